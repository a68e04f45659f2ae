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
 * the rate of senders.  See "Waking relays" in outbox_wake.c.
 *
 * Times of leases and backoffs are read from the clock, not the start of
 * the transaction: a relay's transaction may be old.
 *
 * This file holds what the others share: the relations, the arguments,
 * the topics' settings, the ids, and the look-ups of messages.  The send
 * and the key rows known to exist are in outbox_send.c, the wake-ups and
 * the transaction callbacks in outbox_wake.c, the lease in outbox_lease.c,
 * the ack and the nack in outbox_ack.c; outbox.h declares what they share.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/table.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_trigger.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/procarray.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "idem.h"
#include "outbox.h"

/*
 * OIDs of the outbox's relations, looked up by name once per backend and
 * forgotten when the relcache says one of them changed.
 */
Oid	outbox_relid = InvalidOid;
Oid	outbox_pkey_oid = InvalidOid;
Oid	outbox_seq_oid = InvalidOid;
Oid	outbox_keys_relid = InvalidOid;
Oid	outbox_topics_relid = InvalidOid;
Oid	outbox_topics_pkey_oid = InvalidOid;

/*
 * Whether the columns and indexes of idem.outbox, and the columns of
 * idem.outbox_keys, were found as idem made them since the relcache last
 * said one of the relations changed: a send need not compare every column's
 * name again.
 */
bool outbox_checked = false;
bool outbox_keys_checked = false;

void
idem_outbox_relcache(Oid relid)
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

void
idem_outbox_init(void)
{
	outbox_wake_init();
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

void
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
bool outbox_direct_index = false;
MemoryContext outbox_index_cxt = NULL;
IndexInfo *outbox_pkey_info = NULL;

/*
 * The message table and its primary key, opened for one call.
 */

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

void
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
	r->pkey_nblocks = InvalidBlockNumber;
}

void
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

IdemStore *
outbox_keys_open(void)
{
	return outbox_keys_open_lock(RowExclusiveLock);
}

/* The same, opened with lockmode: below RowExclusiveLock, to read only. */
IdemStore *
outbox_keys_open_lock(LOCKMODE lockmode)
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
		{"leased_max", INT8OID, false, InvalidOid},
		{"attempts_kept", INT8ARRAYOID, false, InvalidOid},
		{"dead_kept", INT8OID, false, InvalidOid},
		{"error_kept", TEXTOID, false, InvalidOid}
	};
	IdemStore  *store;

	/* the relids, so that the callback knows this table's */
	outbox_lookup_relids();
	store = idem_store_open(OUTBOX_KEYS_TABLE, lockmode);
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

Jsonb *
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

void
outbox_check_utf8_text(const char *what, text *t)
{
	if (t != NULL)
		outbox_check_utf8(what, VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

void
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
int64
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

static int64
outbox_topic_span(Datum d)
{
	Interval   *span = DatumGetIntervalP(d);

	/* idem_outbox_configure checked it; a row written by hand is bounded */
	if (span->month != 0 || span->day < 0 || span->time < 0)
		return USECS_PER_SEC;
	return Min(span->day, 1) * USECS_PER_DAY + Min(span->time, USECS_PER_DAY);
}

/* topics a cache searches in a list before it makes a hash table */
#define OUTBOX_TOPIC_LIST_MAX	8

/* An entry of a cache's hash table: its key is the topic of t. */
typedef struct OutboxTopicEntry
{
	text	   *topic;
	OutboxTopic *t;
} OutboxTopicEntry;

static uint32
outbox_topic_hash(const void *key, Size keysize)
{
	text	   *topic = *(text *const *) key;

	return hash_bytes((const unsigned char *) VARDATA_ANY(topic),
					  VARSIZE_ANY_EXHDR(topic));
}

static int
outbox_topic_match(const void *a, const void *b, Size keysize)
{
	return outbox_text_eq(*(text *const *) a, *(text *const *) b) ? 0 : 1;
}

static void
outbox_topic_enter(HTAB *hash, OutboxTopic *t)
{
	OutboxTopicEntry *e = hash_search(hash, &t->topic, HASH_ENTER, NULL);

	e->topic = t->topic;
	e->t = t;
}

/*
 * The settings of a topic, from idem.outbox_topics or the defaults.  The
 * topics are remembered for the length of one call in *cache, in the
 * caller's memory context, with a copy of their name: the name given may
 * point into a buffer the caller's scan lets go of, and another row's topic
 * come to lie there.  A call that meets many topics (a redrive of them all,
 * the statistics) finds each through a hash table.
 */
OutboxTopic *
outbox_topic(OutboxTopicCache *cache, text *topic)
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

	if (cache->hash != NULL)
	{
		OutboxTopicEntry *e = hash_search(cache->hash, &topic, HASH_FIND,
										  NULL);

		if (e != NULL)
			return e->t;
	}
	else
	{
		foreach(lc, cache->list)
		{
			t = lfirst(lc);
			if (outbox_text_eq(t->topic, topic))
				return t;
		}
	}

	t = palloc(sizeof(OutboxTopic));
	t->topic = (text *) PG_DETOAST_DATUM_COPY(PointerGetDatum(topic));
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
	idem_check_readable(rel, OUTBOX_TOPICS_TABLE);
	idem_check_index(index, rel, 1, topic_cols);
	/* a table changed otherwise must not make every topic's settings go */
	idem_check_columns(RelationGetDescr(rel), OUTBOX_TOPICS_TABLE,
					   topic_columns, OT_NATTS);
	{
		snap = RegisterSnapshot(GetLatestSnapshot());
		slot = table_slot_create(rel, NULL);
		ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ,
					PointerGetDatum(t->topic));
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

	if (cache->hash != NULL)
		outbox_topic_enter(cache->hash, t);
	else
	{
		cache->list = lappend(cache->list, t);
		if (list_length(cache->list) > OUTBOX_TOPIC_LIST_MAX)
		{
			HASHCTL		ctl;

			ctl.keysize = sizeof(text *);
			ctl.entrysize = sizeof(OutboxTopicEntry);
			ctl.hash = outbox_topic_hash;
			ctl.match = outbox_topic_match;
			ctl.hcxt = CurrentMemoryContext;
			cache->hash = hash_create("idem outbox topics", 64, &ctl,
									  HASH_ELEM | HASH_FUNCTION |
									  HASH_COMPARE | HASH_CONTEXT);
			foreach(lc, cache->list)
				outbox_topic_enter(cache->hash, lfirst(lc));
		}
	}
	return t;
}

/*
 * The wait before the next attempt after "attempts" failed ones:
 * exponential, bounded by backoff_max, with jitter that spreads retries of
 * many messages over the second half of the wait.
 */
int64
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

int64
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
/* OUTBOX_PREFIX_BITS and the others, and outbox_hash_prefix: outbox.h */

void
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

/*
 * The lock a sender holds in SHARE mode from before it draws its message's
 * seq until the message is in the primary key, and a lease that would hand
 * out a run tries in ROW EXCLUSIVE mode (which conflicts with SHARE, and not
 * with another lease's) before it reads the key's messages: the one message
 * a run could not see while it passed over its seq (see lease_run).  An
 * advisory lock of the database named by the key's hash, with an objsubid
 * that neither pg_advisory_* (1 and 2), the relays' idle lock (3) nor Citus
 * (4 to 16) uses.
 */
void
outbox_sending_locktag(LOCKTAG *tag, int64 key_hash)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) ((uint64) key_hash >> 32),
						 (uint32) key_hash, OUTBOX_SENDING_LOCK_ID4);
}

/* The seq an id was made with (see outbox_make_id). */
int64
outbox_id_seq(const pg_uuid_t *id)
{
	uint64		hi = 0;
	uint64		lo = 0;
	int			i;

	for (i = 0; i < 8; i++)
	{
		hi = (hi << 8) | id->data[i];
		lo = (lo << 8) | id->data[8 + i];
	}
	return (int64) ((((hi >> 16) & 0xFFFF) << 32) | ((hi & 0xFFF) << 20) |
					((lo >> 42) & 0xFFFFF));
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
void
outbox_key_range(ScanKey skeys, pg_uuid_t *lo, pg_uuid_t *hi, int64 key_hash)
{
	outbox_make_id(lo, key_hash, 0, 0);
	outbox_make_id(hi, key_hash, OUTBOX_SEQ_MAX, OUTBOX_RANDOM_MASK);
	ScanKeyInit(&skeys[0], 1, BTGreaterEqualStrategyNumber, F_UUID_GE,
				UUIDPGetDatum(lo));
	ScanKeyInit(&skeys[1], 1, BTLessEqualStrategyNumber, F_UUID_LE,
				UUIDPGetDatum(hi));
}

/*
 * Find a message by its id, as it stands now (the latest committed
 * version, or this transaction's).  Leaves its columns in r->slot.  When
 * tid is given, the row there is taken if it is visible and has the id.
 */
bool
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

/*
 * Whether the message version in slot (pinned, found under a snapshot) is
 * being deleted or updated by a transaction that has not ended, or was by
 * one that committed: an ack of it that has not committed, or committed
 * after the snapshot.  Locks alone say no.
 */
bool
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
 * message (or has locked it so); in any case false when it is gone.  Also
 * false while another transaction is updating the message (an UPDATE by
 * hand): the lock would hold on the version being replaced but not on the
 * new one, which an ack could then delete without waiting for us.
 */
bool
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
	if (result == TM_Ok && outbox_message_busy(slot))
		result = TM_WouldBlock;
	ExecDropSingleTupleTableSlot(slot);
	return result == TM_Ok;
}

/*
 * Whether a message is there, as it stands now, or a transaction that has
 * not committed is deleting it.  r->slot is left as it was.
 */
bool
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

