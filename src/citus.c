/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Planning of calls of idem's functions on a Citus node, around a defect
 *	  of Citus's planner.
 *
 * Citus sends a call of a distributed function to the node of its key
 * ("delegation") when a SELECT's target list is nothing but the call.  It
 * decides so after the standard planner has run, on the query as that
 * planner rewrote it, and then deparses the rewritten query: when the
 * call's argument came from a FROM that the planner folded into the query
 * ("SELECT idem_claim(k) FROM (VALUES ('a')) v(k)", a view, a CTE), that
 * deparse crashes the server (Citus 13.2, any distributed function).
 *
 * Such a call is not a plain "SELECT fn(...)" that Citus could send as it
 * is, so idem gives the query a second, hidden (resjunk) target entry
 * before Citus's planner sees it: Citus then plans it as any other query,
 * the call runs where it is made, and its statements reach the key's shard
 * through Citus, as for any call Citus does not send.  The hook is in place
 * once the library is loaded: on a Citus node idem belongs in
 * shared_preload_libraries, beside Citus, or the first such query of a
 * session still meets the defect.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "nodes/makefuncs.h"
#include "optimizer/planner.h"

#include "idem.h"

static planner_hook_type prev_planner_hook = NULL;

/*
 * The shape Citus would send once the standard planner folded its FROM: a
 * SELECT with a FROM whose target list is one call of one of idem's
 * functions, in a database with Citus.  The cheap tests come first: most
 * queries stop at them.
 */
static bool
citus_would_send_folded(Query *parse)
{
	TargetEntry *tle;
	Oid			idem_oid;

	if (parse->commandType != CMD_SELECT || parse->utilityStmt != NULL ||
		parse->jointree == NULL || parse->jointree->fromlist == NIL ||
		list_length(parse->targetList) != 1)
		return false;
	tle = linitial_node(TargetEntry, parse->targetList);
	if (tle->resjunk || !IsA(tle->expr, FuncExpr))
		return false;
	if (!OidIsValid(get_extension_oid("citus", true)))
		return false;
	idem_oid = get_extension_oid("idem", true);
	return OidIsValid(idem_oid) &&
		getExtensionOfObject(ProcedureRelationId,
							 ((FuncExpr *) tle->expr)->funcid) == idem_oid;
}

static PlannedStmt *
idem_planner(Query *parse, const char *query_string, int cursorOptions,
			 ParamListInfo boundParams)
{
	if (prev_planner_hook == NULL)
		return standard_planner(parse, query_string, cursorOptions,
								boundParams);
	if (citus_would_send_folded(parse))
	{
		Const	   *one = makeConst(INT4OID, -1, InvalidOid, sizeof(int32),
									Int32GetDatum(1), false, true);

		/* hidden from the result, as the columns of an ORDER BY are */
		parse->targetList = lappend(parse->targetList,
									makeTargetEntry((Expr *) one, 2, NULL,
													true));
	}
	return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
}

void
idem_citus_init(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = idem_planner;
}
