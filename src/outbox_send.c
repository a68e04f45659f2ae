/*-------------------------------------------------------------------------
 *
 * outbox_send.c
 *	  idem_outbox_send: a message written in the sender's transaction, and
 *	  the row of its key made sure of (see "Key rows known to exist").
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "catalog/pg_sequence.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "common/pg_prng.h"
#include "executor/executor.h"
#include "mb/pg_wchar.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "idem.h"
#include "outbox.h"

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

/*
 * entries, and bytes of their texts, past which no more keys are remembered
 * (their sends probe the key rows) until the set is forgotten
 */
#define OUTBOX_KNOWN_MAX		65536
#define OUTBOX_KNOWN_MAX_BYTES	(8 * 1024 * 1024)

static MemoryContext outbox_known_cxt = NULL;
static HTAB *outbox_known = NULL;
static Size outbox_known_bytes = 0;
static uint64 outbox_known_generation = 0;	/* how many times forgotten */
static uint64 outbox_known_stages = 0;	/* how many commits staged keys */

/* Whether idem.outbox_keys has its trigger, as seen when last checked. */
bool outbox_keys_trigger_ok = false;

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

void
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
void
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
/*
 * What this transaction probed is forgotten: a subtransaction rolled back,
 * which may have inserted a key row.
 */
void
outbox_known_keys_forget_probed(void)
{
	outbox_probed_keys = NIL;
	outbox_probed_bytes = 0;
}

/* The transaction ended without a commit: nothing it probed or staged holds. */
void
outbox_known_keys_abandon(void)
{
	outbox_known_keys_forget_probed();
	outbox_staged_keys = NULL;
	outbox_nstaged = 0;
}

void
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

/*
 * Whether idem.outbox_seq was last found with settings that keep the order
 * of sending, since pg_sequence or its pg_class row last changed.
 */
static bool outbox_seq_ok = false;
static bool outbox_seq_callback_set = false;
static uint32 outbox_seq_relhash = 0;	/* its pg_class row's, when ok */

static void
outbox_seq_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	/* pg_class changes often (statistics, temporary tables): only its row */
	if (cacheid == RELOID && hashvalue != 0 && hashvalue != outbox_seq_relhash)
		return;
	outbox_seq_ok = false;
}

/*
 * A message's seq must be greater than that of every message committed
 * before its transaction began: a sequence that hands a backend values
 * ahead (CACHE above 1), counts down, or starts again (CYCLE) would give
 * a later message of a key a smaller seq, and break the key's order
 * silently; so would an UNLOGGED sequence, which a crash sets back.
 * Checked before nextval, since a sequence's step is not undone by the
 * rollback of a refused send (a decreasing sequence would otherwise have
 * stepped back once per refusal by the time its settings are put back), and
 * after it, against the settings it used (an ALTER that committed while
 * nextval waited for its lock).  (Values a backend drew ahead are not handed
 * out after the settings are put back: ALTER SEQUENCE gives the sequence a
 * new relfilenode, which makes every backend forget them.)
 */
static void
outbox_check_seq(void)
{
	HeapTuple	tup;
	Form_pg_sequence seqform;
	int64		cache;
	int64		increment;
	bool		cycle;

	if (outbox_seq_ok)
		return;
	if (!outbox_seq_callback_set)
	{
		CacheRegisterSyscacheCallback(SEQRELID, outbox_seq_callback, (Datum) 0);
		/* SET UNLOGGED changes only pg_class */
		CacheRegisterSyscacheCallback(RELOID, outbox_seq_callback, (Datum) 0);
		outbox_seq_callback_set = true;
	}
	if (get_rel_persistence(outbox_seq_oid) != RELPERSISTENCE_PERMANENT)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sequence \"%s.%s\" would not keep outbox messages in their order of sending",
						IDEM_SCHEMA, OUTBOX_SEQ),
				 errdetail("It is UNLOGGED: after a crash it would hand out values it had handed out before."),
				 errhint("ALTER SEQUENCE %s.%s SET LOGGED;",
						 IDEM_SCHEMA, OUTBOX_SEQ)));
	tup = SearchSysCache1(SEQRELID, ObjectIdGetDatum(outbox_seq_oid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for sequence %u", outbox_seq_oid);
	seqform = (Form_pg_sequence) GETSTRUCT(tup);
	cache = seqform->seqcache;
	increment = seqform->seqincrement;
	cycle = seqform->seqcycle;
	ReleaseSysCache(tup);
	if (cache != 1 || increment <= 0 || cycle)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("sequence \"%s.%s\" would not keep outbox messages in their order of sending",
						IDEM_SCHEMA, OUTBOX_SEQ),
				 errdetail("It has CACHE " INT64_FORMAT ", INCREMENT BY " INT64_FORMAT " and %s; a send needs CACHE 1, a positive increment and NO CYCLE.",
						   cache, increment, cycle ? "CYCLE" : "NO CYCLE"),
				 errhint("ALTER SEQUENCE %s.%s CACHE 1 INCREMENT BY 1 NO CYCLE;",
						 IDEM_SCHEMA, OUTBOX_SEQ)));
	outbox_seq_relhash = GetSysCacheHashValue1(RELOID,
											   ObjectIdGetDatum(outbox_seq_oid));
	outbox_seq_ok = true;
}

static void outbox_ensure_key(text *topic, text *key, int64 key_hash);

/*
 * A leased message reaches the relay as text, in one row of the lease: a
 * row whose text cannot be made (past 1 GB) fails the whole lease, each
 * time, holding back every key, and a message a relay could not hold
 * would do much the same.  So a send refuses a message whose payload and
 * headers as text take more than OUTBOX_MAX_MESSAGE_TEXT.  The text of a
 * jsonb can be much longer than the jsonb (a control character is written
 * as six, a number such as 1e131071 as all its 131,072 digits, from 14
 * bytes: about 10,000 times at most), so it is measured by making it, for
 * the messages whose size could get there only (the text of jsonb values of
 * OUTBOX_SIZE_CHECKED_FROM bytes stays under 256 MB).  A text past 1 GB
 * fails to be made, with 54000 too.
 */
static void
outbox_check_size(Jsonb *payload, Jsonb *headers)
{
	Size		binary = VARSIZE(payload) + (headers ? VARSIZE(headers) : 0);
	Size		text = 0;
	char	   *s;

	if (binary < OUTBOX_SIZE_CHECKED_FROM)
		return;
	s = JsonbToCString(NULL, &payload->root, VARSIZE(payload));
	text += strlen(s);
	pfree(s);
	if (headers != NULL)
	{
		s = JsonbToCString(NULL, &headers->root, VARSIZE(headers));
		text += strlen(s);
		pfree(s);
	}
	if (text > OUTBOX_MAX_MESSAGE_TEXT)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox message is too large"),
				 errdetail("Its payload and headers take %zu bytes as text; a message takes at most %d.",
						   text, OUTBOX_MAX_MESSAGE_TEXT),
				 errhint("Keep large contents elsewhere, and send a reference to them.")));
}

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
	LOCKTAG		sending;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Send an empty object, {}, for a message without content.")));
	payload = outbox_arg_json(fcinfo, 2, "payload", true, false);
	if (!PG_ARGISNULL(4))
	{
		idem_check_raw_len(PG_GETARG_DATUM(4), "type", OUTBOX_MAX_TYPE_LEN);
		type = PG_GETARG_TEXT_PP(4);
		idem_check_key(type, "type", OUTBOX_MAX_TYPE_LEN);
	}
	idem_check_writable("idem_outbox_send()");
	outbox_check_size(payload, headers);
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

	/*
	 * The message.  From before its seq is drawn until it is in the primary
	 * key, a lease of the key hands out no run (see lease_run).
	 */
	outbox_lookup_relids();
	outbox_sending_locktag(&sending, key_hash);
	(void) LockAcquire(&sending, ShareLock, false, false);
	outbox_check_seq();
	seq = nextval_internal(outbox_seq_oid, false);
	outbox_check_seq();
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
	LockRelease(&sending, ShareLock, false);

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

