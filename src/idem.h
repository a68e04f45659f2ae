/*-------------------------------------------------------------------------
 *
 * idem.h
 *	  Shared declarations of the idem extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_H
#define IDEM_H

#include "postgres.h"

#include "access/tupdesc.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "nodes/execnodes.h"
#include "storage/lockdefs.h"
#include "utils/relcache.h"
#include "utils/timestamp.h"

/* Limits of keys, in bytes. */
#define IDEM_MAX_KEY_LEN	512
#define IDEM_MAX_NS_LEN		63

/* Name of the schema that holds idem's tables. */
#define IDEM_SCHEMA			"idem"

/* idem.c: argument checks shared by every capability */
extern text *idem_arg_key(FunctionCallInfo fcinfo, int argno, const char *what,
						  int maxlen);
extern text *idem_arg_ns(FunctionCallInfo fcinfo, int argno);
extern void idem_check_key(text *key, const char *what, int maxlen);
extern void idem_check_raw_len(Datum value, const char *what, int maxlen);
extern void idem_check_writable(const char *fname);
extern char *idem_interval_text(Interval *span);
extern Oid	idem_enum_label_oid(FunctionCallInfo fcinfo, int index,
								const char *const *labels, int nlabels);
extern Oid	idem_enum_type_label_oid(Oid typoid, int index,
									 const char *const *labels, int nlabels);

/* idem.c: a column one of idem's tables must have, in order */
typedef struct IdemColumn
{
	const char *name;
	Oid			type;
	bool		notnull;
	Oid			collation;		/* InvalidOid: any */
} IdemColumn;

extern void idem_check_columns(TupleDesc desc, const char *relname,
							   const IdemColumn *cols, int ncols);
extern void idem_check_index(Relation index, Relation rel, int nkeys,
							 const AttrNumber *attnums);
extern void idem_check_readable(Relation rel, const char *relname);

/*
 * store.c: the one interface through which a capability reaches a keyed
 * table of idem.  A keyed table has a unique btree index on its first two
 * columns (namespace, key), both text with the C collation.  The direct path
 * below reads and writes the table through the table and index access
 * methods; a path through SQL (needed when the table is distributed) can be
 * added behind the same calls.
 */
typedef enum IdemStoreWait
{
	IDEM_WAIT,					/* wait for an in-flight holder to finish */
	IDEM_NOWAIT					/* report an in-flight holder */
} IdemStoreWait;

typedef enum IdemStoreResult
{
	IDEM_STORE_INSERTED,		/* this call inserted the row */
	IDEM_STORE_EXISTS,			/* a committed row (or one of ours) exists */
	IDEM_STORE_IN_FLIGHT,		/* another transaction holds an uncommitted row */
	IDEM_STORE_ABSENT			/* no row (lookups only) */
} IdemStoreResult;

typedef struct IdemStore IdemStore;

extern void idem_store_init(void);
extern void idem_guard_init(void);
extern void idem_outbox_init(void);

/*
 * What each part forgets when the relcache says a relation changed (relid,
 * or InvalidOid for every relation).  idem registers one relcache callback
 * that calls them all: a backend has room for ten, which Citus and
 * PostgreSQL's own caches nearly fill.
 */
extern void idem_store_relcache(Oid relid);
extern void idem_token_relcache(Oid relid);
extern void idem_guard_relcache(Oid relid);
extern void idem_outbox_relcache(Oid relid);

/* citus.c: planning of idem's calls on a Citus node */
extern void idem_citus_init(void);

/*
 * A client session: on one server its pid and start time (node -1); on a
 * Citus cluster also the node it is connected to (session.c).
 */
typedef struct IdemSession
{
	int32		node;
	int32		pid;
	TimestampTz started;
} IdemSession;

extern bool idem_session_alive(int32 pid, TimestampTz started);
extern void idem_citus_session(Oid runas, IdemSession *me);
extern bool idem_citus_session_alive(Oid runas, const IdemSession *s);

extern IdemStore *idem_store_open(const char *relname, LOCKMODE lockmode);
extern IdemStore *idem_store_open_keys(const char *relname, LOCKMODE lockmode,
									   int nkeys);
extern void idem_store_close(IdemStore *store);
extern bool idem_relation_is_distributed(Oid relid);
extern bool idem_store_through_sql(IdemStore *store);
extern Oid	idem_store_relowner(IdemStore *store);
extern TupleDesc idem_store_tupdesc(IdemStore *store);
extern Relation idem_store_index(IdemStore *store);
extern ItemPointerData idem_store_inserted_tid(IdemStore *store);
extern void idem_store_hint(IdemStore *store, ItemPointer tid);
extern IdemStoreResult idem_store_insert(IdemStore *store, Datum *values,
										 bool *isnull, IdemStoreWait wait);
extern IdemStoreResult idem_store_lookup(IdemStore *store, Datum ns, Datum key,
										 IdemStoreWait wait, Datum *values,
										 bool *isnull);
extern bool idem_store_delete(IdemStore *store, Datum ns, Datum key);

/*
 * store.c: update in place and read of the latest version (single-use
 * tokens).
 */
typedef enum IdemStoreUpdateResult
{
	IDEM_UPDATE_DONE,			/* this call updated the row */
	IDEM_UPDATE_DECLINED,		/* the row exists; fn left it as it was */
	IDEM_UPDATE_ABSENT,			/* no row */
	IDEM_UPDATE_BUSY			/* another transaction is changing the row
								 * (idem_store_try_update only) */
} IdemStoreUpdateResult;

typedef bool (*IdemStoreUpdateFn) (TupleDesc tupdesc, Datum *values,
								   bool *isnull, void *arg);

extern IdemStoreUpdateResult idem_store_update(IdemStore *store, Datum ns,
											   Datum key, IdemStoreUpdateFn fn,
											   void *arg);
extern IdemStoreUpdateResult idem_store_update_at(IdemStore *store,
												  ItemPointer latest,
												  Datum ns, Datum key,
												  IdemStoreUpdateFn fn,
												  void *arg);
extern IdemStoreUpdateResult idem_store_try_update_latest(IdemStore *store,
														  ItemPointer latest,
														  Datum ns, Datum key,
														  IdemStoreUpdateFn fn,
														  void *arg);
extern ItemPointerData idem_store_updated_tid(IdemStore *store);
extern bool idem_store_version_untouched(IdemStore *store, ItemPointer tid);
extern void idem_store_require_snapshot(IdemStore *store);
extern void idem_store_require_snapshot_insert(IdemStore *store);
extern IdemStoreUpdateResult idem_store_try_update(IdemStore *store,
												   Datum ns, Datum key,
												   IdemStoreUpdateFn fn,
												   void *arg);
extern IdemStoreUpdateResult idem_store_try_update_at(IdemStore *store,
													  ItemPointer tid,
													  Datum *values,
													  bool *isnull,
													  IdemStoreUpdateFn fn,
													  void *arg);
extern bool idem_store_read(IdemStore *store, Datum ns, Datum key,
							Datum *values, bool *isnull);

/*
 * store.c: the same calls for a table whose unique index has one to three
 * key columns of any type (idem_store_open_keys); idem_store_insert takes
 * the key from the first columns of values.
 */
extern IdemStoreUpdateResult idem_store_update_keys(IdemStore *store,
													const Datum *keys,
													IdemStoreUpdateFn fn,
													void *arg);
extern bool idem_store_read_keys(IdemStore *store, const Datum *keys,
								 Datum *values, bool *isnull);

/*
 * stats.c: counters of outcomes in shared memory, added when the
 * transaction commits (nothing is counted without shared_preload_libraries).
 */
typedef enum IdemStatKind
{
	IDEM_KIND_CLAIM,
	IDEM_KIND_TOKEN,
	IDEM_KIND_TRANSITION,
	IDEM_KIND_REQUEST,
	IDEM_KIND_OUTBOX,
	IDEM_NKINDS
} IdemStatKind;

#define IDEM_STAT_MAX_OUTCOMES 8

/* outcomes of each kind, in the order stats.c names them */
enum
{
	IDEM_CLAIM_CLAIMED, IDEM_CLAIM_DUPLICATE, IDEM_CLAIM_IN_FLIGHT,
	IDEM_CLAIM_WAITED
};
enum
{
	IDEM_TOKEN_ISSUED, IDEM_TOKEN_CONSUMED, IDEM_TOKEN_REJECTED_CONSUMED,
	IDEM_TOKEN_REJECTED_EXPIRED, IDEM_TOKEN_REJECTED_UNKNOWN
};
/* transitions: the outcomes of idem_transition, in their enum's order */
/* requests: the statuses of idem_request_begin, then: */
#define IDEM_REQUEST_FINISHED 5
enum
{
	IDEM_OUTBOX_SENT, IDEM_OUTBOX_LEASED, IDEM_OUTBOX_REDELIVERED,
	IDEM_OUTBOX_DELIVERED, IDEM_OUTBOX_RETRIED, IDEM_OUTBOX_DEAD
};

extern void idem_stats_init(void);
extern void idem_stats_judge_idle(const char *(*dbname) (Oid dbid));
extern int	idem_stats_forget_dropped(void);

/* worker.c: the maintenance worker */
extern void idem_worker_init(void);
extern void idem_stat_count(IdemStatKind kind, const char *ns, int nslen,
							int outcome, int64 n);
extern void idem_stat_count_text(IdemStatKind kind, text *ns, int outcome,
								 int64 n);

/* store.c: how many times this backend waited for another transaction */
extern uint64 idem_store_waits;

#endif							/* IDEM_H */
