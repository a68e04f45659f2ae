/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The maintenance worker: the purges of every capability, on schedule.
 *
 * With idem in shared_preload_libraries and idem.maintenance on, the
 * postmaster starts one background worker, the launcher.  Every
 * idem.maintenance_interval it starts a round: a worker of its own that
 * connects to idem.database and runs idem_maintenance(batch) in
 * transactions of their own until a round purges less than a batch of each
 * kind (or the interval is used up), so that no transaction holds many rows
 * and claims, tokens and requests go on meanwhile, and then exits.  After
 * each batch it sleeps so that it works idem.maintenance_load of the time (a
 * quarter by default): a backlog is purged at a pace that leaves most of the
 * machine to the claims.  Each purge keeps to the retention of its
 * namespace: the worker only calls the purge functions.
 *
 * The launcher connects to no database: between rounds nothing of idem is
 * connected to idem.database, which can then be dropped, or copied as a
 * template, as any database without sessions.  A round in progress is
 * ended by such a command of the database's owner, as autovacuum's workers
 * are (see worker_utility).  A database that does not exist is skipped (and
 * logged once) until it does.
 *
 * At each round the launcher also judges the duplicate rate of every
 * namespace whose interval is over (see stats.c), so that a namespace that
 * fell silent after a burst of duplicates is judged within a round.
 *
 * A round that fails is logged and retried at the next interval.  A
 * database without the extension is skipped (and logged once).  The
 * launcher ends at once on SIGTERM, ignores a cancel (it runs no query),
 * and is restarted by the postmaster after a crash.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_subscription.h"
#include "catalog/pg_tablespace.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/tablespace.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/slot.h"
#include "storage/shmem.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idem.h"

PGDLLEXPORT void idem_maintenance_main(Datum main_arg);
PGDLLEXPORT void idem_maintenance_round_main(Datum main_arg);

static bool worker_enabled = true;
static char *worker_database = NULL;
static int	worker_interval = 60;	/* seconds */
static int	worker_batch = 1000;
static double worker_load = 0.25;	/* share of the time spent purging */

/*
 * What was last logged of idem.database, so that each state is logged once
 * and not at every round: by the rounds (0 nothing; -1 the extension
 * missing; -3 at a version without idem_maintenance()), and by the launcher
 * (0 nothing; -4 the database missing; -5 not accepting connections; -6 no
 * round could be started).  Each field has one writer at a time.
 *
 * And the round in progress, its pid and database (0 and InvalidOid
 * between rounds), for the commands that end it (see worker_utility).
 */
typedef struct WorkerShared
{
	int			round_logged;
	int			launcher_logged;
	slock_t		mutex;			/* round_pid and round_dbid */
	int			round_pid;
	Oid			round_dbid;
} WorkerShared;

static WorkerShared *worker_shared = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ProcessUtility_hook_type prev_ProcessUtility_hook = NULL;

static void
worker_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(sizeof(WorkerShared));
}

static void
worker_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	worker_shared = ShmemInitStruct("idem_maintenance_worker",
									sizeof(WorkerShared), &found);
	if (!found)
	{
		worker_shared->round_logged = 0;
		worker_shared->launcher_logged = 0;
		SpinLockInit(&worker_shared->mutex);
		worker_shared->round_pid = 0;
		worker_shared->round_dbid = InvalidOid;
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * The round's database, when stmt is a command that needs it without
 * sessions (DROP DATABASE, ALTER DATABASE ... RENAME, ALTER DATABASE ... SET
 * TABLESPACE, CREATE DATABASE ... TEMPLATE) and that will not fail before
 * it counts the sessions on the checks the server makes first: run where it
 * may run (not in a transaction block, not read-only, not the session's own
 * database), by a role that may run it (the owner, or for a template anyone
 * who may create databases; a move also needs CREATE on another
 * tablespace).  Another role's attempt must not end a round.  InvalidOid
 * otherwise.
 */
static Oid
worker_command_database(Node *stmt, Oid round_dbid, bool isTopLevel)
{
	const char *dbname = NULL;
	const char *tablespace = NULL;
	bool		template = false;
	ListCell   *lc;
	HeapTuple	tup;
	bool		istemplate;
	Oid			dbid;

	if (IsA(stmt, DropdbStmt))
		dbname = ((DropdbStmt *) stmt)->dbname;
	else if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
		dbname = ((RenameStmt *) stmt)->subname;
	else if (IsA(stmt, AlterDatabaseStmt))
	{
		List	   *options = ((AlterDatabaseStmt *) stmt)->options;
		DefElem    *opt = list_length(options) == 1 ? linitial_node(DefElem, options) : NULL;

		/* the server refuses TABLESPACE beside another option */
		if (opt != NULL && strcmp(opt->defname, "tablespace") == 0 && opt->arg != NULL)
		{
			tablespace = defGetString(opt);
			dbname = ((AlterDatabaseStmt *) stmt)->dbname;
		}
	}
	else if (IsA(stmt, CreatedbStmt))
	{
		foreach(lc, ((CreatedbStmt *) stmt)->options)
		{
			DefElem    *opt = lfirst_node(DefElem, lc);

			if (strcmp(opt->defname, "template") == 0 && opt->arg != NULL)
				dbname = defGetString(opt);
		}
		template = true;
	}
	if (dbname == NULL || XactReadOnly ||
		(!IsA(stmt, RenameStmt) && (IsTransactionBlock() || !isTopLevel)))
		return InvalidOid;
	dbid = get_database_oid(dbname, true);
	if (!OidIsValid(dbid) || dbid != round_dbid || dbid == MyDatabaseId)
		return InvalidOid;
	tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dbid));
	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	istemplate = ((Form_pg_database) GETSTRUCT(tup))->datistemplate;
	if (tablespace != NULL)
	{
		Oid			tsoid = get_tablespace_oid(tablespace, true);

		/* a move to where it is does nothing; pg_global is refused */
		if (!OidIsValid(tsoid) || tsoid == GLOBALTABLESPACE_OID ||
			tsoid == ((Form_pg_database) GETSTRUCT(tup))->dattablespace ||
			pg_tablespace_aclcheck(tsoid, GetUserId(), ACL_CREATE) != ACLCHECK_OK)
			dbid = InvalidOid;
		ReleaseSysCache(tup);
		return OidIsValid(dbid) && pg_database_ownercheck(dbid, GetUserId()) ? dbid : InvalidOid;
	}
	ReleaseSysCache(tup);
	if (IsA(stmt, DropdbStmt))
	{
		int			nslots;
		int			nslots_active;

		/* the server refuses it first while slots or subscriptions use it */
		if (istemplate || !pg_database_ownercheck(dbid, GetUserId()) ||
			ReplicationSlotsCountDBSlots(dbid, &nslots, &nslots_active) ||
			CountDBSubscriptions(dbid) > 0)
			return InvalidOid;
		return dbid;
	}
	if (!have_createdb_privilege())
		return InvalidOid;
	/* a new name that is taken is refused first */
	if (IsA(stmt, RenameStmt) &&
		OidIsValid(get_database_oid(((RenameStmt *) stmt)->newname, true)))
		return InvalidOid;
	if (template && istemplate)
		return dbid;
	return pg_database_ownercheck(dbid, GetUserId()) ? dbid : InvalidOid;
}

/*
 * A command that needs the maintenance round's database without sessions
 * ends the round first, and waits up to 5 seconds for it to go, as the
 * server does for autovacuum's workers: otherwise the database's owner
 * could not drop it while a round works off a backlog (the round runs as
 * the bootstrap superuser, whom only a superuser or pg_signal_backend may
 * terminate, also with WITH (FORCE)).  The round is started again at the
 * next interval.
 */
static void
worker_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			   ProcessUtilityContext context, ParamListInfo params,
			   QueryEnvironment *queryEnv, DestReceiver *dest,
			   QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	int			pid;
	Oid			round_dbid;
	Oid			dbid;

	SpinLockAcquire(&worker_shared->mutex);
	pid = worker_shared->round_pid;
	round_dbid = worker_shared->round_dbid;
	SpinLockRelease(&worker_shared->mutex);
	if (pid != 0 &&
		(IsA(stmt, DropdbStmt) || IsA(stmt, RenameStmt) || IsA(stmt, CreatedbStmt) ||
		 IsA(stmt, AlterDatabaseStmt)) &&
		OidIsValid(dbid = worker_command_database(stmt, round_dbid,
												  context == PROCESS_UTILITY_TOPLEVEL)))
	{
		int			i;

		ereport(DEBUG1,
				(errmsg("ending the idem maintenance round in database %u", dbid)));
		/* still the round's pid (it says it is gone before it exits) */
		SpinLockAcquire(&worker_shared->mutex);
		round_dbid = worker_shared->round_pid == pid ? worker_shared->round_dbid : InvalidOid;
		SpinLockRelease(&worker_shared->mutex);
		if (round_dbid == dbid)
			(void) kill(pid, SIGTERM);

		/*
		 * The round says it is gone before it leaves the array of
		 * processes, which the command counts: both are waited for.
		 */
		for (i = 0; i < 500; i++)
		{
			SpinLockAcquire(&worker_shared->mutex);
			round_dbid = worker_shared->round_pid == pid ? worker_shared->round_dbid : InvalidOid;
			SpinLockRelease(&worker_shared->mutex);
			if (round_dbid != dbid && BackendPidGetProc(pid) == NULL)
				break;
			CHECK_FOR_INTERRUPTS();
			pg_usleep(10 * 1000L);
		}
	}
	if (prev_ProcessUtility_hook)
		prev_ProcessUtility_hook(pstmt, queryString, readOnlyTree, context,
								 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/* The round says it is gone. */
static void
worker_round_unpublish(int code, Datum arg)
{
	SpinLockAcquire(&worker_shared->mutex);
	if (worker_shared->round_pid == MyProcPid)
	{
		worker_shared->round_pid = 0;
		worker_shared->round_dbid = InvalidOid;
	}
	SpinLockRelease(&worker_shared->mutex);
}

/*
 * The round says where it works, before it connects: from the moment it
 * takes the database's lock, the commands count it among the sessions.
 */
static void
worker_round_publish(Oid dbid)
{
	before_shmem_exit(worker_round_unpublish, (Datum) 0);
	SpinLockAcquire(&worker_shared->mutex);
	worker_shared->round_pid = MyProcPid;
	worker_shared->round_dbid = dbid;
	SpinLockRelease(&worker_shared->mutex);
}

void
idem_worker_init(void)
{
	BackgroundWorker worker;

	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomBoolVariable("idem.maintenance",
							 "Runs the purges of idem in a background worker.",
							 NULL,
							 &worker_enabled,
							 true,
							 PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("idem.database",
							   "Database in which the maintenance worker runs idem's purges.",
							   NULL,
							   &worker_database,
							   "postgres",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.maintenance_interval",
							"Time between two rounds of the maintenance worker.",
							NULL,
							&worker_interval,
							60, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.maintenance_batch",
							"Rows the maintenance worker purges of each kind per transaction.",
							NULL,
							&worker_batch,
							1000, 1, 1000000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("idem.maintenance_load",
							 "Share of the time the maintenance worker spends purging while there is more to purge.",
							 "After each batch the worker sleeps long enough for its work to take this share of the time; 1 does not sleep.",
							 &worker_load,
							 0.25, 0.01, 1.0,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	if (!worker_enabled)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = worker_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = worker_shmem_startup;
	prev_ProcessUtility_hook = ProcessUtility_hook;
	ProcessUtility_hook = worker_utility;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_maintenance_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem maintenance worker");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem maintenance worker");
	RegisterBackgroundWorker(&worker);
}

/*
 * One transaction of maintenance: idem._maintenance(batch) (what
 * idem_maintenance runs), which purges at
 * most a batch of each kind.  Returns the largest number purged of one kind,
 * or -1 when the extension is not installed, -2 when the round failed, -3
 * when the extension is at a version without idem_maintenance() (0.1.0,
 * between the installation of a new library and ALTER EXTENSION UPDATE;
 * its version is then in *version).
 */
static int64
worker_round(char *version, size_t versionlen)
{
	volatile int64 most = 0;
	MemoryContext cxt = CurrentMemoryContext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idem maintenance");

	PG_TRY();
	{
		SPI_connect();
		/*
		 * idem._maintenance, not the extension's schema's idem_maintenance:
		 * a role with CREATE on that schema (its owner: the database's owner
		 * for public) could put a function of that name there, or rename
		 * the schema and make another, and have it run as a superuser.
		 */
		if (SPI_execute("SELECT e.extversion, "
						"pg_catalog.to_regprocedure('idem._maintenance(pg_catalog.int4)') IS NOT NULL "
						"FROM pg_catalog.pg_extension e "
						"WHERE e.extname OPERATOR(pg_catalog.=) 'idem'",
						true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not look for extension \"idem\"");
		if (SPI_processed == 0)
			most = -1;
		else if (strcmp(SPI_getvalue(SPI_tuptable->vals[0],
									 SPI_tuptable->tupdesc, 2), "t") != 0)
		{
			strlcpy(version, SPI_getvalue(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1), versionlen);
			most = -3;
		}
		else
		{
			char		sql[256];
			uint64		i;

			snprintf(sql, sizeof(sql),
					 "SELECT kind, purged FROM idem._maintenance(%d)",
					 worker_batch);
			if (SPI_execute(sql, false, 0) != SPI_OK_SELECT)
				elog(ERROR, "idem_maintenance() did not return rows");
			for (i = 0; i < SPI_processed; i++)
			{
				bool		isnull;
				Datum		d = SPI_getbinval(SPI_tuptable->vals[i],
											  SPI_tuptable->tupdesc, 2, &isnull);

				if (!isnull && DatumGetInt64(d) > most)
					most = DatumGetInt64(d);
			}
		}
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		/* log it, undo the transaction, and go on at the next round */
		MemoryContextSwitchTo(cxt);
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		most = -2;
	}
	PG_END_TRY();

	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, NULL);
	return most;
}

/*
 * A round, in a worker of its own connected to idem.database: batch after
 * batch until less than a batch of each kind is left (or the interval is
 * used up).
 */
void
idem_maintenance_round_main(Datum main_arg)
{
	int			logged = worker_shared->round_logged;
	char	   *dbname;
	char		version[64] = "";
	TimestampTz start = GetCurrentTimestamp();
	int64		most;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* the database the launcher found (by its name, which may be cut) */
	worker_round_publish(DatumGetObjectId(main_arg));
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg),
											  InvalidOid, 0);
	/* its name as it is, for the lines (idem.database may be longer) */
	StartTransactionCommand();
	dbname = MemoryContextStrdup(TopMemoryContext,
								 get_database_name(MyDatabaseId));

	/*
	 * As the bootstrap superuser, whatever role or session_authorization
	 * the database's owner set for it: every round would fail for want of
	 * privileges.  (The checks of both read the catalogs: in a transaction.)
	 */
	SetConfigOption("session_authorization",
					GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false),
					PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("role", "none", PGC_SUSET, PGC_S_OVERRIDE);
	CommitTransactionCommand();

	/*
	 * Whatever the database's settings say: the worker runs as the bootstrap
	 * superuser (see above), so no schema a user can create in comes before
	 * pg_catalog; and the purge of idle outbox keys needs READ COMMITTED,
	 * in a transaction that may write.
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET,
					PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_isolation", "read committed",
					PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET,
					PGC_S_OVERRIDE);

	/*
	 * Batch after batch, while there is more and time left, sleeping after
	 * each so that the purge takes idem.maintenance_load of the time: the
	 * claims it runs beside keep the rest of the machine.
	 */
	for (;;)
	{
		TimestampTz batch_start = GetCurrentTimestamp();
		long		worked;

		CHECK_FOR_INTERRUPTS();
		most = worker_round(version, sizeof(version));
		if (most < worker_batch ||
			TimestampDifferenceExceeds(start, GetCurrentTimestamp(),
									   worker_interval * 1000))
			break;
		worked = TimestampDifferenceMilliseconds(batch_start,
												 GetCurrentTimestamp());
		if (worker_load < 1.0 && worked > 0)
		{
			double		pause = worked * (1.0 - worker_load) / worker_load;
			TimestampTz until;
			long		left;

			/*
			 * The whole pause: the latch is also set by the catch-up of
			 * invalidations and by the barriers other backends' commands
			 * emit, which may not shorten it.  A reload ends it, so that new
			 * settings take effect at once.
			 */
			until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												(long) Min(pause, worker_interval * 1000.0));
			while ((left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
														   until)) > 0)
			{
				(void) WaitLatch(MyLatch,
								 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 left, PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
				if (ConfigReloadPending)
					break;
			}
		}
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
	if (most == -1 && logged != -1)
	{
		ereport(LOG,
				(errmsg("idem maintenance worker: extension \"idem\" is not installed in database \"%s\"",
						dbname),
				 errhint("Create it there, or set idem.database to the database that has it.")));
		logged = -1;
	}
	else if (most == -3 && logged != -3)
	{
		ereport(LOG,
				(errmsg("idem maintenance worker: extension \"idem\" in database \"%s\" is at version %s, which has no idem_maintenance()",
						dbname, version),
				 errhint("Run ALTER EXTENSION idem UPDATE there.")));
		logged = -3;
	}
	else if (most >= 0)
		logged = 0;
	worker_shared->round_logged = logged;
	proc_exit(0);
}

/* What the launcher finds of idem.database in pg_database. */
typedef enum WorkerDatabase
{
	WORKER_DB_OK,
	WORKER_DB_MISSING,
	WORKER_DB_NO_CONNECTIONS	/* datallowconn off, or left invalid by an
								 * interrupted DROP DATABASE */
} WorkerDatabase;

/*
 * Whether a database is the one named.  CREATE DATABASE cuts a name to
 * NAMEDATALEN - 1 bytes at a character's boundary, in the encoding of the
 * database it runs in, which may not be the new one's; the postmaster,
 * which reads idem.database, knows no encoding.  So a longer name is that
 * of the database whose name it begins with, cut before a character that
 * did not fit (of more than one byte, when short of NAMEDATALEN - 1); the
 * longest such name wins.  Returns the length that matched, or 0.
 */
static size_t
worker_database_named(Form_pg_database db, const char *name)
{
	size_t		len = strlen(name);
	size_t		dblen = strlen(NameStr(db->datname));

	if (len < NAMEDATALEN)
		return dblen == len &&
			memcmp(NameStr(db->datname), name, len) == 0 ? len : 0;
	if (dblen <= NAMEDATALEN - 1 - MAX_MULTIBYTE_CHAR_LEN ||
		memcmp(NameStr(db->datname), name, dblen) != 0 ||
		(dblen < NAMEDATALEN - 1 && !IS_HIGHBIT_SET(name[dblen])))
		return 0;
	return dblen;
}

/*
 * Find a database in pg_database, by its name or (name NULL) its oid, and
 * copy its row's fixed part into *out.  The launcher is connected to no
 * database: it reads the shared catalog by a plain scan, as autovacuum's
 * launcher does (its indexes need the shared relcache init file, which a
 * start removes and only a backend of a database writes again).
 */
static bool
worker_find_database(const char *name, Oid dbid, FormData_pg_database *out)
{
	bool		found = false;
	size_t		best = 0;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (name != NULL)
		{
			size_t		matched = worker_database_named(db, name);

			if (matched <= best)
				continue;
			best = matched;
		}
		else if (db->oid != dbid)
			continue;
		*out = *db;
		found = true;
		if (name == NULL)
			break;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return found;
}

/*
 * Whether idem.database exists (its oid in *dbid, its name, as cut, in
 * *dbname) and accepts connections.
 */
static WorkerDatabase
worker_database_state(Oid *dbid, NameData *dbname)
{
	FormData_pg_database db;

	if (!worker_find_database(worker_database, InvalidOid, &db))
		return WORKER_DB_MISSING;
	*dbid = db.oid;
	namestrcpy(dbname, NameStr(db.datname));
	if (!db.datallowconn)
		return WORKER_DB_NO_CONNECTIONS;
	/* left invalid by an interrupted DROP DATABASE (-2 since 15.4) */
	if (db.datconnlimit == -2)
		return WORKER_DB_NO_CONNECTIONS;
	return WORKER_DB_OK;
}

/*
 * The name of a database, for the launcher's lines of duplicate rates
 * (idem_stats_judge_idle); NULL once dropped.
 */
static const char *
worker_database_name(Oid dbid)
{
	static NameData name;
	FormData_pg_database db;

	if (!worker_find_database(NULL, dbid, &db))
		return NULL;
	namestrcpy(&name, NameStr(db.datname));
	return NameStr(name);
}

/* The round in progress, which the launcher ends when it exits. */
static BackgroundWorkerHandle *worker_round_handle = NULL;

static void
worker_end_round(int code, Datum arg)
{
	if (worker_round_handle != NULL)
		TerminateBackgroundWorker(worker_round_handle);
}

/* Whether the launcher logs a state now: once, until another one is logged. */
static bool
worker_log_once(int state)
{
	if (worker_shared->launcher_logged == state)
		return false;
	worker_shared->launcher_logged = state;
	return true;
}

/*
 * Start a round in the database dbid: worker_round_handle is then set, and
 * the launcher's latch is set when the round ends (bgw_notify_pid).
 */
static void
worker_start_round(Oid dbid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_maintenance_round_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem maintenance round");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem maintenance round");
	worker.bgw_notify_pid = MyProcPid;
	worker.bgw_main_arg = ObjectIdGetDatum(dbid);
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		if (worker_log_once(-6))
			ereport(LOG,
					(errmsg("idem maintenance worker: could not start a round"),
					 errhint("Raise max_worker_processes; a round is tried at every interval.")));
		return;
	}
	worker_shared->launcher_logged = 0;
	worker_round_handle = handle;
}

/* Whether the round started last has ended (its handle is then freed). */
static bool
worker_round_ended(void)
{
	pid_t		pid;

	if (worker_round_handle == NULL)
		return true;
	switch (GetBackgroundWorkerPid(worker_round_handle, &pid))
	{
		case BGWH_STOPPED:
			pfree(worker_round_handle);
			worker_round_handle = NULL;
			return true;
		case BGWH_POSTMASTER_DIED:
			proc_exit(1);
			break;
		default:
			break;
	}
	return false;
}

/*
 * What the launcher does at every interval, whether or not a round runs
 * (one may wait on a lock for long): make room in the statistics for the
 * dropped databases' entries, and judge the namespaces silent since a
 * burst of duplicates.
 */
static void
worker_judge(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	(void) idem_stats_forget_dropped();
	CommitTransactionCommand();
	idem_stats_judge_idle(worker_database_name);
}

/*
 * The launcher: a round every idem.maintenance_interval, counted from the
 * end of the last.  Whatever else wakes it (a reload, a signal barrier of
 * DROP DATABASE, a late notice of a round) starts no round before its time.
 */
void
idem_maintenance_main(Datum main_arg)
{
	TimestampTz next_round = 0;
	TimestampTz next_judge = 0;
	bool		running = false;	/* a round was started and has not ended */
	Oid			dbid = InvalidOid;
	NameData	dbname;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	/* a cancel would be an error, and an error ends the launcher */
	pqsignal(SIGINT, SIG_IGN);
	BackgroundWorkerUnblockSignals();
	/* no database: only the shared catalogs, to see whether it exists */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	before_shmem_exit(worker_end_round, (Datum) 0);

	ereport(LOG,
			(errmsg("idem maintenance worker started for database \"%s\", every %d s",
					worker_database, worker_interval)));

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			int			old_interval = worker_interval;

			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* a new interval counts from the end of the last round */
			if (worker_interval != old_interval)
			{
				if (next_round != 0)
					next_round = TimestampTzPlusMilliseconds(next_round,
															 (worker_interval - old_interval) * 1000L);
				if (next_judge != 0)
					next_judge = TimestampTzPlusMilliseconds(next_judge,
															 (worker_interval - old_interval) * 1000L);
			}
		}
		now = GetCurrentTimestamp();
		/* a clock set back postpones a round by an interval at most */
		if (next_round > TimestampTzPlusMilliseconds(now, worker_interval * 1000L))
			next_round = TimestampTzPlusMilliseconds(now, worker_interval * 1000L);
		if (next_judge > TimestampTzPlusMilliseconds(now, worker_interval * 1000L))
			next_judge = TimestampTzPlusMilliseconds(now, worker_interval * 1000L);

		/* a round that ended: the next one an interval from now */
		if (running && worker_round_ended())
		{
			running = false;
			worker_judge();
			now = GetCurrentTimestamp();
			next_round = next_judge =
				TimestampTzPlusMilliseconds(now, worker_interval * 1000L);
			continue;
		}
		if (!running && now >= next_round)
		{
			switch (worker_database_state(&dbid, &dbname))
			{
				case WORKER_DB_OK:
					/* the database is back: a state of it is logged again */
					if (worker_shared->launcher_logged != -6)
						worker_shared->launcher_logged = 0;
					worker_start_round(dbid);
					running = (worker_round_handle != NULL);
					break;
				case WORKER_DB_MISSING:
					if (worker_log_once(-4))
						ereport(LOG,
								(errmsg("idem maintenance worker: database \"%s\" does not exist",
										worker_database),
								 errhint("Create it, or set idem.database to the database that has idem.")));
					break;
				case WORKER_DB_NO_CONNECTIONS:
					if (worker_log_once(-5))
						ereport(LOG,
								(errmsg("idem maintenance worker: database \"%s\" does not accept connections",
										NameStr(dbname)),
								 errhint("Allow connections to it, or set idem.database to another database.")));
					break;
			}
			if (running)
			{
				/* judged when it ends, or an interval from now */
				next_judge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														 worker_interval * 1000L);
				continue;
			}
			worker_judge();
			next_round = next_judge =
				TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											worker_interval * 1000L);
			continue;
		}
		/* a round still running after an interval (waiting on a lock, say) */
		if (running && now >= next_judge)
		{
			worker_judge();
			next_judge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 worker_interval * 1000L);
			continue;
		}
		wake = running ? next_judge : next_round;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 TimestampDifferenceMilliseconds(now, wake),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
