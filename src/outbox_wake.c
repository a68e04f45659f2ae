/*-------------------------------------------------------------------------
 *
 * outbox_wake.c
 *	  Waking idle relays with a notification when messages commit.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/xact.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "utils/memutils.h"

#include "idem.h"
#include "outbox.h"


/*
 * ---- Waking relays ----
 *
 * A relay whose lease found nothing holds the idle lock of the database, a
 * user lock in ROW EXCLUSIVE mode, for its session, until a lease gives it
 * messages again.  Relays do not conflict with one another on it.  A
 * transaction that sent messages tries a SHARE lock on it just before it
 * commits, without waiting: when that fails, a relay is idle, and the
 * transaction notifies idem_outbox once per topic.  A relay takes the idle
 * lock before its last look for messages (a pass, whose snapshot is taken
 * after the lock), so a sender that commits after that look sees the lock.  A sender that checked just before the relay took
 * it and commits just after its last look is not seen by either: its
 * messages wait for the relay's next poll.  A prepared transaction does not
 * notify (PostgreSQL refuses NOTIFY there); its messages are found by polls.
 *
 * A NOTIFY wakes every relay listening, and one is enough until a relay
 * looks again.  With idem preloaded, a flag per database in shared memory
 * says whether a notification is still owed: a relay that goes idle, or
 * looks again while idle, raises it before its look, and only the first
 * sender to find it raised (and a relay idle) notifies.  Without it, every
 * sender that commits while a relay is idle notifies, and those commits
 * queue one behind the other on NOTIFY's lock.  A notification reaches the
 * relays only once its sender has committed, so while a sender that
 * notifies is still committing, the senders that find the flag lowered
 * notify too (a commit made visible late, by synchronous replication say,
 * could otherwise come after the look its notification caused).  A sender
 * that found the flag lowered and no notifier committing just before an
 * idle relay raised it again, and commits after that relay's look, is left
 * to the relay's next poll, as above.
 */
#define OUTBOX_IDLE_LOCK_ID1	0x6964656d	/* "idem" */
#define OUTBOX_IDLE_LOCK_ID2	0x6f757462	/* "outb" */
#define OUTBOX_IDLE_LOCK_ID4	3	/* pg_advisory_* use 1 and 2 */

#define OUTBOX_WAKE_SLOTS	64

typedef struct OutboxWakeSlot
{
	pg_atomic_uint32 dbid;		/* InvalidOid: free; never changes once set */
	pg_atomic_uint32 owed;		/* an idle relay waits for a notification */
	pg_atomic_uint32 notifiers; /* senders that notify, still committing */
} OutboxWakeSlot;

static OutboxWakeSlot *outbox_wake_slots = NULL;	/* shared memory */
static bool outbox_wake_claimed = false;	/* this transaction lowered the flag */
static bool outbox_wake_counted = false;	/* and counts among the notifiers */
static OutboxWakeSlot *outbox_wake_slot = NULL; /* this database's */
static bool outbox_wake_slot_sought = false;

static bool outbox_relay_idle = false;	/* this session holds the idle lock */

/*
 * The topics this transaction sent to, in the order of their first sends,
 * each with the subtransaction that made it: a rollback to a savepoint
 * takes back the topics first sent since, so that a message rolled back
 * wakes no relay.
 */
typedef struct OutboxSentTopic
{
	SubTransactionId subid;
	char		name[FLEXIBLE_ARRAY_MEMBER];
} OutboxSentTopic;

static List *outbox_sent_topics = NIL;	/* in TopTransactionContext */

/*
 * The same topics in a hash table, in TopTransactionContext too, once they
 * are more than OUTBOX_SENT_HASH_MIN: a transaction that sends to many topics
 * searched the list at every send (100,000 topics took half a minute more).
 */
#define OUTBOX_SENT_HASH_MIN	16
static HTAB *outbox_sent_hash = NULL;
static bool outbox_xact_callback_registered = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static void outbox_wake_shmem_request(void);
static void outbox_wake_shmem_startup(void);

/*
 * With idem preloaded, the flags that spare senders redundant wake-ups:
 * see outbox_wake_claim.
 */
void
outbox_wake_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_wake_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_wake_shmem_startup;
}

static void
outbox_wake_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(mul_size(OUTBOX_WAKE_SLOTS, sizeof(OutboxWakeSlot)));
}

static void
outbox_wake_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_wake_slots = ShmemInitStruct("idem_outbox_wake",
										mul_size(OUTBOX_WAKE_SLOTS,
												 sizeof(OutboxWakeSlot)),
										&found);
	if (!found)
	{
		for (i = 0; i < OUTBOX_WAKE_SLOTS; i++)
		{
			pg_atomic_init_u32(&outbox_wake_slots[i].dbid, InvalidOid);
			pg_atomic_init_u32(&outbox_wake_slots[i].owed, 0);
			pg_atomic_init_u32(&outbox_wake_slots[i].notifiers, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * This database's flag, or NULL without preloading or once every slot is
 * taken by other databases.  A database takes the first free slot, and a
 * slot is never given back, so every backend of a database finds the same
 * one: the first that holds its OID.
 */
static OutboxWakeSlot *
outbox_wake_get_slot(void)
{
	int			i;

	if (outbox_wake_slot_sought)
		return outbox_wake_slot;
	outbox_wake_slot_sought = true;
	if (outbox_wake_slots == NULL)
		return NULL;
	for (i = 0; i < OUTBOX_WAKE_SLOTS; i++)
	{
		OutboxWakeSlot *slot = &outbox_wake_slots[i];
		uint32		dbid = pg_atomic_read_u32(&slot->dbid);

		if (dbid == InvalidOid &&
			pg_atomic_compare_exchange_u32(&slot->dbid, &dbid, MyDatabaseId))
			dbid = MyDatabaseId;
		if (dbid == MyDatabaseId)
		{
			outbox_wake_slot = slot;
			break;
		}
	}
	return outbox_wake_slot;
}

/* An idle relay is about to look: the next sender must notify. */
void
outbox_wake_owe(void)
{
	OutboxWakeSlot *slot = outbox_wake_get_slot();

	/* a full barrier: raised before the look's snapshot is taken */
	if (slot != NULL)
		(void) pg_atomic_exchange_u32(&slot->owed, 1);
}

/*
 * Whether a sender that found a relay idle must notify: without the flags
 * always; with them, the first since a relay looked, and any while a sender
 * that notifies is still committing.  A sender that notifies counts itself
 * first, so that one that comes meanwhile sees it.
 */
static bool
outbox_wake_claim(void)
{
	OutboxWakeSlot *slot = outbox_wake_get_slot();
	uint32		others;

	if (slot == NULL)
		return true;
	(void) pg_atomic_fetch_add_u32(&slot->notifiers, 1);
	outbox_wake_counted = true;
	outbox_wake_claimed = pg_atomic_read_u32(&slot->owed) != 0 &&
		pg_atomic_exchange_u32(&slot->owed, 0) != 0;
	/* read after the flag: whoever lowered it counted itself before */
	others = pg_atomic_read_u32(&slot->notifiers) - 1;
	if (outbox_wake_claimed || others > 0)
		return true;
	(void) pg_atomic_fetch_sub_u32(&slot->notifiers, 1);
	outbox_wake_counted = false;
	return false;
}

/*
 * The end of a sender's transaction.  One can still fail after its
 * pre-commit callbacks (a serialization failure, a full notification
 * queue): its notification is then never sent, and the next sender must
 * notify in its place.
 */
static void
outbox_wake_done(bool committed)
{
	if (outbox_wake_slot != NULL)
	{
		if (outbox_wake_claimed && !committed)
			(void) pg_atomic_exchange_u32(&outbox_wake_slot->owed, 1);
		if (outbox_wake_counted)
			(void) pg_atomic_fetch_sub_u32(&outbox_wake_slot->notifiers, 1);
	}
	outbox_wake_claimed = false;
	outbox_wake_counted = false;
}

static void
outbox_idle_locktag(LOCKTAG *tag)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, OUTBOX_IDLE_LOCK_ID1,
						 OUTBOX_IDLE_LOCK_ID2, OUTBOX_IDLE_LOCK_ID4);
}

/*
 * Whether this session holds the idle lock.  pg_advisory_unlock_all() and
 * DISCARD ALL release it with the session's advisory locks.
 */
bool
outbox_relay_is_idle(void)
{
	LOCKTAG		tag;

	if (outbox_relay_idle)
	{
		outbox_idle_locktag(&tag);
		outbox_relay_idle = LockHeldByMe(&tag, RowExclusiveLock);
	}
	return outbox_relay_idle;
}

void
outbox_set_relay_idle(bool idle)
{
	LOCKTAG		tag;

	if (idle == outbox_relay_is_idle())
		return;
	outbox_idle_locktag(&tag);
	if (idle)
	{
		/*
		 * Waiting: a sender holds the SHARE lock for the instant of its
		 * test, and a relay that gave up then would not be marked idle at
		 * all.  A sender that tests while the relay waits finds the lock
		 * unavailable and notifies.  With the lock table full, the relay is
		 * not marked idle: it is not notified and finds messages by polling.
		 */
		idle = LockAcquireExtended(&tag, RowExclusiveLock, true, false, false,
								   NULL) != LOCKACQUIRE_NOT_AVAIL;
	}
	else
		LockRelease(&tag, RowExclusiveLock, true);
	outbox_relay_idle = idle;
}

static void
outbox_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;
	LOCKTAG		tag;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			outbox_known_keys_stage();
			if (outbox_sent_topics == NIL)
				break;
			outbox_idle_locktag(&tag);

			/*
			 * Not available: a relay is idle, or the lock table is full, in
			 * which case notifying is the safe answer (the commit must not
			 * fail for the sake of a wake-up).
			 */
			/*
			 * A session's own idle lock does not conflict with its test:
			 * a relay that sends while idle is idle all the same.
			 */
			if (outbox_relay_is_idle() ||
				LockAcquireExtended(&tag, ShareLock, false, true, false,
									NULL) == LOCKACQUIRE_NOT_AVAIL)
			{
				if (outbox_wake_claim())
					foreach(lc, outbox_sent_topics)
						Async_Notify(OUTBOX_CHANNEL,
									 ((OutboxSentTopic *) lfirst(lc))->name);
			}
			else
				LockRelease(&tag, ShareLock, false);
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			break;
		case XACT_EVENT_ABORT:
			outbox_wake_done(false);
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			outbox_known_keys_abandon();
			break;
		case XACT_EVENT_COMMIT:
			outbox_wake_done(true);
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			outbox_known_keys_commit();
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PRE_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			outbox_sent_topics = NIL;
			outbox_sent_hash = NULL;
			outbox_known_keys_abandon();
			break;
		default:
			break;
	}
}

/*
 * A key row this transaction inserted goes if a subtransaction rolls back:
 * what was probed is forgotten with any of them, which is rare.  So do the
 * topics first sent to since it began: the last ones of the list, since
 * subtransaction ids grow and only the innermost one ends (one that
 * commits leaves its id to its topics, which its parent's rollback takes
 * back as well, and its later siblings' never).
 */
static void
outbox_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	int			n;

	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	outbox_known_keys_forget_probed();
	n = list_length(outbox_sent_topics);
	while (n > 0)
	{
		OutboxSentTopic *t = list_nth(outbox_sent_topics, n - 1);

		if (t->subid < mySubid)
			break;
		if (outbox_sent_hash != NULL)
			(void) hash_search(outbox_sent_hash, t->name, HASH_REMOVE, NULL);
		pfree(t);
		n--;
	}
	outbox_sent_topics = list_truncate(outbox_sent_topics, n);
}

void
outbox_register_callbacks(void)
{
	if (!outbox_xact_callback_registered)
	{
		RegisterXactCallback(outbox_xact_callback, NULL);
		RegisterSubXactCallback(outbox_subxact_callback, NULL);
		outbox_xact_callback_registered = true;
	}
}

/* Remember that this transaction sent a message of this topic. */
void
outbox_sent(text *topic)
{
	ListCell   *lc;
	char		name[OUTBOX_MAX_TOPIC_LEN + 1];
	int			len = VARSIZE_ANY_EXHDR(topic);
	OutboxSentTopic *sent;
	MemoryContext oldcxt;

	outbox_register_callbacks();
	Assert(len <= OUTBOX_MAX_TOPIC_LEN);
	memcpy(name, VARDATA_ANY(topic), len);
	name[len] = '\0';
	if (outbox_sent_hash != NULL)
	{
		if (hash_search(outbox_sent_hash, name, HASH_FIND, NULL) != NULL)
			return;
	}
	else
	{
		foreach(lc, outbox_sent_topics)
		{
			if (strcmp(((OutboxSentTopic *) lfirst(lc))->name, name) == 0)
				return;
		}
	}
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	sent = palloc(offsetof(OutboxSentTopic, name) + len + 1);
	sent->subid = GetCurrentSubTransactionId();
	memcpy(sent->name, name, len + 1);
	outbox_sent_topics = lappend(outbox_sent_topics, sent);
	if (outbox_sent_hash != NULL)
		(void) hash_search(outbox_sent_hash, name, HASH_ENTER, NULL);
	else if (list_length(outbox_sent_topics) > OUTBOX_SENT_HASH_MIN)
	{
		HASHCTL		ctl;
		HTAB	   *hash;

		ctl.keysize = OUTBOX_MAX_TOPIC_LEN + 1;
		ctl.entrysize = OUTBOX_MAX_TOPIC_LEN + 1;
		ctl.hcxt = TopTransactionContext;
		hash = hash_create("idem outbox topics sent", 256, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		foreach(lc, outbox_sent_topics)
			(void) hash_search(hash, ((OutboxSentTopic *) lfirst(lc))->name,
							   HASH_ENTER, NULL);
		outbox_sent_hash = hash;
	}
	MemoryContextSwitchTo(oldcxt);
}

