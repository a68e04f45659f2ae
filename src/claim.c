/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  Consumer dedup: idem_claim and its variants.
 *
 * A claim is a row (ns, msg_id, claimed_at) of idem.claims, inserted in the
 * caller's transaction: it commits or rolls back with the business write
 * beside it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "idem.h"

/*
 * The most ids one idem_claim_batch call takes: it sorts them, and answers
 * for each, in memory (about 40 bytes an id).
 */
#define CLAIM_MAX_BATCH		10000000

#define CLAIMS_TABLE	"claims"
#define CLAIMS_NATTS	3

static const char *const claim_result_labels[] = {
	"claimed", "duplicate", "in_flight"
};

static IdemStoreResult
claim_one(IdemStore *store, text *ns, text *msg_id, IdemStoreWait wait)
{
	Datum		values[CLAIMS_NATTS];
	bool		isnull[CLAIMS_NATTS] = {false, false, false};

	IdemStoreResult r;
	uint64		waits = idem_store_waits;

	values[0] = PointerGetDatum(ns);
	values[1] = PointerGetDatum(msg_id);
	values[2] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	r = idem_store_insert(store, values, isnull, wait);
	idem_stat_count_text(IDEM_KIND_CLAIM, ns,
						 r == IDEM_STORE_INSERTED ? IDEM_CLAIM_CLAIMED :
						 r == IDEM_STORE_EXISTS ? IDEM_CLAIM_DUPLICATE :
						 IDEM_CLAIM_IN_FLIGHT, 1);
	if (idem_store_waits != waits)
		idem_stat_count_text(IDEM_KIND_CLAIM, ns, IDEM_CLAIM_WAITED, 1);
	return r;
}

static void
check_claims_shape(IdemStore *store)
{
	static const IdemColumn columns[CLAIMS_NATTS] = {
		{"ns", TEXTOID, true, C_COLLATION_OID},
		{"msg_id", TEXTOID, true, C_COLLATION_OID},
		{"claimed_at", TIMESTAMPTZOID, false, InvalidOid}
	};

	idem_check_columns(idem_store_tupdesc(store), CLAIMS_TABLE, columns,
					   CLAIMS_NATTS);
}

static IdemStore *
claims_open_for_write(const char *fname)
{
	IdemStore  *store;

	idem_check_writable(fname);
	store = idem_store_open(CLAIMS_TABLE, RowExclusiveLock);
	check_claims_shape(store);
	return store;
}

/*
 * idem_claim(msg_id, ns) returns boolean
 *
 * true when this transaction is the first to claim (ns, msg_id); false when
 * it is claimed already.  An uncommitted claim of another transaction is
 * waited for.
 */
PG_FUNCTION_INFO_V1(idem_claim);
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	text	   *msg_id = idem_arg_key(fcinfo, 0, "msg_id", IDEM_MAX_KEY_LEN);
	text	   *ns = idem_arg_ns(fcinfo, 1);
	IdemStore  *store;
	IdemStoreResult r;

	store = claims_open_for_write("idem_claim()");
	r = claim_one(store, ns, msg_id, IDEM_WAIT);
	idem_store_close(store);
	PG_RETURN_BOOL(r == IDEM_STORE_INSERTED);
}

/*
 * idem_try_claim(msg_id, ns) returns idem_claim_result
 *
 * Like idem_claim but never waits for another transaction.
 */
PG_FUNCTION_INFO_V1(idem_try_claim);
Datum
idem_try_claim(PG_FUNCTION_ARGS)
{
	text	   *msg_id = idem_arg_key(fcinfo, 0, "msg_id", IDEM_MAX_KEY_LEN);
	text	   *ns = idem_arg_ns(fcinfo, 1);
	IdemStore  *store;
	IdemStoreResult r;
	int			label;

	store = claims_open_for_write("idem_try_claim()");
	r = claim_one(store, ns, msg_id, IDEM_NOWAIT);
	idem_store_close(store);

	switch (r)
	{
		case IDEM_STORE_INSERTED:
			label = 0;
			break;
		case IDEM_STORE_EXISTS:
			label = 1;
			break;
		default:
			label = 2;
			break;
	}
	PG_RETURN_OID(idem_enum_label_oid(fcinfo, label, claim_result_labels,
									  lengthof(claim_result_labels)));
}

/* An element of a batch, with its place in the array. */
typedef struct BatchItem
{
	const char *data;
	int			len;
	int			pos;
} BatchItem;

/*
 * The order a batch is claimed in: the order of the primary key (msg_id is
 * of collation "C": bytes, then length), then the place in the array, so
 * that a repeated id is claimed by its first occurrence.
 */
static int
batch_item_cmp(const void *a, const void *b)
{
	const BatchItem *x = (const BatchItem *) a;
	const BatchItem *y = (const BatchItem *) b;
	int			r = memcmp(x->data, y->data, Min(x->len, y->len));

	if (r != 0)
		return r;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return x->pos < y->pos ? -1 : (x->pos > y->pos ? 1 : 0);
}

/*
 * idem_claim_batch(msg_ids text[], ns) returns boolean[]
 *
 * One result per element, in order.  Every element is checked before
 * anything is written.  Per-element memory is reset as we go, and claiming
 * takes no lock that outlives the element, so the size of a batch is bounded
 * by the array, not by the lock table.
 */
PG_FUNCTION_INFO_V1(idem_claim_batch);
Datum
idem_claim_batch(PG_FUNCTION_ARGS)
{
	ArrayType  *arr;
	text	   *ns;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;
	int			len;
	int			lbound;
	Datum	   *results;
	BatchItem  *items;
	IdemStore  *store;
	MemoryContext elemcxt;
	MemoryContext oldcxt;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("msg_ids must not be null"),
				 errhint("Pass an array of message ids, possibly empty.")));
	ns = idem_arg_ns(fcinfo, 1);
	arr = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("msg_ids must be a one-dimensional array"),
				 errdetail("The array given has %d dimensions.", ARR_NDIM(arr))));

	/* what one call can sort and answer in memory */
	if (ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr)) > CLAIM_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many msg_ids in one batch"),
				 errdetail("The array has %d elements; the limit is %d.",
						   ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr)),
						   CLAIM_MAX_BATCH),
				 errhint("Claim the ids in several batches.")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	/* the answer keeps the subscripts of the ids, which errors name */
	lbound = ARR_NDIM(arr) == 1 ? ARR_LBOUND(arr)[0] : 1;
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("msg_ids must not contain null"),
					 errdetail("Element %d is null.", lbound + i)));
		len = VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i]));
		/* as idem_check_key, but saying which element */
		if (len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("msg_ids must not contain an empty string"),
					 errdetail("Element %d is empty.", lbound + i),
					 errhint("Give a non-empty identifier.")));
		if (len > IDEM_MAX_KEY_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
					 errmsg("msg_id is too long"),
					 errdetail("Element %d is %d bytes long; the limit is %d bytes.",
							   lbound + i, len, IDEM_MAX_KEY_LEN)));
	}

	idem_check_writable("idem_claim_batch()");
	results = palloc(Max(n, 1) * sizeof(Datum));
	if (n > 0)
	{
		/*
		 * Claim in key order: two batches that share ids then wait for each
		 * other in one direction only and cannot deadlock, and neighbouring
		 * claims touch neighbouring index pages.
		 */
		items = palloc(n * sizeof(BatchItem));
		for (i = 0; i < n; i++)
		{
			text	   *t = (text *) DatumGetPointer(elems[i]);

			items[i].data = VARDATA_ANY(t);
			items[i].len = VARSIZE_ANY_EXHDR(t);
			items[i].pos = i;
		}
		qsort(items, n, sizeof(BatchItem), batch_item_cmp);

		store = claims_open_for_write("idem_claim_batch()");
		elemcxt = AllocSetContextCreate(CurrentMemoryContext,
										"idem_claim_batch element",
										ALLOCSET_SMALL_SIZES);
		for (i = 0; i < n; i++)
		{
			IdemStoreResult r;
			int			pos = items[i].pos;

			oldcxt = MemoryContextSwitchTo(elemcxt);
			r = claim_one(store, ns, (text *) DatumGetPointer(elems[pos]),
						  IDEM_WAIT);
			MemoryContextSwitchTo(oldcxt);
			MemoryContextReset(elemcxt);
			results[pos] = BoolGetDatum(r == IDEM_STORE_INSERTED);
		}
		MemoryContextDelete(elemcxt);
		idem_store_close(store);
	}

	if (n == 0)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(BOOLOID));
	PG_RETURN_ARRAYTYPE_P(construct_md_array(results, NULL, 1, &n, &lbound,
											 BOOLOID, 1, true, TYPALIGN_CHAR));
}

/*
 * idem_claim_info(msg_id, ns) returns timestamptz
 *
 * When the claim was made, NULL when there is no committed claim (nor one of
 * this transaction).  Never waits.
 */
PG_FUNCTION_INFO_V1(idem_claim_info);
Datum
idem_claim_info(PG_FUNCTION_ARGS)
{
	text	   *msg_id = idem_arg_key(fcinfo, 0, "msg_id", IDEM_MAX_KEY_LEN);
	text	   *ns = idem_arg_ns(fcinfo, 1);
	IdemStore  *store;
	IdemStoreResult r;
	Datum		values[CLAIMS_NATTS];
	bool		isnull[CLAIMS_NATTS];

	store = idem_store_open(CLAIMS_TABLE, AccessShareLock);
	check_claims_shape(store);
	r = idem_store_lookup(store, PointerGetDatum(ns), PointerGetDatum(msg_id),
						  IDEM_NOWAIT, values, isnull);
	idem_store_close(store);
	if (r != IDEM_STORE_EXISTS || isnull[2])
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(DatumGetTimestampTz(values[2]));
}

/*
 * idem_release(msg_id, ns) returns boolean
 *
 * Forget a claim on purpose, so that the message is processed again.  True
 * when a claim was removed.
 */
PG_FUNCTION_INFO_V1(idem_release);
Datum
idem_release(PG_FUNCTION_ARGS)
{
	text	   *msg_id = idem_arg_key(fcinfo, 0, "msg_id", IDEM_MAX_KEY_LEN);
	text	   *ns = idem_arg_ns(fcinfo, 1);
	IdemStore  *store;
	bool		released;

	store = claims_open_for_write("idem_release()");
	released = idem_store_delete(store, PointerGetDatum(ns),
								 PointerGetDatum(msg_id));
	idem_store_close(store);
	PG_RETURN_BOOL(released);
}
