/*-------------------------------------------------------------------------
 *
 * guard_machine.c
 *	  The state machines and the guarded tables, cached per backend.
 *
 * Owns the machines read from idem.transitions (and the questions asked of
 * them: is a machine defined, is a transition allowed, is a state reachable),
 * the per-backend entry of every guarded table (its columns, types and
 * functions, read from its guard trigger, and what idem_transition keeps
 * with it), the relcache callback that drops both when they change, and the
 * reading and checking of a guard's definition from its trigger.
 *
 * Caches.  Every backend keeps the machines in memory, and for every guarded
 * table the columns and types the trigger needs and the plans of
 * idem_transition.  A change to idem.transitions (from idem_allow,
 * idem_disallow or any INSERT, UPDATE, DELETE or TRUNCATE, through triggers
 * enabled ALWAYS) sends a relcache invalidation of that table; a relcache
 * callback then drops the machines, so that every session sees committed
 * definitions at its next statement, without reconnecting.  The messages are
 * read before the machines are used, not only when a statement opens its
 * tables: a prepared statement run again in an open transaction opens none.
 * The machines are read with the latest snapshot, as catalogs are, so a
 * session in a REPEATABLE READ transaction also sees the new definitions.
 * The per-table entries are dropped by the same callback when their table
 * changes.
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
#include "guard.h"

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
	bool		initial;		/* a row may start in this state */
} StateEntry;

typedef struct MachineEntry
{
	char		name[NAMEDATALEN];	/* hash key */
	bool		has_transitions;
	bool		has_initial;
} MachineEntry;

static MemoryContext machines_cxt = NULL;
static HTAB *states_htab = NULL;	/* NULL when not loaded */
static HTAB *machines_htab = NULL;
static bool machines_valid = false;
static Oid	transitions_relid = InvalidOid;
static Oid	initial_relid = InvalidOid;

static HTAB *guard_htab = NULL;
static Oid	guard_func_oid = InvalidOid;

/* ----------------------------------------------------------------
 * Invalidation
 * ----------------------------------------------------------------
 */
void
idem_guard_relcache(Oid relid)
{
	if (!OidIsValid(relid) || relid == transitions_relid ||
		relid == initial_relid)
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

/*
 * The entries of dropped tables, removed when the table grows past
 * guard_sweep_at entries (twice what a sweep leaves, at least
 * GUARD_SWEEP_MIN): a session that guards temporary tables, or partitions
 * that come and go, would otherwise keep an entry, its functions' memory
 * and its plans for each of them until it ends.
 */
#define GUARD_SWEEP_MIN 64

static long guard_sweep_at = GUARD_SWEEP_MIN;

static void
guard_sweep(Oid keep)
{
	HASH_SEQ_STATUS status;
	GuardEntry *entry;

	if (hash_get_num_entries(guard_htab) < guard_sweep_at)
		return;
	hash_seq_init(&status, guard_htab);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		/*
		 * A table a call is using is open, and cannot be dropped; a call
		 * running its plans marks it busy.  One dropped in this transaction
		 * may come back with a rollback: its entry is then made again.
		 */
		if (entry->relid == keep || entry->valid || entry->busy > 0 ||
			SearchSysCacheExists1(RELOID, ObjectIdGetDatum(entry->relid)))
			continue;
		guard_free_plans(entry);
		/* what it points to may still be in use until the transaction ends */
		if (entry->fn_cxt != NULL)
			MemoryContextSetParent(entry->fn_cxt, TopTransactionContext);
		(void) hash_search(guard_htab, &entry->relid, HASH_REMOVE, NULL);
	}
	guard_sweep_at = Max(GUARD_SWEEP_MIN, 2 * hash_get_num_entries(guard_htab));
}

static void
guard_init(void)
{
	HASHCTL		ctl;

	if (guard_htab != NULL)
		return;
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(GuardEntry);
	guard_htab = hash_create("idem guarded tables", 16, &ctl,
							 HASH_ELEM | HASH_BLOBS);
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

static StateEntry *machine_state(const char *machine, const char *state);

/*
 * Does idem.initial_states exist?  Asked only while it did not when the
 * machines were read: its invalidations could not be told from others'.
 */
static bool
initial_table_exists(void)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA, true);

	return OidIsValid(nsp) && OidIsValid(get_relname_relid(INITIAL_TABLE, nsp));
}

/*
 * The entry of (machine, state) in states, made if missing; allocated in
 * machines_cxt, which must be current.
 */
static StateEntry *
state_entry_enter(HTAB *states, const char *machine, const char *state)
{
	StateKey	key = make_state_key(machine, state);
	StateEntry *entry;
	bool		found;

	entry = hash_search(states, &key, HASH_ENTER, &found);
	if (!found)
	{
		entry->key = key;		/* the copy in machines_cxt */
		entry->ntargets = 0;
		entry->maxtargets = 4;
		entry->targets = palloc(entry->maxtargets * sizeof(char *));
		entry->initial = false;
	}
	else
		pfree((void *) key.data);
	return entry;
}

/*
 * The machine's entry in machines, made if missing, or NULL if its name is
 * too long to be one.
 */
static MachineEntry *
machine_entry_enter(HTAB *machines, const char *machine)
{
	MachineEntry *entry;
	bool		found;

	if (strlen(machine) >= NAMEDATALEN)
		return NULL;
	entry = hash_search(machines, machine, HASH_ENTER, &found);
	if (!found)
	{
		entry->has_transitions = false;
		entry->has_initial = false;
	}
	return entry;
}

/*
 * The initial states, idem.initial_states (since 0.2.0: a database where the
 * extension is older has none), read into states and machines with the
 * snapshot the transitions were read with.
 */
static void
initial_states_load(HTAB *states, HTAB *machines, Snapshot snapshot)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA, true);
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;

	initial_relid = OidIsValid(nsp) ? get_relname_relid(INITIAL_TABLE, nsp) :
		InvalidOid;
	if (!OidIsValid(initial_relid))
		return;
	if (get_rel_relkind(initial_relid) != RELKIND_RELATION)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("\"%s.%s\" of the idem extension is not an ordinary table",
						IDEM_SCHEMA, INITIAL_TABLE),
				 errhint("Recreate the extension's objects with DROP EXTENSION idem and CREATE EXTENSION idem.")));
	rel = table_open(initial_relid, AccessShareLock);
	{
		static const IdemColumn columns[INITIAL_NATTS] = {
			{"machine", TEXTOID, true, C_COLLATION_OID},
			{"state", TEXTOID, true, C_COLLATION_OID}
		};

		idem_check_columns(RelationGetDescr(rel), INITIAL_TABLE, columns,
						   INITIAL_NATTS);
	}
	scan = table_beginscan(rel, snapshot, 0, NULL);
	slot = table_slot_create(rel, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		MemoryContext old;
		char	   *machine;
		char	   *state;
		MachineEntry *m;

		slot_getallattrs(slot);
		if (slot->tts_isnull[0] || slot->tts_isnull[1])
			continue;			/* not possible: the columns are NOT NULL */
		old = MemoryContextSwitchTo(machines_cxt);
		machine = TextDatumGetCString(slot->tts_values[0]);
		state = TextDatumGetCString(slot->tts_values[1]);
		m = machine_entry_enter(machines, machine);
		if (m != NULL)
			m->has_initial = true;
		state_entry_enter(states, machine, state)->initial = true;
		MemoryContextSwitchTo(old);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_endscan(scan);
	table_close(rel, AccessShareLock);
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
	if (machines_valid && states_htab != NULL &&
		(OidIsValid(initial_relid) || !initial_table_exists()))
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
		StateEntry *entry;
		MachineEntry *m;

		slot_getallattrs(slot);
		if (slot->tts_isnull[0] || slot->tts_isnull[1] || slot->tts_isnull[2])
			continue;			/* not possible: the columns are NOT NULL */

		old = MemoryContextSwitchTo(machines_cxt);
		machine = TextDatumGetCString(slot->tts_values[0]);
		from = TextDatumGetCString(slot->tts_values[1]);
		to = TextDatumGetCString(slot->tts_values[2]);
		m = machine_entry_enter(machines, machine);
		if (m != NULL)
			m->has_transitions = true;
		entry = state_entry_enter(states, machine, from);
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
	table_close(rel, AccessShareLock);
	initial_states_load(states, machines, snapshot);
	UnregisterSnapshot(snapshot);

	states_htab = states;
	machines_htab = machines;
}

bool
guard_machine_defined(const char *machine)
{
	MachineEntry *entry;

	if (strlen(machine) >= NAMEDATALEN)
		return false;
	machines_ensure();
	entry = hash_search(machines_htab, machine, HASH_FIND, NULL);
	return entry != NULL && entry->has_transitions;
}

/* Does the machine have initial states? */
bool
guard_machine_has_initial(const char *machine)
{
	MachineEntry *entry;

	if (strlen(machine) >= NAMEDATALEN)
		return false;
	machines_ensure();
	entry = hash_search(machines_htab, machine, HASH_FIND, NULL);
	return entry != NULL && entry->has_initial;
}

/* May a row start in this state?  A NULL state never may. */
bool
guard_state_initial(const char *machine, const char *state)
{
	StateEntry *entry;

	if (state == NULL)
		return false;
	machines_ensure();
	entry = machine_state(machine, state);
	return entry != NULL && entry->initial;
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
bool
guard_transition_allowed(const char *machine, const char *from, const char *to)
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

/*
 * Can target be reached from "from" by one transition or more?  A breadth
 * first search over the states that have transitions, each visited once
 * (a hash set of their entries): a machine may have tens of thousands of
 * states, and the search must stay linear and cancellable.
 */
bool
guard_state_reachable(const char *machine, const char *from, const char *target)
{
	HASHCTL		ctl;
	HTAB	   *seen;
	StateEntry **queue;
	int			head = 0;
	int			tail = 0;
	StateEntry *entry;
	bool		reached = false;

	if (from == NULL || target == NULL)
		return false;
	machines_ensure();
	entry = machine_state(machine, from);
	if (entry == NULL)
		return false;

	ctl.keysize = sizeof(StateEntry *);
	ctl.entrysize = sizeof(StateEntry *);
	ctl.hcxt = CurrentMemoryContext;
	seen = hash_create("idem reachable states", 64, &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	/* every state is queued once at most */
	queue = palloc((hash_get_num_entries(states_htab) + 1) * sizeof(StateEntry *));
	(void) hash_search(seen, &entry, HASH_ENTER, NULL);
	queue[tail++] = entry;
	while (head < tail && !reached)
	{
		int			i;

		CHECK_FOR_INTERRUPTS();
		entry = queue[head++];
		for (i = 0; i < entry->ntargets; i++)
		{
			StateEntry *next;
			bool		found;

			if (strcmp(entry->targets[i], target) == 0)
			{
				reached = true;
				break;
			}
			/* a state without transitions leads nowhere */
			next = machine_state(machine, entry->targets[i]);
			if (next == NULL)
				continue;
			(void) hash_search(seen, &next, HASH_ENTER, &found);
			if (!found)
				queue[tail++] = next;
		}
	}
	pfree(queue);
	hash_destroy(seen);
	return reached;
}
/* ----------------------------------------------------------------
 * Guarded tables
 * ----------------------------------------------------------------
 */

/* The attribute number of a live user column, or InvalidAttrNumber. */
AttrNumber
guard_column_attnum(Relation rel, const char *name)
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

bool
guard_is_version_type(Oid type)
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
Oid
guard_lookup_func(Oid caller_fn)
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
bool
guard_is_trigger(Trigger *trigger, Oid fn)
{
	return trigger->tgfoid == fn;
}


/*
 * The guard trigger of a table, or NULL.  The OID of the trigger function
 * is kept; it is looked up again when no trigger matches, in case the
 * extension was created again.
 */
Trigger *
guard_find_trigger(Relation rel, Oid caller_fn)
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
			guard_func_oid = guard_lookup_func(caller_fn);
		for (i = 0; i < desc->numtriggers; i++)
		{
			Trigger    *trigger = &desc->triggers[i];

			if (!guard_is_trigger(trigger, guard_func_oid))
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

void
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
char *
guard_version_key_problem(Relation rel, AttrNumber attnum)
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

		if (index->rd_index->indisunique || index->rd_index->indisexclusion)
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
							   index->rd_index->indisprimary ? "primary key" :
							   index->rd_index->indisexclusion ?
							   "exclusion constraint" : "unique index",
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
 * columns, the version column of an integer type, NOT NULL and part of no
 * key.  Returns false and fills *problem otherwise.  idem_guard and DDL
 * check the same, and so does every firing: a NOT NULL dropped where event
 * triggers do not fire (session_replication_role = replica) fails the
 * guard instead of leaving it to tolerate NULL versions.
 */
bool
guard_definition(Relation rel, Trigger *trigger, GuardDef *def,
				 GuardProblem *problem)
{
	const char *relname = RelationGetRelationName(rel);
	const char *state_col;
	const char *version_col = NULL;
	Form_pg_attribute att;
	char	   *why;

	if (!GUARD_TRIGGER_TYPE_OK(trigger->tgtype) || trigger->tgnattr != 0 ||
		trigger->tgqual != NULL)
		return guard_problem(problem, ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
							 psprintf("trigger \"%s\" of table \"%s\" must be BEFORE INSERT OR UPDATE FOR EACH ROW",
									  trigger->tgname, relname),
							 psprintf("%s() guards every UPDATE of a row, and every INSERT beside it: it cannot fire for DELETE, TRUNCATE or INSERT alone, after the row, for each statement, for some columns only, or under a WHEN condition.",
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
	/* what idem_guard, idem_allow and idem_disallow refuse */
	if (def->machine[0] == '\0')
		return guard_problem(problem, ERRCODE_INVALID_PARAMETER_VALUE,
							 pstrdup("machine must not be empty"),
							 psprintf("The guard \"%s\" of table \"%s\" names no machine.",
									  trigger->tgname, relname),
							 "Guard the table with idem_guard().");
	if (strlen(def->machine) >= NAMEDATALEN)
		return guard_problem(problem, ERRCODE_STRING_DATA_RIGHT_TRUNCATION,
							 pstrdup("machine is too long"),
							 psprintf("The machine of the guard \"%s\" of table \"%s\" is %zu bytes long; the limit is %d bytes.",
									  trigger->tgname, relname, strlen(def->machine),
									  NAMEDATALEN - 1),
							 "Guard the table with idem_guard().");
	state_col = trigger->tgargs[1];
	if (trigger->tgnargs == 3 && trigger->tgargs[2][0] != '\0')
		version_col = trigger->tgargs[2];

	def->state_attnum = guard_column_attnum(rel, state_col);
	if (def->state_attnum == InvalidAttrNumber)
		return guard_problem(problem, ERRCODE_UNDEFINED_COLUMN,
							 psprintf("column \"%s\" of relation \"%s\" does not exist",
									  state_col, relname),
							 psprintf("The guard \"%s\" of the table names it as the state column.",
									  trigger->tgname),
							 "Guard the table again with idem_guard().");
	att = TupleDescAttr(RelationGetDescr(rel), def->state_attnum - 1);
	if (att->attgenerated)
		return guard_problem(problem, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							 psprintf("state column \"%s\" of table \"%s\" must not be a generated column",
									  state_col, relname),
							 pstrdup(GUARD_GENERATED_DETAIL),
							 "Guard the column the state is computed from, or keep the state in a column of its own.");
	def->version_attnum = InvalidAttrNumber;
	if (version_col == NULL)
		return true;

	def->version_attnum = guard_column_attnum(rel, version_col);
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
	if (!guard_is_version_type(att->atttypid))
		return guard_problem(problem, ERRCODE_DATATYPE_MISMATCH,
							 psprintf("version column \"%s\" of table \"%s\" must be of type smallint, integer or bigint",
									  version_col, relname),
							 psprintf("Column \"%s\" is of type %s.", version_col,
									  format_type_be(att->atttypid)),
							 "Guard the table again with idem_guard().");
	if (att->attgenerated)
		return guard_problem(problem, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							 psprintf("version column \"%s\" of table \"%s\" must not be a generated column",
									  version_col, relname),
							 pstrdup(GUARD_GENERATED_DETAIL),
							 "Give a column of its own as the version column.");
	if (!att->attnotnull)
		return guard_problem(problem, ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							 psprintf("version column \"%s\" must be NOT NULL",
									  version_col),
							 NULL,
							 psprintf("Run ALTER TABLE %s ALTER COLUMN %s SET NOT NULL.",
									  relname, quote_identifier(version_col)));
	why = guard_version_key_problem(rel, def->version_attnum);
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
int
guard_trigger_depth(void)
{
	LOCAL_FCINFO(fcinfo, 0);

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	return DatumGetInt32(pg_trigger_depth(fcinfo));
}

/*
 * The executor's nesting: how many ExecutorRun and ExecutorFinish calls
 * are under way (as pg_stat_statements counts them), and whether the
 * innermost runs the statement that sets the command tag (not a rule's
 * action).  Every statement a function, trigger or rule action runs nests
 * one level deeper than the one that called it, where the trigger depth
 * counts only triggers.
 */
static ExecutorRun_hook_type prev_ExecutorRun = NULL;
static ExecutorFinish_hook_type prev_ExecutorFinish = NULL;
static int	exec_level = 0;
static bool exec_sets_tag = false;

static void
guard_ExecutorRun(QueryDesc *queryDesc, ScanDirection direction,
				  uint64 count, bool execute_once)
{
	int			saved_level = exec_level;
	bool		saved_tag = exec_sets_tag;

	exec_level++;
	exec_sets_tag = queryDesc->plannedstmt->canSetTag;
	PG_TRY();
	{
		if (prev_ExecutorRun)
			prev_ExecutorRun(queryDesc, direction, count, execute_once);
		else
			standard_ExecutorRun(queryDesc, direction, count, execute_once);
	}
	PG_FINALLY();
	{
		exec_level = saved_level;
		exec_sets_tag = saved_tag;
	}
	PG_END_TRY();
}

static void
guard_ExecutorFinish(QueryDesc *queryDesc)
{
	int			saved_level = exec_level;
	bool		saved_tag = exec_sets_tag;

	exec_level++;
	exec_sets_tag = queryDesc->plannedstmt->canSetTag;
	PG_TRY();
	{
		if (prev_ExecutorFinish)
			prev_ExecutorFinish(queryDesc);
		else
			standard_ExecutorFinish(queryDesc);
	}
	PG_FINALLY();
	{
		exec_level = saved_level;
		exec_sets_tag = saved_tag;
	}
	PG_END_TRY();
}

int
guard_executor_level(void)
{
	return exec_level;
}

bool
guard_executor_sets_tag(void)
{
	return exec_sets_tag;
}

void
idem_guard_init(void)
{
	prev_ExecutorRun = ExecutorRun_hook;
	ExecutorRun_hook = guard_ExecutorRun;
	prev_ExecutorFinish = ExecutorFinish_hook;
	ExecutorFinish_hook = guard_ExecutorFinish;
}

/*
 * The cache entry of a guarded table, read from its trigger's arguments:
 * (machine, state column [, version column]).  A trigger that cannot work
 * as a guard is refused here, whoever made it.
 */
GuardEntry *
guard_entry_get(Relation rel, Trigger *trigger)
{
	Oid			relid = RelationGetRelid(rel);
	GuardEntry *entry;
	bool		found;
	GuardDef	def;
	GuardProblem problem;
	Form_pg_attribute att;

	guard_init();
	entry = hash_search(guard_htab, &relid, HASH_FIND, NULL);
	if (entry == NULL)
	{
		guard_sweep(relid);
		entry = hash_search(guard_htab, &relid, HASH_ENTER, &found);
		Assert(!found);
		memset(((char *) entry) + sizeof(Oid), 0,
			   sizeof(GuardEntry) - sizeof(Oid));
		entry->relid = relid;
	}
	if (entry->valid && entry->tgoid == trigger->tgoid)
		return entry;

	/* Rebuild the guard part; the plans are prepared again when used. */
	entry->generation++;
	entry->valid = false;
	entry->key_valid = false;
	entry->plans_valid = false;
	guard_entry_new_fn_cxt(entry);
	if (!guard_definition(rel, trigger, &def, &problem))
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
