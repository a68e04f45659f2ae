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
#include "utils/acl.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "idem.h"

/* Citus's global pid: node id times 10^10, plus the pid */
#define CITUS_GPID_NODE_MULTIPLIER	INT64CONST(10000000000)
/* the node id Citus gives a node missing from its metadata */
#define CITUS_NODE_NOT_IN_METADATA	99999999

/*
 * The backend status of the session with this pid on this server: its
 * start time and login user.  Read afresh: a snapshot taken earlier in the
 * transaction could show a session that has left since.  The snapshot read
 * here is dropped again, so that the caller's next look at
 * pg_stat_activity in this transaction reads the sessions as they are then,
 * not as they were at this call.
 */
static bool
session_status(int32 pid, TimestampTz *started, Oid *userid)
{
	bool		found = false;
	int			n;
	int			i;

	pgstat_clear_backend_activity_snapshot();
	n = pgstat_fetch_stat_numbackends();
	for (i = 1; i <= n; i++)
	{
		LocalPgBackendStatus *local = pgstat_fetch_stat_local_beentry(i);

		if (local != NULL && local->backendStatus.st_procpid == pid)
		{
			*started = local->backendStatus.st_proc_start_timestamp;
			*userid = local->backendStatus.st_userid;
			found = true;
			break;
		}
	}
	pgstat_clear_backend_activity_snapshot();
	return found;
}

/*
 * Is the session with this pid and start time connected to this server?
 * Our own session is recognised by its pid and start time; another by its
 * pid in the process array and, since pids are reused, by the start time
 * its backend status shows.
 */
bool
idem_session_alive(int32 pid, TimestampTz started)
{
	TimestampTz st;
	Oid			userid;

	if (pid == MyProcPid)
		return started == MyStartTimestamp;
	if (BackendPidGetProc(pid) == NULL)
		return false;
	return session_status(pid, &st, &userid) && st == started;
}

/*
 * Whether Citus made this backend for a client session (as Citus tells,
 * from the application_name it connects with).
 */
static bool
citus_made_for_client(void)
{
	static const char *const prefixes[] = {
		"citus_internal gpid=", "citus_rebalancer gpid=", "citus_run_command gpid="
	};
	size_t		i;

	if (application_name == NULL)
		return false;
	for (i = 0; i < lengthof(prefixes); i++)
		if (strncmp(application_name, prefixes[i], strlen(prefixes[i])) == 0)
			return true;
	return false;
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

/* The single value of a query without parameters (not null). */
static Datum
session_sql_value(const char *query, const char *what)
{
	int			rc = SPI_execute(query, true, 1);
	bool		isnull = true;
	Datum		d = (Datum) 0;

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not read %s: %s", what, SPI_result_code_string(rc));
	if (SPI_processed == 1)
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		elog(ERROR, "could not read %s", what);
	return d;
}

/*
 * This backend's global pid, as Citus gives it: for a backend Citus made,
 * the global pid of its client session.  Asked on every call: Citus may
 * give a session a new one when the node joins the metadata.
 */
static uint64
citus_gpid(void)
{
	return (uint64) DatumGetInt64(session_sql_value("SELECT pg_catalog.citus_backend_gpid()",
													"Citus's global pid"));
}

/*
 * Whether the node with this id is this one: a node of this node's group
 * (the group holds a primary and its secondaries, and only a primary runs
 * the calls that record an owner).  Citus gives a node missing from its
 * metadata (a coordinator without citus_set_coordinator_host) the id
 * CITUS_NODE_NOT_IN_METADATA: that is this node when it is missing.
 */
static bool
citus_node_here(int32 node)
{
	Oid			type = INT4OID;
	Datum		arg = Int32GetDatum(node);
	int			rc;
	bool		isnull;
	bool		here;

	rc = SPI_execute_with_args("SELECT CASE WHEN $1 OPERATOR(pg_catalog.=) " CppAsString2(CITUS_NODE_NOT_IN_METADATA)
							   " THEN NOT EXISTS (SELECT FROM pg_catalog.pg_dist_node n, pg_catalog.pg_dist_local_group g"
							   " WHERE n.groupid OPERATOR(pg_catalog.=) g.groupid)"
							   " ELSE EXISTS (SELECT FROM pg_catalog.pg_dist_node n, pg_catalog.pg_dist_local_group g"
							   " WHERE n.nodeid OPERATOR(pg_catalog.=) $1"
							   " AND n.groupid OPERATOR(pg_catalog.=) g.groupid) END",
							   1, &type, &arg, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not read Citus's nodes: %s",
			 SPI_result_code_string(rc));
	here = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull));
	return !isnull && here;
}

/*
 * This node's id: its group's primary, or CITUS_NODE_NOT_IN_METADATA.
 */
static int32
citus_this_node(void)
{
	int			rc;
	bool		isnull;
	Datum		d;

	rc = SPI_execute("SELECT n.nodeid FROM pg_catalog.pg_dist_node n, pg_catalog.pg_dist_local_group g"
					 " WHERE n.groupid OPERATOR(pg_catalog.=) g.groupid"
					 " AND n.noderole OPERATOR(pg_catalog.=) 'primary'"
					 " ORDER BY n.nodeid LIMIT 1",
					 true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not read this node's id: %s",
			 SPI_result_code_string(rc));
	if (SPI_processed == 0)
		return CITUS_NODE_NOT_IN_METADATA;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? CITUS_NODE_NOT_IN_METADATA : DatumGetInt32(d);
}

/*
 * Run one command on the node with this id and return its single value, or
 * NULL when the node is not in the metadata (*in_metadata false) or the
 * command failed there (the node is unreachable, say).  Citus makes a new
 * connection for it, as its run_command_on_* functions do; its attempt to
 * connect is bounded to two seconds at most, whatever
 * citus.node_connection_timeout says.  (A caller deciding under the store's
 * lock timeout of one millisecond takes a lock wait here for a holder in
 * flight, which errs on the safe side.)
 */
static char *
citus_node_query(int32 node, const char *command, bool *in_metadata)
{
	Oid			types[2] = {INT4OID, TEXTOID};
	Datum		args[2];
	int			rc;
	bool		isnull;
	bool		success;
	char	   *result = NULL;
	int			save_nestlevel;
	const char *timeout;

	args[0] = Int32GetDatum(node);
	args[1] = CStringGetTextDatum(command);
	save_nestlevel = NewGUCNestLevel();
	timeout = GetConfigOption("citus.node_connection_timeout", true, false);
	if (timeout == NULL || atoi(timeout) > 2000)
		(void) set_config_option("citus.node_connection_timeout", "2000",
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
								 true, 0, false);
	rc = SPI_execute_with_args("SELECT r.success, r.result"
							   " FROM pg_catalog.pg_dist_node n,"
							   " pg_catalog.master_run_on_worker(ARRAY[n.nodename],"
							   " ARRAY[n.nodeport], ARRAY[$2], false) r"
							   " WHERE n.nodeid OPERATOR(pg_catalog.=) $1",
							   2, types, args, NULL, true, 1);
	AtEOXact_GUC(true, save_nestlevel);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not run a command on node %d: %s", node,
			 SPI_result_code_string(rc));
	*in_metadata = (SPI_processed > 0);
	if (SPI_processed == 0)
		return NULL;
	success = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 1, &isnull));
	if (!isnull && success)
		result = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	return result;
}

/* A start time as microseconds since 1970, exact on every node. */
static int64
started_unix_us(TimestampTz t)
{
	return t + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

/* What a node says of the session with a pid. */
typedef enum CitusSessionFound
{
	CITUS_SESSION_FOUND,
	CITUS_SESSION_NONE,			/* no session with that pid */
	CITUS_SESSION_HIDDEN,		/* its start time cannot be read */
	CITUS_SESSION_NO_NODE,		/* the node is not in the metadata */
	CITUS_SESSION_UNASKED		/* the node cannot be reached */
} CitusSessionFound;

/*
 * The start time and login user of the session with this pid on the node
 * with this id.
 */
static CitusSessionFound
citus_session_status(int32 node, int32 pid, TimestampTz *started, Oid *userid)
{
	char	   *result;
	char	   *space;
	bool		in_metadata;

	if (citus_node_here(node))
		return session_status(pid, started, userid) ?
			CITUS_SESSION_FOUND : CITUS_SESSION_NONE;
	result = citus_node_query(node,
							  psprintf("SELECT COALESCE((SELECT COALESCE((pg_catalog.extract('epoch', backend_start)"
									   " OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8::pg_catalog.text, 'hidden')"
									   " OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) usename"
									   " FROM pg_catalog.pg_stat_activity"
									   " WHERE pid OPERATOR(pg_catalog.=) %d), 'none')",
									   pid), &in_metadata);
	if (result == NULL)
		return in_metadata ? CITUS_SESSION_UNASKED : CITUS_SESSION_NO_NODE;
	if ((space = strchr(result, ' ')) == NULL)
		return CITUS_SESSION_NONE;
	*space = '\0';
	if (strcmp(result, "hidden") == 0)
		return CITUS_SESSION_HIDDEN;
	*started = strtoi64(result, NULL, 10) -
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
	*userid = get_role_oid(space + 1, true);
	return CITUS_SESSION_FOUND;
}

/*
 * Whether a connection logged in as this backend's login role may pass for
 * a session logged in as userid: when that session could have become this
 * role (its own, or one it could SET ROLE to), which is how Citus connects
 * for it.  A superuser's session only by a superuser's connection: the
 * application_name that names the session is not authenticated, and every
 * role would otherwise pass for a superuser's sessions.
 */
static bool
citus_may_pass_for(Oid userid)
{
	Oid			me = GetSessionUserId();

	if (!OidIsValid(userid))
		return false;
	if (superuser_arg(userid))
		return superuser_arg(me);
	return is_member_of_role_nosuper(userid, me);
}

/*
 * The client session this backend works for on a Citus node: itself, named
 * by Citus's global pid (its node and pid) and its start time; for a
 * backend Citus made for a client session, that session, whose start time
 * and login role are asked of its node once per backend.  That session is
 * taken for the client when this backend's login role may pass for it
 * (citus_may_pass_for); otherwise (a call in a SECURITY DEFINER function,
 * or a superuser's session that SET ROLE) the backend is its own client, as
 * a client session is.  A client session that cannot be found is an error:
 * answered by any other session, the call could take another one's attempt
 * for abandoned.
 */
void
idem_citus_session(Oid runas, IdemSession *me)
{
	static bool known_valid = false;
	static uint64 known_gpid;
	static IdemSession known;
	uint64		gpid;
	int32		node;
	int32		pid;
	TimestampTz started = 0;
	Oid			userid = InvalidOid;
	SessionSql	ss;

	session_sql_begin(runas, &ss);
	gpid = citus_gpid();
	node = (int32) (gpid / CITUS_GPID_NODE_MULTIPLIER);
	pid = (int32) (gpid % CITUS_GPID_NODE_MULTIPLIER);
	me->node = node;
	me->pid = MyProcPid;
	me->started = MyStartTimestamp;
	if (gpid == 0 || !citus_made_for_client())
	{
		/* a client session, named as Citus names it (when Citus does) */
		if (gpid == 0)
			me->node = citus_this_node();
	}
	else if (known_valid && gpid == known_gpid)
		*me = known;
	else
	{
		switch (citus_session_status(node, pid, &started, &userid))
		{
			case CITUS_SESSION_FOUND:
				break;
			case CITUS_SESSION_NONE:
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("the client session of this connection of Citus is gone"),
						 errdetail("No session with pid %d is connected to node %d.",
								   pid, node)));
				break;
			case CITUS_SESSION_HIDDEN:
				ereport(ERROR,
						(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						 errmsg("the start time of the client session of this connection of Citus cannot be read"),
						 errdetail("The owner of idem's tables cannot read the start time of other roles' sessions on node %d.",
								   node),
						 errhint("Grant pg_read_all_stats to the owner of idem's tables.")));
				break;
			case CITUS_SESSION_NO_NODE:
				/* asking again would not help: not a connection failure */
				if (node == CITUS_NODE_NOT_IN_METADATA)
					ereport(ERROR,
							(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
							 errmsg("the client session of this connection of Citus is on a node missing from Citus's metadata"),
							 errhint("Add the coordinator to the metadata with citus_set_coordinator_host().")));
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("the client session of this connection of Citus is on node %d, which is missing from Citus's metadata",
								node)));
				break;
			case CITUS_SESSION_UNASKED:
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("could not ask node %d for the client session of this connection of Citus",
								node),
						 errhint("Retry the call once the node can be reached.")));
				break;
		}
		if (citus_may_pass_for(userid))
		{
			me->pid = pid;
			me->started = started;
		}
		else
			me->node = citus_this_node();	/* its own client */
		known_gpid = gpid;
		known = *me;
		known_valid = true;
	}
	session_sql_end(&ss);
}

/*
 * Is the session s, of a Citus node, still connected?  Asked of its node;
 * a node that cannot be asked (missing from the metadata, unreachable), or
 * that shows the session without its start time, is taken to keep its
 * sessions: the caller's lease then decides.
 */
bool
idem_citus_session_alive(Oid runas, const IdemSession *s)
{
	SessionSql	ss;
	char	   *result;
	bool		alive;
	bool		in_metadata;

	session_sql_begin(runas, &ss);
	if (citus_node_here(s->node))
		alive = idem_session_alive(s->pid, s->started);
	else
	{
		result = citus_node_query(s->node,
								  psprintf("SELECT CASE"
										   " WHEN pg_catalog.bool_or(backend_start IS NULL) THEN 'unknown'"
										   " WHEN pg_catalog.bool_or((pg_catalog.extract('epoch', backend_start)"
										   " OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8"
										   " OPERATOR(pg_catalog.=) " INT64_FORMAT ") THEN 'alive'"
										   " ELSE 'gone' END"
										   " FROM pg_catalog.pg_stat_activity"
										   " WHERE pid OPERATOR(pg_catalog.=) %d",
										   started_unix_us(s->started), s->pid),
								  &in_metadata);
		alive = (result == NULL || strcmp(result, "gone") != 0);
	}
	session_sql_end(&ss);
	return alive;
}
