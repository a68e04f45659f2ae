/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Counters of every capability's outcomes, per database, kind and
 *	  namespace, in shared memory.
 *
 * With idem in shared_preload_libraries, a hash table in shared memory holds
 * one entry per (database, kind, namespace): claims per namespace, tokens per
 * scope, transitions per machine, requests per namespace and outbox messages
 * per topic.  Each entry has one atomic counter per outcome.  Nothing is
 * written to a table.
 *
 * Work that rolls back is not counted.  A backend keeps what its transaction
 * did in a local list, tagged with the subtransaction level; a subtransaction
 * that aborts drops its part, and the list is added to shared memory when
 * the transaction commits.  A prepared transaction's list is parked in
 * shared memory under its GID and added by COMMIT PREPARED, dropped by
 * ROLLBACK PREPARED (see "Prepared transactions" below).
 *
 * The number of entries is bounded by idem.max_namespaces.  When the table is
 * full, the counts of a new namespace go to the namespace "*" of its kind,
 * for which room is kept (for 64 databases).  Only the entries of dropped
 * databases are removed (see idem_stats_forget_dropped; a reset sets the
 * counters of the others to zero), so a backend may add to an entry of its
 * database without holding the lock.
 *
 * A namespace's duplicate rate is judged when a transaction that counted
 * into it commits, once idem.duplicate_rate_interval has passed since it was
 * last judged, over the operations since then; when it exceeds
 * idem.duplicate_rate_warning, that backend logs one line, with the time the
 * rate covers.  The maintenance worker's launcher also judges, at each of
 * its rounds, every namespace whose interval is over, so that a burst of
 * duplicates followed by silence is not left until the namespace's next
 * commit.  The lines are at most one per interval and namespace.
 *
 * Without preloading, counting does nothing and the functions that read the
 * counters fail with 55000.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "idem.h"

/* Longest namespace kept: an outbox topic has up to 255 bytes. */
#define STATS_NS_LEN		256

/* The namespace that collects new namespaces when the table is full. */
#define STATS_OVERFLOW_NS	"*"

typedef struct StatsKey
{
	Oid			dbid;
	int32		kind;
	char		ns[STATS_NS_LEN];
} StatsKey;

typedef struct StatsEntry
{
	StatsKey	key;			/* hash key: first */
	pg_atomic_uint64 counters[IDEM_STAT_MAX_OUTCOMES];
	/* where the current interval of the duplicate rate began */
	TimestampTz interval_start;
	uint64		interval_ops;
	uint64		interval_dups;
	/*
	 * Sweeps begun before a backend of its database last looked it up:
	 * written under the shared lock (atomically); a sweep removes it only
	 * under the exclusive one (see idem_stats_forget_dropped).
	 */
	pg_atomic_uint64 seen_sweep;
} StatsEntry;

typedef struct StatsShared
{
	LWLock	   *lock;			/* the hash table's entries and resets */
	TimestampTz stats_reset;
	int			nentries;		/* entries but the overflow ones */
	int			noverflow;		/* the overflow ones */
	uint64		sweeps;			/* of dropped databases' entries, begun */
} StatsShared;

/* what each kind counts, in the order of its outcomes */
typedef struct StatsKindInfo
{
	const char *name;			/* kind, as idem_stats shows it */
	const char *metric;			/* Prometheus counter */
	const char *help;
	int			noutcomes;
	const char *outcomes[IDEM_STAT_MAX_OUTCOMES];
	uint32		operations;		/* bit per outcome that is an operation */
	int			duplicate;		/* the outcome that is a duplicate */
} StatsKindInfo;

static const StatsKindInfo kinds[IDEM_NKINDS] = {
	[IDEM_KIND_CLAIM] = {
		"claim", "idem_claims_total",
		"Claims of a message id, by outcome; waited counts claims that waited for another transaction.",
		4, {"claimed", "duplicate", "in_flight", "waited"},
		(1 << 0) | (1 << 1) | (1 << 2), 1
	},
	[IDEM_KIND_TOKEN] = {
		"token", "idem_tokens_total",
		"Single-use tokens issued, consumed, and rejected by reason, by scope.",
		5, {"issued", "consumed", "rejected_consumed", "rejected_expired", "rejected_unknown"},
		(1 << 1) | (1 << 2) | (1 << 3) | (1 << 4), 2
	},
	[IDEM_KIND_TRANSITION] = {
		"transition", "idem_transitions_total",
		"Calls of idem_transition by outcome, by machine.",
		5, {"applied", "already", "stale", "illegal", "not_found"},
		(1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4), 1
	},
	[IDEM_KIND_REQUEST] = {
		"request", "idem_requests_total",
		"Request idempotency keys: begins by status, and finished requests, by namespace.",
		6, {"new", "replay", "mismatch", "in_flight", "resume", "finished"},
		(1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4), 1
	},
	[IDEM_KIND_OUTBOX] = {
		"outbox", "idem_outbox_messages_total",
		"Outbox messages sent, leased, leased again, delivered, retried after a failure and dead, by topic.",
		6, {"sent", "leased", "redelivered", "delivered", "retried", "dead"},
		(1 << 1), 2
	},
};

/* GUCs */
static int	stats_max_namespaces = 1000;
static double stats_duplicate_rate_warning = 0.0;
static int	stats_duplicate_rate_interval = 60;	/* seconds */
static int	stats_duplicate_rate_min_operations = 100;

static StatsShared *stats_shared = NULL;
static HTAB *stats_hash = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ProcessUtility_hook_type prev_ProcessUtility_hook = NULL;

/*
 * ---- Prepared transactions ----
 *
 * The counts of a prepared transaction wait in a slot of shared memory,
 * named by its database and GID, until COMMIT PREPARED adds them or
 * ROLLBACK PREPARED drops them: a prepared transaction may still roll back.
 * There is a slot per max_prepared_transactions, each with room for
 * STATS_PREPARED_ITEMS kinds and namespaces; a transaction whose counts do
 * not fit, or that finds no free slot, is counted when it is prepared, as
 * is one prepared while the GID could not be learnt.  The slots live as
 * long as shared memory: a transaction still prepared when the server
 * stops is not counted when it is committed after the restart.
 *
 * A slot also holds the transaction's XID, and is settled by the outcome of
 * that XID, not by the statement that finished its GID: once COMMIT
 * PREPARED has freed a GID, another transaction can be prepared under it
 * before the statement returns, and its slot must be neither taken nor
 * overwritten then.
 */
#define STATS_PREPARED_ITEMS	8

typedef struct PreparedItem
{
	int32		kind;
	char		ns[STATS_NS_LEN];
	int64		counts[IDEM_STAT_MAX_OUTCOMES];
} PreparedItem;

typedef struct PreparedSlot
{
	Oid			dbid;			/* InvalidOid: free */
	TransactionId xid;			/* the prepared transaction */
	char		gid[GIDSIZE];
	int			nitems;
	uint64		made_sweep;		/* sweeps begun before it was taken */
	PreparedItem items[STATS_PREPARED_ITEMS];
} PreparedSlot;

static PreparedSlot *stats_prepared = NULL;	/* under stats_shared->lock */
static int	stats_nprepared = 0;

/* The GID of the PREPARE TRANSACTION this backend is running, if any. */
static char stats_prepare_gid[GIDSIZE];
static bool stats_prepare_gid_set = false;

/*
 * What this backend's transaction counted, not yet in shared memory.  One
 * entry per kind, namespace and subtransaction level, in the order they were
 * made: the levels never decrease along the list (a subtransaction's entries
 * are the last ones while it runs), so the end of a subtransaction touches
 * only the tail.
 */
typedef struct PendingKey
{
	int32		kind;
	int32		level;
	char		ns[STATS_NS_LEN];	/* zero-padded: the key is hashed whole */
} PendingKey;

typedef struct PendingEntry
{
	PendingKey	key;
	int64		counts[IDEM_STAT_MAX_OUTCOMES];
} PendingEntry;

static PendingEntry *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static bool callbacks_registered = false;

/*
 * A transaction that counts in many namespaces (a batch that spans many
 * tenants) finds its entries through a hash table of their positions, built
 * once the list is longer than STATS_PENDING_HASH_MIN: searching the list
 * made such a transaction quadratic (a million namespaces took over half an
 * hour).
 */
#define STATS_PENDING_HASH_MIN	32

/*
 * A transaction counts in at most this many namespaces (of every kind and
 * subtransaction level) on their own; the further ones are counted under
 * "*" of their kind, as when the table in shared memory is full.  Each entry
 * takes some 600 bytes with its place in the hash table: without a bound, a
 * statement that counted in two million namespaces took 1.3 GB and failed.
 */
#define STATS_PENDING_MAX		65536

typedef struct PendingHashEntry
{
	PendingKey	key;
	int			index;			/* in pending[] */
} PendingHashEntry;

static HTAB *pending_hash = NULL;

/*
 * The shared entries this backend has added to, so that a commit finds its
 * entry without the lock and the hash lookup.  Only the entries of a
 * dropped database are removed from shared memory (a reset zeroes them),
 * so a pointer stays good for the life of the backend, whose database
 * does not change.
 */
#define STATS_LOCAL_ENTRIES 16

typedef struct LocalEntry
{
	int32		kind;
	char		ns[STATS_NS_LEN];
	StatsEntry *entry;
} LocalEntry;

static LocalEntry local_entries[STATS_LOCAL_ENTRIES];
static int	nlocal = 0;
static int	nextlocal = 0;		/* the one to replace when all are taken */

/*
 * Each database has its own overflow entry per kind, beyond the limit: room
 * is kept for those of this many databases (the counts of more are not
 * kept, until the entries of dropped databases are removed).
 */
#define STATS_OVERFLOW_DATABASES	64

static long
stats_maxentries(void)
{
	return (long) stats_max_namespaces + IDEM_NKINDS * STATS_OVERFLOW_DATABASES;
}

static Size
stats_memsize(void)
{
	long		n = stats_maxentries();

	return add_size(add_size(MAXALIGN(sizeof(StatsShared)),
							 hash_estimate_size(n, sizeof(StatsEntry))),
					mul_size(Max(max_prepared_xacts, 0), sizeof(PreparedSlot)));
}

static void
stats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(stats_memsize());
	RequestNamedLWLockTranche("idem_stats", 1);
}

static void
stats_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;
	long		n = stats_maxentries();

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	stats_shared = ShmemInitStruct("idem_stats", sizeof(StatsShared), &found);
	if (!found)
	{
		stats_shared->lock = &(GetNamedLWLockTranche("idem_stats"))->lock;
		stats_shared->stats_reset = GetCurrentTimestamp();
		stats_shared->nentries = 0;
		stats_shared->noverflow = 0;
		stats_shared->sweeps = 0;
	}
	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(StatsEntry);
	/* never more than its room: the server's spare shared memory is others' */
	stats_hash = ShmemInitHash("idem_stats hash", n, n, &info,
							   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	stats_nprepared = Max(max_prepared_xacts, 0);
	if (stats_nprepared > 0)
	{
		stats_prepared = ShmemInitStruct("idem_stats prepared",
										 mul_size(stats_nprepared,
												  sizeof(PreparedSlot)),
										 &found);
		if (!found)
			memset(stats_prepared, 0, stats_nprepared * sizeof(PreparedSlot));
	}
	LWLockRelease(AddinShmemInitLock);
}

static void stats_utility(PlannedStmt *pstmt, const char *queryString,
						  bool readOnlyTree, ProcessUtilityContext context,
						  ParamListInfo params, QueryEnvironment *queryEnv,
						  DestReceiver *dest, QueryCompletion *qc);

void
idem_stats_init(void)
{
	DefineCustomRealVariable("idem.duplicate_rate_warning",
							 "Duplicate rate of a namespace over an interval above which idem logs a warning.",
							 "0 turns the warning off.",
							 &stats_duplicate_rate_warning,
							 0.0, 0.0, 1.0,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.duplicate_rate_interval",
							"Length of the interval over which the duplicate rate is judged.",
							NULL,
							&stats_duplicate_rate_interval,
							60, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("idem.duplicate_rate_min_operations",
							"Operations an interval must have before its duplicate rate is judged.",
							NULL,
							&stats_duplicate_rate_min_operations,
							100, 1, INT_MAX,
							PGC_SIGHUP, 0, NULL, NULL, NULL);

	/*
	 * The rest only when preloading: a PGC_POSTMASTER setting cannot be
	 * defined once the server runs (that would end the session).
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("idem.max_namespaces",
							"Number of namespaces whose outcomes idem counts in shared memory.",
							"When they are all taken, a new namespace is counted under \"*\".",
							&stats_max_namespaces,
							1000, 10, 1000000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
	prev_ProcessUtility_hook = ProcessUtility_hook;
	ProcessUtility_hook = stats_utility;
}

/*
 * ---- Counting ----
 */

static void stats_flush(void);
static bool stats_park_prepared(void);
static void stats_finish_prepared(const char *gid);

/* Most transactions count a few namespaces: a larger list is not kept. */
#define STATS_PENDING_KEEP	64

static void
stats_pending_reset(void)
{
	npending = 0;
	if (pending_hash != NULL)
	{
		hash_destroy(pending_hash);
		pending_hash = NULL;
	}
	if (maxpending > STATS_PENDING_KEEP)
	{
		pfree(pending);
		pending = NULL;
		maxpending = 0;
	}
}

/* The key of (kind, level, namespace), zero-padded. */
static void
stats_pending_key(PendingKey *key, int32 kind, int level, const char *ns,
				  int nslen)
{
	memset(key, 0, sizeof(PendingKey));
	key->kind = kind;
	key->level = level;
	memcpy(key->ns, ns, nslen);
}

/* Where the entry of key is among the first n entries, or -1. */
static int
stats_pending_find(const PendingKey *key, int n)
{
	int			i;

	if (pending_hash != NULL)
	{
		PendingHashEntry *h = hash_search(pending_hash, key, HASH_FIND, NULL);

		return (h != NULL && h->index < n) ? h->index : -1;
	}
	for (i = n - 1; i >= 0; i--)
	{
		PendingKey *k = &pending[i].key;

		if (k->kind == key->kind && k->level == key->level &&
			strcmp(k->ns, key->ns) == 0)
			return i;
	}
	return -1;
}

/*
 * Record in the hash table where entry i is.  With build (not in the
 * subtransaction callback, which must not fail), the table is made once the
 * list is long enough; without it, a list that has none is searched.
 */
static void
stats_pending_index(int i, bool build)
{
	PendingHashEntry *h;

	if (pending_hash == NULL)
	{
		HASHCTL		ctl;
		HTAB	   *hash;
		int			j;

		if (!build || npending <= STATS_PENDING_HASH_MIN)
			return;
		ctl.keysize = sizeof(PendingKey);
		ctl.entrysize = sizeof(PendingHashEntry);
		ctl.hcxt = TopMemoryContext;
		hash = hash_create("idem pending statistics", 4 * npending, &ctl,
						   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		for (j = 0; j < npending; j++)
		{
			h = hash_search(hash, &pending[j].key, HASH_ENTER, NULL);
			h->index = j;
		}
		pending_hash = hash;
		return;
	}
	/* in the callback, an entry was removed just before: no allocation */
	h = hash_search(pending_hash, &pending[i].key, HASH_ENTER, NULL);
	h->index = i;
}

static void
stats_pending_unindex(int i)
{
	if (pending_hash != NULL)
		(void) hash_search(pending_hash, &pending[i].key, HASH_REMOVE, NULL);
}

static void
stats_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			stats_flush();
			stats_pending_reset();
			stats_prepare_gid_set = false;
			break;
		case XACT_EVENT_PREPARE:
			/* counted when committed, if it can wait in shared memory */
			if (!stats_park_prepared())
				stats_flush();
			stats_pending_reset();
			stats_prepare_gid_set = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			stats_pending_reset();
			stats_prepare_gid_set = false;
			break;
		default:
			break;
	}
}

static void
stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	int			start;
	int			i;
	int			j;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;

	/* the subtransaction's entries: the tail of the list */
	for (start = npending; start > 0; start--)
		if (pending[start - 1].key.level < level)
			break;

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			/* what the subtransaction did is undone: so are its counts */
			for (i = start; i < npending; i++)
				stats_pending_unindex(i);
			npending = start;
			break;
		case SUBXACT_EVENT_COMMIT_SUB:

			/*
			 * Its counts become the parent's, added to the parent's entry of
			 * the same kind and namespace: one entry per subtransaction
			 * would make a loop of exception blocks grow the list (and the
			 * search of it) without bound.
			 */
			for (i = start, j = start; i < npending; i++)
			{
				PendingEntry *e = &pending[i];
				int			k;

				stats_pending_unindex(i);
				e->key.level = level - 1;
				k = stats_pending_find(&e->key, j);
				if (k >= 0)
				{
					int			o;

					for (o = 0; o < IDEM_STAT_MAX_OUTCOMES; o++)
						pending[k].counts[o] += e->counts[o];
					continue;
				}
				if (j != i)
					pending[j] = *e;
				stats_pending_index(j, false);
				j++;
			}
			npending = j;
			break;
		default:
			break;
	}
}

/*
 * Count n outcomes of a kind in a namespace, for the current transaction.
 */
void
idem_stat_count(IdemStatKind kind, const char *ns, int nslen, int outcome,
				int64 n)
{
	PendingKey	key;
	int			i;
	PendingEntry *e;

	Assert(kind >= 0 && kind < IDEM_NKINDS);
	Assert(outcome >= 0 && outcome < kinds[kind].noutcomes);
	if (stats_shared == NULL || n == 0)
		return;
	if (nslen >= STATS_NS_LEN)
		nslen = STATS_NS_LEN - 1;
	stats_pending_key(&key, (int32) kind, GetCurrentTransactionNestLevel(),
					  ns, nslen);

	i = stats_pending_find(&key, npending);
	if (i >= 0)
	{
		pending[i].counts[outcome] += n;
		return;
	}
	if (npending >= STATS_PENDING_MAX &&
		!(nslen == 1 && ns[0] == STATS_OVERFLOW_NS[0]))
	{
		idem_stat_count(kind, STATS_OVERFLOW_NS, 1, outcome, n);
		return;
	}

	if (!callbacks_registered)
	{
		RegisterXactCallback(stats_xact_callback, NULL);
		RegisterSubXactCallback(stats_subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (npending == maxpending)
	{
		maxpending = Max(8, maxpending * 2);
		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext,
										 sizeof(PendingEntry) * maxpending);
		else
			pending = repalloc(pending, sizeof(PendingEntry) * maxpending);
	}
	e = &pending[npending++];
	memset(e, 0, sizeof(PendingEntry));
	e->key = key;
	e->counts[outcome] = n;
	stats_pending_index(npending - 1, true);
}

void
idem_stat_count_text(IdemStatKind kind, text *ns, int outcome, int64 n)
{
	if (stats_shared == NULL || n == 0)
		return;
	idem_stat_count(kind, VARDATA_ANY(ns), VARSIZE_ANY_EXHDR(ns), outcome, n);
}

/*
 * The shared entry of a key, made if there is room; NULL if not (the
 * overflow entries "*" have room for 64 databases' of each kind).  An entry
 * looked up is marked as seen by a backend of its database at this sweep
 * (see idem_stats_forget_dropped).
 */
static StatsEntry *
stats_entry(StatsKey *key, bool create)
{
	StatsEntry *entry;
	bool		found;
	bool		overflow = strcmp(key->ns, STATS_OVERFLOW_NS) == 0;
	int			i;
	int			room;

	LWLockAcquire(stats_shared->lock, LW_SHARED);
	entry = hash_search(stats_hash, key, HASH_FIND, NULL);
	if (entry != NULL)
		pg_atomic_write_u64(&entry->seen_sweep, stats_shared->sweeps);
	/* full: not worth the exclusive lock, which every commit would queue on */
	room = overflow ?
		IDEM_NKINDS * STATS_OVERFLOW_DATABASES - stats_shared->noverflow :
		stats_max_namespaces - stats_shared->nentries;
	LWLockRelease(stats_shared->lock);
	if (entry != NULL || !create || room <= 0)
		return entry;

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	entry = hash_search(stats_hash, key, HASH_FIND, NULL);
	if (entry != NULL)
		pg_atomic_write_u64(&entry->seen_sweep, stats_shared->sweeps);
	if (entry == NULL &&
		(overflow ?
		 stats_shared->noverflow < IDEM_NKINDS * STATS_OVERFLOW_DATABASES :
		 stats_shared->nentries < stats_max_namespaces))
	{
		entry = hash_search(stats_hash, key, HASH_ENTER_NULL, &found);
		if (entry != NULL && !found)
		{
			for (i = 0; i < IDEM_STAT_MAX_OUTCOMES; i++)
				pg_atomic_init_u64(&entry->counters[i], 0);
			entry->interval_start = GetCurrentTimestamp();
			entry->interval_ops = 0;
			entry->interval_dups = 0;
			pg_atomic_init_u64(&entry->seen_sweep, stats_shared->sweeps);
			if (overflow)
				stats_shared->noverflow++;
			else
				stats_shared->nentries++;
		}
	}
	LWLockRelease(stats_shared->lock);
	return entry;
}

/* Whether the sweep "sweep" removes an entry or slot: see below. */
static inline bool
stats_dropped(Oid dbid, uint64 seen, uint64 sweep, const Oid *live, int nlive)
{
	return seen < sweep && OidIsValid(dbid) &&
		bsearch(&dbid, live, nlive, sizeof(Oid), oid_cmp) == NULL;
}

/*
 * Remove the entries of dropped databases, which would otherwise keep their
 * room (and their namespaces, the limit's) until the server stops, and free
 * their prepared transactions' slots left unsettled; returns how many
 * entries.  Called in a transaction.  An entry last looked up (or a slot
 * taken) before this sweep began was so by a backend of a database that
 * existed then: if pg_database, read after that, no longer has it, the
 * database was dropped, and with it every backend that could hold a pointer
 * to the entry (see local_entries); no transaction of it is prepared.  The
 * maintenance worker's launcher calls it every round, and so does
 * idem_stats_reset.
 */
int
idem_stats_forget_dropped(void)
{
	uint64		sweep;
	Oid		   *live;
	int			nlive = 0;
	int			maxlive = 64;
	int			removed = 0;
	bool		any = false;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	HASH_SEQ_STATUS seq;
	StatsEntry *entry;
	int			i;

	if (stats_shared == NULL)
		return 0;
	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	sweep = ++stats_shared->sweeps;
	LWLockRelease(stats_shared->lock);

	/* the databases as they are now, not as a snapshot taken before */
	InvalidateCatalogSnapshot();
	live = palloc(sizeof(Oid) * maxlive);
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		if (nlive == maxlive)
		{
			maxlive *= 2;
			live = repalloc(live, sizeof(Oid) * maxlive);
		}
		live[nlive++] = ((Form_pg_database) GETSTRUCT(tup))->oid;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	qsort(live, nlive, sizeof(Oid), oid_cmp);

	/* mostly none: found under the shared lock, which commits share */
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&seq, stats_hash);
	while (!any && (entry = hash_seq_search(&seq)) != NULL)
		any = stats_dropped(entry->key.dbid,
							pg_atomic_read_u64(&entry->seen_sweep), sweep,
							live, nlive);
	if (any)
		hash_seq_term(&seq);
	for (i = 0; !any && i < stats_nprepared; i++)
		any = stats_dropped(stats_prepared[i].dbid,
							stats_prepared[i].made_sweep, sweep, live, nlive);
	LWLockRelease(stats_shared->lock);
	if (!any)
	{
		pfree(live);
		return 0;
	}

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		if (!stats_dropped(entry->key.dbid,
						   pg_atomic_read_u64(&entry->seen_sweep), sweep,
						   live, nlive))
			continue;
		if (strcmp(entry->key.ns, STATS_OVERFLOW_NS) == 0)
			stats_shared->noverflow--;
		else
			stats_shared->nentries--;
		/* removing the entry just returned is allowed during a scan */
		(void) hash_search(stats_hash, &entry->key, HASH_REMOVE, NULL);
		removed++;
	}
	for (i = 0; i < stats_nprepared; i++)
		if (stats_dropped(stats_prepared[i].dbid, stats_prepared[i].made_sweep,
						  sweep, live, nlive))
			stats_prepared[i].dbid = InvalidOid;
	LWLockRelease(stats_shared->lock);
	pfree(live);
	return removed;
}

/*
 * The operations and duplicates of an entry.  A commit adds an operation
 * before the duplicate it is (or with it), so the duplicates read first
 * never exceed the operations read after.
 */
static void
stats_read_rate(const StatsKindInfo *k, StatsEntry *entry, uint64 *ops,
				uint64 *dups)
{
	int			i;

	*dups = pg_atomic_read_u64(&entry->counters[k->duplicate]);
	pg_read_barrier();
	*ops = 0;
	for (i = 0; i < k->noutcomes; i++)
		if (k->operations & (1 << i))
			*ops += pg_atomic_read_u64(&entry->counters[i]);
}

/*
 * Under the exclusive lock: end the entry's interval of the duplicate rate
 * if it is over, with what it counted in *ops, *dups and when it began in
 * *start; false if it is not over (another process may have ended it).
 */
static bool
stats_end_interval(StatsEntry *entry, TimestampTz now, uint64 *ops,
				   uint64 *dups, TimestampTz *start)
{
	uint64		all_ops;
	uint64		all_dups;

	if (!TimestampDifferenceExceeds(entry->interval_start, now,
									stats_duplicate_rate_interval * 1000))
		return false;
	stats_read_rate(&kinds[entry->key.kind], entry, &all_ops, &all_dups);
	*ops = all_ops - entry->interval_ops;
	*dups = all_dups - entry->interval_dups;
	*start = entry->interval_start;
	entry->interval_start = now;
	entry->interval_ops = all_ops;
	entry->interval_dups = all_dups;
	return true;
}

/*
 * Log the duplicate rate of an interval that ended, if too high.  dbname,
 * given by a process connected to no database, names the entry's database
 * in the line (a backend's log_line_prefix can say it).
 */
static void
stats_log_rate(const StatsKey *key, uint64 ops, uint64 dups,
			   TimestampTz start, TimestampTz now,
			   const char *(*dbname) (Oid dbid))
{
	const StatsKindInfo *k = &kinds[key->kind];
	double		rate;
	const char *db;

	if (ops < (uint64) stats_duplicate_rate_min_operations)
		return;
	rate = (double) dups / (double) ops;
	if (rate <= stats_duplicate_rate_warning)
		return;
	db = dbname != NULL ? dbname(key->dbid) : NULL;
	ereport(LOG,
			(errmsg("idem: duplicate rate of %s namespace \"%s\" is %.3f over the last %.0f s",
					k->name, key->ns, rate,
					(double) (now - start) / USECS_PER_SEC),
			 dbname != NULL ?
			 errdetail("%llu of %llu operations in database \"%s\" were duplicates; idem.duplicate_rate_warning is %g.",
					   (unsigned long long) dups, (unsigned long long) ops,
					   db ? db : "?", stats_duplicate_rate_warning) :
			 errdetail("%llu of %llu operations were duplicates; idem.duplicate_rate_warning is %g.",
					   (unsigned long long) dups, (unsigned long long) ops,
					   stats_duplicate_rate_warning)));
}

/*
 * Judge the duplicate rate of an entry of this backend's database (which
 * cannot be removed while it is connected) when its interval is over.
 */
static void
stats_check_rate(StatsEntry *entry)
{
	TimestampTz now;
	TimestampTz start;
	uint64		ops;
	uint64		dups;
	bool		ended;
	StatsKey	key;

	if (stats_duplicate_rate_warning <= 0.0)
		return;
	now = GetCurrentTimestamp();
	/* an unlocked look first: a torn read only costs the lock */
	if (!TimestampDifferenceExceeds(entry->interval_start, now,
									stats_duplicate_rate_interval * 1000))
		return;
	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	ended = stats_end_interval(entry, now, &ops, &dups, &start);
	key = entry->key;
	LWLockRelease(stats_shared->lock);
	if (ended)
		stats_log_rate(&key, ops, dups, start, now, NULL);
}

/* A rate too high, to be logged once the lock is released. */
typedef struct StatsDue
{
	StatsKey	key;
	uint64		ops;
	uint64		dups;
	TimestampTz start;
} StatsDue;

/*
 * Judge every namespace whose interval is over, as a commit of its work
 * would.  The maintenance worker's launcher calls it at each round; dbname
 * names a database for the lines.  When a look under the shared lock finds
 * one, a pass under the exclusive lock ends the intervals; the lines, for
 * the few rates too high, are logged after it (with copies: an entry of a
 * dropped database may be removed then).
 */
void
idem_stats_judge_idle(const char *(*dbname) (Oid dbid))
{
	HASH_SEQ_STATUS seq;
	StatsEntry *entry;
	StatsDue   *due;
	int			ndue = 0;
	int			maxdue = 16;
	TimestampTz now;
	int			i;

	if (stats_shared == NULL || stats_duplicate_rate_warning <= 0.0)
		return;
	now = GetCurrentTimestamp();
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&seq, stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL &&
		   !TimestampDifferenceExceeds(entry->interval_start, now,
									   stats_duplicate_rate_interval * 1000))
		;
	if (entry != NULL)
		hash_seq_term(&seq);
	LWLockRelease(stats_shared->lock);
	if (entry == NULL)
		return;

	due = palloc(sizeof(StatsDue) * maxdue);
	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		StatsDue	d;

		if (!stats_end_interval(entry, now, &d.ops, &d.dups, &d.start) ||
			d.ops < (uint64) stats_duplicate_rate_min_operations ||
			(double) d.dups / (double) d.ops <= stats_duplicate_rate_warning)
			continue;
		if (ndue == maxdue)
		{
			maxdue *= 2;
			due = repalloc(due, sizeof(StatsDue) * maxdue);
		}
		d.key = entry->key;
		due[ndue++] = d;
	}
	LWLockRelease(stats_shared->lock);
	for (i = 0; i < ndue; i++)
		stats_log_rate(&due[i].key, due[i].ops, due[i].dups, due[i].start,
					   now, dbname);
	pfree(due);
}

/* The shared entry of a kind and namespace, if this backend knows it. */
static StatsEntry *
stats_local_entry(int32 kind, const char *ns)
{
	int			i;

	for (i = 0; i < nlocal; i++)
		if (local_entries[i].kind == kind &&
			strcmp(local_entries[i].ns, ns) == 0)
			return local_entries[i].entry;
	return NULL;
}

static void
stats_remember_entry(int32 kind, const char *ns, StatsEntry *entry)
{
	LocalEntry *l;

	if (nlocal < STATS_LOCAL_ENTRIES)
		l = &local_entries[nlocal++];
	else
	{
		l = &local_entries[nextlocal];
		nextlocal = (nextlocal + 1) % STATS_LOCAL_ENTRIES;
	}
	l->kind = kind;
	strlcpy(l->ns, ns, STATS_NS_LEN);
	l->entry = entry;
}

/* Add the counts of a kind and namespace of this database to shared memory. */
static void
stats_add(int32 kind, const char *ns, const int64 *counts)
{
	StatsKey	key;
	StatsEntry *entry;
	int			j;

	entry = stats_local_entry(kind, ns);
	if (entry == NULL)
	{
		memset(&key, 0, sizeof(key));
		key.dbid = MyDatabaseId;
		key.kind = kind;
		strlcpy(key.ns, ns, STATS_NS_LEN);
		entry = stats_entry(&key, true);
		if (entry != NULL)
			stats_remember_entry(kind, ns, entry);
		else
		{
			/* full: the namespace "*" of the kind */
			memset(key.ns, 0, sizeof(key.ns));
			strlcpy(key.ns, STATS_OVERFLOW_NS, STATS_NS_LEN);
			entry = stats_entry(&key, true);
			if (entry == NULL)
				return;			/* the room of "*" is taken: not counted */
		}
	}
	for (j = 0; j < kinds[kind].noutcomes; j++)
		if (counts[j] != 0)
			pg_atomic_fetch_add_u64(&entry->counters[j], counts[j]);
	stats_check_rate(entry);
}

/* Add the transaction's counts to shared memory. */
static void
stats_flush(void)
{
	int			i;

	for (i = 0; i < npending; i++)
		stats_add(pending[i].key.kind, pending[i].key.ns, pending[i].counts);
}

/*
 * Park the counts of the transaction being prepared in a slot named by its
 * GID.  False when they were not parked: they are to be counted now.
 */
static bool
stats_park_prepared(void)
{
	PreparedSlot *slot = NULL;
	TransactionId xid = GetTopTransactionIdIfAny();
	int			i;
	int			j;

	if (npending == 0)
		return true;
	if (!stats_prepare_gid_set || stats_prepared == NULL ||
		!TransactionIdIsValid(xid))
		return false;

	/*
	 * Only a free slot: one of the same GID may belong to a transaction
	 * that COMMIT PREPARED has just finished and not settled yet.  With none
	 * free, the slots of this database's transactions that are over (whose
	 * COMMIT or ROLLBACK PREPARED did not get to settle them) are settled
	 * first.
	 */
	for (j = 0; j < 2 && slot == NULL; j++)
	{
		if (j == 1)
			stats_finish_prepared(NULL);
		LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
		for (i = 0; i < stats_nprepared; i++)
		{
			if (stats_prepared[i].dbid == InvalidOid)
			{
				slot = &stats_prepared[i];
				break;
			}
		}
		if (slot == NULL)
			LWLockRelease(stats_shared->lock);
	}
	if (slot == NULL)
		return false;
	slot->dbid = InvalidOid;
	slot->nitems = 0;
	for (i = 0; i < npending; i++)
	{
		PendingEntry *p = &pending[i];
		PreparedItem *item = NULL;

		for (j = 0; j < slot->nitems; j++)
			if (slot->items[j].kind == p->key.kind &&
				strcmp(slot->items[j].ns, p->key.ns) == 0)
				item = &slot->items[j];
		if (item == NULL)
		{
			if (slot->nitems == STATS_PREPARED_ITEMS)
			{
				/* too many to park: the slot stays free */
				LWLockRelease(stats_shared->lock);
				return false;
			}
			item = &slot->items[slot->nitems++];
			memset(item, 0, sizeof(PreparedItem));
			item->kind = p->key.kind;
			strlcpy(item->ns, p->key.ns, STATS_NS_LEN);
		}
		for (j = 0; j < IDEM_STAT_MAX_OUTCOMES; j++)
			item->counts[j] += p->counts[j];
	}
	strlcpy(slot->gid, stats_prepare_gid, GIDSIZE);
	slot->xid = xid;
	slot->dbid = MyDatabaseId;
	slot->made_sweep = stats_shared->sweeps;
	LWLockRelease(stats_shared->lock);
	return true;
}

/*
 * A prepared transaction of GID gid in this database has been committed or
 * rolled back: settle the slots of that GID whose transaction is over, by
 * its outcome (the counts of a committed one are added, those of one rolled
 * back dropped).  A slot of the GID whose transaction is still prepared is
 * another transaction's, prepared since under the same GID: it is left.
 * With gid NULL, every slot of this database whose transaction is over.
 */
static void
stats_finish_prepared(const char *gid)
{
	PreparedItem items[STATS_PREPARED_ITEMS];
	int			i;

	if (stats_prepared == NULL)
		return;
	for (i = 0; i < stats_nprepared; i++)
	{
		PreparedSlot *s = &stats_prepared[i];
		TransactionId xid;
		int			nitems = 0;
		bool		committed;
		int			j;

		LWLockAcquire(stats_shared->lock, LW_SHARED);
		xid = (s->dbid == MyDatabaseId &&
			   (gid == NULL || strcmp(s->gid, gid) == 0)) ?
			s->xid : InvalidTransactionId;
		LWLockRelease(stats_shared->lock);
		if (!TransactionIdIsValid(xid) || TransactionIdIsInProgress(xid))
			continue;
		/* one too old for the commit log to tell (a slot left for long) is dropped */
		LWLockAcquire(XactTruncationLock, LW_SHARED);
		committed = !TransactionIdPrecedes(xid, ShmemVariableCache->oldestClogXid) &&
			TransactionIdDidCommit(xid);
		LWLockRelease(XactTruncationLock);

		LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
		if (s->dbid == MyDatabaseId && s->xid == xid &&
			(gid == NULL || strcmp(s->gid, gid) == 0))
		{
			nitems = s->nitems;
			memcpy(items, s->items, nitems * sizeof(PreparedItem));
			s->dbid = InvalidOid;
			s->xid = InvalidTransactionId;
			s->nitems = 0;
		}
		LWLockRelease(stats_shared->lock);
		if (committed)
			for (j = 0; j < nitems; j++)
				stats_add(items[j].kind, items[j].ns, items[j].counts);
	}
}

/*
 * PREPARE TRANSACTION names the transaction that the callback then parks;
 * COMMIT PREPARED and ROLLBACK PREPARED have finished the prepared
 * transaction once the statement returns.
 */
static void
stats_utility(PlannedStmt *pstmt, const char *queryString,
			  bool readOnlyTree, ProcessUtilityContext context,
			  ParamListInfo params, QueryEnvironment *queryEnv,
			  DestReceiver *dest, QueryCompletion *qc)
{
	TransactionStmt *stmt = NULL;

	if (IsA(pstmt->utilityStmt, TransactionStmt))
		stmt = (TransactionStmt *) pstmt->utilityStmt;
	if (stmt != NULL && stmt->kind == TRANS_STMT_PREPARE && stmt->gid != NULL)
	{
		strlcpy(stats_prepare_gid, stmt->gid, GIDSIZE);
		stats_prepare_gid_set = true;
	}
	if (prev_ProcessUtility_hook)
		prev_ProcessUtility_hook(pstmt, queryString, readOnlyTree, context,
								 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
	if (stmt != NULL && stmt->gid != NULL &&
		(stmt->kind == TRANS_STMT_COMMIT_PREPARED ||
		 stmt->kind == TRANS_STMT_ROLLBACK_PREPARED))
		stats_finish_prepared(stmt->gid);
}

/*
 * ---- Reading ----
 */

static void
stats_check_loaded(void)
{
	if (stats_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem statistics are not available"),
				 errdetail("idem was not loaded by shared_preload_libraries."),
				 errhint("Add idem to shared_preload_libraries and restart the server.")));
}

/*
 * A copy of an entry of the current database, made under the shared lock:
 * the output is built after the lock is released, where it can be cancelled,
 * and the sessions that make entries do not wait for it.
 */
typedef struct StatsCopy
{
	int32		kind;
	char	   *ns;
	uint64		dups;			/* read before the counters (stats_read_rate) */
	uint64		counters[IDEM_STAT_MAX_OUTCOMES];
} StatsCopy;

static StatsCopy *
stats_copy_database(int *n, TimestampTz *reset)
{
	HASH_SEQ_STATUS seq;
	StatsEntry *entry;
	StatsCopy  *copies;
	int			i;

	*n = 0;
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	*reset = stats_shared->stats_reset;
	copies = palloc(sizeof(StatsCopy) * Max(hash_get_num_entries(stats_hash), 1));
	hash_seq_init(&seq, stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		const StatsKindInfo *k;
		StatsCopy  *c;

		if (entry->key.dbid != MyDatabaseId)
			continue;
		k = &kinds[entry->key.kind];
		c = &copies[(*n)++];
		c->kind = entry->key.kind;
		c->ns = pstrdup(entry->key.ns);
		c->dups = pg_atomic_read_u64(&entry->counters[k->duplicate]);
		pg_read_barrier();
		for (i = 0; i < k->noutcomes; i++)
			c->counters[i] = pg_atomic_read_u64(&entry->counters[i]);
	}
	LWLockRelease(stats_shared->lock);
	return copies;
}

/*
 * idem_stats_rows() returns setof (ns, kind, operations, duplicates,
 * duplicate_rate, counters, stats_reset): the rows of the view idem_stats,
 * for the current database.
 */
PG_FUNCTION_INFO_V1(idem_stats_rows);
Datum
idem_stats_rows(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	StatsCopy  *copies;
	int			ncopies;
	int			j;
	TimestampTz reset;

	stats_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != 7)
		elog(ERROR, "idem_stats_rows: unexpected result type");

	copies = stats_copy_database(&ncopies, &reset);
	for (j = 0; j < ncopies; j++)
	{
		StatsCopy  *c = &copies[j];
		const StatsKindInfo *k = &kinds[c->kind];
		Datum		values[7];
		bool		nulls[7] = {0};
		StringInfoData buf;
		uint64		ops = 0;
		uint64		total = 0;
		int			i;

		CHECK_FOR_INTERRUPTS();
		initStringInfo(&buf);
		appendStringInfoChar(&buf, '{');
		for (i = 0; i < k->noutcomes; i++)
		{
			uint64		v = c->counters[i];

			total += v;
			if (k->operations & (1 << i))
				ops += v;
			appendStringInfo(&buf, "%s\"%s\": " UINT64_FORMAT,
							 i > 0 ? ", " : "", k->outcomes[i], v);
		}
		appendStringInfoChar(&buf, '}');
		/* the overflow entries appear once they have counted something */
		if (total == 0 && strcmp(c->ns, STATS_OVERFLOW_NS) == 0)
			continue;
		values[0] = CStringGetTextDatum(c->ns);
		values[1] = CStringGetTextDatum(k->name);
		values[2] = Int64GetDatum((int64) ops);
		values[3] = Int64GetDatum((int64) c->dups);
		if (ops > 0)
			values[4] = Float8GetDatum((double) c->dups / (double) ops);
		else
			nulls[4] = true;
		values[5] = DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
		values[6] = TimestampTzGetDatum(reset);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		pfree(buf.data);
	}
	return (Datum) 0;
}

/*
 * idem_stats_reset() returns void: every counter of every database back to
 * zero.  The namespaces keep their entries, except those of dropped
 * databases, which it removes.
 */
PG_FUNCTION_INFO_V1(idem_stats_reset);
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS seq;
	StatsEntry *entry;
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	stats_check_loaded();
	(void) idem_stats_forget_dropped();
	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, stats_hash);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		for (i = 0; i < IDEM_STAT_MAX_OUTCOMES; i++)
			pg_atomic_write_u64(&entry->counters[i], 0);
		entry->interval_start = now;
		entry->interval_ops = 0;
		entry->interval_dups = 0;
	}
	stats_shared->stats_reset = now;
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}

/*
 * A Prometheus label value: backslash, double quote and newline escaped.
 * The format is UTF-8.  A database in another encoding has its text
 * converted for the client, except SQL_ASCII, which checks nothing: there a
 * byte that does not begin a valid UTF-8 character is written as U+FFFD,
 * so that one namespace cannot make the whole scrape unreadable.
 */
static void
append_label(StringInfo buf, const char *s)
{
	bool		sql_ascii = GetDatabaseEncoding() == PG_SQL_ASCII;

	while (*s)
	{
		unsigned char c = (unsigned char) *s;

		if (c == '\\')
			appendStringInfoString(buf, "\\\\");
		else if (c == '"')
			appendStringInfoString(buf, "\\\"");
		else if (c == '\n')
			appendStringInfoString(buf, "\\n");
		else if (c >= 0x80 && sql_ascii)
		{
			int			len = pg_utf_mblen((const unsigned char *) s);

			if (len > 1 && strnlen(s, len) == (size_t) len &&
				pg_utf8_islegal((const unsigned char *) s, len))
			{
				appendBinaryStringInfo(buf, s, len);
				s += len;
			}
			else
			{
				appendStringInfoString(buf, "\xEF\xBF\xBD");
				s++;
			}
			continue;
		}
		else
			appendStringInfoChar(buf, c);
		s++;
	}
}

/*
 * Longer than any line of idem_metrics (a label escapes each byte in two,
 * or writes it as three).
 */
#define METRICS_LINE_MAX	(4 * STATS_NS_LEN)

/* An error unless need more bytes still fit in idem_metrics' text. */
static void
metrics_room(StringInfo buf, int need, int ncopies)
{
	if ((Size) buf->len + need >= MaxAllocSize - VARHDRSZ)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idem_metrics() output would exceed 1 GB"),
				 errdetail("The current database has %d namespaces counted.",
						   ncopies),
				 errhint("Read the view idem_stats, or lower idem.max_namespaces.")));
}

/*
 * idem_metrics() returns text: the counters of the current database in the
 * Prometheus text exposition format.  A text value holds at most 1 GB; about
 * a million namespaces with long names would need more.
 */
PG_FUNCTION_INFO_V1(idem_metrics);
Datum
idem_metrics(PG_FUNCTION_ARGS)
{
	StringInfoData buf;
	StatsCopy  *copies;
	int			ncopies;
	TimestampTz reset;
	int			k;

	stats_check_loaded();
	copies = stats_copy_database(&ncopies, &reset);
	initStringInfo(&buf);
	for (k = 0; k < IDEM_NKINDS; k++)
	{
		const StatsKindInfo *ki = &kinds[k];
		int			j;

		metrics_room(&buf, METRICS_LINE_MAX, ncopies);
		appendStringInfo(&buf, "# HELP %s %s\n# TYPE %s counter\n",
						 ki->metric, ki->help, ki->metric);
		for (j = 0; j < ncopies; j++)
		{
			int			i;

			if (copies[j].kind != k)
				continue;
			CHECK_FOR_INTERRUPTS();
			metrics_room(&buf, ki->noutcomes * METRICS_LINE_MAX, ncopies);
			for (i = 0; i < ki->noutcomes; i++)
			{
				appendStringInfo(&buf, "%s{namespace=\"", ki->metric);
				append_label(&buf, copies[j].ns);
				appendStringInfo(&buf, "\",outcome=\"%s\"} " UINT64_FORMAT "\n",
								 ki->outcomes[i], copies[j].counters[i]);
			}
		}
	}
	metrics_room(&buf, METRICS_LINE_MAX, ncopies);
	appendStringInfo(&buf,
					 "# HELP idem_stats_reset_timestamp_seconds When the counters were last reset.\n"
					 "# TYPE idem_stats_reset_timestamp_seconds gauge\n"
					 "idem_stats_reset_timestamp_seconds %.3f\n",
					 (double) reset / USECS_PER_SEC +
					 (double) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY);
	PG_RETURN_TEXT_P(cstring_to_text(buf.data));
}
