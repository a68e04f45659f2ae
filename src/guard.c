/*-------------------------------------------------------------------------
 *
 * guard.c
 *	  State machines, guarded tables and transitions.
 *
 * A state machine is a set of allowed transitions (machine, from_state,
 * to_state), rows of idem.transitions.  States are compared as text: the
 * text the state column's type prints (its output function), so integer,
 * text and enum columns all work, and an integer state 1 is written '1'.
 *
 * idem_guard() puts the row trigger idem_guard_trigger() on a table, BEFORE
 * UPDATE FOR EACH ROW, named "idem_guard", with the machine, the state column
 * and the optional version column as its arguments: the trigger is the
 * guard's whole definition and is dumped with the table.  A guard is any
 * trigger that executes idem_guard_trigger(), whatever its name; one that
 * cannot work is refused when made and wherever it is used, and the event
 * trigger idem_guard_ddl refuses DDL that would break a guard (the columns
 * are named in the trigger's arguments, and a dump keeps names).  On every
 * UPDATE of a guarded row, whatever code path issued it:
 *
 *	- a change of the state column that is not an allowed transition fails
 *	  with SQLSTATE 23514 (check_violation); the error names the table (and
 *	  its schema and the state column, in the error's fields), the row's
 *	  primary key and both states.  A NULL state is never part of a machine,
 *	  so changing to or from NULL is never allowed.  An UPDATE that leaves the
 *	  state as it was (same text) is not a transition and is always allowed.
 *	- the version column goes up by exactly one: an UPDATE that leaves it
 *	  unchanged gets old + 1 written for it, an UPDATE that sets old + 1 is
 *	  accepted, any other value (NULL included) fails with SQLSTATE 23514,
 *	  with the version column in the error's fields.  Every UPDATE of the row
 *	  writes a new row version and counts as a change, even one that writes
 *	  the same values.  A version that cannot go up (the largest value of its
 *	  type) fails with 22003; a row whose version is NULL (possible only after
 *	  the NOT NULL constraint idem_guard() requires was dropped) fails with
 *	  23502.
 *	- INSERT is not checked: a row may start in any state, at any version.
 *
 * The guard sees the row as the BEFORE ROW triggers sorted before
 * "idem_guard" left it; triggers sorted after it run after the check.
 *
 * idem_transition(tbl, key, to_state, expected_version) moves one row,
 * found by the table's single-column primary key, and says what happened
 * (enum idem_transition_result):
 *
 *	applied    the row moved to to_state; its version went up by one.
 *	already    the row is in to_state and, if expected_version was given,
 *			   at expected_version + 1 (a retry of a request that was
 *			   applied), or at expected_version without a transition from
 *			   to_state to itself (see below).  Nothing is written.
 *	stale      with expected_version: the row is at another version (and not
 *			   "already").  Without it: the row's state can be reached from
 *			   to_state through the machine, so the row has already moved
 *			   beyond to_state and the request is late.  Nothing is written.
 *	illegal    the machine has no transition from the row's state to
 *			   to_state, and none of the above holds.
 *	not_found  no row has that key (or the caller may not see it).
 *
 * When expected_version is given and matches, a request to move a row to the
 * state it is in is a transition from that state to itself: applied (the
 * version goes up) if the machine allows it; otherwise already, as without
 * expected_version: the row is at the version the caller knows and in the
 * state it asks for, which is what it wants, where illegal would tell it
 * that the state cannot be reached.  Nothing is written then (a plain UPDATE
 * that sets the same state writes the row and bumps its version).  In a machine
 * with cycles a late request without expected_version can look like a legal
 * transition and be applied: give expected_version there.
 *
 * idem_transition does what "UPDATE ONLY t SET state = $2 WHERE key = $1"
 * does.  On most tables it does it itself, without a plan, as logical
 * replication applies a change: a probe of the primary key, the row lock,
 * then the row triggers, constraints and indexes of an UPDATE.  A table
 * with row-level security, rules, statement-level UPDATE triggers or
 * transition tables, or stored generated columns gets that UPDATE through
 * SPI, with a plan prepared once per table and kept.  Either way the
 * decision is made by the guard trigger itself on the locked row (the latest
 * version of it, as with any UPDATE under READ COMMITTED), so concurrent
 * calls on one row serialise on the row lock and each sees what the
 * previous one did; under REPEATABLE READ or SERIALIZABLE a concurrent
 * change is the usual 40001.  It runs as the caller, who needs the
 * privileges a hand-written UPDATE of the state column by primary key needs
 * (UPDATE on the state column, SELECT on the key column) and, since the
 * outcomes tell the row's state and version, SELECT on those columns too;
 * row-level security applies.
 *
 * Errors of misuse (SQLSTATE):
 *	22004  a NULL tbl, key, to_state, machine, from_state or state_column
 *	22023  an empty machine name; expected_version given for a table
 *		   guarded without a version column; the same column given as
 *		   state and version
 *	22001  a machine name longer than 63 bytes
 *	42P01  no table has that OID
 *	42809  idem_guard or idem_transition on something that is not an
 *		   ordinary table (idem_transition moves rows of a partition), or
 *		   idem_guard on a table of the schema idem (also a guard trigger
 *		   made by hand there)
 *	42703  no such column (also when a guarded column was dropped or
 *		   renamed where the event trigger did not fire: every UPDATE then
 *		   fails until the table is guarded again)
 *	42804  a version column that is not smallint, integer or bigint
 *	42704  idem_guard with a machine that has no transition
 *	42710  idem_guard on a table guarded already with another definition;
 *		   a second guard trigger; a trigger named "idem_guard" that is not
 *		   idem's guard
 *	42501  no EXECUTE privilege on the administration functions; no
 *		   TRIGGER privilege (idem_guard); not the owner (idem_unguard); no
 *		   UPDATE privilege, or no SELECT privilege on the key, state and
 *		   version columns (idem_transition)
 *	55000  idem_transition on a table that is not guarded, has more than
 *		   one guard, whose guard is disabled or did not fire
 *		   (session_replication_role = replica),
 *		   that has no single-column primary key, or whose row was skipped
 *		   by another BEFORE trigger; a version column that is nullable
 *		   (idem_guard, DDL) or part of a key (primary key, unique
 *		   constraint or index, foreign key)
 *	39P01  a trigger executing idem_guard_trigger() that is not BEFORE
 *		   UPDATE FOR EACH ROW, for UPDATE only, without a column list or a
 *		   WHEN condition, or with other arguments than (machine, state
 *		   column [, version column]): when it is created, and wherever it
 *		   fires or is used
 *	2BP01  ALTER TABLE or CREATE INDEX that would leave a guard that cannot
 *		   work (the event trigger idem_guard_ddl)
 *	25006  a read-only transaction
 *	The key and to_state are read by the input functions of the key and
 *	state column types, whose errors (such as 22P02) come through.
 *	idem_transition raises what the UPDATE it stands for would: 40001 when
 *	the row changed since a REPEATABLE READ snapshot, 27000 when a trigger
 *	of the same command already changed it, and the errors of the table's
 *	own constraints and triggers.
 *
 * Caches.  Every backend keeps the machines in memory, and for every guarded
 * table the columns and types the trigger needs and the plans of
 * idem_transition.  A change to idem.transitions (from idem_allow,
 * idem_disallow or any INSERT, UPDATE, DELETE or TRUNCATE, through triggers
 * enabled ALWAYS) sends a relcache invalidation of that table; a relcache
 * callback then drops the machines, so that every session sees committed
 * definitions at its next statement, without reconnecting.  The messages are
 * read before the machines are used, not only when a statement opens its
 * tables: a prepared statement run again in an open transaction opens none.  The machines are
 * read with the latest snapshot, as catalogs are, so a session in a
 * REPEATABLE READ transaction also sees the new definitions.  The per-table
 * entries are dropped by the same callback when their table changes.
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
#include "catalog/pg_collation.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
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

#define TRANSITIONS_TABLE	"transitions"
#define TRANSITIONS_NATTS	3
#define GUARD_TRIGGER_NAME	"idem_guard"
#define GUARD_TRIGGER_FUNC	"idem_guard_trigger"
#define MACHINE_MAX_LEN		IDEM_MAX_NS_LEN

typedef enum TransitionOutcome
{
	OUTCOME_APPLIED,
	OUTCOME_ALREADY,
	OUTCOME_STALE,
	OUTCOME_ILLEGAL,
	OUTCOME_NOT_FOUND
} TransitionOutcome;

static const char *const transition_result_labels[] = {
	"applied", "already", "stale", "illegal", "not_found"
};

/* ----------------------------------------------------------------
 * The machines, cached per backend
 * ----------------------------------------------------------------
 */

/*
 * The successors of one state of one machine.  The key is the bytes
 * "machine\0state", of length len (without the final \0).
 */
typedef struct StateKey
{
	uint32		len;
	const char *data;
} StateKey;

typedef struct StateEntry
{
	StateKey	key;
	int			ntargets;
	int			maxtargets;
	char	  **targets;
} StateEntry;

typedef struct MachineEntry
{
	char		name[NAMEDATALEN];	/* hash key */
} MachineEntry;

static MemoryContext machines_cxt = NULL;
static HTAB *states_htab = NULL;	/* NULL when not loaded */
static HTAB *machines_htab = NULL;
static bool machines_valid = false;
static Oid	transitions_relid = InvalidOid;

/* ----------------------------------------------------------------
 * Guarded tables, cached per backend
 * ----------------------------------------------------------------
 */
typedef struct GuardEntry
{
	Oid			relid;			/* hash key */
	bool		valid;			/* the guard part below is current */
	MemoryContext fn_cxt;		/* fn_mcxt of the FmgrInfos below */
	Oid			tgoid;			/* the trigger it was read from */
	char		machine[NAMEDATALEN];
	bool		machine_too_long;
	AttrNumber	state_attnum;
	Oid			state_type;
	int32		state_typmod;
	bool		state_byval;
	int16		state_len;
	FmgrInfo	state_out;
	AttrNumber	version_attnum; /* InvalidAttrNumber if none */
	Oid			version_type;

	/* idem_transition: the key, valid while key_valid */
	bool		key_valid;
	Oid			key_index;		/* the primary key */
	AttrNumber	key_attnum;
	Oid			key_type;
	int32		key_typmod;
	Oid			key_ioparam;
	FmgrInfo	key_in;
	Oid			key_eqop;
	FmgrInfo	key_eq;
	Oid			key_collation;
	Oid			state_ioparam;
	FmgrInfo	state_in;

	/* the SPI path: valid only while plans != NULL and plans_valid */
	bool		plans_valid;
	int			busy;			/* idem_transition calls running the plans */
	SPIPlanPtr	update_plan;
	SPIPlanPtr	exists_plan;
} GuardEntry;

static HTAB *guard_htab = NULL;
static bool callback_registered = false;
static Oid	guard_func_oid = InvalidOid;

/*
 * A transition asked by idem_transition, decided by the trigger when it
 * fires on the row of that key for the UPDATE that idem_transition runs: not
 * for an UPDATE of the same row that another trigger runs meanwhile, which
 * fires it one level deeper.  Calls can nest (a trigger may call
 * idem_transition), hence the chain.
 */
typedef struct TransitionRequest
{
	Oid			relid;
	AttrNumber	key_attnum;
	Datum		key;
	FmgrInfo	key_eq;
	Oid			key_collation;
	const char *to_state;		/* as the state type prints it */
	bool		has_expected;
	int64		expected;
	int			depth;			/* trigger depth of the guard's firing */
	bool		fired;
	TransitionOutcome outcome;
	struct TransitionRequest *outer;
} TransitionRequest;

static TransitionRequest *active_request = NULL;

/* ----------------------------------------------------------------
 * Invalidation
 * ----------------------------------------------------------------
 */
static void
guard_relcache_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == transitions_relid)
		machines_valid = false;

	if (guard_htab == NULL)
		return;
	if (!OidIsValid(relid))
	{
		HASH_SEQ_STATUS status;
		GuardEntry *entry;

		hash_seq_init(&status, guard_htab);
		while ((entry = hash_seq_search(&status)) != NULL)
		{
			entry->valid = false;
			entry->key_valid = false;
			entry->plans_valid = false;
		}
	}
	else
	{
		GuardEntry *entry = hash_search(guard_htab, &relid, HASH_FIND, NULL);

		if (entry != NULL)
		{
			entry->valid = false;
			entry->key_valid = false;
			entry->plans_valid = false;
		}
	}
}

static void
guard_init(void)
{
	HASHCTL		ctl;

	if (callback_registered)
		return;
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(GuardEntry);
	guard_htab = hash_create("idem guarded tables", 16, &ctl,
							 HASH_ELEM | HASH_BLOBS);
	CacheRegisterRelcacheCallback(guard_relcache_callback, (Datum) 0);
	callback_registered = true;
}

/* ----------------------------------------------------------------
 * Loading and reading the machines
 * ----------------------------------------------------------------
 */
static uint32
state_key_hash(const void *key, Size keysize)
{
	const StateKey *k = (const StateKey *) key;

	return hash_bytes((const unsigned char *) k->data, (int) k->len);
}

static int
state_key_match(const void *key1, const void *key2, Size keysize)
{
	const StateKey *a = (const StateKey *) key1;
	const StateKey *b = (const StateKey *) key2;

	if (a->len == b->len && memcmp(a->data, b->data, a->len) == 0)
		return 0;
	return 1;
}

/* The key of (machine, state), allocated in the current memory context. */
static StateKey
make_state_key(const char *machine, const char *state)
{
	StateKey	key;
	size_t		mlen = strlen(machine);
	size_t		slen = strlen(state);
	char	   *data = palloc(mlen + slen + 2);

	memcpy(data, machine, mlen + 1);
	memcpy(data + mlen + 1, state, slen + 1);
	key.len = (uint32) (mlen + 1 + slen);
	key.data = data;
	return key;
}

static Oid
transitions_table_oid(void)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA, true);
	Oid			relid = InvalidOid;

	if (OidIsValid(nsp))
		relid = get_relname_relid(TRANSITIONS_TABLE, nsp);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"%s.%s\" does not exist",
						IDEM_SCHEMA, TRANSITIONS_TABLE),
				 errhint("Install the extension idem.")));
	/* it is scanned with the table access method, which only a table has */
	if (get_rel_relkind(relid) != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("\"%s.%s\" of the idem extension is not an ordinary table",
						IDEM_SCHEMA, TRANSITIONS_TABLE),
				 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
	return relid;
}

/*
 * Make sure the machines are loaded and current.  Pointers into them stay
 * valid until the next call of this function.
 */
static void
machines_ensure(void)
{
	Relation	rel;
	Snapshot	snapshot;
	TableScanDesc scan;
	TupleTableSlot *slot;
	HASHCTL		ctl;
	HTAB	   *states;
	HTAB	   *machines;

	guard_init();

	/*
	 * Read what other sessions committed.  A statement that names its tables
	 * does so when it opens them, but a prepared statement or a PL/pgSQL
	 * plan run again in the same transaction takes no new lock, and would
	 * otherwise go on with the machines of its first execution.  Nothing to
	 * read is one look at a shared counter.
	 */
	AcceptInvalidationMessages();
	if (machines_valid && states_htab != NULL)
		return;

	transitions_relid = transitions_table_oid();
	/* Opening the table takes a lock and so reads pending invalidations. */
	rel = table_open(transitions_relid, AccessShareLock);
	{
		static const IdemColumn columns[TRANSITIONS_NATTS] = {
			{"machine", TEXTOID, true, C_COLLATION_OID},
			{"from_state", TEXTOID, true, C_COLLATION_OID},
			{"to_state", TEXTOID, true, C_COLLATION_OID}
		};

		idem_check_columns(RelationGetDescr(rel), TRANSITIONS_TABLE, columns,
						   TRANSITIONS_NATTS);
	}

	/* An invalidation that arrives from here on makes us read again. */
	machines_valid = true;
	states_htab = NULL;
	machines_htab = NULL;
	if (machines_cxt == NULL)
		machines_cxt = AllocSetContextCreate(CacheMemoryContext,
											 "idem state machines",
											 ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(machines_cxt);

	ctl.keysize = sizeof(StateKey);
	ctl.entrysize = sizeof(StateEntry);
	ctl.hash = state_key_hash;
	ctl.match = state_key_match;
	ctl.hcxt = machines_cxt;
	states = hash_create("idem machine states", 64, &ctl,
						 HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(MachineEntry);
	ctl.hcxt = machines_cxt;
	machines = hash_create("idem machines", 16, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);

	/*
	 * The latest snapshot, not the transaction's: definitions behave like
	 * catalogs, and a change committed after this snapshot was taken sends
	 * an invalidation that has not been read yet.
	 */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = table_beginscan(rel, snapshot, 0, NULL);
	slot = table_slot_create(rel, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		MemoryContext old;
		char	   *machine;
		char	   *from;
		char	   *to;
		StateKey	key;
		StateEntry *entry;
		bool		found;

		slot_getallattrs(slot);
		if (slot->tts_isnull[0] || slot->tts_isnull[1] || slot->tts_isnull[2])
			continue;			/* not possible: the columns are NOT NULL */

		old = MemoryContextSwitchTo(machines_cxt);
		machine = TextDatumGetCString(slot->tts_values[0]);
		from = TextDatumGetCString(slot->tts_values[1]);
		to = TextDatumGetCString(slot->tts_values[2]);
		if (strlen(machine) < NAMEDATALEN)
			(void) hash_search(machines, machine, HASH_ENTER, NULL);
		key = make_state_key(machine, from);
		entry = hash_search(states, &key, HASH_ENTER, &found);
		if (!found)
		{
			entry->key = key;	/* the copy in machines_cxt */
			entry->ntargets = 0;
			entry->maxtargets = 4;
			entry->targets = palloc(entry->maxtargets * sizeof(char *));
		}
		if (entry->ntargets == entry->maxtargets)
		{
			entry->maxtargets *= 2;
			entry->targets = repalloc(entry->targets,
									  entry->maxtargets * sizeof(char *));
		}
		entry->targets[entry->ntargets++] = to;
		MemoryContextSwitchTo(old);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);

	states_htab = states;
	machines_htab = machines;
}

static bool
machine_defined(const char *machine)
{
	if (strlen(machine) >= NAMEDATALEN)
		return false;
	machines_ensure();
	return hash_search(machines_htab, machine, HASH_FIND, NULL) != NULL;
}

static StateEntry *
machine_state(const char *machine, const char *state)
{
	StateKey	key = make_state_key(machine, state);
	StateEntry *entry;

	entry = hash_search(states_htab, &key, HASH_FIND, NULL);
	pfree((void *) key.data);
	return entry;
}

/* Does the machine allow from -> to?  NULL states are never allowed. */
static bool
transition_allowed(const char *machine, const char *from, const char *to)
{
	StateEntry *entry;
	int			i;

	if (from == NULL || to == NULL)
		return false;
	machines_ensure();
	entry = machine_state(machine, from);
	if (entry == NULL)
		return false;
	for (i = 0; i < entry->ntargets; i++)
		if (strcmp(entry->targets[i], to) == 0)
			return true;
	return false;
}

/* Can target be reached from "from" by one transition or more? */
static bool
state_reachable(const char *machine, const char *from, const char *target)
{
	List	   *queue;
	List	   *seen;
	bool		reached = false;

	if (from == NULL || target == NULL)
		return false;
	machines_ensure();
	queue = list_make1((char *) from);
	seen = list_make1((char *) from);
	while (queue != NIL && !reached)
	{
		char	   *state = linitial(queue);
		StateEntry *entry;
		int			i;

		queue = list_delete_first(queue);
		entry = machine_state(machine, state);
		if (entry == NULL)
			continue;
		for (i = 0; i < entry->ntargets && !reached; i++)
		{
			char	   *next = entry->targets[i];
			ListCell   *lc;
			bool		known = false;

			if (strcmp(next, target) == 0)
			{
				reached = true;
				break;
			}
			foreach(lc, seen)
			{
				if (strcmp((char *) lfirst(lc), next) == 0)
				{
					known = true;
					break;
				}
			}
			if (!known)
			{
				seen = lappend(seen, next);
				queue = lappend(queue, next);
			}
		}
	}
	list_free(queue);
	list_free(seen);
	return reached;
}

/* ----------------------------------------------------------------
 * Guarded tables
 * ----------------------------------------------------------------
 */

/* The attribute number of a live user column, or InvalidAttrNumber. */
static AttrNumber
column_attnum(Relation rel, const char *name)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), name) == 0)
			return att->attnum;
	}
	return InvalidAttrNumber;
}

static bool
is_version_type(Oid type)
{
	return type == INT2OID || type == INT4OID || type == INT8OID;
}

/* The schema of an extension (get_extension_schema is not exported in 15). */
static Oid
extension_schema(Oid ext)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			nsp = InvalidOid;

	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		nsp = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return nsp;
}

/*
 * The OID of idem_guard_trigger(), beside the function that asks (the
 * extension's schema), or in the extension's schema when the caller is one
 * of idem's internal functions.
 */
static Oid
lookup_guard_func(Oid caller_fn)
{
	Oid			nsp = get_func_namespace(caller_fn);
	Oid			none = InvalidOid;
	Oid			ext = get_extension_oid("idem", true);
	oidvector  *noargs = buildoidvector(&none, 0);
	Oid			fn;

	if (OidIsValid(ext) && nsp == get_namespace_oid(IDEM_SCHEMA, true))
		nsp = extension_schema(ext);
	fn = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
						 CStringGetDatum(GUARD_TRIGGER_FUNC),
						 PointerGetDatum(noargs),
						 ObjectIdGetDatum(nsp));
	pfree(noargs);
	if (!OidIsValid(fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function %s() does not exist", GUARD_TRIGGER_FUNC),
				 errhint("Install the extension idem.")));
	return fn;
}

/*
 * A guard is a trigger that executes idem_guard_trigger(), whatever its name
 * and whatever it fires for: one that fires for anything else than UPDATE
 * is a guard that does not work, refused where it is used.
 */
static bool
is_guard_trigger(Trigger *trigger, Oid fn)
{
	return trigger->tgfoid == fn;
}

/* The only kind of trigger a guard can be: BEFORE UPDATE FOR EACH ROW. */
#define GUARD_TRIGGER_TYPE	(TRIGGER_TYPE_ROW | TRIGGER_TYPE_BEFORE | TRIGGER_TYPE_UPDATE)

/*
 * The guard trigger of a table, or NULL.  The OID of the trigger function
 * is kept; it is looked up again when no trigger matches, in case the
 * extension was created again.
 */
static Trigger *
find_guard_trigger(Relation rel, Oid caller_fn)
{
	TriggerDesc *desc = rel->trigdesc;
	int			pass;

	if (desc == NULL)
		return NULL;
	for (pass = 0; pass < 2; pass++)
	{
		Trigger    *found = NULL;
		int			i;

		if (!OidIsValid(guard_func_oid) || pass == 1)
			guard_func_oid = lookup_guard_func(caller_fn);
		for (i = 0; i < desc->numtriggers; i++)
		{
			Trigger    *trigger = &desc->triggers[i];

			if (!is_guard_trigger(trigger, guard_func_oid))
				continue;
			if (found != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("table \"%s\" has more than one guard",
								RelationGetRelationName(rel)),
						 errdetail("Triggers \"%s\" and \"%s\" both execute %s().",
								   found->tgname, trigger->tgname,
								   GUARD_TRIGGER_FUNC)));
			found = trigger;
		}
		if (found != NULL)
			return found;
	}
	return NULL;
}

/*
 * What is wrong with a guard, if anything: the error to raise, kept rather
 * than raised so that the DDL check can say it in its own words.
 */
typedef struct GuardProblem
{
	int			code;
	char	   *message;
	char	   *detail;
	char	   *hint;
} GuardProblem;

/* A guard's definition, read from its trigger. */
typedef struct GuardDef
{
	const char *machine;
	AttrNumber	state_attnum;
	AttrNumber	version_attnum; /* InvalidAttrNumber if none */
} GuardDef;

static bool
guard_problem(GuardProblem *problem, int code, char *message, char *detail,
			  char *hint)
{
	problem->code = code;
	problem->message = message;
	problem->detail = detail;
	problem->hint = hint;
	return false;
}

static void
guard_problem_raise(GuardProblem *problem)
{
	ereport(ERROR,
			(errcode(problem->code),
			 errmsg_internal("%s", problem->message),
			 problem->detail ? errdetail_internal("%s", problem->detail) : 0,
			 problem->hint ? errhint("%s", problem->hint) : 0));
}

/*
 * Why the column cannot be a version column because of a key: it is part of
 * a unique index (the primary key, a unique constraint, or a unique index
 * alone, also in an expression or predicate) or of a foreign key.  NULL if
 * it is not.  The guard writes the version on every UPDATE, which would
 * change the key.
 */
static char *
version_key_problem(Relation rel, AttrNumber attnum)
{
	List	   *indexes = RelationGetIndexList(rel);
	List	   *fkeys;
	ListCell   *lc;
	char	   *why = NULL;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Bitmapset  *attrs = NULL;
		int			i;

		if (index->rd_index->indisunique)
		{
			for (i = 0; i < index->rd_index->indnatts; i++)
				if (index->rd_index->indkey.values[i] == attnum)
					attrs = bms_add_member(attrs, 0);
			pull_varattnos((Node *) RelationGetIndexExpressions(index), 1,
						   &attrs);
			pull_varattnos((Node *) RelationGetIndexPredicate(index), 1,
						   &attrs);
			if (bms_is_member(0, attrs) ||
				bms_is_member(attnum - FirstLowInvalidHeapAttributeNumber,
							  attrs) ||
				bms_is_member(InvalidAttrNumber - FirstLowInvalidHeapAttributeNumber,
							  attrs))
				why = psprintf("It is part of the %s \"%s\".",
							   index->rd_index->indisprimary ?
							   "primary key" : "unique index",
							   RelationGetRelationName(index));
		}
		index_close(index, AccessShareLock);
		if (why != NULL)
			break;
	}
	list_free(indexes);
	if (why != NULL)
		return why;

	fkeys = RelationGetFKeyList(rel);
	foreach(lc, fkeys)
	{
		ForeignKeyCacheInfo *fk = lfirst_node(ForeignKeyCacheInfo, lc);
		int			i;

		for (i = 0; i < fk->nkeys; i++)
			if (fk->conkey[i] == attnum)
				return psprintf("It is part of the foreign key \"%s\".",
								get_constraint_name(fk->conoid));
	}
	return NULL;
}

/*
 * Check what a guard trigger must be for the guard to work, and read its
 * definition into *def: BEFORE UPDATE FOR EACH ROW and nothing else (no
 * column list, no WHEN condition), on a table outside idem's schema, with
 * (machine, state column [, version column]) as arguments naming live
 * columns, the version column of an integer type and part of no key.
 * "strict" adds what idem_guard demands of a new guard and DDL keeps: a
 * version column NOT NULL.  Returns false and fills *problem otherwise.
 */
static bool
guard_definition(Relation rel, Trigger *trigger, bool strict, GuardDef *def,
				 GuardProblem *problem)
{
	const char *relname = RelationGetRelationName(rel);
	const char *state_col;
	const char *version_col = NULL;
	Form_pg_attribute att;
	char	   *why;

	if (trigger->tgtype != GUARD_TRIGGER_TYPE || trigger->tgnattr != 0 ||
		trigger->tgqual != NULL)
		return guard_problem(problem, ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
							 psprintf("trigger \"%s\" of table \"%s\" must be BEFORE UPDATE FOR EACH ROW",
									  trigger->tgname, relname),
							 psprintf("%s() guards every UPDATE of a row: it cannot fire for INSERT, DELETE or TRUNCATE, after the row, for each statement, for some columns only, or under a WHEN condition.",
									  GUARD_TRIGGER_FUNC),
							 "Guard the table with idem_guard().");
	if (trigger->tgnargs < 2 || trigger->tgnargs > 3)
		return guard_problem(problem, ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
							 psprintf("trigger \"%s\" of table \"%s\" has wrong arguments",
									  trigger->tgname, relname),
							 psprintf("%s() takes a machine, a state column and an optional version column.",
									  GUARD_TRIGGER_FUNC),
							 "Guard the table with idem_guard().");
	if (RelationGetNamespace(rel) == get_namespace_oid(IDEM_SCHEMA, true))
		return guard_problem(problem, ERRCODE_WRONG_OBJECT_TYPE,
							 psprintf("table \"%s.%s\" cannot be guarded",
									  IDEM_SCHEMA, relname),
							 "The tables of the schema \"idem\" belong to the extension idem.",
							 NULL);

	def->machine = trigger->tgargs[0];
	state_col = trigger->tgargs[1];
	if (trigger->tgnargs == 3 && trigger->tgargs[2][0] != '\0')
		version_col = trigger->tgargs[2];

	def->state_attnum = column_attnum(rel, state_col);
	if (def->state_attnum == InvalidAttrNumber)
		return guard_problem(problem, ERRCODE_UNDEFINED_COLUMN,
							 psprintf("column \"%s\" of relation \"%s\" does not exist",
									  state_col, relname),
							 psprintf("The guard \"%s\" of the table names it as the state column.",
									  trigger->tgname),
							 "Guard the table again with idem_guard().");
	def->version_attnum = InvalidAttrNumber;
	if (version_col == NULL)
		return true;

	def->version_attnum = column_attnum(rel, version_col);
	if (def->version_attnum == InvalidAttrNumber)
		return guard_problem(problem, ERRCODE_UNDEFINED_COLUMN,
							 psprintf("column \"%s\" of relation \"%s\" does not exist",
									  version_col, relname),
							 psprintf("The guard \"%s\" of the table names it as the version column.",
									  trigger->tgname),
							 "Guard the table again with idem_guard().");
	if (def->version_attnum == def->state_attnum)
		return guard_problem(problem, ERRCODE_INVALID_PARAMETER_VALUE,
							 pstrdup("the state column and the version column must differ"),
							 psprintf("The guard \"%s\" of table \"%s\" names column \"%s\" as both.",
									  trigger->tgname, relname, state_col),
							 "Guard the table again with idem_guard().");
	att = TupleDescAttr(RelationGetDescr(rel), def->version_attnum - 1);
	if (!is_version_type(att->atttypid))
		return guard_problem(problem, ERRCODE_DATATYPE_MISMATCH,
							 psprintf("version column \"%s\" of table \"%s\" must be of type smallint, integer or bigint",
									  version_col, relname),
							 psprintf("Column \"%s\" is of type %s.", version_col,
									  format_type_be(att->atttypid)),
							 "Guard the table again with idem_guard().");
	if (strict && !att->attnotnull)
		return guard_problem(problem, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							 psprintf("version column \"%s\" must be NOT NULL",
									  version_col),
							 NULL,
							 psprintf("Run ALTER TABLE %s ALTER COLUMN %s SET NOT NULL.",
									  relname, quote_identifier(version_col)));
	why = version_key_problem(rel, def->version_attnum);
	if (why != NULL)
		return guard_problem(problem, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							 psprintf("version column \"%s\" of table \"%s\" must not be part of a key",
									  version_col, relname),
							 psprintf("%s Every update of a guarded row changes its version.",
									  why),
							 "Give a column of its own as the version column.");
	return true;
}

/*
 * A new memory context for the entry's FmgrInfos, where their functions keep
 * their own caches (record_eq and domain_in do).  A call in progress may
 * still use the old one: it goes with the transaction.
 */
static void
guard_entry_new_fn_cxt(GuardEntry *entry)
{
	if (entry->fn_cxt != NULL)
		MemoryContextSetParent(entry->fn_cxt, TopTransactionContext);
	entry->fn_cxt = AllocSetContextCreate(CacheMemoryContext,
										  "idem guarded table",
										  ALLOCSET_SMALL_SIZES);
}

/* The trigger depth, as pg_trigger_depth() tells it. */
static int
trigger_depth(void)
{
	LOCAL_FCINFO(fcinfo, 0);

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	return DatumGetInt32(pg_trigger_depth(fcinfo));
}

/*
 * The cache entry of a guarded table, read from its trigger's arguments:
 * (machine, state column [, version column]).  A trigger that cannot work
 * as a guard is refused here, whoever made it.
 */
static GuardEntry *
guard_entry_get(Relation rel, Trigger *trigger)
{
	Oid			relid = RelationGetRelid(rel);
	GuardEntry *entry;
	bool		found;
	GuardDef	def;
	GuardProblem problem;
	Form_pg_attribute att;

	guard_init();
	entry = hash_search(guard_htab, &relid, HASH_ENTER, &found);
	if (!found)
	{
		memset(((char *) entry) + sizeof(Oid), 0,
			   sizeof(GuardEntry) - sizeof(Oid));
		entry->relid = relid;
	}
	if (entry->valid && entry->tgoid == trigger->tgoid)
		return entry;

	/* Rebuild the guard part; the plans are prepared again when used. */
	entry->valid = false;
	entry->key_valid = false;
	entry->plans_valid = false;
	guard_entry_new_fn_cxt(entry);
	if (!guard_definition(rel, trigger, false, &def, &problem))
		guard_problem_raise(&problem);

	entry->machine_too_long = strlen(def.machine) >= NAMEDATALEN;
	strlcpy(entry->machine, def.machine, NAMEDATALEN);

	entry->state_attnum = def.state_attnum;
	att = TupleDescAttr(RelationGetDescr(rel), entry->state_attnum - 1);
	entry->state_type = att->atttypid;
	entry->state_typmod = att->atttypmod;
	entry->state_byval = att->attbyval;
	entry->state_len = att->attlen;
	{
		Oid			outfn;
		bool		varlena;

		getTypeOutputInfo(entry->state_type, &outfn, &varlena);
		fmgr_info_cxt(outfn, &entry->state_out, entry->fn_cxt);
	}

	entry->version_attnum = def.version_attnum;
	entry->version_type = InvalidOid;
	if (def.version_attnum != InvalidAttrNumber)
		entry->version_type = TupleDescAttr(RelationGetDescr(rel),
											def.version_attnum - 1)->atttypid;

	entry->tgoid = trigger->tgoid;
	entry->valid = true;
	return entry;
}

/* ----------------------------------------------------------------
 * The trigger
 * ----------------------------------------------------------------
 */
static char *
state_text(GuardEntry *entry, HeapTuple tuple, TupleDesc desc, Datum *value,
		   bool *isnull)
{
	*value = heap_getattr(tuple, entry->state_attnum, desc, isnull);
	if (*isnull)
		return NULL;
	return OutputFunctionCall(&entry->state_out, *value);
}

static int64
version_value(GuardEntry *entry, Datum d)
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

static Datum
version_datum(GuardEntry *entry, int64 v)
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

static int64
version_max(GuardEntry *entry)
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
 * May the current user read the column?  Column privileges are looked at
 * only when the table's own SELECT privilege is missing.
 */
static bool
column_readable(Relation rel, AttrNumber attnum)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			userid = GetUserId();

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

	if (!OidIsValid(pkoid))
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
static TransitionOutcome
decide(GuardEntry *entry, TransitionRequest *req, HeapTuple oldtup,
	   TupleDesc desc)
{
	Datum		cur_value;
	bool		cur_isnull;
	char	   *cur = state_text(entry, oldtup, desc, &cur_value, &cur_isnull);
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
		version = ver_isnull ? 0 : version_value(entry, ver_value);
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
			transition_allowed(entry->machine, cur, req->to_state))
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
	if (transition_allowed(entry->machine, cur, req->to_state))
		return OUTCOME_APPLIED;
	if (state_reachable(entry->machine, req->to_state, cur))
		return OUTCOME_STALE;
	return OUTCOME_ILLEGAL;
}

static bool
request_matches(TransitionRequest *req, HeapTuple oldtup, TupleDesc desc)
{
	bool		isnull;
	Datum		key = heap_getattr(oldtup, req->key_attnum, desc, &isnull);

	if (isnull)
		return false;
	return DatumGetBool(FunctionCall2Coll(&req->key_eq, req->key_collation,
										  key, req->key));
}

/* The checks of every UPDATE; returns the row to write. */
static HeapTuple
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
									transition_allowed(entry->machine,
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
		old_version = version_value(entry, old_value);
		if (old_version >= version_max(entry) &&
			!column_readable(rel, attnum))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("version of a row of table \"%s\" is out of range",
							RelationGetRelationName(rel)),
					 errdetail("%sThe row is at the largest version its type holds.",
							   key_sentence(rel, oldtup)),
					 errtablecol(rel, attnum)));
		if (old_version >= version_max(entry))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("version of a row of table \"%s\" is out of range",
							RelationGetRelationName(rel)),
					 errdetail("%sThe row is at version " INT64_FORMAT ", the largest value of its type.",
							   key_sentence(rel, oldtup), old_version),
					 errtablecol(rel, attnum)));
		target = old_version + 1;
		if (!new_isnull && version_value(entry, new_value) == old_version)
		{
			Datum		value = version_datum(entry, target);
			bool		isnull = false;
			int			col = attnum;

			newtup = heap_modify_tuple_by_cols(newtup, desc, 1, &col,
											   &value, &isnull);
		}
		else if ((new_isnull || version_value(entry, new_value) != target) &&
				 !column_readable(rel, attnum))
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("invalid version %s for a row of table \"%s\"",
							new_isnull ? "NULL" :
							psprintf(INT64_FORMAT, version_value(entry, new_value)),
							RelationGetRelationName(rel)),
					 errdetail("%sAn update must set the version to one more than the row's, or leave it unchanged.",
							   key_sentence(rel, oldtup)),
					 errtablecol(rel, attnum)));
		else if (new_isnull || version_value(entry, new_value) != target)
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("invalid version %s for a row of table \"%s\"",
							new_isnull ? "NULL" :
							psprintf(INT64_FORMAT, version_value(entry, new_value)),
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

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() was not called by the trigger manager",
						GUARD_TRIGGER_FUNC)));
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" of table \"%s\" must be BEFORE UPDATE FOR EACH ROW",
						trigdata->tg_trigger->tgname,
						RelationGetRelationName(trigdata->tg_relation)),
				 errdetail("%s() guards every UPDATE of a row: it cannot fire for INSERT, DELETE or TRUNCATE, after the row, for each statement, for some columns only, or under a WHEN condition.",
						   GUARD_TRIGGER_FUNC),
				 errhint("Guard the table with idem_guard().")));

	rel = trigdata->tg_relation;
	oldtup = trigdata->tg_trigtuple;
	entry = guard_entry_get(rel, trigdata->tg_trigger);

	req = active_request;
	if (req != NULL && !req->fired && req->relid == RelationGetRelid(rel) &&
		req->depth == trigger_depth() &&
		request_matches(req, oldtup, RelationGetDescr(rel)))
	{
		req->fired = true;
		req->outcome = decide(entry, req, oldtup, RelationGetDescr(rel));
		if (req->outcome != OUTCOME_APPLIED)
			return PointerGetDatum(NULL);	/* nothing is written */
	}

	return PointerGetDatum(guard_update(rel, entry, oldtup,
										trigdata->tg_newtuple));
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
static Relation
open_table_arg(FunctionCallInfo fcinfo, LOCKMODE lockmode)
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

static void
check_privilege(Oid relid, AclMode mode)
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
	idem_check_writable("idem_guard");

	relid = PG_GETARG_OID(0);
	if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
		check_privilege(relid, ACL_TRIGGER);
	rel = open_table_arg(fcinfo, ShareRowExclusiveLock);
	if (rel->rd_rel->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", RelationGetRelationName(rel)),
				 errdetail("Only ordinary tables can be guarded; guard each partition of a partitioned table.")));
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

	state_attnum = column_attnum(rel, state_col);
	if (state_attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist",
						state_col, RelationGetRelationName(rel))));
	if (version_col != NULL)
	{
		AttrNumber	attnum = column_attnum(rel, version_col);
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
		if (!is_version_type(att->atttypid))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("version column \"%s\" must be of type smallint, integer or bigint",
							version_col),
					 errdetail("Column \"%s\" is of type %s.", version_col,
							   format_type_be(att->atttypid))));
		if (!att->attnotnull)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("version column \"%s\" must be NOT NULL", version_col),
					 errhint("Run ALTER TABLE %s ALTER COLUMN %s SET NOT NULL.",
							 RelationGetRelationName(rel),
							 quote_identifier(version_col))));
		why = version_key_problem(rel, attnum);
		if (why != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("version column \"%s\" of table \"%s\" must not be part of a key",
							version_col, RelationGetRelationName(rel)),
					 errdetail("%s Every update of a guarded row changes its version.",
							   why),
					 errhint("Give a column of its own as the version column.")));
	}
	if (!machine_defined(machine))
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
	fn = lookup_guard_func(fcinfo->flinfo->fn_oid);
	existing = find_guard_trigger(rel, fcinfo->flinfo->fn_oid);
	if (existing != NULL)
	{
		const char *old_version = NULL;

		if (existing->tgnargs == 3 && existing->tgargs[2][0] != '\0')
			old_version = existing->tgargs[2];
		if (existing->tgtype == GUARD_TRIGGER_TYPE &&
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
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("table \"%s\" is guarded already",
						RelationGetRelationName(rel)),
				 errdetail("Its guard \"%s\" has another definition.",
						   existing->tgname),
				 errhint("Remove the guard with idem_unguard() first, then guard the table again.")));
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
					 "CREATE TRIGGER %s BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s(%s, %s",
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
	idem_check_writable("idem_unguard");
	relid = PG_GETARG_OID(0);
	if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)) &&
		!pg_class_ownercheck(relid, GetUserId()))
		aclcheck_error(ACLCHECK_NOT_OWNER,
					   get_relkind_objtype(get_rel_relkind(relid)),
					   get_rel_name(relid));
	rel = open_table_arg(fcinfo, ShareRowExclusiveLock);
	fn = lookup_guard_func(fcinfo->flinfo->fn_oid);
	/* every trigger that executes the guard, whatever its name */
	if (rel->trigdesc != NULL)
	{
		int			i;

		for (i = 0; i < rel->trigdesc->numtriggers; i++)
			if (is_guard_trigger(&rel->trigdesc->triggers[i], fn))
				names = lappend(names,
								pstrdup(rel->trigdesc->triggers[i].tgname));
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
 * and is refused as such.
 */
static void
check_guards_after_ddl(Relation rel, Oid fn, bool created)
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

		if (!is_guard_trigger(trigger, fn))
			continue;
		if (!guard_definition(rel, trigger, true, &def, &problem))
		{
			if (created)
				guard_problem_raise(&problem);
			ereport(ERROR,
					(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
					 errmsg("cannot change table \"%s\" under its guard",
							RelationGetRelationName(rel)),
					 errdetail("The guard \"%s\" would fail with: %s.",
							   trigger->tgname, problem.message),
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
 * idem._guard_ddl(): event trigger at the end of ALTER TABLE, CREATE INDEX
 * and CREATE TRIGGER.  A guard names its columns in its trigger's arguments
 * (which is what pg_dump keeps), so a command that renames or drops a
 * guarded column, changes the version column's type, drops its NOT NULL or
 * puts it in a key would leave a guard that fails every UPDATE of the table
 * (or changes its keys): it is refused, with 2BP01.  A guard trigger made by
 * hand that cannot work, or a second one, is refused with the error of the
 * problem.  Inheritance children and partitions, which ALTER TABLE changes
 * with their parent, are checked too.
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
	Oid			fn;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem._guard_ddl() was not called by the event trigger manager")));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute("SELECT DISTINCT "
					  "CASE WHEN c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_trigger'::pg_catalog.regclass "
					  "THEN (SELECT t.tgrelid FROM pg_catalog.pg_trigger t "
					  "       WHERE t.oid OPERATOR(pg_catalog.=) c.objid) "
					  "ELSE COALESCE((SELECT i.indrelid FROM pg_catalog.pg_index i "
					  "                WHERE i.indexrelid OPERATOR(pg_catalog.=) c.objid), c.objid) END, "
					  "c.command_tag OPERATOR(pg_catalog.=) 'CREATE TRIGGER' "
					  "FROM pg_catalog.pg_event_trigger_ddl_commands() c "
					  "WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass "
					  "   OR c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_trigger'::pg_catalog.regclass",
					  false, 0);	/* not read-only: sees the command's rows */
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute of the DDL commands failed: %s",
			 SPI_result_code_string(ret));
	n = SPI_processed;
	relids = SPI_palloc(Max(n, 1) * sizeof(Oid));
	created = SPI_palloc(Max(n, 1) * sizeof(bool));
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
	}
	SPI_finish();

	fn = InvalidOid;
	for (i = 0; i < n; i++)
	{
		List	   *rels;
		ListCell   *lc;
		char		relkind;

		if (!OidIsValid(relids[i]))
			continue;
		relkind = get_rel_relkind(relids[i]);
		if (relkind != RELKIND_RELATION && relkind != RELKIND_PARTITIONED_TABLE &&
			relkind != RELKIND_FOREIGN_TABLE)
			continue;
		if (!OidIsValid(fn))
			fn = lookup_guard_func(fcinfo->flinfo->fn_oid);
		rels = find_all_inheritors(relids[i], AccessShareLock, NULL);
		foreach(lc, rels)
		{
			Relation	rel = try_relation_open(lfirst_oid(lc), AccessShareLock);

			if (rel == NULL)
				continue;
			check_guards_after_ddl(rel, fn, created[i]);
			relation_close(rel, AccessShareLock);
		}
		list_free(rels);
	}
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * idem_transition
 * ----------------------------------------------------------------
 */

/*
 * What idem_transition needs to find a row by its key: the primary key
 * index, its single column, the equality operator of its operator class (as
 * the core RI triggers use) and the input functions of the key and the
 * state.  Kept with the guard entry, read again after the table changed.
 */
static void
guard_prepare_key(GuardEntry *entry, Relation rel)
{
	Oid			pkoid;
	Relation	index;
	Oid			eqop;
	Form_pg_attribute att;
	Oid			infn;

	if (entry->key_valid)
		return;

	pkoid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(pkoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" has no primary key",
						RelationGetRelationName(rel)),
				 errhint("idem_transition() finds rows by a single-column primary key.")));
	index = index_open(pkoid, AccessShareLock);
	if (IndexRelationGetNumberOfKeyAttributes(index) != 1 ||
		index->rd_index->indkey.values[0] == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("primary key of table \"%s\" is not a single column",
						RelationGetRelationName(rel)),
				 errhint("idem_transition() finds rows by a single-column primary key.")));
	entry->key_attnum = index->rd_index->indkey.values[0];
	eqop = get_opfamily_member(index->rd_opfamily[0], index->rd_opcintype[0],
							   index->rd_opcintype[0], BTEqualStrategyNumber);
	entry->key_eqop = eqop;
	entry->key_collation = index->rd_indcollation[0];
	index_close(index, AccessShareLock);
	if (!OidIsValid(eqop))
		elog(ERROR, "no equality operator for the primary key of \"%s\"",
			 RelationGetRelationName(rel));
	fmgr_info_cxt(get_opcode(eqop), &entry->key_eq, entry->fn_cxt);

	att = TupleDescAttr(RelationGetDescr(rel), entry->key_attnum - 1);
	entry->key_type = att->atttypid;
	entry->key_typmod = att->atttypmod;
	getTypeInputInfo(entry->key_type, &infn, &entry->key_ioparam);
	fmgr_info_cxt(infn, &entry->key_in, entry->fn_cxt);

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
static void
check_outcome_privileges(Relation rel, GuardEntry *entry)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			userid = GetUserId();

	if (pg_class_aclcheck(relid, userid, ACL_SELECT) == ACLCHECK_OK)
		return;
	if (pg_attribute_aclcheck(relid, entry->key_attnum, userid,
							  ACL_SELECT) == ACLCHECK_OK &&
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

/*
 * Prepare and keep the plans of the SPI path of a guarded table (once per
 * table and backend, again after the table changed):
 *
 *	UPDATE ONLY t SET state = $2 WHERE key = $1
 *	SELECT 1 FROM ONLY t WHERE key = $1 FOR KEY SHARE
 *
 * with the equality operator of the primary key's operator class.  The
 * second tells, after an UPDATE that found nothing to update, whether a row
 * has the key: in its latest version, as the UPDATE judged it (a row deleted
 * or given another key while the UPDATE waited is no row), and one that a
 * trigger skipped is locked by this transaction already.  Must be called
 * connected to SPI, after guard_prepare_key().
 */
static void
guard_prepare_plans(GuardEntry *entry, Relation rel)
{
	HeapTuple	optup;
	Form_pg_operator op;
	char	   *opname;
	char	   *relname;
	char	   *keycol;
	char	   *statecol;
	Oid			argtypes[2];
	StringInfoData sql;
	SPIPlanPtr	update_plan;
	SPIPlanPtr	exists_plan;

	Assert(entry->key_valid);
	if (entry->plans_valid && entry->update_plan != NULL)
		return;

	keycol = pstrdup(quote_identifier(NameStr(TupleDescAttr(RelationGetDescr(rel),
															entry->key_attnum - 1)->attname)));
	statecol = pstrdup(quote_identifier(NameStr(TupleDescAttr(RelationGetDescr(rel),
															  entry->state_attnum - 1)->attname)));
	optup = SearchSysCache1(OPEROID, ObjectIdGetDatum(entry->key_eqop));
	if (!HeapTupleIsValid(optup))
		elog(ERROR, "cache lookup failed for operator %u", entry->key_eqop);
	op = (Form_pg_operator) GETSTRUCT(optup);
	opname = psprintf("OPERATOR(%s.%s)",
					  quote_identifier(get_namespace_name(op->oprnamespace)),
					  NameStr(op->oprname));
	ReleaseSysCache(optup);

	relname = quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
										 RelationGetRelationName(rel));
	argtypes[0] = entry->key_type;
	argtypes[1] = entry->state_type;

	initStringInfo(&sql);
	appendStringInfo(&sql, "UPDATE ONLY %s SET %s = $2 WHERE %s %s $1",
					 relname, statecol, keycol, opname);
	update_plan = SPI_prepare(sql.data, 2, argtypes);
	if (update_plan == NULL)
		elog(ERROR, "SPI_prepare of \"%s\" failed: %s", sql.data,
			 SPI_result_code_string(SPI_result));
	resetStringInfo(&sql);
	appendStringInfo(&sql, "SELECT 1 FROM ONLY %s WHERE %s %s $1 FOR KEY SHARE",
					 relname, keycol, opname);
	exists_plan = SPI_prepare(sql.data, 1, argtypes);
	if (exists_plan == NULL)
		elog(ERROR, "SPI_prepare of \"%s\" failed: %s", sql.data,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(update_plan);
	SPI_keepplan(exists_plan);

	/* Plans still run by an outer call are left to it (and leaked). */
	if (entry->busy == 0)
	{
		if (entry->update_plan != NULL)
			SPI_freeplan(entry->update_plan);
		if (entry->exists_plan != NULL)
			SPI_freeplan(entry->exists_plan);
	}
	entry->update_plan = update_plan;
	entry->exists_plan = exists_plan;
	entry->plans_valid = true;
}

/*
 * The enum label of an outcome.  The OIDs are kept per backend rather than
 * per call site: a prepared statement starts its executor, and so gets a new
 * call site, at every execution.  They are looked up again when the result
 * type is another (the extension was created again).
 */
static Oid
outcome_label(FunctionCallInfo fcinfo, TransitionOutcome outcome)
{
	static Oid	result_type = InvalidOid;
	static Oid	labels[lengthof(transition_result_labels)];
	Oid			typoid = get_fn_expr_rettype(fcinfo->flinfo);

	if (typoid != result_type || !OidIsValid(typoid))
	{
		int			i;

		if (!OidIsValid(typoid))
			elog(ERROR, "could not determine the result type of idem_transition");
		result_type = InvalidOid;
		for (i = 0; i < (int) lengthof(transition_result_labels); i++)
		{
			labels[i] = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
										ObjectIdGetDatum(typoid),
										CStringGetDatum(transition_result_labels[i]));
			if (!OidIsValid(labels[i]))
				elog(ERROR, "enum label \"%s\" of type %u is missing",
					 transition_result_labels[i], typoid);
		}
		result_type = typoid;
	}
	return labels[outcome];
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
 * Run the UPDATE of a transition with the request made visible to the
 * trigger; returns the number of rows updated.
 */
static pg_noinline uint64
run_request(GuardEntry *entry, Datum *values, TransitionRequest *req)
{
	SPIPlanPtr	plan = entry->update_plan;
	volatile uint64 processed = 0;

	entry->busy++;
	active_request = req;
	PG_TRY();
	{
		int			rc = SPI_execute_snapshot(plan, values, NULL,
											  statement_snapshot(),
											  InvalidSnapshot, false, true, 0);

		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "SPI_execute_plan of the transition failed: %s",
				 SPI_result_code_string(rc));
		processed = SPI_processed;
	}
	PG_FINALLY();
	{
		active_request = req->outer;
		entry->busy--;
	}
	PG_END_TRY();
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
		if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA)
			fires = (t->tgenabled == TRIGGER_FIRES_ON_REPLICA ||
					 t->tgenabled == TRIGGER_FIRES_ALWAYS);
		else
			fires = (t->tgenabled == TRIGGER_FIRES_ON_ORIGIN ||
					 t->tgenabled == TRIGGER_FIRES_ALWAYS);
		if (t->tgoid == entry->tgoid && t->tgqual == NULL && t->tgnattr == 0)
			guard_fires = fires;
		else if (t->tgenabled != TRIGGER_DISABLED)
			return false;
	}
	return guard_fires;
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
			   EState *estate, TupleTableSlot *slot, Datum *values,
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

	if (decide(entry, req, oldtup, desc) != OUTCOME_APPLIED)
		return false;

	/*
	 * SET state = $2, with the version the guard would write (so that the
	 * row is formed once); guard_update checks both again, and passes them:
	 * decide() allowed the move and the version can go up.
	 */
	vals = palloc(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	heap_deform_tuple(oldtup, desc, vals, nulls);
	vals[entry->state_attnum - 1] = values[1];
	nulls[entry->state_attnum - 1] = false;
	if (entry->version_attnum != InvalidAttrNumber)
	{
		int64		v;

		if (nulls[entry->version_attnum - 1])
			return false;
		v = version_value(entry, vals[entry->version_attnum - 1]);
		if (v >= version_max(entry))
			return false;
		vals[entry->version_attnum - 1] = version_datum(entry, v + 1);
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
run_request_direct(Relation rel, GuardEntry *entry, Datum *values,
				   TransitionRequest *req, bool *updated)
{
	EState	   *estate;
	RangeTblEntry *rte;
	ResultRelInfo *rri;
	EPQState	epqstate;
	Relation	index = NULL;
	IndexScanDesc scan;
	ScanKeyData skey;
	TupleTableSlot *slot;
	TupleTableSlot *newslot;
	TM_FailureData tmfd;
	TM_Result	res;
	LockTupleMode lockmode;
	Snapshot	snapshot;
	ItemPointerData tid;
	volatile bool found = false;
	bool		applied_unlocked = false;
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
	rte->selectedCols = bms_make_singleton(entry->key_attnum -
										   FirstLowInvalidHeapAttributeNumber);
	rte->updatedCols = bms_make_singleton(entry->state_attnum -
										  FirstLowInvalidHeapAttributeNumber);
	ExecInitRangeTable(estate, list_make1(rte));
	/* the privileges of the UPDATE it stands for, and the hooks' say */
	ExecCheckRTPerms(estate->es_range_table, true);

	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	estate->es_opened_result_relations = list_make1(rri);
	estate->es_output_cid = GetCurrentCommandId(true);
	estate->es_snapshot = snapshot;
	CheckValidResultRel(rri, CMD_UPDATE);
	ExecOpenIndices(rri, false);
	for (i = 0; i < rri->ri_NumIndices; i++)
		if (RelationGetRelid(rri->ri_IndexRelationDescs[i]) == entry->key_index)
			index = rri->ri_IndexRelationDescs[i];
	if (index == NULL)
		elog(ERROR, "primary key of table \"%s\" was not opened",
			 RelationGetRelationName(rel));
	EvalPlanQualInit(&epqstate, estate, NULL, NIL, -1);
	AfterTriggerBeginQuery();

	slot = table_slot_create(rel, &estate->es_tupleTable);
	ScanKeyEntryInitializeWithInfo(&skey, 0, 1, BTEqualStrategyNumber,
								   InvalidOid, entry->key_collation,
								   &entry->key_eq, values[0]);
	scan = index_beginscan(rel, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		found = true;
		tid = slot->tts_tid;
	}
	index_endscan(scan);

	if (found && guard_alone(rri->ri_TrigDesc, entry) &&
		apply_unlocked(rel, entry, rri, estate, slot, values, req))
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

					found = request_matches(req, tuple, RelationGetDescr(rel));
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
		newslot->tts_values[entry->state_attnum - 1] = values[1];
		newslot->tts_isnull[entry->state_attnum - 1] = false;
		ExecStoreVirtualTuple(newslot);
		tid = slot->tts_tid;

		/* the guard decides on the row the triggers before it left */
		active_request = req;
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
			active_request = req->outer;
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
 * idem_transition(tbl regclass, key text, to_state text,
 *				   expected_version bigint DEFAULT NULL)
 * RETURNS idem_transition_result
 */
PG_FUNCTION_INFO_V1(idem_transition);
Datum
idem_transition(PG_FUNCTION_ARGS)
{
	char		machine[NAMEDATALEN];
	Relation	rel;
	Trigger    *trigger;
	GuardEntry *entry;
	char	   *key_str;
	char	   *to_str;
	Datum		values[2];
	TransitionRequest req;
	SPIPlanPtr	exists_plan;
	int			ret;
	uint64		processed;
	bool		found;
	TransitionOutcome outcome;
	char		tgname[NAMEDATALEN];

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tbl must not be null")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("key must not be null")));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("to_state must not be null")));
	key_str = text_to_cstring(PG_GETARG_TEXT_PP(1));
	to_str = text_to_cstring(PG_GETARG_TEXT_PP(2));
	idem_check_writable("idem_transition");

	/*
	 * Refuse a caller who may not update the table before taking any lock on
	 * it: a lock request alone would let anyone queue on any relation.  The
	 * UPDATE itself checks the exact column privileges later.
	 */
	{
		Oid			relid = PG_GETARG_OID(0);

		if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)) &&
			pg_class_aclcheck(relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK &&
			pg_attribute_aclcheck_all(relid, GetUserId(), ACL_UPDATE,
									  ACLMASK_ANY) != ACLCHECK_OK)
			check_privilege(relid, ACL_UPDATE);
	}
	rel = open_table_arg(fcinfo, RowExclusiveLock);

	/*
	 * Only an ordinary table has rows of its own to update: a partitioned
	 * table has no storage (and no table access method), and a guard can be
	 * put on any table by hand.  Refuse the rest before anything reads it.
	 */
	if (rel->rd_rel->relkind != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", RelationGetRelationName(rel)),
				 errdetail("idem_transition() moves rows of ordinary tables."),
				 rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE ?
				 errhint("Call it on the partition that holds the row.") : 0));
	if (idem_relation_is_distributed(RelationGetRelid(rel)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" is distributed by Citus",
						RelationGetRelationName(rel)),
				 errdetail("idem_transition() updates rows of the table on the node where it runs; the rows of a distributed table are in its shards on other nodes.")));
	trigger = find_guard_trigger(rel, fcinfo->flinfo->fn_oid);
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
	check_outcome_privileges(rel, entry);

	/* The key and the state as the column types read them. */
	values[0] = InputFunctionCall(&entry->key_in, key_str, entry->key_ioparam,
								  entry->key_typmod);
	values[1] = InputFunctionCall(&entry->state_in, to_str,
								  entry->state_ioparam, entry->state_typmod);

	req.relid = RelationGetRelid(rel);
	req.key_attnum = entry->key_attnum;
	req.key = values[0];
	/* its own copy: record_eq keeps a cache in fn_mcxt at every call */
	fmgr_info_copy(&req.key_eq, &entry->key_eq, CurrentMemoryContext);
	req.key_collation = entry->key_collation;
	req.to_state = OutputFunctionCall(&entry->state_out, values[1]);
	req.has_expected = !PG_ARGISNULL(3);
	req.expected = req.has_expected ? PG_GETARG_INT64(3) : 0;
	req.depth = trigger_depth() + 1;
	req.fired = false;
	req.outcome = OUTCOME_NOT_FOUND;
	req.outer = active_request;

	if (direct_path_ok(rel))
	{
		bool		updated;

		ereport(DEBUG1,
				(errmsg_internal("idem_transition updates a row of \"%s\" directly",
								 RelationGetRelationName(rel))));

		found = run_request_direct(rel, entry, values, &req, &updated);
		processed = updated ? 1 : 0;
	}
	else
	{
		ereport(DEBUG1,
				(errmsg_internal("idem_transition updates a row of \"%s\" through SPI",
								 RelationGetRelationName(rel))));
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		guard_prepare_plans(entry, rel);
		exists_plan = entry->exists_plan;
		processed = run_request(entry, values, &req);
		found = (processed > 0 || req.fired);
		if (!found)
		{
			ret = SPI_execute_snapshot(exists_plan, values, NULL,
									   statement_snapshot(), InvalidSnapshot,
									   false, true, 1);
			if (ret != SPI_OK_SELECT)
				elog(ERROR, "SPI_execute_plan of the lookup failed: %s",
					 SPI_result_code_string(ret));
			found = (SPI_processed > 0);
		}
		SPI_finish();
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
	PG_RETURN_OID(outcome_label(fcinfo, outcome));
}
