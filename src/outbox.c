/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The transactional outbox: messages written in the sender's transaction,
 *	  leased by relays, acknowledged once delivered, in order per key.
 *
 * A message is a row of idem.outbox, inserted by idem_outbox_send in the
 * caller's transaction and deleted by idem_outbox_ack.  Its seq, from the
 * sequence idem.outbox_seq, is the order of sending; its id, a UUID that
 * begins with a prefix of key_hash (a 64-bit hash of topic and key) and
 * then seq, puts each key's messages side by side in the primary key, in
 * the order of sending (see outbox_make_id).  So the one index finds a
 * message by its id and gives each key's head, its oldest message not yet
 * acknowledged: the first entry of the key's range whose row has the topic
 * and key sought (keys with one prefix share a range).  A transaction that
 * committed before another began sending has the smaller seq, and any
 * snapshot that sees the later message sees the earlier one.
 *
 * Only a key's head is ever leased, so the state of a delivery lives in one
 * row per (topic, key) of idem.outbox_keys, a keyed table of the store: the
 * head leased last (head_id), how many leases it has had (attempts), when it
 * may be leased again (available_at: the end of a lease or of a backoff) and
 * whether it is dead.  A lease and a nack update that row in place; no
 * indexed column changes, so the updates are HOT.  An ack of a head leased
 * alone does not: it deletes the message, and a lease ends when its message
 * is gone (the row still names it).  Two relays never lease one key at
 * once: the update of the key row is the lock, taken without waiting (a
 * relay skips a key another relay is leasing), and the head is read with a
 * snapshot taken after the key row was read: an ack of an earlier head has
 * committed its deletion (or its update of the row, for the acks that
 * write it), or the lease finds the head busy, being deleted, and skips
 * the key.  A lease that hands a head out again, and a nack, lock the
 * message too, so that an ack deleting it sees what they wrote.
 *
 * The sender only makes sure the key row exists: a probe of its primary key
 * once the key has had a message.  Key rows of idle keys are removed by
 * idem_outbox_purge, under a lock that waits for every sender in flight.
 *
 * Relays are woken by a notification on the channel idem_outbox when a
 * message commits, but only when a relay is idle: a NOTIFY makes committing
 * transactions of the database queue one behind the other, which would halve
 * the rate of senders.  See "Waking relays" below.
 *
 * Times of leases and backoffs are read from the clock, not the start of
 * the transaction: a relay's transaction may be old.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/defrem.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "mb/pg_wchar.h"
#include "port/atomics.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/predicate.h"
#include "storage/lock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "common/hashfn.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "pgstat.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "idem.h"

#define OUTBOX_TABLE		"outbox"
#define OUTBOX_PKEY			"outbox_pkey"
#define OUTBOX_SEQ			"outbox_seq"
#define OUTBOX_KEYS_TABLE	"outbox_keys"
#define OUTBOX_TOPICS_TABLE "outbox_topics"
#define OUTBOX_TOPICS_PKEY	"outbox_topics_pkey"

/* idem.outbox */
#define OB_NATTS			9
#define OB_ID				0
#define OB_TOPIC			1
#define OB_KEY				2
#define OB_TYPE				3
#define OB_PAYLOAD			4
#define OB_HEADERS			5
#define OB_SEQ				6
#define OB_CREATED_AT		7
#define OB_KEY_HASH			8

/* idem.outbox_keys */
#define OK_NATTS			10
#define OK_TOPIC			0
#define OK_KEY				1
#define OK_DEAD				2
#define OK_ATTEMPTS			3
#define OK_AVAILABLE_AT		4
#define OK_HEAD_ID			5
#define OK_LEASED_BY		6
#define OK_LAST_ERROR		7
#define OK_LEASED_THROUGH	8
#define OK_LEASED_MAX		9

/* idem.outbox_topics */
#define OT_NATTS			4

/* idem_outbox_message */
#define OM_NATTS			8

/* Limits, in bytes. */
#define OUTBOX_MAX_TOPIC_LEN	255
#define OUTBOX_MAX_KEY_LEN		1024
#define OUTBOX_MAX_TYPE_LEN		255
#define OUTBOX_MAX_RELAY_LEN	255
#define OUTBOX_MAX_ERROR_LEN	2000
#define OUTBOX_MAX_LEASE_BATCH	10000

/* Without a row in idem.outbox_topics. */
#define OUTBOX_DEFAULT_MAX_ATTEMPTS	10
#define OUTBOX_DEFAULT_BACKOFF_BASE	USECS_PER_SEC
#define OUTBOX_DEFAULT_BACKOFF_MAX	(10 * USECS_PER_MINUTE)

/* The channel relays LISTEN on; the payload is the topic. */
#define OUTBOX_CHANNEL		"idem_outbox"

/* Error message of a lease that ran out, kept in last_error. */
#define OUTBOX_EXPIRED_ERROR "the lease ran out before the message was acknowledged"

/*
 * OIDs of the outbox's relations, looked up by name once per backend and
 * forgotten when the relcache says one of them changed.
 */
static Oid	outbox_relid = InvalidOid;
static Oid	outbox_pkey_oid = InvalidOid;
static Oid	outbox_seq_oid = InvalidOid;
static Oid	outbox_keys_relid = InvalidOid;
static Oid	outbox_topics_relid = InvalidOid;
static Oid	outbox_topics_pkey_oid = InvalidOid;

/*
 * Whether the columns and indexes of idem.outbox, and the columns of
 * idem.outbox_keys, were found as idem made them since the relcache last
 * said one of the relations changed: a send need not compare every column's
 * name again.
 */
static bool outbox_checked = false;
static bool outbox_keys_checked = false;

/*
 * ---- Key rows known to exist ----
 *
 * A sender makes sure its key has a row in idem.outbox_keys; once a key's
 * row is known to be committed, the session's later sends of that key take
 * only the table's lock and skip the probe.
 *
 * Key rows are deleted only by DELETE (idem_outbox_purge's, or one by hand;
 * TRUNCATE, ALTER TABLE and DROP EXTENSION send invalidations of their own).
 * The trigger idem._outbox_keys_deleted, BEFORE DELETE FOR EACH ROW and
 * ALWAYS (so also in a logical replication worker), makes a deleter wait
 * for every sender in flight, as the purge does, with a SHARE lock that
 * conflicts with the senders' ROW EXCLUSIVE; it makes its own session
 * forget at once, and sends an invalidation of the table that other
 * sessions hear when they next take a lock on it.  A sender reads pending
 * invalidations after taking its lock, even one it held already, before it
 * looks here.  The set is used only while that trigger is in place and
 * enabled, as idem made it.
 *
 * A key becomes known only when the transaction that probed it commits: a
 * row this transaction inserted goes if it rolls back, or the subtransaction
 * that inserted it does, and a prepared transaction may still roll back.
 * Nothing may fail once a transaction has committed, so the entries are made
 * before its commit, not yet valid, and made valid once it committed, unless
 * the session forgot the keys meanwhile.  Making the entries never makes the
 * commit fail either: out of memory, keys are just not remembered.
 */
typedef struct OutboxKnownKey
{
	int64		hash;			/* hash key: the key's key_hash */
	bool		valid;			/* its row is known to exist */
	uint64		staged;			/* the stage that last listed it */
	text	   *topic;			/* in outbox_known_cxt */
	text	   *key;
} OutboxKnownKey;

/* entries, and bytes of their texts, past which the set starts again */
#define OUTBOX_KNOWN_MAX		65536
#define OUTBOX_KNOWN_MAX_BYTES	(8 * 1024 * 1024)

static MemoryContext outbox_known_cxt = NULL;
static HTAB *outbox_known = NULL;
static Size outbox_known_bytes = 0;
static uint64 outbox_known_generation = 0;	/* how many times forgotten */
static uint64 outbox_known_stages = 0;	/* how many commits staged keys */

/* Whether idem.outbox_keys has its trigger, as seen when last checked. */
static bool outbox_keys_trigger_ok = false;

/* A key this transaction probed, in TopTransactionContext. */
typedef struct OutboxProbedKey
{
	int64		hash;
	text	   *topic;
	text	   *key;
} OutboxProbedKey;
static List *outbox_probed_keys = NIL;
static Size outbox_probed_bytes = 0;

/* the entries made before this transaction's commit, and when */
static OutboxKnownKey **outbox_staged_keys = NULL;	/* in
													 * TopTransactionContext */
static int	outbox_nstaged = 0;
static uint64 outbox_staged_generation = 0;

/*
 * The set's allocator: NULL when out of memory, so that HASH_ENTER_NULL can
 * answer NULL before a commit rather than fail it.
 */
static void *
outbox_known_alloc(Size size)
{
	return MemoryContextAllocExtended(outbox_known_cxt, size, MCXT_ALLOC_NO_OOM);
}

static void
outbox_known_keys_forget(void)
{
	if (outbox_known_cxt != NULL)
		MemoryContextReset(outbox_known_cxt);
	outbox_known = NULL;
	outbox_known_bytes = 0;
	outbox_known_generation++;
	/* what this transaction probed may be gone by its commit */
	outbox_probed_keys = NIL;
	outbox_probed_bytes = 0;
}

static bool outbox_text_eq(text *a, text *b);

static bool
outbox_known_key(int64 hash, text *topic, text *key)
{
	OutboxKnownKey *e;

	if (outbox_known == NULL || !outbox_keys_trigger_ok)
		return false;
	e = hash_search(outbox_known, &hash, HASH_FIND, NULL);
	return e != NULL && e->valid &&
		outbox_text_eq(e->topic, topic) && outbox_text_eq(e->key, key);
}

/* Remember that this transaction probed a key: known once it commits. */
static void
outbox_known_keys_probed(int64 hash, text *topic, text *key)
{
	OutboxProbedKey *probed;
	MemoryContext oldcxt;
	Size		bytes = VARSIZE_ANY(topic) + VARSIZE_ANY(key);

	if (!outbox_keys_trigger_ok ||
		list_length(outbox_probed_keys) >= OUTBOX_KNOWN_MAX ||
		outbox_probed_bytes + bytes > OUTBOX_KNOWN_MAX_BYTES)
		return;
	/* the set, made here where failing is allowed, not at commit */
	if (outbox_known == NULL)
	{
		HASHCTL		ctl;

		if (outbox_known_cxt == NULL)
			outbox_known_cxt = AllocSetContextCreate(TopMemoryContext,
													 "idem outbox keys known",
													 ALLOCSET_DEFAULT_SIZES);
		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(OutboxKnownKey);
		ctl.hcxt = outbox_known_cxt;
		ctl.alloc = outbox_known_alloc;
		outbox_known = hash_create("idem outbox keys known", 1024, &ctl,
								   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT | HASH_ALLOC);
	}
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	probed = palloc(sizeof(OutboxProbedKey));
	probed->hash = hash;
	probed->topic = (text *) palloc(VARSIZE_ANY(topic));
	memcpy(probed->topic, topic, VARSIZE_ANY(topic));
	probed->key = (text *) palloc(VARSIZE_ANY(key));
	memcpy(probed->key, key, VARSIZE_ANY(key));
	outbox_probed_keys = lappend(outbox_probed_keys, probed);
	outbox_probed_bytes += bytes;
	MemoryContextSwitchTo(oldcxt);
}

/*
 * Before the commit: entries for the keys probed, not yet valid.  Never
 * fails for want of memory: the keys are then not remembered.
 */
static void
outbox_known_keys_stage(void)
{
	ListCell   *lc;

	outbox_staged_keys = NULL;
	outbox_nstaged = 0;
	outbox_staged_generation = outbox_known_generation;
	outbox_known_stages++;
	if (outbox_probed_keys == NIL || outbox_known == NULL)
		return;
	outbox_staged_keys = MemoryContextAllocExtended(TopTransactionContext,
													sizeof(OutboxKnownKey *) *
													list_length(outbox_probed_keys),
													MCXT_ALLOC_NO_OOM);
	if (outbox_staged_keys == NULL)
		return;
	foreach(lc, outbox_probed_keys)
	{
		OutboxProbedKey *p = lfirst(lc);
		OutboxKnownKey *e;
		bool		found;
		Size		bytes = VARSIZE_ANY(p->topic) + VARSIZE_ANY(p->key);
		text	   *t;
		text	   *k;

		/* full: the keys of this commit are not remembered */
		if (hash_get_num_entries(outbox_known) >= OUTBOX_KNOWN_MAX ||
			outbox_known_bytes + bytes > OUTBOX_KNOWN_MAX_BYTES)
			break;
		e = hash_search(outbox_known, &p->hash, HASH_ENTER_NULL, &found);
		if (e == NULL)
			break;
		if (found && outbox_text_eq(e->topic, p->topic) &&
			outbox_text_eq(e->key, p->key))
		{
			/* known already, or listed by this stage already */
			if (e->valid || e->staged == outbox_known_stages)
				continue;
		}
		else
		{
			/* new, or another key of the same hash, which is forgotten */
			e->valid = false;
			e->topic = NULL;
			e->key = NULL;
			t = outbox_known_alloc(VARSIZE_ANY(p->topic));
			k = t == NULL ? NULL : outbox_known_alloc(VARSIZE_ANY(p->key));
			if (k == NULL)
			{
				(void) hash_search(outbox_known, &p->hash, HASH_REMOVE, NULL);
				break;
			}
			memcpy(t, p->topic, VARSIZE_ANY(p->topic));
			memcpy(k, p->key, VARSIZE_ANY(p->key));
			e->topic = t;
			e->key = k;
			outbox_known_bytes += bytes;
		}
		e->staged = outbox_known_stages;
		outbox_staged_keys[outbox_nstaged++] = e;
	}
	outbox_probed_keys = NIL;
	outbox_probed_bytes = 0;
}

/* Once committed: the staged entries are valid.  Cannot fail. */
static void
outbox_known_keys_commit(void)
{
	int			i;

	if (outbox_staged_generation == outbox_known_generation)
		for (i = 0; i < outbox_nstaged; i++)
			outbox_staged_keys[i]->valid = true;
	outbox_staged_keys = NULL;
	outbox_nstaged = 0;
	outbox_probed_keys = NIL;
	outbox_probed_bytes = 0;
}

static void
outbox_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == outbox_relid ||
		relid == outbox_pkey_oid ||
		relid == outbox_seq_oid || relid == outbox_keys_relid ||
		relid == outbox_topics_relid || relid == outbox_topics_pkey_oid)
	{
		outbox_relid = InvalidOid;
		outbox_checked = false;
		outbox_keys_checked = false;
		/* the table of the messages changes often (autovacuum): not that */
		if (relid == InvalidOid || relid == outbox_keys_relid)
		{
			outbox_keys_trigger_ok = false;
			outbox_known_keys_forget();
		}
	}
}

static void outbox_wake_shmem_request(void);
static void outbox_wake_shmem_startup(void);
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void
idem_outbox_init(void)
{
	CacheRegisterRelcacheCallback(outbox_relcache_callback, (Datum) 0);

	/* the flags that spare senders redundant wake-ups: see outbox_wake_claim */
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_wake_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_wake_shmem_startup;
}

static Oid
outbox_lookup(Oid nspid, const char *name)
{
	Oid			relid = get_relname_relid(name, nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s.%s\" of the idem extension does not exist",
						IDEM_SCHEMA, name),
				 errhint("Update the extension with ALTER EXTENSION idem UPDATE.")));
	return relid;
}

static void
outbox_lookup_relids(void)
{
	Oid			nspid;

	if (OidIsValid(outbox_relid))
		return;
	nspid = get_namespace_oid(IDEM_SCHEMA, true);
	if (!OidIsValid(nspid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s.%s\" of the idem extension does not exist",
						IDEM_SCHEMA, OUTBOX_TABLE),
				 errhint("Create the extension again with CREATE EXTENSION idem.")));
	/* the callback may fire during the lookups: set outbox_relid last */
	outbox_pkey_oid = outbox_lookup(nspid, OUTBOX_PKEY);
	outbox_seq_oid = outbox_lookup(nspid, OUTBOX_SEQ);
	outbox_keys_relid = outbox_lookup(nspid, OUTBOX_KEYS_TABLE);
	outbox_topics_relid = outbox_lookup(nspid, OUTBOX_TOPICS_TABLE);
	outbox_topics_pkey_oid = outbox_lookup(nspid, OUTBOX_TOPICS_PKEY);
	outbox_relid = outbox_lookup(nspid, OUTBOX_TABLE);
}

/*
 * Whether a send inserts the primary key's entry itself (see
 * outbox_insert_message), as found when idem.outbox was last checked, and
 * the index's IndexInfo, in outbox_index_cxt.
 */
static bool outbox_direct_index = false;
static MemoryContext outbox_index_cxt = NULL;
static IndexInfo *outbox_pkey_info = NULL;

/*
 * The message table and its primary key, opened for one call.
 */
typedef struct OutboxRels
{
	Relation	rel;
	Relation	pkey;
	TupleTableSlot *slot;
	LOCKMODE	lockmode;
	BlockNumber nblocks;		/* rel's size once asked, or
								 * InvalidBlockNumber */
} OutboxRels;

/*
 * An index the executor would fill with nothing but its columns' values:
 * no expression, predicate or INCLUDE column, ready for insertions, not an
 * exclusion constraint, and unique (checked at once) exactly when expected.
 */
static bool
outbox_index_plain(Relation index, bool unique)
{
	Form_pg_index ix = index->rd_index;

	return ix->indisready && ix->indimmediate &&
		ix->indisunique == unique && !ix->indisexclusion &&
		ix->indnatts == ix->indnkeyatts &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);
}

/*
 * Whether the table's only index is the primary key idem made, plain: then
 * a send inserts its entry without the executor's state.  An index a user
 * added (or one REINDEX CONCURRENTLY is building) sends every insertion
 * through the executor's routine, which keeps them all.
 */
static void
outbox_check_direct_index(OutboxRels *r)
{
	List	   *indexes = RelationGetIndexList(r->rel);
	MemoryContext old;

	outbox_direct_index = list_length(indexes) == 1 &&
		list_member_oid(indexes, RelationGetRelid(r->pkey)) &&
		outbox_index_plain(r->pkey, true);
	list_free(indexes);
	if (!outbox_direct_index)
		return;
	if (outbox_index_cxt == NULL)
		outbox_index_cxt = AllocSetContextCreate(TopMemoryContext,
												 "idem outbox indexes",
												 ALLOCSET_SMALL_SIZES);
	MemoryContextReset(outbox_index_cxt);
	outbox_pkey_info = NULL;
	old = MemoryContextSwitchTo(outbox_index_cxt);
	outbox_pkey_info = BuildIndexInfo(r->pkey);
	MemoryContextSwitchTo(old);
}

/*
 * The primary key gives each key's messages in ascending seq only in the
 * order of the ids' bytes: one in another order (DESC, another operator
 * family) would hand a key's later message out first.
 */
static void
outbox_check_pkey_order(Relation index)
{
	Oid			opclass = GetDefaultOpClass(UUIDOID, BTREE_AM_OID);

	if (index->rd_indoption[0] != 0 || !OidIsValid(opclass) ||
		index->rd_opfamily[0] != get_opclass_family(opclass))
		ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("index \"%s.%s\" of the idem extension is not the one idem made",
							IDEM_SCHEMA, RelationGetRelationName(index)),
					 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
}

static void
outbox_open(OutboxRels *r, LOCKMODE lockmode)
{
	static const IdemColumn columns[OB_NATTS] = {
		{"id", UUIDOID, true, InvalidOid},
		{"aggregatetype", TEXTOID, true, C_COLLATION_OID},
		{"aggregateid", TEXTOID, true, C_COLLATION_OID},
		{"type", TEXTOID, false, InvalidOid},
		{"payload", JSONBOID, true, InvalidOid},
		{"headers", JSONBOID, false, InvalidOid},
		{"seq", INT8OID, true, InvalidOid},
		{"created_at", TIMESTAMPTZOID, true, InvalidOid},
		{"key_hash", INT8OID, true, InvalidOid}
	};
	static const AttrNumber pkey_cols[1] = {OB_ID + 1};
	int			tries;

	r->lockmode = lockmode;
	for (tries = 0;; tries++)
	{
		outbox_lookup_relids();
		r->rel = try_relation_open(outbox_relid, lockmode);
		r->pkey = NULL;
		if (r->rel != NULL)
			r->pkey = try_relation_open(outbox_pkey_oid, lockmode);
		if (r->pkey != NULL)
			break;

		/*
		 * Dropped since it was looked up (DROP EXTENSION; an index that
		 * REINDEX CONCURRENTLY replaced): once more by name.
		 */
		if (r->rel != NULL)
			relation_close(r->rel, lockmode);
		outbox_relid = InvalidOid;
		if (tries > 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("relation of the idem extension \"%s.%s\" or its primary key was dropped concurrently",
							IDEM_SCHEMA, OUTBOX_TABLE)));
	}
	if (r->rel->rd_rel->relkind != RELKIND_RELATION ||
		r->pkey->rd_rel->relkind != RELKIND_INDEX)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("\"%s.%s\" of the idem extension is not an ordinary table with its primary key",
						IDEM_SCHEMA, OUTBOX_TABLE),
				 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
	/* the opens above took the locks, and so heard of any change */
	if (!outbox_checked || !OidIsValid(outbox_relid))
	{
		idem_check_columns(RelationGetDescr(r->rel), OUTBOX_TABLE, columns,
						   OB_NATTS);
		idem_check_index(r->pkey, r->rel, 1, pkey_cols);
		outbox_check_pkey_order(r->pkey);
		outbox_check_direct_index(r);
		outbox_checked = OidIsValid(outbox_relid);
	}
	r->slot = table_slot_create(r->rel, NULL);
	r->nblocks = InvalidBlockNumber;
}

static void
outbox_close(OutboxRels *r)
{
	ExecDropSingleTupleTableSlot(r->slot);
	index_close(r->pkey, NoLock);
	table_close(r->rel, NoLock);
}

/*
 * Whether idem.outbox_keys (locked by the caller) has the trigger that makes
 * sessions forget the keys they knew, as idem made it: BEFORE DELETE FOR
 * EACH ROW, ALWAYS, calling idem._outbox_keys_deleted.  (A trigger before
 * UPDATE, even of other columns, would make every UPDATE lock its row
 * first, which a lease in the same transaction takes for another relay's.)  Without it, a
 * session looks for its key's row on every send.
 */
static bool
outbox_keys_has_trigger(void)
{
	Relation	rel = relation_open(outbox_keys_relid, NoLock);
	TriggerDesc *td = rel->trigdesc;
	bool		ok = false;
	int			i;

	for (i = 0; td != NULL && i < td->numtriggers && !ok; i++)
	{
		Trigger    *t = &td->triggers[i];
		char	   *fname;

		if (t->tgenabled != TRIGGER_FIRES_ALWAYS ||
			t->tgtype != (TRIGGER_TYPE_ROW | TRIGGER_TYPE_BEFORE | TRIGGER_TYPE_DELETE) ||
			t->tgnargs != 0 || t->tgqual != NULL || t->tgnattr != 0 ||
			get_func_namespace(t->tgfoid) != RelationGetNamespace(rel))
			continue;
		fname = get_func_name(t->tgfoid);
		ok = fname != NULL && strcmp(fname, "_outbox_keys_deleted") == 0;
	}
	relation_close(rel, NoLock);
	return ok;
}

static IdemStore *
outbox_keys_open(void)
{
	static const IdemColumn columns[OK_NATTS] = {
		{"topic", TEXTOID, true, C_COLLATION_OID},
		{"key", TEXTOID, true, C_COLLATION_OID},
		{"dead", BOOLOID, true, InvalidOid},
		{"attempts", INT4OID, true, InvalidOid},
		{"available_at", TIMESTAMPTZOID, true, InvalidOid},
		{"head_id", UUIDOID, false, InvalidOid},
		{"leased_by", TEXTOID, false, InvalidOid},
		{"last_error", TEXTOID, false, InvalidOid},
		{"leased_through", INT8OID, false, InvalidOid},
		{"leased_max", INT8OID, false, InvalidOid}
	};
	IdemStore  *store;

	/* the relids, so that the callback knows this table's */
	outbox_lookup_relids();
	store = idem_store_open(OUTBOX_KEYS_TABLE, RowExclusiveLock);
	if (!outbox_keys_checked || !OidIsValid(outbox_relid))
	{
		idem_check_columns(idem_store_tupdesc(store), OUTBOX_KEYS_TABLE,
						   columns, OK_NATTS);
		outbox_keys_trigger_ok = outbox_keys_has_trigger();
		outbox_keys_checked = OidIsValid(outbox_relid);
	}
	return store;
}

/*
 * ---- Arguments ----
 */

static Jsonb *
outbox_arg_json(FunctionCallInfo fcinfo, int argno, const char *what,
				bool container, bool object_only)
{
	Jsonb	   *jb;

	if (PG_ARGISNULL(argno))
		return NULL;
	jb = PG_GETARG_JSONB_P(argno);
	if (JB_ROOT_IS_SCALAR(jb) || (object_only && !JB_ROOT_IS_OBJECT(jb)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON %s", what,
						object_only ? "object" : "object or array"),
				 errhint("Wrap the value in an object, such as {\"value\": 42}.")));
	return jb;
}

/*
 * Relays read messages as UTF-8 (JSON is), whatever the database's encoding:
 * a text that has no UTF-8 form would fail every lease that meets it, and
 * hold back every key behind it.  So a send refuses it.  In a UTF8 database
 * the server has checked it already; in SQL_ASCII nothing was checked.
 */
static void
outbox_check_utf8(const char *what, const char *s, int len)
{
	int			enc = GetDatabaseEncoding();

	if (enc == PG_UTF8)
		return;
	if (enc == PG_SQL_ASCII)
	{
		if (!pg_verify_mbstr(PG_UTF8, s, len, true))
			ereport(ERROR,
					(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
					 errmsg("%s is not valid UTF-8", what),
					 errdetail("Relays read outbox messages as UTF-8, and the database's encoding is SQL_ASCII, which checks nothing."),
					 errhint("Send the text encoded as UTF-8.")));
		return;
	}
	/* fails with 22P05 when a character has no UTF-8 form */
	(void) pg_server_to_any(s, len, PG_UTF8);
}

static void
outbox_check_utf8_text(const char *what, text *t)
{
	if (t != NULL)
		outbox_check_utf8(what, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

static void
outbox_check_utf8_json(const char *what, Jsonb *jb)
{
	char	   *s;

	if (jb == NULL || GetDatabaseEncoding() == PG_UTF8)
		return;
	s = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	outbox_check_utf8(what, s, strlen(s));
	pfree(s);
}

/*
 * A span of time given by the caller: days and smaller units of one sign
 * (a month, or fields of both signs, would make its length depend on the
 * date), between zero (allowed or not) and one day.  Returns microseconds.
 */
static int64
outbox_span(Interval *span, const char *what, bool zero_ok, const char *hint)
{
	int64		us = 0;
	bool		ok;

	/* days are checked first: a day count times a day can overflow */
	ok = span->month == 0 && span->day >= 0 && span->time >= 0 &&
		span->day <= 1 && span->time <= USECS_PER_DAY;
	if (ok)
	{
		us = span->day * USECS_PER_DAY + span->time;
		ok = us <= USECS_PER_DAY && (zero_ok || us > 0);
	}
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be %s and at most one day", what,
						zero_ok ? "zero or positive" : "positive"),
				 errdetail("The %s given was %s.", what, idem_interval_text(span)),
				 errhint("%s", hint)));
	return us;
}

/*
 * ---- Per-topic settings ----
 */

typedef struct OutboxTopic
{
	text	   *topic;
	int32		max_attempts;
	int64		backoff_base;	/* microseconds */
	int64		backoff_max;
} OutboxTopic;

static int64
outbox_topic_span(Datum d)
{
	Interval   *span = DatumGetIntervalP(d);

	/* idem_outbox_configure checked it; a row written by hand is bounded */
	if (span->month != 0 || span->day < 0 || span->time < 0)
		return USECS_PER_SEC;
	return Min(span->day, 1) * USECS_PER_DAY + Min(span->time, USECS_PER_DAY);
}

/*
 * The settings of a topic, from idem.outbox_topics or the defaults.  A few
 * topics are remembered for the length of one call in *cache.
 */
static OutboxTopic *
outbox_topic(List **cache, text *topic)
{
	ListCell   *lc;
	OutboxTopic *t;
	Relation	rel;
	Relation	index;
	IndexScanDesc scan;
	ScanKeyData skey;
	TupleTableSlot *slot;
	Snapshot	snap;
	int			tries;
	static const AttrNumber topic_cols[1] = {1};
	static const IdemColumn topic_columns[OT_NATTS] = {
		{"topic", TEXTOID, true, C_COLLATION_OID},
		{"max_attempts", INT4OID, true, InvalidOid},
		{"backoff_base", INTERVALOID, true, InvalidOid},
		{"backoff_max", INTERVALOID, true, InvalidOid},
	};

	foreach(lc, *cache)
	{
		t = lfirst(lc);
		if (VARSIZE_ANY_EXHDR(t->topic) == VARSIZE_ANY_EXHDR(topic) &&
			memcmp(VARDATA_ANY(t->topic), VARDATA_ANY(topic),
				   VARSIZE_ANY_EXHDR(topic)) == 0)
			return t;
	}

	t = palloc(sizeof(OutboxTopic));
	t->topic = topic;
	t->max_attempts = OUTBOX_DEFAULT_MAX_ATTEMPTS;
	t->backoff_base = OUTBOX_DEFAULT_BACKOFF_BASE;
	t->backoff_max = OUTBOX_DEFAULT_BACKOFF_MAX;

	/*
	 * As outbox_open: the index may have been replaced (REINDEX
	 * CONCURRENTLY) since its OID was looked up, which the table's lock
	 * makes known.  The locks are kept to the end of the transaction, so
	 * that nothing replaces them while this transaction uses them.
	 */
	for (tries = 0;; tries++)
	{
		outbox_lookup_relids();
		rel = try_relation_open(outbox_topics_relid, AccessShareLock);
		index = NULL;
		if (rel != NULL)
		{
			outbox_lookup_relids();
			index = try_relation_open(outbox_topics_pkey_oid, AccessShareLock);
		}
		if (index != NULL)
			break;
		if (rel != NULL)
			relation_close(rel, AccessShareLock);
		outbox_relid = InvalidOid;
		if (tries > 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("relation of the idem extension \"%s.%s\" or its primary key was dropped concurrently",
							IDEM_SCHEMA, OUTBOX_TOPICS_TABLE)));
	}
	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		index->rd_rel->relkind != RELKIND_INDEX)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("\"%s.%s\" of the idem extension is not an ordinary table with its primary key",
						IDEM_SCHEMA, OUTBOX_TOPICS_TABLE),
				 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
	idem_check_index(index, rel, 1, topic_cols);
	/* a table changed otherwise must not make every topic's settings go */
	idem_check_columns(RelationGetDescr(rel), OUTBOX_TOPICS_TABLE,
					   topic_columns, OT_NATTS);
	{
		snap = RegisterSnapshot(GetLatestSnapshot());
		slot = table_slot_create(rel, NULL);
		ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ,
					PointerGetDatum(topic));
		skey.sk_collation = C_COLLATION_OID;
		scan = index_beginscan(rel, index, snap, 1, 0);
		index_rescan(scan, &skey, 1, NULL, 0);
		if (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d;

			d = slot_getattr(slot, 2, &isnull);
			if (!isnull)
				t->max_attempts = Max(DatumGetInt32(d), 1);
			d = slot_getattr(slot, 3, &isnull);
			if (!isnull)
				t->backoff_base = outbox_topic_span(d);
			d = slot_getattr(slot, 4, &isnull);
			if (!isnull)
				t->backoff_max = outbox_topic_span(d);
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		UnregisterSnapshot(snap);
	}
	relation_close(index, NoLock);
	relation_close(rel, NoLock);

	*cache = lappend(*cache, t);
	return t;
}

/*
 * The wait before the next attempt after "attempts" failed ones:
 * exponential, bounded by backoff_max, with jitter that spreads retries of
 * many messages over the second half of the wait.
 */
static int64
outbox_backoff(OutboxTopic *t, int32 attempts)
{
	int64		wait = t->backoff_base;
	int			i;

	/* a base of zero (written by hand) doubles to nothing: no loop */
	for (i = 1; i < attempts && wait > 0 && wait < t->backoff_max; i++)
		wait *= 2;
	wait = Min(wait, t->backoff_max);
	return wait / 2 + (int64) (pg_prng_double(&pg_global_prng_state) * (wait - wait / 2));
}

/*
 * ---- Waking relays ----
 *
 * A relay whose lease found nothing holds the idle lock of the database, a
 * user lock in ROW EXCLUSIVE mode, for its session, until a lease gives it
 * messages again.  Relays do not conflict with one another on it.  A
 * transaction that sent messages tries a SHARE lock on it just before it
 * commits, without waiting: when that fails, a relay is idle, and the
 * transaction notifies idem_outbox once per topic.  A relay takes the idle
 * lock before its last look for messages (a pass, whose snapshot is taken
 * after the lock), so a sender that commits after that look sees the lock.  A sender that checked just before the relay took
 * it and commits just after its last look is not seen by either: its
 * messages wait for the relay's next poll.  A prepared transaction does not
 * notify (PostgreSQL refuses NOTIFY there); its messages are found by polls.
 *
 * A NOTIFY wakes every relay listening, and one is enough until a relay
 * looks again.  With idem preloaded, a flag per database in shared memory
 * says whether a notification is still owed: a relay that goes idle, or
 * looks again while idle, raises it before its look, and only the first
 * sender to find it raised (and a relay idle) notifies.  Without it, every
 * sender that commits while a relay is idle notifies, and those commits
 * queue one behind the other on NOTIFY's lock.  A notification reaches the
 * relays only once its sender has committed, so while a sender that
 * notifies is still committing, the senders that find the flag lowered
 * notify too (a commit made visible late, by synchronous replication say,
 * could otherwise come after the look its notification caused).  A sender
 * that found the flag lowered and no notifier committing just before an
 * idle relay raised it again, and commits after that relay's look, is left
 * to the relay's next poll, as above.
 */
#define OUTBOX_IDLE_LOCK_ID1	0x6964656d	/* "idem" */
#define OUTBOX_IDLE_LOCK_ID2	0x6f757462	/* "outb" */
#define OUTBOX_IDLE_LOCK_ID4	3	/* pg_advisory_* use 1 and 2 */

#define OUTBOX_WAKE_SLOTS	64

typedef struct OutboxWakeSlot
{
	pg_atomic_uint32 dbid;		/* InvalidOid: free; never changes once set */
	pg_atomic_uint32 owed;		/* an idle relay waits for a notification */
	pg_atomic_uint32 notifiers; /* senders that notify, still committing */
} OutboxWakeSlot;

static OutboxWakeSlot *outbox_wake_slots = NULL;	/* shared memory */
static bool outbox_wake_claimed = false;	/* this transaction lowered the flag */
static bool outbox_wake_counted = false;	/* and counts among the notifiers */
static OutboxWakeSlot *outbox_wake_slot = NULL; /* this database's */
static bool outbox_wake_slot_sought = false;

static bool outbox_relay_idle = false;	/* this session holds the idle lock */
static List *outbox_sent_topics = NIL;	/* in TopTransactionContext */

/*
 * The same topics in a hash table, in TopTransactionContext too, once they
 * are more than OUTBOX_SENT_HASH_MIN: a transaction that sends to many topics
 * searched the list at every send (100,000 topics took half a minute more).
 */
#define OUTBOX_SENT_HASH_MIN	16
static HTAB *outbox_sent_hash = NULL;
static bool outbox_xact_callback_registered = false;

static void
outbox_wake_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(mul_size(OUTBOX_WAKE_SLOTS, sizeof(OutboxWakeSlot)));
}

static void
outbox_wake_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_wake_slots = ShmemInitStruct("idem_outbox_wake",
										mul_size(OUTBOX_WAKE_SLOTS,
												 sizeof(OutboxWakeSlot)),
										&found);
	if (!found)
	{
		for (i = 0; i < OUTBOX_WAKE_SLOTS; i++)
		{
			pg_atomic_init_u32(&outbox_wake_slots[i].dbid, InvalidOid);
			pg_atomic_init_u32(&outbox_wake_slots[i].owed, 0);
			pg_atomic_init_u32(&outbox_wake_slots[i].notifiers, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * This database's flag, or NULL without preloading or once every slot is
 * taken by other databases.  A database takes the first free slot, and a
 * slot is never given back, so every backend of a database finds the same
 * one: the first that holds its OID.
 */
static OutboxWakeSlot *
outbox_wake_get_slot(void)
{
	int			i;

	if (outbox_wake_slot_sought)
		return outbox_wake_slot;
	outbox_wake_slot_sought = true;
	if (outbox_wake_slots == NULL)
		return NULL;
	for (i = 0; i < OUTBOX_WAKE_SLOTS; i++)
	{
		OutboxWakeSlot *slot = &outbox_wake_slots[i];
		uint32		dbid = pg_atomic_read_u32(&slot->dbid);

		if (dbid == InvalidOid &&
			pg_atomic_compare_exchange_u32(&slot->dbid, &dbid, MyDatabaseId))
			dbid = MyDatabaseId;
		if (dbid == MyDatabaseId)
		{
			outbox_wake_slot = slot;
			break;
		}
	}
	return outbox_wake_slot;
}

/* An idle relay is about to look: the next sender must notify. */
static void
outbox_wake_owe(void)
{
	OutboxWakeSlot *slot = outbox_wake_get_slot();

	/* a full barrier: raised before the look's snapshot is taken */
	if (slot != NULL)
		(void) pg_atomic_exchange_u32(&slot->owed, 1);
}

/*
 * Whether a sender that found a relay idle must notify: without the flags
 * always; with them, the first since a relay looked, and any while a sender
 * that notifies is still committing.  A sender that notifies counts itself
 * first, so that one that comes meanwhile sees it.
 */
static bool
outbox_wake_claim(void)
{
	OutboxWakeSlot *slot = outbox_wake_get_slot();
	uint32		others;

	if (slot == NULL)
		return true;
	(void) pg_atomic_fetch_add_u32(&slot->notifiers, 1);
	outbox_wake_counted = true;
	outbox_wake_claimed = pg_atomic_read_u32(&slot->owed) != 0 &&
		pg_atomic_exchange_u32(&slot->owed, 0) != 0;
	/* read after the flag: whoever lowered it counted itself before */
	others = pg_atomic_read_u32(&slot->notifiers) - 1;
	if (outbox_wake_claimed || others > 0)
		return true;
	(void) pg_atomic_fetch_sub_u32(&slot->notifiers, 1);
	outbox_wake_counted = false;
	return false;
}

/*
 * The end of a sender's transaction.  One can still fail after its
 * pre-commit callbacks (a serialization failure, a full notification
 * queue): its notification is then never sent, and the next sender must
 * notify in its place.
 */
static void
outbox_wake_done(bool committed)
{
	if (outbox_wake_slot != NULL)
	{
		if (outbox_wake_claimed && !committed)
			(void) pg_atomic_exchange_u32(&outbox_wake_slot->owed, 1);
		if (outbox_wake_counted)
			(void) pg_atomic_fetch_sub_u32(&outbox_wake_slot->notifiers, 1);
	}
	outbox_wake_claimed = false;
	outbox_wake_counted = false;
}

static void
outbox_idle_locktag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, OUTBOX_IDLE_LOCK_ID1,
						 OUTBOX_IDLE_LOCK_ID2, OUTBOX_IDLE_LOCK_ID4);
}

/*
 * Whether this session holds the idle lock.  pg_advisory_unlock_all() and
 * DISCARD ALL release it with the session's advisory locks.
 */
static bool
outbox_relay_is_idle(void)
{
	LOCKTAG		tag;

	if (outbox_relay_idle)
	{
		outbox_idle_locktag(&tag);
		outbox_relay_idle = LockHeldByMe(&tag, RowExclusiveLock);
	}
	return outbox_relay_idle;
}

static void
outbox_set_relay_idle(bool idle)
{
	LOCKTAG		tag;

	if (idle == outbox_relay_is_idle())
		return;
	outbox_idle_locktag(&tag);
	if (idle)
	{
		/*
		 * Waiting: a sender holds the SHARE lock for the instant of its
		 * test, and a relay that gave up then would not be marked idle at
		 * all.  A sender that tests while the relay waits finds the lock
		 * unavailable and notifies.  With the lock table full, the relay is
		 * not marked idle: it is not notified and finds messages by polling.
		 */
		idle = LockAcquireExtended(&tag, RowExclusiveLock, true, false, false,
								   NULL) != LOCKACQUIRE_NOT_AVAIL;
	}
	else
		LockRelease(&tag, RowExclusiveLock, true);
	outbox_relay_idle = idle;
}

static void
outbox_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;
	LOCKTAG		tag;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			outbox_known_keys_stage();
			if (outbox_sent_topics == NIL)
				break;
			outbox_idle_locktag(&tag);

			/*
			 * Not available: a relay is idle, or the lock table is full, in
			 * which case notifying is the safe answer (the commit must not
			 * fail for the sake of a wake-up).
			 */
			/*
			 * A session's own idle lock does not conflict with its test:
			 * a relay that sends while idle is idle all the same.
			 */
			if (outbox_relay_is_idle() ||
				LockAcquireExtended(&tag, ShareLock, false, true, false,
									NULL) == LOCKACQUIRE_NOT_AVAIL)
			{
				if (outbox_wake_claim())
					foreach(lc, outbox_sent_topics)
						Async_Notify(OUTBOX_CHANNEL, (char *) lfirst(lc));
			}
			else
				LockRelease(&tag, ShareLock, false);
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			break;
		case XACT_EVENT_ABORT:
			outbox_wake_done(false);
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			outbox_probed_keys = NIL;
			outbox_probed_bytes = 0;
			outbox_staged_keys = NULL;
			outbox_nstaged = 0;
			break;
		case XACT_EVENT_COMMIT:
			outbox_wake_done(true);
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			outbox_known_keys_commit();
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PRE_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			outbox_probed_keys = NIL;
			outbox_probed_bytes = 0;
			outbox_staged_keys = NULL;
			outbox_nstaged = 0;
			break;
		default:
			break;
	}
}

/*
 * A key row this transaction inserted goes if a subtransaction rolls back:
 * what was probed is forgotten with any of them, which is rare.
 */
static void
outbox_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		outbox_probed_keys = NIL;
		outbox_probed_bytes = 0;
	}
}

static void
outbox_register_callbacks(void)
{
	if (!outbox_xact_callback_registered)
	{
		RegisterXactCallback(outbox_xact_callback, NULL);
		RegisterSubXactCallback(outbox_subxact_callback, NULL);
		outbox_xact_callback_registered = true;
	}
}

/* Remember that this transaction sent a message of this topic. */
static void
outbox_sent(text *topic)
{
	ListCell   *lc;
	char		name[OUTBOX_MAX_TOPIC_LEN + 1];
	int			len = VARSIZE_ANY_EXHDR(topic);
	MemoryContext oldcxt;

	outbox_register_callbacks();
	Assert(len <= OUTBOX_MAX_TOPIC_LEN);
	memcpy(name, VARDATA_ANY(topic), len);
	name[len] = '\0';
	if (outbox_sent_hash != NULL)
	{
		if (hash_search(outbox_sent_hash, name, HASH_FIND, NULL) != NULL)
			return;
	}
	else
	{
		foreach(lc, outbox_sent_topics)
		{
			if (strcmp((char *) lfirst(lc), name) == 0)
				return;
		}
	}
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	outbox_sent_topics = lappend(outbox_sent_topics, pstrdup(name));
	if (outbox_sent_hash != NULL)
		(void) hash_search(outbox_sent_hash, name, HASH_ENTER, NULL);
	else if (list_length(outbox_sent_topics) > OUTBOX_SENT_HASH_MIN)
	{
		HASHCTL		ctl;
		HTAB	   *hash;

		ctl.keysize = OUTBOX_MAX_TOPIC_LEN + 1;
		ctl.entrysize = OUTBOX_MAX_TOPIC_LEN + 1;
		ctl.hcxt = TopTransactionContext;
		hash = hash_create("idem outbox topics sent", 256, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		foreach(lc, outbox_sent_topics)
			(void) hash_search(hash, lfirst(lc), HASH_ENTER, NULL);
		outbox_sent_hash = hash;
	}
	MemoryContextSwitchTo(oldcxt);
}

/*
 * ---- Messages ----
 */

/*
 * The hash of (topic, key) that idem.outbox's key_hash holds: 64-bit FNV-1a
 * over the topic's length and bytes, then the key's bytes.  It is the same
 * on every machine (hash_any_extended reads words in the machine's byte
 * order): a dump restored on a server of the other byte order keeps the
 * hashes its messages were stored with.
 */
#define FNV64_OFFSET	UINT64CONST(0xcbf29ce484222325)
#define FNV64_PRIME		UINT64CONST(0x100000001b3)

static inline uint64
fnv64_bytes(uint64 h, const unsigned char *p, size_t len)
{
	while (len-- > 0)
	{
		h ^= *p++;
		h *= FNV64_PRIME;
	}
	return h;
}

static int64
outbox_key_hash(text *topic, text *key)
{
	uint32		tlen = VARSIZE_ANY_EXHDR(topic);
	unsigned char lenbytes[4];
	uint64		h;

	lenbytes[0] = (unsigned char) tlen;
	lenbytes[1] = (unsigned char) (tlen >> 8);
	lenbytes[2] = (unsigned char) (tlen >> 16);
	lenbytes[3] = (unsigned char) (tlen >> 24);
	h = fnv64_bytes(FNV64_OFFSET, lenbytes, sizeof(lenbytes));
	h = fnv64_bytes(h, (const unsigned char *) VARDATA_ANY(topic), tlen);
	h = fnv64_bytes(h, (const unsigned char *) VARDATA_ANY(key),
					VARSIZE_ANY_EXHDR(key));
	return (int64) h;
}

/*
 * idem._outbox_keys_deleted(): the trigger before each DELETE of a row of
 * idem.outbox_keys (idem_outbox_purge's, one by hand, one applied by logical
 * replication).  It waits for the senders in flight, as the purge
 * does (so two such statements at once can deadlock, as two purges did),
 * makes this session forget the keys it knew to have a row, and every other
 * session when it next takes a lock on the table (see "Key rows known to
 * exist").
 */
PG_FUNCTION_INFO_V1(idem_outbox_keys_deleted);
Datum
idem_outbox_keys_deleted(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem._outbox_keys_deleted() must be fired BEFORE DELETE FOR EACH ROW")));
	/* taken once per transaction; then found in the local lock table */
	LockRelationOid(RelationGetRelid(trigdata->tg_relation), ShareLock);
	outbox_known_keys_forget();
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(trigdata->tg_trigtuple);
}

/*
 * idem._outbox_key_hash(topic, key) returns bigint, for the functions written
 * in SQL.
 */
PG_FUNCTION_INFO_V1(idem_outbox_key_hash);
Datum
idem_outbox_key_hash(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(outbox_key_hash(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1)));
}

/*
 * A message's id: a UUID of version 8 whose 122 free bits are, in order,
 * the first 32 bits of its key_hash (the sign bit flipped, so that the
 * bytes order hashes as signed integers), its seq (48 bits) and 42 random
 * bits.  The primary key, which compares ids byte by byte, so keeps each
 * key's messages together in the order of sending: a send inserts one
 * entry, and the lease finds a key's head in the key's range of ids
 * (outbox_key_range), which it shares with the keys of the same prefix.
 * The random bits keep ids apart that the same key and seq would make in
 * another database, or after the sequence started again (the extension
 * created again, a standby promoted before it had every value handed
 * out): consumers deduplicate by id.  The prefix's length weighs them
 * against the cost of sharing a range: a key's head is found after the
 * entries of older messages of the other keys of its prefix.
 *
 * The layout is part of what is stored: another one needs an update script
 * that rewrites the ids of idem.outbox (and the key rows' head_id), or the
 * messages sent before would be out of their keys' ranges.
 */
#define OUTBOX_PREFIX_BITS	32
#define OUTBOX_SEQ_BITS		48
#define OUTBOX_RANDOM_BITS	42
#define OUTBOX_SEQ_MAX		((INT64CONST(1) << OUTBOX_SEQ_BITS) - 1)
#define OUTBOX_RANDOM_MASK	((UINT64CONST(1) << OUTBOX_RANDOM_BITS) - 1)

/* The prefix of a key_hash that its messages' ids begin with. */
static inline int64
outbox_hash_prefix(int64 key_hash)
{
	return (int64) (((uint64) key_hash ^ (UINT64CONST(1) << 63)) >>
					(64 - OUTBOX_PREFIX_BITS));
}

static void
outbox_make_id(pg_uuid_t *uuid, int64 key_hash, int64 seq, uint64 rnd)
{
	uint64		a = (uint64) outbox_hash_prefix(key_hash);
	uint64		s = (uint64) seq;
	uint64		hi;
	uint64		lo;
	int			i;

	Assert(seq >= 0 && seq <= OUTBOX_SEQ_MAX);
	StaticAssertStmt(OUTBOX_PREFIX_BITS == 32 && OUTBOX_SEQ_BITS == 48 &&
					 OUTBOX_RANDOM_BITS == 42, "an id has 122 free bits");
	/* 48 bits: the prefix, seq's first 16; the version; seq's next 12 */
	hi = (((a << 16) | (s >> 32)) << 16) | (UINT64CONST(0x8) << 12) |
		((s >> 20) & 0xFFF);
	/* the variant; seq's last 20 bits; the random bits */
	lo = (UINT64CONST(0x2) << 62) | ((s & 0xFFFFF) << 42) |
		(rnd & OUTBOX_RANDOM_MASK);
	for (i = 0; i < 8; i++)
	{
		uuid->data[i] = (uint8) (hi >> (56 - 8 * i));
		uuid->data[8 + i] = (uint8) (lo >> (56 - 8 * i));
	}
}

/* The prefix of key_hash an id begins with (any UUID gives one). */
static int64
outbox_id_prefix(const pg_uuid_t *uuid)
{
	return (int64) (((uint64) uuid->data[0] << 24) |
					((uint64) uuid->data[1] << 16) |
					((uint64) uuid->data[2] << 8) | uuid->data[3]);
}

/*
 * idem._outbox_id(topic, key, seq) returns uuid
 *
 * A new id for a message of that topic and key with that seq, as a send
 * makes it.
 */
PG_FUNCTION_INFO_V1(idem_outbox_id);
Datum
idem_outbox_id(PG_FUNCTION_ARGS)
{
	int64		seq = PG_GETARG_INT64(2);
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));

	if (seq < 0 || seq > OUTBOX_SEQ_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("seq must be between 0 and " INT64_FORMAT, OUTBOX_SEQ_MAX),
				 errdetail("seq was " INT64_FORMAT ".", seq)));
	outbox_make_id(id, outbox_key_hash(PG_GETARG_TEXT_PP(0),
									   PG_GETARG_TEXT_PP(1)),
				   seq, pg_prng_uint64(&pg_global_prng_state));
	PG_RETURN_UUID_P(id);
}

/*
 * idem._outbox_id_matches(id, topic, key, seq) returns bool
 *
 * Whether id is one a send makes for that topic, key and seq: the version
 * and variant, the prefix of the key's hash and the seq (any random bits).
 * The CHECK constraint of idem.outbox, for rows written by hand: the lease
 * orders a key's messages by id, the runs, acks and nacks by seq.
 */
PG_FUNCTION_INFO_V1(idem_outbox_id_matches);
Datum
idem_outbox_id_matches(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *id = PG_GETARG_UUID_P(0);
	int64		seq = PG_GETARG_INT64(3);
	pg_uuid_t	lo;

	if (seq < 0 || seq > OUTBOX_SEQ_MAX)
		PG_RETURN_BOOL(false);
	/* every bit but the random ones: those of the id with none set */
	outbox_make_id(&lo, outbox_key_hash(PG_GETARG_TEXT_PP(1),
										PG_GETARG_TEXT_PP(2)), seq, 0);
	PG_RETURN_BOOL(memcmp(id->data, lo.data, 10) == 0 &&
				   (id->data[10] & 0xFC) == lo.data[10]);
}

/*
 * idem._outbox_id_bound(topic, key, upper) returns uuid
 *
 * The first id (or, when upper, the last) a message of that topic and key
 * can have: what the functions written in SQL use to find a key's messages.
 */
PG_FUNCTION_INFO_V1(idem_outbox_id_bound);
Datum
idem_outbox_id_bound(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	int64		key_hash = outbox_key_hash(PG_GETARG_TEXT_PP(0),
										   PG_GETARG_TEXT_PP(1));

	if (PG_GETARG_BOOL(2))
		outbox_make_id(id, key_hash, OUTBOX_SEQ_MAX, OUTBOX_RANDOM_MASK);
	else
		outbox_make_id(id, key_hash, 0, 0);
	PG_RETURN_UUID_P(id);
}

/*
 * Scan keys on the primary key for every id a message of key_hash can
 * have; lo and hi must live as long as the scan.
 */
static void
outbox_key_range(ScanKey skeys, pg_uuid_t *lo, pg_uuid_t *hi, int64 key_hash)
{
	outbox_make_id(lo, key_hash, 0, 0);
	outbox_make_id(hi, key_hash, OUTBOX_SEQ_MAX, OUTBOX_RANDOM_MASK);
	ScanKeyInit(&skeys[0], 1, BTGreaterEqualStrategyNumber, F_UUID_GE,
				UUIDPGetDatum(lo));
	ScanKeyInit(&skeys[1], 1, BTLessEqualStrategyNumber, F_UUID_LE,
				UUIDPGetDatum(hi));
}

static void
outbox_insert_message(Datum *values, bool *isnull)
{
	OutboxRels	r;
	EState	   *estate;
	ResultRelInfo *rri;
	List	   *recheck;

	outbox_open(&r, RowExclusiveLock);
	ExecClearTuple(r.slot);
	memcpy(r.slot->tts_values, values, sizeof(Datum) * OB_NATTS);
	memcpy(r.slot->tts_isnull, isnull, sizeof(bool) * OB_NATTS);
	ExecStoreVirtualTuple(r.slot);
	table_tuple_insert(r.rel, r.slot, GetCurrentCommandId(true), 0, NULL);

	/*
	 * The primary key idem made, and no other index: its entry is the id,
	 * inserted without building the executor's state for each send.  (A
	 * btree's insertion does not read the IndexInfo; the one kept is given
	 * all the same.)
	 */
	if (outbox_direct_index)
	{
		index_insert(r.pkey, &values[OB_ID], &isnull[OB_ID],
					 &r.slot->tts_tid, r.rel, UNIQUE_CHECK_YES, false,
					 outbox_pkey_info);
		outbox_close(&r);
		return;
	}

	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, r.rel, 1, NULL, 0);
	ExecOpenIndices(rri, false);
	recheck = ExecInsertIndexTuples(rri, r.slot, estate, false, false, NULL,
									NIL);

	/*
	 * A deferrable unique constraint a user added is checked by a trigger
	 * queued here by the executor; a send fires no trigger, so it refuses
	 * rather than leave the constraint unchecked.
	 */
	if (recheck != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_outbox_send() does not support a deferrable unique constraint on \"%s.%s\"",
						IDEM_SCHEMA, OUTBOX_TABLE),
				 errhint("Make the constraint NOT DEFERRABLE, or drop it.")));

	ExecCloseIndices(rri);
	FreeExecutorState(estate);
	outbox_close(&r);
}

static void outbox_ensure_key(text *topic, text *key, int64 key_hash);

/*
 * idem_outbox_send(topic, key, payload, headers, type) returns uuid
 *
 * The message is a row written in the caller's transaction: relays see it
 * once that commits, and never if it rolls back.  Idle relays are notified
 * at commit, once per topic and transaction.
 */
PG_FUNCTION_INFO_V1(idem_outbox_send);
Datum
idem_outbox_send(PG_FUNCTION_ARGS)
{
	text	   *topic = idem_arg_key(fcinfo, 0, "topic", OUTBOX_MAX_TOPIC_LEN);
	text	   *key = idem_arg_key(fcinfo, 1, "key", OUTBOX_MAX_KEY_LEN);
	Jsonb	   *payload;
	Jsonb	   *headers = outbox_arg_json(fcinfo, 3, "headers", true, true);
	text	   *type = NULL;
	pg_uuid_t  *id = palloc(sizeof(pg_uuid_t));
	int64		key_hash;
	int64		seq;
	Datum		values[OB_NATTS];
	bool		isnull[OB_NATTS];

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Send an empty object, {}, for a message without content.")));
	payload = outbox_arg_json(fcinfo, 2, "payload", true, false);
	if (!PG_ARGISNULL(4))
	{
		type = PG_GETARG_TEXT_PP(4);
		idem_check_key(type, "type", OUTBOX_MAX_TYPE_LEN);
	}
	idem_check_writable("idem_outbox_send()");
	if (GetDatabaseEncoding() != PG_UTF8)
	{
		outbox_check_utf8_text("topic", topic);
		outbox_check_utf8_text("key", key);
		outbox_check_utf8_text("type", type);
		outbox_check_utf8_json("payload", payload);
		outbox_check_utf8_json("headers", headers);
	}
	key_hash = outbox_key_hash(topic, key);

	/*
	 * The key's row, which its leases will update.  The lock comes first:
	 * taking it hears of a purge that committed since the row was known.
	 */
	outbox_lookup_relids();
	LockRelationOid(outbox_keys_relid, RowExclusiveLock);
	/* also when this transaction held the lock already */
	AcceptInvalidationMessages();
	if (!outbox_keys_checked || !outbox_known_key(key_hash, topic, key))
		outbox_ensure_key(topic, key, key_hash);

	/* the message */
	outbox_lookup_relids();
	seq = nextval_internal(outbox_seq_oid, false);
	/* the sequence was made with this range; its owner may have changed it */
	if (seq < 0 || seq > OUTBOX_SEQ_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("value " INT64_FORMAT " of sequence \"%s.%s\" is out of the range of outbox messages",
						seq, IDEM_SCHEMA, OUTBOX_SEQ),
				 errdetail("An outbox message's seq is between 0 and " INT64_FORMAT ".",
						   OUTBOX_SEQ_MAX),
				 errhint("Give the sequence back the range idem made it with.")));
	/*
	 * The random bits only keep ids apart, they guard no secret: the
	 * backend's generator, seeded from a strong source when the backend
	 * started, serves them without a system call per message.
	 */
	outbox_make_id(id, key_hash, seq, pg_prng_uint64(&pg_global_prng_state));
	values[OB_ID] = UUIDPGetDatum(id);
	values[OB_TOPIC] = PointerGetDatum(topic);
	values[OB_KEY] = PointerGetDatum(key);
	values[OB_TYPE] = PointerGetDatum(type);
	values[OB_PAYLOAD] = JsonbPGetDatum(payload);
	values[OB_HEADERS] = JsonbPGetDatum(headers);
	values[OB_SEQ] = Int64GetDatum(seq);
	values[OB_CREATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[OB_KEY_HASH] = Int64GetDatum(key_hash);
	memset(isnull, false, sizeof(isnull));
	isnull[OB_TYPE] = (type == NULL);
	isnull[OB_HEADERS] = (headers == NULL);
	outbox_insert_message(values, isnull);

	outbox_sent(topic);
	idem_stat_count_text(IDEM_KIND_OUTBOX, topic, IDEM_OUTBOX_SENT, 1);

	PG_RETURN_UUID_P(id);
}

/*
 * Make sure the key has its row, and remember that it was probed: known
 * from this transaction's commit on.
 */
static void
outbox_ensure_key(text *topic, text *key, int64 key_hash)
{
	Datum		kvalues[OK_NATTS];
	bool		kisnull[OK_NATTS];
	IdemStore  *store;

	store = outbox_keys_open();
	memset(kisnull, true, sizeof(kisnull));
	kvalues[OK_TOPIC] = PointerGetDatum(topic);
	kisnull[OK_TOPIC] = false;
	kvalues[OK_KEY] = PointerGetDatum(key);
	kisnull[OK_KEY] = false;
	kvalues[OK_DEAD] = BoolGetDatum(false);
	kisnull[OK_DEAD] = false;
	kvalues[OK_ATTEMPTS] = Int32GetDatum(0);
	kisnull[OK_ATTEMPTS] = false;
	kvalues[OK_AVAILABLE_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	kisnull[OK_AVAILABLE_AT] = false;

	/*
	 * A sender inserting the row is waited for: its row goes if it rolls
	 * back.  A relay updating it (a lease, an ack or a nack in a transaction
	 * still open) is not: the row stays whatever the relay does, and a
	 * producer's transaction must not wait for a relay's (unless the update
	 * moved the row to another page, which the table's fillfactor makes
	 * rare: its new version looks like an insertion).  Only a purge deletes
	 * key rows, and it cannot run while this transaction sends.
	 */
	if (idem_store_insert(store, kvalues, kisnull, IDEM_NOWAIT) == IDEM_STORE_IN_FLIGHT &&
		idem_store_lookup(store, PointerGetDatum(topic), PointerGetDatum(key),
						  IDEM_NOWAIT, NULL, NULL) != IDEM_STORE_EXISTS)
		(void) idem_store_insert(store, kvalues, kisnull, IDEM_WAIT);
	idem_store_close(store);

	outbox_register_callbacks();
	outbox_known_keys_probed(key_hash, topic, key);
}

static bool uuid_datum_eq(Datum a, pg_uuid_t *b);

/*
 * Find a message by its id, as it stands now (the latest committed
 * version, or this transaction's).  Leaves its columns in r->slot.  When
 * tid is given, the row there is taken if it is visible and has the id.
 */
static bool
outbox_find(OutboxRels *r, pg_uuid_t *id, ItemPointer tid)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	bool		found;

	/*
	 * The table's size is asked once per call: the lock held keeps it from
	 * shrinking, and the row cannot be in a block added since.
	 */
	if (tid != NULL && ItemPointerIsValid(tid) &&
		r->nblocks == InvalidBlockNumber)
		r->nblocks = RelationGetNumberOfBlocks(r->rel);
	if (tid != NULL && ItemPointerIsValid(tid) &&
		ItemPointerGetBlockNumber(tid) < r->nblocks &&
		table_tuple_fetch_row_version(r->rel, tid, snap, r->slot))
	{
		slot_getallattrs(r->slot);
		if (!r->slot->tts_isnull[OB_ID] &&
			uuid_datum_eq(r->slot->tts_values[OB_ID], id))
		{
			UnregisterSnapshot(snap);
			return true;
		}
		ExecClearTuple(r->slot);
	}

	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_UUID_EQ,
				UUIDPGetDatum(id));
	scan = index_beginscan(r->rel, r->pkey, snap, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, r->slot);
	if (found)
		slot_getallattrs(r->slot);
	index_endscan(scan);
	UnregisterSnapshot(snap);
	return found;
}

/* Whether two texts have the same bytes (the "C" collation's equality). */
static bool
outbox_text_eq(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * Make a scan of idem.outbox's primary key keep its pin on each leaf page
 * while it reads the page's entries, as a scan that returns index tuples
 * does.  An entry whose message is dead to every transaction is then marked
 * dead in the index when the scan leaves the page, and later scans skip it
 * without a visit to the table.  A scan that drops the pin marks nothing on
 * a page that changed meanwhile, and the leaf pages of the outbox's primary
 * key change all the time: a send inserts into the range of its key, which
 * may be any page, not only the right-most one.  Leases read each key's
 * acknowledged messages (deleted, not yet vacuumed) again and again
 * otherwise.
 */
static inline void
outbox_scan_keep_pin(IndexScanDesc scan)
{
	scan->xs_want_itup = true;
}

static bool outbox_key_in_run(Datum *values, bool *isnull);
static bool outbox_message_exists(OutboxRels *r, pg_uuid_t *id);

/*
 * Whether the message version in slot (pinned, found under a snapshot) is
 * being deleted or updated by a transaction that has not ended, or was by
 * one that committed: an ack of it that has not committed, or committed
 * after the snapshot.  Locks alone say no.
 */
static bool
outbox_message_busy(TupleTableSlot *slot)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	HeapTupleHeader tup = bslot->base.tuple->t_data;
	TransactionId xmax = InvalidTransactionId;
	uint16		infomask;

	LockBuffer(bslot->buffer, BUFFER_LOCK_SHARE);
	infomask = tup->t_infomask;
	if (!(infomask & HEAP_XMAX_INVALID) && !HEAP_XMAX_IS_LOCKED_ONLY(infomask))
	{
		/* a deletion by a transaction that also locked it: its updater */
		if (infomask & HEAP_XMAX_IS_MULTI)
			xmax = HeapTupleGetUpdateXid(tup);
		else
			xmax = HeapTupleHeaderGetRawXmax(tup);
	}
	LockBuffer(bslot->buffer, BUFFER_LOCK_UNLOCK);
	/* not "did not abort": a transaction cut by a crash never says so */
	return TransactionIdIsValid(xmax) &&
		(TransactionIdIsInProgress(xmax) || TransactionIdDidCommit(xmax));
}

/*
 * Lock a message (its latest version) against its deletion, for the rest
 * of the transaction: a lease that hands out a head again, or marks it
 * dead, and a nack, which write the key's row, against the ack of the
 * message, which may judge the key's row before it deletes the message
 * (see ack_key).  Without waiting, false when a transaction is deleting the
 * message (or has locked it so); in any case false when it is gone.
 */
static bool
outbox_lock_message(OutboxRels *r, ItemPointer tid, bool wait)
{
	TupleTableSlot *slot = table_slot_create(r->rel, NULL);
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	TM_FailureData tmfd;
	TM_Result	result;
	ItemPointerData t = *tid;

	result = table_tuple_lock(r->rel, &t, snap, slot,
							  GetCurrentCommandId(false), LockTupleKeyShare,
							  wait ? LockWaitBlock : LockWaitSkip,
							  TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
	UnregisterSnapshot(snap);
	ExecDropSingleTupleTableSlot(slot);
	return result == TM_Ok;
}

/*
 * ---- A key's head, from the leaves of the primary key ----
 *
 * A key's head is the first entry of its range of ids in the primary key
 * whose message the snapshot sees.  An index scan bounded by that range
 * reads every entry of the range on a leaf (two calls of the operator
 * class's functions each) before it returns the first: a key with many
 * messages waiting would pay for all of them at every probe of its head.
 * So the probe descends to the leaf as that scan would (_bt_search), and
 * takes the entries at or after the range's start a few at a time, while
 * they are in the range (ids compare as their bytes do in uuid_ops, the
 * operator family outbox_check_pkey_order requires), skipping those marked
 * dead, as the scan does; it fetches their messages in that order, and
 * steps to the next leaf as the scan does.  Entries it takes again from a
 * leaf come after the last id it took: those that came since are of
 * transactions the snapshot cannot see, as for the scan, which reads a
 * leaf once.  The entries of messages no transaction can see any more are
 * marked dead, as the scan marks them (_bt_killitems), under the pin kept
 * on the leaf since it was read, which keeps VACUUM from removing them,
 * and so from recycling their heap TIDs, meanwhile.  A posting list (the
 * primary key has none unless its rows are updated by hand) leaves the
 * answer to the index scan.
 */
/* entries taken from a leaf at a time */
#define OUTBOX_LEAF_CHUNK	8

typedef enum OutboxLeafProbe
{
	LEAF_FOUND,					/* the head, in r->slot */
	LEAF_NONE,					/* the key has none */
	LEAF_UNSURE					/* the index scan must tell */
} OutboxLeafProbe;

/*
 * The id of a leaf entry of the primary key, NULL if it has none: its one
 * column, a uuid, aligned on a byte, right after the header.
 */
static inline const uint8 *
outbox_leaf_id(IndexTuple itup)
{
	if (IndexTupleHasNulls(itup))
		return NULL;
	return (const uint8 *) itup + IndexInfoFindDataOffset(itup->t_info);
}

/*
 * Mark dead the entries at offs with the heap TIDs tids (dead[i]) on the
 * leaf in buf, pinned since it was read: an entry may have moved right on
 * it since (an insertion), or gone (a split, the removal of dead entries).
 */
static void
outbox_leaf_kill(Buffer buf, OffsetNumber *offs, ItemPointerData *tids,
				 bool *dead, int n)
{
	Page		page;
	OffsetNumber maxoff;
	bool		killed = false;
	int			i;

	LockBuffer(buf, BT_READ);
	page = BufferGetPage(buf);
	maxoff = PageGetMaxOffsetNumber(page);
	for (i = 0; i < n; i++)
	{
		OffsetNumber off;

		if (!dead[i])
			continue;
		for (off = offs[i]; off <= maxoff; off++)
		{
			ItemId		iid = PageGetItemId(page, off);
			IndexTuple	itup = (IndexTuple) PageGetItem(page, iid);

			if (!BTreeTupleIsPosting(itup) &&
				ItemPointerEquals(&itup->t_tid, &tids[i]))
			{
				if (!ItemIdIsDead(iid))
				{
					ItemIdMarkDead(iid);
					killed = true;
				}
				break;
			}
		}
	}
	if (killed)
	{
		BTPageGetOpaque(page)->btpo_flags |= BTP_HAS_GARBAGE;
		MarkBufferDirtyHint(buf, true);
	}
	LockBuffer(buf, BUFFER_LOCK_UNLOCK);
}

static OutboxLeafProbe
outbox_head_leaf(OutboxRels *r, Snapshot snap, pg_uuid_t *lo, pg_uuid_t *hi,
				 text *t, text *k)
{
	BTScanInsert key;
	BTStack		stack;
	Buffer		buf;
	Form_pg_attribute att = TupleDescAttr(RelationGetDescr(r->pkey), 0);
	uint8		after[UUID_LEN];	/* the last id taken */
	bool		have_after = false;
	OffsetNumber offs[OUTBOX_LEAF_CHUNK];
	ItemPointerData tids[OUTBOX_LEAF_CHUNK];
	bool		dead[OUTBOX_LEAF_CHUNK];
	IndexFetchTableData *fetch;
	OutboxLeafProbe result = LEAF_UNSURE;

	if (att->atttypid != UUIDOID || att->attalign != TYPALIGN_CHAR)
		return LEAF_UNSURE;
	key = _bt_mkscankey(r->pkey, NULL);
	_bt_metaversion(r->pkey, &key->heapkeyspace, &key->allequalimage);
	key->anynullkeys = false;
	key->keysz = 1;
	key->scankeys[0].sk_flags &= ~SK_ISNULL;
	key->scankeys[0].sk_argument = UUIDPGetDatum(lo);
	stack = _bt_search(r->pkey, key, &buf, BT_READ, snap);
	_bt_freestack(stack);
	pfree(key);
	pgstat_count_index_scan(r->pkey);
	/* an index without a root has no entry */
	if (!BufferIsValid(buf))
		return LEAF_NONE;

	fetch = table_index_fetch_begin(r->rel);
	for (;;)
	{
		Page		page = BufferGetPage(buf);
		BTPageOpaque opaque = BTPageGetOpaque(page);
		OffsetNumber maxoff = PageGetMaxOffsetNumber(page);
		OffsetNumber off = P_FIRSTDATAKEY(opaque);
		OffsetNumber high = maxoff + 1;
		BlockNumber next = opaque->btpo_next;
		bool		rightmost = P_RIGHTMOST(opaque);
		bool		complete = false;
		bool		posting = false;
		bool		found = false;
		int			n = 0;
		int			ndead = 0;
		int			i;

		if (P_IGNORE(opaque))
			off = high;
		else
			PredicateLockPage(r->pkey, BufferGetBlockNumber(buf), snap);
		/* the first entry at or after lo, or after the last one taken */
		while (off < high)
		{
			OffsetNumber mid = off + (high - off) / 2;
			const uint8 *id = outbox_leaf_id((IndexTuple)
											 PageGetItem(page, PageGetItemId(page, mid)));
			int			c = id == NULL ? 1 :
				(have_after ? (memcmp(id, after, UUID_LEN) <= 0 ? -1 : 1) :
				 memcmp(id, lo->data, UUID_LEN));

			if (c < 0)
				off = mid + 1;
			else
				high = mid;
		}
		for (; off <= maxoff && n < OUTBOX_LEAF_CHUNK; off++)
		{
			ItemId		iid = PageGetItemId(page, off);
			IndexTuple	itup;
			const uint8 *id;

			if (ItemIdIsDead(iid))
				continue;
			itup = (IndexTuple) PageGetItem(page, iid);
			id = outbox_leaf_id(itup);
			if (BTreeTupleIsPosting(itup) || id == NULL)
			{
				posting = true;
				break;
			}
			if (memcmp(id, hi->data, UUID_LEN) > 0)
			{
				complete = true;
				break;
			}
			memcpy(after, id, UUID_LEN);
			have_after = true;
			offs[n] = off;
			tids[n] = itup->t_tid;
			dead[n] = false;
			n++;
		}
		/* this leaf has no entry of the range after those taken */
		if (off > maxoff && !complete && !posting && rightmost)
			complete = true;
		LockBuffer(buf, BUFFER_LOCK_UNLOCK);

		for (i = 0; i < n && !found; i++)
		{
			bool		call_again = false;
			bool		all_dead = false;

			CHECK_FOR_INTERRUPTS();
			pgstat_count_index_tuples(r->pkey, 1);
			if (table_index_fetch_tuple(fetch, &tids[i], snap, r->slot,
										&call_again, &all_dead))
			{
				pgstat_count_heap_fetch(r->pkey);
				slot_getallattrs(r->slot);
				/* another (topic, key) with the same hash: not ours */
				found = outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_TOPIC]), t) &&
					outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_KEY]), k);
			}
			else if (all_dead)
			{
				dead[i] = true;
				ndead++;
			}
		}
		if (ndead > 0)
			outbox_leaf_kill(buf, offs, tids, dead, i);
		if (found)
			result = LEAF_FOUND;
		else if (complete)
			result = LEAF_NONE;
		if (found || complete || posting)
			break;
		if (off <= maxoff)
		{
			/* more of this leaf: read it again, after the last one taken */
			LockBuffer(buf, BT_READ);
			continue;
		}
		/* the next leaf, as the scan steps to it */
		ReleaseBuffer(buf);
		buf = _bt_getbuf(r->pkey, next, BT_READ);
	}
	ReleaseBuffer(buf);
	table_index_fetch_end(fetch);
	if (result != LEAF_FOUND)
		ExecClearTuple(r->slot);
	return result;
}

/*
 * The head of a key, its oldest message not yet acknowledged, as it stands
 * now.  Leaves its columns in r->slot.  *busy: a transaction is deleting it
 * (an ack that has not committed), or has deleted it since this look's
 * snapshot: it is not to be leased now.
 */
static bool
outbox_head(OutboxRels *r, Datum topic, Datum key, bool *busy)
{
	ScanKeyData skeys[2];
	pg_uuid_t	lo;
	pg_uuid_t	hi;
	IndexScanDesc scan;
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	text	   *t = DatumGetTextPP(topic);
	text	   *k = DatumGetTextPP(key);
	bool		found = false;

	outbox_key_range(skeys, &lo, &hi, outbox_key_hash(t, k));
	switch (outbox_head_leaf(r, snap, &lo, &hi, t, k))
	{
		case LEAF_FOUND:
			*busy = outbox_message_busy(r->slot);
			UnregisterSnapshot(snap);
			return true;
		case LEAF_NONE:
			UnregisterSnapshot(snap);
			return false;
		case LEAF_UNSURE:
			break;
	}
	scan = index_beginscan(r->rel, r->pkey, snap, 2, 0);
	outbox_scan_keep_pin(scan);
	index_rescan(scan, skeys, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, r->slot))
	{
		text	   *mt;
		text	   *mk;

		slot_getallattrs(r->slot);
		mt = DatumGetTextPP(r->slot->tts_values[OB_TOPIC]);
		mk = DatumGetTextPP(r->slot->tts_values[OB_KEY]);
		/* another (topic, key) with the same hash: not ours */
		if (outbox_text_eq(mt, t) && outbox_text_eq(mk, k))
		{
			found = true;
			*busy = outbox_message_busy(r->slot);
			break;
		}
	}
	index_endscan(scan);
	UnregisterSnapshot(snap);
	return found;
}

/*
 * Whether a message is there, as it stands now, or a transaction that has
 * not committed is deleting it.  r->slot is left as it was.
 */
static bool
outbox_message_exists(OutboxRels *r, pg_uuid_t *id)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	TupleTableSlot *slot = table_slot_create(r->rel, NULL);
	bool		found;

	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_UUID_EQ,
				UUIDPGetDatum(id));
	scan = index_beginscan(r->rel, r->pkey, snap, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snap);
	return found;
}

static bool
uuid_datum_eq(Datum a, pg_uuid_t *b)
{
	return memcmp(DatumGetUUIDP(a)->data, b->data, UUID_LEN) == 0;
}

/*
 * ---- Where leased messages are ----
 *
 * A relay acknowledges the messages it leased, usually in the same session:
 * the lease remembers, per message id, where the message was and where it
 * left the key row's new version, and the ack looks there before it probes
 * the indexes.  What it finds there is checked (the message's id; the key
 * row's key, and that the version is still the latest), so a stale entry
 * (another relay's lease since, a rollback, DROP EXTENSION) only costs the
 * probes.  Entries are removed by the ack; the whole table is dropped when
 * it grows past OUTBOX_LEASED_MAX (leases never acknowledged here).
 */
#define OUTBOX_LEASED_MAX	65536

typedef struct OutboxLeased
{
	pg_uuid_t	id;				/* hash key */
	ItemPointerData msg_tid;
	ItemPointerData key_tid;
} OutboxLeased;

static HTAB *outbox_leased = NULL;

static void
outbox_remember_lease(pg_uuid_t *id, ItemPointer msg_tid,
					  ItemPointerData key_tid)
{
	OutboxLeased *e;
	bool		found;

	if (outbox_leased != NULL &&
		hash_get_num_entries(outbox_leased) >= OUTBOX_LEASED_MAX)
	{
		hash_destroy(outbox_leased);
		outbox_leased = NULL;
	}
	if (outbox_leased == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(pg_uuid_t);
		ctl.entrysize = sizeof(OutboxLeased);
		ctl.hcxt = TopMemoryContext;
		outbox_leased = hash_create("idem outbox leases", 1024, &ctl,
									HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	e = hash_search(outbox_leased, id, HASH_ENTER, &found);
	e->msg_tid = *msg_tid;
	e->key_tid = key_tid;
}

/* Where a message leased by this session was, forgotten once asked. */
static bool
outbox_recall_lease(pg_uuid_t *id, ItemPointer msg_tid, ItemPointer key_tid)
{
	OutboxLeased *e;

	if (outbox_leased == NULL)
		return false;
	e = hash_search(outbox_leased, id, HASH_FIND, NULL);
	if (e == NULL)
		return false;
	*msg_tid = e->msg_tid;
	*key_tid = e->key_tid;
	(void) hash_search(outbox_leased, id, HASH_REMOVE, NULL);
	return true;
}

/*
 * ---- Lease ----
 */

/*
 * A key row that may be leased now, as a pass's scan saw it: where it was
 * and when it became available.  Candidates are tried in the order of
 * (available_at, tid): the keys that have waited longest first.
 */
typedef struct LeaseCandidate
{
	TimestampTz available_at;
	ItemPointerData tid;		/* where the scan saw the key's row */
} LeaseCandidate;

typedef struct LeaseArg
{
	OutboxRels *rels;
	OutboxTopic *topic;
	text	   *relay;
	TimestampTz now;
	int64		lease;
	int			per_key;		/* the most messages of one key */
	int			budget;			/* the most messages of this key, now */
	MemoryContext runcxt;		/* the copies of one key's run, reset */
	/* the answer */
	int			misses;			/* keys whose head was sought, and none found */
	bool		leased;			/* values hold a leased message */
	bool		died;			/* the head used up its attempts */
	Datum		values[OM_NATTS];
	bool		isnull[OM_NATTS];
	pg_uuid_t	head_id;
	ItemPointerData head_tid;	/* where the leased head is */
	/* the head's columns when the slot is needed for its run */
	Datum		head_values[OB_NATTS];
	bool		head_isnull[OB_NATTS];
	/* the messages after the head leased with it, and where they are */
	int			nrun;
	HeapTuple  *run;			/* per_key - 1 of them */
	ItemPointerData *run_tids;
} LeaseArg;

static int
lease_candidate_cmp(const void *a, const void *b)
{
	const LeaseCandidate *ca = a;
	const LeaseCandidate *cb = b;

	if (ca->available_at != cb->available_at)
		return ca->available_at < cb->available_at ? -1 : 1;
	return ItemPointerCompare((ItemPointer) &ca->tid, (ItemPointer) &cb->tid);
}

/*
 * The best candidates of a scan, kept in a max-heap of at most "size"
 * entries: the worst kept is at the root, and a better one replaces it.
 */
typedef struct LeaseHeap
{
	LeaseCandidate *c;
	int			n;
	int			size;
} LeaseHeap;

static void
lease_heap_add(LeaseHeap *h, TimestampTz available_at, ItemPointer tid)
{
	LeaseCandidate cand;
	int			i;

	cand.available_at = available_at;
	cand.tid = *tid;
	if (h->n < h->size)
	{
		/* sift up */
		i = h->n++;
		while (i > 0 && lease_candidate_cmp(&h->c[(i - 1) / 2], &cand) < 0)
		{
			h->c[i] = h->c[(i - 1) / 2];
			i = (i - 1) / 2;
		}
		h->c[i] = cand;
		return;
	}
	if (lease_candidate_cmp(&cand, &h->c[0]) >= 0)
		return;
	/* replace the root, sift down */
	i = 0;
	for (;;)
	{
		int			child = 2 * i + 1;

		if (child >= h->n)
			break;
		if (child + 1 < h->n &&
			lease_candidate_cmp(&h->c[child + 1], &h->c[child]) > 0)
			child++;
		if (lease_candidate_cmp(&h->c[child], &cand) <= 0)
			break;
		h->c[i] = h->c[child];
		i = child;
	}
	h->c[i] = cand;
}

/*
 * The messages of the key (topic, key) after its head (whose seq is head),
 * up to limit, in the order of seq: copies in arg->run (in arg->runcxt),
 * where they are in arg->run_tids.
 *
 * The messages up to leased_through must all be leased by the run: a
 * message committed later with a smaller seq than the run's last (two
 * senders of the key committing out of their order of sending) would be
 * taken for one the run leased.  So, read with a dirty snapshot, there is
 * no run when the key has a message before its head (committed since the
 * head was read, or whose sender is still committing), and the run ends
 * before a message whose sender is still committing (or that a
 * transaction is deleting).
 *
 * Nor may a run take in a message an earlier lease handed out (seq up to
 * leased_max, -1 for none): one after a head whose sender committed late.
 * The late ack of that message, by the relay whose lease of it ran out,
 * would count for the run, and as its last end it while its head is held.
 */
static void
lease_run(LeaseArg *arg, text *topic, text *key, int64 head, int64 leased_max,
		  int limit)
{
	OutboxRels *r = arg->rels;
	ScanKeyData skeys[2];
	pg_uuid_t	lo;
	pg_uuid_t	hi;
	IndexScanDesc scan;
	SnapshotData dirty;
	MemoryContext oldcxt;

	InitDirtySnapshot(dirty);
	outbox_key_range(skeys, &lo, &hi, outbox_key_hash(topic, key));
	scan = index_beginscan(r->rel, r->pkey, &dirty, 2, 0);
	index_rescan(scan, skeys, 2, NULL, 0);
	while (arg->nrun < limit &&
		   index_getnext_slot(scan, ForwardScanDirection, r->slot))
	{
		int64		seq;
		bool		busy = TransactionIdIsValid(dirty.xmin) ||
			TransactionIdIsValid(dirty.xmax);

		slot_getallattrs(r->slot);
		/* another (topic, key) with the same hash: not ours */
		if (!outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_TOPIC]), topic) ||
			!outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_KEY]), key))
			continue;
		seq = DatumGetInt64(r->slot->tts_values[OB_SEQ]);
		if (seq < head)
		{
			/* the index gives these first: nothing was taken yet */
			Assert(arg->nrun == 0);
			break;
		}
		if (seq == head)
			continue;
		if (busy || seq <= leased_max)
			break;
		oldcxt = MemoryContextSwitchTo(arg->runcxt);
		arg->run[arg->nrun] = ExecCopySlotHeapTuple(r->slot);
		MemoryContextSwitchTo(oldcxt);
		arg->run_tids[arg->nrun] = r->slot->tts_tid;
		arg->nrun++;
	}
	index_endscan(scan);
	ExecClearTuple(r->slot);
}

/*
 * Called by the store with the latest version of a key row.
 *
 * A head leased for the first time, and not part of the key's last run,
 * may be leased with up to per_key - 1 messages after it (a run): every
 * one of them is at its first attempt, and leased_through keeps the seq
 * of the last.  A message up to leased_through that is not acknowledged
 * when its run ends (the lease ran out, a nack) was leased once, and is
 * leased alone from then on, at its second attempt: the attempts of every
 * message stay exact without a write of the message.
 */
static bool
lease_key(TupleDesc tupdesc, Datum *values, bool *isnull, void *argp)
{
	LeaseArg   *arg = argp;
	OutboxRels *r = arg->rels;
	TupleTableSlot *slot = r->slot;
	int32		attempts;
	int64		head_seq;
	bool		run_ok;
	bool		in_lease;
	bool		busy = false;
	bool		new_head;
	bool		before_last;
	int64		leased_max;
	int64		last_seq;
	text	   *topic;
	text	   *key;

	arg->leased = false;
	arg->died = false;
	arg->nrun = 0;
	if (DatumGetBool(values[OK_DEAD]))
		return false;
	in_lease = DatumGetTimestampTz(values[OK_AVAILABLE_AT]) > arg->now;
	/* waiting for its retry */
	if (in_lease && isnull[OK_LEASED_BY])
		return false;

	/*
	 * The head is read after the key row, as it stands now.  An ack that
	 * removed an earlier head has committed (the head read is another
	 * message), or is still running (its head is busy).  One that has not
	 * deleted its message yet is seen by idem_outbox_ack's second look at
	 * the row, if this lease locks the message (below) and writes the row.
	 */
	if (!outbox_head(r, values[OK_TOPIC], values[OK_KEY], &busy))
	{
		arg->misses++;
		return false;
	}
	if (busy)
		return false;

	head_seq = DatumGetInt64(slot->tts_values[OB_SEQ]);
	new_head = isnull[OK_HEAD_ID] ||
		!uuid_datum_eq(values[OK_HEAD_ID], DatumGetUUIDP(slot->tts_values[OB_ID]));
	/*
	 * The row names a message after the head: the head's sender committed
	 * late, or a nack named a message of a run.
	 */
	before_last = new_head && !isnull[OK_HEAD_ID] &&
		memcmp(DatumGetUUIDP(values[OK_HEAD_ID])->data,
			   DatumGetUUIDP(slot->tts_values[OB_ID])->data, UUID_LEN) > 0;

	/*
	 * Leased, and not run out: the lease holds while its message, or one of
	 * its run, is there (the ack of a head leased alone deletes it and
	 * leaves the key row as the lease wrote it: see ack_key).  Its message
	 * is the key's head, or a message after it when one sent before it
	 * committed since.  A leased message that would come before the head is
	 * gone.
	 */
	if (in_lease &&
		(!new_head ||
		 (outbox_key_in_run(values, isnull) &&
		  head_seq <= DatumGetInt64(values[OK_LEASED_THROUGH])) ||
		 (before_last &&
		  outbox_message_exists(r, DatumGetUUIDP(values[OK_HEAD_ID])))))
		return false;

	attempts = DatumGetInt32(values[OK_ATTEMPTS]);
	/* a head leased before is the same head only if its id says so */
	if (new_head)
	{
		attempts = 0;
		/* the error was the last head's */
		isnull[OK_LAST_ERROR] = true;
	}
	else if (!outbox_lock_message(r, &slot->tts_tid, false))
	{
		/*
		 * Handed out again (its lease ran out, or its retry is due), or
		 * dead: not while an ack deletes it, nor may that ack commit
		 * without seeing this row (see idem_outbox_ack).
		 */
		return false;
	}
	/* past the last run: forgotten */
	if (!isnull[OK_LEASED_THROUGH] &&
		head_seq > DatumGetInt64(values[OK_LEASED_THROUGH]))
		isnull[OK_LEASED_THROUGH] = true;
	/* in it: leased once with it */
	if (attempts == 0 && !isnull[OK_LEASED_THROUGH])
		attempts = 1;
	run_ok = (attempts == 0);
	leased_max = isnull[OK_LEASED_MAX] ? -1 : DatumGetInt64(values[OK_LEASED_MAX]);
	last_seq = head_seq;

	memcpy(&arg->head_id, DatumGetUUIDP(slot->tts_values[OB_ID]), UUID_LEN);
	arg->head_tid = slot->tts_tid;
	values[OK_HEAD_ID] = UUIDPGetDatum(&arg->head_id);
	isnull[OK_HEAD_ID] = false;

	if (attempts >= arg->topic->max_attempts)
	{
		/* its last lease ran out: it is dead, and holds its key back */
		values[OK_DEAD] = BoolGetDatum(true);
		values[OK_ATTEMPTS] = Int32GetDatum(attempts);
		isnull[OK_LEASED_BY] = true;
		values[OK_LAST_ERROR] = CStringGetTextDatum(OUTBOX_EXPIRED_ERROR);
		isnull[OK_LAST_ERROR] = false;
		arg->died = true;
		return true;
	}

	values[OK_ATTEMPTS] = Int32GetDatum(attempts + 1);
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now + arg->lease);
	values[OK_LEASED_BY] = PointerGetDatum(arg->relay);
	isnull[OK_LEASED_BY] = false;

	arg->values[0] = UUIDPGetDatum(&arg->head_id);
	arg->isnull[0] = false;
	arg->values[1] = slot->tts_values[OB_TOPIC];
	arg->isnull[1] = false;
	arg->values[2] = slot->tts_values[OB_KEY];
	arg->isnull[2] = false;
	arg->values[3] = slot->tts_values[OB_TYPE];
	arg->isnull[3] = slot->tts_isnull[OB_TYPE];
	arg->values[4] = slot->tts_values[OB_PAYLOAD];
	arg->isnull[4] = false;
	arg->values[5] = slot->tts_values[OB_HEADERS];
	arg->isnull[5] = slot->tts_isnull[OB_HEADERS];
	arg->values[6] = Int32GetDatum(attempts + 1);
	arg->isnull[6] = false;
	arg->values[7] = slot->tts_values[OB_CREATED_AT];
	arg->isnull[7] = false;
	arg->leased = true;

	if (run_ok && arg->per_key > 1 && arg->budget > 1)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(arg->runcxt);
		HeapTuple	head = ExecCopySlotHeapTuple(slot);

		/* the head's columns outlive the slot, which the run's scan reuses */
		MemoryContextSwitchTo(oldcxt);
		heap_deform_tuple(head, RelationGetDescr(r->rel), arg->head_values,
						  arg->head_isnull);
		arg->values[1] = arg->head_values[OB_TOPIC];
		arg->values[2] = arg->head_values[OB_KEY];
		arg->values[3] = arg->head_values[OB_TYPE];
		arg->values[4] = arg->head_values[OB_PAYLOAD];
		arg->values[5] = arg->head_values[OB_HEADERS];
		arg->values[7] = arg->head_values[OB_CREATED_AT];
		topic = DatumGetTextPP(arg->values[1]);
		key = DatumGetTextPP(arg->values[2]);
		lease_run(arg, topic, key, head_seq, leased_max,
				  Min(arg->per_key, arg->budget) - 1);
		if (arg->nrun > 0)
		{
			bool		isn;

			values[OK_LEASED_THROUGH] =
				heap_getattr(arg->run[arg->nrun - 1], OB_SEQ + 1,
							 RelationGetDescr(r->rel), &isn);
			isnull[OK_LEASED_THROUGH] = false;
			last_seq = DatumGetInt64(values[OK_LEASED_THROUGH]);
		}
	}
	/* the highest seq ever handed out (see lease_run) */
	if (last_seq > leased_max)
	{
		values[OK_LEASED_MAX] = Int64GetDatum(last_seq);
		isnull[OK_LEASED_MAX] = false;
	}
	return true;
}

static void
outbox_check_message_type(TupleDesc desc)
{
	static const Oid types[OM_NATTS] = {
		UUIDOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, INT4OID,
		TIMESTAMPTZOID
	};
	int			i;
	bool		ok = (desc->natts == OM_NATTS);

	for (i = 0; ok && i < OM_NATTS; i++)
		ok = !TupleDescAttr(desc, i)->attisdropped &&
			TupleDescAttr(desc, i)->atttypid == types[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("type idem_outbox_message does not have the expected attributes"),
				 errhint("Undo the change to the type.")));
}

/*
 * Whether the key row version in slot (pinned) has been updated or deleted
 * by a transaction that committed or is still running: idem_store_try_update_at
 * would then leave it, whatever lease_key said.  A lock (held or not), a
 * multixact and an aborted updater say no: the update is tried, and
 * decides.
 */
static bool
lease_row_changed(TupleTableSlot *slot)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	HeapTupleHeader tup = bslot->base.tuple->t_data;
	uint16		infomask;
	TransactionId xmax;
	bool		changed;

	LockBuffer(bslot->buffer, BUFFER_LOCK_SHARE);
	infomask = tup->t_infomask;
	xmax = HeapTupleHeaderGetRawXmax(tup);
	LockBuffer(bslot->buffer, BUFFER_LOCK_UNLOCK);
	if ((infomask & HEAP_XMAX_INVALID) || (infomask & HEAP_XMAX_IS_MULTI) ||
		!TransactionIdIsValid(xmax))
		return false;
	if (HEAP_XMAX_IS_LOCKED_ONLY(infomask))
		return false;
	changed = !TransactionIdDidAbort(xmax);
	return changed;
}

/*
 * The keys the last pass of this session found without a head, or would
 * have sought one of without lease_present_hashes: when they are more than
 * the index has pages, the next pass reads the index whole first.
 */
static int	lease_last_misses = 0;

static int
lease_hash_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : (x > y ? 1 : 0);
}

/*
 * The prefixes of key_hash (see outbox_make_id) that begin an id in the
 * primary key, in order, each once: those of the keys that may have a head.  The index is read
 * whole, without the table: one read of each of its pages instead of a
 * descent per key, which pays when it has fewer pages than a pass has
 * candidates (a short backlog, keys whose messages were all delivered).
 *
 * A key without an entry has no message that a probe of its head, at the
 * time of this read, could find: a message's entry is in the index before
 * its sender's transaction commits (and before that transaction looks at
 * the idle lock: see "Waking relays"), and the index drops (marks dead)
 * only entries of rows that no transaction can see any more.  Such a key
 * is skipped, as such a probe would have answered.  A key with an entry is
 * probed as usual, after its row is read again.
 */
static int64 *
lease_present_hashes(OutboxRels *r, int *n)
{
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	IndexScanDesc scan;
	int			size = 1024;
	int64	   *hashes = palloc(sizeof(int64) * size);

	*n = 0;
	scan = index_beginscan(r->rel, r->pkey, snap, 0, 0);
	scan->xs_want_itup = true;
	index_rescan(scan, NULL, 0, NULL, 0);
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		bool		isnull;
		Datum		id;
		int64		hash = 0;

		CHECK_FOR_INTERRUPTS();
		id = index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull);
		if (!isnull)
			hash = outbox_id_prefix(DatumGetUUIDP(id));
		/* the index is in order of key_hash: a repeat follows its first */
		if (isnull || (*n > 0 && hashes[*n - 1] == hash))
			continue;
		if (*n == size)
		{
			size *= 2;
			hashes = repalloc(hashes, sizeof(int64) * size);
		}
		hashes[(*n)++] = hash;
	}
	index_endscan(scan);
	UnregisterSnapshot(snap);
	return hashes;
}

/*
 * Lease the head of the key whose row version, as the pass's snapshot sees
 * it, is in kslot (pinned) at tid, and its run (see lease_key) within
 * budget messages.  Returns how many messages were leased (they are then
 * in the result, the head first).  kslot is left empty.
 */
static int
lease_try(IdemStore *store, TupleTableSlot *kslot, ItemPointer tid,
		  ReturnSetInfo *rsinfo, LeaseArg *arg, List **topics, int budget)
{
	IdemStoreUpdateResult res;
	text	   *topic;

	/*
	 * A version another transaction has updated since, or is updating, will
	 * not be updated here: skip it before the probe of its head.
	 */
	if (lease_row_changed(kslot))
	{
		ExecClearTuple(kslot);
		return 0;
	}
	slot_getallattrs(kslot);
	topic = DatumGetTextPCopy(kslot->tts_values[OK_TOPIC]);
	arg->topic = outbox_topic(topics, topic);

	/*
	 * The row is updated where the pass saw it, if no transaction has changed
	 * it since: one that has, or is changing it, is skipped.
	 */
	arg->budget = budget;
	res = idem_store_try_update_at(store, tid, kslot->tts_values,
								   kslot->tts_isnull, lease_key, arg);
	ExecClearTuple(kslot);
	if (res == IDEM_UPDATE_DONE && arg->leased)
	{
		ItemPointerData key_tid = idem_store_updated_tid(store);
		TupleDesc	desc = RelationGetDescr(arg->rels->rel);
		int			i;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
							 arg->values, arg->isnull);
		outbox_remember_lease(&arg->head_id, &arg->head_tid, key_tid);
		for (i = 0; i < arg->nrun; i++)
		{
			Datum		mv[OB_NATTS];
			bool		mn[OB_NATTS];
			Datum		v[OM_NATTS];
			bool		n[OM_NATTS];

			heap_deform_tuple(arg->run[i], desc, mv, mn);
			v[0] = mv[OB_ID];
			n[0] = false;
			v[1] = mv[OB_TOPIC];
			n[1] = false;
			v[2] = mv[OB_KEY];
			n[2] = false;
			v[3] = mv[OB_TYPE];
			n[3] = mn[OB_TYPE];
			v[4] = mv[OB_PAYLOAD];
			n[4] = false;
			v[5] = mv[OB_HEADERS];
			n[5] = mn[OB_HEADERS];
			v[6] = Int32GetDatum(1);
			n[6] = false;
			v[7] = mv[OB_CREATED_AT];
			n[7] = false;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
			outbox_remember_lease(DatumGetUUIDP(mv[OB_ID]), &arg->run_tids[i],
								  key_tid);
		}
		MemoryContextReset(arg->runcxt);
		idem_stat_count_text(IDEM_KIND_OUTBOX, topic, IDEM_OUTBOX_LEASED,
							 1 + arg->nrun);
		if (DatumGetInt32(arg->values[6]) > 1)
			idem_stat_count_text(IDEM_KIND_OUTBOX, topic,
								 IDEM_OUTBOX_REDELIVERED, 1);
		return 1 + arg->nrun;
	}
	MemoryContextReset(arg->runcxt);
	if (res == IDEM_UPDATE_DONE && arg->died)
		idem_stat_count_text(IDEM_KIND_OUTBOX, topic, IDEM_OUTBOX_DEAD, 1);
	return 0;
}

/*
 * Whether the key row version in kslot makes its key a candidate of a
 * pass, and when it became available (*at, the order of candidates): not
 * dead, and available now, or leased (the ack of a head leased alone leaves
 * the row: see ack_key).  head: the key's head as the pass sees it, or NULL
 * when unknown; a lease holds while that head is its message or in its
 * run (lease_key decides the rest).  A leased key counts as available since
 * its lease began, as far as this call's lease tells.
 */
static bool
lease_candidate_at(TupleTableSlot *kslot, LeaseArg *arg, pg_uuid_t *head,
				   int64 head_seq, TimestampTz *at)
{
	bool		isnull;
	Datum		d;

	d = slot_getattr(kslot, OK_DEAD + 1, &isnull);
	if (isnull || DatumGetBool(d))
		return false;
	d = slot_getattr(kslot, OK_AVAILABLE_AT + 1, &isnull);
	if (isnull)
		return false;
	*at = DatumGetTimestampTz(d);
	if (*at <= arg->now)
		return true;
	/* waiting for its retry */
	(void) slot_getattr(kslot, OK_LEASED_BY + 1, &isnull);
	if (isnull)
		return false;
	if (head != NULL)
	{
		Datum	   *values = kslot->tts_values;
		bool	   *nulls = kslot->tts_isnull;

		slot_getallattrs(kslot);
		if (!nulls[OK_HEAD_ID] && uuid_datum_eq(values[OK_HEAD_ID], head))
			return false;
		if (outbox_key_in_run(values, nulls) &&
			head_seq <= DatumGetInt64(values[OK_LEASED_THROUGH]))
			return false;
	}
	*at -= arg->lease;
	return true;
}

/*
 * Fill heap with the candidates of a scan of every key row under snap: the
 * keys lease_candidate_at takes (after: the last candidate an earlier
 * round tried, or NULL; present: see lease_present_hashes).
 */
static void
lease_scan_keys(Relation keys_rel, Snapshot snap, TupleTableSlot *kslot,
				LeaseHeap *heap, LeaseCandidate *after, LeaseArg *arg,
				int64 *present, int npresent, bool *more)
{
	TableScanDesc scan = table_beginscan(keys_rel, snap, 0, NULL);

	while (table_scan_getnextslot(scan, ForwardScanDirection, kslot))
	{
		TimestampTz avail;
		int64		hash;

		if (!lease_candidate_at(kslot, arg, NULL, 0, &avail))
			continue;
		if (after != NULL)
		{
			LeaseCandidate cand;

			/* tried by an earlier round */
			cand.available_at = avail;
			cand.tid = kslot->tts_tid;
			if (lease_candidate_cmp(&cand, after) <= 0)
				continue;
		}
		if (present != NULL)
		{
			bool		tnull;
			bool		knull;
			Datum		t = slot_getattr(kslot, OK_TOPIC + 1, &tnull);
			Datum		k = slot_getattr(kslot, OK_KEY + 1, &knull);

			/* no entry in the index: no head */
			if (tnull || knull)
				continue;
			hash = outbox_hash_prefix(outbox_key_hash(DatumGetTextPP(t),
													  DatumGetTextPP(k)));
			if (bsearch(&hash, present, npresent, sizeof(int64),
						lease_hash_cmp) == NULL)
			{
				arg->misses++;
				continue;
			}
		}
		if (heap->n == heap->size)
			*more = true;
		lease_heap_add(heap, avail, &kslot->tts_tid);
		CHECK_FOR_INTERRUPTS();
	}
	table_endscan(scan);
}

/*
 * ---- Finding keys through their messages ----
 *
 * A pass that scans the key rows reads every one, however few keys have
 * messages: with many idle keys (keys are often the ids of orders or
 * accounts, and a key's row stays until idem_outbox_purge) and a short
 * backlog, as when relays keep up, that is most of a lease's work, paid
 * again by every lease that finds nothing.  So a pass first reads the
 * primary key of idem.outbox (ids in the order of key_hash, then seq) in
 * order, under the pass's snapshot, and finds the key row of each key seen
 * there through the primary key of idem.outbox_keys: the candidates a
 * scan of the key rows would give, kept and tried in the same order, from
 * the keys that have messages only (the others have no head to lease),
 * less the keys whose lease holds on the head the read sees (a scan of the
 * key rows cannot tell those from keys whose leased head was acknowledged,
 * and leaves them to lease_key).
 *
 * The read gives up once it has cost more than a scan of the key rows would
 * (a long backlog, counted in messages: many messages of a few keys count
 * as many): the pass then scans the key rows, and so do the session's next
 * passes, LEASE_MESSAGES_SKIP of them, twice as many after each read given
 * up in a row, up to LEASE_MESSAGES_SKIP_MAX, so that a long backlog pays
 * little for the reads given up, and a backlog gone is noticed within that
 * many passes.  (A pass that leases nothing is no sign of that: the heads
 * may all be leased, waiting for a retry, or behind dead keys.)  Every
 * index entry read counts (one the snapshot cannot see costs its heap fetch
 * too), a key row found LEASE_PROBE_COST; a scan of the key rows is priced
 * at LEASE_ROWS_PER_PAGE rows per page of the table, plus LEASE_MIN_BUDGET.
 */
#define LEASE_MESSAGES_SKIP 16
#define LEASE_MESSAGES_SKIP_MAX 64
#define LEASE_ROWS_PER_PAGE 40
#define LEASE_MIN_BUDGET	64
#define LEASE_PROBE_COST	2

/*
 * Passes of this session that scan the key rows without trying the index,
 * and how many the next read given up sets.
 */
static int	lease_messages_skip = 0;
static int	lease_messages_backoff = LEASE_MESSAGES_SKIP;

/* A (topic, key) seen in the index, among those of one prefix of ids. */
typedef struct LeaseSeenKey
{
	text	   *topic;
	text	   *key;
} LeaseSeenKey;

/* Frees a run of keys seen, with their copies of topic and key. */
static void
lease_free_run(List *run)
{
	ListCell   *lc;

	foreach(lc, run)
	{
		LeaseSeenKey *seen = lfirst(lc);

		pfree(seen->topic);
		pfree(seen->key);
	}
	list_free_deep(run);
}

/*
 * Fill heap with the candidates among the keys that have a message visible
 * to snap, as lease_scan_keys does from every key row (after: the last
 * candidate an earlier round tried, or NULL).  False when that cost more
 * than the scan: heap is then to be filled by the scan.
 */
static bool
lease_candidates_by_messages(IdemStore *store, OutboxRels *r,
							 Relation keys_rel, Snapshot snap,
							 TupleTableSlot *kslot, LeaseHeap *heap,
							 LeaseCandidate *after, LeaseArg *arg,
							 bool *more)
{
	Relation	keys_index = idem_store_index(store);
	int64		budget;
	int64		cost = 0;
	int64		run_hash = 0;
	List	   *run = NIL;		/* LeaseSeenKey of run_hash */
	IndexScanDesc scan;
	IndexScanDesc kscan;
	ScanKeyData skeys[2];
	bool		ok = true;

	Assert(keys_index != NULL);
	budget = (int64) RelationGetNumberOfBlocks(keys_rel) * LEASE_ROWS_PER_PAGE +
		LEASE_MIN_BUDGET;

	scan = index_beginscan(r->rel, r->pkey, snap, 0, 0);
	outbox_scan_keep_pin(scan);
	index_rescan(scan, NULL, 0, NULL, 0);
	kscan = index_beginscan(keys_rel, keys_index, snap, 2, 0);
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		int64		hash;
		text	   *topic;
		text	   *key;
		bool		known = false;
		ListCell   *lc;
		LeaseSeenKey *seen;
		TimestampTz avail;

		CHECK_FOR_INTERRUPTS();
		/* every entry counts, also one whose message the snapshot cannot see */
		if (++cost > budget)
		{
			ok = false;
			break;
		}
		if (!index_fetch_heap(scan, r->slot))
			continue;
		slot_getallattrs(r->slot);
		/* the index gives the entries of each prefix of ids together */
		hash = outbox_id_prefix(DatumGetUUIDP(r->slot->tts_values[OB_ID]));
		topic = DatumGetTextPP(r->slot->tts_values[OB_TOPIC]);
		key = DatumGetTextPP(r->slot->tts_values[OB_KEY]);
		if (run != NIL && hash == run_hash)
		{
			/* a later message of a key seen, or a key with the same prefix */
			foreach(lc, run)
			{
				seen = lfirst(lc);
				if (outbox_text_eq(seen->topic, topic) &&
					outbox_text_eq(seen->key, key))
				{
					known = true;
					break;
				}
			}
			if (known)
				continue;
		}
		else
		{
			lease_free_run(run);
			run = NIL;
			run_hash = hash;
		}
		seen = palloc(sizeof(LeaseSeenKey));
		seen->topic = DatumGetTextPCopy(PointerGetDatum(topic));
		seen->key = DatumGetTextPCopy(PointerGetDatum(key));
		run = lappend(run, seen);

		/*
		 * The key's row, as the scan of the key rows would see it.  The
		 * primary key is on (topic, key), both text in the "C" collation, as
		 * outbox_keys_open checked.
		 */
		cost += LEASE_PROBE_COST;
		ScanKeyEntryInitialize(&skeys[0], 0, 1, BTEqualStrategyNumber,
							   InvalidOid, C_COLLATION_OID, F_TEXTEQ,
							   PointerGetDatum(topic));
		ScanKeyEntryInitialize(&skeys[1], 0, 2, BTEqualStrategyNumber,
							   InvalidOid, C_COLLATION_OID, F_TEXTEQ,
							   PointerGetDatum(key));
		index_rescan(kscan, skeys, 2, NULL, 0);
		if (!index_getnext_slot(kscan, ForwardScanDirection, kslot))
			continue;
		if (lease_candidate_at(kslot, arg,
							   DatumGetUUIDP(r->slot->tts_values[OB_ID]),
							   DatumGetInt64(r->slot->tts_values[OB_SEQ]),
							   &avail))
		{
			LeaseCandidate cand;

			cand.available_at = avail;
			cand.tid = kslot->tts_tid;
			if (after == NULL || lease_candidate_cmp(&cand, after) > 0)
			{
				if (heap->n == heap->size)
					*more = true;
				lease_heap_add(heap, cand.available_at, &cand.tid);
			}
		}
		ExecClearTuple(kslot);
	}
	index_endscan(kscan);
	index_endscan(scan);
	ExecClearTuple(r->slot);
	lease_free_run(run);
	return ok;
}

/*
 * One look for keys whose head may be leased now: their heads go into the
 * result, up to max_messages.  Returns how many.
 *
 * The candidates come from the primary key (lease_candidates_by_messages)
 * or, past its cost, from a scan of every key row (lease_scan_keys).  The
 * pass keeps only the best candidates, about twice as many as may be
 * leased; the rows are read again when they are tried, under the pass's
 * snapshot, which keeps the versions it saw where they were.  When fewer
 * than max_messages could be leased and the pass saw more candidates than
 * it kept, it runs again under the same snapshot for the next ones.
 */
/* the largest set of candidates a round keeps (16 bytes each) */
#define LEASE_HEAP_MAX		(1 << 20)

static int
lease_pass(IdemStore *store, OutboxRels *r, ReturnSetInfo *rsinfo,
		   LeaseArg *arg, int max_messages, List **topics)
{
	Relation	keys_rel;
	Snapshot	snap;
	TupleTableSlot *kslot;
	LeaseHeap	heap;
	LeaseCandidate last;
	bool		have_last = false;
	bool		more;
	bool		by_messages = false;
	int64	   *present = NULL;
	int			npresent = 0;
	int			nleased = 0;
	int			i;

	arg->now = GetCurrentTimestamp();
	heap.size = max_messages * 2 + 16;
	heap.c = palloc(sizeof(LeaseCandidate) * heap.size);

	/*
	 * When the last pass sought the head of more keys without one than the
	 * index has pages, reading the index whole costs less than a descent
	 * per such key: see lease_present_hashes.
	 */
	arg->misses = 0;
	/* the keys with messages through the index, or every key row */
	if (lease_messages_skip > 0)
		lease_messages_skip--;
	else
		by_messages = idem_store_index(store) != NULL;
	if (!by_messages && lease_last_misses > 0 &&
		RelationGetNumberOfBlocks(r->pkey) < (BlockNumber) lease_last_misses)
		present = lease_present_hashes(r, &npresent);
	/* this call's own updates (a first pass) must be seen */
	CommandCounterIncrement();
	keys_rel = table_open(outbox_keys_relid, RowExclusiveLock);
	snap = RegisterSnapshot(GetLatestSnapshot());
	kslot = table_slot_create(keys_rel, NULL);
	do
	{
		heap.n = 0;
		more = false;
		if (by_messages &&
			!lease_candidates_by_messages(store, r, keys_rel, snap, kslot,
										  &heap, have_last ? &last : NULL,
										  arg, &more))
		{
			/* a long backlog: the key rows, for a while */
			by_messages = false;
			lease_messages_skip = lease_messages_backoff;
			lease_messages_backoff = Min(lease_messages_backoff * 2,
										 LEASE_MESSAGES_SKIP_MAX);
			heap.n = 0;
			more = false;
		}
		else if (by_messages)
			lease_messages_backoff = LEASE_MESSAGES_SKIP;
		if (!by_messages)
			lease_scan_keys(keys_rel, snap, kslot, &heap,
							have_last ? &last : NULL, arg, present, npresent,
							&more);

		/* the keys that have waited longest first */
		qsort(heap.c, heap.n, sizeof(LeaseCandidate), lease_candidate_cmp);

		for (i = 0; i < heap.n && nleased < max_messages; i++)
		{
			CHECK_FOR_INTERRUPTS();
			/* the version the pass saw: the snapshot keeps it there */
			if (!table_tuple_fetch_row_version(keys_rel, &heap.c[i].tid, snap,
											   kslot))
				continue;
			nleased += lease_try(store, kslot, &heap.c[i].tid, rsinfo, arg,
								 topics, max_messages - nleased);
		}
		if (heap.n > 0)
		{
			last = heap.c[heap.n - 1];
			have_last = true;
		}

		/*
		 * Each round tries a bounded set of candidates and reads every key
		 * row (or the primary key) again.  Among many keys without a head
		 * (all delivered, not purged yet) a pass of rounds of one size would
		 * cost the square of their number: each round's set is twice the
		 * last's, so a pass takes a number of rounds that grows as the
		 * logarithm of theirs.  Once they outnumber the index's pages, the
		 * rest of the pass also skips those the index shows without a head.
		 */
		if (more && nleased < max_messages)
		{
			if (heap.size < LEASE_HEAP_MAX)
			{
				heap.size = Min(heap.size * 2, LEASE_HEAP_MAX);
				heap.c = repalloc(heap.c, sizeof(LeaseCandidate) * heap.size);
			}
			if (!by_messages && present == NULL && arg->misses > 0 &&
				RelationGetNumberOfBlocks(r->pkey) < (BlockNumber) arg->misses)
				present = lease_present_hashes(r, &npresent);
		}
	} while (more && nleased < max_messages);
	ExecDropSingleTupleTableSlot(kslot);
	UnregisterSnapshot(snap);
	table_close(keys_rel, NoLock);
	pfree(heap.c);
	if (present != NULL)
		pfree(present);
	lease_last_misses = arg->misses;
	return nleased;
}

/*
 * idem_outbox_lease(relay, max_messages, lease, per_key) returns setof
 * idem_outbox_message
 *
 * Up to max_messages heads of keys that may be leased now, the keys that
 * have waited longest first, each followed by the rest of its run when
 * per_key is above 1 (see lease_key).  A key another relay is leasing at
 * this very moment is skipped, not waited for.
 */
PG_FUNCTION_INFO_V1(idem_outbox_lease);
Datum
idem_outbox_lease(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *relay = idem_arg_key(fcinfo, 0, "relay", OUTBOX_MAX_RELAY_LEN);
	int32		max_messages;
	int64		lease;
	int32		per_key;
	IdemStore  *store;
	OutboxRels	r;
	int			nleased = 0;
	List	   *topics = NIL;
	LeaseArg	arg;
	MemoryContext callcxt;
	MemoryContext oldcxt;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_messages must not be null")));
	max_messages = PG_GETARG_INT32(1);
	if (max_messages < 1 || max_messages > OUTBOX_MAX_LEASE_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_messages must be between 1 and %d",
						OUTBOX_MAX_LEASE_BATCH),
				 errdetail("The value given was %d.", max_messages)));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease must not be null")));
	lease = outbox_span(PG_GETARG_INTERVAL_P(2), "lease", false,
						"Give how long a relay may take to deliver a batch, such as '30 seconds'.");
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("per_key must not be null"),
				 errhint("Give 1 to lease only the oldest message of each key.")));
	per_key = PG_GETARG_INT32(3);
	if (per_key < 1 || per_key > OUTBOX_MAX_LEASE_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("per_key must be between 1 and %d",
						OUTBOX_MAX_LEASE_BATCH),
				 errdetail("The value given was %d.", per_key)));
	idem_check_writable("idem_outbox_lease()");

	InitMaterializedSRF(fcinfo, 0);
	outbox_check_message_type(rsinfo->setDesc);

	callcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_outbox_lease",
									ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(callcxt);

	store = outbox_keys_open();
	outbox_open(&r, RowExclusiveLock);

	arg.rels = &r;
	arg.relay = relay;
	arg.lease = lease;
	arg.per_key = per_key;
	arg.nrun = 0;
	arg.run = NULL;
	arg.run_tids = NULL;
	arg.runcxt = AllocSetContextCreate(callcxt, "idem_outbox_lease run",
									   ALLOCSET_DEFAULT_SIZES);
	if (per_key > 1)
	{
		int			most = Min(per_key, max_messages) - 1;

		arg.run = palloc(sizeof(HeapTuple) * Max(most, 1));
		arg.run_tids = palloc(sizeof(ItemPointerData) * Max(most, 1));
	}
	/* idle since an earlier call: this look is the last one */
	if (outbox_relay_is_idle())
		outbox_wake_owe();
	nleased = lease_pass(store, &r, rsinfo, &arg, max_messages, &topics);
	if (nleased == 0 && !outbox_relay_is_idle())
	{
		/* idle from now on, then a last look: see "Waking relays" */
		outbox_set_relay_idle(true);
		if (outbox_relay_is_idle())
			outbox_wake_owe();
		nleased = lease_pass(store, &r, rsinfo, &arg, max_messages, &topics);
	}
	if (nleased > 0)
		outbox_set_relay_idle(false);

	outbox_close(&r);
	idem_store_close(store);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(callcxt);
	return (Datum) 0;
}

/*
 * ---- Ack and nack ----
 */

typedef struct AckArg
{
	pg_uuid_t  *id;
	int64		seq;			/* the message's */
	TimestampTz now;
	bool		acked;			/* ack: the message was leased */
	bool		need_lock;		/* ack: the key row is not updated yet */
	/* ack: the row was left as judged, what it said, and a look again */
	bool		left;
	bool		again;
	int32		left_attempts;
	TimestampTz left_available_at;
	/* nack only */
	OutboxTopic *topic;
	text	   *error;
	int64		retry_after;	/* -1: backoff */
	text	   *relay;			/* NULL: any relay's lease */
	bool		permanent;		/* dead at once */
	bool		died;
} AckArg;

/*
 * Whether the key is leased in a run (see lease_key): leased_through is
 * kept until a lease passes it, but only a run's lease leaves attempts at
 * 1 with it set and a relay holding it (a nack and a release clear
 * leased_by).
 */
static bool
outbox_key_in_run(Datum *values, bool *isnull)
{
	return !isnull[OK_LEASED_THROUGH] && !isnull[OK_LEASED_BY] &&
		DatumGetInt32(values[OK_ATTEMPTS]) == 1;
}

/*
 * An ack of a message leased: the key's head, or one up to the end of its
 * last run.  The key is released (its next message becomes its head) by
 * the ack of the last message its lease handed out: its head, or the last
 * of its run.  A head leased alone (with no error kept) is released by its
 * deletion alone: the row is not written (false, with acked set), and still
 * names it with its lease, which ends with the message (see lease_key; a
 * lease does not take a head that a transaction is deleting).  A dead
 * head, one waiting for its retry, or one that failed before, is released
 * by a write of the row.  The messages of a run
 * before its last are deleted and the key stays leased to the relay
 * delivering the rest; its row is updated all the same (unchanged), once
 * per call and key (need_lock): a lease skips a key row another
 * transaction is changing.
 */
static bool
ack_key(TupleDesc tupdesc, Datum *values, bool *isnull, void *argp)
{
	AckArg	   *arg = argp;
	bool		is_head;
	bool		last;

	/* the row left, as it was judged: nothing was written since */
	if (arg->again &&
		!DatumGetBool(values[OK_DEAD]) && !isnull[OK_LEASED_BY] &&
		DatumGetInt32(values[OK_ATTEMPTS]) == arg->left_attempts &&
		DatumGetTimestampTz(values[OK_AVAILABLE_AT]) == arg->left_available_at)
		return false;
	is_head = !isnull[OK_HEAD_ID] && uuid_datum_eq(values[OK_HEAD_ID], arg->id);
	arg->acked = is_head ||
		(!isnull[OK_LEASED_THROUGH] &&
		 arg->seq <= DatumGetInt64(values[OK_LEASED_THROUGH]));
	if (!arg->acked)
		return false;
	if (DatumGetBool(values[OK_DEAD]) || !outbox_key_in_run(values, isnull))
	{
		/*
		 * A head leased alone: the row is left as the lease wrote it, and
		 * the lease ends with the message (see lease_key).  One dead,
		 * waiting for its retry, or that failed before (its error goes with
		 * it) is released here, and so is one whose row was written after
		 * it was left (again).
		 */
		if (is_head && !arg->again && !DatumGetBool(values[OK_DEAD]) &&
			!isnull[OK_LEASED_BY] && isnull[OK_LAST_ERROR])
		{
			arg->left = true;
			arg->left_attempts = DatumGetInt32(values[OK_ATTEMPTS]);
			arg->left_available_at = DatumGetTimestampTz(values[OK_AVAILABLE_AT]);
			return false;
		}
		last = is_head;
	}
	else
		last = arg->seq == DatumGetInt64(values[OK_LEASED_THROUGH]);
	if (!last)
		return arg->need_lock;
	values[OK_DEAD] = BoolGetDatum(false);
	values[OK_ATTEMPTS] = Int32GetDatum(0);
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now);
	isnull[OK_HEAD_ID] = true;
	isnull[OK_LEASED_BY] = true;
	isnull[OK_LAST_ERROR] = true;
	return true;
}

/* A nack: the head waits, or dies. */
static bool
nack_key(TupleDesc tupdesc, Datum *values, bool *isnull, void *argp)
{
	AckArg	   *arg = argp;
	int32		attempts;
	bool		is_head;

	arg->died = false;
	if (isnull[OK_LEASED_BY] || DatumGetBool(values[OK_DEAD]))
		return false;
	is_head = !isnull[OK_HEAD_ID] && uuid_datum_eq(values[OK_HEAD_ID], arg->id);
	/* or a message of the run leased with the head */
	if (!is_head &&
		!(outbox_key_in_run(values, isnull) &&
		  arg->seq <= DatumGetInt64(values[OK_LEASED_THROUGH])))
		return false;
	/* a relay whose lease ran out must not end the lease of another */
	if (arg->relay != NULL)
	{
		text	   *holder = DatumGetTextPP(values[OK_LEASED_BY]);

		if (VARSIZE_ANY_EXHDR(holder) != VARSIZE_ANY_EXHDR(arg->relay) ||
			memcmp(VARDATA_ANY(holder), VARDATA_ANY(arg->relay),
				   VARSIZE_ANY_EXHDR(holder)) != 0)
			return false;
	}
	attempts = DatumGetInt32(values[OK_ATTEMPTS]);
	if (!is_head)
	{
		/*
		 * The messages of the run before it were delivered: it is the head
		 * the next lease retries, once they are acknowledged, at its second
		 * attempt.
		 */
		values[OK_HEAD_ID] = UUIDPGetDatum(arg->id);
		isnull[OK_HEAD_ID] = false;
		attempts = 1;
		values[OK_ATTEMPTS] = Int32GetDatum(attempts);
	}
	values[OK_LAST_ERROR] = PointerGetDatum(arg->error);
	isnull[OK_LAST_ERROR] = false;
	isnull[OK_LEASED_BY] = true;
	if (arg->permanent || attempts >= arg->topic->max_attempts)
	{
		values[OK_DEAD] = BoolGetDatum(true);
		arg->died = true;
		return true;
	}
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now +
												  (arg->retry_after >= 0 ? arg->retry_after :
												   outbox_backoff(arg->topic, attempts)));
	return true;
}

/*
 * A key whose row an ack has updated (see ack_key), by key_hash, and where
 * the row's new version is: the acks of the other messages of its run read
 * it there without a probe.
 */
typedef struct OutboxAckedKey
{
	int64		hash;
	text	   *topic;
	text	   *key;
	ItemPointerData key_tid;
} OutboxAckedKey;

/*
 * A message an ack found: where it is, and its key by its hash (its topic
 * and key are read again when its turn comes, so that a call with many ids
 * keeps no copy of them).
 */
typedef struct OutboxAckMsg
{
	pg_uuid_t  *id;
	ItemPointerData msg_tid;
	ItemPointerData key_tid;	/* where its lease left the key row, or not */
	int64		key_hash;
	int64		seq;
} OutboxAckMsg;

/*
 * By key_hash, then the latest first: the ack of a run's last message,
 * whose update releases the key, then holds its row for the acks of the
 * others, which need no update of their own.  (Two keys with one hash
 * mix; acks that update both could deadlock, once in 2^64 pairs of keys.)
 */
static int
ack_msg_cmp(const void *a, const void *b)
{
	const OutboxAckMsg *x = a;
	const OutboxAckMsg *y = b;

	if (x->key_hash != y->key_hash)
		return x->key_hash < y->key_hash ? -1 : 1;
	if (x->seq != y->seq)
		return x->seq > y->seq ? -1 : 1;
	return 0;
}

/* NULL elements (0) first, then the ids in the order of their bytes */
static int
ack_id_cmp(const void *a, const void *b)
{
	Datum		x = *(const Datum *) a;
	Datum		y = *(const Datum *) b;

	if (x == (Datum) 0 || y == (Datum) 0)
		return (x != (Datum) 0) - (y != (Datum) 0);
	return memcmp(DatumGetUUIDP(x)->data, DatumGetUUIDP(y)->data, UUID_LEN);
}

/*
 * idem_outbox_ack(ids) returns int
 *
 * Each message that is the leased head of its key, or of the run leased
 * with it (the lease may have run out), is delivered: deleted, and once the
 * last message its lease handed out is, the key's next message becomes its
 * head (see ack_key).  Returns how many were; an id acked before, unknown,
 * or never leased counts 0.
 */
PG_FUNCTION_INFO_V1(idem_outbox_ack);
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	ArrayType  *ids;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			i;
	int32		acked = 0;
	IdemStore  *store;
	OutboxRels	r;
	AckArg		arg;
	HTAB	   *updated = NULL;
	OutboxAckMsg *msgs;
	int			nmsgs = 0;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not be null")));
	ids = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("ids must be a one-dimensional array")));
	deconstruct_array(ids, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR,
					  &elems, &nulls, &nelems);
	idem_check_writable("idem_outbox_ack()");
	if (nelems == 0)
		PG_RETURN_INT32(0);

	for (i = 0; i < nelems; i++)
		if (nulls[i])
			elems[i] = (Datum) 0;
	/* in the order of the ids, so that an id given twice comes twice in a row */
	qsort(elems, nelems, sizeof(Datum), ack_id_cmp);

	store = outbox_keys_open();
	outbox_open(&r, RowExclusiveLock);
	arg.now = GetCurrentTimestamp();

	/*
	 * The messages first, then their keys' rows in the order of the keys:
	 * two acks that update rows of the same keys (a relay's late ack of a
	 * run, and the ack of the relay that leased its messages again) lock
	 * them in one order, and cannot deadlock.
	 */
	msgs = palloc_extended(sizeof(OutboxAckMsg) * nelems, MCXT_ALLOC_HUGE);
	for (i = 0; i < nelems; i++)
	{
		OutboxAckMsg *m = &msgs[nmsgs];

		CHECK_FOR_INTERRUPTS();
		if (elems[i] == (Datum) 0)
			continue;
		m->id = DatumGetUUIDP(elems[i]);
		if (!outbox_recall_lease(m->id, &m->msg_tid, &m->key_tid))
		{
			ItemPointerSetInvalid(&m->msg_tid);
			ItemPointerSetInvalid(&m->key_tid);
		}
		if (!outbox_find(&r, m->id, &m->msg_tid))
			continue;
		m->msg_tid = r.slot->tts_tid;
		m->seq = DatumGetInt64(r.slot->tts_values[OB_SEQ]);
		m->key_hash = DatumGetInt64(r.slot->tts_values[OB_KEY_HASH]);
		ExecClearTuple(r.slot);
		nmsgs++;
	}
	qsort(msgs, nmsgs, sizeof(OutboxAckMsg), ack_msg_cmp);

	for (i = 0; i < nmsgs; i++)
	{
		OutboxAckMsg *m = &msgs[i];
		OutboxAckedKey *e = NULL;
		IdemStoreUpdateResult res;
		ItemPointer latest;
		text	   *topic;
		text	   *key;
		bool		kept = false;

		CHECK_FOR_INTERRUPTS();
		/* the same id given twice: acknowledged once */
		if (i > 0 && memcmp(m->id->data, msgs[i - 1].id->data, UUID_LEN) == 0)
			continue;
		/* as it stands now: deleted, or updated by hand, since */
		if (!outbox_find(&r, m->id, &m->msg_tid))
			continue;
		m->msg_tid = r.slot->tts_tid;
		topic = DatumGetTextPCopy(r.slot->tts_values[OB_TOPIC]);
		key = DatumGetTextPCopy(r.slot->tts_values[OB_KEY]);
		ExecClearTuple(r.slot);
		arg.id = m->id;
		arg.seq = m->seq;
		if (updated != NULL)
			e = hash_search(updated, &m->key_hash, HASH_FIND, NULL);
		if (e != NULL && !(outbox_text_eq(e->topic, topic) &&
						   outbox_text_eq(e->key, key)))
			e = NULL;
		arg.need_lock = (e == NULL);
		arg.acked = false;
		arg.left = false;
		arg.again = false;
		latest = (e != NULL) ? &e->key_tid : &m->key_tid;
		res = idem_store_update_at(store, latest, PointerGetDatum(topic),
								   PointerGetDatum(key), ack_key, &arg);
		if (res == IDEM_UPDATE_DONE && e == NULL)
		{
			bool		found;

			if (updated == NULL)
			{
				HASHCTL		ctl;

				ctl.keysize = sizeof(int64);
				ctl.entrysize = sizeof(OutboxAckedKey);
				ctl.hcxt = CurrentMemoryContext;
				updated = hash_create("idem outbox acked keys", 64, &ctl,
									  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
			}
			e = hash_search(updated, &m->key_hash, HASH_ENTER, &found);
			/* a hash shared with another key: that one keeps the entry */
			if (!found)
			{
				e->topic = topic;
				e->key = key;
				kept = true;
			}
			else
				e = NULL;
		}
		if (res == IDEM_UPDATE_DONE && e != NULL)
			e->key_tid = idem_store_updated_tid(store);
		if (res == IDEM_UPDATE_DONE ||
			(res == IDEM_UPDATE_DECLINED && arg.acked))
		{
			TM_FailureData tmfd;
			TM_Result	result;

			for (;;)
			{
				/* the row may have been sent by this very command */
				CommandCounterIncrement();
				result = table_tuple_delete(r.rel, &m->msg_tid,
											GetCurrentCommandId(true),
											InvalidSnapshot, InvalidSnapshot,
											true, &tmfd, false);
				/* updated by hand since it was read: its new version */
				if (result != TM_Updated || !outbox_find(&r, m->id, NULL))
					break;
				m->msg_tid = r.slot->tts_tid;
				ExecClearTuple(r.slot);
				CHECK_FOR_INTERRUPTS();
			}
			if (result == TM_Ok)
			{
				acked++;
				idem_stat_count_text(IDEM_KIND_OUTBOX, topic,
									 IDEM_OUTBOX_DELIVERED, 1);
			}
			else if (result != TM_SelfModified && result != TM_Deleted &&
					 result != TM_Updated)
				elog(ERROR, "unexpected result %d deleting from \"%s\"",
					 (int) result, RelationGetRelationName(r.rel));
			if (result == TM_Ok && arg.left)
			{
				ItemPointerData judged = idem_store_updated_tid(store);

				/*
				 * The row was judged before the message was deleted.  A lease
				 * that handed the message out again (or marked it dead), or a
				 * nack of it, locked the message after it judged the row, so
				 * the deletion waited for it: its write is seen here, and
				 * released.  Later ones find the message busy, or gone (a
				 * nack then undoes its write).  A write still in progress is
				 * not waited for (no wait here, after the deletion, so no
				 * deadlock): it is a nack's, which will find the message
				 * deleted, or an ack's, which releases the key.
				 */
				arg.again = true;
				(void) idem_store_try_update_latest(store, &judged,
													PointerGetDatum(topic),
													PointerGetDatum(key),
													ack_key, &arg);
			}
		}
		if (!kept)
		{
			pfree(topic);
			pfree(key);
		}
	}
	pfree(msgs);
	outbox_close(&r);
	idem_store_close(store);
	if (updated != NULL)
		hash_destroy(updated);
	PG_RETURN_INT32(acked);
}

/*
 * The nack's write of the key's row, in a subtransaction, and then a lock
 * of the message against its deletion, without waiting.  An ack that
 * deletes the message later waits for this transaction, and then sees the
 * write (see idem_outbox_ack); one that is deleting it, or has, makes the
 * lock fail, and the write is undone: the message was delivered.  Nothing
 * is waited for while the row is written (an ack holding the message could
 * be waiting for the row: a deadlock).  Whether the row was written.
 */
static bool
outbox_row_read(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	return false;
}

static bool
outbox_nack_write(IdemStore *store, OutboxRels *r, pg_uuid_t *id,
				  text *topic, text *key, AckArg *arg)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	bool		done;

	/*
	 * A read of the row first: the store opens what it keeps open (its
	 * index, its slots) under the transaction, not the subtransaction, and
	 * a write in progress is waited for here, before any lock is held.
	 */
	(void) idem_store_update(store, PointerGetDatum(topic),
							 PointerGetDatum(key), outbox_row_read, NULL);
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		done = (idem_store_update(store, PointerGetDatum(topic),
								  PointerGetDatum(key), nack_key, arg) == IDEM_UPDATE_DONE);
		if (done)
		{
			/* the message as it stands now, to lock its latest version */
			done = outbox_find(r, id, NULL) &&
				outbox_lock_message(r, &r->slot->tts_tid, false);
			ExecClearTuple(r->slot);
		}
		if (done)
			ReleaseCurrentSubTransaction();
		else
			RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		RollbackAndReleaseCurrentSubTransaction();
		CurrentResourceOwner = oldowner;
		PG_RE_THROW();
	}
	PG_END_TRY();
	return done;
}

/*
 * idem_outbox_nack(id, error, retry_after, relay, permanent) returns boolean
 *
 * The delivery of a leased head, or of a message of the run leased with it,
 * failed: the key may be leased again after retry_after exactly when given,
 * else after the topic's backoff, from its oldest message; once the message
 * has had the topic's maximum attempts, or at once when the failure is
 * permanent (the receiver refused the message itself), it is dead.  The
 * messages of a run after it are released with it.  Returns whether id was
 * leased so (to relay, when given).
 */
PG_FUNCTION_INFO_V1(idem_outbox_nack);
Datum
idem_outbox_nack(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *id;
	text	   *error;
	IdemStore  *store;
	OutboxRels	r;
	AckArg		arg;
	List	   *topics = NIL;
	text	   *topic;
	text	   *key;
	bool		done = false;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));
	id = PG_GETARG_UUID_P(0);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("error must not be null"),
				 errhint("Give what the broker or the endpoint answered.")));
	error = PG_GETARG_TEXT_PP(1);
	if (VARSIZE_ANY_EXHDR(error) > OUTBOX_MAX_ERROR_LEN)
	{
		/* kept short: the key row is updated in place on every delivery */
		int			len = pg_mbcliplen(VARDATA_ANY(error),
									   VARSIZE_ANY_EXHDR(error),
									   OUTBOX_MAX_ERROR_LEN);

		error = cstring_to_text_with_len(VARDATA_ANY(error), len);
	}
	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("permanent must not be null")));
	arg.permanent = PG_GETARG_BOOL(4);
	arg.relay = NULL;
	if (!PG_ARGISNULL(3))
		arg.relay = idem_arg_key(fcinfo, 3, "relay", OUTBOX_MAX_RELAY_LEN);
	arg.retry_after = -1;
	if (!PG_ARGISNULL(2))
		arg.retry_after = outbox_span(PG_GETARG_INTERVAL_P(2), "retry_after", true,
									  "Give how long to wait before the next attempt, such as '5 seconds', or NULL for the topic's backoff.");
	idem_check_writable("idem_outbox_nack()");

	store = outbox_keys_open();
	outbox_open(&r, RowExclusiveLock);
	arg.id = id;
	arg.error = error;
	arg.now = GetCurrentTimestamp();
	if (outbox_find(&r, id, NULL))
	{
		topic = DatumGetTextPCopy(r.slot->tts_values[OB_TOPIC]);
		key = DatumGetTextPCopy(r.slot->tts_values[OB_KEY]);
		arg.seq = DatumGetInt64(r.slot->tts_values[OB_SEQ]);
		ExecClearTuple(r.slot);
		arg.topic = outbox_topic(&topics, topic);
		done = outbox_nack_write(store, &r, id, topic, key, &arg);
		if (done)
			idem_stat_count_text(IDEM_KIND_OUTBOX, topic,
								 arg.died ? IDEM_OUTBOX_DEAD : IDEM_OUTBOX_RETRIED, 1);
	}
	outbox_close(&r);
	idem_store_close(store);
	PG_RETURN_BOOL(done);
}
