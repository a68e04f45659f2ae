/*-------------------------------------------------------------------------
 *
 * idem.c
 *	  Module entry point and helpers shared by every capability of idem.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xlog.h"
#include "catalog/pg_am.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_index.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "idem.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static void
idem_relcache_callback(Datum arg, Oid relid)
{
	idem_store_relcache(relid);
	idem_token_relcache(relid);
	idem_guard_relcache(relid);
	idem_outbox_relcache(relid);
}

void
_PG_init(void)
{
	CacheRegisterRelcacheCallback(idem_relcache_callback, (Datum) 0);
	idem_store_init();
	idem_guard_init();
	idem_outbox_init();
	idem_citus_init();
	idem_stats_init();
	idem_worker_init();
	/* after the settings are defined: it drops placeholders of the prefix */
	MarkGUCPrefixReserved("idem");
}

static void
key_too_long(const char *what, Size len, int maxlen) pg_attribute_noreturn();

static void
key_too_long(const char *what, Size len, int maxlen)
{
	ereport(ERROR,
			(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
			 errmsg("%s is too long", what),
			 errdetail("The %s is %zu bytes long; the limit is %d bytes.",
					   what, len, maxlen)));
}

/*
 * Check a key given by the caller: not empty and not longer than maxlen
 * bytes.  NULL is checked by the callers, which know the argument.
 */
void
idem_check_key(text *key, const char *what, int maxlen)
{
	int			len = VARSIZE_ANY_EXHDR(key);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what),
				 errhint("Give a non-empty identifier.")));
	if (len > maxlen)
		key_too_long(what, (Size) len, maxlen);
}

/*
 * A compressed or out-of-line text argument longer than maxlen bytes is
 * refused before it is read whole: a value of a gigabyte compresses into
 * a few megabytes of a table.
 */
void
idem_check_raw_len(Datum value, const char *what, int maxlen)
{
	struct varlena *v = (struct varlena *) DatumGetPointer(value);

	if (VARATT_IS_EXTERNAL(v) || VARATT_IS_COMPRESSED(v))
	{
		Size		len = toast_raw_datum_size(value) - VARHDRSZ;

		if (len > (Size) maxlen)
			key_too_long(what, len, maxlen);
	}
}

/*
 * Fetch and check a key argument.  Functions taking keys are declared
 * CALLED ON NULL INPUT so that a NULL is an error, never a silent NULL.
 */
text *
idem_arg_key(FunctionCallInfo fcinfo, int argno, const char *what, int maxlen)
{
	text	   *key;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	idem_check_raw_len(PG_GETARG_DATUM(argno), what, maxlen);
	key = PG_GETARG_TEXT_PP(argno);
	idem_check_key(key, what, maxlen);
	return key;
}

text *
idem_arg_ns(FunctionCallInfo fcinfo, int argno)
{
	return idem_arg_key(fcinfo, argno, "ns", IDEM_MAX_NS_LEN);
}

/* An interval as the server prints it, for error details. */
char *
idem_interval_text(Interval *span)
{
	return DatumGetCString(DirectFunctionCall1(interval_out,
											   IntervalPGetDatum(span)));
}

/*
 * Writes are refused where the server would refuse an INSERT.
 */
void
idem_check_writable(const char *fname)
{
	PreventCommandIfReadOnly(fname);
	PreventCommandIfParallelMode(fname);
	PreventCommandDuringRecovery(fname);
}

/*
 * Label OIDs of the enums idem returns, kept per backend: a prepared
 * statement gets a fresh fn_extra at every execution, so fn_extra alone
 * would look the labels up on every call.  Any change to pg_type drops them.
 */
#define ENUM_CACHE_SIZE		8
#define ENUM_MAX_LABELS		8

typedef struct EnumCacheEntry
{
	Oid			typoid;
	int			nlabels;
	Oid			oids[ENUM_MAX_LABELS];
} EnumCacheEntry;

static EnumCacheEntry enum_cache[ENUM_CACHE_SIZE];
static int	enum_cache_used = 0;
static bool enum_cache_registered = false;

static void
enum_cache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	enum_cache_used = 0;
}

/*
 * Return the OID of label number "index" of the enum the function returns.
 */
Oid
idem_enum_label_oid(FunctionCallInfo fcinfo, int index,
					const char *const *labels, int nlabels)
{
	Oid			typoid = get_fn_expr_rettype(fcinfo->flinfo);

	/* a call through the fast-path protocol has no expression */
	if (!OidIsValid(typoid) && fcinfo->flinfo != NULL)
		typoid = get_func_rettype(fcinfo->flinfo->fn_oid);
	if (!OidIsValid(typoid))
		elog(ERROR, "could not determine the result type of an idem function");
	return idem_enum_type_label_oid(typoid, index, labels, nlabels);
}

/*
 * The same for the enum typoid (a column of a composite result, for one).
 */
Oid
idem_enum_type_label_oid(Oid typoid, int index, const char *const *labels,
						 int nlabels)
{
	EnumCacheEntry entry;
	int			i;

	Assert(index >= 0 && index < nlabels && nlabels <= ENUM_MAX_LABELS);

	for (i = 0; i < enum_cache_used; i++)
	{
		if (enum_cache[i].typoid == typoid && enum_cache[i].nlabels == nlabels)
			return enum_cache[i].oids[index];
	}

	if (!enum_cache_registered)
	{
		/* a label renamed changes pg_enum only */
		CacheRegisterSyscacheCallback(TYPEOID, enum_cache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(ENUMOID, enum_cache_callback, (Datum) 0);
		enum_cache_registered = true;
	}
	/* look up into a local entry: the lookups may reset the cache */
	entry.typoid = typoid;
	entry.nlabels = nlabels;
	for (i = 0; i < nlabels; i++)
	{
		entry.oids[i] = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
										ObjectIdGetDatum(typoid),
										CStringGetDatum(labels[i]));
		if (!OidIsValid(entry.oids[i]))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("type %s of the idem extension has no label \"%s\"",
							format_type_be(typoid), labels[i]),
					 errhint("Undo the change to the type, or recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
	}
	if (enum_cache_used >= ENUM_CACHE_SIZE)
		enum_cache_used = 0;	/* more enums than expected: start over */
	enum_cache[enum_cache_used++] = entry;
	return entry.oids[index];
}

/*
 * idem._check_ns(ns): the namespace check, for the functions written in SQL.
 */
PG_FUNCTION_INFO_V1(idem_check_ns);
Datum
idem_check_ns(PG_FUNCTION_ARGS)
{
	(void) idem_arg_ns(fcinfo, 0);
	PG_RETURN_VOID();
}

/*
 * A standby has only the init fork of an unlogged table (one of idem's
 * tables made unlogged by hand, as idem.tokens may be): refuse it as the
 * planner does (get_relation_info) rather than fail on the missing file.
 */
void
idem_check_readable(Relation rel, const char *relname)
{
	if (!RelationIsPermanent(rel) && RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot access temporary or unlogged relations during recovery"),
				 errdetail("Table \"%s.%s\" is unlogged: a standby holds none of its rows.",
						   IDEM_SCHEMA, relname),
				 errhint("Query the primary, or make the table logged with ALTER TABLE ... SET LOGGED.")));
}

/*
 * Check that one of idem's tables has the columns the C code reads: their
 * number (dropped ones included, since rows are formed by position), names,
 * types, NOT NULL where the code or a key relies on it, and collation where
 * a key is compared bytewise.  A table altered by its owner (ALTER COLUMN
 * ... TYPE, DROP COLUMN) is refused with 55000 instead of being read with
 * the wrong types.
 */
void
idem_check_columns(TupleDesc desc, const char *relname,
				   const IdemColumn *cols, int ncols)
{
	int			i;

	if (desc->natts != ncols)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" does not have the expected columns",
						IDEM_SCHEMA, relname),
				 errdetail("The table has %d columns (dropped ones included); idem expects %d.",
						   desc->natts, ncols),
				 errhint("Undo the change to the table.")));
	for (i = 0; i < ncols; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		const IdemColumn *col = &cols[i];

		if (att->attisdropped || strcmp(NameStr(att->attname), col->name) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" does not have the expected columns",
							IDEM_SCHEMA, relname),
					 errdetail("Column %d is not \"%s\".", i + 1, col->name),
					 errhint("Undo the change to the table.")));
		if (att->atttypid != col->type)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" does not have the expected columns",
							IDEM_SCHEMA, relname),
					 errdetail("Column \"%s\" is of type %s; idem expects %s.",
							   col->name, format_type_be(att->atttypid),
							   format_type_be(col->type)),
					 errhint("Undo the change to the table.")));
		if (col->notnull && !att->attnotnull)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" does not have the expected columns",
							IDEM_SCHEMA, relname),
					 errdetail("Column \"%s\" must be NOT NULL.", col->name),
					 errhint("Undo the change to the table.")));
		if (OidIsValid(col->collation) && att->attcollation != col->collation)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"%s.%s\" does not have the expected columns",
							IDEM_SCHEMA, relname),
					 errdetail("Column \"%s\" must have the collation \"C\".",
							   col->name),
					 errhint("Undo the change to the table.")));
	}
}

/*
 * A primary key is scanned with keys of the types of the columns it is
 * expected on: one on other columns (an expression is column 0) would
 * compare them with the wrong functions, and a partial one, or one not yet
 * built (left by a CREATE INDEX CONCURRENTLY that failed), would hide rows.
 * One that is not unique would let a row's key be inserted twice where the
 * executor's path for other indexes checks nothing.
 */
void
idem_check_index(Relation index, Relation rel, int nkeys,
				 const AttrNumber *attnums)
{
	bool		ok;
	int			i;

	ok = index->rd_index->indrelid == RelationGetRelid(rel) &&
		index->rd_rel->relam == BTREE_AM_OID &&
		index->rd_index->indnkeyatts == nkeys &&
		index->rd_index->indisunique &&
		index->rd_index->indisvalid && index->rd_index->indisready &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);
	for (i = 0; ok && i < nkeys; i++)
		ok = index->rd_index->indkey.values[i] == attnums[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s.%s\" of the idem extension is not the one idem made",
						IDEM_SCHEMA, RelationGetRelationName(index)),
				 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
}
