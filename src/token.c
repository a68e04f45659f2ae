/*-------------------------------------------------------------------------
 *
 * token.c
 *	  Single-use tokens against double submission.
 *
 * A token is 32 bytes from pg_strong_random, given to the caller as 43
 * characters of unpadded base64url (the secret), followed by 8 characters
 * that say where its row is (the hint).  The table idem.tokens keeps only the
 * SHA-256 digest of the secret's text, under the scope the token was issued
 * for: (scope, digest, expires_at, consumed_at).  Reading the table, a
 * backup or a replica yields no token that could be consumed.  Looking the
 * digest up in the primary key tells nothing about how close a guess was.
 *
 * The hint is the row's address (block and offset), which lets consumption
 * read one heap page instead of descending the primary key.  It is never
 * trusted: the row found there must carry the token's scope and digest, and
 * when it does not (the row moved, the hint was altered, the table was
 * restored from a dump) the primary key is searched as without a hint.  So
 * the hint changes how fast an answer comes, never the answer.  It is
 * XORed with the first 6 bytes of SHA-256(key || digest), where the key is
 * 32 bytes from pg_strong_random made at CREATE EXTENSION (idem.token_key,
 * by idem._random_key): a token does not tell where its row is, nor how
 * many tokens came before it.
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
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
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
#define TOKEN_SECRET_LEN	((TOKEN_RANDOM_BYTES * 4 + 2) / 3)
/* then where the row is: block (4 bytes) and offset (2), as 8 characters */
#define TOKEN_HINT_BYTES	6
#define TOKEN_HINT_LEN		((TOKEN_HINT_BYTES * 4 + 2) / 3)
#define TOKEN_LEN			(TOKEN_SECRET_LEN + TOKEN_HINT_LEN)

/* the key that hides hints, read once per session from idem.token_key */
#define TOKEN_KEY_TABLE		"token_key"
#define TOKEN_KEY_BYTES		32
static uint8 token_key[TOKEN_KEY_BYTES];
static bool token_key_loaded = false;
static Oid	token_key_relid = InvalidOid;

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

/* the value of a base64url character, or -1 */
static inline int
base64url_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '-')
		return 62;
	if (c == '_')
		return 63;
	return -1;
}

/* SHA-256 of a, followed by b when b is not NULL */
static void
token_sha256(const uint8 *a, size_t alen, const uint8 *b, size_t blen,
			 uint8 *dest)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, a, alen) < 0 ||
		(b != NULL && pg_cryptohash_update(ctx, b, blen) < 0) ||
		pg_cryptohash_final(ctx, dest, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not compute %s hash: %s", "SHA256",
			 pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
}

void
idem_token_relcache(Oid relid)
{
	if (relid == InvalidOid || relid == token_key_relid)
		token_key_loaded = false;
}

/*
 * Read the hint key.  Without a usable key (the row was deleted or
 * changed shape) hints are hidden with a key of zeros: they still work,
 * they only stop hiding where rows are.  A key changed while sessions run
 * is seen by new sessions only; hints then fail to decode in old ones,
 * which costs them the index descent the hint saves, never an answer.
 *
 * The key is kept for the session only once read from a row committed by
 * another transaction: a key row this transaction wrote may be rolled
 * back, and a table whose row the snapshot does not see (a transaction
 * older than the row, or a deleted row) would otherwise leave the session
 * with a key of zeros for good.  Until then it is read at each call.
 */
static void
token_load_key(void)
{
	Oid			nspid = get_namespace_oid(IDEM_SCHEMA, true);
	Oid			relid = InvalidOid;
	Relation	rel;
	bool		keep = true;

	memset(token_key, 0, sizeof(token_key));
	if (OidIsValid(nspid))
		relid = get_relname_relid(TOKEN_KEY_TABLE, nspid);
	/* dropped since the look-up: no key */
	rel = OidIsValid(relid) ? try_relation_open(relid, AccessShareLock) : NULL;
	/*
	 * an unlogged key table has no rows on a standby, and only a table can
	 * be scanned: no key then either
	 */
	if (rel != NULL && ((!RelationIsPermanent(rel) && RecoveryInProgress()) ||
						rel->rd_rel->relkind != RELKIND_RELATION))
	{
		table_close(rel, AccessShareLock);
		rel = NULL;
	}
	if (rel != NULL)
	{
		TupleDesc	tupdesc = RelationGetDescr(rel);
		/* the query's snapshot: parallel workers may not take new ones */
		Snapshot	snapshot = RegisterSnapshot(ActiveSnapshotSet() ?
												GetActiveSnapshot() :
												GetTransactionSnapshot());
		TableScanDesc scan = table_beginscan(rel, snapshot, 0, NULL);
		TupleTableSlot *slot = table_slot_create(rel, NULL);
		bool		shaped = tupdesc->natts == 2 &&
			TupleDescAttr(tupdesc, 1)->atttypid == BYTEAOID &&
			!TupleDescAttr(tupdesc, 1)->attisdropped;

		/* a table of another shape stays so until its relcache entry goes */
		keep = !shaped;
		if (shaped && table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d;

			if (rel->rd_rel->relam != HEAP_TABLE_AM_OID)
				keep = true;
			else
			{
				Datum		xmin = slot_getsysattr(slot,
												   MinTransactionIdAttributeNumber,
												   &isnull);

				keep = isnull ||
					!TransactionIdIsCurrentTransactionId(DatumGetTransactionId(xmin));
			}
			d = slot_getattr(slot, 2, &isnull);

			if (!isnull)
			{
				bytea	   *key = DatumGetByteaPP(d);

				if (VARSIZE_ANY_EXHDR(key) == TOKEN_KEY_BYTES)
					memcpy(token_key, VARDATA_ANY(key), TOKEN_KEY_BYTES);
			}
		}
		ExecDropSingleTupleTableSlot(slot);
		table_endscan(scan);
		UnregisterSnapshot(snapshot);
		table_close(rel, AccessShareLock);
	}
	token_key_relid = relid;
	token_key_loaded = keep;
}

/* the 6 bytes that hide the hint of the token whose digest is given */
static void
token_hint_pad(const bytea *digest, uint8 *pad)
{
	uint8		h[PG_SHA256_DIGEST_LENGTH];

	if (!token_key_loaded)
		token_load_key();
	token_sha256(token_key, TOKEN_KEY_BYTES,
				 (const uint8 *) VARDATA(digest), PG_SHA256_DIGEST_LENGTH, h);
	memcpy(pad, h, TOKEN_HINT_BYTES);
}

static void
token_encode_hint(ItemPointerData tid, const bytea *digest, char *dst)
{
	/* an invalid tid (a table Citus distributes) encodes offset 0: no hint */
	BlockNumber blkno = ItemPointerGetBlockNumberNoCheck(&tid);
	OffsetNumber off = ItemPointerGetOffsetNumberNoCheck(&tid);
	uint8		raw[TOKEN_HINT_BYTES];
	uint8		pad[TOKEN_HINT_BYTES];
	int			i;

	raw[0] = blkno >> 24;
	raw[1] = blkno >> 16;
	raw[2] = blkno >> 8;
	raw[3] = blkno;
	raw[4] = off >> 8;
	raw[5] = off;
	token_hint_pad(digest, pad);
	for (i = 0; i < TOKEN_HINT_BYTES; i++)
		raw[i] ^= pad[i];
	base64url_encode(raw, sizeof(raw), dst);
}

/* 8 characters of base64url are exactly 6 bytes */
static void
token_decode_hint(const char *src, const bytea *digest, ItemPointer tid)
{
	uint8		pad[TOKEN_HINT_BYTES];
	uint64		v = 0;
	int			i;

	token_hint_pad(digest, pad);
	for (i = 0; i < TOKEN_HINT_LEN; i++)
		v = (v << 6) | (uint64) base64url_value((unsigned char) src[i]);
	for (i = 0; i < TOKEN_HINT_BYTES; i++)
		v ^= (uint64) pad[i] << (8 * (TOKEN_HINT_BYTES - 1 - i));
	ItemPointerSet(tid, (BlockNumber) (v >> 16), (OffsetNumber) (v & 0xFFFF));
}

/*
 * The token argument as the digest stored for it, or NULL when the string
 * cannot be a token (empty, too long, or not base64url): such a string,
 * coming from a client, is an answer ("unknown"), not an error.  The length
 * is checked before the value is detoasted.  *hint is where the token says
 * its row is.
 */
static bytea *
token_arg_digest(FunctionCallInfo fcinfo, int argno, ItemPointer hint)
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
		if (base64url_value((unsigned char) p[i]) < 0)
			return NULL;
	}
	digest = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	token_sha256((const uint8 *) p, TOKEN_SECRET_LEN, NULL, 0,
				 (uint8 *) VARDATA(digest));
	token_decode_hint(p + TOKEN_SECRET_LEN, digest, hint);
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
	idem_check_raw_len(PG_GETARG_DATUM(argno), "scope", IDEM_MAX_NS_LEN);
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
	static const IdemColumn columns[TOKENS_NATTS] = {
		{"scope", TEXTOID, true, C_COLLATION_OID},
		{"digest", BYTEAOID, true, InvalidOid},
		{"expires_at", TIMESTAMPTZOID, false, InvalidOid},
		{"consumed_at", TIMESTAMPTZOID, false, InvalidOid}
	};

	idem_check_columns(idem_store_tupdesc(store), TOKENS_TABLE, columns,
					   TOKENS_NATTS);
}

static IdemStore *
tokens_open(LOCKMODE lockmode)
{
	IdemStore  *store = idem_store_open(TOKENS_TABLE, lockmode);

	check_tokens_shape(store);
	return store;
}

/*
 * The expiry of a token issued at "now" with the given ttl, added in UTC (a
 * day is 24 hours, whatever the session's time zone does).  The ttl must
 * put the expiry after now and no later than one calendar year after now.
 * Spans far beyond that are refused before any arithmetic, so that they
 * cannot overflow the timestamp range.
 */
static TimestampTz
token_expiry(Interval *ttl, TimestampTz now)
{
	/*
	 * Each field within 2,000 years: now + ttl, added field by field, stays
	 * within 6,000 years of now, where a timestamp cannot overflow.
	 */
	const int32 months = 2000 * MONTHS_PER_YEAR;
	const int32 days = 2000 * 366;
	Interval	year = {.time = 0, .day = 0, .month = TOKEN_MAX_TTL_MONTHS};
	TimestampTz expires;
	TimestampTz limit;

	if (ttl->month > months || ttl->month < -months ||
		ttl->day > days || ttl->day < -days ||
		ttl->time > (int64) days * USECS_PER_DAY ||
		ttl->time < -(int64) days * USECS_PER_DAY)
	{
		bool		pos = ttl->month > 0 || ttl->day > 0 || ttl->time > 0;
		bool		neg = ttl->month < 0 || ttl->day < 0 || ttl->time < 0;

		/* of one sign, beyond 2,000 years: its sign tells */
		if (pos && neg)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("ttl must not have fields of both signs of which one exceeds 2000 years"),
					 errdetail("The ttl given was %s.", idem_interval_text(ttl)),
					 errhint("Give how long the token stays valid, such as '30 minutes'.")));
		expires = pos ? DT_NOEND : DT_NOBEGIN;
	}
	else
		expires = DatumGetTimestampTz(DirectFunctionCall2(timestamp_pl_interval,
														  TimestampTzGetDatum(now),
														  IntervalPGetDatum(ttl)));
	if (expires <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive"),
				 errdetail("The ttl given was %s.", idem_interval_text(ttl)),
				 errhint("Give how long the token stays valid, such as '30 minutes'.")));
	limit = DatumGetTimestampTz(DirectFunctionCall2(timestamp_pl_interval,
													TimestampTzGetDatum(now),
													IntervalPGetDatum(&year)));
	if (expires > limit)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must not exceed one year"),
				 errdetail("The ttl given was %s.", idem_interval_text(ttl)),
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
	token_sha256((const uint8 *) VARDATA(token), TOKEN_SECRET_LEN, NULL, 0,
				 (uint8 *) VARDATA(digest));

	values[TOKENS_SCOPE] = PointerGetDatum(scope);
	values[TOKENS_DIGEST] = PointerGetDatum(digest);
	values[TOKENS_EXPIRES_AT] = TimestampTzGetDatum(expires);
	values[TOKENS_CONSUMED_AT] = (Datum) 0;

	store = tokens_open(RowExclusiveLock);
	r = idem_store_insert(store, values, isnull, IDEM_NOWAIT);
	/* 256 random bits do not repeat */
	if (r != IDEM_STORE_INSERTED)
		elog(ERROR, "digest of a fresh token is already stored");
	token_encode_hint(idem_store_inserted_tid(store), digest,
					  VARDATA(token) + TOKEN_SECRET_LEN);
	idem_store_close(store);
	idem_stat_count_text(IDEM_KIND_TOKEN, scope, IDEM_TOKEN_ISSUED, 1);

	PG_RETURN_TEXT_P(token);
}

/* What a consumption judged, and why it refused. */
typedef struct TokenConsume
{
	TimestampTz now;
	int			refused;		/* IDEM_TOKEN_REJECTED_* */
} TokenConsume;

/*
 * Consumption of the latest version of a token's row: the condition
 * "consumed_at IS NULL AND expires_at > now()" and the assignment
 * "consumed_at = now()".
 */
static bool
token_consume_row(TupleDesc tupdesc, Datum *values, bool *isnull, void *arg)
{
	TokenConsume *c = arg;
	TimestampTz now = c->now;

	if (!isnull[TOKENS_CONSUMED_AT])
	{
		c->refused = IDEM_TOKEN_REJECTED_CONSUMED;
		return false;
	}
	if (isnull[TOKENS_EXPIRES_AT] ||
		DatumGetTimestampTz(values[TOKENS_EXPIRES_AT]) <= now)
	{
		c->refused = IDEM_TOKEN_REJECTED_EXPIRED;
		return false;
	}
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
	ItemPointerData hint;
	bytea	   *digest = token_arg_digest(fcinfo, 0, &hint);
	text	   *scope = token_arg_scope(fcinfo, 1);
	TokenConsume c;
	IdemStore  *store;
	IdemStoreUpdateResult r;

	idem_check_writable("idem_token_consume()");
	if (digest == NULL)
	{
		idem_stat_count_text(IDEM_KIND_TOKEN, scope,
							 IDEM_TOKEN_REJECTED_UNKNOWN, 1);
		PG_RETURN_BOOL(false);
	}

	c.now = GetCurrentTransactionStartTimestamp();
	c.refused = IDEM_TOKEN_REJECTED_UNKNOWN;
	store = tokens_open(RowExclusiveLock);
	idem_store_hint(store, &hint);
	r = idem_store_update(store, PointerGetDatum(scope),
						  PointerGetDatum(digest), token_consume_row, &c);
	idem_store_close(store);
	idem_stat_count_text(IDEM_KIND_TOKEN, scope,
						 r == IDEM_UPDATE_DONE ? IDEM_TOKEN_CONSUMED : c.refused, 1);
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
	ItemPointerData hint;
	bytea	   *digest = token_arg_digest(fcinfo, 0, &hint);
	text	   *scope = token_arg_scope(fcinfo, 1);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TokenState	state = TOKEN_UNKNOWN;

	if (digest != NULL)
	{
		IdemStore  *store = tokens_open(AccessShareLock);
		Datum		values[TOKENS_NATTS];
		bool		isnull[TOKENS_NATTS];
		bool		found;

		idem_store_hint(store, &hint);
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

/*
 * idem._random_key() returns bytea
 *
 * A new key for idem.token_key: 32 bytes from pg_strong_random, every bit
 * of them random (gen_random_uuid fixes the version and variant bits).
 */
PG_FUNCTION_INFO_V1(idem_random_key);
Datum
idem_random_key(PG_FUNCTION_ARGS)
{
	bytea	   *key = palloc(VARHDRSZ + TOKEN_KEY_BYTES);

	SET_VARSIZE(key, VARHDRSZ + TOKEN_KEY_BYTES);
	if (!pg_strong_random(VARDATA(key), TOKEN_KEY_BYTES))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random key")));
	PG_RETURN_BYTEA_P(key);
}
