/*-------------------------------------------------------------------------
 *
 * session.c
 *	  Client sessions: which one a call works for, and whether one is still
 *	  connected, on one server and on any node of a Citus cluster.
 *
 * A request key's attempt may span transactions: it belongs to the client
 * session that began it and stays in flight while that session is
 * connected.  On one server that session is the backend running the call,
 * named by its pid and start time (so that a pid reused after it left is
 * not taken for it).
 *
 * On a Citus cluster the backend running a call is often not the client's
 * session: a call Citus sent to the key's node runs in a connection Citus
 * made for that session, which Citus may close and make again between two
 * of its transactions, and a call made on a node without the key's shard
 * runs there while its rows are on another node.  So there the session is
 * named as Citus names it: by the node it is connected to and its pid,
 * which Citus hands to the connections it makes for it ("citus_internal
 * gpid=N" in their application_name, N its global pid), and by its start
 * time, asked once of that node by each such connection.  Whether the
 * session is still connected is asked of its node.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/procarray.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "idem.h"

/* Citus's global pid: node id times 10^10, plus the pid */
#define CITUS_GPID_NODE_MULTIPLIER	INT64CONST(10000000000)
/* the node id Citus gives a node missing from its metadata */
#define CITUS_NODE_NOT_IN_METADATA	99999999

/*
 * Is the session with this pid and start time connected to this server?
 * Our own session is recognised by its pid and start time; another by its
 * pid in the process array and, since pids are reused, by the start time
 * its backend status shows.  The backend status is read afresh: a snapshot
 * taken earlier in the transaction could show a session that has left
 * since.  The snapshot read here is dropped again, so that the caller's
 * next look at pg_stat_activity in this transaction reads the sessions as
 * they are then, not as they were at this call.
 */
bool
idem_session_alive(int32 pid, TimestampTz started)
{
	bool		alive = false;	/* not found: a new session with a reused pid */
	int			n;
	int			i;

	if (pid == MyProcPid)
		return started == MyStartTimestamp;
	if (BackendPidGetProc(pid) == NULL)
		return false;
	pgstat_clear_backend_activity_snapshot();
	n = pgstat_fetch_stat_numbackends();
	for (i = 1; i <= n; i++)
	{
		LocalPgBackendStatus *local = pgstat_fetch_stat_local_beentry(i);

		if (local != NULL && local->backendStatus.st_procpid == pid)
		{
			alive = (local->backendStatus.st_proc_start_timestamp == started);
			break;
		}
	}
	pgstat_clear_backend_activity_snapshot();
	return alive;
}

/*
 * The start time of the session with this pid on this server, when it
 * logged in as userid: 0 when none is connected.
 */
static TimestampTz
session_started_here(int32 pid, Oid userid)
{
	TimestampTz started = 0;
	int			n;
	int			i;

	pgstat_clear_backend_activity_snapshot();
	n = pgstat_fetch_stat_numbackends();
	for (i = 1; i <= n; i++)
	{
		LocalPgBackendStatus *local = pgstat_fetch_stat_local_beentry(i);

		if (local != NULL && local->backendStatus.st_procpid == pid)
		{
			if (local->backendStatus.st_userid == userid)
				started = local->backendStatus.st_proc_start_timestamp;
			break;
		}
	}
	pgstat_clear_backend_activity_snapshot();
	return started;
}

/*
 * The global pid of the session this backend works for when Citus made it
 * for one (as Citus reads it, from the application_name it connects with),
 * or 0.
 */
static uint64
citus_client_gpid(void)
{
	static const char *const prefixes[] = {
		"citus_internal gpid=", "citus_rebalancer gpid=", "citus_run_command gpid="
	};
	size_t		i;

	if (application_name == NULL)
		return 0;
	for (i = 0; i < lengthof(prefixes); i++)
	{
		size_t		len = strlen(prefixes[i]);

		if (strncmp(application_name, prefixes[i], len) == 0)
			return strtou64(application_name + len, NULL, 10);
	}
	return 0;
}

/* The statements below run as runas, in a connection to SPI of their own. */
typedef struct SessionSql
{
	Oid			userid;
	int			sec_context;
} SessionSql;

static void
session_sql_begin(Oid runas, SessionSql *ss)
{
	GetUserIdAndSecContext(&ss->userid, &ss->sec_context);
	SetUserIdAndSecContext(runas, ss->sec_context | SECURITY_LOCAL_USERID_CHANGE);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
session_sql_end(SessionSql *ss)
{
	SPI_finish();
	SetUserIdAndSecContext(ss->userid, ss->sec_context);
}

/* This node's id in Citus's metadata, as Citus finds it; once per backend. */
static int32
citus_local_node(void)
{
	static int32 local_node = -1;
	int			rc;
	bool		isnull;
	Datum		d;

	if (local_node >= 0)
		return local_node;
	rc = SPI_execute("SELECT nodeid FROM pg_catalog.pg_dist_node"
					 " WHERE groupid OPERATOR(pg_catalog.=)"
					 " (SELECT groupid FROM pg_catalog.pg_dist_local_group)"
					 " AND isactive AND noderole OPERATOR(pg_catalog.=) 'primary'"
					 " ORDER BY nodeid LIMIT 1",
					 true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not read this node's id: %s",
			 SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return CITUS_NODE_NOT_IN_METADATA;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	local_node = isnull ? CITUS_NODE_NOT_IN_METADATA : DatumGetInt32(d);
	return local_node;
}

/*
 * Run one command on the node with this id (a new connection, as Citus's
 * run_command_on_* functions make) and return its single value, or NULL
 * when the node is not in the metadata or the command failed there (the
 * node is unreachable, say).
 */
static char *
citus_node_query(int32 node, const char *command)
{
	Oid			types[2] = {INT4OID, TEXTOID};
	Datum		args[2];
	int			rc;
	bool		isnull;
	char	   *result;

	args[0] = Int32GetDatum(node);
	args[1] = CStringGetTextDatum(command);
	rc = SPI_execute_with_args("SELECT r.success, r.result"
							   " FROM pg_catalog.pg_dist_node n,"
							   " pg_catalog.master_run_on_worker(ARRAY[n.nodename],"
							   " ARRAY[n.nodeport], ARRAY[$2], false) r"
							   " WHERE n.nodeid OPERATOR(pg_catalog.=) $1",
							   2, types, args, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not run a command on node %d: %s", node,
			 SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return NULL;
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 1, &isnull)) ||
		isnull)
		return NULL;
	result = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	return result ? pstrdup(result) : NULL;
}

/* A start time as microseconds since 1970, exact on every node. */
static int64
started_unix_us(TimestampTz t)
{
	return t + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

/*
 * The start time of the session with this pid on the node with this id,
 * when its session user is user: 0 when none is connected there (or the
 * node cannot be asked).
 */
static TimestampTz
citus_session_started(int32 node, int32 pid, const char *user)
{
	char	   *command;
	char	   *result;
	int64		us;

	command = psprintf("SELECT COALESCE((SELECT"
					   " (pg_catalog.extract('epoch', backend_start)"
					   " OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8::pg_catalog.text"
					   " FROM pg_catalog.pg_stat_activity"
					   " WHERE pid OPERATOR(pg_catalog.=) %d"
					   " AND usename OPERATOR(pg_catalog.=) %s), '')",
					   pid, quote_literal_cstr(user));
	result = citus_node_query(node, command);
	if (result == NULL || result[0] == '\0')
		return 0;
	us = strtoi64(result, NULL, 10);
	return us - (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

/*
 * The client session this backend works for on a Citus node.  A backend
 * Citus made for a session of another node (or of this one) works for that
 * session; its start time is asked of its node once per backend.  That
 * session is taken for the client only when it logged in as the user this
 * backend logged in as (Citus connects as the user of the statement), so
 * that a session cannot pass for another one by the application_name it
 * gives; otherwise, and when the session's node cannot be asked, the
 * backend is its own client, as a client session is.
 */
void
idem_citus_session(Oid runas, IdemSession *me)
{
	static bool known_valid = false;
	static uint64 known_gpid = 0;
	static IdemSession known;
	uint64		gpid = citus_client_gpid();
	SessionSql	ss;

	if (known_valid && gpid == known_gpid)
	{
		*me = known;
		return;
	}
	session_sql_begin(runas, &ss);
	me->node = citus_local_node();
	me->pid = MyProcPid;
	me->started = MyStartTimestamp;
	if (gpid != 0)
	{
		int32		node = (int32) (gpid / CITUS_GPID_NODE_MULTIPLIER);
		int32		pid = (int32) (gpid % CITUS_GPID_NODE_MULTIPLIER);
		TimestampTz started = 0;

		if (node == me->node)
			started = session_started_here(pid, GetSessionUserId());
		else if (node != CITUS_NODE_NOT_IN_METADATA)
			started = citus_session_started(node, pid,
											GetUserNameFromId(GetSessionUserId(), false));
		if (started != 0)
		{
			me->node = node;
			me->pid = pid;
			me->started = started;
		}
	}
	session_sql_end(&ss);
	/* until this node is in the metadata, asked again */
	if (me->node != CITUS_NODE_NOT_IN_METADATA)
	{
		known_gpid = gpid;
		known = *me;
		known_valid = true;
	}
}

/*
 * Is the session s, of a Citus node, still connected?  Asked of its node;
 * a node that cannot be asked (missing from the metadata, unreachable) is
 * taken to keep its sessions: the caller's lease then decides.
 */
bool
idem_citus_session_alive(Oid runas, const IdemSession *s)
{
	SessionSql	ss;
	char	   *result;
	bool		alive;

	if (s->node < 0)
		return idem_session_alive(s->pid, s->started);
	session_sql_begin(runas, &ss);
	if (s->node == citus_local_node())
		alive = idem_session_alive(s->pid, s->started);
	else
	{
		result = citus_node_query(s->node,
								  psprintf("SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity"
										   " WHERE pid OPERATOR(pg_catalog.=) %d"
										   " AND (pg_catalog.extract('epoch', backend_start)"
										   " OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8"
										   " OPERATOR(pg_catalog.=) " INT64_FORMAT,
										   s->pid, started_unix_us(s->started)));
		alive = (result == NULL || strcmp(result, "0") != 0);
	}
	session_sql_end(&ss);
	return alive;
}
