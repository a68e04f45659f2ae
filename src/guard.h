/*-------------------------------------------------------------------------
 *
 * guard.h
 *	  State machines, guarded tables and transitions: what the guard's three
 *	  files share.
 *
 * guard_machine.c  the machines (idem.transitions) and the guarded tables,
 *				  cached per backend, and the invalidation that keeps both
 *				  current; reading a guard's definition from its trigger.
 * guard_trigger.c  the trigger idem_guard_trigger() (the checks of every
 *				  UPDATE) and the administration: idem_guard, idem_unguard
 *				  and the event trigger idem._guard_ddl.
 * guard_transition.c  idem_transition, by its direct and its SPI path.
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
 *	- INSERT (and COPY) is checked only when the machine has initial states
 *	  (idem.initial_states): the new row's state must be one of them, or the
 *	  INSERT fails with 23514.  The version is not touched: a row starts at
 *	  the version it says.  The INSERT that moves a row to another partition
 *	  (an UPDATE of a partitioned table) is not a new row: the guard of the
 *	  partition it leaves checked it as a transition (guard_trigger.c).
 *
 * A partitioned table is guarded by a trigger on it, which PostgreSQL
 * clones to every partition, present and future; the clones fire.
 *
 * The guard sees the row as the BEFORE ROW triggers sorted before
 * "idem_guard" left it; triggers sorted after it run after the check.
 *
 * idem_transition(tbl, key, to_state, expected_version) moves one row,
 * found by the table's primary key (one value, or an array of the values of
 * its columns in order), and says what happened
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
 * does (on a partitioned table, "UPDATE t ...": the row is updated in the
 * partition tuple routing finds for the key, or through SPI on the parent
 * when the state column is part of a partition key).  On most tables it does it itself, without a plan, as logical
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
 *	22004  a NULL tbl, key, to_state, machine, from_state or state_column;
 *		   a NULL value in a key array
 *	22023  an empty machine name; expected_version given for a table
 *		   guarded without a version column; the same column given as
 *		   state and version; a key array whose length is not the number of
 *		   columns of the primary key, or of more than one dimension
 *	22001  a machine or state name longer than 63 bytes
 *	42P01  no table has that OID
 *	42809  idem_guard or idem_transition on something that is not an
 *		   ordinary or partitioned table, or
 *		   idem_guard on a table of the schema idem (also a guard trigger
 *		   made by hand there)
 *	42703  no such column (also when a guarded column was dropped or
 *		   renamed where the event trigger did not fire: every UPDATE then
 *		   fails until the table is guarded again)
 *	42804  a version column that is not smallint, integer or bigint
 *	42704  idem_guard with a machine that has no transition
 *	42710  idem_guard on a table guarded already with another definition;
 *		   a second guard trigger; a trigger named "idem_guard" that is not
 *		   idem's guard; idem_guard on a partitioned table one of whose
 *		   partitions has a guard of its own
 *	42501  no EXECUTE privilege on the administration functions; no
 *		   TRIGGER privilege (idem_guard); not the owner (idem_unguard); no
 *		   UPDATE privilege, or no SELECT privilege on the key, state and
 *		   version columns (idem_transition)
 *	55000  idem_transition on a table that is not guarded, has more than
 *		   one guard, whose guard is disabled or did not fire
 *		   (session_replication_role = replica),
 *		   that has no primary key (or one of several columns, given a
 *		   single value), or whose row was skipped
 *		   by another BEFORE trigger; a version column that is nullable
 *		   (idem_guard, DDL) or part of a key (primary key, unique
 *		   constraint or index, foreign key)
 *	39P01  a trigger executing idem_guard_trigger() that is not BEFORE
 *		   INSERT OR UPDATE (or BEFORE UPDATE) FOR EACH ROW, without a column list or a
 *		   WHEN condition, or with other arguments than (machine, state
 *		   column [, version column]): when it is created, and wherever it
 *		   fires or is used
 *	2BP01  ALTER TABLE or CREATE INDEX that would leave a guard that cannot
 *		   work (the event trigger idem_guard_ddl); idem_unguard on a
 *		   partition guarded through its partitioned table
 *	25006  a read-only transaction
 *	The key and to_state are read by the input functions of the key and
 *	state column types, whose errors (such as 22P02) come through.
 *	idem_transition raises what the UPDATE it stands for would: 40001 when
 *	the row changed since a REPEATABLE READ snapshot, 27000 when a trigger
 *	of the same command already changed it, and the errors of the table's
 *	own constraints and triggers.
 *
 * Caches: see guard_machine.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_GUARD_H
#define IDEM_GUARD_H

#include "postgres.h"

#include "access/htup.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/parsenodes.h"
#include "utils/rel.h"

#include "idem.h"

#define TRANSITIONS_TABLE	"transitions"
#define TRANSITIONS_NATTS	3
#define INITIAL_TABLE		"initial_states"
#define INITIAL_NATTS		2
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

/* ----------------------------------------------------------------
 * Guarded tables, cached per backend
 * ----------------------------------------------------------------
 */
typedef struct GuardEntry
{
	Oid			relid;			/* hash key */
	bool		valid;			/* the guard part below is current */
	uint64		generation;		/* bumped whenever a part below is read again */
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

	/*
	 * idem_transition: the primary key, valid while key_valid: its columns
	 * in its order, with the input function of each and the equality
	 * operator of its operator class.  On a partitioned table the key is
	 * the partitioned table's own (its partitions have it too).
	 */
	bool		key_valid;
	Oid			key_index;		/* the primary key */
	int			key_natts;
	AttrNumber	key_attnums[INDEX_MAX_KEYS];
	Oid			key_types[INDEX_MAX_KEYS];
	int32		key_typmods[INDEX_MAX_KEYS];
	Oid			key_ioparams[INDEX_MAX_KEYS];
	FmgrInfo	key_in[INDEX_MAX_KEYS];
	Oid			key_eqops[INDEX_MAX_KEYS];
	FmgrInfo	key_eq[INDEX_MAX_KEYS];
	Oid			key_collations[INDEX_MAX_KEYS];
	Oid			state_ioparam;
	FmgrInfo	state_in;

	/* the SPI path: valid only while plans != NULL and plans_valid */
	bool		plans_valid;
	int			busy;			/* idem_transition calls running the plans */
	SPIPlanPtr	update_plan;
	SPIPlanPtr	exists_plan;
	SPIPlanPtr	lock_plan;
	/* plans replaced while busy, freed once no call runs them (a List) */
	List	   *retired_plans;
} GuardEntry;

/*
 * A transition asked by idem_transition, decided by the trigger when it
 * fires on the row of that key for the UPDATE that idem_transition runs: not
 * for an UPDATE of the same row that another trigger, a function or a rule's
 * action runs meanwhile.  Those run at a deeper level of the executor, or
 * (a rule's action beside the UPDATE run through SPI) at the same level but
 * not as the statement that sets the command tag.  Calls can nest (a trigger
 * may call idem_transition), hence the chain.
 */
typedef struct TransitionRequest
{
	Oid			relid;			/* the table idem_transition was called on */
	bool		partitioned;	/* relid is a partitioned table */
	int			nkeys;
	AttrNumber	key_attnums[INDEX_MAX_KEYS];	/* in relid */
	const char *key_names[INDEX_MAX_KEYS];	/* to find them in a partition */
	Datum		keys[INDEX_MAX_KEYS];
	FmgrInfo	key_eq[INDEX_MAX_KEYS];
	Oid			key_collations[INDEX_MAX_KEYS];
	const char *to_state;		/* as the state type prints it */
	bool		has_expected;
	int64		expected;
	int			level;			/* executor level of the guard's firing */
	bool		by_spi;			/* the UPDATE is a statement run by SPI */
	bool		fired;
	TransitionOutcome outcome;
	struct TransitionRequest *outer;
} TransitionRequest;

/*
 * The kinds of trigger a guard can be: BEFORE INSERT OR UPDATE FOR EACH ROW,
 * as idem_guard makes it (INSERT checks the initial states), or BEFORE
 * UPDATE FOR EACH ROW, as idem_guard made it before 0.2.0.
 */
#define GUARD_TRIGGER_TYPE_UPDATE	(TRIGGER_TYPE_ROW | TRIGGER_TYPE_BEFORE | TRIGGER_TYPE_UPDATE)
#define GUARD_TRIGGER_TYPE	(GUARD_TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_INSERT)
#define GUARD_TRIGGER_TYPE_OK(t)	((t) == GUARD_TRIGGER_TYPE || (t) == GUARD_TRIGGER_TYPE_UPDATE)

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

/* guard_machine.c: the machines and the guarded tables */
extern bool guard_machine_defined(const char *machine);
extern bool guard_transition_allowed(const char *machine, const char *from,
									 const char *to);
extern bool guard_state_reachable(const char *machine, const char *from,
								  const char *target);
extern bool guard_machine_has_initial(const char *machine);
extern bool guard_state_initial(const char *machine, const char *state);
extern AttrNumber guard_column_attnum(Relation rel, const char *name);
extern bool guard_is_version_type(Oid type);
extern Oid	guard_lookup_func(Oid caller_fn);
extern bool guard_is_trigger(Trigger *trigger, Oid fn);
extern Trigger *guard_find_trigger(Relation rel, Oid caller_fn);
extern void guard_problem_raise(GuardProblem *problem);
extern char *guard_version_key_problem(Relation rel, AttrNumber attnum);
extern bool guard_definition(Relation rel, Trigger *trigger, GuardDef *def,
							 GuardProblem *problem);
extern int	guard_trigger_depth(void);
extern int	guard_executor_level(void);
extern bool guard_executor_sets_tag(void);
extern GuardEntry *guard_entry_get(Relation rel, Trigger *trigger);

/* guard_trigger.c: the checks of every UPDATE, and the administration */
extern TransitionRequest *guard_active_request;
extern int64 guard_version_value(GuardEntry *entry, Datum d);
extern Datum guard_version_datum(GuardEntry *entry, int64 v);
extern int64 guard_version_max(GuardEntry *entry);
extern void guard_refused_before_firing(void);
extern TransitionOutcome guard_decide(GuardEntry *entry, TransitionRequest *req,
									  HeapTuple oldtup, TupleDesc desc);
extern bool guard_request_matches(TransitionRequest *req, Relation rel,
								  HeapTuple oldtup);
extern char *guard_state_text(GuardEntry *entry, HeapTuple tuple,
							  TupleDesc desc, Datum *value, bool *isnull);
extern HeapTuple guard_update(Relation rel, GuardEntry *entry,
							  HeapTuple oldtup, HeapTuple newtup);
extern Relation guard_open_table_arg(FunctionCallInfo fcinfo, LOCKMODE lockmode);
extern void guard_check_privilege(Oid relid, AclMode mode);

/* guard_transition.c: idem_transition */
extern void guard_free_plans(GuardEntry *entry);

/* why a generated column can be neither the state nor the version */
#define GUARD_GENERATED_DETAIL \
	"PostgreSQL computes a stored generated column after the BEFORE triggers of the row, so the guard would judge the old value, or none."

#endif							/* IDEM_GUARD_H */
