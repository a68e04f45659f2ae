/*-------------------------------------------------------------------------
 *
 * outbox_ack.c
 *	  idem_outbox_ack and idem_outbox_nack: a leased message delivered, or
 *	  failed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/tableam.h"
#include "miscadmin.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "idem.h"
#include "outbox.h"

/*
 * ---- Ack and nack ----
 */

/*
 * The columns ack_key reads of a key row it wrote (and every column's null
 * flag), as plain values: an ack that wrote a key's row holds it until its
 * transaction ends, so the acks of the key's other messages in the same
 * call judge this copy instead of reading the row again (see
 * ack_key_kept).
 */
typedef struct AckKeptRow
{
	bool		isnull[OK_NATTS];
	bool		dead;
	int32		attempts;
	TimestampTz available_at;
	int64		leased_through;
	pg_uuid_t	head_id;
} AckKeptRow;

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
	OutboxRels *rels;
	OutboxTopic *topic;
	text	   *error;
	int64		retry_after;	/* -1: backoff */
	text	   *relay;			/* NULL: any relay's lease */
	bool		permanent;		/* dead at once */
	bool		died;
	/* ack: the row it is about to write */
	AckKeptRow	row;
} AckArg;

static void
ack_keep_row(AckArg *arg, Datum *values, bool *isnull)
{
	AckKeptRow *k = &arg->row;

	memcpy(k->isnull, isnull, sizeof(k->isnull));
	k->dead = DatumGetBool(values[OK_DEAD]);
	k->attempts = DatumGetInt32(values[OK_ATTEMPTS]);
	k->available_at = DatumGetTimestampTz(values[OK_AVAILABLE_AT]);
	k->leased_through = isnull[OK_LEASED_THROUGH] ? 0 :
		DatumGetInt64(values[OK_LEASED_THROUGH]);
	if (!isnull[OK_HEAD_ID])
		memcpy(&k->head_id, DatumGetUUIDP(values[OK_HEAD_ID]), UUID_LEN);
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
	{
		if (arg->need_lock)
			ack_keep_row(arg, values, isnull);
		return arg->need_lock;
	}
	values[OK_DEAD] = BoolGetDatum(false);
	values[OK_ATTEMPTS] = Int32GetDatum(0);
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now);
	isnull[OK_HEAD_ID] = true;
	isnull[OK_LEASED_BY] = true;
	isnull[OK_LAST_ERROR] = true;
	ack_keep_row(arg, values, isnull);
	return true;
}

/*
 * Whether the key has a message before the one nacked, as it stands now: one
 * a transaction is deleting counts (its ack may yet roll back; if it
 * commits, the nacked message is the head, dead as it would be now).
 */
static bool
nack_earlier_message(AckArg *arg, Datum *values)
{
	bool		busy = false;
	bool		earlier;

	if (!outbox_head(arg->rels, values[OK_TOPIC], values[OK_KEY], &busy))
		return false;
	earlier = busy ||
		DatumGetInt64(arg->rels->slot->tts_values[OB_SEQ]) < arg->seq;
	ExecClearTuple(arg->rels->slot);
	return earlier;
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
	/* a message of a run was leased once, with the run */
	attempts = is_head ? DatumGetInt32(values[OK_ATTEMPTS]) : 1;
	arg->died = arg->permanent || attempts >= arg->topic->max_attempts;
	isnull[OK_LEASED_BY] = true;
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now +
												  (arg->retry_after >= 0 ? arg->retry_after :
												   outbox_backoff(arg->topic, attempts)));
	if (!is_head && arg->died && nack_earlier_message(arg, values))
	{
		/*
		 * A message of the run before it is still to be acknowledged (its
		 * ack was lost, or is being made): that one is leased again first,
		 * at its next attempt, and this one is dead once it is the head
		 * (see lease_key), with this error.  The row goes on naming the
		 * run's head.
		 */
		values[OK_DEAD_KEPT] = Int64GetDatum(arg->seq);
		isnull[OK_DEAD_KEPT] = false;
		values[OK_ERROR_KEPT] = PointerGetDatum(arg->error);
		isnull[OK_ERROR_KEPT] = false;
		return true;
	}
	if (!is_head)
	{
		/*
		 * The messages of the run before it were delivered: it is the head
		 * the next lease retries, once they are acknowledged, at its second
		 * attempt.
		 */
		values[OK_HEAD_ID] = UUIDPGetDatum(arg->id);
		isnull[OK_HEAD_ID] = false;
		values[OK_ATTEMPTS] = Int32GetDatum(attempts);
	}
	values[OK_LAST_ERROR] = PointerGetDatum(arg->error);
	isnull[OK_LAST_ERROR] = false;
	if (arg->died)
		values[OK_DEAD] = BoolGetDatum(true);
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
	bool		valid;			/* row is that version's */
	AckKeptRow	row;
} OutboxAckedKey;

/*
 * The ack of a message of a key whose row this call wrote, judged on the
 * copy of what it wrote: true when ack_key declines to write the row, as
 * it would on the row itself (arg->acked then says whether the message is
 * acknowledged).  False when the row is to be written, or left to a second
 * look: the caller then goes through the row itself.  The columns ack_key
 * does not read are 0 here.
 */
static bool
ack_key_kept(OutboxAckedKey *e, AckArg *arg)
{
	AckKeptRow *k = &e->row;
	Datum		values[OK_NATTS];
	bool		isnull[OK_NATTS];
	int			i;

	for (i = 0; i < OK_NATTS; i++)
		values[i] = (Datum) 0;
	memcpy(isnull, k->isnull, sizeof(isnull));
	values[OK_DEAD] = BoolGetDatum(k->dead);
	values[OK_ATTEMPTS] = Int32GetDatum(k->attempts);
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(k->available_at);
	if (!isnull[OK_LEASED_THROUGH])
		values[OK_LEASED_THROUGH] = Int64GetDatum(k->leased_through);
	if (!isnull[OK_HEAD_ID])
		values[OK_HEAD_ID] = UUIDPGetDatum(&k->head_id);
	if (ack_key(NULL, values, isnull, arg) || arg->left)
	{
		arg->acked = false;
		arg->left = false;
		return false;
	}
	return true;
}

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
	/* ids given twice come next to each other (two rows may share a seq) */
	return memcmp(x->id->data, y->id->data, UUID_LEN);
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

		/*
		 * A message this session leased: its key and seq are known (an id
		 * has its seq), and the second pass reads it where it was.
		 */
		if (outbox_recall_lease(m->id, &m->msg_tid, &m->key_tid,
								&m->key_hash))
		{
			m->seq = outbox_id_seq(m->id);
			nmsgs++;
			continue;
		}
		ItemPointerSetInvalid(&m->msg_tid);
		ItemPointerSetInvalid(&m->key_tid);
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
		m->seq = DatumGetInt64(r.slot->tts_values[OB_SEQ]);
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
		if (e != NULL && e->valid && ack_key_kept(e, &arg))
			res = IDEM_UPDATE_DECLINED;
		else
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
		{
			e->key_tid = idem_store_updated_tid(store);
			e->row = arg.row;
			e->valid = true;
		}
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
				/* nothing written since, as a look at it would say */
				if (!idem_store_version_untouched(store, &judged) &&
					idem_store_try_update_latest(store, &judged,
												 PointerGetDatum(topic),
												 PointerGetDatum(key),
												 ack_key, &arg) ==
					IDEM_UPDATE_DONE && e != NULL)
					e->valid = false;
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
 * lock fail, and the write is undone: the message was delivered.  The
 * message is not waited for while the row is written (an ack holding the
 * message could be waiting for the row: a deadlock).  The row is: a lease,
 * ack or nack that holds it waits for nothing of this transaction's, unless
 * this transaction holds other key rows, which is why the nacks of one
 * transaction come in the order of their keys (as idem-relay's do, after
 * its acks).  Whether the row was written.
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
	OutboxTopicCache topics = OUTBOX_TOPIC_CACHE_INIT;
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
	/* no more than is kept is read of a long one */
	error = PG_GETARG_TEXT_P_SLICE(1, 0, OUTBOX_MAX_ERROR_LEN + MAX_MULTIBYTE_CHAR_LEN);
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
	arg.rels = &r;
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
