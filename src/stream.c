/*-------------------------------------------------------------------------
 *
 * stream.c
 *	  Ordered streams: consumer offsets and producer sequences.
 *
 * A consumer of an ordered source (a Kafka partition, say) needs no row per
 * message: it stores, in the transaction that applies a message, the offset
 * of that message, and skips any message at or below the stored offset.
 * idem.offsets has one row per (consumer, stream, partition).
 *
 * A producer that numbers its messages is deduplicated with one row of
 * idem.producer_seqs: the highest number accepted (the high-water mark) and
 * a bitmap of the last "window" numbers below and at it, bit i standing for
 * high - i.  A number above the mark moves the mark and shifts the bitmap; a
 * number inside the window is accepted once; one below the window is
 * "too_old", never silently dropped.  The bitmap has a fixed length for a
 * producer, so the row has a constant size whatever the number of messages.
 *
 * Both rows are changed through store.c's update, which judges the latest
 * version of the row and waits for a transaction changing it, as UPDATE
 * does in READ COMMITTED; no indexed column changes, so the updates are HOT
 * and the tables keep one row per partition or producer.  A missing row is
 * inserted with ON CONFLICT semantics, and a concurrent inserter of the same
 * row is waited for and its row judged once it has committed.
 *
 * Under REPEATABLE READ and SERIALIZABLE the latest version is still the one
 * judged, so that a replay is false whatever the snapshot; but an offset is
 * never stored on top of one the caller's snapshot does not see
 * (idem_store_require_snapshot): the caller would apply the message on a
 * snapshot without the effects of the one before it.  That is 40001, as
 * for INSERT ... ON CONFLICT DO UPDATE.  A producer's numbers carry no such
 * order, and are judged as claims are.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem.h"

#define OFFSETS_TABLE		"offsets"
#define OFFSETS_NKEYS		3
#define OFFSETS_NATTS		5
#define OFFSETS_CONSUMER	0
#define OFFSETS_STREAM		1
#define OFFSETS_PART		2
#define OFFSETS_OFFSET		3
#define OFFSETS_UPDATED_AT	4

#define SEQS_TABLE			"producer_seqs"
#define SEQS_NKEYS			1
#define SEQS_NATTS			5
#define SEQS_PRODUCER		0
#define SEQS_WINDOW			1
#define SEQS_HIGH			2
#define SEQS_SEEN			3
#define SEQS_UPDATED_AT		4

/* The documented range of a producer's window. */
#define SEQ_MIN_WINDOW		1
#define SEQ_MAX_WINDOW		1024

typedef enum SeqResult
{
	SEQ_ACCEPTED,
	SEQ_DUPLICATE,
	SEQ_TOO_OLD
} SeqResult;

static const char *const seq_result_labels[] = {
	"accepted", "duplicate", "too_old"
};

/* ---- arguments ---- */

static int64
stream_arg_nonneg64(FunctionCallInfo fcinfo, int argno, const char *what)
{
	int64		v;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	v = PG_GETARG_INT64(argno);
	if (v < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", what),
				 errdetail("The %s given was " INT64_FORMAT ".", what, v)));
	return v;
}

static int32
stream_arg_part(FunctionCallInfo fcinfo, int argno)
{
	int32		v;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("part must not be null")));
	v = PG_GETARG_INT32(argno);
	if (v < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("part must not be negative"),
				 errdetail("The part given was %d.", v)));
	return v;
}

/* ---- the tables ---- */

static IdemStore *
offsets_open(LOCKMODE lockmode)
{
	static const IdemColumn columns[OFFSETS_NATTS] = {
		{"consumer", TEXTOID, true, C_COLLATION_OID},
		{"stream", TEXTOID, true, C_COLLATION_OID},
		{"part", INT4OID, true, InvalidOid},
		{"offset", INT8OID, true, InvalidOid},
		{"updated_at", TIMESTAMPTZOID, true, InvalidOid}
	};
	IdemStore  *store = idem_store_open_keys(OFFSETS_TABLE, lockmode,
											 OFFSETS_NKEYS);

	idem_check_columns(idem_store_tupdesc(store), OFFSETS_TABLE, columns,
					   OFFSETS_NATTS);
	return store;
}

static IdemStore *
seqs_open(LOCKMODE lockmode)
{
	static const IdemColumn columns[SEQS_NATTS] = {
		{"producer", TEXTOID, true, C_COLLATION_OID},
		{"window", INT4OID, true, InvalidOid},
		{"high", INT8OID, true, InvalidOid},
		{"seen", BYTEAOID, true, InvalidOid},
		{"updated_at", TIMESTAMPTZOID, true, InvalidOid}
	};
	IdemStore  *store = idem_store_open_keys(SEQS_TABLE, lockmode, SEQS_NKEYS);

	idem_check_columns(idem_store_tupdesc(store), SEQS_TABLE, columns,
					   SEQS_NATTS);
	return store;
}

/* ---- offsets ---- */

typedef struct OffsetAdvance
{
	int64		offset;
	TimestampTz now;
} OffsetAdvance;

/* "UPDATE ... SET offset = $4 WHERE offset < $4" on the latest version */
static bool
offset_advance_row(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	OffsetAdvance *a = arg;

	if (!isnull[OFFSETS_OFFSET] &&
		DatumGetInt64(values[OFFSETS_OFFSET]) >= a->offset)
		return false;
	values[OFFSETS_OFFSET] = Int64GetDatum(a->offset);
	isnull[OFFSETS_OFFSET] = false;
	values[OFFSETS_UPDATED_AT] = TimestampTzGetDatum(a->now);
	isnull[OFFSETS_UPDATED_AT] = false;
	return true;
}

/*
 * idem_offset_advance(consumer, stream, part, offset) returns boolean
 *
 * true, and the offset stored, when offset is beyond the stored one (or none
 * is stored): apply the message.  false when it is at or below it: a replay.
 */
PG_FUNCTION_INFO_V1(idem_offset_advance);
Datum
idem_offset_advance(PG_FUNCTION_ARGS)
{
	text	   *consumer = idem_arg_key(fcinfo, 0, "consumer", IDEM_MAX_KEY_LEN);
	text	   *stream = idem_arg_key(fcinfo, 1, "stream", IDEM_MAX_KEY_LEN);
	int32		part = stream_arg_part(fcinfo, 2);
	int64		offset = stream_arg_nonneg64(fcinfo, 3, "offset");
	OffsetAdvance a;
	IdemStore  *store;
	Datum		keys[OFFSETS_NKEYS];
	bool		advanced = false;

	idem_check_writable("idem_offset_advance()");
	a.offset = offset;
	a.now = GetCurrentTransactionStartTimestamp();
	keys[OFFSETS_CONSUMER] = PointerGetDatum(consumer);
	keys[OFFSETS_STREAM] = PointerGetDatum(stream);
	keys[OFFSETS_PART] = Int32GetDatum(part);

	store = offsets_open(RowExclusiveLock);
	/*
	 * message n + 1 is applied on a snapshot that has message n's effects,
	 * also when an offset the snapshot sees was forgotten since (a reset to
	 * NULL): the first offset stored again would rest on that snapshot
	 */
	idem_store_require_snapshot_insert(store);
	for (;;)
	{
		IdemStoreUpdateResult u;
		Datum		values[OFFSETS_NATTS];
		bool		isnull[OFFSETS_NATTS] = {false};

		u = idem_store_update_keys(store, keys, offset_advance_row, &a);
		if (u != IDEM_UPDATE_ABSENT)
		{
			advanced = (u == IDEM_UPDATE_DONE);
			break;
		}
		values[OFFSETS_CONSUMER] = keys[OFFSETS_CONSUMER];
		values[OFFSETS_STREAM] = keys[OFFSETS_STREAM];
		values[OFFSETS_PART] = keys[OFFSETS_PART];
		values[OFFSETS_OFFSET] = Int64GetDatum(offset);
		values[OFFSETS_UPDATED_AT] = TimestampTzGetDatum(a.now);
		if (idem_store_insert(store, values, isnull, IDEM_WAIT) ==
			IDEM_STORE_INSERTED)
		{
			advanced = true;
			break;
		}
		/* a concurrent first advance committed its row: judge it */
	}
	idem_store_close(store);
	PG_RETURN_BOOL(advanced);
}

/*
 * idem_offset_get(consumer, stream, part) returns bigint
 *
 * The stored offset as committed, or as this transaction left it; NULL when
 * none is stored.  An advance in progress in another transaction is not
 * seen and not waited for.
 */
PG_FUNCTION_INFO_V1(idem_offset_get);
Datum
idem_offset_get(PG_FUNCTION_ARGS)
{
	text	   *consumer = idem_arg_key(fcinfo, 0, "consumer", IDEM_MAX_KEY_LEN);
	text	   *stream = idem_arg_key(fcinfo, 1, "stream", IDEM_MAX_KEY_LEN);
	int32		part = stream_arg_part(fcinfo, 2);
	IdemStore  *store;
	Datum		keys[OFFSETS_NKEYS];
	Datum		values[OFFSETS_NATTS];
	bool		isnull[OFFSETS_NATTS];
	bool		found;

	keys[OFFSETS_CONSUMER] = PointerGetDatum(consumer);
	keys[OFFSETS_STREAM] = PointerGetDatum(stream);
	keys[OFFSETS_PART] = Int32GetDatum(part);
	store = offsets_open(AccessShareLock);
	found = idem_store_read_keys(store, keys, values, isnull);
	idem_store_close(store);
	if (!found || isnull[OFFSETS_OFFSET])
		PG_RETURN_NULL();
	PG_RETURN_INT64(DatumGetInt64(values[OFFSETS_OFFSET]));
}

/* ---- producer sequences ---- */

#define SEQ_BYTES(window)	(((window) + 7) / 8)

static inline bool
seq_bit(const uint8 *bits, int64 i)
{
	return (bits[i / 8] >> (i % 8)) & 1;
}

static inline void
seq_set_bit(uint8 *bits, int64 i)
{
	bits[i / 8] |= (uint8) (1 << (i % 8));
}

/*
 * Move every bit of the bitmap k places up (bit i becomes bit i + k), the
 * bits that leave the window dropped and the ones that enter it clear.
 */
static void
seq_shift(uint8 *bits, int window, int64 k)
{
	int			nbytes = SEQ_BYTES(window);
	int			bytes;
	int			shift;
	int			j;

	if (k >= window)
	{
		memset(bits, 0, nbytes);
		return;
	}
	bytes = (int) (k / 8);
	shift = (int) (k % 8);
	for (j = nbytes - 1; j >= 0; j--)
	{
		uint8		v = 0;

		if (j - bytes >= 0)
			v = (uint8) (bits[j - bytes] << shift);
		if (shift > 0 && j - bytes - 1 >= 0)
			v |= (uint8) (bits[j - bytes - 1] >> (8 - shift));
		bits[j] = v;
	}
	/* no bit beyond the window */
	if (window % 8 != 0)
		bits[nbytes - 1] &= (uint8) ((1 << (window % 8)) - 1);
}

typedef struct SeqAccept
{
	text	   *producer;
	int64		seq;
	int32		window;
	TimestampTz now;
	SeqResult	result;
} SeqAccept;

static bool
seq_accept_row(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	SeqAccept  *a = arg;
	int32		window = DatumGetInt32(values[SEQS_WINDOW]);
	int64		high = DatumGetInt64(values[SEQS_HIGH]);
	bytea	   *seen = DatumGetByteaPCopy(values[SEQS_SEEN]);
	uint8	   *bits = (uint8 *) VARDATA(seen);

	/* sequence numbers are not negative: a row that says otherwise was written by hand */
	if (window < SEQ_MIN_WINDOW || window > SEQ_MAX_WINDOW ||
		(int) VARSIZE_ANY_EXHDR(seen) != SEQ_BYTES(window) || high < 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("row of producer \"%s\" in \"%s.%s\" is malformed",
						text_to_cstring(a->producer), IDEM_SCHEMA, SEQS_TABLE),
				 errdetail("Its window is %d, its bitmap %zu bytes long and its highest sequence number " INT64_FORMAT ".",
						   window, VARSIZE_ANY_EXHDR(seen), high)));
	if (window != a->window)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("window of producer \"%s\" is %d, not %d",
						text_to_cstring(a->producer), window, a->window),
				 errdetail("A producer's window is set by its first sequence number and cannot change."),
				 errhint("Pass the producer's window, or use a new producer name.")));

	if (a->seq > high)
	{
		seq_shift(bits, window, a->seq - high);
		seq_set_bit(bits, 0);
		values[SEQS_HIGH] = Int64GetDatum(a->seq);
	}
	else if (high - a->seq >= window)
	{
		a->result = SEQ_TOO_OLD;
		return false;
	}
	else if (seq_bit(bits, high - a->seq))
	{
		a->result = SEQ_DUPLICATE;
		return false;
	}
	else
		seq_set_bit(bits, high - a->seq);
	values[SEQS_SEEN] = PointerGetDatum(seen);
	values[SEQS_UPDATED_AT] = TimestampTzGetDatum(a->now);
	a->result = SEQ_ACCEPTED;
	return true;
}

/*
 * idem_seq_accept(producer, seq, window) returns idem_seq_result
 *
 * 'accepted' the first time a number above the window's floor is seen,
 * 'duplicate' when it was accepted before, 'too_old' when it is "window" or
 * more below the highest number accepted.
 */
PG_FUNCTION_INFO_V1(idem_seq_accept);
Datum
idem_seq_accept(PG_FUNCTION_ARGS)
{
	text	   *producer = idem_arg_key(fcinfo, 0, "producer", IDEM_MAX_KEY_LEN);
	int64		seq = stream_arg_nonneg64(fcinfo, 1, "seq");
	int32		window;
	SeqAccept	a;
	IdemStore  *store;
	Datum		keys[SEQS_NKEYS];

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("window must not be null")));
	window = PG_GETARG_INT32(2);
	if (window < SEQ_MIN_WINDOW || window > SEQ_MAX_WINDOW)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("window must be between %d and %d",
						SEQ_MIN_WINDOW, SEQ_MAX_WINDOW),
				 errdetail("The window given was %d.", window)));
	idem_check_writable("idem_seq_accept()");

	a.producer = producer;
	a.seq = seq;
	a.window = window;
	a.now = GetCurrentTransactionStartTimestamp();
	a.result = SEQ_ACCEPTED;
	keys[SEQS_PRODUCER] = PointerGetDatum(producer);

	store = seqs_open(RowExclusiveLock);
	for (;;)
	{
		IdemStoreUpdateResult u;
		Datum		values[SEQS_NATTS];
		bool		isnull[SEQS_NATTS] = {false};
		bytea	   *seen;

		u = idem_store_update_keys(store, keys, seq_accept_row, &a);
		if (u != IDEM_UPDATE_ABSENT)
			break;
		seen = palloc0(VARHDRSZ + SEQ_BYTES(window));
		SET_VARSIZE(seen, VARHDRSZ + SEQ_BYTES(window));
		seq_set_bit((uint8 *) VARDATA(seen), 0);
		values[SEQS_PRODUCER] = keys[SEQS_PRODUCER];
		values[SEQS_WINDOW] = Int32GetDatum(window);
		values[SEQS_HIGH] = Int64GetDatum(seq);
		values[SEQS_SEEN] = PointerGetDatum(seen);
		values[SEQS_UPDATED_AT] = TimestampTzGetDatum(a.now);
		if (idem_store_insert(store, values, isnull, IDEM_WAIT) ==
			IDEM_STORE_INSERTED)
		{
			a.result = SEQ_ACCEPTED;
			break;
		}
		/* a concurrent first call committed its row: judge it */
	}
	idem_store_close(store);
	PG_RETURN_OID(idem_enum_label_oid(fcinfo, (int) a.result,
									  seq_result_labels,
									  lengthof(seq_result_labels)));
}
