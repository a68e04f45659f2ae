/*-------------------------------------------------------------------------
 *
 * guard_transition.c
 *	  idem_transition: moving one row of a guarded table.
 *
 * Owns idem_transition and its two paths: the direct path, which updates the
 * row itself as logical replication applies a change, and the SPI path, a
 * plan prepared once per table and kept, for the tables the direct path does
 * not handle.  Either way the guard trigger decides the request on the
 * locked row (guard_trigger.c).
 *
 * The guard as a whole is described in guard.h.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/stratnum.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/objectaddress.h"
#include "catalog/partition.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "catalog/pg_index.h"
#include "catalog/pg_inherits.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "optimizer/optimizer.h"
#include "rewrite/prs2lock.h"
#include "rewrite/rewriteDefine.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "utils/partcache.h"

#include "idem.h"
#include "guard.h"

static const char *const transition_result_labels[] = {
	"applied", "already", "stale", "illegal", "not_found"
};

/* ----------------------------------------------------------------
 * idem_transition
 * ----------------------------------------------------------------
 */

/*
 * How the direct path finds the row of a key in the table it updates: the
 * index, its key columns in that table (in the order of the key's values)
 * and their equality functions and collations.  For a table, its primary
 * key; for a partition reached through its partitioned table, the partition
 * of the partitioned table's primary key, whose columns may have other
 * numbers than in the partitioned table.
 */
typedef struct KeyLookup
{
	Oid			index;
	int			natts;
	AttrNumber	attnums[INDEX_MAX_KEYS];
	const Oid  *collations;
	FmgrInfo   *eq;
} KeyLookup;

static void
key_lookup_own(KeyLookup *key, GuardEntry *entry)
{
	key->index = entry->key_index;
	key->natts = entry->key_natts;
	memcpy(key->attnums, entry->key_attnums, entry->key_natts * sizeof(AttrNumber));
	key->collations = entry->key_collations;
	key->eq = entry->key_eq;
}

/*
 * The key of a partitioned table's row in the partition it is in: the
 * partition of the partitioned table's primary key (not the partition's own
 * primary key, which may have other columns or another order, or not exist),
 * its columns found by name.  Returns false when that index cannot be
 * searched with the partitioned table's key values as they are (then the
 * UPDATE goes through the partitioned table).
 */
static bool
key_lookup_leaf(KeyLookup *key, Relation parent, GuardEntry *entry,
				Relation leaf)
{
	Oid			idxoid = index_get_partition(leaf, entry->key_index);
	Relation	index;
	bool		ok = true;
	int			i;

	if (!OidIsValid(idxoid))
		return false;
	index = index_open(idxoid, AccessShareLock);
	if (!index->rd_index->indisvalid || !index->rd_index->indisunique ||
		IndexRelationGetNumberOfKeyAttributes(index) != entry->key_natts)
		ok = false;
	for (i = 0; ok && i < entry->key_natts; i++)
	{
		const char *name = NameStr(TupleDescAttr(RelationGetDescr(parent),
												 entry->key_attnums[i] - 1)->attname);
		AttrNumber	attnum = get_attnum(RelationGetRelid(leaf), name);

		if (attnum == InvalidAttrNumber ||
			index->rd_index->indkey.values[i] != attnum ||
			index->rd_indcollation[i] != entry->key_collations[i] ||
			get_opfamily_member(index->rd_opfamily[i],
								index->rd_opcintype[i],
								index->rd_opcintype[i],
								BTEqualStrategyNumber) != entry->key_eqops[i] ||
			TupleDescAttr(RelationGetDescr(leaf), attnum - 1)->atttypid !=
			TupleDescAttr(RelationGetDescr(parent),
						  entry->key_attnums[i] - 1)->atttypid)
			ok = false;
		else
			key->attnums[i] = attnum;
	}
	index_close(index, AccessShareLock);
	if (!ok)
		return false;
	key->index = idxoid;
	key->natts = entry->key_natts;
	key->collations = entry->key_collations;
	key->eq = entry->key_eq;
	return true;
}

/*
 * What idem_transition needs to find a row by its key: the primary key
 * index, its single column, the equality operator of its operator class (as
 * the core RI triggers use) and the input functions of the key and the
 * state.  Kept with the guard entry, read again after the table changed.
 */
/*
 * Whether the table's primary key is deferrable: RelationGetPrimaryKeyIndex
 * leaves such a key out, as one that does not make its columns unique at
 * every moment.
 */
static bool
guard_has_deferrable_pkey(Relation rel)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	bool		found = false;

	foreach(lc, indexes)
	{
		HeapTuple	tup = SearchSysCache1(INDEXRELID,
										  ObjectIdGetDatum(lfirst_oid(lc)));

		if (!HeapTupleIsValid(tup))
			continue;
		if (((Form_pg_index) GETSTRUCT(tup))->indisprimary)
			found = true;
		ReleaseSysCache(tup);
	}
	list_free(indexes);
	return found;
}

static void
guard_prepare_key(GuardEntry *entry, Relation rel)
{
	Oid			pkoid;
	Relation	index;
	int			natts;
	int			i;
	Oid			infn;

	if (entry->key_valid)
		return;

	entry->generation++;
	pkoid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(pkoid) && guard_has_deferrable_pkey(rel))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("primary key of table \"%s\" is deferrable",
						RelationGetRelationName(rel)),
				 errdetail("idem_transition() finds one row by its primary key, which may hold duplicates until the transaction commits."),
				 errhint("Make the primary key NOT DEFERRABLE.")));
	if (!OidIsValid(pkoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" has no primary key",
						RelationGetRelationName(rel)),
				 errhint("idem_transition() finds rows by their primary key.")));
	index = index_open(pkoid, AccessShareLock);
	natts = IndexRelationGetNumberOfKeyAttributes(index);
	for (i = 0; i < natts; i++)
	{
		Oid			eqop;
		Form_pg_attribute att;

		if (index->rd_index->indkey.values[i] == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("primary key of table \"%s\" has an expression",
							RelationGetRelationName(rel))));
		entry->key_attnums[i] = index->rd_index->indkey.values[i];
		eqop = get_opfamily_member(index->rd_opfamily[i],
								   index->rd_opcintype[i],
								   index->rd_opcintype[i],
								   BTEqualStrategyNumber);
		if (!OidIsValid(eqop))
			elog(ERROR, "no equality operator for the primary key of \"%s\"",
				 RelationGetRelationName(rel));
		entry->key_eqops[i] = eqop;
		entry->key_collations[i] = index->rd_indcollation[i];
		fmgr_info_cxt(get_opcode(eqop), &entry->key_eq[i], entry->fn_cxt);

		att = TupleDescAttr(RelationGetDescr(rel), entry->key_attnums[i] - 1);
		/*
		 * The key is read as "WHERE key = $1" reads its parameter: of the
		 * column's base type, without its typmod (no rounding to the
		 * column's scale, no domain check).
		 */
		entry->key_types[i] = getBaseType(att->atttypid);
		entry->key_typmods[i] = -1;
		getTypeInputInfo(entry->key_types[i], &infn, &entry->key_ioparams[i]);
		fmgr_info_cxt(infn, &entry->key_in[i], entry->fn_cxt);
	}
	index_close(index, AccessShareLock);
	entry->key_natts = natts;

	getTypeInputInfo(entry->state_type, &infn, &entry->state_ioparam);
	fmgr_info_cxt(infn, &entry->state_in, entry->fn_cxt);

	entry->key_index = pkoid;
	entry->key_valid = true;
}

/*
 * The outcomes of idem_transition tell the row's state (already, stale,
 * illegal) and, tried with several expected versions, its version.  The
 * caller must therefore be allowed to read the key, the state and the
 * version, as a hand-written "UPDATE t SET state = $2 WHERE key = $1 AND
 * state = ... AND version = ..." needs; the error is that UPDATE's.
 */
static bool
keys_readable(Oid relid, GuardEntry *entry, Oid userid)
{
	int			i;

	for (i = 0; i < entry->key_natts; i++)
		if (pg_attribute_aclcheck(relid, entry->key_attnums[i], userid,
								  ACL_SELECT) != ACLCHECK_OK)
			return false;
	return true;
}

static void
check_outcome_privileges(Relation rel, GuardEntry *entry)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			userid = GetUserId();

	if (pg_class_aclcheck(relid, userid, ACL_SELECT) == ACLCHECK_OK)
		return;
	if (keys_readable(relid, entry, userid) &&
		pg_attribute_aclcheck(relid, entry->state_attnum, userid,
							  ACL_SELECT) == ACLCHECK_OK &&
		(entry->version_attnum == InvalidAttrNumber ||
		 pg_attribute_aclcheck(relid, entry->version_attnum, userid,
							   ACL_SELECT) == ACLCHECK_OK))
		return;
	aclcheck_error(ACLCHECK_NO_PRIV,
				   get_relkind_objtype(rel->rd_rel->relkind),
				   RelationGetRelationName(rel));
}

/* Free the plans retired while calls ran them: none does any more. */
static void
guard_free_retired_plans(GuardEntry *entry)
{
	ListCell   *lc;

	Assert(entry->busy == 0);
	foreach(lc, entry->retired_plans)
		SPI_freeplan((SPIPlanPtr) lfirst(lc));
	list_free(entry->retired_plans);
	entry->retired_plans = NIL;
}

/* Free the plans of the entry, retired or current: no call runs them. */
void
guard_free_plans(GuardEntry *entry)
{
	guard_free_retired_plans(entry);
	if (entry->update_plan != NULL)
		SPI_freeplan(entry->update_plan);
	if (entry->exists_plan != NULL)
		SPI_freeplan(entry->exists_plan);
	if (entry->lock_plan != NULL)
		SPI_freeplan(entry->lock_plan);
	entry->update_plan = NULL;
	entry->exists_plan = NULL;
	entry->lock_plan = NULL;
}

/*
 * Prepare and keep the plans of the SPI path of a guarded table (once per
 * table and backend, again after the table changed):
 *
 *	UPDATE ONLY t SET state = $2 WHERE key = $1
 *	SELECT 1 FROM ONLY t WHERE key = $1 FOR KEY SHARE
 *	SELECT state [, version] FROM ONLY t WHERE key = $1 FOR [NO KEY] UPDATE
 *
 * with the equality operator of the primary key's operator class.  The
 * second tells, after an UPDATE that found nothing to update, whether a row
 * has the key: in its latest version, as the UPDATE judged it (a row deleted
 * or given another key while the UPDATE waited is no row), and one that a
 * trigger skipped is locked by this transaction already.  The third locks
 * the row as the UPDATE would, before it, so that a move the guard refuses
 * runs none of the rules and triggers the UPDATE would.  It reads only the
 * columns the caller must be allowed to read (on a partitioned table, those
 * of the partitioned table, whose guard its partitions' clone).  Must be called connected to
 * SPI, after guard_prepare_key().
 */
static pg_noinline void
guard_prepare_plans(GuardEntry *entry, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	char	   *relname;
	char	   *statecol;
	const char *only;
	Oid			argtypes[INDEX_MAX_KEYS + 1];
	StringInfoData cond;
	StringInfoData sql;
	SPIPlanPtr	update_plan;
	SPIPlanPtr	exists_plan;
	SPIPlanPtr	lock_plan;
	int			n = entry->key_natts;
	int			i;

	/*
	 * (The key may have been marked invalid since guard_prepare_key, by an
	 * invalidation taken in with a lock the arguments' input functions took:
	 * its fields stay as read until it is read again, which the call's
	 * generation check would notice.)
	 */
	if (entry->plans_valid && entry->update_plan != NULL)
		return;

	/* key1 = $1 AND key2 = $2 ..., with the operators of the key */
	initStringInfo(&cond);
	for (i = 0; i < n; i++)
	{
		HeapTuple	optup;
		Form_pg_operator op;

		optup = SearchSysCache1(OPEROID, ObjectIdGetDatum(entry->key_eqops[i]));
		if (!HeapTupleIsValid(optup))
			elog(ERROR, "cache lookup failed for operator %u",
				 entry->key_eqops[i]);
		op = (Form_pg_operator) GETSTRUCT(optup);
		appendStringInfo(&cond, "%s%s OPERATOR(%s.%s) $%d",
						 i > 0 ? " AND " : "",
						 quote_identifier(NameStr(TupleDescAttr(desc,
																entry->key_attnums[i] - 1)->attname)),
						 quote_identifier(get_namespace_name(op->oprnamespace)),
						 NameStr(op->oprname), i + 1);
		ReleaseSysCache(optup);
		argtypes[i] = entry->key_types[i];
	}
	argtypes[n] = entry->state_type;
	statecol = pstrdup(quote_identifier(NameStr(TupleDescAttr(desc,
															  entry->state_attnum - 1)->attname)));
	relname = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
										 RelationGetRelationName(rel));
	/* a partitioned table finds the row in its partitions */
	only = rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE ? "" : "ONLY ";

	initStringInfo(&sql);
	appendStringInfo(&sql, "UPDATE %s%s SET %s = $%d WHERE %s",
					 only, relname, statecol, n + 1, cond.data);
	update_plan = SPI_prepare(sql.data, n + 1, argtypes);
	if (update_plan == NULL)
		elog(ERROR, "SPI_prepare of \"%s\" failed: %s", sql.data,
			 SPI_result_code_string(SPI_result));
	resetStringInfo(&sql);
	appendStringInfo(&sql, "SELECT 1 FROM %s%s WHERE %s FOR KEY SHARE",
					 only, relname, cond.data);
	exists_plan = SPI_prepare(sql.data, n, argtypes);
	if (exists_plan == NULL)
		elog(ERROR, "SPI_prepare of \"%s\" failed: %s", sql.data,
			 SPI_result_code_string(SPI_result));
	{
		resetStringInfo(&sql);
		appendStringInfo(&sql, "SELECT %s", statecol);
		if (entry->version_attnum != InvalidAttrNumber)
			appendStringInfo(&sql, ", %s",
							 quote_identifier(NameStr(TupleDescAttr(desc,
																	entry->version_attnum - 1)->attname)));
		/* the lock the UPDATE of the state takes (ExecUpdateLockMode) */
		appendStringInfo(&sql, " FROM %s%s WHERE %s FOR %s",
						 only, relname, cond.data,
						 bms_is_member(entry->state_attnum -
									   FirstLowInvalidHeapAttributeNumber,
									   RelationGetIndexAttrBitmap(rel,
																  INDEX_ATTR_BITMAP_KEY)) ?
						 "UPDATE" : "NO KEY UPDATE");
		lock_plan = SPI_prepare(sql.data, n, argtypes);
		if (lock_plan == NULL)
			elog(ERROR, "SPI_prepare of \"%s\" failed: %s", sql.data,
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(lock_plan);
	}
	SPI_keepplan(update_plan);
	SPI_keepplan(exists_plan);

	/*
	 * Plans an outer call may still run are retired, and freed when it is
	 * done (see run_request_spi).
	 */
	if (entry->busy == 0)
		guard_free_plans(entry);
	else
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(CacheMemoryContext);

		if (entry->update_plan != NULL)
			entry->retired_plans = lappend(entry->retired_plans,
										   entry->update_plan);
		if (entry->exists_plan != NULL)
			entry->retired_plans = lappend(entry->retired_plans,
										   entry->exists_plan);
		if (entry->lock_plan != NULL)
			entry->retired_plans = lappend(entry->retired_plans,
										   entry->lock_plan);
		MemoryContextSwitchTo(oldcxt);
	}
	entry->update_plan = update_plan;
	entry->exists_plan = exists_plan;
	entry->lock_plan = lock_plan;
	entry->plans_valid = true;
}

/*
 * The snapshot the UPDATE of a transition runs with: that of the statement
 * that called idem_transition, as if the UPDATE were written in its place
 * (the row itself is locked in its latest version, as any UPDATE does).
 * SPI would otherwise take a new one for every call.
 */
static Snapshot
statement_snapshot(void)
{
	return ActiveSnapshotSet() ? GetActiveSnapshot() : InvalidSnapshot;
}

/*
 * idem_transition stands for an UPDATE of one row: a rule that does instead
 * of the table's UPDATE something else (nothing, an INSERT, an UPDATE of
 * another table), or does it only for some rows, leaves no transition to
 * judge.  Such a rule, as it would fire in this session, is refused.
 */
static void
refuse_instead_rules(Relation rel)
{
	RuleLock   *rules = rel->rd_rules;
	int			i;

	if (rules == NULL)
		return;
	for (i = 0; i < rules->numLocks; i++)
	{
		RewriteRule *rule = rules->rules[i];

		if (rule->event != CMD_UPDATE || !rule->isInstead ||
			rule->enabled == RULE_DISABLED)
			continue;
		if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA ?
			rule->enabled == RULE_FIRES_ON_ORIGIN :
			rule->enabled == RULE_FIRES_ON_REPLICA)
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem_transition cannot move a row of table \"%s\"",
						RelationGetRelationName(rel)),
				 errdetail("A DO INSTEAD rule rewrites the UPDATE of the table."),
				 errhint("Make the transition with an UPDATE, which the guard checks as well, or drop the rule.")));
	}
}

/*
 * Run the UPDATE of a transition with the request made visible to the
 * trigger; returns the number of rows updated.
 */
static uint64
run_request(SPIPlanPtr plan, Datum *values, TransitionRequest *req)
{
	volatile uint64 processed = 0;

	/* the guard fires within the ExecutorRun of the UPDATE */
	req->level = guard_executor_level() + 1;
	req->by_spi = true;
	guard_active_request = req;
	PG_TRY();
	{
		int			rc = SPI_execute_snapshot(plan, values, NULL,
											  statement_snapshot(),
											  InvalidSnapshot, false, true, 0);

		if (rc == SPI_OK_REWRITTEN)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the UPDATE of a transition was rewritten by a rule"),
					 errhint("Make the transition with an UPDATE, which the guard checks as well, or drop the rule.")));
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "SPI_execute_plan of the transition failed: %s",
				 SPI_result_code_string(rc));
		processed = SPI_processed;
	}
	PG_FINALLY();
	{
		guard_active_request = req->outer;
	}
	PG_END_TRY();
	return processed;
}

static bool guard_fires(TriggerDesc *td, Oid tgoid);
static void check_parent_privileges(Relation rel, GuardEntry *entry);
static void guard_entry_check_unchanged(GuardEntry *entry, uint64 generation,
										Relation rel);

/*
 * The transition through SPI: the row locked and judged first, its UPDATE
 * when the move is allowed, then, when that moved no row and the guard did
 * not fire, a look for the row.  The plans stay allocated until they have
 * run: a policy, trigger or rule of the table may call
 * idem_transition on it again after an invalidation, and that call
 * prepares new plans (see guard_prepare_plans).  Returns the number of
 * rows updated, and in *found whether the row is there.
 */
static pg_noinline uint64
run_request_spi(GuardEntry *entry, Relation rel, Datum *values,
				TransitionRequest *req, uint64 generation, bool *found)
{
	SPIPlanPtr	update_plan;
	SPIPlanPtr	exists_plan;
	SPIPlanPtr	lock_plan;
	volatile uint64 processed = 0;
	volatile bool exists = false;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	guard_prepare_plans(entry, rel);
	update_plan = entry->update_plan;
	exists_plan = entry->exists_plan;
	lock_plan = entry->lock_plan;
	entry->busy++;
	PG_TRY();
	{
		TransitionOutcome pre = OUTCOME_APPLIED;

		/*
		 * The row locked first, as the UPDATE would lock it, and judged as
		 * the guard would judge it (on the row as it is, not on what the
		 * triggers before it make of the new one): a refused move leaves
		 * the UPDATE unrun, and with it the actions of the table's DO ALSO
		 * rules and the triggers that fire before the guard, which the
		 * UPDATE it stands for, failing, would have undone.
		 */
		if (lock_plan != NULL && guard_fires(rel->trigdesc, entry->tgoid))
		{
			int			rc;

			/* the UPDATE's privileges, which the lock alone does not need */
			check_parent_privileges(rel, entry);
			rc = SPI_execute_snapshot(lock_plan, values, NULL,
									  statement_snapshot(), InvalidSnapshot,
									  false, true, 1);
			if (rc != SPI_OK_SELECT)
				elog(ERROR, "SPI_execute_plan of the lock failed: %s",
					 SPI_result_code_string(rc));
			/* its policies may have run any SQL, the guard read again */
			guard_entry_check_unchanged(entry, generation, rel);
			if (SPI_processed > 0)
			{
				TupleDesc	desc = RelationGetDescr(rel);
				Datum	   *vals = palloc0(desc->natts * sizeof(Datum));
				bool	   *nulls = palloc(desc->natts * sizeof(bool));
				HeapTuple	row;

				memset(nulls, true, desc->natts * sizeof(bool));
				vals[entry->state_attnum - 1] =
					SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
								  1, &nulls[entry->state_attnum - 1]);
				if (entry->version_attnum != InvalidAttrNumber)
					vals[entry->version_attnum - 1] =
						SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 2,
									  &nulls[entry->version_attnum - 1]);
				row = heap_form_tuple(desc, vals, nulls);
				pre = guard_decide(entry, req, row, desc);
			}
		}
		if (pre != OUTCOME_APPLIED)
		{
			req->fired = true;
			req->outcome = pre;
			exists = true;
			guard_refused_before_firing();
		}
		else
			processed = run_request(update_plan, values, req);
		exists = (exists || processed > 0 || req->fired);
		if (!exists)
		{
			int			rc = SPI_execute_snapshot(exists_plan, values, NULL,
												  statement_snapshot(),
												  InvalidSnapshot, false,
												  true, 1);

			if (rc != SPI_OK_SELECT)
				elog(ERROR, "SPI_execute_plan of the lookup failed: %s",
					 SPI_result_code_string(rc));
			exists = (SPI_processed > 0);
		}
	}
	PG_FINALLY();
	{
		entry->busy--;
	}
	PG_END_TRY();
	/* (after an error, the next call that prepares plans frees them) */
	if (entry->busy == 0 && entry->retired_plans != NIL)
		guard_free_retired_plans(entry);
	SPI_finish();
	*found = exists;
	return processed;
}

/*
 * Whether idem_transition may update the row itself, as logical replication
 * applies a change, instead of running its UPDATE through SPI.  What the
 * direct path does not do, the SPI path keeps: row-level security, rules,
 * statement-level triggers and transition tables, stored generated columns.
 */
static bool
direct_path_ok(Relation rel)
{
	TriggerDesc *td = rel->trigdesc;

	if (rel->rd_rules != NULL)
		return false;
	if (td != NULL &&
		(td->trig_update_before_statement || td->trig_update_after_statement ||
		 td->trig_update_instead_row ||
		 td->trig_update_old_table || td->trig_update_new_table))
		return false;
	if (rel->rd_att->constr != NULL && rel->rd_att->constr->has_generated_stored)
		return false;
	if (rel->rd_rel->relrowsecurity &&
		check_enable_rls(RelationGetRelid(rel), InvalidOid, false) == RLS_ENABLED)
		return false;
	return true;
}

/* Whether trigger t fires in this session (session_replication_role). */
static bool
trigger_fires_here(Trigger *t)
{
	if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA)
		return (t->tgenabled == TRIGGER_FIRES_ON_REPLICA ||
				t->tgenabled == TRIGGER_FIRES_ALWAYS);
	return (t->tgenabled == TRIGGER_FIRES_ON_ORIGIN ||
			t->tgenabled == TRIGGER_FIRES_ALWAYS);
}

/* Whether the trigger tgoid of td fires in this session. */
static bool
guard_fires(TriggerDesc *td, Oid tgoid)
{
	int			i;

	if (td == NULL)
		return false;
	for (i = 0; i < td->numtriggers; i++)
		if (td->triggers[i].tgoid == tgoid)
			return trigger_fires_here(&td->triggers[i]);
	return false;
}

/*
 * Whether the guard is the only BEFORE ROW UPDATE trigger of the table that
 * may fire, and fires in this session, without a WHEN condition.  Then
 * idem_transition can run the guard's checks itself.
 */
static bool
guard_alone(TriggerDesc *td, GuardEntry *entry)
{
	bool		guard_fires = false;
	int			i;

	if (td == NULL)
		return false;
	for (i = 0; i < td->numtriggers; i++)
	{
		Trigger    *t = &td->triggers[i];
		bool		fires;

		if (!TRIGGER_TYPE_MATCHES(t->tgtype, TRIGGER_TYPE_ROW,
								  TRIGGER_TYPE_BEFORE, TRIGGER_TYPE_UPDATE))
			continue;
		fires = trigger_fires_here(t);
		if (t->tgoid == entry->tgoid && t->tgqual == NULL && t->tgnattr == 0)
			guard_fires = fires;
		else if (t->tgenabled != TRIGGER_DISABLED)
			return false;
	}
	return guard_fires;
}

/*
 * Whether a BEFORE ROW UPDATE trigger other than the guard may fire on a
 * partition.  Such a trigger may change the partition key: the UPDATE of the
 * partitioned table then moves the row to another partition, which an
 * update of the partition itself cannot do.  idem_transition then updates
 * through the partitioned table.
 */
static bool
other_before_row_update(TriggerDesc *td, Oid guard_tgoid)
{
	int			i;

	if (td == NULL)
		return false;
	for (i = 0; i < td->numtriggers; i++)
	{
		Trigger    *t = &td->triggers[i];

		if (TRIGGER_TYPE_MATCHES(t->tgtype, TRIGGER_TYPE_ROW,
								 TRIGGER_TYPE_BEFORE, TRIGGER_TYPE_UPDATE) &&
			t->tgoid != guard_tgoid && t->tgenabled != TRIGGER_DISABLED)
			return true;
	}
	return false;
}

/*
 * The common case of the direct path, without a row lock: the row as the
 * snapshot sees it allows the move, and the update finds it unchanged.  The
 * guard's checks run here rather than through the trigger manager (the guard
 * being the only BEFORE ROW UPDATE trigger), and the update itself says
 * whether another transaction changed the row since the snapshot (it waits
 * for one still running, as an UPDATE does).  Returns false, having written
 * nothing, when the request is not applied on this version or the row
 * changed: the caller then locks the latest version and decides again, as
 * an UPDATE checks its condition again on it.
 *
 * Nothing may be refused on the snapshot's version, which may be old: an
 * UPDATE with the guard locks the row first (a BEFORE ROW trigger does), so
 * its checks see the latest version.  A row the guard would refuse (a NULL
 * version, or one that cannot go up) takes the locking path, and the
 * table's constraints are checked once the update has found the row
 * unchanged: an error then undoes the update with the (sub)transaction.
 */
static bool
apply_unlocked(Relation rel, GuardEntry *entry, ResultRelInfo *rri,
			   EState *estate, TupleTableSlot *slot, Datum to_state,
			   TransitionRequest *req)
{
	TupleDesc	desc = RelationGetDescr(rel);
	bool		should_free;
	HeapTuple	oldtup = ExecFetchSlotHeapTuple(slot, false, &should_free);
	HeapTuple	newtup;
	TupleTableSlot *newslot;
	Datum	   *vals;
	bool	   *nulls;
	TM_FailureData tmfd;
	TM_Result	res;
	LockTupleMode lockmode;
	bool		update_indexes;
	List	   *recheck = NIL;

	if (guard_decide(entry, req, oldtup, desc) != OUTCOME_APPLIED)
		return false;

	/*
	 * SET state = $2, with the version the guard would write (so that the
	 * row is formed once); guard_update checks both again, and passes them:
	 * guard_decide() allowed the move and the version can go up.
	 */
	vals = palloc(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	heap_deform_tuple(oldtup, desc, vals, nulls);
	vals[entry->state_attnum - 1] = to_state;
	nulls[entry->state_attnum - 1] = false;
	if (entry->version_attnum != InvalidAttrNumber)
	{
		int64		v;

		if (nulls[entry->version_attnum - 1])
			return false;
		v = guard_version_value(entry, vals[entry->version_attnum - 1]);
		if (v >= guard_version_max(entry))
			return false;
		vals[entry->version_attnum - 1] = guard_version_datum(entry, v + 1);
	}
	newtup = guard_update(rel, entry, oldtup, heap_form_tuple(desc, vals, nulls));
	newslot = table_slot_create(rel, &estate->es_tupleTable);
	ExecForceStoreHeapTuple(newtup, newslot, false);

	res = table_tuple_update(rel, &slot->tts_tid, newslot,
							 estate->es_output_cid, estate->es_snapshot,
							 InvalidSnapshot, true, &tmfd, &lockmode,
							 &update_indexes);
	switch (res)
	{
		case TM_Ok:
			break;
		case TM_Updated:
		case TM_Deleted:
		case TM_SelfModified:
			/* changed since the snapshot: the locking path sorts it out */
			return false;
		default:
			elog(ERROR, "unexpected table_tuple_update status: %u", res);
	}

	/* the row was the latest version: its checks are the UPDATE's */
	if (rel->rd_att->constr)
		ExecConstraints(rri, newslot, estate);
	if (rel->rd_rel->relispartition)
		ExecPartitionCheck(rri, newslot, estate, true);

	req->fired = true;
	req->outcome = OUTCOME_APPLIED;
	if (rri->ri_NumIndices > 0 && update_indexes)
		recheck = ExecInsertIndexTuples(rri, newslot, estate, true, false,
										NULL, NIL);
	ExecARUpdateTriggers(estate, rri, NULL, NULL, &slot->tts_tid, NULL,
						 newslot, recheck, NULL, false);
	list_free(recheck);
	return true;
}

/* guard_decide on the row in slot, a version of rel's. */
static TransitionOutcome
guard_decide_slot(GuardEntry *entry, TransitionRequest *req,
				  TupleTableSlot *slot, Relation rel)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	TransitionOutcome outcome = guard_decide(entry, req, tuple,
											 RelationGetDescr(rel));

	if (should_free)
		heap_freetuple(tuple);
	return outcome;
}

/*
 * The privileges of "UPDATE t SET state = $2 WHERE key = $1": SELECT on the
 * key's columns and UPDATE on the state column (and the hooks' say).  For a
 * partitioned table, which its partitions' own do not change, and before
 * the SPI path's lock, which needs UPDATE on any column only.
 */
static void
check_parent_privileges(Relation rel, GuardEntry *entry)
{
	RangeTblEntry *rte = makeNode(RangeTblEntry);
	int			i;

	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	rte->requiredPerms = ACL_SELECT | ACL_UPDATE;
	for (i = 0; i < entry->key_natts; i++)
		rte->selectedCols = bms_add_member(rte->selectedCols,
										   entry->key_attnums[i] -
										   FirstLowInvalidHeapAttributeNumber);
	rte->updatedCols = bms_make_singleton(entry->state_attnum -
										  FirstLowInvalidHeapAttributeNumber);
	ExecCheckRTPerms(list_make1(rte), true);
}

/*
 * The direct path of idem_transition: what "UPDATE ONLY t SET state = $2
 * WHERE key = $1" does, without a plan.  The row is found through the
 * primary key with the statement's snapshot (advanced past the commands of
 * this transaction, as SPI does).  When the guard is the table's only BEFORE
 * ROW UPDATE trigger and the move applies to that version, the row is
 * updated at once (apply_unlocked).  Otherwise, or when the row changed
 * since the snapshot, it is locked in its latest version (under READ
 * COMMITTED, after checking the key again, as EvalPlanQual would; under
 * REPEATABLE READ a concurrent change is the usual 40001), and updated with
 * the table's BEFORE ROW triggers (the guard deciding the request), its
 * constraints, its indexes and its AFTER ROW triggers.  Returns whether the
 * row was found; *updated says whether it was written.
 */
static bool
run_request_direct(Relation rel, GuardEntry *entry, const KeyLookup *key,
				   Relation perm_rel, GuardEntry *perm_entry, Datum *values,
				   TransitionRequest *req, bool *updated)
{
	EState	   *estate;
	RangeTblEntry *rte;
	ResultRelInfo *rri;
	EPQState	epqstate;
	Relation	index = NULL;
	IndexScanDesc scan;
	ScanKeyData skey[INDEX_MAX_KEYS];
	TupleTableSlot *slot;
	TupleTableSlot *newslot;
	TM_FailureData tmfd;
	TM_Result	res;
	LockTupleMode lockmode;
	Snapshot	snapshot;
	ItemPointerData tid;
	volatile bool found = false;
	bool		applied_unlocked = false;
	TransitionOutcome pre;
	int			i;

	*updated = false;

	CommandCounterIncrement();
	if (ActiveSnapshotSet())
		PushCopiedSnapshot(GetActiveSnapshot());
	else
		PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	snapshot = GetActiveSnapshot();

	estate = CreateExecutorState();
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	rte->requiredPerms = ACL_SELECT | ACL_UPDATE;
	rte->selectedCols = NULL;
	for (i = 0; i < key->natts; i++)
		rte->selectedCols = bms_add_member(rte->selectedCols,
										   key->attnums[i] -
										   FirstLowInvalidHeapAttributeNumber);
	rte->updatedCols = bms_make_singleton(entry->state_attnum -
										  FirstLowInvalidHeapAttributeNumber);
	ExecInitRangeTable(estate, list_make1(rte));
	/* the privileges of the UPDATE it stands for, and the hooks' say */
	if (perm_rel == rel)
		ExecCheckRTPerms(estate->es_range_table, true);
	else
		check_parent_privileges(perm_rel, perm_entry);

	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	estate->es_opened_result_relations = list_make1(rri);
	estate->es_output_cid = GetCurrentCommandId(true);
	estate->es_snapshot = snapshot;
	CheckValidResultRel(rri, CMD_UPDATE);
	ExecOpenIndices(rri, false);
	for (i = 0; i < rri->ri_NumIndices; i++)
		if (RelationGetRelid(rri->ri_IndexRelationDescs[i]) == key->index)
			index = rri->ri_IndexRelationDescs[i];
	if (index == NULL)
		elog(ERROR, "primary key of table \"%s\" was not opened",
			 RelationGetRelationName(rel));
	EvalPlanQualInit(&epqstate, estate, NULL, NIL, -1);
	AfterTriggerBeginQuery();

	slot = table_slot_create(rel, &estate->es_tupleTable);
	for (i = 0; i < key->natts; i++)
		ScanKeyEntryInitializeWithInfo(&skey[i], 0, i + 1,
									   BTEqualStrategyNumber, InvalidOid,
									   key->collations[i],
									   &key->eq[i], values[i]);
	scan = index_beginscan(rel, index, snapshot, key->natts, 0);
	index_rescan(scan, skey, key->natts, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		found = true;
		tid = slot->tts_tid;
	}
	index_endscan(scan);

	if (found && guard_alone(rri->ri_TrigDesc, entry) &&
		apply_unlocked(rel, entry, rri, estate, slot, values[key->natts], req))
	{
		applied_unlocked = true;
		ereport(DEBUG1,
				(errmsg_internal("idem_transition moved the row without locking it first")));
	}

	if (found && !applied_unlocked)
	{
		lockmode = ExecUpdateLockMode(estate, rri);
		res = table_tuple_lock(rel, &tid, snapshot, slot,
							   estate->es_output_cid, lockmode, LockWaitBlock,
							   IsolationUsesXactSnapshot() ? 0 :
							   TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
							   &tmfd);
		switch (res)
		{
			case TM_Ok:
				/* a newer version of the row must still have the key */
				if (tmfd.traversed)
				{
					bool		should_free;
					HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false,
															   &should_free);

					found = guard_request_matches(req, rel, tuple);
					if (should_free)
						heap_freetuple(tuple);
				}
				break;
			case TM_SelfModified:
				if (tmfd.cmax != estate->es_output_cid)
					ereport(ERROR,
							(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
							 errmsg("tuple to be updated was already modified by an operation triggered by the current command"),
							 errhint("Consider using an AFTER trigger instead of a BEFORE trigger to propagate changes to other rows.")));
				found = false;
				break;
			case TM_Updated:
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
				break;
			case TM_Deleted:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent delete")));
				found = false;
				break;
			default:
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
				break;
		}
	}

	if (applied_unlocked)
	{
		*updated = true;
		AfterTriggerEndQuery(estate);
	}
	else if (found && guard_fires(rri->ri_TrigDesc, entry->tgoid) &&
			 (pre = guard_decide_slot(entry, req, slot, rel)) != OUTCOME_APPLIED)
	{
		/*
		 * The guard judges the row as locked, whatever the triggers before
		 * it do to the new one: a refused move runs none of them, as the
		 * UPDATE it stands for, failing, would leave nothing of them.
		 */
		req->fired = true;
		req->outcome = pre;
		guard_refused_before_firing();
		AfterTriggerEndQuery(estate);
	}
	else if (found)
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		skip = false;
		bool		update_indexes = false;

		/* the new row: the old one with the state set, as the UPDATE builds it */
		slot_getallattrs(slot);
		newslot = table_slot_create(rel, &estate->es_tupleTable);
		memcpy(newslot->tts_values, slot->tts_values,
			   desc->natts * sizeof(Datum));
		memcpy(newslot->tts_isnull, slot->tts_isnull,
			   desc->natts * sizeof(bool));
		newslot->tts_values[entry->state_attnum - 1] = values[key->natts];
		newslot->tts_isnull[entry->state_attnum - 1] = false;
		ExecStoreVirtualTuple(newslot);
		tid = slot->tts_tid;

		/* the guard decides on the row the triggers before it left */
		guard_active_request = req;
		PG_TRY();
		{
			if (rri->ri_TrigDesc != NULL &&
				rri->ri_TrigDesc->trig_update_before_row &&
				!ExecBRUpdateTriggers(estate, &epqstate, rri, &tid, NULL,
									  newslot, NULL))
				skip = true;
			if (!skip)
			{
				if (rel->rd_att->constr)
					ExecConstraints(rri, newslot, estate);
				if (rel->rd_rel->relispartition)
					ExecPartitionCheck(rri, newslot, estate, true);

				/*
				 * With the executor's command id: a row that a trigger of
				 * this command changed meanwhile is then told apart, as
				 * ExecUpdate does.
				 */
				res = table_tuple_update(rel, &tid, newslot,
										 estate->es_output_cid, snapshot,
										 InvalidSnapshot, true, &tmfd,
										 &lockmode, &update_indexes);
				switch (res)
				{
					case TM_Ok:
						break;
					case TM_SelfModified:
						if (tmfd.cmax != estate->es_output_cid)
							ereport(ERROR,
									(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
									 errmsg("tuple to be updated was already modified by an operation triggered by the current command"),
									 errhint("Consider using an AFTER trigger instead of a BEFORE trigger to propagate changes to other rows.")));
						/* updated by this command already: nothing to do */
						skip = true;
						break;
					default:
						/* not possible: the row is locked */
						elog(ERROR, "unexpected table_tuple_update status: %u",
							 res);
						break;
				}
			}
			if (!skip)
			{
				List	   *recheck = NIL;

				if (rri->ri_NumIndices > 0 && update_indexes)
					recheck = ExecInsertIndexTuples(rri, newslot, estate,
													true, false, NULL, NIL);
				ExecARUpdateTriggers(estate, rri, NULL, NULL, &tid, NULL,
									 newslot, recheck, NULL, false);
				list_free(recheck);
				*updated = true;
			}
			AfterTriggerEndQuery(estate);
		}
		PG_FINALLY();
		{
			guard_active_request = req->outer;
		}
		PG_END_TRY();
	}
	else
		AfterTriggerEndQuery(estate);

	EvalPlanQualEnd(&epqstate);
	ExecCloseTrigTargetRelations(estate);
	ExecCloseIndices(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
	PopActiveSnapshot();
	CommandCounterIncrement();
	return found;
}

/*
 * The partition of a partitioned table (at any depth) where a row of that
 * primary key would be, as tuple routing finds it (get_partition_for_tuple
 * in execPartition.c): the partition key's columns are all in the primary
 * key, which PostgreSQL requires.  Each partitioned table on the way is
 * opened (and locked) as the UPDATE of the parent would.  Returns
 * InvalidOid when no partition takes the key (the row cannot exist), and
 * sets *usable to false when the route cannot be taken by hand: a partition
 * key with an expression, or one the state column is part of (a transition
 * would move the row), or a partition that is not an ordinary table.
 */
static Oid
route_to_leaf(Relation parent, GuardEntry *entry, Datum *keys, bool *usable)
{
	Relation	rel = parent;
	TupleDesc	pdesc = RelationGetDescr(parent);
	const char *statecol = NameStr(TupleDescAttr(pdesc, entry->state_attnum - 1)->attname);
	Oid			leaf = InvalidOid;

	*usable = true;
	for (;;)
	{
		PartitionKey key = RelationGetPartitionKey(rel);
		PartitionDesc pd = RelationGetPartitionDesc(rel, true);
		PartitionBoundInfo boundinfo = pd->boundinfo;
		Datum		values[PARTITION_MAX_KEYS];
		bool		isnull[PARTITION_MAX_KEYS];
		int			part_index = -1;
		int			i;
		Oid			next;

		for (i = 0; i < key->partnatts; i++)
		{
			const char *col;
			int			k;

			if (key->partattrs[i] == 0)
			{
				*usable = false;
				break;
			}
			col = NameStr(TupleDescAttr(RelationGetDescr(rel),
										key->partattrs[i] - 1)->attname);
			if (strcmp(col, statecol) == 0)
			{
				*usable = false;
				break;
			}
			for (k = 0; k < entry->key_natts; k++)
				if (strcmp(col, NameStr(TupleDescAttr(pdesc,
													  entry->key_attnums[k] - 1)->attname)) == 0)
					break;
			if (k == entry->key_natts)
			{
				*usable = false;
				break;
			}
			values[i] = keys[k];
			isnull[i] = false;
		}
		if (!*usable || pd->nparts == 0)
			break;

		switch (key->strategy)
		{
			case PARTITION_STRATEGY_HASH:
				{
					uint64		hash;

					hash = compute_partition_hash_value(key->partnatts,
														key->partsupfunc,
														key->partcollation,
														values, isnull);
					part_index = boundinfo->indexes[hash % boundinfo->nindexes];
				}
				break;
			case PARTITION_STRATEGY_LIST:
				{
					bool		equal = false;
					int			offset;

					offset = partition_list_bsearch(key->partsupfunc,
													key->partcollation,
													boundinfo, values[0],
													&equal);
					if (offset >= 0 && equal)
						part_index = boundinfo->indexes[offset];
				}
				break;
			case PARTITION_STRATEGY_RANGE:
				{
					bool		equal = false;
					int			offset;

					offset = partition_range_datum_bsearch(key->partsupfunc,
														   key->partcollation,
														   boundinfo,
														   key->partnatts,
														   values, &equal);
					part_index = boundinfo->indexes[offset + 1];
				}
				break;
			default:
				*usable = false;
				break;
		}
		if (!*usable)
			break;
		if (part_index < 0)
			part_index = boundinfo->default_index;
		if (part_index < 0)
			break;				/* no partition: no row */
		next = pd->oids[part_index];
		if (!pd->is_leaf[part_index])
		{
			Relation	sub = relation_open(next, RowExclusiveLock);

			if (rel != parent)
				relation_close(rel, NoLock);
			rel = sub;
			continue;
		}
		if (get_rel_relkind(next) != RELKIND_RELATION)
			*usable = false;
		else
			leaf = next;
		break;
	}
	if (rel != parent)
		relation_close(rel, NoLock);
	return *usable ? leaf : InvalidOid;
}

/*
 * The key given to idem_transition, as text: one value (nkeys = -1, the
 * form of a single-column primary key) or an array of them.
 */
typedef struct KeyArg
{
	int			nkeys;
	char	   *keys[INDEX_MAX_KEYS];
} KeyArg;

static Datum transition_common(FunctionCallInfo fcinfo, KeyArg *key);

/*
 * idem_transition(tbl regclass, key text, to_state text,
 *				   expected_version bigint DEFAULT NULL)
 * RETURNS idem_transition_result
 */
PG_FUNCTION_INFO_V1(idem_transition);
Datum
idem_transition(PG_FUNCTION_ARGS)
{
	KeyArg		key;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tbl must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("key must not be null")));
	key.nkeys = -1;
	key.keys[0] = text_to_cstring(PG_GETARG_TEXT_PP(1));
	return transition_common(fcinfo, &key);
}

/*
 * idem_transition(tbl regclass, key text[], to_state text,
 *				   expected_version bigint DEFAULT NULL)
 * RETURNS idem_transition_result
 *
 * The key's values in the order of the primary key's columns.
 */
PG_FUNCTION_INFO_V1(idem_transition_keys);
Datum
idem_transition_keys(PG_FUNCTION_ARGS)
{
	KeyArg		key;
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tbl must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("key must not be null")));
	arr = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("key must be a one-dimensional array"),
				 errdetail("The key has %d dimensions.", ARR_NDIM(arr))));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls,
					  &n);
	if (n > INDEX_MAX_KEYS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key has too many values"),
				 errdetail("The key has %d values; a primary key has at most %d columns.",
						   n, INDEX_MAX_KEYS)));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("key must not contain null values"),
					 errdetail("Value %d of the key is null.", i + 1)));
		key.keys[i] = TextDatumGetCString(elems[i]);
	}
	key.nkeys = n;
	return transition_common(fcinfo, &key);
}

/*
 * Fail when the entry was read again since generation (see the input of the
 * key and state in transition_common): what this call read with it, and the
 * functions it kept, belong to a guard that is no longer the table's.
 */
static void
guard_entry_check_unchanged(GuardEntry *entry, uint64 generation,
							Relation rel)
{
	if (entry->generation != generation)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the guard of table \"%s\" changed during idem_transition()",
						RelationGetRelationName(rel)),
				 errdetail("A function that idem_transition() ran (a domain's check, to read its arguments, or a row-level security policy) changed the guard of the table.")));
}

static Datum
transition_common(FunctionCallInfo fcinfo, KeyArg *key)
{
	char		machine[NAMEDATALEN];
	Relation	rel;
	Trigger    *trigger;
	GuardEntry *entry;
	char	   *to_str;
	Datum		values[INDEX_MAX_KEYS + 1];
	TransitionRequest req;
	bool		partitioned;
	bool		direct_done = false;
	int			i;
	uint64		processed;
	bool		found;
	TransitionOutcome outcome;
	char		tgname[NAMEDATALEN];
	uint64		generation;
	int			nkeys;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("to_state must not be null")));
	to_str = text_to_cstring(PG_GETARG_TEXT_PP(2));
	idem_check_writable("idem_transition()");

	/*
	 * Refuse a caller who may not update the table before taking any lock on
	 * it: a lock request alone would let anyone queue on any relation.  The
	 * UPDATE itself checks the exact column privileges later.
	 */
	{
		Oid			relid = PG_GETARG_OID(0);
		char		relkind = get_rel_relkind(relid);

		/* what no role may update is refused as such, as UPDATE does */
		if (relkind != '\0' && relkind != RELKIND_RELATION &&
			relkind != RELKIND_PARTITIONED_TABLE)
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("\"%s\" is not a table", get_rel_name(relid)),
					 errdetail("idem_transition() moves rows of ordinary and partitioned tables.")));
		if (relkind != '\0' &&
			pg_class_aclcheck(relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK &&
			pg_attribute_aclcheck_all(relid, GetUserId(), ACL_UPDATE,
									  ACLMASK_ANY) != ACLCHECK_OK)
			guard_check_privilege(relid, ACL_UPDATE);
	}
	rel = guard_open_table_arg(fcinfo, RowExclusiveLock);

	/*
	 * Only an ordinary table has rows of its own to update, and a
	 * partitioned table finds them in its partitions: a guard can be put on
	 * any table by hand.  Refuse the rest before anything reads it.
	 */
	if (rel->rd_rel->relkind != RELKIND_RELATION &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", RelationGetRelationName(rel)),
				 errdetail("idem_transition() moves rows of ordinary and partitioned tables.")));
	if (idem_relation_is_distributed(RelationGetRelid(rel)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" is distributed by Citus",
						RelationGetRelationName(rel)),
				 errdetail("idem_transition() updates rows of the table on the node where it runs; the rows of a distributed table are in its shards on other nodes.")));
	partitioned = (rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE);
	trigger = guard_find_trigger(rel, fcinfo->flinfo->fn_oid);
	if (trigger == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" is not guarded",
						RelationGetRelationName(rel)),
				 errhint("Guard it with idem_guard().")));
	if (trigger->tgenabled == TRIGGER_DISABLED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the guard of table \"%s\" is disabled",
						RelationGetRelationName(rel)),
				 errhint("Enable trigger \"%s\".", trigger->tgname)));
	strlcpy(tgname, trigger->tgname, NAMEDATALEN);
	entry = guard_entry_get(rel, trigger);
	strlcpy(machine, entry->machine, sizeof(machine));
	if (!PG_ARGISNULL(3) && entry->version_attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("table \"%s\" has no version column",
						RelationGetRelationName(rel)),
				 errhint("Call idem_transition() without expected_version, or guard the table with a version column.")));

	guard_prepare_key(entry, rel);
	if (key->nkeys < 0 && entry->key_natts != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("primary key of table \"%s\" is not a single column",
						RelationGetRelationName(rel)),
				 errhint("Give the key as an array of its %d values, in the order of the primary key's columns.",
						 entry->key_natts)));
	if (key->nkeys >= 0 && key->nkeys != entry->key_natts)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg_plural("the key must have %d value, as the primary key of table \"%s\" has %d column",
							   "the key must have %d values, as the primary key of table \"%s\" has %d columns",
							   entry->key_natts, entry->key_natts,
							   RelationGetRelationName(rel), entry->key_natts),
				 errdetail_plural("The key has %d value.", "The key has %d values.",
								  key->nkeys, key->nkeys),
				 errhint("Give one value per column of the primary key, in its order.")));
	check_outcome_privileges(rel, entry);

	/*
	 * The key and the state as the column types read them.  A domain's
	 * input function runs its CHECK expressions, which may run any SQL: one
	 * that guards the table anew, or calls idem_transition on it, reads the
	 * entry again (another state type, another key), and what was read with
	 * the entry as it was could not be used with it as it is.
	 */
	generation = entry->generation;
	nkeys = entry->key_natts;
	for (i = 0; i < nkeys; i++)
	{
		values[i] = InputFunctionCall(&entry->key_in[i], key->keys[i],
									  entry->key_ioparams[i],
									  entry->key_typmods[i]);
		guard_entry_check_unchanged(entry, generation, rel);
	}
	values[nkeys] = InputFunctionCall(&entry->state_in, to_str,
									  entry->state_ioparam,
									  entry->state_typmod);
	guard_entry_check_unchanged(entry, generation, rel);

	req.relid = RelationGetRelid(rel);
	req.partitioned = partitioned;
	req.nkeys = entry->key_natts;
	for (i = 0; i < entry->key_natts; i++)
	{
		req.key_attnums[i] = entry->key_attnums[i];
		req.key_names[i] = !partitioned ? NULL :
			pstrdup(NameStr(TupleDescAttr(RelationGetDescr(rel),
										  entry->key_attnums[i] - 1)->attname));
		req.keys[i] = values[i];
		/* its own copy: record_eq keeps a cache in fn_mcxt at every call */
		fmgr_info_copy(&req.key_eq[i], &entry->key_eq[i],
					   CurrentMemoryContext);
		req.key_collations[i] = entry->key_collations[i];
	}
	req.to_state = OutputFunctionCall(&entry->state_out,
									  values[entry->key_natts]);
	guard_entry_check_unchanged(entry, generation, rel);
	req.has_expected = !PG_ARGISNULL(3);
	req.expected = req.has_expected ? PG_GETARG_INT64(3) : 0;
	/* the direct path fires the guard itself; run_request() says deeper */
	req.level = guard_executor_level();
	req.by_spi = false;
	req.fired = false;
	req.outcome = OUTCOME_NOT_FOUND;
	req.outer = guard_active_request;

	if (partitioned && direct_path_ok(rel))
	{
		bool		usable;
		Oid			leaf_oid = route_to_leaf(rel, entry, values, &usable);

		guard_entry_check_unchanged(entry, generation, rel);

		if (usable && !OidIsValid(leaf_oid))
		{
			/*
			 * No partition takes the key: the UPDATE would find no row, once
			 * its privileges allowed it to look.
			 */
			check_parent_privileges(rel, entry);
			ereport(DEBUG1,
					(errmsg_internal("idem_transition finds no partition of \"%s\" for the key",
									 RelationGetRelationName(rel))));
			direct_done = true;
			found = false;
			processed = 0;
		}
		else if (usable)
		{
			Relation	leaf = relation_open(leaf_oid, RowExclusiveLock);
			Trigger    *leaf_trigger = guard_find_trigger(leaf,
														  fcinfo->flinfo->fn_oid);

			if (leaf_trigger != NULL &&
				leaf_trigger->tgenabled == TRIGGER_DISABLED)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("the guard of table \"%s\" is disabled",
								RelationGetRelationName(leaf)),
						 errdetail("Table \"%s\" is a partition of table \"%s\".",
								   RelationGetRelationName(leaf),
								   RelationGetRelationName(rel)),
						 errhint("Enable trigger \"%s\".", leaf_trigger->tgname)));
			if (leaf_trigger != NULL && direct_path_ok(leaf) &&
				!other_before_row_update(leaf->trigdesc, leaf_trigger->tgoid))
			{
				GuardEntry *leaf_entry = guard_entry_get(leaf, leaf_trigger);
				KeyLookup	leaf_key;
				bool		updated;

				if (leaf_entry->state_type == entry->state_type &&
					key_lookup_leaf(&leaf_key, rel, entry, leaf))
				{
					ereport(DEBUG1,
							(errmsg_internal("idem_transition updates a row of \"%s\" directly, in partition \"%s\"",
											 RelationGetRelationName(rel),
											 RelationGetRelationName(leaf))));
					found = run_request_direct(leaf, leaf_entry, &leaf_key,
											   rel, entry, values, &req,
											   &updated);
					processed = updated ? 1 : 0;
					direct_done = true;
				}
			}
			relation_close(leaf, NoLock);
		}
	}

	if (direct_done)
		;
	else if (!partitioned && direct_path_ok(rel))
	{
		bool		updated;
		KeyLookup	own_key;

		ereport(DEBUG1,
				(errmsg_internal("idem_transition updates a row of \"%s\" directly",
								 RelationGetRelationName(rel))));

		key_lookup_own(&own_key, entry);
		found = run_request_direct(rel, entry, &own_key, rel, entry, values,
								   &req, &updated);
		processed = updated ? 1 : 0;
	}
	else
	{
		ereport(DEBUG1,
				(errmsg_internal("idem_transition updates a row of \"%s\" through SPI",
								 RelationGetRelationName(rel))));
		refuse_instead_rules(rel);
		processed = run_request_spi(entry, rel, values, &req, generation,
									&found);
	}

	if (!req.fired)
	{
		if (processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the guard of table \"%s\" did not fire",
							RelationGetRelationName(rel)),
					 errdetail("Trigger \"%s\" is not enabled in this session, for example because session_replication_role is \"replica\".",
							   tgname)));
		if (found)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the transition of a row of table \"%s\" was skipped by another trigger",
							RelationGetRelationName(rel)),
					 errdetail("A BEFORE UPDATE trigger that fires before \"%s\" returned NULL.",
							   tgname)));
		outcome = OUTCOME_NOT_FOUND;
	}
	else
	{
		outcome = req.outcome;
		if (outcome == OUTCOME_APPLIED && processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the transition of a row of table \"%s\" was skipped by another trigger",
							RelationGetRelationName(rel)),
					 errdetail("A BEFORE UPDATE trigger that fires after \"%s\" returned NULL.",
							   tgname)));
	}

	relation_close(rel, NoLock);
	idem_stat_count(IDEM_KIND_TRANSITION, machine, strlen(machine), outcome, 1);
	PG_RETURN_OID(idem_enum_label_oid(fcinfo, outcome, transition_result_labels,
									  lengthof(transition_result_labels)));
}

