/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  What the files of the transactional outbox share: the columns of its
 *	  tables, its limits, its relations, and the routines more than one of
 *	  them calls.  See outbox.c for how the outbox works.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_H
#define IDEM_OUTBOX_H

#include "access/relscan.h"
#include "executor/tuptable.h"
#include "storage/lock.h"
#include "storage/lockdefs.h"
#include "utils/rel.h"
#include "nodes/execnodes.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "idem.h"

#define OUTBOX_TABLE		"outbox"
#define OUTBOX_PKEY			"outbox_pkey"
#define OUTBOX_SEQ			"outbox_seq"
#define OUTBOX_KEYS_TABLE	"outbox_keys"
#define OUTBOX_TOPICS_TABLE "outbox_topics"
#define OUTBOX_TOPICS_PKEY	"outbox_topics_pkey"

/* idem.outbox */
#define OB_NATTS			9
#define OB_ID				0
#define OB_TOPIC			1
#define OB_KEY				2
#define OB_TYPE				3
#define OB_PAYLOAD			4
#define OB_HEADERS			5
#define OB_SEQ				6
#define OB_CREATED_AT		7
#define OB_KEY_HASH			8

/* idem.outbox_keys */
#define OK_NATTS			13
#define OK_TOPIC			0
#define OK_KEY				1
#define OK_DEAD				2
#define OK_ATTEMPTS			3
#define OK_AVAILABLE_AT		4
#define OK_HEAD_ID			5
#define OK_LEASED_BY		6
#define OK_LAST_ERROR		7
#define OK_LEASED_THROUGH	8
#define OK_LEASED_MAX		9
#define OK_ATTEMPTS_KEPT	10
#define OK_DEAD_KEPT		11
#define OK_ERROR_KEPT		12

/* idem.outbox_topics */
#define OT_NATTS			4

/* idem_outbox_message */
#define OM_NATTS			8

/* Limits, in bytes. */
#define OUTBOX_MAX_TOPIC_LEN	255
#define OUTBOX_MAX_KEY_LEN		1024
#define OUTBOX_MAX_TYPE_LEN		255
#define OUTBOX_MAX_RELAY_LEN	255
#define OUTBOX_MAX_ERROR_LEN	2000
#define OUTBOX_MAX_LEASE_BATCH	10000
/* a message's payload and headers as text, together (see outbox_check_size) */
#define OUTBOX_MAX_MESSAGE_TEXT	(256 * 1024 * 1024)
/* binary sizes below which their text cannot reach it (see there) */
#define OUTBOX_SIZE_CHECKED_FROM	(16 * 1024)

/* Without a row in idem.outbox_topics. */
#define OUTBOX_DEFAULT_MAX_ATTEMPTS	10
#define OUTBOX_DEFAULT_BACKOFF_BASE	USECS_PER_SEC
#define OUTBOX_DEFAULT_BACKOFF_MAX	(10 * USECS_PER_MINUTE)

/* The channel relays LISTEN on; the payload is the topic. */
#define OUTBOX_CHANNEL		"idem_outbox"

/* Error message of a lease that ran out, kept in last_error. */
#define OUTBOX_EXPIRED_ERROR "the lease ran out before the message was acknowledged"
/* ... and of one whose lease a nack of a later message of its run ended. */
#define OUTBOX_RUN_NACKED_ERROR "the lease ended with the nack of a later message of its run before the message was acknowledged"

typedef struct OutboxRels
{
	Relation	rel;
	Relation	pkey;
	TupleTableSlot *slot;
	LOCKMODE	lockmode;
	BlockNumber nblocks;		/* rel's size once asked, or
								 * InvalidBlockNumber */
	BlockNumber pkey_nblocks;	/* pkey's, the same */
} OutboxRels;

typedef struct OutboxTopic
{
	text	   *topic;			/* a copy */
	int32		max_attempts;
	int64		backoff_base;	/* microseconds */
	int64		backoff_max;
} OutboxTopic;

/*
 * The topics one call has looked up (see outbox_topic): a list while they
 * are few, then a hash table of them all.
 */
typedef struct OutboxTopicCache
{
	List	   *list;
	HTAB	   *hash;
} OutboxTopicCache;
#define OUTBOX_TOPIC_CACHE_INIT {NIL, NULL}

/*
 * The layout of an id (see outbox_make_id).  It is part of what is stored:
 * another one needs an update script that rewrites the ids of idem.outbox
 * (and the key rows' head_id).
 */
#define OUTBOX_PREFIX_BITS	32
#define OUTBOX_SEQ_BITS		48
#define OUTBOX_RANDOM_BITS	42
#define OUTBOX_SEQ_MAX		((INT64CONST(1) << OUTBOX_SEQ_BITS) - 1)
#define OUTBOX_RANDOM_MASK	((UINT64CONST(1) << OUTBOX_RANDOM_BITS) - 1)

/* The prefix of a key_hash that its messages' ids begin with. */
static inline int64
outbox_hash_prefix(int64 key_hash)
{
	return (int64) (((uint64) key_hash ^ (UINT64CONST(1) << 63)) >>
					(64 - OUTBOX_PREFIX_BITS));
}

/* outbox.c: the relations, arguments, topics, ids and messages */
extern Oid	outbox_relid;
extern Oid	outbox_pkey_oid;
extern Oid	outbox_seq_oid;
extern Oid	outbox_keys_relid;
extern Oid	outbox_topics_relid;
extern Oid	outbox_topics_pkey_oid;
extern bool outbox_checked;
extern bool outbox_keys_checked;
extern bool outbox_direct_index;
extern MemoryContext outbox_index_cxt;
extern IndexInfo *outbox_pkey_info;

extern void outbox_lookup_relids(void);
extern void outbox_open(OutboxRels *r, LOCKMODE lockmode);
extern void outbox_close(OutboxRels *r);
extern IdemStore *outbox_keys_open(void);
extern IdemStore *outbox_keys_open_lock(LOCKMODE lockmode);
extern Jsonb *outbox_arg_json(FunctionCallInfo fcinfo, int argno,
							  const char *what, bool container,
							  bool object_only);
extern void outbox_check_utf8_text(const char *what, text *t);
extern void outbox_check_utf8_json(const char *what, Jsonb *jb);
extern int64 outbox_span(Interval *span, const char *what, bool zero_ok,
						 const char *hint);
extern OutboxTopic *outbox_topic(OutboxTopicCache *cache, text *topic);
extern int64 outbox_backoff(OutboxTopic *t, int32 attempts);
extern int64 outbox_key_hash(text *topic, text *key);
extern void outbox_make_id(pg_uuid_t *uuid, int64 key_hash, int64 seq,
						   uint64 rnd);
extern void outbox_key_range(ScanKey skeys, pg_uuid_t *lo, pg_uuid_t *hi,
							 int64 key_hash);
extern bool outbox_find(OutboxRels *r, pg_uuid_t *id, ItemPointer tid);
extern bool outbox_message_busy(TupleTableSlot *slot);
extern bool outbox_lock_message(OutboxRels *r, ItemPointer tid, bool wait);
extern bool outbox_message_exists(OutboxRels *r, pg_uuid_t *id);
extern int64 outbox_id_seq(const pg_uuid_t *id);
/* the objsubid of the sending lock of a key: "id" */
#define OUTBOX_SENDING_LOCK_ID4	0x6964
extern void outbox_sending_locktag(LOCKTAG *tag, int64 key_hash);

/* Small look-ups, inline: the lease and the ack call them in their loops. */
/* Whether two texts have the same bytes (the "C" collation's equality). */
static inline bool
outbox_text_eq(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * Make a scan of idem.outbox's primary key keep its pin on each leaf page
 * while it reads the page's entries, as a scan that returns index tuples
 * does.  An entry whose message is dead to every transaction is then marked
 * dead in the index when the scan leaves the page, and later scans skip it
 * without a visit to the table.  A scan that drops the pin marks nothing on
 * a page that changed meanwhile, and the leaf pages of the outbox's primary
 * key change all the time: a send inserts into the range of its key, which
 * may be any page, not only the right-most one.  Leases read each key's
 * acknowledged messages (deleted, not yet vacuumed) again and again
 * otherwise.
 */
static inline void
outbox_scan_keep_pin(IndexScanDesc scan)
{
	scan->xs_want_itup = true;
}

static inline bool
uuid_datum_eq(Datum a, pg_uuid_t *b)
{
	return memcmp(DatumGetUUIDP(a)->data, b->data, UUID_LEN) == 0;
}

/*
 * Whether the key is leased in a run (see lease_key): leased_through is
 * kept until a lease passes it, but only a run's lease leaves attempts at
 * 1 with it set and a relay holding it (a nack and a release clear
 * leased_by).
 */
static inline bool
outbox_key_in_run(Datum *values, bool *isnull)
{
	return !isnull[OK_LEASED_THROUGH] && !isnull[OK_LEASED_BY] &&
		DatumGetInt32(values[OK_ATTEMPTS]) == 1;
}

/* The prefix of key_hash an id begins with (any UUID gives one). */
static inline int64
outbox_id_prefix(const pg_uuid_t *uuid)
{
	return (int64) (((uint64) uuid->data[0] << 24) |
					((uint64) uuid->data[1] << 16) |
					((uint64) uuid->data[2] << 8) | uuid->data[3]);
}

/* outbox_send.c: the key rows known to exist */
extern bool outbox_keys_trigger_ok;
extern void outbox_known_keys_forget(void);
extern void outbox_known_keys_forget_probed(void);
extern void outbox_known_keys_abandon(void);
extern void outbox_known_keys_stage(void);
extern void outbox_known_keys_commit(void);

/* outbox_wake.c: waking relays, and the outbox's transaction callbacks */
extern void outbox_wake_init(void);
extern void outbox_register_callbacks(void);
extern void outbox_sent(text *topic);
extern bool outbox_relay_is_idle(void);
extern void outbox_set_relay_idle(bool idle);
extern void outbox_wake_owe(void);

/* outbox_lease.c: a key's head, and where this session's leased messages are */
extern bool outbox_head(OutboxRels *r, Datum topic, Datum key, bool *busy);
extern void outbox_remember_lease(pg_uuid_t *id, ItemPointer msg_tid,
								  ItemPointerData key_tid, int64 key_hash);
extern bool outbox_recall_lease(pg_uuid_t *id, ItemPointer msg_tid,
								ItemPointer key_tid, int64 *key_hash);

#endif							/* IDEM_OUTBOX_H */
