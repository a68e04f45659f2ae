/*-------------------------------------------------------------------------
 *
 * store.c
 *	  Keyed tables of idem, reached through the table and index access
 *	  methods.
 *
 * Every capability keeps its rows in an ordinary heap table of the schema
 * "idem" whose primary key is (namespace, key).  This file is the only place
 * that reads or writes such a table directly.  Insertion follows the
 * executor's INSERT ... ON CONFLICT DO NOTHING (ExecInsert in
 * nodeModifyTable.c): a pre-check through the unique index with a dirty
 * snapshot, then a speculative heap insertion whose index entries are made
 * with a partial uniqueness check, backed out and retried when a concurrent
 * inserter won the race.  A conflict is therefore never an error, and a
 * holder that is still in progress is waited for exactly as a unique index
 * would wait for it (lock_timeout and statement_timeout apply).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/subtrans.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_namespace.h"
#include "executor/spi.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"

#include "idem.h"

uint64		idem_store_waits = 0;

/*
 * A keyed table's unique index has two key columns: namespace and key.  A
 * table opened with idem_store_open_keys may have one to STORE_MAX_KEYS key
 * columns of any btree type (ordered streams key their offsets by consumer,
 * stream and partition), always the table's first columns, in order.
 */
#define STORE_NKEYS 2
#define STORE_MAX_KEYS 3

struct IdemStore
{
	Relation	rel;
	Relation	index;			/* unique index on (ns, key) */
	LOCKMODE	lockmode;
	MemoryContext mcxt;			/* where the store lives */
	bool		indexes_open;	/* ExecOpenIndices done on rri */
	ResultRelInfo *rri;
	EState	   *estate;
	bool		own_estate;		/* estate made for this store, freed at close */
	IndexScanDesc scan;			/* probes through the unique index */
	bool		heap;			/* the table is a heap: see store_fetch */
	Buffer		hbuf;			/* heap page pinned by store_fetch */
	ItemPointerData hint;		/* where the next probe looks first */
	ItemPointerData last_tid;	/* where the last insertion put its row */
	ItemPointerData updated_tid;	/* where the last update put its version */
	BlockNumber nblocks;		/* the table's size, once store_fetch_version
								 * asked (InvalidBlockNumber: not yet) */
	SnapshotData dirty;			/* the probes' snapshot */
	List	   *arbiters;		/* list of the unique index's OID */
	TupleTableSlot *probe_slot; /* receives existing rows */
	TupleTableSlot *ins_slot;	/* holds the row being inserted */
	int			nkeys;			/* key columns of the unique index */
	Oid			eqproc[STORE_MAX_KEYS];
	Oid			collation[STORE_MAX_KEYS];
	struct StoreCacheEntry *entry;	/* counted as a user of it */
	bool		sql;			/* distributed: every call goes through SQL */
	bool		xact_snapshot;	/* updates judge against the transaction's
								 * snapshot: idem_store_require_snapshot */
	bool		xact_snapshot_insert;	/* and insertions:
										 * idem_store_require_snapshot_insert */
};

/*
 * Relation and index OIDs, looked up by name once per backend and forgotten
 * when the relcache says the table changed (DROP EXTENSION, for one).
 */
typedef struct StoreCacheEntry
{
	char		relname[NAMEDATALEN];
	Oid			relid;
	Oid			indexid;
	Oid			eqproc[STORE_MAX_KEYS]; /* equality of each key column */
	Oid			collation[STORE_MAX_KEYS];

	/*
	 * The table's indexes, with their IndexInfo built once rather than on
	 * every call.  Only kept when every index is a plain btree (no
	 * expressions, no predicate), whose IndexInfo insertion never changes.
	 * "stale" is set by invalidation; the memory is freed when no store is
	 * using it.
	 */
	bool		indexes_valid;
	bool		indexes_simple;
	int			nindexes;
	Oid		   *indexoids;
	IndexInfo **indexinfos;
	MemoryContext indexcxt;
	int			inval_count;	/* invalidations seen while building */
	int			users;			/* stores open on it, reset at xact end */

	/* new keys inserted in a row by this backend, up to STORE_NEW_STREAK */
	int			new_streak;

	/*
	 * Whether Citus distributes the table (a row of pg_dist_partition):
	 * looked up once, forgotten with relid.
	 */
	bool		dist_known;
	bool		distributed;

	/*
	 * Which key column Citus distributes the table by (-1: none of them;
	 * STORE_DIST_UNKNOWN: not asked yet), for store_sql_probe_shard.
	 */
	int			dist_key;

	/*
	 * Whether this node holds a placement of any of the table's shards (1),
	 * none (0), or STORE_DIST_UNKNOWN.  Citus invalidates the table's
	 * relcache entry when it adds or removes a placement, which forgets it.
	 */
	int			local_placements;
} StoreCacheEntry;

#define STORE_DIST_UNKNOWN (-2)

static IdemStore *store_open_direct(IdemStore *store, StoreCacheEntry *e,
									Relation rel, Oid indexid,
									LOCKMODE lockmode, const char *relname);

/* the path through SQL, for a table distributed by Citus: see the end */
static bool store_is_distributed(Oid relid);
static IdemStoreResult store_sql_insert(IdemStore *store, Datum *values,
										bool *isnull, IdemStoreWait wait);
static IdemStoreResult store_sql_lookup(IdemStore *store, const Datum *keys,
										IdemStoreWait wait, Datum *values,
										bool *isnull);
static bool store_sql_delete(IdemStore *store, const Datum *keys);
static IdemStoreUpdateResult store_sql_update(IdemStore *store,
											  const Datum *keys,
											  IdemStoreUpdateFn fn, void *arg,
											  IdemStoreWait wait);
static bool store_sql_read(IdemStore *store, const Datum *keys,
						   Datum *values, bool *isnull);
static void store_sql_unsupported(IdemStore *store, const char *what);

/*
 * idem_store_insert skips its pre-check while the last STORE_NEW_STREAK keys
 * this backend inserted into the table were all new; see there.
 */
#define STORE_NEW_STREAK 16

#define STORE_CACHE_SIZE 8
static StoreCacheEntry store_cache[STORE_CACHE_SIZE];
static int	store_cache_used = 0;

/*
 * Whether Citus distributes a table other than idem's own (a guarded one):
 * the last few answered, each forgotten on its table's invalidation, which
 * Citus sends whenever it changes the table's row of pg_dist_partition.
 */
#define STORE_DIST_CACHE_SIZE 16
typedef struct StoreDistEntry
{
	Oid			relid;
	bool		distributed;
} StoreDistEntry;
static StoreDistEntry store_dist_cache[STORE_DIST_CACHE_SIZE];
static int	store_dist_next = 0;
static uint64 store_dist_invals = 0;	/* invalidations seen */

void
idem_store_relcache(Oid relid)
{
	int			i;

	store_dist_invals++;
	for (i = 0; i < STORE_DIST_CACHE_SIZE; i++)
		if (!OidIsValid(relid) || store_dist_cache[i].relid == relid)
			store_dist_cache[i].relid = InvalidOid;

	for (i = 0; i < store_cache_used; i++)
	{
		if (relid == InvalidOid || store_cache[i].relid == relid ||
			store_cache[i].indexid == relid)
		{
			store_cache[i].relid = InvalidOid;
			store_cache[i].indexid = InvalidOid;
			store_cache[i].eqproc[0] = InvalidOid;
			store_cache[i].indexes_valid = false;
			store_cache[i].dist_known = false;
			store_cache[i].dist_key = STORE_DIST_UNKNOWN;
			store_cache[i].local_placements = STORE_DIST_UNKNOWN;
			store_cache[i].inval_count++;
		}
		else
		{
			int			j;

			for (j = 0; j < store_cache[i].nindexes; j++)
				if (store_cache[i].indexoids[j] == relid)
				{
					store_cache[i].indexes_valid = false;
					store_cache[i].inval_count++;
				}
		}
	}
}

/* A store never outlives a call: any still counted at xact end was abandoned. */
static void
store_xact_callback(XactEvent event, void *arg)
{
	int			i;

	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PARALLEL_ABORT || event == XACT_EVENT_PREPARE)
	{
		for (i = 0; i < store_cache_used; i++)
			store_cache[i].users = 0;
	}
}

void
idem_store_init(void)
{
	RegisterXactCallback(store_xact_callback, NULL);
}

/*
 * The EState that index insertion needs; one per backend, since it holds
 * nothing but memory and its per-tuple context is reset after each row.
 */
static EState *
store_estate(void)
{
	static EState *estate = NULL;

	if (estate == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

		estate = CreateExecutorState();
		MemoryContextSwitchTo(oldcxt);
	}
	return estate;
}

/*
 * (Re)build the entry's list of indexes with their IndexInfo.  The indexes
 * are opened here only to read their definitions.
 */
static void
store_build_indexes(StoreCacheEntry *e, Relation rel)
{
	List	   *oids = RelationGetIndexList(rel);
	MemoryContext cxt;
	MemoryContext oldcxt;
	ListCell   *lc;
	int			i = 0;
	int			n;
	bool		simple = true;

	/*
	 * Free the old definitions, unless a store may still use them: one of an
	 * outer call, or one abandoned by an error earlier in this transaction
	 * (its count is only reset at transaction end).  Those go with the
	 * transaction.
	 */
	if (e->indexcxt != NULL)
	{
		if (e->users == 0)
			MemoryContextDelete(e->indexcxt);
		else
			MemoryContextSetParent(e->indexcxt, TopTransactionContext);
	}
	e->indexcxt = NULL;
	e->indexes_valid = false;

	e->nindexes = 0;
	cxt = AllocSetContextCreate(CacheMemoryContext, "idem store indexes",
								ALLOCSET_SMALL_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);
	n = list_length(oids);
	e->indexoids = palloc(Max(n, 1) * sizeof(Oid));
	e->indexinfos = palloc(Max(n, 1) * sizeof(IndexInfo *));
	e->inval_count = 0;
	foreach(lc, oids)
	{
		Oid			indexoid = lfirst_oid(lc);
		Relation	irel = index_open(indexoid, AccessShareLock);
		IndexInfo  *ii = BuildIndexInfo(irel);

		if (ii->ii_Unique)
			BuildSpeculativeIndexInfo(irel, ii);
		if (irel->rd_rel->relam != BTREE_AM_OID || ii->ii_Expressions != NIL ||
			ii->ii_Predicate != NIL || ii->ii_ExclusionOps != NULL)
			simple = false;
		e->indexoids[i] = indexoid;
		e->indexinfos[i] = ii;
		i++;
		index_close(irel, AccessShareLock);
	}
	MemoryContextSwitchTo(oldcxt);
	list_free(oids);

	e->indexcxt = cxt;
	e->nindexes = n;
	e->indexes_simple = simple;
	/* an invalidation that came while we read the definitions wins */
	e->indexes_valid = (e->inval_count == 0);
}

/*
 * The indexes a conflicting key is looked for in: the unique index of the
 * key, and every other unique index that is the same (REINDEX CONCURRENTLY
 * builds its copy beside it, and PostgreSQL maintains both for a while).
 * An insertion that finds its key in an index that is not among them fails
 * with a unique violation instead of reporting the conflict.
 */
static List *
store_arbiters(IdemStore *store)
{
	List	   *arbiters = list_make1_oid(RelationGetRelid(store->index));
	int2vector *key = &store->index->rd_index->indkey;
	int			nkeys = store->index->rd_index->indnkeyatts;
	int			i;
	int			j;

	if (!store->indexes_open)
		return arbiters;
	for (i = 0; i < store->rri->ri_NumIndices; i++)
	{
		Relation	irel = store->rri->ri_IndexRelationDescs[i];
		IndexInfo  *ii = store->rri->ri_IndexRelationInfo[i];
		bool		same;

		if (irel == store->index || !ii->ii_Unique || !ii->ii_ReadyForInserts ||
			irel->rd_rel->relam != BTREE_AM_OID ||
			ii->ii_Expressions != NIL || ii->ii_Predicate != NIL ||
			ii->ii_NumIndexKeyAttrs != nkeys)
			continue;
		same = true;
		for (j = 0; same && j < nkeys; j++)
			same = ii->ii_IndexAttrNumbers[j] == key->values[j] &&
				irel->rd_opfamily[j] == store->index->rd_opfamily[j] &&
				irel->rd_indcollation[j] == store->index->rd_indcollation[j];
		if (same)
			arbiters = lappend_oid(arbiters, RelationGetRelid(irel));
	}
	return arbiters;
}

/*
 * Open every index of the store's table for insertion, as ExecOpenIndices
 * does, but with the IndexInfo kept by the cache when it can be.
 */
static void
store_open_indexes(IdemStore *store, StoreCacheEntry *e)
{
	ResultRelInfo *rri = store->rri;
	int			i;

	int			n;
	Oid		   *oids;
	IndexInfo **infos;

	if (!e->indexes_valid)
		store_build_indexes(e, store->rel);
	if (!e->indexes_simple)
	{
		/*
		 * Expression or partial indexes (none of idem's own): their state is
		 * built in the EState, so this store gets an EState of its own.
		 */
		ExecOpenIndices(rri, true);
		store->own_estate = true;
		return;
	}

	/*
	 * Invalidations processed while the indexes are opened only mark the
	 * entry; its arrays stay until the next open rebuilds them.
	 */
	n = e->nindexes;
	oids = e->indexoids;
	infos = e->indexinfos;
	rri->ri_NumIndices = n;
	rri->ri_IndexRelationDescs = palloc(Max(n, 1) * sizeof(Relation));
	rri->ri_IndexRelationInfo = palloc(Max(n, 1) * sizeof(IndexInfo *));
	for (i = 0; i < n; i++)
	{
		rri->ri_IndexRelationDescs[i] = index_open(oids[i], RowExclusiveLock);
		rri->ri_IndexRelationInfo[i] = infos[i];
	}
}

static StoreCacheEntry *
store_cache_entry(const char *relname)
{
	int			i;
	StoreCacheEntry *e;

	for (i = 0; i < store_cache_used; i++)
	{
		if (strcmp(store_cache[i].relname, relname) == 0)
			return &store_cache[i];
	}
	if (store_cache_used >= STORE_CACHE_SIZE)
		elog(ERROR, "too many idem tables");
	e = &store_cache[store_cache_used++];
	strlcpy(e->relname, relname, NAMEDATALEN);
	e->relid = InvalidOid;
	e->indexid = InvalidOid;
	e->eqproc[0] = InvalidOid;
	e->dist_known = false;
	e->dist_key = STORE_DIST_UNKNOWN;
	e->local_placements = STORE_DIST_UNKNOWN;
	return e;
}

static Oid
store_lookup_relid(const char *relname)
{
	Oid			nspid = get_namespace_oid(IDEM_SCHEMA, true);
	Oid			relid = InvalidOid;

	if (OidIsValid(nspid))
		relid = get_relname_relid(relname, nspid);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"%s.%s\" of the idem extension does not exist",
						IDEM_SCHEMA, relname),
				 errhint("Install the extension with CREATE EXTENSION idem.")));
	return relid;
}

/*
 * Whether Citus distributes the table relid: whether pg_dist_partition, when
 * it exists, has a row for it.  Asked once per table and backend (see
 * StoreCacheEntry.dist_known); Citus sends a relcache invalidation of the
 * table whenever it changes the table's row.
 */
static bool
store_is_distributed(Oid relid)
{
	Oid			catid = get_relname_relid("pg_dist_partition",
										  PG_CATALOG_NAMESPACE);
	Relation	cat;
	TableScanDesc scan;
	ScanKeyData skey;
	bool		found;

	if (!OidIsValid(catid))
		return false;
	cat = try_table_open(catid, AccessShareLock);
	if (cat == NULL)
		return false;
	/* logicalrelid is the catalog's first column */
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = table_beginscan_catalog(cat, 1, &skey);
	found = (heap_getnext(scan, ForwardScanDirection) != NULL);
	table_endscan(scan);
	table_close(cat, AccessShareLock);
	return found;
}

/*
 * Whether Citus distributes relid, for the guard's refusal: without Citus in
 * the database, a look-up of the catalog's name in the syscache, nothing
 * more; with it, a scan of pg_dist_partition the first time a table is
 * asked about.
 */
bool
idem_relation_is_distributed(Oid relid)
{
	StoreDistEntry *e;
	uint64		invals = store_dist_invals;
	bool		distributed;
	int			i;

	for (i = 0; i < STORE_DIST_CACHE_SIZE; i++)
		if (OidIsValid(relid) && store_dist_cache[i].relid == relid)
			return store_dist_cache[i].distributed;
	distributed = store_is_distributed(relid);

	/*
	 * The answer is kept only if no invalidation came while it was read
	 * (the catalog's scan may process some): one that did may concern it.
	 */
	if (invals != store_dist_invals)
		return distributed;
	e = &store_dist_cache[store_dist_next];
	store_dist_next = (store_dist_next + 1) % STORE_DIST_CACHE_SIZE;
	e->relid = relid;
	e->distributed = distributed;
	return distributed;
}

/*
 * A store on a distributed table: only the relation is kept, for its row
 * type; every call runs a statement through SPI, which Citus plans and sends
 * to the shard of the key (or runs on it, when it is on this node).
 */
static IdemStore *
store_open_sql(IdemStore *store, StoreCacheEntry *e, Relation rel,
			   LOCKMODE lockmode)
{
	store->entry = e;
	store->rel = rel;
	store->lockmode = lockmode;
	store->mcxt = CurrentMemoryContext;
	store->sql = true;
	ItemPointerSetInvalid(&store->hint);
	ItemPointerSetInvalid(&store->last_tid);
	ItemPointerSetInvalid(&store->updated_tid);
	return store;
}

/*
 * Open one of idem's keyed tables.  With RowExclusiveLock every index of the
 * table is opened for insertion, as the executor does.
 *
 * Opening a relation may process invalidation messages, which reset the
 * cache entry under our feet: what the entry says is copied into the store
 * before anything else is opened, and only the copy is used afterwards.
 */
IdemStore *
idem_store_open(const char *relname, LOCKMODE lockmode)
{
	return idem_store_open_keys(relname, lockmode, STORE_NKEYS);
}

/*
 * The same for a table whose unique index has nkeys key columns (1 to
 * STORE_MAX_KEYS), the table's first columns in order.  The calls taking
 * (ns, key) need two; the others take the key as an array of nkeys Datums.
 */
IdemStore *
idem_store_open_keys(const char *relname, LOCKMODE lockmode, int nkeys)
{
	StoreCacheEntry *e = store_cache_entry(relname);
	IdemStore  *store;
	Relation	rel = NULL;
	Oid			relid;
	Oid			indexid;
	int			tries;

	if (nkeys < 1 || nkeys > STORE_MAX_KEYS)
		elog(ERROR, "a keyed table has 1 to %d key columns, not %d",
			 STORE_MAX_KEYS, nkeys);
	store = palloc0(sizeof(IdemStore));
	store->nkeys = nkeys;
	for (tries = 0; rel == NULL; tries++)
	{
		relid = e->relid;
		if (!OidIsValid(relid))
			relid = store_lookup_relid(relname);
		rel = try_relation_open(relid, lockmode);
		if (rel == NULL)
		{
			/* dropped under us: look the name up again, once */
			e->relid = InvalidOid;
			if (tries > 0)
				ereport(ERROR,
						(errcode(ERRCODE_UNDEFINED_TABLE),
						 errmsg("table \"%s.%s\" of the idem extension was dropped concurrently",
								IDEM_SCHEMA, relname)));
		}
	}

	/*
	 * Whatever carries the name must be an ordinary table: the access
	 * methods are called on it below, and a partitioned table has none.
	 */
	if (rel->rd_rel->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("\"%s.%s\" of the idem extension is not an ordinary table",
						IDEM_SCHEMA, relname),
				 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));

	idem_check_readable(rel, relname);

	/* with the lock held, the table and its primary key stay as they are */
	if (e->relid != relid)
	{
		e->relid = relid;
		e->indexid = InvalidOid;
		e->eqproc[0] = InvalidOid;
		e->indexes_valid = false;
		e->dist_known = false;
		e->dist_key = STORE_DIST_UNKNOWN;
		e->local_placements = STORE_DIST_UNKNOWN;
	}

	/*
	 * A table that Citus distributes is an empty shell here: its rows are in
	 * shards, which only a query through Citus's planner reaches.
	 */
	if (!e->dist_known)
	{
		e->distributed = store_is_distributed(relid);
		e->dist_known = (e->relid == relid);
	}
	if (e->distributed)
		return store_open_sql(store, e, rel, lockmode);
	indexid = e->indexid;
	if (!OidIsValid(indexid))
	{
		indexid = RelationGetPrimaryKeyIndex(rel);
		if (!OidIsValid(indexid))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" has no primary key",
							IDEM_SCHEMA, relname),
					 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
		e->indexid = indexid;
		e->eqproc[0] = InvalidOid;
	}
	return store_open_direct(store, e, rel, indexid, lockmode, relname);
}

/*
 * The rest of the opening of a store on a table the direct path reaches:
 * rel, opened with lockmode, and its primary key indexid.  e is the table's
 * cache entry, or NULL for a relation that has none (the local shard of a
 * distributed table), whose store is opened only to probe.
 */
static IdemStore *
store_open_direct(IdemStore *store, StoreCacheEntry *e, Relation rel,
				  Oid indexid, LOCKMODE lockmode, const char *relname)
{
	int			nkeys = store->nkeys;

	Assert(e != NULL || lockmode < RowExclusiveLock);
	store->rel = rel;
	store->lockmode = lockmode;
	store->mcxt = CurrentMemoryContext;
	store->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(store->rri, rel, 1, NULL, 0);
	if (lockmode >= RowExclusiveLock)
	{
		int			i;

		store_open_indexes(store, e);
		store->indexes_open = true;
		e->users++;
		store->entry = e;
		for (i = 0; i < store->rri->ri_NumIndices; i++)
		{
			Relation	irel = store->rri->ri_IndexRelationDescs[i];

			if (RelationGetRelid(irel) == indexid)
				store->index = irel;
		}
		if (store->index == NULL)
			elog(ERROR, "primary key of \"%s.%s\" was not opened",
				 IDEM_SCHEMA, relname);
	}
	else
		store->index = index_open(indexid, lockmode);

	if (e != NULL && OidIsValid(e->eqproc[0]) && e->indexid == indexid &&
		IndexRelationGetNumberOfKeyAttributes(store->index) == nkeys)
	{
		memcpy(store->eqproc, e->eqproc, sizeof(store->eqproc));
		memcpy(store->collation, e->collation, sizeof(store->collation));
	}
	else
	{
		static const char *const counts[] = {"", "one", "two", "three"};
		bool		shaped;
		int			i;

		/* rows are compared with the key by position: columns 1 to nkeys */
		shaped = (IndexRelationGetNumberOfKeyAttributes(store->index) == nkeys &&
				  store->index->rd_rel->relam == BTREE_AM_OID);
		for (i = 0; shaped && i < nkeys; i++)
			shaped = (store->index->rd_index->indkey.values[i] == i + 1);
		if (!shaped)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 nkeys == 1 ?
					 errmsg("primary key of \"%s.%s\" is not a btree on its first column",
							IDEM_SCHEMA, relname) :
					 errmsg("primary key of \"%s.%s\" is not a btree on its first %s columns",
							IDEM_SCHEMA, relname, counts[nkeys])));
		for (i = 0; i < nkeys; i++)
		{
			Oid			opcintype = store->index->rd_opcintype[i];
			Oid			eqop;

			eqop = get_opfamily_member(store->index->rd_opfamily[i],
									   opcintype, opcintype,
									   BTEqualStrategyNumber);
			if (!OidIsValid(eqop))
				elog(ERROR, "missing equality operator for type %u", opcintype);
			store->eqproc[i] = get_opcode(eqop);
			store->collation[i] = store->index->rd_indcollation[i];
		}
		if (e != NULL && e->indexid == indexid)
		{
			memcpy(e->eqproc, store->eqproc, sizeof(e->eqproc));
			memcpy(e->collation, store->collation, sizeof(e->collation));
		}
	}
	store->arbiters = store_arbiters(store);
	store->probe_slot = table_slot_create(rel, NULL);
	store->heap = (rel->rd_tableam == GetHeapamTableAmRoutine() &&
				   TTS_IS_BUFFERTUPLE(store->probe_slot));
	store->hbuf = InvalidBuffer;
	InitDirtySnapshot(store->dirty);
	ItemPointerSetInvalid(&store->hint);
	ItemPointerSetInvalid(&store->last_tid);
	ItemPointerSetInvalid(&store->updated_tid);
	store->nblocks = InvalidBlockNumber;
	return store;
}

/* Let go of the heap page the probes keep pinned. */
static void
store_unpin_page(IdemStore *store)
{
	if (BufferIsValid(store->hbuf))
	{
		ReleaseBuffer(store->hbuf);
		store->hbuf = InvalidBuffer;
	}
}

void
idem_store_close(IdemStore *store)
{
	if (store->sql)
	{
		table_close(store->rel, NoLock);
		pfree(store);
		return;
	}
	ExecDropSingleTupleTableSlot(store->probe_slot);
	store_unpin_page(store);
	if (store->scan)
		index_endscan(store->scan);
	if (store->ins_slot)
		ExecDropSingleTupleTableSlot(store->ins_slot);
	if (store->indexes_open && store->own_estate)
		ExecCloseIndices(store->rri);
	else if (store->indexes_open)
	{
		int			i;

		/*
		 * The locks stay until the end of the transaction, like the table's:
		 * releasing them only to take them again at the next call costs a
		 * trip through the lock manager per call.
		 */
		for (i = 0; i < store->rri->ri_NumIndices; i++)
			index_close(store->rri->ri_IndexRelationDescs[i], NoLock);
	}
	else
		index_close(store->index, store->lockmode);
	if (store->entry && store->entry->users > 0)
		store->entry->users--;
	if (store->own_estate && store->estate)
		FreeExecutorState(store->estate);
	table_close(store->rel, NoLock);
	list_free(store->arbiters);
	pfree(store->rri);
	pfree(store);
}

/*
 * Where the row that the last successful idem_store_insert made is: the root
 * of the row's chain of versions, which HOT updates and pruning keep where
 * it is.
 */
ItemPointerData
idem_store_inserted_tid(IdemStore *store)
{
	/* the path through SQL knows no row's place: an invalid hint */
	Assert(store->sql || ItemPointerIsValid(&store->last_tid));
	return store->last_tid;
}

/*
 * Where the next probe looks for its row before descending the index: a
 * caller that remembers where a row was inserted saves the descent while the
 * row stays there.  The hint is checked (the row found must have the key
 * sought) and may point anywhere; an invalid one is ignored.
 */
void
idem_store_hint(IdemStore *store, ItemPointer tid)
{
	if (tid != NULL && ItemPointerIsValid(tid))
		store->hint = *tid;
	else
		ItemPointerSetInvalid(&store->hint);
}

TupleDesc
idem_store_tupdesc(IdemStore *store)
{
	return RelationGetDescr(store->rel);
}

/* Whether the store's table is distributed by Citus (calls go through SQL). */
bool
idem_store_through_sql(IdemStore *store)
{
	return store->sql;
}

/* The owner of the store's table, as whom its statements run. */
Oid
idem_store_relowner(IdemStore *store)
{
	return store->rel->rd_rel->relowner;
}

/*
 * The unique index on the key, which idem_store_open checked; NULL for a
 * table distributed by Citus (the store then goes through SQL).
 */
Relation
idem_store_index(IdemStore *store)
{
	return store->index;
}

/*
 * What a probe found.  An in-flight deletion (a release or a purge not yet
 * committed) is told apart from an in-flight insertion.
 */
typedef enum ProbeResult
{
	PROBE_ABSENT,
	PROBE_EXISTS,
	PROBE_IN_FLIGHT_INSERT,
	PROBE_IN_FLIGHT_DELETE
} ProbeResult;

static void
store_scankeys(IdemStore *store, ScanKey skeys, const Datum *keys)
{
	int			i;

	for (i = 0; i < store->nkeys; i++)
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, store->collation[i],
							   store->eqproc[i], keys[i]);
}

/* The two key columns of a (ns, key) table as an array. */
static const Datum *
store_key_pair(IdemStore *store, Datum *pair, Datum ns, Datum key)
{
	Assert(store->nkeys == STORE_NKEYS);
	pair[0] = ns;
	pair[1] = key;
	return pair;
}

/*
 * When the heap pages the probes visit are pruned.  The executor's index
 * fetch prunes a page on every visit once its free space is under the
 * fillfactor's reserve (10% at least), and pruning reads every tuple of the
 * page.  A token's consumption, a HOT update, takes some of that free space
 * on every call, so each later visit of the page would prune it again to
 * reclaim one row version.  The store prunes when the free space left would
 * hold only a few more versions: still before an update has to leave the
 * page, far less often.
 */
#define STORE_PRUNE_FREE (BLCKSZ / 32)

/*
 * Pin the heap page blkno in store->hbuf, pruning it as store_fetch says.
 */
static Page
store_pin_page(IdemStore *store, BlockNumber blkno)
{
	if (!BufferIsValid(store->hbuf) ||
		BufferGetBlockNumber(store->hbuf) != blkno)
	{
		store->hbuf = ReleaseAndReadBuffer(store->hbuf, store->rel, blkno);
		if (PageGetHeapFreeSpace(BufferGetPage(store->hbuf)) < STORE_PRUNE_FREE)
			heap_page_prune_opt(store->rel, store->hbuf);
	}
	return BufferGetPage(store->hbuf);
}

/*
 * The next row of the probe scan visible to its snapshot, into slot: what
 * index_getnext_slot does, with pruning as above on a heap.  Other table
 * access methods take the common path.
 */
static bool
store_fetch(IdemStore *store, TupleTableSlot *slot)
{
	IndexScanDesc scan = store->scan;
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;

	if (!store->heap)
		return index_getnext_slot(scan, ForwardScanDirection, slot);

	for (;;)
	{
		ItemPointer tid = index_getnext_tid(scan, ForwardScanDirection);
		BlockNumber blkno;
		bool		all_dead = false;
		bool		found;

		if (tid == NULL)
			return false;
		blkno = ItemPointerGetBlockNumber(tid);
		store_pin_page(store, blkno);

		LockBuffer(store->hbuf, BUFFER_LOCK_SHARE);
		found = heap_hot_search_buffer(tid, store->rel, store->hbuf,
									   scan->xs_snapshot, &bslot->base.tupdata,
									   &all_dead, true);
		bslot->base.tupdata.t_self = *tid;
		LockBuffer(store->hbuf, BUFFER_LOCK_UNLOCK);
		if (found)
		{
			pgstat_count_heap_fetch(scan->indexRelation);
			slot->tts_tableOid = RelationGetRelid(store->rel);
			ExecStoreBufferHeapTuple(&bslot->base.tupdata, slot, store->hbuf);
			return true;
		}
		/* a dead chain: let the index mark its entry, as the executor does */
		if (!scan->xactStartedInRecovery)
			scan->kill_prior_tuple = all_dead;
	}
}

/* Let go of every page the probes keep pinned, restarting the index scan. */
static void
store_release_pins(IdemStore *store)
{
	store_unpin_page(store);
	if (store->scan)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(store->mcxt);

		index_rescan(store->scan, store->scan->keyData,
					 store->scan->numberOfKeys, NULL, 0);
		MemoryContextSwitchTo(oldcxt);
	}
}

/*
 * Whether the row in slot, a version a probe fetched by its TID, holds the
 * key sought (the index that led there may be stale, or the TID forged);
 * the slot is cleared when it does not.
 */
static bool
store_slot_has_keys(IdemStore *store, TupleTableSlot *slot, ScanKey skeys)
{
	int			i;

	slot_getsomeattrs(slot, store->nkeys);
	for (i = 0; i < store->nkeys; i++)
	{
		if (slot->tts_isnull[i] ||
			!DatumGetBool(FunctionCall2Coll(&skeys[i].sk_func,
											skeys[i].sk_collation,
											slot->tts_values[i],
											skeys[i].sk_argument)))
		{
			ExecClearTuple(slot);
			return false;
		}
	}
	return true;
}

/*
 * The row at the store's hint, into slot, if it is visible to the probe's
 * snapshot and is the row (ns, key) sought: one page read instead of a
 * descent of the index.  A hint comes from outside (a client may forge it):
 * any block and offset must be harmless.
 */
static bool
store_fetch_hint(IdemStore *store, Snapshot snapshot, ScanKey skeys,
				 TupleTableSlot *slot)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	ItemPointerData tid = store->hint;
	bool		all_dead;
	bool		found;

	if (!store->heap ||
		ItemPointerGetBlockNumber(&tid) >= RelationGetNumberOfBlocks(store->rel))
		return false;
	store_pin_page(store, ItemPointerGetBlockNumber(&tid));
	LockBuffer(store->hbuf, BUFFER_LOCK_SHARE);
	found = heap_hot_search_buffer(&tid, store->rel, store->hbuf, snapshot,
								   &bslot->base.tupdata, &all_dead, true);
	bslot->base.tupdata.t_self = tid;
	LockBuffer(store->hbuf, BUFFER_LOCK_UNLOCK);
	if (!found)
		return false;
	slot->tts_tableOid = RelationGetRelid(store->rel);
	ExecStoreBufferHeapTuple(&bslot->base.tupdata, slot, store->hbuf);
	return store_slot_has_keys(store, slot, skeys);
}

/*
 * Look for the row (ns, key) in the unique index with a dirty snapshot, so
 * that uncommitted rows of other transactions are seen too.  A speculative
 * insertion in progress is always waited for: it is decided in moments.  A
 * transaction in progress is waited for only with IDEM_WAIT, under oper
 * (what the wait's error context says the caller was doing).  On
 * PROBE_EXISTS and PROBE_IN_FLIGHT_DELETE the row is left in probe_slot.
 */
static ProbeResult
store_probe(IdemStore *store, const Datum *keys, IdemStoreWait wait,
			XLTW_Oper oper)
{
	ScanKeyData skeys[STORE_MAX_KEYS];
	TupleTableSlot *slot = store->probe_slot;

	store_scankeys(store, skeys, keys);

	for (;;)
	{
		SnapshotData *dirty = &store->dirty;
		TransactionId xwait;
		bool		inserting;
		ItemPointerData tid;
		bool		found;

		CHECK_FOR_INTERRUPTS();

		found = ItemPointerIsValid(&store->hint) &&
			store_fetch_hint(store, &store->dirty, skeys, slot);
		if (!found)
		{
			/*
			 * One index scan serves every probe of the store: beginning a
			 * btree scan allocates tens of kilobytes, which a batch would
			 * otherwise pay per key.  The scan allocates some of its state
			 * lazily (the btree's list of dead items, for one): it must
			 * outlive the caller's per-row context.
			 */
			MemoryContext oldcxt = MemoryContextSwitchTo(store->mcxt);

			if (store->scan == NULL)
				store->scan = index_beginscan(store->rel, store->index,
											  &store->dirty, store->nkeys, 0);
			index_rescan(store->scan, skeys, store->nkeys, NULL, 0);
			found = store_fetch(store, slot);
			MemoryContextSwitchTo(oldcxt);
		}
		if (!found)
		{
			/* what comes next (an insertion) may wait: keep no page pinned */
			ExecClearTuple(slot);
			store_unpin_page(store);
			return PROBE_ABSENT;
		}

		inserting = TransactionIdIsValid(dirty->xmin);
		xwait = inserting ? dirty->xmin : dirty->xmax;
		if (!TransactionIdIsValid(xwait))
			return PROBE_EXISTS;

		/*
		 * A speculative insertion ends within its statement, and is waited
		 * for even without waiting, as the executor's checks of unique
		 * indexes do; but not on a standby, where no lock of the primary's
		 * is held to wait on: a read there would go round until the
		 * insertion's end is replayed (or, after a crash of the primary,
		 * until its transaction is known to be gone).
		 */
		if (wait == IDEM_NOWAIT &&
			(!dirty->speculativeToken || RecoveryInProgress()))
		{
			if (!inserting)
				return PROBE_IN_FLIGHT_DELETE;	/* row left in the slot */
			ExecClearTuple(slot);
			return PROBE_IN_FLIGHT_INSERT;
		}

		/*
		 * Never wait holding a page pin: the slot and the scan (by a rescan)
		 * let go of theirs first.
		 */
		tid = slot->tts_tid;
		ExecClearTuple(slot);
		store_release_pins(store);
		idem_store_waits++;
		if (dirty->speculativeToken)
			SpeculativeInsertionWait(dirty->xmin, dirty->speculativeToken);
		else
			XactLockTableWait(xwait, store->rel, &tid, oper);
	}
}

/*
 * The executor state and the slot that writing needs, made on first use in
 * the store's own context (callers may reset theirs between rows).
 */
static TupleTableSlot *
store_write_slot(IdemStore *store)
{
	Assert(store->indexes_open);
	if (store->estate == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(store->mcxt);

		store->estate = store->own_estate ? CreateExecutorState() : store_estate();
		store->ins_slot = MakeSingleTupleTableSlot(RelationGetDescr(store->rel),
												   &TTSOpsVirtual);
		MemoryContextSwitchTo(oldcxt);
	}
	return store->ins_slot;
}

/*
 * Insert a row unless one with the same (ns, key) exists: the semantics of
 * INSERT ... ON CONFLICT DO NOTHING, with the outcome told to the caller.
 * values[0] and values[1] are the namespace and the key.
 */
static inline IdemStoreResult store_insert_direct(IdemStore *store,
													Datum *values,
													bool *isnull,
													IdemStoreWait wait);

IdemStoreResult
idem_store_insert(IdemStore *store, Datum *values, bool *isnull,
				  IdemStoreWait wait)
{
	if (unlikely(store->sql))
		return store_sql_insert(store, values, isnull, wait);
	return store_insert_direct(store, values, isnull, wait);
}

/*
 * After an insertion into a store that judges insertions against the
 * transaction's snapshot (idem_store_require_snapshot_insert), under
 * REPEATABLE READ and SERIALIZABLE: fail with 40001 when that snapshot still
 * sees a row of the key, which a transaction that committed after it
 * deleted (a purge).  The insertion answers as if the key had never been
 * there, which the snapshot contradicts, as an update of a version written
 * after it would (store_sql_check_snapshot does the same through SQL).  The
 * versions are read through SnapshotAny and judged one by one, so that the
 * look takes no predicate lock: under SERIALIZABLE, an index scan through
 * the snapshot would lock the leaf page, and insertions of other new keys
 * there would fail each other.  The row inserted is of the current command,
 * which the snapshot does not see.
 */
static void
store_check_insert_snapshot(IdemStore *store, const Datum *keys)
{
	ScanKeyData skeys[STORE_MAX_KEYS];
	IndexScanDesc scan;
	TupleTableSlot *slot = store->probe_slot;
	Snapshot	snapshot = GetTransactionSnapshot();
	bool		seen = false;

	store_scankeys(store, skeys, keys);
	scan = index_beginscan(store->rel, store->index, SnapshotAny,
						   store->nkeys, 0);
	index_rescan(scan, skeys, store->nkeys, NULL, 0);
	while (!seen && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;

		CHECK_FOR_INTERRUPTS();
		Assert(TTS_IS_BUFFERTUPLE(slot));
		LockBuffer(bslot->buffer, BUFFER_LOCK_SHARE);
		seen = HeapTupleSatisfiesVisibility(bslot->base.tuple, snapshot,
											bslot->buffer);
		/*
		 * A version this transaction deleted, in this very command (its
		 * snapshot still sees that), is no concurrent deletion.
		 */
		if (seen)
		{
			HeapTupleHeader htup = bslot->base.tuple->t_data;

			if (!(htup->t_infomask & HEAP_XMAX_INVALID) &&
				!HEAP_XMAX_IS_LOCKED_ONLY(htup->t_infomask) &&
				TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetUpdateXid(htup)))
				seen = false;
		}
		LockBuffer(bslot->buffer, BUFFER_LOCK_UNLOCK);
	}
	index_endscan(scan);
	ExecClearTuple(slot);
	if (seen)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent delete"),
				 errdetail("The row of this key in table \"%s.%s\" was deleted by a transaction that committed after this transaction's snapshot was taken.",
						   IDEM_SCHEMA, RelationGetRelationName(store->rel)),
				 errhint("The transaction might succeed if retried.")));
}

static inline IdemStoreResult
store_insert_direct(IdemStore *store, Datum *values, bool *isnull,
					IdemStoreWait wait)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	TupleTableSlot *slot = store_write_slot(store);
	StoreCacheEntry *e = store->entry;

	/*
	 * The pre-check descends the index once more than the insertion itself,
	 * which a stream of new keys never needs: the speculative insertion
	 * finds a conflicting key by itself, and is then backed out and followed
	 * by the pre-check, as when another session wins a race.  So the
	 * pre-check is skipped while this backend's last STORE_NEW_STREAK keys
	 * were all new, and made again from the first duplicate on, which keeps
	 * the cost of a run of duplicates (a redelivered batch) at one
	 * backed-out insertion.
	 */
	bool		precheck = (e->new_streak < STORE_NEW_STREAK);

	for (;;)
	{
		ProbeResult found;
		uint32		specToken;
		bool		specConflict = false;
		List	   *recheck;

		/* a batch of claims can be long, and a new key is never probed */
		CHECK_FOR_INTERRUPTS();
		if (precheck)
		{
			found = store_probe(store, values, wait, XLTW_InsertIndex);
			ExecClearTuple(store->probe_slot);
			if (found != PROBE_ABSENT)
			{
				e->new_streak = 0;
				return found == PROBE_EXISTS ? IDEM_STORE_EXISTS :
					IDEM_STORE_IN_FLIGHT;
			}
		}

		ExecClearTuple(slot);
		memcpy(slot->tts_values, values, tupdesc->natts * sizeof(Datum));
		memcpy(slot->tts_isnull, isnull, tupdesc->natts * sizeof(bool));
		ExecStoreVirtualTuple(slot);

		/*
		 * Others that find our tuple wait on the speculative insertion lock
		 * until we know whether the insertion stands.
		 */
		specToken = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(store->rel, slot,
									   GetCurrentCommandId(true), 0, NULL,
									   specToken);
		recheck = ExecInsertIndexTuples(store->rri, slot, store->estate,
										false, true, &specConflict,
										store->arbiters);
		table_tuple_complete_speculative(store->rel, slot, specToken,
										 !specConflict);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		list_free(recheck);
		ResetPerTupleExprContext(store->estate);

		if (!specConflict)
		{
			if (e->new_streak < STORE_NEW_STREAK)
				e->new_streak++;
			store->last_tid = slot->tts_tid;
			if (store->xact_snapshot_insert && IsolationUsesXactSnapshot())
				store_check_insert_snapshot(store, values);
			return IDEM_STORE_INSERTED;
		}
		/* The key exists or a concurrent inserter won: the pre-check finds it. */
		e->new_streak = 0;
		precheck = true;
	}
}

/* Copy the columns of the row in slot into the caller's memory. */
static void
store_copy_row(IdemStore *store, TupleTableSlot *slot, Datum *values,
			   bool *isnull)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	int			i;

	slot_getallattrs(slot);
	for (i = 0; i < tupdesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);

		isnull[i] = slot->tts_isnull[i];
		values[i] = isnull[i] ? (Datum) 0 :
			datumCopy(slot->tts_values[i], att->attbyval, att->attlen);
	}
}

/*
 * Find the row (ns, key).  With IDEM_NOWAIT an uncommitted insertion by
 * another transaction is reported as in flight; a row whose deletion is not
 * committed yet still exists.  On IDEM_STORE_EXISTS and when values is not
 * NULL, the row's columns are copied into values and isnull.
 */
IdemStoreResult
idem_store_lookup(IdemStore *store, Datum ns, Datum key, IdemStoreWait wait,
				  Datum *values, bool *isnull)
{
	ProbeResult found;
	TupleTableSlot *slot = store->probe_slot;
	Datum		pair[STORE_NKEYS];

	if (unlikely(store->sql))
		return store_sql_lookup(store, store_key_pair(store, pair, ns, key),
								wait, values, isnull);
	found = store_probe(store, store_key_pair(store, pair, ns, key), wait,
						XLTW_InsertIndexUnique);
	if (found == PROBE_ABSENT)
		return IDEM_STORE_ABSENT;
	if (found == PROBE_IN_FLIGHT_INSERT)
		return IDEM_STORE_IN_FLIGHT;
	/* a row whose deletion is not committed yet still exists */
	if (values != NULL)
		store_copy_row(store, slot, values, isnull);
	ExecClearTuple(slot);
	return IDEM_STORE_EXISTS;
}

/*
 * Delete the row (ns, key) if it exists, waiting for an in-flight holder.
 * Returns whether this call deleted it.
 */
bool
idem_store_delete(IdemStore *store, Datum ns, Datum key)
{
	if (unlikely(store->sql))
	{
		Datum		pair[STORE_NKEYS];

		return store_sql_delete(store, store_key_pair(store, pair, ns, key));
	}
	for (;;)
	{
		ItemPointerData tid;
		TM_FailureData tmfd;
		TM_Result	result;

		Datum		pair[STORE_NKEYS];

		if (store_probe(store, store_key_pair(store, pair, ns, key),
						IDEM_WAIT, XLTW_Delete) != PROBE_EXISTS)
		{
			ExecClearTuple(store->probe_slot);
			return false;
		}
		tid = store->probe_slot->tts_tid;
		ExecClearTuple(store->probe_slot);
		store_release_pins(store);

		/*
		 * The row may have been inserted by this very command (a claim and a
		 * release in one statement): make it visible to the deletion.
		 */
		CommandCounterIncrement();
		result = table_tuple_delete(store->rel, &tid,
									GetCurrentCommandId(true),
									InvalidSnapshot, InvalidSnapshot,
									true, &tmfd, false);
		switch (result)
		{
			case TM_Ok:
				return true;
			case TM_SelfModified:
				return false;
			case TM_Updated:
			case TM_Deleted:
				/* someone else got there first: look again */
				continue;
			default:
				elog(ERROR, "unexpected result %d deleting from \"%s\"",
					 (int) result, RelationGetRelationName(store->rel));
		}
	}
}

/*
 * ---- Update in place and read of the latest version (single-use tokens) ----
 */

/*
 * The row version at tid itself (not the chain of versions it starts), as
 * the probes see it, when it has the key in skeys.  tid may point anywhere.
 */
static bool
store_fetch_version(IdemStore *store, ItemPointer tid, ScanKey skeys,
					TupleTableSlot *slot)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	HeapTuple	tuple = &bslot->base.tupdata;
	OffsetNumber offnum = ItemPointerGetOffsetNumber(tid);
	Page		page;
	bool		valid = false;

	/*
	 * The size is asked once per store, and again for a block past it: the
	 * lock the store holds keeps the table from shrinking, but the caller
	 * may have put a version in a block added since (an update that did not
	 * fit on its page).
	 */
	if (!store->heap)
		return false;
	if (store->nblocks == InvalidBlockNumber ||
		ItemPointerGetBlockNumber(tid) >= store->nblocks)
		store->nblocks = RelationGetNumberOfBlocks(store->rel);
	if (ItemPointerGetBlockNumber(tid) >= store->nblocks)
		return false;
	page = store_pin_page(store, ItemPointerGetBlockNumber(tid));
	LockBuffer(store->hbuf, BUFFER_LOCK_SHARE);
	if (offnum >= FirstOffsetNumber && offnum <= PageGetMaxOffsetNumber(page))
	{
		ItemId		lp = PageGetItemId(page, offnum);

		if (ItemIdIsNormal(lp))
		{
			tuple->t_data = (HeapTupleHeader) PageGetItem(page, lp);
			tuple->t_len = ItemIdGetLength(lp);
			tuple->t_tableOid = RelationGetRelid(store->rel);
			tuple->t_self = *tid;
			valid = HeapTupleSatisfiesVisibility(tuple, &store->dirty,
												 store->hbuf);
		}
	}
	LockBuffer(store->hbuf, BUFFER_LOCK_UNLOCK);
	if (!valid)
		return false;
	slot->tts_tableOid = RelationGetRelid(store->rel);
	ExecStoreBufferHeapTuple(tuple, slot, store->hbuf);
	return store_slot_has_keys(store, slot, skeys);
}

/*
 * Whether the transaction's snapshot sees the row version in slot (a buffer
 * tuple the probe found), or this transaction (or one of its
 * subtransactions) made it: a version of the current command is one of ours
 * that the snapshot's command counter does not reach yet.
 */
static bool
store_version_in_snapshot(IdemStore *store, TupleTableSlot *slot)
{
	if (table_tuple_satisfies_snapshot(store->rel, slot,
									   GetTransactionSnapshot()))
		return true;
	if (TTS_IS_BUFFERTUPLE(slot))
	{
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, NULL);

		return TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
	}
	return false;
}

/*
 * Make the updates of this store judge under REPEATABLE READ and
 * SERIALIZABLE as UPDATE does where it matters: an update that fn accepts
 * of a row version the transaction's snapshot does not see (one a
 * transaction committed after the snapshot was taken, also one this call
 * waited for) fails with 40001 instead of being made, since what the
 * caller then does would rest on a snapshot without that version's
 * effects.  A version that fn declines is still answered as it stands (a
 * replay is a replay, whatever the snapshot).  The path through SQL fails
 * such calls already (store_sql_check_snapshot).
 */
void
idem_store_require_snapshot(IdemStore *store)
{
	store->xact_snapshot = true;
}

/*
 * Also make an insertion under those levels fail with 40001 when the
 * transaction's snapshot still sees a row of the key that a transaction
 * committed after it deleted (store_check_insert_snapshot): for a store
 * whose caller answers "new" to a key it inserts, which that snapshot says
 * was there.
 */
void
idem_store_require_snapshot_insert(IdemStore *store)
{
	store->xact_snapshot = true;
	store->xact_snapshot_insert = true;
}

/*
 * Lock the version tid for an update of its columns but the key, without
 * waiting: TM_Ok when it is locked (until the transaction ends, also when
 * the row is not updated after all), TM_WouldBlock when another transaction
 * holds a lock that conflicts or is changing the row, TM_Updated (or
 * TM_Deleted, TM_SelfModified) when the row has changed since.
 */
static TM_Result
store_lock_no_wait(IdemStore *store, ItemPointer tid)
{
	TM_FailureData tmfd;
	TM_Result	result;
	Bitmapset  *keyattrs;
	LockTupleMode mode = LockTupleNoKeyExclusive;
	int			i;

	/*
	 * The update changes no column of the key, which is columns 1 to nkeys.
	 * A unique index a user added on other columns makes heap_update take
	 * the row in the exclusive mode, which would wait for a FOR KEY SHARE
	 * beside this lock: then it is taken in that mode here too.
	 */
	keyattrs = RelationGetIndexAttrBitmap(store->rel, INDEX_ATTR_BITMAP_KEY);
	for (i = 1; i <= store->nkeys; i++)
		keyattrs = bms_del_member(keyattrs, i - FirstLowInvalidHeapAttributeNumber);
	if (!bms_is_empty(keyattrs))
		mode = LockTupleExclusive;
	bms_free(keyattrs);

	result = table_tuple_lock(store->rel, tid, SnapshotAny,
							  store->probe_slot, GetCurrentCommandId(true),
							  mode, LockWaitSkip, 0, &tmfd);
	ExecClearTuple(store->probe_slot);
	store_release_pins(store);
	return result;
}

/*
 * Find the row (ns, key) and update it when fn says so: the semantics of
 * UPDATE ... WHERE ns = $1 AND key = $2 AND <fn> in READ COMMITTED, where the
 * latest version of the row is the one judged, whatever the snapshot.  An
 * in-flight holder of the row (its inserter, or a transaction that updates or
 * deletes it) is waited for, as a unique index would wait for it, and the
 * row is judged again once it has finished.
 *
 * fn receives the row's columns in values/isnull; to update the row it
 * changes them (never the two key columns) and returns true.  Datums it puts
 * there must live until this function returns.
 *
 * A HOT update needs no index entries; when the new version could not stay
 * on the page, the entries of every index of the table are made here.
 */
static IdemStoreUpdateResult
store_update(IdemStore *store, const Datum *keys, IdemStoreUpdateFn fn,
			 void *arg, IdemStoreWait wait, ItemPointer latest)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	TupleTableSlot *slot;
	bool		locked = false;

	if (unlikely(store->sql))
		return store_sql_update(store, keys, fn, arg, wait);
	slot = store_write_slot(store);

	for (;;)
	{
		ItemPointerData tid;
		TM_FailureData tmfd;
		TM_Result	result;
		LockTupleMode lockmode;
		bool		update_indexes = false;
		ProbeResult found = PROBE_ABSENT;
		bool		probed = false;
		bool		in_snapshot;

		/*
		 * A version the caller says was the latest is taken without a probe
		 * when it has the key and still is: no transaction has updated or
		 * deleted it, or is doing so.  (A row lock alone is not seen here;
		 * heap_update waits for its holder, as it would after a probe.)
		 * Anything else, and every later round, goes through the probe.
		 */
		if (latest != NULL && ItemPointerIsValid(latest))
		{
			ScanKeyData skeys[STORE_MAX_KEYS];

			store_scankeys(store, skeys, keys);
			if (store_fetch_version(store, latest, skeys, store->probe_slot))
			{
				if (!TransactionIdIsValid(store->dirty.xmin) &&
					!TransactionIdIsValid(store->dirty.xmax))
				{
					found = PROBE_EXISTS;
					probed = true;
				}
				else
					ExecClearTuple(store->probe_slot);
			}
			latest = NULL;
		}
		if (!probed)
			found = store_probe(store, keys, wait, XLTW_Update);

		if (found != PROBE_EXISTS)
		{
			ExecClearTuple(store->probe_slot);
			return found == PROBE_ABSENT ? IDEM_UPDATE_ABSENT : IDEM_UPDATE_BUSY;
		}

		/*
		 * Whether the transaction's snapshot sees the version judged, asked
		 * while the probe still holds it (see idem_store_require_snapshot).
		 */
		in_snapshot = !store->xact_snapshot || !IsolationUsesXactSnapshot() ||
			store_version_in_snapshot(store, store->probe_slot);

		/* a private copy of the row, so that no buffer pin is kept */
		ExecCopySlot(slot, store->probe_slot);
		ExecMaterializeSlot(slot);
		tid = store->probe_slot->tts_tid;
		ExecClearTuple(store->probe_slot);
		store_release_pins(store);
		slot_getallattrs(slot);
		if (!fn(tupdesc, slot->tts_values, slot->tts_isnull, arg))
		{
			/* the version judged: see idem_store_updated_tid */
			store->updated_tid = tid;
			ExecClearTuple(slot);
			return IDEM_UPDATE_DECLINED;
		}
		if (!in_snapshot)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update"),
					 errdetail("The row of this key in table \"%s.%s\" was written by a transaction that committed after this transaction's snapshot was taken.",
							   IDEM_SCHEMA, RelationGetRelationName(store->rel)),
					 errhint("The transaction might succeed if retried.")));

		/*
		 * The row may have been inserted by this very command (an issue and a
		 * consumption in one statement): make it visible to the update.
		 */
		CommandCounterIncrement();
		result = table_tuple_update(store->rel, &tid, slot,
									GetCurrentCommandId(true),
									InvalidSnapshot, InvalidSnapshot,
									wait == IDEM_WAIT || locked, &tmfd,
									&lockmode, &update_indexes);
		locked = false;
		switch (result)
		{
			case TM_Ok:
				if (update_indexes)
				{
					List	   *recheck;

					/*
					 * Not a HOT update: the new version needs its own index
					 * entries.  The "unchanged" hint of an UPDATE statement
					 * is not given, as it needs a range table.
					 */
					recheck = ExecInsertIndexTuples(store->rri, slot,
													store->estate, false,
													false, NULL, NIL);
					list_free(recheck);
					ResetPerTupleExprContext(store->estate);
				}
				store->updated_tid = slot->tts_tid;
				ExecClearTuple(slot);
				return IDEM_UPDATE_DONE;
			case TM_SelfModified:
			case TM_Updated:
			case TM_Deleted:
				/* changed since we read it: judge the latest version again */
				ExecClearTuple(slot);
				continue;
			case TM_BeingModified:

				/*
				 * Only without waiting.  Without waiting, the update takes
				 * any lock on the row for a conflict: this transaction's own
				 * (a SELECT ... FOR UPDATE before), and the FOR KEY SHARE of
				 * others (a foreign key's check), which an update of the
				 * row's other columns does not wait for.  A lock of the row
				 * that would not wait tells them apart; once it is held, the
				 * update waits for nothing.
				 */
				ExecClearTuple(slot);
				result = store_lock_no_wait(store, &tid);
				if (result == TM_Ok)
					locked = true;
				else if (result != TM_Updated && result != TM_Deleted &&
						 result != TM_SelfModified)
					return IDEM_UPDATE_BUSY;
				/* judged again, the row locked or changed */
				continue;
			case TM_WouldBlock:
				ExecClearTuple(slot);
				return IDEM_UPDATE_BUSY;
			default:
				elog(ERROR, "unexpected result %d updating \"%s\"",
					 (int) result, RelationGetRelationName(store->rel));
		}
	}
}

IdemStoreUpdateResult
idem_store_update(IdemStore *store, Datum ns, Datum key,
				  IdemStoreUpdateFn fn, void *arg)
{
	Datum		pair[STORE_NKEYS];

	return store_update(store, store_key_pair(store, pair, ns, key), fn, arg,
						IDEM_WAIT, NULL);
}

/* The same for a table opened with idem_store_open_keys. */
IdemStoreUpdateResult
idem_store_update_keys(IdemStore *store, const Datum *keys,
					   IdemStoreUpdateFn fn, void *arg)
{
	return store_update(store, keys, fn, arg, IDEM_WAIT, NULL);
}

/*
 * idem_store_update, when the caller remembers where the row's latest
 * version was (idem_store_updated_tid after an update of it): that version
 * is judged without a probe when it has the key and still is the latest.
 * latest may point anywhere; the answer is idem_store_update's.
 */
IdemStoreUpdateResult
idem_store_update_at(IdemStore *store, ItemPointer latest, Datum ns,
					 Datum key, IdemStoreUpdateFn fn, void *arg)
{
	Datum		pair[STORE_NKEYS];

	return store_update(store, store_key_pair(store, pair, ns, key), fn, arg,
						IDEM_WAIT, latest);
}

/*
 * idem_store_update_at without ever waiting: when another transaction is
 * inserting, updating or deleting the row, IDEM_UPDATE_BUSY, and fn is not
 * called.
 */
IdemStoreUpdateResult
idem_store_try_update_latest(IdemStore *store, ItemPointer latest, Datum ns,
							 Datum key, IdemStoreUpdateFn fn, void *arg)
{
	Datum		pair[STORE_NKEYS];

	return store_update(store, store_key_pair(store, pair, ns, key), fn, arg,
						IDEM_NOWAIT, latest);
}

/*
 * Where the last successful update of this store put the row's new version,
 * or, after idem_store_update or idem_store_update_at declined, where the
 * version the callback judged was.
 */
ItemPointerData
idem_store_updated_tid(IdemStore *store)
{
	return store->updated_tid;
}

/*
 * Whether no transaction has updated, deleted or locked the row version at
 * tid (its xmax is unset, or was an aborted transaction's): a caller that
 * judged that version, and holds a lock that keeps the table from
 * shrinking, then knows it is still the latest and as it was, without
 * reading it again.  False when unsure: a table that is not a heap, or
 * rows reached through SQL.
 */
bool
idem_store_version_untouched(IdemStore *store, ItemPointer tid)
{
	Buffer		buf;
	Page		page;
	OffsetNumber off;
	bool		untouched = false;

	if (store->sql || !store->heap || !ItemPointerIsValid(tid))
		return false;
	buf = ReadBuffer(store->rel, ItemPointerGetBlockNumber(tid));
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	off = ItemPointerGetOffsetNumber(tid);
	if (off >= FirstOffsetNumber && off <= PageGetMaxOffsetNumber(page))
	{
		ItemId		lp = PageGetItemId(page, off);

		if (ItemIdIsNormal(lp))
		{
			HeapTupleHeader tup = (HeapTupleHeader) PageGetItem(page, lp);

			untouched = (tup->t_infomask & HEAP_XMAX_INVALID) != 0 ||
				!TransactionIdIsValid(HeapTupleHeaderGetRawXmax(tup));
		}
	}
	UnlockReleaseBuffer(buf);
	return untouched;
}

/*
 * The same without ever waiting: when another transaction is inserting,
 * updating or deleting the row, IDEM_UPDATE_BUSY, and fn is not called.
 */
IdemStoreUpdateResult
idem_store_try_update(IdemStore *store, Datum ns, Datum key,
					  IdemStoreUpdateFn fn, void *arg)
{
	Datum		pair[STORE_NKEYS];

	return store_update(store, store_key_pair(store, pair, ns, key), fn, arg,
						IDEM_NOWAIT, NULL);
}

/*
 * Update the row version at tid, whose columns the caller read (values and
 * isnull, copied by the caller), when fn says so and that version is still
 * the latest: a version changed since, or being changed, by any transaction
 * is IDEM_UPDATE_BUSY, never waited for.  This is UPDATE ... SKIP LOCKED
 * for a caller that scanned the table itself, which saves the search of the
 * row through the index.
 */
IdemStoreUpdateResult
idem_store_try_update_at(IdemStore *store, ItemPointer tid, Datum *values,
						 bool *isnull, IdemStoreUpdateFn fn, void *arg)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	TupleTableSlot *slot;
	TM_FailureData tmfd;
	TM_Result	result;
	LockTupleMode lockmode;
	bool		update_indexes = false;

	if (unlikely(store->sql))
		store_sql_unsupported(store, "an update at a known place");
	slot = store_write_slot(store);

	ExecClearTuple(slot);
	memcpy(slot->tts_values, values, sizeof(Datum) * tupdesc->natts);
	memcpy(slot->tts_isnull, isnull, sizeof(bool) * tupdesc->natts);
	ExecStoreVirtualTuple(slot);
	if (!fn(tupdesc, slot->tts_values, slot->tts_isnull, arg))
	{
		ExecClearTuple(slot);
		return IDEM_UPDATE_DECLINED;
	}
	CommandCounterIncrement();
	result = table_tuple_update(store->rel, tid, slot,
								GetCurrentCommandId(true),
								InvalidSnapshot, InvalidSnapshot,
								false, &tmfd, &lockmode, &update_indexes);
	switch (result)
	{
		case TM_Ok:
			if (update_indexes)
			{
				List	   *recheck;

				recheck = ExecInsertIndexTuples(store->rri, slot,
												store->estate, false,
												false, NULL, NIL);
				list_free(recheck);
				ResetPerTupleExprContext(store->estate);
			}
			store->updated_tid = slot->tts_tid;
			ExecClearTuple(slot);
			return IDEM_UPDATE_DONE;
		case TM_SelfModified:
		case TM_Updated:
		case TM_Deleted:
		case TM_BeingModified:
		case TM_WouldBlock:
			ExecClearTuple(slot);
			return IDEM_UPDATE_BUSY;
		default:
			elog(ERROR, "unexpected result %d updating \"%s\"",
				 (int) result, RelationGetRelationName(store->rel));
	}
	return IDEM_UPDATE_BUSY;	/* keep compiler quiet */
}

/*
 * Read the row (ns, key) as it stands: the latest committed version, or the
 * one this transaction made (even in the current command).  An uncommitted
 * change of another transaction is not seen and not waited for.  Returns
 * whether the row exists; its columns are copied into values and isnull.
 */
bool
idem_store_read(IdemStore *store, Datum ns, Datum key, Datum *values,
				bool *isnull)
{
	Datum		pair[STORE_NKEYS];

	return idem_store_read_keys(store, store_key_pair(store, pair, ns, key),
								values, isnull);
}

/* Fetch into slot the version of the key that snap sees, through the index. */
static bool
store_index_fetch(IdemStore *store, Snapshot snap, ScanKey skeys,
				  TupleTableSlot *slot)
{
	IndexScanDesc scan;
	bool		found;

	scan = index_beginscan(store->rel, store->index, snap, store->nkeys, 0);
	index_rescan(scan, skeys, store->nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

/*
 * Whether the row of the version in slot (a buffer tuple a snapshot sees) is
 * gone as it stands: the version, or the last of the versions its updates
 * made, was deleted by a transaction that committed.  The versions after one
 * a snapshot sees are kept while that snapshot is held (they are not dead to
 * it), so the chain is followed to its end; a chain that breaks anyway, or a
 * version whose change is still in progress or rolled back, is not taken
 * for gone.  A transaction is asked whether it is in progress before
 * whether it committed, as HeapTupleSatisfiesSelf asks: its commit is in
 * the commit log a moment before it leaves the array of running
 * transactions, and the deletion is not done for snapshots meanwhile.
 */
static bool
store_version_deleted(IdemStore *store, TupleTableSlot *slot)
{
	ItemPointerData tid = slot->tts_tid;
	TransactionId prev_xmax = InvalidTransactionId;
	bool		deleted = false;

	if (!TTS_IS_BUFFERTUPLE(slot) || !ItemPointerIsValid(&tid))
		return false;
	for (;;)
	{
		Buffer		buf;
		Page		page;
		OffsetNumber off = ItemPointerGetOffsetNumber(&tid);
		ItemId		lp;
		HeapTupleHeader htup;
		TransactionId xmax;
		bool		next = false;

		CHECK_FOR_INTERRUPTS();
		if (ItemPointerGetBlockNumber(&tid) >= RelationGetNumberOfBlocks(store->rel))
			break;
		buf = ReadBuffer(store->rel, ItemPointerGetBlockNumber(&tid));
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		if (off >= FirstOffsetNumber && off <= PageGetMaxOffsetNumber(page) &&
			ItemIdIsNormal(lp = PageGetItemId(page, off)))
		{
			htup = (HeapTupleHeader) PageGetItem(page, lp);
			if ((!TransactionIdIsValid(prev_xmax) ||
				 TransactionIdEquals(HeapTupleHeaderGetXmin(htup), prev_xmax)) &&
				!(htup->t_infomask & HEAP_XMAX_INVALID) &&
				!HEAP_XMAX_IS_LOCKED_ONLY(htup->t_infomask) &&
				!HeapTupleHeaderIndicatesMovedPartitions(htup) &&
				!TransactionIdIsInProgress(xmax = HeapTupleHeaderGetUpdateXid(htup)) &&
				TransactionIdDidCommit(xmax))
			{
				if (ItemPointerEquals(&tid, &htup->t_ctid))
					deleted = true;
				else
				{
					prev_xmax = xmax;
					tid = htup->t_ctid;
					next = true;
				}
			}
		}
		UnlockReleaseBuffer(buf);
		if (!next)
			break;
	}
	return deleted;
}

/* The same for a table opened with idem_store_open_keys. */
bool
idem_store_read_keys(IdemStore *store, const Datum *keys, Datum *values,
					 bool *isnull)
{
	ScanKeyData skeys[STORE_MAX_KEYS];
	IndexScanDesc scan;
	TupleTableSlot *slot = store->probe_slot;
	Snapshot	snap;
	bool		found;

	if (unlikely(store->sql))
		return store_sql_read(store, keys, values, isnull);
	store_scankeys(store, skeys, keys);

	/*
	 * A snapshot, not SnapshotSelf: judged one by one, the two versions of a
	 * row that another transaction moves to another page can both be missed
	 * (the new one while it is in progress, the old one once it committed).
	 * The counter makes this command's own changes part of it.  In parallel
	 * mode no snapshot can be taken nor command started: each version is
	 * judged as it stands, and a miss is read again through the query's
	 * snapshot (below).
	 */
	if (IsInParallelMode())
	{
		snap = SnapshotSelf;

		/*
		 * Only a read through an MVCC snapshot takes the predicate locks of
		 * SERIALIZABLE (and sees the conflicts with writers in progress):
		 * without them a parallel query's read would let a write skew
		 * commit that the same read outside parallel mode fails.  The
		 * query's snapshot (the transaction's) reads the key once more for
		 * them; its answer is not used.
		 */
		if (IsolationIsSerializable() && ActiveSnapshotSet())
		{
			scan = index_beginscan(store->rel, store->index,
								   GetActiveSnapshot(), store->nkeys, 0);
			index_rescan(scan, skeys, store->nkeys, NULL, 0);
			(void) index_getnext_slot(scan, ForwardScanDirection, slot);
			ExecClearTuple(slot);
			index_endscan(scan);
		}
	}
	else
	{
		CommandCounterIncrement();
		snap = RegisterSnapshot(GetLatestSnapshot());
	}
	found = (ItemPointerIsValid(&store->hint) &&
			 store_fetch_hint(store, snap, skeys, slot)) ||
		store_index_fetch(store, snap, skeys, slot);

	/*
	 * Judged one by one, the versions of a row that another transaction
	 * moved can all be missed (see above), however often one looks again
	 * while it keeps moving it.  The query's snapshot cannot miss a row
	 * that was there when the query began: its version then is the answer,
	 * unless that version was deleted since (an offset forgotten, a token
	 * purged), which no version takes the place of.
	 */
	if (!found && snap == SnapshotSelf && ActiveSnapshotSet())
		found = store_index_fetch(store, GetActiveSnapshot(), skeys, slot) &&
			!store_version_deleted(store, slot);
	if (found)
		store_copy_row(store, slot, values, isnull);
	ExecClearTuple(slot);
	if (IsMVCCSnapshot(snap))
		UnregisterSnapshot(snap);
	return found;
}

/*
 * ---- The path through SQL, for a table distributed by Citus ----
 *
 * Each call is one statement (two for an update) that names the key by its
 * columns, so that Citus routes it to the key's shard.  The statements do
 * what the direct path does by hand: INSERT ... ON CONFLICT DO NOTHING waits
 * for an in-flight holder of the key as the unique index would, SELECT ...
 * FOR UPDATE judges the latest version of a row.  Without waiting, an
 * in-flight holder is found by a lock timeout of one millisecond (set for
 * the statement only, on every node it reaches): the holder is then
 * reported in flight, as the direct path reports it.
 *
 * A statement sees committed rows only: a row another transaction is still
 * inserting is absent to it, where the direct path's probe sees the row and
 * waits for its inserter (or reports it in flight).  So when the key's shard
 * is on this node (a call Citus delegated to the shard's node, or one made
 * there), the shard is probed first, as the direct path probes the table:
 * see store_sql_probe_shard.
 */

/*
 * The statements run as the table's owner, as the direct path reaches the
 * table whatever the caller's privileges (the caller needs none on idem's
 * tables), in a connection to SPI of their own.
 */
typedef struct StoreSqlUser
{
	Oid			userid;
	int			sec_context;
} StoreSqlUser;

static void
store_sql_begin(IdemStore *store, StoreSqlUser *su)
{
	/*
	 * Citus runs no statement of a distributed table in parallel mode (in a
	 * parallel worker, nor in its leader while the query runs):
	 * idem_distribute() makes the functions that read such a table
	 * PARALLEL UNSAFE, so that no parallel plan calls them.
	 */
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot read the distributed table \"%s.%s\" in a parallel query",
						IDEM_SCHEMA, RelationGetRelationName(store->rel)),
				 errhint("Run idem_distribute() on the coordinator: it marks the functions that read distributed tables PARALLEL UNSAFE.")));
	GetUserIdAndSecContext(&su->userid, &su->sec_context);
	SetUserIdAndSecContext(store->rel->rd_rel->relowner,
						   su->sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_NOFORCE_RLS);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
store_sql_end(StoreSqlUser *su)
{
	SPI_finish();
	SetUserIdAndSecContext(su->userid, su->sec_context);
}

/* "idem"."relname" */
static char *
store_sql_relname(IdemStore *store)
{
	return quote_qualified_identifier(IDEM_SCHEMA,
									  RelationGetRelationName(store->rel));
}

static const char *
store_sql_column(IdemStore *store, int i)
{
	return quote_identifier(NameStr(TupleDescAttr(RelationGetDescr(store->rel),
												  i)->attname));
}

/* " WHERE k1 = $1 AND k2 = $2 ..." for the key columns */
static void
store_sql_where(IdemStore *store, StringInfo buf)
{
	int			i;

	for (i = 0; i < store->nkeys; i++)
		appendStringInfo(buf, "%s %s OPERATOR(pg_catalog.=) $%d",
						 i == 0 ? " WHERE" : " AND",
						 store_sql_column(store, i), i + 1);
}

static void
store_sql_argtypes(IdemStore *store, Oid *types, int n)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	int			i;

	for (i = 0; i < n; i++)
		types[i] = TupleDescAttr(tupdesc, i)->atttypid;
}

static void
store_sql_nulls(const bool *isnull, char *nulls, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		nulls[i] = (isnull != NULL && isnull[i]) ? 'n' : ' ';
	nulls[n] = '\0';
}

static void
store_sql_check(int rc, int expected, const char *what)
{
	if (rc != expected)
		elog(ERROR, "SPI_execute_with_args failed on %s: %s", what,
			 SPI_result_code_string(rc));
}

/* The row of the last SELECT into values and isnull, in cxt. */
static void
store_sql_copy_row(IdemStore *store, MemoryContext cxt, Datum *values,
				   bool *isnull)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	MemoryContext oldcxt = MemoryContextSwitchTo(cxt);
	HeapTuple	tup = SPI_copytuple(SPI_tuptable->vals[0]);

	if (SPI_tuptable->tupdesc->natts != tupdesc->natts)
		elog(ERROR, "unexpected row shape reading \"%s\"",
			 RelationGetRelationName(store->rel));
	heap_deform_tuple(tup, SPI_tuptable->tupdesc, values, isnull);
	MemoryContextSwitchTo(oldcxt);
}

/*
 * Run a read-only query of Citus's catalogs under a snapshot taken now:
 * after the invalidations that the opening of the table took in, so that
 * an answer kept until the next invalidation is never older than it.  (The
 * statement's own snapshot may predate a change whose invalidation has
 * already reset the cache.)
 */
static void
store_sql_catalog_query(const char *query, Oid argtype, Datum arg,
						const char *what)
{
	SPIPlanPtr	plan = SPI_prepare(query, 1, &argtype);
	int			rc;

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for %s: %s", what,
			 SPI_result_code_string(SPI_result));
	rc = SPI_execute_snapshot(plan, &arg, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, 1);
	store_sql_check(rc, SPI_OK_SELECT, what);
	SPI_freeplan(plan);
}

/*
 * Which key column Citus distributes the store's table by hash, asked once
 * per table and backend: -1 when none is (a reference table, or another
 * method of distribution, which is left to the statements).
 */
static int
store_sql_dist_key(IdemStore *store)
{
	uint64		invals = store_dist_invals;
	int			key = -1;

	if (store->entry != NULL && store->entry->dist_key != STORE_DIST_UNKNOWN)
		return store->entry->dist_key;
	store_sql_catalog_query("SELECT pg_catalog.column_to_column_name(logicalrelid, partkey)"
							" FROM pg_catalog.pg_dist_partition"
							" WHERE logicalrelid OPERATOR(pg_catalog.=) $1"
							" AND partmethod OPERATOR(pg_catalog.=) 'h'",
							OIDOID, ObjectIdGetDatum(RelationGetRelid(store->rel)),
							"the distribution column");
	if (SPI_processed == 1)
	{
		char	   *col = SPI_getvalue(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1);
		int			i;

		for (i = 0; col != NULL && i < store->nkeys; i++)
			if (strcmp(NameStr(TupleDescAttr(RelationGetDescr(store->rel),
											 i)->attname), col) == 0)
				key = i;
	}
	/* kept unless an invalidation came while the query ran */
	if (store->entry != NULL && invals == store_dist_invals &&
		store->entry->relid == RelationGetRelid(store->rel))
		store->entry->dist_key = key;
	return key;
}

/*
 * Whether this node holds a placement of a shard of the store's table,
 * asked once per table and backend until Citus changes the placements (a
 * coordinator that holds none then skips store_sql_probe_shard's query).
 */
static bool
store_sql_local_placements(IdemStore *store)
{
	uint64		invals = store_dist_invals;
	bool		some;

	if (store->entry != NULL &&
		store->entry->local_placements != STORE_DIST_UNKNOWN)
		return store->entry->local_placements > 0;
	store_sql_catalog_query("SELECT FROM pg_catalog.pg_dist_shard s, pg_catalog.pg_dist_placement p,"
							" pg_catalog.pg_dist_local_group g"
							" WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1"
							" AND p.shardid OPERATOR(pg_catalog.=) s.shardid"
							" AND p.groupid OPERATOR(pg_catalog.=) g.groupid",
							OIDOID, ObjectIdGetDatum(RelationGetRelid(store->rel)),
							"the local placements");
	some = SPI_processed > 0;
	/* kept unless an invalidation came while the query ran */
	if (store->entry != NULL && invals == store_dist_invals &&
		store->entry->relid == RelationGetRelid(store->rel))
		store->entry->local_placements = some ? 1 : 0;
	return some;
}

/*
 * Whether the transaction xid (in progress) is run, on this node, for the
 * same Citus distributed transaction as this backend's.
 */
static bool
store_sql_own_transaction(TransactionId xid)
{
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1];
	int			pid;
	int			rc;

	if (!TransactionIdIsValid(xid))
		return false;
	pid = BackendXidGetPid(SubTransGetTopmostTransaction(xid));
	if (pid == 0)
		return false;
	args[0] = Int32GetDatum(pid);
	/* the backend works for this one: Citus gives it this one's global pid */
	rc = SPI_execute_with_args("SELECT FROM pg_catalog.get_all_active_transactions() a"
							   " WHERE a.process_id OPERATOR(pg_catalog.=) $1"
							   " AND a.global_pid OPERATOR(pg_catalog.=) pg_catalog.citus_backend_gpid()",
							   1, argtypes, args, NULL, true, 1);
	store_sql_check(rc, SPI_OK_SELECT, "the distributed transaction");
	return SPI_processed > 0;
}

/* Whether Citus runs the statements on this node's shards in this backend. */
static bool
store_sql_local_execution(void)
{
	const char *local = GetConfigOption("citus.enable_local_execution", true,
										false);

	return local == NULL || strcmp(local, "on") == 0;
}

/*
 * Under REPEATABLE READ and SERIALIZABLE the statement judges the row by the
 * transaction's snapshot, where the direct path judges it as it stands (the
 * latest committed version).  When the two differ (a row committed, changed
 * or deleted since the snapshot, or committed by the inserter just waited
 * for), the statement's answer would be silently different from one
 * server's: fail as PostgreSQL fails a write that meets a concurrent update.
 * found is the probe's answer; on PROBE_EXISTS and PROBE_IN_FLIGHT_DELETE
 * the latest committed version is in the probe's slot.
 *
 * The statement runs on this backend's snapshot through Citus's local
 * execution only: with citus.enable_local_execution off it runs in another
 * backend, whose snapshot this one cannot judge, and nothing is checked
 * here: store_sql_probe_shard sends the probe to that backend instead.
 * (When Citus has turned local execution off for the rest of a transaction
 * that reached this node through a connection first, the check may fail a
 * call the statement would have answered: an error, never a wrong answer.)
 */
static void
store_sql_check_snapshot(IdemStore *probe, IdemStore *store,
						 const Datum *keys, ProbeResult found)
{
	Snapshot	snapshot;
	bool		differs;

	if (!store_sql_local_execution())
		return;
	snapshot = GetTransactionSnapshot();

	if (found == PROBE_EXISTS || found == PROBE_IN_FLIGHT_DELETE)
	{
		Assert(!TTS_EMPTY(probe->probe_slot));
		differs = !table_tuple_satisfies_snapshot(probe->rel, probe->probe_slot,
												  snapshot);
		/* a row of this transaction's (also of a subtransaction) is seen */
		if (differs && TTS_IS_BUFFERTUPLE(probe->probe_slot))
		{
			HeapTuple	tuple = ExecFetchSlotHeapTuple(probe->probe_slot,
													   false, NULL);

			differs = !TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
		}
	}
	else if (found == PROBE_ABSENT)
	{
		ScanKeyData skeys[STORE_MAX_KEYS];
		IndexScanDesc scan;

		/* a version the snapshot still sees, deleted since */
		store_scankeys(probe, skeys, keys);
		scan = index_beginscan(probe->rel, probe->index, snapshot,
							   probe->nkeys, 0);
		index_rescan(scan, skeys, probe->nkeys, NULL, 0);
		differs = index_getnext_slot(scan, ForwardScanDirection,
									 probe->probe_slot);
		index_endscan(scan);
	}
	else
		return;
	ExecClearTuple(probe->probe_slot);
	if (differs)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("A row with this key in table \"%s.%s\" was inserted, updated or deleted by a transaction that committed after this transaction's snapshot was taken.",
						   IDEM_SCHEMA, RelationGetRelationName(store->rel)),
				 errhint("The transaction might succeed if retried.")));
}

/*
 * The look-up of the key's shard on this node, prepared once per backend and
 * type of distribution column (a call per probe).  The plan cache revalidates it when Citus's
 * catalogs or functions change.
 */
#define STORE_SHARD_PLANS 4

static struct
{
	Oid			keytype;
	SPIPlanPtr	plan;
}			store_shard_plans[STORE_SHARD_PLANS];

static SPIPlanPtr
store_sql_shard_plan(Oid keytype)
{
	Oid			argtypes[2] = {OIDOID, keytype};
	SPIPlanPtr	plan;
	int			i;

	for (i = 0; i < STORE_SHARD_PLANS && store_shard_plans[i].plan != NULL; i++)
		if (store_shard_plans[i].keytype == keytype)
			return store_shard_plans[i].plan;
	plan = SPI_prepare("SELECT pg_catalog.to_regclass(pg_catalog.shard_name($1::pg_catalog.regclass, s))::pg_catalog.oid"
					   " FROM pg_catalog.get_shard_id_for_distribution_column($1::pg_catalog.regclass, $2) s"
					   " WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_placement p, pg_catalog.pg_dist_local_group g"
					   " WHERE p.shardid OPERATOR(pg_catalog.=) s"
					   " AND p.groupid OPERATOR(pg_catalog.=) g.groupid"
					   " AND p.shardstate OPERATOR(pg_catalog.=) 1)",
					   2, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for the local shard: %s",
			 SPI_result_code_string(SPI_result));
	/* kept while there is room; otherwise freed with the SPI connection */
	if (i < STORE_SHARD_PLANS && SPI_keepplan(plan) == 0)
	{
		store_shard_plans[i].keytype = keytype;
		store_shard_plans[i].plan = plan;
	}
	return plan;
}

/*
 * Probe the key's shard when this node holds an active placement of it, as
 * the direct path probes the table (store_probe, with its waits).  *elsewhere
 * is set when the key's shard is on another node (the caller then sends the
 * probe there: store_sql_probe_remote); PROBE_ABSENT without a probe.
 *
 * Only a look, and only its waits and its "in flight" are trusted: whether
 * the row exists is for the statement to say, through Citus, since a shard
 * move that ends meanwhile leaves this copy behind.  A move waits for the
 * writes in flight on the copy it moves, so a row being inserted here is
 * being inserted in the shard.  Under a transaction snapshot the look also
 * makes sure that the statement will judge the row as it stands
 * (store_sql_check_snapshot).
 */
static ProbeResult
store_sql_probe_here(IdemStore *store, const Datum *keys, IdemStoreWait wait,
					 bool *elsewhere)
{
	int			dkey = store_sql_dist_key(store);
	Datum		args[2];
	bool		isnull;
	Datum		d;
	Oid			shardrelid;
	Relation	shard;
	Oid			indexid;
	IdemStore  *probe;
	ProbeResult found;
	int			rc;

	*elsewhere = false;
	if (dkey < 0)
		return PROBE_ABSENT;
	*elsewhere = true;
	if (!store_sql_local_placements(store))
		return PROBE_ABSENT;
	args[0] = ObjectIdGetDatum(RelationGetRelid(store->rel));
	args[1] = keys[dkey];
	/*
	 * Under a snapshot taken now, as store_sql_catalog_query: the
	 * transaction's own (REPEATABLE READ) may still show a placement Citus
	 * has moved away since, whose copy stays until its deferred drop while
	 * Citus routes the key's statements to the new one.
	 */
	rc = SPI_execute_snapshot(store_sql_shard_plan(TupleDescAttr(RelationGetDescr(store->rel),
																 dkey)->atttypid),
							  args, NULL, GetLatestSnapshot(), InvalidSnapshot,
							  true, false, 1);
	store_sql_check(rc, SPI_OK_SELECT, "the local shard");
	if (SPI_processed != 1)
		return PROBE_ABSENT;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return PROBE_ABSENT;
	shardrelid = DatumGetObjectId(d);
	shard = try_table_open(shardrelid, AccessShareLock);
	if (shard == NULL)
		return PROBE_ABSENT;
	*elsewhere = false;
	indexid = shard->rd_rel->relkind == RELKIND_RELATION ?
		RelationGetPrimaryKeyIndex(shard) : InvalidOid;
	if (!OidIsValid(indexid))
	{
		table_close(shard, AccessShareLock);
		return PROBE_ABSENT;
	}
	probe = palloc0(sizeof(IdemStore));
	probe->nkeys = store->nkeys;
	store_open_direct(probe, NULL, shard, indexid, AccessShareLock,
					  RelationGetRelationName(shard));
	found = store_probe(probe, keys, IDEM_NOWAIT, XLTW_InsertIndexUnique);
	if (found == PROBE_IN_FLIGHT_INSERT || found == PROBE_IN_FLIGHT_DELETE)
	{
		TransactionId xid = found == PROBE_IN_FLIGHT_INSERT ?
			probe->dirty.xmin : probe->dirty.xmax;

		/*
		 * A row this very distributed transaction is writing through a
		 * connection Citus made to this node is this transaction's own, as
		 * the statement (which Citus sends through the same connection)
		 * sees it: inserted, it exists; deleted, it is gone.  Waiting for
		 * that connection's backend would wait for ourselves.
		 */
		if (store_sql_own_transaction(xid))
		{
			ExecClearTuple(probe->probe_slot);
			found = (found == PROBE_IN_FLIGHT_INSERT) ? PROBE_EXISTS : PROBE_ABSENT;
			idem_store_close(probe);
			return found;
		}
		if (wait == IDEM_WAIT)
		{
			ExecClearTuple(probe->probe_slot);
			found = store_probe(probe, keys, IDEM_WAIT, XLTW_InsertIndexUnique);
		}
	}
	if (IsolationUsesXactSnapshot())
		store_sql_check_snapshot(probe, store, keys, found);
	ExecClearTuple(probe->probe_slot);
	idem_store_close(probe);
	return found;
}

/*
 * The codes idem._shard_probe returns: a ProbeResult, with this bit when the
 * probe waited for another transaction.
 */
#define SHARD_PROBE_WAITED	16

/*
 * Probe the key's shard on the node that holds it: a statement on the table
 * that names the key, which Citus routes to the shard, and whose target list
 * calls idem._shard_probe there (the aggregate makes one row whether or not
 * the row is visible).  So a call made on a node without the key's shard
 * (the coordinator, say) waits for an inserter in flight, or reports it in
 * flight, as on one server.  Its wait is counted here too.
 */
static ProbeResult
store_sql_probe_remote(IdemStore *store, const Datum *keys, IdemStoreWait wait)
{
	StringInfoData buf;
	Oid			types[STORE_MAX_KEYS];
	bool		isnull;
	Datum		d;
	int32		code;
	int			rc;
	int			i;

	initStringInfo(&buf);
	appendStringInfo(&buf, "SELECT %s._shard_probe(%s, %s",
					 quote_identifier(IDEM_SCHEMA),
					 quote_literal_cstr(RelationGetRelationName(store->rel)),
					 wait == IDEM_WAIT ? "true" : "false");
	for (i = 0; i < store->nkeys; i++)
		appendStringInfo(&buf, ", $%d", i + 1);
	appendStringInfo(&buf, "), pg_catalog.count(*) FROM %s",
					 store_sql_relname(store));
	store_sql_where(store, &buf);
	store_sql_argtypes(store, types, store->nkeys);
	rc = SPI_execute_with_args(buf.data, store->nkeys, types, (Datum *) keys,
							   NULL, false, 1);
	store_sql_check(rc, SPI_OK_SELECT, "the probe of the key's shard");
	if (SPI_processed != 1)
		return PROBE_ABSENT;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return PROBE_ABSENT;
	code = DatumGetInt32(d);
	if (code & SHARD_PROBE_WAITED)
		idem_store_waits++;
	code &= ~SHARD_PROBE_WAITED;
	if (code < PROBE_ABSENT || code > PROBE_IN_FLIGHT_DELETE)
		elog(ERROR, "unexpected answer %d of the probe of the key's shard", code);
	return (ProbeResult) code;
}

/*
 * Probe the key's shard where it is: here, or through Citus on its node.
 * Without a shard distributed by hash nothing is known: PROBE_ABSENT, and
 * the statement that follows answers alone.
 */
static ProbeResult
store_sql_probe_shard(IdemStore *store, const Datum *keys, IdemStoreWait wait)
{
	bool		elsewhere;
	ProbeResult found;

	/*
	 * With Citus's local execution off, the statement that follows runs in a
	 * backend Citus connects to, also on the node of the shard, in a
	 * transaction of its own: under a transaction snapshot the probe must
	 * judge the row by that transaction's snapshot, so it goes the same way.
	 */
	if (IsolationUsesXactSnapshot() && !store_sql_local_execution() &&
		store_sql_dist_key(store) >= 0)
		return store_sql_probe_remote(store, keys, wait);
	found = store_sql_probe_here(store, keys, wait, &elsewhere);
	if (elsewhere)
		found = store_sql_probe_remote(store, keys, wait);
	return found;
}

/*
 * idem._shard_probe(tbl text, wait bool, VARIADIC keys "any") returns int
 *
 * The probe of store_sql_probe_remote, on the node of the key's shard: a
 * ProbeResult, with SHARD_PROBE_WAITED when it waited.  It never sends the
 * probe on (a shard that moved meanwhile is absent here: PROBE_ABSENT, and
 * the caller's statement answers alone, as before).
 */
PG_FUNCTION_INFO_V1(idem_shard_probe);
Datum
idem_shard_probe(PG_FUNCTION_ARGS)
{
	static const struct
	{
		const char *name;
		int			nkeys;
	}			tables[] = {
		{"claims", 2}, {"tokens", 2}, {"requests", 2}, {"offsets", 3},
		{"producer_seqs", 1}
	};
	char	   *tbl = text_to_cstring(PG_GETARG_TEXT_PP(0));
	bool		wait = PG_GETARG_BOOL(1);
	int			nkeys = PG_NARGS() - 2;
	Datum		keys[STORE_MAX_KEYS];
	uint64		waits = idem_store_waits;
	IdemStore  *store;
	StoreSqlUser su;
	ProbeResult found;
	bool		elsewhere;
	int			want = -1;
	int			i;

	for (i = 0; i < (int) lengthof(tables); i++)
		if (strcmp(tbl, tables[i].name) == 0)
			want = tables[i].nkeys;
	if (want < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("\"%s\" is not a keyed table of the idem extension", tbl)));
	if (nkeys != want || get_fn_expr_variadic(fcinfo->flinfo))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem._shard_probe of table \"%s.%s\" takes %d keys, each as an argument of its own",
						IDEM_SCHEMA, tbl, want)));
	store = idem_store_open_keys(tbl, AccessShareLock, nkeys);
	for (i = 0; i < nkeys; i++)
	{
		Oid			want = TupleDescAttr(RelationGetDescr(store->rel), i)->atttypid;

		if (get_fn_expr_argtype(fcinfo->flinfo, i + 2) != want)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("key %d of table \"%s.%s\" must be of type %s",
							i + 1, IDEM_SCHEMA, tbl, format_type_be(want))));
		keys[i] = PG_GETARG_DATUM(i + 2);
	}
	if (!store->sql)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" is not distributed by Citus", IDEM_SCHEMA, tbl)));
	store_sql_begin(store, &su);
	found = store_sql_probe_here(store, keys, wait ? IDEM_WAIT : IDEM_NOWAIT,
								 &elsewhere);
	store_sql_end(&su);
	idem_store_close(store);
	PG_RETURN_INT32((int32) found |
					(idem_store_waits != waits ? SHARD_PROBE_WAITED : 0));
}

/*
 * Run fn with the lock timeout at one millisecond on every node the
 * statements reach, in a subtransaction: true when it ran, false when a lock
 * was not available (another transaction holds the key); any other error is
 * raised again.
 */
typedef void (*StoreSqlFn) (IdemStore *store, void *arg);

static bool
store_sql_nowait(IdemStore *store, StoreSqlFn fn, void *arg)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	char	   *old_timeout = pstrdup(GetConfigOption("lock_timeout", false,
													  false));
	const char *old_propagate = GetConfigOption("citus.propagate_set_commands",
												true, false);
	bool		ran = true;

	if (old_propagate != NULL)
		old_propagate = pstrdup(old_propagate);

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		StringInfoData buf;

		/* SET LOCAL reaches the nodes Citus talks to in this transaction */
		SPI_execute("SELECT pg_catalog.set_config('citus.propagate_set_commands', 'local', true)",
					false, 0);
		SPI_execute("SET LOCAL lock_timeout = 1", false, 0);
		fn(store, arg);
		initStringInfo(&buf);
		appendStringInfo(&buf, "SET LOCAL lock_timeout = %s",
						 quote_literal_cstr(old_timeout));
		SPI_execute(buf.data, false, 0);
		if (old_propagate != NULL)
			(void) set_config_option("citus.propagate_set_commands",
									 old_propagate, PGC_USERSET,
									 PGC_S_SESSION, GUC_ACTION_LOCAL, true,
									 0, false);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(edata);
		FreeErrorData(edata);
		ran = false;
	}
	PG_END_TRY();
	return ran;
}

typedef struct StoreSqlInsert
{
	Datum	   *values;
	bool	   *isnull;
	bool		inserted;
} StoreSqlInsert;

static void
store_sql_insert_stmt(IdemStore *store, void *arg)
{
	StoreSqlInsert *a = (StoreSqlInsert *) arg;
	int			natts = RelationGetDescr(store->rel)->natts;
	Oid		   *types = palloc(natts * sizeof(Oid));
	char	   *nulls = palloc(natts + 1);
	StringInfoData buf;
	int			i;
	int			rc;

	initStringInfo(&buf);
	appendStringInfo(&buf, "INSERT INTO %s (", store_sql_relname(store));
	for (i = 0; i < natts; i++)
		appendStringInfo(&buf, "%s%s", i ? ", " : "", store_sql_column(store, i));
	appendStringInfoString(&buf, ") VALUES (");
	for (i = 0; i < natts; i++)
		appendStringInfo(&buf, "%s$%d", i ? ", " : "", i + 1);
	appendStringInfoString(&buf, ") ON CONFLICT DO NOTHING");
	store_sql_argtypes(store, types, natts);
	store_sql_nulls(a->isnull, nulls, natts);
	rc = SPI_execute_with_args(buf.data, natts, types, a->values, nulls,
							   false, 0);
	store_sql_check(rc, SPI_OK_INSERT, "insert");
	a->inserted = (SPI_processed == 1);
}

static IdemStoreResult
store_sql_insert(IdemStore *store, Datum *values, bool *isnull,
				 IdemStoreWait wait)
{
	StoreSqlUser su;
	StoreSqlInsert a = {values, isnull, false};
	bool		ran = true;

	store_sql_begin(store, &su);
	/*
	 * With IDEM_WAIT the statement waits for an inserter in flight by
	 * itself.  A probe first would count the wait as waited, as on one
	 * server, but costs a quarter of a claim's CPU on Citus: not done.
	 */
	if (wait == IDEM_NOWAIT)
	{
		ProbeResult found = store_sql_probe_shard(store, values, IDEM_NOWAIT);

		/*
		 * As the direct path: an insertion or a deletion in flight is a
		 * holder in flight.  Without one, the statement still runs with its
		 * lock timeout: a holder may come between the probe and the
		 * statement, and this call must not wait for it.
		 */
		if (found == PROBE_IN_FLIGHT_INSERT || found == PROBE_IN_FLIGHT_DELETE)
		{
			store_sql_end(&su);
			return IDEM_STORE_IN_FLIGHT;
		}
	}
	if (wait == IDEM_WAIT)
		store_sql_insert_stmt(store, &a);
	else
		ran = store_sql_nowait(store, store_sql_insert_stmt, &a);
	store_sql_end(&su);
	if (!ran)
		return IDEM_STORE_IN_FLIGHT;
	return a.inserted ? IDEM_STORE_INSERTED : IDEM_STORE_EXISTS;
}

/* SELECT * of the row with the key; FOR UPDATE when lock is set. */
static bool
store_sql_select(IdemStore *store, const Datum *keys, const char *lock,
				 MemoryContext cxt, Datum *values, bool *isnull)
{
	Oid			types[STORE_MAX_KEYS];
	StringInfoData buf;
	int			rc;

	initStringInfo(&buf);
	appendStringInfo(&buf, "SELECT * FROM %s", store_sql_relname(store));
	store_sql_where(store, &buf);
	if (lock)
		appendStringInfo(&buf, " %s", lock);
	store_sql_argtypes(store, types, store->nkeys);
	rc = SPI_execute_with_args(buf.data, store->nkeys, types,
							   (Datum *) keys, NULL, false, 0);
	store_sql_check(rc, SPI_OK_SELECT, "select");
	if (SPI_processed == 0)
		return false;
	if (values != NULL)
		store_sql_copy_row(store, cxt, values, isnull);
	return true;
}

static IdemStoreResult
store_sql_lookup(IdemStore *store, const Datum *keys, IdemStoreWait wait,
				 Datum *values, bool *isnull)
{
	StoreSqlUser su;
	MemoryContext cxt = CurrentMemoryContext;
	bool		found;

	store_sql_begin(store, &su);
	/* an in-flight deletion leaves the row, as on the direct path */
	if (store_sql_probe_shard(store, keys, wait) == PROBE_IN_FLIGHT_INSERT)
	{
		store_sql_end(&su);
		return IDEM_STORE_IN_FLIGHT;
	}
	found = store_sql_select(store, keys, NULL, cxt, values, isnull);
	store_sql_end(&su);
	return found ? IDEM_STORE_EXISTS : IDEM_STORE_ABSENT;
}

static bool
store_sql_delete(IdemStore *store, const Datum *keys)
{
	StoreSqlUser su;
	Oid			types[STORE_MAX_KEYS];
	StringInfoData buf;
	int			rc;
	bool		deleted;

	store_sql_begin(store, &su);
	/* an inserter in flight is waited for, as the direct path waits */
	(void) store_sql_probe_shard(store, keys, IDEM_WAIT);
	initStringInfo(&buf);
	appendStringInfo(&buf, "DELETE FROM %s", store_sql_relname(store));
	store_sql_where(store, &buf);
	store_sql_argtypes(store, types, store->nkeys);
	rc = SPI_execute_with_args(buf.data, store->nkeys, types,
							   (Datum *) keys, NULL, false, 0);
	store_sql_check(rc, SPI_OK_DELETE, "delete");
	deleted = (SPI_processed > 0);
	store_sql_end(&su);
	return deleted;
}

typedef struct StoreSqlUpdate
{
	const Datum *keys;
	IdemStoreUpdateFn fn;
	void	   *fnarg;
	MemoryContext cxt;
	IdemStoreUpdateResult result;
} StoreSqlUpdate;

static void
store_sql_update_stmt(IdemStore *store, void *arg)
{
	StoreSqlUpdate *a = (StoreSqlUpdate *) arg;
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	int			natts = tupdesc->natts;
	Datum	   *values = palloc(natts * sizeof(Datum));
	bool	   *isnull = palloc(natts * sizeof(bool));
	Oid		   *types = palloc(natts * sizeof(Oid));
	char	   *nulls = palloc(natts + 1);
	MemoryContext oldcxt;
	StringInfoData buf;
	bool		changed;
	int			i;
	int			rc;

	if (!store_sql_select(store, a->keys, "FOR UPDATE", a->cxt, values,
						  isnull))
	{
		a->result = IDEM_UPDATE_ABSENT;
		return;
	}
	/* fn works in the caller's memory, as on the direct path */
	oldcxt = MemoryContextSwitchTo(a->cxt);
	changed = a->fn(tupdesc, values, isnull, a->fnarg);
	MemoryContextSwitchTo(oldcxt);
	if (!changed)
	{
		a->result = IDEM_UPDATE_DECLINED;
		return;
	}
	initStringInfo(&buf);
	appendStringInfo(&buf, "UPDATE %s SET", store_sql_relname(store));
	for (i = store->nkeys; i < natts; i++)
		appendStringInfo(&buf, "%s %s = $%d", i > store->nkeys ? "," : "",
						 store_sql_column(store, i), i + 1);
	store_sql_where(store, &buf);
	store_sql_argtypes(store, types, natts);
	for (i = 0; i < store->nkeys; i++)
	{
		values[i] = a->keys[i];
		isnull[i] = false;
	}
	store_sql_nulls(isnull, nulls, natts);
	rc = SPI_execute_with_args(buf.data, natts, types, values, nulls,
							   false, 0);
	store_sql_check(rc, SPI_OK_UPDATE, "update");
	a->result = SPI_processed > 0 ? IDEM_UPDATE_DONE : IDEM_UPDATE_ABSENT;
}

/*
 * Whether fn declines the row as a statement without a lock reads it; fn
 * works in cxt, the caller's memory, as in store_sql_update_stmt.
 */
static bool
store_sql_decline_unlocked(IdemStore *store, const Datum *keys,
						   IdemStoreUpdateFn fn, void *arg, MemoryContext cxt)
{
	TupleDesc	tupdesc = RelationGetDescr(store->rel);
	Datum	   *values = MemoryContextAlloc(cxt, tupdesc->natts * sizeof(Datum));
	bool	   *isnull = MemoryContextAlloc(cxt, tupdesc->natts * sizeof(bool));
	MemoryContext oldcxt;
	bool		changed;

	if (!store_sql_select(store, keys, NULL, cxt, values, isnull))
		return false;
	oldcxt = MemoryContextSwitchTo(cxt);
	changed = fn(tupdesc, values, isnull, arg);
	MemoryContextSwitchTo(oldcxt);
	return !changed;
}

static IdemStoreUpdateResult
store_sql_update(IdemStore *store, const Datum *keys, IdemStoreUpdateFn fn,
				 void *arg, IdemStoreWait wait)
{
	StoreSqlUser su;
	StoreSqlUpdate a = {keys, fn, arg, CurrentMemoryContext, IDEM_UPDATE_ABSENT};
	bool		ran = true;

	store_sql_begin(store, &su);
	if (store_sql_probe_shard(store, keys, wait) == PROBE_IN_FLIGHT_INSERT)
	{
		store_sql_end(&su);
		return IDEM_UPDATE_BUSY;
	}

	/*
	 * A call that does not wait answers a version fn declines without a
	 * lock, as on the direct path: a lock kept until this transaction ends
	 * would make other transactions' calls of the key answer in flight, and
	 * the owner's own updates wait, where nothing was written (a replay, a
	 * mismatch).  Only a version fn would change is read again FOR UPDATE,
	 * and judged again.  (The version read is the last committed one: a
	 * transaction still writing the row is not seen, where the direct path
	 * answers in flight; see README, "Scale-out on Citus".)  A call that
	 * waits judges the version it locked, after any writer in flight: an
	 * unlocked read could decline what that writer changes (an offset being
	 * reset).
	 */
	if (wait == IDEM_NOWAIT &&
		store_sql_decline_unlocked(store, keys, fn, arg, a.cxt))
	{
		store_sql_end(&su);
		return IDEM_UPDATE_DECLINED;
	}
	if (wait == IDEM_WAIT)
		store_sql_update_stmt(store, &a);
	else
		ran = store_sql_nowait(store, store_sql_update_stmt, &a);
	store_sql_end(&su);
	return ran ? a.result : IDEM_UPDATE_BUSY;
}

static bool
store_sql_read(IdemStore *store, const Datum *keys, Datum *values,
			   bool *isnull)
{
	StoreSqlUser su;
	MemoryContext cxt = CurrentMemoryContext;
	bool		found;

	/* no wait: an uncommitted change of another transaction is not seen */
	store_sql_begin(store, &su);
	/* a transaction snapshot must see the row as it stands */
	if (IsolationUsesXactSnapshot())
		(void) store_sql_probe_shard(store, keys, IDEM_NOWAIT);
	found = store_sql_select(store, keys, NULL, cxt, values, isnull);
	store_sql_end(&su);
	return found;
}

static void
store_sql_unsupported(IdemStore *store, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("%s is not supported on distributed table \"%s.%s\"", what,
					IDEM_SCHEMA, RelationGetRelationName(store->rel))));
}
