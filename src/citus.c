/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Planning of calls of idem's functions on a Citus node, around a defect
 *	  of Citus's planner.
 *
 * Citus sends a call of a distributed function to the node of its key
 * ("delegation") when a query on no distributed table is, once the standard
 * planner has run, nothing but the call: "SELECT fn(...)" or "SELECT ...
 * FROM fn(...)", without a WHERE.  It decides so on the query as that
 * planner rewrote it, and then prints the rewritten query: when the planner
 * folded a FROM into it (a subquery without tables, VALUES, a view, a CTE,
 * an inlined SQL function), the printing crashes the server (Citus 13.2,
 * any distributed function): "SELECT idem_claim(k) FROM (VALUES ('a'))
 * v(k)", or "SELECT idem_claim(k) AND true FROM ...", which the planner
 * folds into the bare call.
 *
 * What the planner will fold cannot be told beforehand, so idem gives every
 * query that might end so a WHERE that no planning removes: a SELECT with a
 * FROM, on no distributed table, that calls one of idem's functions or a
 * SQL function (which may be inlined into a call of one) gets "WHERE
 * clock_timestamp() IS NOT NULL", always true, volatile and so evaluated,
 * never folded.  Citus then sends nothing: the call runs where it is made
 * and its statements reach the key's shard through Citus, as for any call
 * Citus does not send.  "SELECT idem_claim('k')", without a FROM, folds
 * nothing and is still sent.  The hook is in place once the library is
 * loaded: on a Citus node idem belongs in shared_preload_libraries, beside
 * Citus, or a session's first such query still meets the defect.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/dependency.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/planner.h"
#include "rewrite/rewriteManip.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "idem.h"

static planner_hook_type prev_planner_hook = NULL;

typedef struct FoldContext
{
	List	   *funcs;			/* OIDs of the functions called, not built in */
	bool		distributed;	/* a table Citus distributes was found */
} FoldContext;

/* Whether fn is written in SQL: the planner may inline it. */
static bool
func_is_sql(Oid fn)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	bool		sql = false;

	if (HeapTupleIsValid(tup))
	{
		sql = ((Form_pg_proc) GETSTRUCT(tup))->prolang == SQLlanguageId;
		ReleaseSysCache(tup);
	}
	return sql;
}

/*
 * Gather the functions the query and the queries in it call (built-in
 * functions are neither SQL functions of the user nor idem's), and look for
 * a table Citus distributes.
 */
static bool
fold_walker(Node *node, FoldContext *cxt)
{
	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr))
	{
		Oid			fn = ((FuncExpr *) node)->funcid;

		if (fn >= FirstNormalObjectId)
			cxt->funcs = list_append_unique_oid(cxt->funcs, fn);
	}
	else if (IsA(node, RangeTblEntry))
	{
		RangeTblEntry *rte = (RangeTblEntry *) node;

		if (rte->rtekind == RTE_RELATION && rte->relid >= FirstNormalObjectId &&
			idem_relation_is_distributed(rte->relid))
			cxt->distributed = true;
		return false;			/* its contents are walked by the caller */
	}
	else if (IsA(node, Query))
		return query_tree_walker((Query *) node, fold_walker, (void *) cxt,
								 QTW_EXAMINE_RTES_BEFORE);
	return expression_tree_walker(node, fold_walker, (void *) cxt);
}

/*
 * Whether the query's only FROM is one call of a function that the planner
 * cannot inline (not SQL), on arguments without subqueries: "SELECT status
 * FROM idem_request_begin($1, $2)".  Citus sends it as it is, with nothing
 * folded, and must keep doing so (begin, then finish, on the key's node).
 */
static bool
from_function_alone(Query *parse)
{
	RangeTblEntry *rte;
	RangeTblFunction *rtfunc;

	if (list_length(parse->rtable) != 1 || parse->cteList != NIL ||
		list_length(parse->jointree->fromlist) != 1)
		return false;
	rte = linitial_node(RangeTblEntry, parse->rtable);
	if (rte->rtekind != RTE_FUNCTION || list_length(rte->functions) != 1)
		return false;
	rtfunc = linitial_node(RangeTblFunction, rte->functions);
	return IsA(rtfunc->funcexpr, FuncExpr) &&
		!func_is_sql(((FuncExpr *) rtfunc->funcexpr)->funcid) &&
		!checkExprHasSubLink(rtfunc->funcexpr);
}

/*
 * Whether the query is one Citus might send once the standard planner has
 * folded it: a SELECT with a FROM, on no table Citus distributes, calling one
 * of idem's functions or a SQL function, in a database with Citus.  The
 * tests without catalog look-ups come first: most queries stop at them.
 */
static bool
citus_might_send_folded(Query *parse)
{
	FoldContext cxt = {NIL, false};
	Oid			idem_oid;
	ListCell   *lc;
	bool		found = false;

	if (parse->commandType != CMD_SELECT || parse->utilityStmt != NULL ||
		parse->jointree == NULL || parse->jointree->fromlist == NIL)
		return false;
	/* Citus's library loaded in this backend: a lookup of one of its settings */
	if (GetConfigOption("citus.enable_local_execution", true, false) == NULL)
		return false;
	if (from_function_alone(parse))
		/* "SELECT ... FROM fn(...)": nothing to fold but the target list */
		(void) fold_walker((Node *) parse->targetList, &cxt);
	else
		(void) query_tree_walker(parse, fold_walker, (void *) &cxt,
								 QTW_EXAMINE_RTES_BEFORE);
	if (cxt.funcs == NIL || cxt.distributed ||
		!OidIsValid(get_extension_oid("citus", true)))
		return false;
	idem_oid = get_extension_oid("idem", true);
	foreach(lc, cxt.funcs)
	{
		Oid			fn = lfirst_oid(lc);

		if (func_is_sql(fn) ||
			getExtensionOfObject(ProcedureRelationId, fn) == idem_oid)
		{
			found = true;
			break;
		}
	}
	list_free(cxt.funcs);
	return found && OidIsValid(idem_oid);
}

static PlannedStmt *
idem_planner(Query *parse, const char *query_string, int cursorOptions,
			 ParamListInfo boundParams)
{
	if (prev_planner_hook == NULL)
		return standard_planner(parse, query_string, cursorOptions,
								boundParams);
	if (citus_might_send_folded(parse))
	{
		NullTest   *keep = makeNode(NullTest);

		keep->arg = (Expr *) makeFuncExpr(F_CLOCK_TIMESTAMP, TIMESTAMPTZOID,
										  NIL, InvalidOid, InvalidOid,
										  COERCE_EXPLICIT_CALL);
		keep->nulltesttype = IS_NOT_NULL;
		keep->argisrow = false;
		keep->location = -1;
		parse->jointree->quals = make_and_qual(parse->jointree->quals,
											   (Node *) keep);
	}
	return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
}

void
idem_citus_init(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = idem_planner;
}
