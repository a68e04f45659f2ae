/*-------------------------------------------------------------------------
 *
 * guard_trigger.c
 *	  The guard trigger and the administration of guards.
 *
 * Owns idem_guard_trigger() (the checks of every UPDATE of a guarded row,
 * and the decision of a request of idem_transition on the row it locked),
 * idem._transitions_changed(), and the DDL functions: idem_guard,
 * idem_unguard and the event trigger idem._guard_ddl.
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
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/objectaddress.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "catalog/pg_inherits.h"
#include "catalog/partition.h"
#include "storage/bufmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
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

#include "idem.h"
#include "guard.h"

TransitionRequest *guard_active_request = NULL;

/* ----------------------------------------------------------------
 * The trigger
 * ----------------------------------------------------------------
 */
char *
guard_state_text(GuardEntry *entry, HeapTuple tuple, TupleDesc desc, Datum *value,
		   bool *isnull)
{
	*value = heap_getattr(tuple, entry->state_attnum, desc, isnull);
	if (*isnull)
		return NULL;
	return OutputFunctionCall(&entry->state_out, *value);
}

int64
guard_version_value(GuardEntry *entry, Datum d)
{
	switch (entry->version_type)
	{
		case INT2OID:
			return DatumGetInt16(d);
		case INT4OID:
			return DatumGetInt32(d);
		default:
			return DatumGetInt64(d);
	}
}

Datum
guard_version_datum(GuardEntry *entry, int64 v)
{
	switch (entry->version_type)
	{
		case INT2OID:
			return Int16GetDatum((int16) v);
		case INT4OID:
			return Int32GetDatum((int32) v);
		default:
			return Int64GetDatum(v);
	}
}

int64
guard_version_max(GuardEntry *entry)
{
	switch (entry->version_type)
	{
		case INT2OID:
			return PG_INT16_MAX;
		case INT4OID:
			return PG_INT32_MAX;
		default:
			return PG_INT64_MAX;
	}
}

/*
 * Whether row-level security applies to the user on the table or, for a
 * partition, on a table it is a partition of (where policies usually are):
 * the row may be one the user cannot see, and PostgreSQL's own messages then
 * show no value of it.
 */
static bool
rows_hidden(Relation rel)
{
	List	   *ancestors;
	ListCell   *lc;
	bool		hidden = false;

	if (check_enable_rls(RelationGetRelid(rel), InvalidOid, true) == RLS_ENABLED)
		return true;
	if (!rel->rd_rel->relispartition)
		return false;
	ancestors = get_partition_ancestors(RelationGetRelid(rel));
	foreach(lc, ancestors)
	{
		if (check_enable_rls(lfirst_oid(lc), InvalidOid, true) == RLS_ENABLED)
		{
			hidden = true;
			break;
		}
	}
	list_free(ancestors);
	return hidden;
}

/*
 * May the current user read the column?  Column privileges are looked at
 * only when the table's own SELECT privilege is missing; under row-level
 * security, no.
 */
static bool
column_readable(Relation rel, AttrNumber attnum)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			userid = GetUserId();

	if (rows_hidden(rel))
		return false;
	return pg_class_aclcheck(relid, userid, ACL_SELECT) == ACLCHECK_OK ||
		pg_attribute_aclcheck(relid, attnum, userid, ACL_SELECT) == ACLCHECK_OK;
}

/*
 * "Key (id)=(42). " describing the row by its primary key, or "" when the
 * table has none or the user may not see its columns.
 */
static char *
key_sentence(Relation rel, HeapTuple tuple)
{
	Oid			pkoid = RelationGetPrimaryKeyIndex(rel);
	Relation	index;
	Datum		values[INDEX_MAX_KEYS];
	bool		isnull[INDEX_MAX_KEYS];
	char	   *desc;
	int			i;

	if (!OidIsValid(pkoid) || rows_hidden(rel))
		return "";
	index = index_open(pkoid, AccessShareLock);
	for (i = 0; i < IndexRelationGetNumberOfKeyAttributes(index); i++)
		values[i] = heap_getattr(tuple, index->rd_index->indkey.values[i],
								 RelationGetDescr(rel), &isnull[i]);
	desc = BuildIndexValueDescription(index, values, isnull);
	index_close(index, AccessShareLock);
	if (desc == NULL)
		return "";
	return psprintf("Key %s. ", desc);
}

static char *
quoted_state(const char *state)
{
	return state == NULL ? "NULL" : psprintf("\"%s\"", state);
}

/* What idem_transition's request comes to, on the row the UPDATE locked. */
TransitionOutcome
guard_decide(GuardEntry *entry, TransitionRequest *req, HeapTuple oldtup,
	   TupleDesc desc)
{
	Datum		cur_value;
	bool		cur_isnull;
	char	   *cur = guard_state_text(entry, oldtup, desc, &cur_value, &cur_isnull);
	bool		same_state = (cur != NULL && strcmp(cur, req->to_state) == 0);

	if (req->has_expected)
	{
		bool		ver_isnull;
		Datum		ver_value;
		int64		version;

		if (entry->version_attnum == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("table \"%s\" has no version column",
							get_rel_name(req->relid))));
		ver_value = heap_getattr(oldtup, entry->version_attnum, desc,
								 &ver_isnull);
		version = ver_isnull ? 0 : guard_version_value(entry, ver_value);
		if (ver_isnull)
			return OUTCOME_STALE;
		if (version != req->expected)
		{
			if (same_state && req->expected < PG_INT64_MAX &&
				version == req->expected + 1)
				return OUTCOME_ALREADY;
			return OUTCOME_STALE;
		}
		if (!entry->machine_too_long &&
			guard_transition_allowed(entry->machine, cur, req->to_state))
			return OUTCOME_APPLIED;
		/* the row is where the request wants it; nothing to write */
		if (same_state)
			return OUTCOME_ALREADY;
		return OUTCOME_ILLEGAL;
	}

	if (same_state)
		return OUTCOME_ALREADY;
	if (entry->machine_too_long)
		return OUTCOME_ILLEGAL;
	if (guard_transition_allowed(entry->machine, cur, req->to_state))
		return OUTCOME_APPLIED;
	if (guard_state_reachable(entry->machine, req->to_state, cur))
		return OUTCOME_STALE;
	return OUTCOME_ILLEGAL;
}

/*
 * Is the row the one the request is for?  rel is the table the request was
 * made on, or (when that is a partitioned table) one of its partitions, where
 * the key's columns are found by name.
 */
bool
guard_request_matches(TransitionRequest *req, Relation rel, HeapTuple oldtup)
{
	TupleDesc	desc = RelationGetDescr(rel);
	bool		own = (RelationGetRelid(rel) == req->relid);
	int			i;

	if (!own)
	{
		if (!req->partitioned || !rel->rd_rel->relispartition ||
			!list_member_oid(get_partition_ancestors(RelationGetRelid(rel)),
							 req->relid))
			return false;
	}
	for (i = 0; i < req->nkeys; i++)
	{
		bool		isnull;
		AttrNumber	attnum = own ? req->key_attnums[i] :
			guard_column_attnum(rel, req->key_names[i]);
		Datum		key;

		if (attnum == InvalidAttrNumber)
			return false;
		key = heap_getattr(oldtup, attnum, desc, &isnull);
		if (isnull)
			return false;
		if (!DatumGetBool(FunctionCall2Coll(&req->key_eq[i],
											req->key_collations[i],
											key, req->keys[i])))
			return false;
	}
	return true;
}

/*
 * The UPDATE of a row of a partition that moves it to another partition:
 * the row is then deleted from its partition and inserted into the other,
 * whose guard fires for the INSERT.  That INSERT is the UPDATE's, checked
 * as a transition already, and not a new row whose state must be initial.
 *
 * The guard notes the row an UPDATE of a partition wrote when that row no
 * longer fits the partition's constraint (for a machine with initial
 * states): the executor then routes it from the root of the partition tree.
 * The INSERT it leads to is the next call of a guard at the same trigger
 * depth, in the same transaction, into a partition of the same
 * root, with the same values in every column (by name: partitions may lay
 * their columns out otherwise).  Any other call of a guard at that depth
 * forgets the note, so that a later DELETE and INSERT, or an INSERT into
 * another table, cannot pass for the move.  Between the note and its INSERT,
 * the triggers of the UPDATE and of the DELETE from the partition may move
 * other rows, whose guards fire deeper: the notes are kept one per trigger
 * depth, and a call of a guard forgets only those of its own depth and
 * deeper (left over by calls that are done).  The INSERT must also find the
 * old row deleted by this transaction and marked as moved to another
 * partition: an UPDATE that failed (its subtransaction rolled back) or was
 * skipped (a BEFORE DELETE trigger of the partition returned NULL) leaves a
 * note behind, which must not let a later INSERT of the same values pass;
 * the notes of a (sub)transaction that ends in an error are forgotten with
 * it, and all of them at the end of the transaction.
 * Stored generated columns are left out of the comparison: PostgreSQL
 * computes them again after the guard.  A BEFORE UPDATE trigger that fires
 * after the guard and changes the partition key is not seen (see the
 * README).
 */
typedef struct PendingMove
{
	bool		valid;
	LocalTransactionId lxid;
	SubTransactionId subid;		/* the subtransaction that noted it */
	Oid			relid;			/* the partition the row leaves */
	Oid			root;			/* the root of its partition tree */
	ItemPointerData old_tid;	/* where the old row is in that partition */
	HeapTuple	tuple;			/* in TopMemoryContext */
} PendingMove;

/* The notes, indexed by trigger depth; in TopMemoryContext. */
static PendingMove *pending_moves = NULL;
static int	pending_moves_size = 0;
static bool move_callbacks_registered = false;

static HeapTuple copy_tuple_in(HeapTuple tuple,
							   MemoryContext cxt);

static void
forget_move_at(int depth)
{
	PendingMove *note = &pending_moves[depth];

	note->valid = false;
	if (note->tuple != NULL)
	{
		heap_freetuple(note->tuple);
		note->tuple = NULL;
	}
}

/* Forgets the notes made at this depth or deeper. */
static void
forget_moves(int depth)
{
	int			d;

	for (d = Max(depth, 0); d < pending_moves_size; d++)
		forget_move_at(d);
}

/*
 * idem_transition judged a move refused before the UPDATE that would fire
 * the guard: what the guard does when it fires for an UPDATE, one trigger
 * depth below the caller's, is done here (the notes of that depth are
 * forgotten), so that the rest of the transaction sees what it would have.
 */
void
guard_refused_before_firing(void)
{
	forget_moves(guard_trigger_depth() + 1);
}

/* A transaction forgets all its notes when it ends, however it ends. */
static void
moves_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			forget_moves(0);
			break;
		default:
			break;
	}
}

/*
 * A subtransaction rolled back forgets the notes it made, and those of the
 * subtransactions it started (which have larger ids): their moves were
 * undone.  The notes of the moves it is nested in stay.
 */
static void
moves_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			d;

	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	for (d = 0; d < pending_moves_size; d++)
		if (pending_moves[d].valid && pending_moves[d].subid >= mySubid)
			forget_move_at(d);
}

/* The note of this depth, made room for. */
static PendingMove *
move_note_slot(int depth)
{
	if (!move_callbacks_registered)
	{
		RegisterXactCallback(moves_xact_callback, NULL);
		RegisterSubXactCallback(moves_subxact_callback, NULL);
		move_callbacks_registered = true;
	}
	if (depth >= pending_moves_size)
	{
		int			size = Max(8, pending_moves_size);

		while (size <= depth)
			size *= 2;
		if (pending_moves == NULL)
			pending_moves = MemoryContextAllocZero(TopMemoryContext,
												   size * sizeof(PendingMove));
		else
		{
			pending_moves = repalloc(pending_moves, size * sizeof(PendingMove));
			memset(&pending_moves[pending_moves_size], 0,
				   (size - pending_moves_size) * sizeof(PendingMove));
		}
		pending_moves_size = size;
	}
	return &pending_moves[depth];
}

/* The root of the partition tree of a partition. */
static Oid
partition_root(Relation rel)
{
	List	   *ancestors = get_partition_ancestors(RelationGetRelid(rel));
	Oid			root = ancestors != NIL ? llast_oid(ancestors) : InvalidOid;

	list_free(ancestors);
	return root;
}

/* Whether the new version of a row of a partition leaves the partition. */
static bool
leaves_partition(Relation rel, HeapTuple newtup)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri = makeNode(ResultRelInfo);
	TupleTableSlot *slot;
	bool		fits;

	rri->ri_RelationDesc = rel;
	slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);
	ExecStoreHeapTuple(newtup, slot, false);
	fits = ExecPartitionCheck(rri, slot, estate, false);
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
	pfree(rri);
	return !fits;
}

static void
note_update(GuardEntry *entry, Relation rel, HeapTuple oldtup,
			HeapTuple newtup)
{
	Oid			root;
	int			depth;
	PendingMove *note;

	if (entry->machine_too_long || !guard_machine_has_initial(entry->machine))
		return;
	if (!leaves_partition(rel, newtup))
		return;
	root = partition_root(rel);
	if (!OidIsValid(root))
		return;
	depth = guard_trigger_depth();
	note = move_note_slot(depth);
	forget_move_at(depth);
	note->lxid = MyProc->lxid;
	note->subid = GetCurrentSubTransactionId();
	note->relid = RelationGetRelid(rel);
	note->root = root;
	note->old_tid = oldtup->t_self;
	note->tuple = copy_tuple_in(newtup, TopMemoryContext);
	note->valid = true;
}

static HeapTuple
copy_tuple_in(HeapTuple tuple, MemoryContext cxt)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);
	HeapTuple	copy = heap_copytuple(tuple);

	MemoryContextSwitchTo(old);
	return copy;
}

/*
 * Whether the row version at tid of the partition "from" was deleted by this
 * transaction (or a subtransaction of it still open) as the move of the row
 * to another partition.  Not a heap: the note alone decides, as before.
 */
static bool
row_moved_out(Relation from, ItemPointer tid)
{
	BlockNumber blkno = ItemPointerGetBlockNumber(tid);
	OffsetNumber offnum = ItemPointerGetOffsetNumber(tid);
	Buffer		buf;
	Page		page;
	bool		moved = false;

	if (from->rd_rel->relam != HEAP_TABLE_AM_OID)
		return true;
	if (!ItemPointerIsValid(tid) ||
		blkno >= RelationGetNumberOfBlocks(from))
		return false;
	buf = ReadBuffer(from, blkno);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	if (offnum >= FirstOffsetNumber && offnum <= PageGetMaxOffsetNumber(page))
	{
		ItemId		lp = PageGetItemId(page, offnum);

		if (ItemIdIsNormal(lp))
		{
			HeapTupleHeader htup = (HeapTupleHeader) PageGetItem(page, lp);
			uint16		infomask = htup->t_infomask;

			if (HeapTupleHeaderIndicatesMovedPartitions(htup) &&
				!(infomask & HEAP_XMAX_INVALID) &&
				!HEAP_XMAX_IS_LOCKED_ONLY(infomask))
			{
				TransactionId xmax = (infomask & HEAP_XMAX_IS_MULTI) ?
					HeapTupleGetUpdateXid(htup) :
					HeapTupleHeaderGetRawXmax(htup);

				moved = TransactionIdIsValid(xmax) &&
					TransactionIdIsCurrentTransactionId(xmax);
			}
		}
	}
	UnlockReleaseBuffer(buf);
	return moved;
}

/*
 * Is this INSERT the move of the row noted by note_update() at this trigger
 * depth?  Forgets the notes of this depth and deeper.
 */
static bool
insert_is_move(Relation rel, HeapTuple newtup)
{
	Relation	from;
	TupleDesc	desc = RelationGetDescr(rel);
	int			depth = guard_trigger_depth();
	PendingMove *note;
	bool		move = true;
	int			i;

	if (depth < 0 || depth >= pending_moves_size ||
		!pending_moves[depth].valid)
	{
		forget_moves(depth);
		return false;
	}
	note = &pending_moves[depth];
	if (note->lxid != MyProc->lxid ||
		!rel->rd_rel->relispartition ||
		partition_root(rel) != note->root)
	{
		forget_moves(depth);
		return false;
	}
	from = RelationIdGetRelation(note->relid);
	if (!RelationIsValid(from))
	{
		forget_moves(depth);
		return false;
	}
	for (i = 0; i < desc->natts && move; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		AttrNumber	attnum;
		Datum		a;
		Datum		b;
		bool		a_null;
		bool		b_null;

		/* PostgreSQL computes these again after the guard */
		if (att->attisdropped || att->attgenerated)
			continue;
		attnum = guard_column_attnum(from, NameStr(att->attname));
		if (attnum == InvalidAttrNumber)
		{
			move = false;
			break;
		}
		a = heap_getattr(newtup, att->attnum, desc, &a_null);
		b = heap_getattr(note->tuple, attnum, RelationGetDescr(from),
						 &b_null);
		if (a_null != b_null ||
			(!a_null && !datumIsEqual(a, b, att->attbyval, att->attlen)))
			move = false;
	}
	if (move)
		move = row_moved_out(from, &note->old_tid);
	RelationClose(from);
	forget_moves(depth);
	return move;
}

/*
 * The check of every INSERT (and COPY): when the machine has initial states,
 * a new row must start in one of them.  The row itself is not changed: its
 * version starts where it says.
 */
static void
guard_insert(Relation rel, GuardEntry *entry, HeapTuple newtup)
{
	Datum		value;
	bool		isnull;
	char	   *state;

	bool		move = insert_is_move(rel, newtup);

	if (entry->machine_too_long || !guard_machine_has_initial(entry->machine))
		return;
	state = guard_state_text(entry, newtup, RelationGetDescr(rel), &value,
							 &isnull);
	if (guard_state_initial(entry->machine, state))
		return;
	if (move)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_CHECK_VIOLATION),
			 errmsg("illegal initial state %s in table \"%s\"",
					quoted_state(state), RelationGetRelationName(rel)),
			 errdetail("%sState machine \"%s\" does not let a row start in %s.",
					   key_sentence(rel, newtup), entry->machine,
					   quoted_state(state)),
			 errhint("Insert the row in an initial state of the machine, or make this one initial with idem_allow_initial()."),
			 errtablecol(rel, entry->state_attnum)));
}

/* The checks of every UPDATE; returns the row to write. */
HeapTuple
guard_update(Relation rel, GuardEntry *entry, HeapTuple oldtup,
			 HeapTuple newtup)
{
	TupleDesc	desc = RelationGetDescr(rel);
	Datum		old_value;
	Datum		new_value;
	bool		old_isnull;
	bool		new_isnull;
	bool		changed;

	old_value = heap_getattr(oldtup, entry->state_attnum, desc, &old_isnull);
	new_value = heap_getattr(newtup, entry->state_attnum, desc, &new_isnull);
	if (old_isnull || new_isnull)
		changed = (old_isnull != new_isnull);
	else
		changed = !datumIsEqual(old_value, new_value, entry->state_byval,
								entry->state_len);
	if (changed)
	{
		char	   *old_state = old_isnull ? NULL :
		OutputFunctionCall(&entry->state_out, old_value);
		char	   *new_state = new_isnull ? NULL :
		OutputFunctionCall(&entry->state_out, new_value);

		if ((old_state == NULL) != (new_state == NULL) ||
			(old_state != NULL && strcmp(old_state, new_state) != 0))
		{
			bool		allowed = (!entry->machine_too_long &&
									guard_transition_allowed(entry->machine,
													   old_state, new_state));

			if (!allowed && !column_readable(rel, entry->state_attnum))
			{
				/* an UPDATE that may not read the state is not told it */
				ereport(ERROR,
						(errcode(ERRCODE_CHECK_VIOLATION),
						 errmsg("illegal state transition to %s in table \"%s\"",
								quoted_state(new_state),
								RelationGetRelationName(rel)),
						 errdetail("%sState machine \"%s\" has no transition from the row's state to %s.",
								   key_sentence(rel, oldtup), entry->machine,
								   quoted_state(new_state)),
						 errhint("Move the row through the transitions the machine allows, or allow this one with idem_allow()."),
						 errtablecol(rel, entry->state_attnum)));
			}
			if (!allowed)
				ereport(ERROR,
						(errcode(ERRCODE_CHECK_VIOLATION),
						 errmsg("illegal state transition from %s to %s in table \"%s\"",
								quoted_state(old_state), quoted_state(new_state),
								RelationGetRelationName(rel)),
						 errdetail("%sState machine \"%s\" has no transition from %s to %s.",
								   key_sentence(rel, oldtup), entry->machine,
								   quoted_state(old_state),
								   quoted_state(new_state)),
						 errhint("Move the row through the transitions the machine allows, or allow this one with idem_allow()."),
						 errtablecol(rel, entry->state_attnum)));
		}
	}

	if (entry->version_attnum != InvalidAttrNumber)
	{
		AttrNumber	attnum = entry->version_attnum;
		int64		old_version;
		int64		target;

		old_value = heap_getattr(oldtup, attnum, desc, &old_isnull);
		new_value = heap_getattr(newtup, attnum, desc, &new_isnull);
		if (old_isnull)
			ereport(ERROR,
					(errcode(ERRCODE_NOT_NULL_VIOLATION),
					 errmsg("row of table \"%s\" has a null version",
							RelationGetRelationName(rel)),
					 errdetail("%sThe version column \"%s\" of a guarded table must not be null.",
							   key_sentence(rel, oldtup),
							   NameStr(TupleDescAttr(desc, attnum - 1)->attname)),
					 errtablecol(rel, attnum)));
		old_version = guard_version_value(entry, old_value);
		if (old_version >= guard_version_max(entry) &&
			!column_readable(rel, attnum))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("version of a row of table \"%s\" is out of range",
							RelationGetRelationName(rel)),
					 errdetail("%sThe row is at the largest version its type holds.",
							   key_sentence(rel, oldtup)),
					 errtablecol(rel, attnum)));
		if (old_version >= guard_version_max(entry))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("version of a row of table \"%s\" is out of range",
							RelationGetRelationName(rel)),
					 errdetail("%sThe row is at version " INT64_FORMAT ", the largest value of its type.",
							   key_sentence(rel, oldtup), old_version),
					 errtablecol(rel, attnum)));
		target = old_version + 1;
		if (!new_isnull && guard_version_value(entry, new_value) == old_version)
		{
			Datum		value = guard_version_datum(entry, target);
			bool		isnull = false;
			int			col = attnum;

			newtup = heap_modify_tuple_by_cols(newtup, desc, 1, &col,
											   &value, &isnull);
		}
		else if ((new_isnull || guard_version_value(entry, new_value) != target) &&
				 !column_readable(rel, attnum))
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("invalid version %s for a row of table \"%s\"",
							new_isnull ? "NULL" :
							psprintf(INT64_FORMAT, guard_version_value(entry, new_value)),
							RelationGetRelationName(rel)),
					 errdetail("%sAn update must set the version to one more than the row's, or leave it unchanged.",
							   key_sentence(rel, oldtup)),
					 errtablecol(rel, attnum)));
		else if (new_isnull || guard_version_value(entry, new_value) != target)
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("invalid version %s for a row of table \"%s\"",
							new_isnull ? "NULL" :
							psprintf(INT64_FORMAT, guard_version_value(entry, new_value)),
							RelationGetRelationName(rel)),
					 errdetail("%sThe row is at version " INT64_FORMAT "; an update must set its version to " INT64_FORMAT " or leave it unchanged.",
							   key_sentence(rel, oldtup), old_version, target),
					 errtablecol(rel, attnum)));
	}
	return newtup;
}

PG_FUNCTION_INFO_V1(idem_guard_trigger);
Datum
idem_guard_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	GuardEntry *entry;
	TransitionRequest *req;
	HeapTuple	oldtup;
	HeapTuple	newtup;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() was not called by the trigger manager",
						GUARD_TRIGGER_FUNC)));
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!(TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ||
		  (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) &&
		   TRIGGER_FOR_UPDATE(trigdata->tg_trigger->tgtype))))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" of table \"%s\" must be BEFORE INSERT OR UPDATE FOR EACH ROW",
						trigdata->tg_trigger->tgname,
						RelationGetRelationName(trigdata->tg_relation)),
				 errdetail("%s() guards every UPDATE of a row, and every INSERT beside it: it cannot fire for DELETE, TRUNCATE or INSERT alone, after the row, for each statement, for some columns only, or under a WHEN condition.",
						   GUARD_TRIGGER_FUNC),
				 errhint("Guard the table with idem_guard().")));

	rel = trigdata->tg_relation;
	oldtup = trigdata->tg_trigtuple;
	entry = guard_entry_get(rel, trigdata->tg_trigger);

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
	{
		guard_insert(rel, entry, oldtup);
		return PointerGetDatum(oldtup);
	}

	forget_moves(guard_trigger_depth());
	req = guard_active_request;
	if (req != NULL && !req->fired &&
		req->level == guard_executor_level() &&
		(!req->by_spi || guard_executor_sets_tag()) &&
		guard_request_matches(req, rel, oldtup))
	{
		req->fired = true;
		req->outcome = guard_decide(entry, req, oldtup, RelationGetDescr(rel));
		if (req->outcome != OUTCOME_APPLIED)
			return PointerGetDatum(NULL);	/* nothing is written */
	}

	newtup = guard_update(rel, entry, oldtup, trigdata->tg_newtuple);
	if (rel->rd_rel->relispartition)
		note_update(entry, rel, oldtup, newtup);
	return PointerGetDatum(newtup);
}

/*
 * idem._transitions_changed(): the trigger on idem.transitions that tells
 * every backend to read the machines again.
 */
PG_FUNCTION_INFO_V1(idem_transitions_changed);
Datum
idem_transitions_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem._transitions_changed() was not called by the trigger manager")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}
/* ----------------------------------------------------------------
 * Administration
 * ----------------------------------------------------------------
 */
Relation
guard_open_table_arg(FunctionCallInfo fcinfo, LOCKMODE lockmode)
{
	Oid			relid;
	Relation	rel;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tbl must not be null")));
	relid = PG_GETARG_OID(0);
	rel = try_relation_open(relid, lockmode);
	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	return rel;
}

void
guard_check_privilege(Oid relid, AclMode mode)
{
	AclResult	result = pg_class_aclcheck(relid, GetUserId(), mode);

	if (result != ACLCHECK_OK)
		aclcheck_error(result, get_relkind_objtype(get_rel_relkind(relid)),
					   get_rel_name(relid));
}

static const char *
name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	return NameStr(*PG_GETARG_NAME(argno));
}

/* The trigger named "idem_guard" of a table, or NULL. */
static Trigger *
trigger_named_guard(Relation rel)
{
	TriggerDesc *desc = rel->trigdesc;
	int			i;

	if (desc == NULL)
		return NULL;
	for (i = 0; i < desc->numtriggers; i++)
		if (strcmp(desc->triggers[i].tgname, GUARD_TRIGGER_NAME) == 0)
			return &desc->triggers[i];
	return NULL;
}

static void
run_utility(const char *sql)
{
	int			ret = SPI_execute(sql, false, 0);

	if (ret != SPI_OK_UTILITY)
		elog(ERROR, "SPI_execute of \"%s\" failed: %s", sql,
			 SPI_result_code_string(ret));
}

/*
 * idem_guard(tbl regclass, machine text, state_column name,
 *			  version_column name DEFAULT NULL) RETURNS void
 *
 * Runs as the caller, who needs the TRIGGER privilege on the table.  On a
 * table guarded already with the same definition it does nothing; with
 * another definition it fails (42710): idem_unguard() first.
 */
PG_FUNCTION_INFO_V1(idem_guard);
Datum
idem_guard(PG_FUNCTION_ARGS)
{
	text	   *machine_arg;
	char	   *machine;
	const char *state_col;
	const char *version_col = NULL;
	Oid			relid;
	Relation	rel;
	AttrNumber	state_attnum;
	Trigger    *existing;
	Oid			fn;
	char	   *relname;
	char	   *why;
	StringInfoData sql;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tbl must not be null")));
	machine_arg = idem_arg_key(fcinfo, 1, "machine", MACHINE_MAX_LEN);
	machine = text_to_cstring(machine_arg);
	state_col = name_arg(fcinfo, 2, "state_column");
	if (!PG_ARGISNULL(3))
		version_col = NameStr(*PG_GETARG_NAME(3));
	idem_check_writable("idem_guard()");

	relid = PG_GETARG_OID(0);
	if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
		guard_check_privilege(relid, ACL_TRIGGER);
	rel = guard_open_table_arg(fcinfo, ShareRowExclusiveLock);
	if (rel->rd_rel->relkind != RELKIND_RELATION &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", RelationGetRelationName(rel)),
				 errdetail("Only ordinary and partitioned tables can be guarded.")));
	if (idem_relation_is_distributed(RelationGetRelid(rel)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" is distributed by Citus and cannot be guarded",
						RelationGetRelationName(rel)),
				 errdetail("The guard reads and updates the rows of the table on the node where it runs; the rows of a distributed table are in its shards on other nodes."),
				 errhint("Guard a local table, or check transitions in the application.")));
	if (RelationGetNamespace(rel) == get_namespace_oid(IDEM_SCHEMA, true))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("table \"%s.%s\" cannot be guarded",
						IDEM_SCHEMA, RelationGetRelationName(rel)),
				 errdetail("The tables of the schema \"idem\" belong to the extension idem.")));

	state_attnum = guard_column_attnum(rel, state_col);
	if (state_attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist",
						state_col, RelationGetRelationName(rel))));
	if (TupleDescAttr(RelationGetDescr(rel), state_attnum - 1)->attgenerated)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("state column \"%s\" of table \"%s\" must not be a generated column",
						state_col, RelationGetRelationName(rel)),
				 errdetail(GUARD_GENERATED_DETAIL),
				 errhint("Guard the column the state is computed from, or keep the state in a column of its own.")));
	if (version_col != NULL)
	{
		AttrNumber	attnum = guard_column_attnum(rel, version_col);
		Form_pg_attribute att;

		if (attnum == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("column \"%s\" of relation \"%s\" does not exist",
							version_col, RelationGetRelationName(rel))));
		if (attnum == state_attnum)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the state column and the version column must differ")));
		att = TupleDescAttr(RelationGetDescr(rel), attnum - 1);
		if (!guard_is_version_type(att->atttypid))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("version column \"%s\" must be of type smallint, integer or bigint",
							version_col),
					 errdetail("Column \"%s\" is of type %s.", version_col,
							   format_type_be(att->atttypid))));
		if (att->attgenerated)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("version column \"%s\" of table \"%s\" must not be a generated column",
							version_col, RelationGetRelationName(rel)),
					 errdetail(GUARD_GENERATED_DETAIL),
					 errhint("Give a column of its own as the version column.")));
		if (!att->attnotnull)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("version column \"%s\" must be NOT NULL", version_col),
					 errhint("Run ALTER TABLE %s ALTER COLUMN %s SET NOT NULL.",
							 RelationGetRelationName(rel),
							 quote_identifier(version_col))));
		why = guard_version_key_problem(rel, attnum);
		if (why != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("version column \"%s\" of table \"%s\" must not be part of a key",
							version_col, RelationGetRelationName(rel)),
					 errdetail("%s Every update of a guarded row changes its version.",
							   why),
					 errhint("Give a column of its own as the version column.")));
	}
	if (!guard_machine_defined(machine))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("state machine \"%s\" is not defined", machine),
				 errhint("Define its transitions with idem_allow() first.")));

	/*
	 * A table has one guard.  Guarding it again with the same definition
	 * does nothing, so that a migration can run twice; with another one it
	 * is refused rather than replaced: replacing would take the ownership
	 * that dropping the old trigger needs, and change what every UPDATE of
	 * the table checks without saying so.
	 */
	fn = guard_lookup_func(fcinfo->flinfo->fn_oid);
	existing = guard_find_trigger(rel, fcinfo->flinfo->fn_oid);
	if (existing != NULL)
	{
		const char *old_version = NULL;

		if (existing->tgnargs == 3 && existing->tgargs[2][0] != '\0')
			old_version = existing->tgargs[2];
		if (GUARD_TRIGGER_TYPE_OK(existing->tgtype) &&
			existing->tgnattr == 0 && existing->tgqual == NULL &&
			(existing->tgnargs == 2 || existing->tgnargs == 3) &&
			strcmp(existing->tgargs[0], machine) == 0 &&
			strcmp(existing->tgargs[1], state_col) == 0 &&
			((old_version == NULL && version_col == NULL) ||
			 (old_version != NULL && version_col != NULL &&
			  strcmp(old_version, version_col) == 0)))
		{
			relation_close(rel, NoLock);
			PG_RETURN_VOID();
		}
		if (existing->tgisclone)
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("table \"%s\" is guarded already",
							RelationGetRelationName(rel)),
					 errdetail("It is a partition, guarded by the guard \"%s\" of its partitioned table, with another definition.",
							   existing->tgname),
					 errhint("Guard the partitioned table otherwise, with idem_unguard() and idem_guard() on it.")));
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("table \"%s\" is guarded already",
						RelationGetRelationName(rel)),
				 errdetail("Its guard \"%s\" has another definition.",
						   existing->tgname),
				 errhint("Remove the guard with idem_unguard() first, then guard the table again.")));
	}
	/*
	 * The guard of a partitioned table is cloned to every partition, present
	 * and future: a partition must not have a guard of its own already.
	 */
	if (rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE)
	{
		List	   *parts = find_all_inheritors(RelationGetRelid(rel),
												ShareRowExclusiveLock, NULL);
		ListCell   *lc;

		foreach(lc, parts)
		{
			Relation	part;
			Trigger    *guard;

			if (lfirst_oid(lc) == RelationGetRelid(rel))
				continue;
			part = relation_open(lfirst_oid(lc), NoLock);
			guard = guard_find_trigger(part, fcinfo->flinfo->fn_oid);
			if (guard != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_DUPLICATE_OBJECT),
						 errmsg("partition \"%s\" of table \"%s\" is guarded already",
								RelationGetRelationName(part),
								RelationGetRelationName(rel)),
						 errdetail("The guard of a partitioned table guards every partition."),
						 errhint("Remove the guard of the partition with idem_unguard() first.")));
			relation_close(part, NoLock);
		}
		list_free(parts);
	}
	if (trigger_named_guard(rel) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("trigger \"%s\" for relation \"%s\" already exists",
						GUARD_TRIGGER_NAME, RelationGetRelationName(rel)),
				 errdetail("It does not execute %s().", GUARD_TRIGGER_FUNC),
				 errhint("Rename or drop that trigger.")));

	relname = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
										 RelationGetRelationName(rel));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TRIGGER %s BEFORE INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%s, %s",
					 quote_identifier(GUARD_TRIGGER_NAME), relname,
					 quote_qualified_identifier(get_namespace_name(get_func_namespace(fn)),
												GUARD_TRIGGER_FUNC),
					 quote_literal_cstr(machine), quote_literal_cstr(state_col));
	if (version_col != NULL)
		appendStringInfo(&sql, ", %s", quote_literal_cstr(version_col));
	appendStringInfoChar(&sql, ')');
	run_utility(sql.data);
	SPI_finish();

	relation_close(rel, NoLock);
	PG_RETURN_VOID();
}

/*
 * idem_unguard(tbl regclass) RETURNS boolean: drop the guard (every trigger
 * that executes idem_guard_trigger(), whatever its name); false if the
 * table had none.  Runs as the caller, who must own the table.
 */
PG_FUNCTION_INFO_V1(idem_unguard);
Datum
idem_unguard(PG_FUNCTION_ARGS)
{
	Relation	rel;
	Oid			fn;
	List	   *names = NIL;
	Oid			relid;
	bool		dropped = false;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tbl must not be null")));
	idem_check_writable("idem_unguard()");
	relid = PG_GETARG_OID(0);
	if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)) &&
		!pg_class_ownercheck(relid, GetUserId()))
		aclcheck_error(ACLCHECK_NOT_OWNER,
					   get_relkind_objtype(get_rel_relkind(relid)),
					   get_rel_name(relid));
	rel = guard_open_table_arg(fcinfo, ShareRowExclusiveLock);
	fn = guard_lookup_func(fcinfo->flinfo->fn_oid);
	/* every trigger that executes the guard, whatever its name */
	if (rel->trigdesc != NULL)
	{
		int			i;

		for (i = 0; i < rel->trigdesc->numtriggers; i++)
		{
			Trigger    *trigger = &rel->trigdesc->triggers[i];

			if (!guard_is_trigger(trigger, fn))
				continue;
			/* a partition's clone goes with its parent's guard */
			if (trigger->tgisclone)
				ereport(ERROR,
						(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
						 errmsg("cannot unguard partition \"%s\"",
								RelationGetRelationName(rel)),
						 errdetail("Its guard \"%s\" is that of its partitioned table.",
								   trigger->tgname),
						 errhint("Remove the guard of the partitioned table with idem_unguard(), or detach the partition.")));
			names = lappend(names, pstrdup(trigger->tgname));
		}
	}
	if (names != NIL)
	{
		StringInfoData sql;
		char	   *relname;
		ListCell   *lc;

		relname = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
											 RelationGetRelationName(rel));
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		initStringInfo(&sql);
		foreach(lc, names)
		{
			resetStringInfo(&sql);
			appendStringInfo(&sql, "DROP TRIGGER %s ON %s",
							 quote_identifier((char *) lfirst(lc)), relname);
			run_utility(sql.data);
		}
		SPI_finish();
		dropped = true;
	}
	relation_close(rel, NoLock);
	PG_RETURN_BOOL(dropped);
}

/*
 * The guards of a table after a DDL command: each must still work, and
 * there is at most one.  created: the command created a trigger, whose own
 * error is raised; otherwise the command changed the table under its guard
 * and is refused as such.  dropping: the command dropped a column of the
 * table with an object it uses (sql_drop).
 */
static void
check_guards_after_ddl(Relation rel, Oid fn, bool created, bool new_table,
					   bool dropping)
{
	TriggerDesc *td = rel->trigdesc;
	Trigger    *found = NULL;
	int			i;

	if (td == NULL)
		return;
	for (i = 0; i < td->numtriggers; i++)
	{
		Trigger    *trigger = &td->triggers[i];
		GuardDef	def;
		GuardProblem problem;

		if (!guard_is_trigger(trigger, fn))
			continue;
		if (!guard_definition(rel, trigger, &def, &problem))
		{
			if (created)
				guard_problem_raise(&problem);
			ereport(ERROR,
					(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
					 errmsg("cannot change table \"%s\" under its guard",
							RelationGetRelationName(rel)),
					 errdetail("The guard \"%s\" would fail with: %s.",
							   trigger->tgname, problem.message),
					 new_table ?
					 errhint("Create the partition without that key: the guard of its partitioned table guards it.") :
					 dropping ?
					 errhint("The command drops a guarded column with an object it uses (its type, domain or collation): remove the guard with idem_unguard() first to drop the column with it.") :
					 errhint("Remove the guard with idem_unguard() first, make the change, and guard the table again with idem_guard(), in one transaction.")));
		}
		if (found != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("table \"%s\" is guarded already",
							RelationGetRelationName(rel)),
					 errdetail("Triggers \"%s\" and \"%s\" both execute %s().",
							   found->tgname, trigger->tgname,
							   GUARD_TRIGGER_FUNC),
					 errhint("A table has one guard; remove it with idem_unguard() to guard the table otherwise.")));
		found = trigger;
	}
}

/*
 * idem._guard_problem(trigger oid) returns text: why the guard of that
 * trigger fails where it fires (what its firing would say), or NULL when it
 * works, or when the trigger is gone.  The update from 0.1.0 warns of the
 * guards it keeps that this library refuses.
 */
PG_FUNCTION_INFO_V1(idem_guard_problem);
Datum
idem_guard_problem(PG_FUNCTION_ARGS)
{
	Oid			tgoid = PG_GETARG_OID(0);
	Relation	tgrel;
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tup;
	Oid			relid = InvalidOid;
	Relation	rel;
	char	   *why = NULL;
	int			i;

	tgrel = table_open(TriggerRelationId, AccessShareLock);
	ScanKeyInit(&skey, Anum_pg_trigger_oid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(tgoid));
	scan = systable_beginscan(tgrel, TriggerOidIndexId, true, NULL, 1, &skey);
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
		relid = ((Form_pg_trigger) GETSTRUCT(tup))->tgrelid;
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);
	if (!OidIsValid(relid) ||
		(rel = try_relation_open(relid, AccessShareLock)) == NULL)
		PG_RETURN_NULL();
	for (i = 0; rel->trigdesc != NULL && i < rel->trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &rel->trigdesc->triggers[i];
		GuardDef	def;
		GuardProblem problem;

		if (trigger->tgoid != tgoid)
			continue;
		if (!guard_definition(rel, trigger, &def, &problem))
			why = problem.message;
		break;
	}
	relation_close(rel, AccessShareLock);
	if (why == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(why));
}

/* The tables made of a composite type (CREATE TABLE ... OF). */
static List *
typed_tables_of(Oid typid)
{
	Relation	classrel;
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tup;
	List	   *result = NIL;

	if (!OidIsValid(typid))
		return NIL;
	classrel = table_open(RelationRelationId, AccessShareLock);
	ScanKeyInit(&skey, Anum_pg_class_reloftype, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(typid));
	scan = systable_beginscan(classrel, InvalidOid, false, NULL, 1, &skey);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
		result = lappend_oid(result, ((Form_pg_class) GETSTRUCT(tup))->oid);
	systable_endscan(scan);
	table_close(classrel, AccessShareLock);
	return result;
}

/* Whether this transaction holds a lock of any mode on the relation. */
static bool
relation_locked_by_me(Oid relid)
{
	LOCKTAG		tag;
	LOCKMODE	mode;

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	for (mode = AccessShareLock; mode <= AccessExclusiveLock; mode++)
		if (LockHeldByMe(&tag, mode))
			return true;
	return false;
}

/*
 * Whether the relation has a trigger that executes fn, read from the catalog
 * without a lock on the relation.
 */
static bool
relation_has_trigger_of(Oid relid, Oid fn)
{
	Relation	tgrel;
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	tgrel = table_open(TriggerRelationId, AccessShareLock);
	ScanKeyInit(&skey, Anum_pg_trigger_tgrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(tgrel, TriggerRelidNameIndexId, true, NULL,
							  1, &skey);
	while (!found && HeapTupleIsValid(tup = systable_getnext(scan)))
		found = ((Form_pg_trigger) GETSTRUCT(tup))->tgfoid == fn;
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);
	return found;
}

/*
 * idem._guard_ddl(): event trigger at the end of ALTER TABLE, ALTER TYPE,
 * CREATE INDEX, CREATE TABLE (a new partition of a guarded table, with its
 * own keys) and
 * CREATE TRIGGER.  A guard names its columns in its trigger's arguments
 * (which is what pg_dump keeps), so a command that renames or drops a
 * guarded column, changes the version column's type, drops its NOT NULL or
 * puts it in a key would leave a guard that fails every UPDATE of the table
 * (or changes its keys): it is refused, with 2BP01.  A guard trigger made by
 * hand that cannot work, or a second one, is refused with the error of the
 * problem.  Inheritance children and partitions, which ALTER TABLE changes
 * with their parent, are checked too, and the tables of a composite type,
 * which ALTER TYPE ... CASCADE changes with it.
 *
 * It is also the event trigger at sql_drop, of any command: a DROP TYPE,
 * DOMAIN or COLLATION ... CASCADE (or DROP SCHEMA ... CASCADE of one) drops
 * the columns that use it, and the tables that lose a column are checked
 * in the same way.  A table dropped whole is no longer there, and skipped.
 */
PG_FUNCTION_INFO_V1(idem_guard_ddl);
Datum
idem_guard_ddl(PG_FUNCTION_ARGS)
{
	int			ret;
	uint64		n;
	uint64		i;
	Oid		   *relids;
	bool	   *created;
	bool	   *new_table;
	EventTriggerData *evdata;
	bool		dropping;
	Oid			fn;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem._guard_ddl() was not called by the event trigger manager")));

	/*
	 * idem's own update scripts remake the guards an earlier version made,
	 * which keep working as they did even where a new guard would be
	 * refused (a version column that lost its NOT NULL, say).
	 */
	if (creating_extension &&
		CurrentExtensionObject == get_extension_oid("idem", true))
		PG_RETURN_VOID();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	evdata = (EventTriggerData *) fcinfo->context;
	if (strcmp(evdata->event, "sql_drop") == 0)
		ret = SPI_execute("SELECT DISTINCT d.objid, false, false "
						  "FROM pg_catalog.pg_event_trigger_dropped_objects() d "
						  "WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass "
						  "  AND d.objsubid OPERATOR(pg_catalog.>) 0",
						  false, 0);
	else
		ret = SPI_execute("SELECT DISTINCT "
						  "CASE WHEN c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_trigger'::pg_catalog.regclass "
						  "THEN (SELECT t.tgrelid FROM pg_catalog.pg_trigger t "
						  "       WHERE t.oid OPERATOR(pg_catalog.=) c.objid) "
						  "ELSE COALESCE((SELECT i.indrelid FROM pg_catalog.pg_index i "
						  "                WHERE i.indexrelid OPERATOR(pg_catalog.=) c.objid), c.objid) END, "
						  "c.command_tag OPERATOR(pg_catalog.=) 'CREATE TRIGGER', "
						  "c.command_tag OPERATOR(pg_catalog.=) 'CREATE TABLE' "
						  "FROM pg_catalog.pg_event_trigger_ddl_commands() c "
						  "WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass "
						  "   OR c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_trigger'::pg_catalog.regclass",
						  false, 0);	/* not read-only: sees the command's rows */
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute of the DDL commands failed: %s",
			 SPI_result_code_string(ret));
	n = SPI_processed;
	/* a column dropped with what it uses, not by ALTER TABLE ... DROP */
	dropping = strcmp(evdata->event, "sql_drop") == 0 &&
		evdata->tag != CMDTAG_ALTER_TABLE;
	relids = SPI_palloc(Max(n, 1) * sizeof(Oid));
	created = SPI_palloc(Max(n, 1) * sizeof(bool));
	new_table = SPI_palloc(Max(n, 1) * sizeof(bool));
	for (i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		d;

		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1,
						  &isnull);
		relids[i] = isnull ? InvalidOid : DatumGetObjectId(d);
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2,
						  &isnull);
		created[i] = !isnull && DatumGetBool(d);
		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3,
						  &isnull);
		new_table[i] = !isnull && DatumGetBool(d);
	}
	SPI_finish();

	fn = InvalidOid;
	for (i = 0; i < n; i++)
	{
		List	   *roots;
		List	   *rels = NIL;
		ListCell   *lc;
		char		relkind;

		if (!OidIsValid(relids[i]))
			continue;
		relkind = get_rel_relkind(relids[i]);

		/*
		 * ALTER TYPE ... CASCADE of a composite type changes the tables of
		 * that type (CREATE TABLE ... OF) as it changes the type.
		 */
		if (relkind == RELKIND_COMPOSITE_TYPE)
			roots = typed_tables_of(get_rel_type_id(relids[i]));
		else if (relkind == RELKIND_RELATION ||
				 relkind == RELKIND_PARTITIONED_TABLE ||
				 relkind == RELKIND_FOREIGN_TABLE)
			roots = list_make1_oid(relids[i]);
		else
			continue;
		if (!OidIsValid(fn))
			fn = guard_lookup_func(fcinfo->flinfo->fn_oid);

		/*
		 * Only the relations of the tree that this transaction has locked
		 * (the command locks what it changes: the relation it names, and the
		 * partitions and children it recurses to) and that have a guard
		 * trigger are checked.  Locking every partition after a command on
		 * its parent, which holds its lock on the parent, inverts the order
		 * of locks other sessions take (a COPY into a partition locks the
		 * parent after the partition): a parallel pg_restore, which loads
		 * partitions while it adds the parent's keys (ALTER TABLE ONLY),
		 * deadlocked on any partitioned table.
		 */
		foreach(lc, roots)
			rels = list_concat(rels, find_all_inheritors(lfirst_oid(lc), NoLock,
														 NULL));
		foreach(lc, rels)
		{
			Relation	rel;

			if ((lfirst_oid(lc) != relids[i] &&
				 !relation_locked_by_me(lfirst_oid(lc))) ||
				!relation_has_trigger_of(lfirst_oid(lc), fn))
				continue;
			rel = try_relation_open(lfirst_oid(lc), AccessShareLock);
			if (rel == NULL)
				continue;
			check_guards_after_ddl(rel, fn, created[i], new_table[i],
								   dropping);
			relation_close(rel, AccessShareLock);
		}
		list_free(rels);
		list_free(roots);
	}
	PG_RETURN_VOID();
}
