/*-------------------------------------------------------------------------
 *
 * request.c
 *	  Request idempotency keys: an HTTP Idempotency-Key, its request's
 *	  fingerprint, who is working on it, and its stored response.
 *
 * A request is a row of idem.requests keyed by (ns, key), written in the
 * caller's transaction.  While it is unfinished the row names its owner, the
 * session that began it (its pid and start time, so that a pid reused after
 * the owner left, or after a restart, is not taken for the owner; on a
 * Citus cluster also its node: session.c), and a lease.  Whether another
 * attempt is still running is decided by the server, not guessed:
 *
 *	- a transaction that inserted or is changing the row is in flight as long
 *	  as it is open (the store reports it without waiting);
 *	- a committed, unfinished row is in flight while its owner's session is
 *	  connected and its lease has not run out; once the session is gone (or
 *	  the lease ran out, which only matters for pooled connections that
 *	  outlive a request) the next begin takes the key over and resumes it
 *	  from its last checkpoint.
 *
 * Finishing stores the response in the caller's transaction, so the effect
 * and its result commit together; a finished row answers every later begin
 * with the same fingerprint by replaying that response, until it expires
 * after its namespace's request retention.  Finishing with cache = false
 * releases the key instead: the next begin starts anew.
 *
 * Leases and retentions are counted on the clock, from the call that sets
 * them (a begin, a checkpoint, a finish): counted from the start of the
 * caller's transaction, a transaction longer than the lease would commit a
 * lease already over, and one longer than the retention a response never
 * replayed.  Whether a finished request has expired is judged at the start
 * of the caller's transaction, as now() in SQL and as the purge judges it;
 * whether a lease has run out, on the clock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/int.h"
#include "common/sha2.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"

#define REQUESTS_TABLE		"requests"
#define RETENTION_TABLE		"request_retention"

/* columns of idem.requests */
enum
{
	RQ_NS,
	RQ_KEY,
	RQ_FINGERPRINT,
	RQ_OWNER_PID,
	RQ_OWNER_STARTED,
	RQ_OWNER_NODE,
	RQ_LEASE,
	RQ_LEASE_UNTIL,
	RQ_RECOVERY_POINT,
	RQ_RECOVERY_DATA,
	RQ_RESPONSE_CODE,
	RQ_RESPONSE_BODY,
	RQ_ATTEMPTS,
	RQ_CREATED_AT,
	RQ_FINISHED_AT,
	RQ_EXPIRES_AT,
	RQ_NATTS
};

/* columns of the composite idem_request */
enum
{
	OUT_STATUS,
	OUT_RESPONSE_CODE,
	OUT_RESPONSE_BODY,
	OUT_RECOVERY_POINT,
	OUT_RECOVERY_DATA,
	OUT_ATTEMPTS,
	OUT_CREATED_AT,
	OUT_NATTS
};

#define REQUEST_MAX_KEY_LEN		255
#define REQUEST_MAX_POINT_LEN	255
/* begins of a key whose row is purged under each of them, before 40001 */
#define REQUEST_BEGIN_TRIES		100

static const char *const request_status_labels[] = {
	"new", "replay", "mismatch", "in_flight", "resume"
};

typedef enum RequestStatus
{
	REQUEST_NEW,
	REQUEST_REPLAY,
	REQUEST_MISMATCH,
	REQUEST_IN_FLIGHT,
	REQUEST_RESUME
} RequestStatus;

/* Why a checkpoint or a finish may not go on. */
typedef enum RequestRefusal
{
	REFUSE_NONE,
	REFUSE_FINISHED,
	REFUSE_NOT_OWNER,
	REFUSE_RELEASED
} RequestRefusal;

static void
check_requests_shape(IdemStore *store)
{
	static const IdemColumn columns[RQ_NATTS] = {
		{"ns", TEXTOID, true, C_COLLATION_OID},
		{"key", TEXTOID, true, C_COLLATION_OID},
		{"fingerprint", TEXTOID, true, C_COLLATION_OID},
		{"owner_pid", INT4OID, false, InvalidOid},
		{"owner_started", TIMESTAMPTZOID, false, InvalidOid},
		{"owner_node", INT4OID, false, InvalidOid},
		{"lease", INTERVALOID, false, InvalidOid},
		{"lease_until", TIMESTAMPTZOID, false, InvalidOid},
		{"recovery_point", TEXTOID, false, InvalidOid},
		{"recovery_data", JSONBOID, false, InvalidOid},
		{"response_code", INT4OID, false, InvalidOid},
		{"response_body", JSONBOID, false, InvalidOid},
		{"attempts", INT4OID, true, InvalidOid},
		{"created_at", TIMESTAMPTZOID, true, InvalidOid},
		{"finished_at", TIMESTAMPTZOID, false, InvalidOid},
		{"expires_at", TIMESTAMPTZOID, false, InvalidOid}
	};

	idem_check_columns(idem_store_tupdesc(store), REQUESTS_TABLE, columns,
					   RQ_NATTS);
}

static IdemStore *
requests_open(const char *fname)
{
	IdemStore  *store;

	idem_check_writable(fname);
	store = idem_store_open(REQUESTS_TABLE, RowExclusiveLock);
	check_requests_shape(store);
	return store;
}

static text *
request_arg_key(FunctionCallInfo fcinfo, int argno)
{
	return idem_arg_key(fcinfo, argno, "key", REQUEST_MAX_KEY_LEN);
}

/*
 * The lease argument: more than nothing and at most one day.  A lease only
 * bounds how long a request stays in flight while its session stays
 * connected (a pooled connection); a dead session frees its key at once.
 */
static Interval *
request_arg_lease(FunctionCallInfo fcinfo, int argno)
{
	Interval   *lease;
	Interval	zero = {0};
	Interval	day = {.time = 0, .day = 1, .month = 0};

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease must not be null"),
				 errhint("Give how long a request may stay in flight on a connection that stays open, such as '5 minutes'.")));
	lease = PG_GETARG_INTERVAL_P(argno);
	/* months and mixed signs would make "at most a day" depend on the date */
	if (lease->month != 0 || lease->day < 0 || lease->time < 0 ||
		DatumGetBool(DirectFunctionCall2(interval_le, IntervalPGetDatum(lease),
										 IntervalPGetDatum(&zero))) ||
		DatumGetBool(DirectFunctionCall2(interval_gt, IntervalPGetDatum(lease),
										 IntervalPGetDatum(&day))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be positive and at most one day"),
				 errdetail("The lease given was %s.", idem_interval_text(lease)),
				 errhint("Give how long a request may stay in flight on a connection that stays open, such as '5 minutes'.")));
	return lease;
}

/*
 * Further than any timestamp reaches from today: a retention written into
 * idem.request_retention by hand (idem_request_set_retention allows a year
 * at most) that would overflow keeps its requests for ever instead.
 */
#define RETENTION_MAX_DAYS	((int64) 200000 * 366)
/* the same for a span with a negative field: months are added first */
#define RETENTION_MAX_DAYS_MIXED	((int64) 5000 * 366)

static TimestampTz
plus_interval(TimestampTz t, Interval *span)
{
	int64		days = Abs((int64) span->month) * 31 + Abs((int64) span->day) +
		Abs(span->time / USECS_PER_DAY);
	bool		negative = span->month <= 0 && span->day <= 0 && span->time <= 0;
	bool		mixed = !negative &&
		(span->month < 0 || span->day < 0 || span->time < 0);

	/* a negative span (written by hand) has expired already */
	if (negative && days > RETENTION_MAX_DAYS_MIXED)
		return DT_NOBEGIN;
	if (days > (mixed ? RETENTION_MAX_DAYS_MIXED : RETENTION_MAX_DAYS))
		return DT_NOEND;
	/* in UTC: a day of the session's time zone may be 23 or 25 hours */
	return DatumGetTimestampTz(DirectFunctionCall2(timestamp_pl_interval,
												   TimestampTzGetDatum(t),
												   IntervalPGetDatum(span)));
}

/*
 * When a lease from t runs out: a lease is a span of time, its days 24
 * hours each, added in microseconds.  A lease written by hand with months,
 * or fields of both signs, is added as an interval (in UTC).
 */
static TimestampTz
plus_lease(TimestampTz t, Interval *lease)
{
	int64		span;
	TimestampTz until;

	if (lease->month != 0 || lease->day < 0 || lease->time < 0 ||
		TIMESTAMP_NOT_FINITE(t) ||
		pg_mul_s64_overflow((int64) lease->day, USECS_PER_DAY, &span) ||
		pg_add_s64_overflow(span, lease->time, &span) ||
		pg_add_s64_overflow(t, span, &until) ||
		!IS_VALID_TIMESTAMP(until))
		return plus_interval(t, lease);
	return until;
}

/*
 * The client session a call works for: this backend on one server; on a
 * Citus node, the session Citus works for (session.c), since the backend
 * that runs a call there may be a connection Citus made for it.
 */
static void
request_me(IdemStore *store, IdemSession *me)
{
	me->node = -1;
	me->pid = MyProcPid;
	me->started = MyStartTimestamp;
	if (idem_store_through_sql(store))
		idem_citus_session(idem_store_relowner(store), me);
}

/* The session that owns the row (pid and start time not null). */
static void
request_owner(Datum *values, bool *isnull, IdemSession *owner)
{
	owner->node = isnull[RQ_OWNER_NODE] ? -1 : DatumGetInt32(values[RQ_OWNER_NODE]);
	owner->pid = DatumGetInt32(values[RQ_OWNER_PID]);
	owner->started = DatumGetTimestampTz(values[RQ_OWNER_STARTED]);
}

static bool
request_owned_by_me(Datum *values, bool *isnull, const IdemSession *me)
{
	IdemSession owner;

	if (isnull[RQ_OWNER_PID] || isnull[RQ_OWNER_STARTED])
		return false;
	request_owner(values, isnull, &owner);
	return owner.node == me->node && owner.pid == me->pid &&
		owner.started == me->started;
}

/* A copy of a varlena column that outlives the row it was read from. */
static Datum
copy_varlena(Datum d)
{
	return PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
}

/* ---- idem_request_begin ---- */

typedef struct BeginState
{
	text	   *fingerprint;
	Interval   *lease;
	TimestampTz now;			/* the transaction's start: expiry */
	TimestampTz clock;			/* the time of the call: leases */
	IdemSession me;				/* the session the call works for */
	bool		citus;			/* the table is distributed by Citus */
	Oid			runas;			/* as whom other nodes are asked */
	RequestStatus status;
	/* what the caller is answered, in the caller's memory */
	Datum		out[OUT_NATTS];
	bool		outnull[OUT_NATTS];
} BeginState;

/*
 * Is the session that began a request still connected?  A session of a
 * Citus node is asked of its node; off a Citus cluster (a row restored from
 * one) it is gone.
 */
static bool
request_owner_alive(Datum *values, bool *isnull, BeginState *st)
{
	IdemSession owner;

	request_owner(values, isnull, &owner);
	if (owner.node < 0)
		return idem_session_alive(owner.pid, owner.started);
	return st->citus && idem_citus_session_alive(st->runas, &owner);
}

static void
begin_answer(BeginState *st, Datum *values, bool *isnull, bool response,
			 bool recovery)
{
	if (response && !isnull[RQ_RESPONSE_CODE])
	{
		st->out[OUT_RESPONSE_CODE] = values[RQ_RESPONSE_CODE];
		st->outnull[OUT_RESPONSE_CODE] = false;
		if (!isnull[RQ_RESPONSE_BODY])
		{
			st->out[OUT_RESPONSE_BODY] = copy_varlena(values[RQ_RESPONSE_BODY]);
			st->outnull[OUT_RESPONSE_BODY] = false;
		}
	}
	if (recovery)
	{
		if (!isnull[RQ_RECOVERY_POINT])
		{
			st->out[OUT_RECOVERY_POINT] = copy_varlena(values[RQ_RECOVERY_POINT]);
			st->outnull[OUT_RECOVERY_POINT] = false;
		}
		if (!isnull[RQ_RECOVERY_DATA])
		{
			st->out[OUT_RECOVERY_DATA] = copy_varlena(values[RQ_RECOVERY_DATA]);
			st->outnull[OUT_RECOVERY_DATA] = false;
		}
	}
	st->out[OUT_ATTEMPTS] = values[RQ_ATTEMPTS];
	st->outnull[OUT_ATTEMPTS] = false;
	st->out[OUT_CREATED_AT] = values[RQ_CREATED_AT];
	st->outnull[OUT_CREATED_AT] = false;
}

/* Make values the row of an attempt this session now owns. */
static void
begin_take(BeginState *st, Datum *values, bool *isnull)
{
	values[RQ_OWNER_PID] = Int32GetDatum(st->me.pid);
	isnull[RQ_OWNER_PID] = false;
	values[RQ_OWNER_STARTED] = TimestampTzGetDatum(st->me.started);
	isnull[RQ_OWNER_STARTED] = false;
	values[RQ_OWNER_NODE] = Int32GetDatum(st->me.node);
	isnull[RQ_OWNER_NODE] = (st->me.node < 0);
	values[RQ_LEASE] = IntervalPGetDatum(st->lease);
	isnull[RQ_LEASE] = false;
	values[RQ_LEASE_UNTIL] = TimestampTzGetDatum(plus_lease(st->clock, st->lease));
	isnull[RQ_LEASE_UNTIL] = false;
}

/*
 * The count of attempts after this one begins: it stays at the largest
 * int4 once there (a key begun 2^31 times), rather than wrapping.
 */
static inline int32
request_next_attempt(int32 attempts)
{
	return attempts < PG_INT32_MAX ? attempts + 1 : PG_INT32_MAX;
}

/* Make values the row of a request that starts anew. */
static void
begin_fresh(BeginState *st, Datum *values, bool *isnull, int32 attempts)
{
	int			i;

	for (i = RQ_FINGERPRINT; i < RQ_NATTS; i++)
		isnull[i] = true;
	values[RQ_FINGERPRINT] = PointerGetDatum(st->fingerprint);
	isnull[RQ_FINGERPRINT] = false;
	begin_take(st, values, isnull);
	values[RQ_ATTEMPTS] = Int32GetDatum(attempts);
	isnull[RQ_ATTEMPTS] = false;
	values[RQ_CREATED_AT] = TimestampTzGetDatum(st->now);
	isnull[RQ_CREATED_AT] = false;
}

/*
 * Decide a begin on the latest committed version of an existing row (or
 * one this transaction wrote); true to write the changed row.
 */
static bool
begin_decide(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	BeginState *st = (BeginState *) arg;
	bool		finished = !isnull[RQ_RESPONSE_CODE];
	bool		released = !finished && isnull[RQ_OWNER_PID];
	int32		attempts = DatumGetInt32(values[RQ_ATTEMPTS]);
	int			i;

	/* the store judges again when the row changed under it: start afresh */
	for (i = 0; i < OUT_NATTS; i++)
		st->outnull[i] = true;

	/* a finished request past its expiry is gone, whatever it was */
	if (finished && !isnull[RQ_EXPIRES_AT] &&
		DatumGetTimestampTz(values[RQ_EXPIRES_AT]) <= st->now)
	{
		begin_fresh(st, values, isnull, 1);
		st->status = REQUEST_NEW;
		begin_answer(st, values, isnull, false, false);
		return true;
	}
	/* released by cache => false: the next attempt runs anew */
	if (released)
	{
		begin_fresh(st, values, isnull, request_next_attempt(attempts));
		st->status = REQUEST_NEW;
		begin_answer(st, values, isnull, false, false);
		return true;
	}
	if (!DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID,
											  values[RQ_FINGERPRINT],
											  PointerGetDatum(st->fingerprint))))
	{
		st->status = REQUEST_MISMATCH;
		return false;
	}
	if (finished)
	{
		st->status = REQUEST_REPLAY;
		begin_answer(st, values, isnull, true, true);
		return false;
	}

	/* unfinished: ours, alive elsewhere, or abandoned */
	if (!request_owned_by_me(values, isnull, &st->me) &&
		!isnull[RQ_LEASE_UNTIL] &&
		DatumGetTimestampTz(values[RQ_LEASE_UNTIL]) > st->clock &&
		!isnull[RQ_OWNER_STARTED] &&
		request_owner_alive(values, isnull, st))
	{
		st->status = REQUEST_IN_FLIGHT;
		begin_answer(st, values, isnull, false, false);
		return false;
	}
	begin_take(st, values, isnull);
	values[RQ_ATTEMPTS] = Int32GetDatum(request_next_attempt(attempts));
	st->status = REQUEST_RESUME;
	begin_answer(st, values, isnull, false, true);
	return true;
}

/* The composite idem_request as the C code forms it (the type may be altered). */
static bool
request_result_shape_ok(TupleDesc tupdesc)
{
	static const Oid types[OUT_NATTS] = {
		InvalidOid, INT4OID, JSONBOID, TEXTOID, JSONBOID, INT4OID, TIMESTAMPTZOID
	};
	int			i;

	if (tupdesc->natts != OUT_NATTS)
		return false;
	for (i = 0; i < OUT_NATTS; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);

		if (att->attisdropped)
			return false;
		if (i == OUT_STATUS ? !type_is_enum(att->atttypid) : att->atttypid != types[i])
			return false;
	}
	return true;
}

/*
 * idem_request_begin(key, fingerprint, ns, lease) returns idem_request
 *
 * Never waits: another transaction that holds the key is in flight.
 */
PG_FUNCTION_INFO_V1(idem_request_begin);
Datum
idem_request_begin(PG_FUNCTION_ARGS)
{
	text	   *key = request_arg_key(fcinfo, 0);
	text	   *fingerprint = idem_arg_key(fcinfo, 1, "fingerprint",
										   IDEM_MAX_KEY_LEN);
	text	   *ns = idem_arg_ns(fcinfo, 2);
	Interval   *lease = request_arg_lease(fcinfo, 3);
	TupleDesc	tupdesc;
	BeginState	st;
	IdemStore  *store;
	Datum		values[RQ_NATTS];
	bool		isnull[RQ_NATTS];
	int			tries;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE ||
		!request_result_shape_ok(tupdesc))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("type idem_request does not have the expected attributes"),
				 errhint("Undo the change to the type.")));
	tupdesc = BlessTupleDesc(tupdesc);

	memset(&st, 0, sizeof(st));
	st.fingerprint = fingerprint;
	st.lease = lease;
	st.now = GetCurrentTransactionStartTimestamp();
	st.clock = GetCurrentTimestamp();

	store = requests_open("idem_request_begin()");
	/*
	 * A resume goes on from a checkpoint whose writes committed with it: not
	 * on a snapshot taken before them (nor a new attempt on one taken before
	 * the release or the expiry it follows, nor a new one where the snapshot
	 * sees the request a purge deleted since).  A replay, a mismatch and an
	 * in_flight stay answered on the latest version.
	 */
	idem_store_require_snapshot_insert(store);
	request_me(store, &st.me);
	st.citus = idem_store_through_sql(store);
	st.runas = idem_store_relowner(store);
	for (tries = 0;;)
	{
		IdemStoreResult r;
		IdemStoreUpdateResult u;

		/* nothing a decision on a row since purged may answer */
		for (i = 0; i < OUT_NATTS; i++)
			st.outnull[i] = true;
		values[RQ_NS] = PointerGetDatum(ns);
		values[RQ_KEY] = PointerGetDatum(key);
		isnull[RQ_NS] = isnull[RQ_KEY] = false;
		begin_fresh(&st, values, isnull, 1);
		r = idem_store_insert(store, values, isnull, IDEM_NOWAIT);
		if (r == IDEM_STORE_INSERTED)
		{
			st.status = REQUEST_NEW;
			begin_answer(&st, values, isnull, false, false);
			break;
		}
		if (r == IDEM_STORE_IN_FLIGHT)
		{
			st.status = REQUEST_IN_FLIGHT;
			break;
		}
		u = idem_store_try_update(store, PointerGetDatum(ns),
								  PointerGetDatum(key), begin_decide, &st);
		if (u == IDEM_UPDATE_BUSY)
		{
			/* another transaction is changing the row: it is alive */
			for (i = 0; i < OUT_NATTS; i++)
				st.outnull[i] = true;
			st.status = REQUEST_IN_FLIGHT;
			break;
		}
		if (u != IDEM_UPDATE_ABSENT)
			break;
		/*
		 * Purged between the insertion and the update: insert again.  Only
		 * other transactions' commits bring that about, each time anew; a
		 * key that keeps it up is a conflict the caller retries.
		 */
		if (++tries >= REQUEST_BEGIN_TRIES)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent delete"),
					 errdetail("The row of this key in table \"%s.%s\" was deleted by another transaction between its insertion and its update %d times.",
							   IDEM_SCHEMA, REQUESTS_TABLE, tries),
					 errhint("The transaction might succeed if retried.")));
		CHECK_FOR_INTERRUPTS();
	}
	idem_store_close(store);
	idem_stat_count_text(IDEM_KIND_REQUEST, ns, st.status, 1);

	st.out[OUT_STATUS] =
		ObjectIdGetDatum(idem_enum_type_label_oid(TupleDescAttr(tupdesc, OUT_STATUS)->atttypid,
												  st.status, request_status_labels,
												  lengthof(request_status_labels)));
	st.outnull[OUT_STATUS] = false;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, st.out,
													  st.outnull)));
}

/* ---- idem_request_checkpoint and idem_request_finish ---- */

typedef struct OwnerChange
{
	TimestampTz now;			/* the time of the call */
	IdemSession me;				/* the session the call works for */
	RequestRefusal refusal;
	/* checkpoint */
	bool		checkpoint;
	Datum		recovery_point;
	Datum		recovery_data;
	bool		recovery_data_null;
	/* finish */
	bool		cache;
	int32		response_code;
	Datum		response_body;
	bool		response_body_null;
	TimestampTz expires_at;
} OwnerChange;

static bool
owner_change(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	OwnerChange *ch = (OwnerChange *) arg;
	int			i;

	if (!isnull[RQ_RESPONSE_CODE])
	{
		ch->refusal = REFUSE_FINISHED;
		return false;
	}
	if (isnull[RQ_OWNER_PID])
	{
		ch->refusal = REFUSE_RELEASED;
		return false;
	}
	if (!request_owned_by_me(values, isnull, &ch->me))
	{
		ch->refusal = REFUSE_NOT_OWNER;
		return false;
	}
	ch->refusal = REFUSE_NONE;
	if (ch->checkpoint)
	{
		values[RQ_RECOVERY_POINT] = ch->recovery_point;
		isnull[RQ_RECOVERY_POINT] = false;
		values[RQ_RECOVERY_DATA] = ch->recovery_data;
		isnull[RQ_RECOVERY_DATA] = ch->recovery_data_null;
		/* progress renews the lease */
		if (!isnull[RQ_LEASE])
		{
			values[RQ_LEASE_UNTIL] =
				TimestampTzGetDatum(plus_lease(ch->now,
											   DatumGetIntervalP(values[RQ_LEASE])));
			isnull[RQ_LEASE_UNTIL] = false;
		}
		return true;
	}

	/* finished or released: nobody owns it any more */
	for (i = RQ_OWNER_PID; i <= RQ_LEASE_UNTIL; i++)
		isnull[i] = true;
	values[RQ_FINISHED_AT] = TimestampTzGetDatum(ch->now);
	isnull[RQ_FINISHED_AT] = false;
	values[RQ_EXPIRES_AT] = TimestampTzGetDatum(ch->expires_at);
	isnull[RQ_EXPIRES_AT] = false;
	if (ch->cache)
	{
		values[RQ_RESPONSE_CODE] = Int32GetDatum(ch->response_code);
		isnull[RQ_RESPONSE_CODE] = false;
		values[RQ_RESPONSE_BODY] = ch->response_body;
		isnull[RQ_RESPONSE_BODY] = ch->response_body_null;
	}
	else
	{
		/* released: kept until purged, begun anew by the next attempt */
		isnull[RQ_RECOVERY_POINT] = isnull[RQ_RECOVERY_DATA] = true;
	}
	return true;
}

static void
owner_change_apply(const char *fname, text *ns, text *key, OwnerChange *ch)
{
	IdemStore  *store = requests_open(fname);
	IdemStoreUpdateResult u;
	const char *detail = NULL;

	request_me(store, &ch->me);

	if (!ch->checkpoint && !ch->cache)
		ch->expires_at = ch->now;
	u = idem_store_update(store, PointerGetDatum(ns), PointerGetDatum(key),
						  owner_change, ch);
	idem_store_close(store);
	if (u == IDEM_UPDATE_DONE)
		return;
	if (u == IDEM_UPDATE_ABSENT || ch->refusal == REFUSE_RELEASED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("request key \"%s\" is not begun in namespace \"%s\"",
						text_to_cstring(key), text_to_cstring(ns)),
				 errhint("Call idem_request_begin() first.")));
	switch (ch->refusal)
	{
		case REFUSE_FINISHED:
			detail = "The request is finished.";
			break;
		default:
			detail = "Another attempt owns the request.";
			break;
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("request key \"%s\" in namespace \"%s\" is not owned by this session",
					text_to_cstring(key), text_to_cstring(ns)),
			 errdetail_internal("%s", detail),
			 errhint("Only the session whose idem_request_begin() answered new or resume may checkpoint or finish a request.")));
}

/*
 * idem_request_checkpoint(key, recovery_point, recovery_data, ns)
 *
 * Records how far the owner got; a later attempt resumes from there.
 */
PG_FUNCTION_INFO_V1(idem_request_checkpoint);
Datum
idem_request_checkpoint(PG_FUNCTION_ARGS)
{
	text	   *key = request_arg_key(fcinfo, 0);
	text	   *point = idem_arg_key(fcinfo, 1, "recovery_point",
									 REQUEST_MAX_POINT_LEN);
	text	   *ns = idem_arg_ns(fcinfo, 3);
	OwnerChange ch;

	memset(&ch, 0, sizeof(ch));
	ch.now = GetCurrentTimestamp();
	ch.checkpoint = true;
	ch.recovery_point = PointerGetDatum(point);
	ch.recovery_data_null = PG_ARGISNULL(2);
	if (!ch.recovery_data_null)
		ch.recovery_data = PointerGetDatum(PG_GETARG_JSONB_P(2));
	owner_change_apply("idem_request_checkpoint()", ns, key, &ch);
	PG_RETURN_VOID();
}

/*
 * The request retention of a namespace: its row in idem.request_retention,
 * or 24 hours.
 */
static Interval *
request_retention(text *ns)
{
	Interval   *retention = palloc(sizeof(Interval));
	Oid			nspid = get_namespace_oid(IDEM_SCHEMA, true);
	Oid			relid = InvalidOid;
	Relation	rel;

	retention->month = 0;
	retention->day = 0;
	retention->time = 24 * USECS_PER_HOUR;
	if (OidIsValid(nspid))
		relid = get_relname_relid(RETENTION_TABLE, nspid);
	rel = OidIsValid(relid) ? try_relation_open(relid, AccessShareLock) : NULL;
	/* only a table can be read; anything else carrying the name is ignored */
	if (rel != NULL && rel->rd_rel->relkind != RELKIND_RELATION)
	{
		relation_close(rel, AccessShareLock);
		rel = NULL;
	}
	if (rel != NULL)
	{
		static const IdemColumn columns[2] = {
			{"ns", TEXTOID, true, C_COLLATION_OID},
			{"retention", INTERVALOID, true, InvalidOid},
		};
		static const AttrNumber key[1] = {1};
		Oid			indexid = RelationGetPrimaryKeyIndex(rel);
		TupleDesc	tupdesc = RelationGetDescr(rel);

		/*
		 * A table changed otherwise is refused, not read with the wrong
		 * functions nor taken for one without rows.
		 */
		idem_check_columns(tupdesc, RETENTION_TABLE, columns, 2);
		if (!OidIsValid(indexid))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" has no primary key",
							IDEM_SCHEMA, RETENTION_TABLE),
					 errhint("Undo the change to the table.")));
		{
			Relation	index = index_open(indexid, AccessShareLock);
			ScanKeyData skey;
			SysScanDesc scan;
			HeapTuple	tup;

			idem_check_index(index, rel, 1, key);

			ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ,
						PointerGetDatum(ns));
			skey.sk_collation = C_COLLATION_OID;
			scan = systable_beginscan(rel, indexid, true,
									  GetActiveSnapshot(), 1, &skey);
			tup = systable_getnext(scan);
			if (HeapTupleIsValid(tup))
			{
				bool		isnull;
				Datum		d = heap_getattr(tup, 2, tupdesc, &isnull);

				if (!isnull)
					memcpy(retention, DatumGetIntervalP(d), sizeof(Interval));
			}
			systable_endscan(scan);
			index_close(index, AccessShareLock);
		}
		table_close(rel, AccessShareLock);
	}
	return retention;
}

/*
 * idem_request_finish(key, response_code, response_body, ns, cache)
 *
 * Stores the response, in the caller's transaction; with cache = false
 * releases the key instead.
 */
PG_FUNCTION_INFO_V1(idem_request_finish);
Datum
idem_request_finish(PG_FUNCTION_ARGS)
{
	text	   *key = request_arg_key(fcinfo, 0);
	text	   *ns = idem_arg_ns(fcinfo, 3);
	OwnerChange ch;
	int32		code;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("response_code must not be null")));
	code = PG_GETARG_INT32(1);
	if (code < 100 || code > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response_code must be an HTTP status code, from 100 to 599"),
				 errdetail("The response_code given was %d.", code)));
	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("cache must not be null")));

	memset(&ch, 0, sizeof(ch));
	ch.now = GetCurrentTimestamp();
	ch.cache = PG_GETARG_BOOL(4);
	ch.response_code = code;
	ch.response_body_null = PG_ARGISNULL(2);
	if (!ch.response_body_null)
		ch.response_body = PointerGetDatum(PG_GETARG_JSONB_P(2));
	if (ch.cache)
		ch.expires_at = plus_interval(ch.now, request_retention(ns));
	owner_change_apply("idem_request_finish()", ns, key, &ch);
	if (ch.cache)
		idem_stat_count_text(IDEM_KIND_REQUEST, ns, IDEM_REQUEST_FINISHED, 1);
	PG_RETURN_VOID();
}

/* ---- idem_request_fingerprint ---- */

static void
fp_update(pg_cryptohash_ctx *ctx, const void *data, size_t len)
{
	if (pg_cryptohash_update(ctx, data, len) < 0)
		elog(ERROR, "could not compute %s hash: %s", "SHA256",
			 pg_cryptohash_error(ctx));
}

/* a string, with its length, so that no two sequences of strings collide */
static void
fp_string(pg_cryptohash_ctx *ctx, char tag, const char *s, int len)
{
	char		head[16];
	int			n = snprintf(head, sizeof(head), "%c%d:", tag, len);

	fp_update(ctx, head, n);
	fp_update(ctx, s, len);
}

/*
 * idem_request_fingerprint(payload jsonb) returns text
 *
 * SHA-256, in hex, of a canonical form of the payload: jsonb already drops
 * whitespace and duplicate keys and sorts object keys; numbers are written
 * without insignificant zeros, so that numbers equal as jsonb (1, 1.0, 1e0)
 * give the same fingerprint.
 */
PG_FUNCTION_INFO_V1(idem_request_fingerprint);
Datum
idem_request_fingerprint(PG_FUNCTION_ARGS)
{
	Jsonb	   *payload;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	pg_cryptohash_ctx *ctx;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char		hex[PG_SHA256_DIGEST_LENGTH * 2 + 1];
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Pass 'null'::jsonb for a request without a body.")));
	payload = PG_GETARG_JSONB_P(0);

	ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(ctx) < 0)
		elog(ERROR, "could not compute %s hash: %s", "SHA256",
			 pg_cryptohash_error(ctx));
	it = JsonbIteratorInit(&payload->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		/* a payload of 256 MB has tens of millions of values */
		CHECK_FOR_INTERRUPTS();
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				fp_update(ctx, v.val.array.rawScalar ? "<" : "[", 1);
				break;
			case WJB_END_ARRAY:
				fp_update(ctx, "]", 1);
				break;
			case WJB_BEGIN_OBJECT:
				fp_update(ctx, "{", 1);
				break;
			case WJB_END_OBJECT:
				fp_update(ctx, "}", 1);
				break;
			case WJB_KEY:
				fp_string(ctx, 'k', v.val.string.val, v.val.string.len);
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				switch (v.type)
				{
					case jbvNull:
						fp_update(ctx, "n", 1);
						break;
					case jbvBool:
						fp_update(ctx, v.val.boolean ? "t" : "f", 1);
						break;
					case jbvString:
						fp_string(ctx, 's', v.val.string.val, v.val.string.len);
						break;
					case jbvNumeric:
						{
							char	   *num = numeric_normalize(v.val.numeric);

							fp_string(ctx, 'd', num, strlen(num));
							pfree(num);
						}
						break;
					default:
						elog(ERROR, "unexpected jsonb value type %d", (int) v.type);
				}
				break;
			default:
				break;
		}
	}
	if (pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		elog(ERROR, "could not compute %s hash: %s", "SHA256",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
	for (i = 0; i < PG_SHA256_DIGEST_LENGTH; i++)
		snprintf(hex + 2 * i, 3, "%02x", digest[i]);
	PG_RETURN_TEXT_P(cstring_to_text(hex));
}
