/*-------------------------------------------------------------------------
 *
 * token.c
 *	  Single-use tokens against double submission.
 *
 * A token is 32 bytes from pg_strong_random, given to the caller as 43
 * characters of unpadded base64url.  The table idem.tokens keeps only the
 * SHA-256 digest of the token's text, under the scope the token was issued
 * for: (scope, digest, expires_at, consumed_at).  Reading the table, a
 * backup or a replica yields no token that could be consumed.  Looking the
 * digest up in the primary key tells nothing about how close a guess was.
 *
 * Consumption sets consumed_at on the latest version of the row, through
 * the table access method's update (a HOT update, as consumed_at is not
 * indexed), in the caller's transaction: if that rolls back, the token is
 * valid again.  Concurrent consumers of one token queue on the row as they
 * would in UPDATE; the one that finds the token consumed by a committed
 * transaction gets false, the one whose predecessor rolled back gets true.
 * A consumed row is kept until its expiry, so that its status stays
 * "consumed"; idem_token_purge deletes rows whose expiry has passed.
 *
 * Time is the start of the caller's transaction, as now() in SQL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "idem.h"

#define TOKENS_TABLE		"tokens"
#define TOKENS_NATTS		4
#define TOKENS_SCOPE		0
#define TOKENS_DIGEST		1
#define TOKENS_EXPIRES_AT	2
#define TOKENS_CONSUMED_AT	3

/* 256 random bits, as 43 characters of unpadded base64url */
#define TOKEN_RANDOM_BYTES	32
#define TOKEN_LEN			((TOKEN_RANDOM_BYTES * 4 + 2) / 3)

/* the longest ttl, one calendar year */
#define TOKEN_MAX_TTL_MONTHS 12

static const char *const token_state_labels[] = {
	"valid", "consumed", "expired", "unknown"
};

typedef enum TokenState
{
	TOKEN_VALID,
	TOKEN_CONSUMED,
	TOKEN_EXPIRED,
	TOKEN_UNKNOWN
} TokenState;

static const char base64url_chars[] =
"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static void
base64url_encode(const uint8 *src, int len, char *dst)
{
	uint32		buf = 0;
	int			bits = 0;
	int			i;

	for (i = 0; i < len; i++)
	{
		buf = (buf << 8) | src[i];
		bits += 8;
		while (bits >= 6)
		{
			bits -= 6;
			*dst++ = base64url_chars[(buf >> bits) & 0x3F];
		}
	}
	if (bits > 0)
		*dst++ = base64url_chars[(buf << (6 - bits)) & 0x3F];
}

static inline bool
is_base64url_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void
token_sha256(const char *data, size_t len, uint8 *dest)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0 ||
		pg_cryptohash_final(ctx, dest, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not compute %s hash: %s", "SHA256",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
}

/*
 * The token argument as the digest stored for it, or NULL when the string
 * cannot be a token (empty, too long, or not base64url): such a string,
 * coming from a client, is an answer ("unknown"), not an error.  The length
 * is checked before the value is detoasted.
 */
static bytea *
token_arg_digest(FunctionCallInfo fcinfo, int argno)
{
	text	   *token;
	const char *p;
	bytea	   *digest;
	int			i;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("token must not be null")));
	if (toast_raw_datum_size(PG_GETARG_DATUM(argno)) != VARHDRSZ + TOKEN_LEN)
		return NULL;
	token = PG_GETARG_TEXT_PP(argno);
	if (VARSIZE_ANY_EXHDR(token) != TOKEN_LEN)
		return NULL;
	p = VARDATA_ANY(token);
	for (i = 0; i < TOKEN_LEN; i++)
	{
		if (!is_base64url_char((unsigned char) p[i]))
			return NULL;
	}
	digest = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	token_sha256(p, TOKEN_LEN, (uint8 *) VARDATA(digest));
	return digest;
}

/*
 * The scope argument: any text of at most IDEM_MAX_NS_LEN bytes; the empty
 * string is the default scope.
 */
static text *
token_arg_scope(FunctionCallInfo fcinfo, int argno)
{
	text	   *scope;
	int			len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("scope must not be null"),
				 errhint("Pass an empty string for a token that is not bound to a scope.")));
	scope = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(scope);
	if (len > IDEM_MAX_NS_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("scope is too long"),
				 errdetail("The scope is %d bytes long; the limit is %d bytes.",
						   len, IDEM_MAX_NS_LEN)));
	return scope;
}

static void
check_tokens_shape(IdemStore *store)
{
	static const Oid types[TOKENS_NATTS] = {
		TEXTOID, BYTEAOID, TIMESTAMPTZOID, TIMESTAMPTZOID
	};
	TupleDesc	tupdesc = idem_store_tupdesc(store);
	int			i;

	if (tupdesc->natts != TOKENS_NATTS)
		goto bad;
	for (i = 0; i < TOKENS_NATTS; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);

		if (att->attisdropped || att->atttypid != types[i])
			goto bad;
	}
	return;

bad:
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"%s.%s\" does not have the expected columns",
					IDEM_SCHEMA, TOKENS_TABLE)));
}

static IdemStore *
tokens_open(LOCKMODE lockmode)
{
	IdemStore  *store = idem_store_open(TOKENS_TABLE, lockmode);

	check_tokens_shape(store);
	return store;
}

static char *
interval_text(Interval *span)
{
	return DatumGetCString(DirectFunctionCall1(interval_out,
											   IntervalPGetDatum(span)));
}

/*
 * The expiry of a token issued at "now" with the given ttl.  The ttl must
 * put the expiry after now and no later than one calendar year after now.
 * Spans far beyond that are refused before any arithmetic, so that they
 * cannot overflow the timestamp range.
 */
static TimestampTz
token_expiry(Interval *ttl, TimestampTz now)
{
	const int32 bound = (int32) (100 * DAYS_PER_YEAR);	/* days, or months */
	Interval	year = {.time = 0, .day = 0, .month = TOKEN_MAX_TTL_MONTHS};
	TimestampTz expires;
	TimestampTz limit;

	if (ttl->month > bound || ttl->month < -bound ||
		ttl->day > bound || ttl->day < -bound ||
		ttl->time > (int64) bound * USECS_PER_DAY ||
		ttl->time < -(int64) bound * USECS_PER_DAY)
	{
		/* far out of range: its sign, with months of 30 days, is enough */
		double		span = (double) ttl->month * DAYS_PER_MONTH * USECS_PER_DAY +
			(double) ttl->day * USECS_PER_DAY + (double) ttl->time;

		expires = span > 0 ? DT_NOEND : DT_NOBEGIN;
	}
	else
		expires = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														  TimestampTzGetDatum(now),
														  IntervalPGetDatum(ttl)));
	if (expires <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive"),
				 errdetail("The ttl given was %s.", interval_text(ttl)),
				 errhint("Give how long the token stays valid, such as '30 minutes'.")));
	limit = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													TimestampTzGetDatum(now),
													IntervalPGetDatum(&year)));
	if (expires > limit)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must not exceed one year"),
				 errdetail("The ttl given was %s.", interval_text(ttl)),
				 errhint("Issue a token for at most one year; issue a new one when it expires.")));
	return expires;
}

/*
 * idem_token_issue(scope, ttl) returns text
 *
 * A fresh token, valid in scope until now() + ttl.
 */
PG_FUNCTION_INFO_V1(idem_token_issue);
Datum
idem_token_issue(PG_FUNCTION_ARGS)
{
	text	   *scope = token_arg_scope(fcinfo, 0);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires;
	uint8		raw[TOKEN_RANDOM_BYTES];
	text	   *token;
	bytea	   *digest;
	Datum		values[TOKENS_NATTS];
	bool		isnull[TOKENS_NATTS] = {false, false, false, true};
	IdemStore  *store;
	IdemStoreResult r;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ttl must not be null"),
				 errhint("Give how long the token stays valid, such as '30 minutes'.")));
	expires = token_expiry(PG_GETARG_INTERVAL_P(1), now);
	idem_check_writable("idem_token_issue()");

	if (!pg_strong_random(raw, sizeof(raw)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random token")));
	token = palloc(VARHDRSZ + TOKEN_LEN);
	SET_VARSIZE(token, VARHDRSZ + TOKEN_LEN);
	base64url_encode(raw, sizeof(raw), VARDATA(token));
	explicit_bzero(raw, sizeof(raw));

	digest = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	token_sha256(VARDATA(token), TOKEN_LEN, (uint8 *) VARDATA(digest));

	values[TOKENS_SCOPE] = PointerGetDatum(scope);
	values[TOKENS_DIGEST] = PointerGetDatum(digest);
	values[TOKENS_EXPIRES_AT] = TimestampTzGetDatum(expires);
	values[TOKENS_CONSUMED_AT] = (Datum) 0;

	store = tokens_open(RowExclusiveLock);
	r = idem_store_insert(store, values, isnull, IDEM_NOWAIT);
	idem_store_close(store);
	/* 256 random bits do not repeat */
	if (r != IDEM_STORE_INSERTED)
		elog(ERROR, "digest of a fresh token is already stored");

	PG_RETURN_TEXT_P(token);
}

/*
 * Consumption of the latest version of a token's row: the condition
 * "consumed_at IS NULL AND expires_at > now()" and the assignment
 * "consumed_at = now()".
 */
static bool
token_consume_row(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	TimestampTz now = *(TimestampTz *) arg;

	if (!isnull[TOKENS_CONSUMED_AT])
		return false;
	if (isnull[TOKENS_EXPIRES_AT] ||
		DatumGetTimestampTz(values[TOKENS_EXPIRES_AT]) <= now)
		return false;
	values[TOKENS_CONSUMED_AT] = TimestampTzGetDatum(now);
	isnull[TOKENS_CONSUMED_AT] = false;
	return true;
}

/*
 * idem_token_consume(token, scope) returns boolean
 *
 * true exactly once for a valid token of that scope; false when it is
 * consumed already, expired, unknown, malformed, or of another scope.  A
 * consumption in progress in another transaction is waited for.
 */
PG_FUNCTION_INFO_V1(idem_token_consume);
Datum
idem_token_consume(PG_FUNCTION_ARGS)
{
	bytea	   *digest = token_arg_digest(fcinfo, 0);
	text	   *scope = token_arg_scope(fcinfo, 1);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	IdemStore  *store;
	IdemStoreUpdateResult r;

	idem_check_writable("idem_token_consume()");
	if (digest == NULL)
		PG_RETURN_BOOL(false);

	store = tokens_open(RowExclusiveLock);
	r = idem_store_update(store, PointerGetDatum(scope),
						  PointerGetDatum(digest), token_consume_row, &now);
	idem_store_close(store);
	PG_RETURN_BOOL(r == IDEM_UPDATE_DONE);
}

/*
 * idem_token_status(token, scope) returns idem_token_state
 *
 * The state as committed, or as this transaction left it; a consumption in
 * progress in another transaction is not seen (the token is still valid)
 * and not waited for.
 */
PG_FUNCTION_INFO_V1(idem_token_status);
Datum
idem_token_status(PG_FUNCTION_ARGS)
{
	bytea	   *digest = token_arg_digest(fcinfo, 0);
	text	   *scope = token_arg_scope(fcinfo, 1);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TokenState	state = TOKEN_UNKNOWN;

	if (digest != NULL)
	{
		IdemStore  *store = tokens_open(AccessShareLock);
		Datum		values[TOKENS_NATTS];
		bool		isnull[TOKENS_NATTS];
		bool		found;

		found = idem_store_read(store, PointerGetDatum(scope),
								PointerGetDatum(digest), values, isnull);
		idem_store_close(store);
		if (!found)
			state = TOKEN_UNKNOWN;
		else if (isnull[TOKENS_EXPIRES_AT] ||
				 DatumGetTimestampTz(values[TOKENS_EXPIRES_AT]) <= now)
			state = TOKEN_EXPIRED;
		else if (!isnull[TOKENS_CONSUMED_AT])
			state = TOKEN_CONSUMED;
		else
			state = TOKEN_VALID;
	}
	PG_RETURN_OID(idem_enum_label_oid(fcinfo, (int) state, token_state_labels,
									  lengthof(token_state_labels)));
}
