/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Planning of calls of idem's functions on a Citus node, around a defect
 *	  of Citus's planner.
 *
 * Citus sends a call of a distributed function to the node of its key
 * ("delegation") when a SELECT is nothing but the call.  It decides so
 * after the standard planner has run, on the query as that planner rewrote
 * it, and then deparses the rewritten query: when the call's argument came
 * from a subquery without tables, which the planner pulled up into the
 * query ("SELECT idem_claim(k) FROM (VALUES ('a')) v(k)"), that deparse
 * crashes the server (Citus 13.2, any distributed function).
 *
 * Such a query reads no table, so it needs nothing of Citus's planner but
 * the delegation.  idem plans it with the standard planner instead: the
 * call runs where it is made and its statements reach the key's shard
 * through Citus, as for any call Citus does not send (a key taken from a
 * table, say).  The hook is in place once the library is loaded: on a
 * Citus node idem belongs in shared_preload_libraries, beside Citus.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/planner.h"

#include "idem.h"

static planner_hook_type prev_planner_hook = NULL;

/* Whether a query, or any query inside it, reads a relation. */
static bool
reads_relation_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
	{
		Query	   *query = (Query *) node;
		ListCell   *lc;

		foreach(lc, query->rtable)
		{
			RangeTblEntry *rte = (RangeTblEntry *) lfirst(lc);

			if (rte->rtekind == RTE_RELATION)
				return true;
		}
		return query_tree_walker(query, reads_relation_walker, context, 0);
	}
	return expression_tree_walker(node, reads_relation_walker, context);
}

/* Whether an expression calls a function of the extension *extoid. */
static bool
calls_extension_walker(Node *node, void *context)
{
	Oid			extoid = *(Oid *) context;

	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr) &&
		getExtensionOfObject(ProcedureRelationId,
							 ((FuncExpr *) node)->funcid) == extoid)
		return true;
	/* a subquery reads no table here, and is planned as a whole */
	return expression_tree_walker(node, calls_extension_walker, context);
}

/*
 * The shape that Citus may send after the standard planner pulled up its
 * FROM: a SELECT with a FROM, reading no table, calling one of idem's
 * functions in its target list, in a database with Citus.  The cheap tests
 * come first: most queries stop at the first ones.
 */
static bool
citus_would_crash(Query *parse)
{
	Oid			idem_oid;

	if (parse->commandType != CMD_SELECT || parse->utilityStmt != NULL ||
		parse->jointree == NULL || parse->jointree->fromlist == NIL ||
		parse->targetList == NIL)
		return false;
	if (reads_relation_walker((Node *) parse, NULL))
		return false;
	if (!OidIsValid(get_extension_oid("citus", true)))
		return false;
	idem_oid = get_extension_oid("idem", true);
	if (!OidIsValid(idem_oid))
		return false;
	return calls_extension_walker((Node *) parse->targetList, &idem_oid);
}

static PlannedStmt *
idem_planner(Query *parse, const char *query_string, int cursorOptions,
			 ParamListInfo boundParams)
{
	if (prev_planner_hook == NULL)
		return standard_planner(parse, query_string, cursorOptions,
								boundParams);
	if (citus_would_crash(parse))
		return standard_planner(parse, query_string, cursorOptions,
								boundParams);
	return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
}

void
idem_citus_init(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = idem_planner;
}
