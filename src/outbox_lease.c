/*-------------------------------------------------------------------------
 *
 * outbox_lease.c
 *	  idem_outbox_lease: the heads of keys that may be leased now, found
 *	  through the messages or the key rows, and their runs.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/nbtree.h"
#include "access/xlog.h"
#include "access/table.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "storage/predicate.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "pgstat.h"

#include "idem.h"
#include "outbox.h"

/*
 * ---- A key's head, from the leaves of the primary key ----
 *
 * A key's head is the first entry of its range of ids in the primary key
 * whose message the snapshot sees.  An index scan bounded by that range
 * reads every entry of the range on a leaf (two calls of the operator
 * class's functions each) before it returns the first: a key with many
 * messages waiting would pay for all of them at every probe of its head.
 * So the probe descends to the leaf as that scan would (_bt_search), and
 * takes the entries at or after the range's start a few at a time, while
 * they are in the range (ids compare as their bytes do in uuid_ops, the
 * operator family outbox_check_pkey_order requires), skipping those marked
 * dead, as the scan does; it fetches their messages in that order, and
 * steps to the next leaf as the scan does, unless the leaf's high key is
 * past the range.  Entries it takes again from a leaf come after the last
 * one it took, in the index's order (the id, then the heap TID: a row
 * updated by hand off its HOT chain has two entries with its id); those
 * that came since are of transactions the snapshot cannot see, as for the
 * scan, which reads a leaf once.  The entries of messages no transaction
 * can see any more are marked dead, as the scan marks them
 * (_bt_killitems), under the pin kept on the leaf since it was read, which
 * keeps VACUUM from removing them, and so from recycling their heap TIDs,
 * meanwhile.  A posting list (the primary key has none unless its rows are
 * updated by hand), an index without heap TIDs in its order (made before
 * PostgreSQL 12) and a standby leave the answer to the index scan.
 */
/* entries taken from a leaf at a time */
#define OUTBOX_LEAF_CHUNK	8

typedef enum OutboxLeafProbe
{
	LEAF_FOUND,					/* the head, in r->slot */
	LEAF_NONE,					/* the key has none */
	LEAF_UNSURE					/* the index scan must tell */
} OutboxLeafProbe;

/*
 * The id of a leaf entry of the primary key, NULL if it has none: its one
 * column, a uuid, aligned on a byte, right after the header.
 */
static inline const uint8 *
outbox_leaf_id(IndexTuple itup)
{
	if (IndexTupleHasNulls(itup))
		return NULL;
	return (const uint8 *) itup + IndexInfoFindDataOffset(itup->t_info);
}

/*
 * Mark dead the entries at offs with the heap TIDs tids (dead[i]) on the
 * leaf in buf, pinned since it was read: an entry may have moved right on
 * it since (an insertion), or gone (a split, the removal of dead entries).
 */
static void
outbox_leaf_kill(Relation pkey, Buffer buf, OffsetNumber *offs,
				 ItemPointerData *tids, bool *dead, int n)
{
	Page		page;
	OffsetNumber maxoff;
	bool		killed = false;
	int			i;

	_bt_lockbuf(pkey, buf, BT_READ);
	page = BufferGetPage(buf);
	maxoff = PageGetMaxOffsetNumber(page);
	for (i = 0; i < n; i++)
	{
		OffsetNumber off;

		if (!dead[i])
			continue;
		for (off = offs[i]; off <= maxoff; off++)
		{
			ItemId		iid = PageGetItemId(page, off);
			IndexTuple	itup = (IndexTuple) PageGetItem(page, iid);

			if (!BTreeTupleIsPosting(itup) &&
				ItemPointerEquals(&itup->t_tid, &tids[i]))
			{
				if (!ItemIdIsDead(iid))
				{
					ItemIdMarkDead(iid);
					killed = true;
				}
				break;
			}
		}
	}
	if (killed)
	{
		BTPageGetOpaque(page)->btpo_flags |= BTP_HAS_GARBAGE;
		MarkBufferDirtyHint(buf, true);
	}
	_bt_unlockbuf(pkey, buf);
}

/*
 * Where a probe found the start of a range: the leaf the descent reached,
 * its LSN then, and the offset of the range's first entry not marked dead.
 *
 * The descent from the root, and the search of the leaf, are a third of a
 * probe with many keys: their pages are seldom in the CPU's caches.  So a
 * backend remembers where its last probe of each range started, and the
 * next probe starts there, without a descent or a search, when that leaf's
 * LSN has not moved since: every change of a leaf's entries (an insertion,
 * a split, the removal of entries, the page's deletion and its use again)
 * is logged and moves its LSN, and marking entries dead moves none, nor
 * clears a mark.  So the leaf is the one the descent would reach, as it
 * was, but for entries marked dead since.  (A leaf's content alone does not
 * say that it is linked in the tree: a split that failed leaves its new
 * page looking live.)  An index that is not logged has no LSN to tell.  A
 * hint is for one file of the index (REINDEX, VACUUM FULL and most of
 * TRUNCATE make another; a TRUNCATE in the transaction that made the file
 * empties it in place, so a block past its end is not read).
 */
typedef struct OutboxLeafHint
{
	pg_uuid_t	lo;				/* the range's start: the hash key */
	RelFileNode node;			/* the index's file */
	BlockNumber blkno;
	XLogRecPtr	lsn;
	OffsetNumber off;
} OutboxLeafHint;

/* the most ranges remembered: about 4 MB */
#define OUTBOX_LEAF_HINTS_MAX	65536

static HTAB *outbox_leaf_hints = NULL;

/*
 * A table this session keeps, in TopMemoryContext, for an entry about to be
 * entered: made if there is none, and made anew, empty, once it holds max
 * entries (what it holds is hints, found again when lost).
 */
static HTAB *
outbox_session_table(HTAB **table, const char *name, Size keysize,
					 Size entrysize, long max)
{
	if (*table != NULL && hash_get_num_entries(*table) >= max)
	{
		hash_destroy(*table);
		*table = NULL;
	}
	if (*table == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = keysize;
		ctl.entrysize = entrysize;
		ctl.hcxt = TopMemoryContext;
		*table = hash_create(name, 1024, &ctl,
							 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	return *table;
}

static OutboxLeafHint *
outbox_leaf_hint(pg_uuid_t *lo, bool enter)
{
	OutboxLeafHint *hint;
	bool		found;

	if (outbox_leaf_hints != NULL)
	{
		hint = hash_search(outbox_leaf_hints, lo, HASH_FIND, NULL);
		if (hint != NULL || !enter)
			return hint;
	}
	if (!enter)
		return NULL;
	hint = hash_search(outbox_session_table(&outbox_leaf_hints,
											"idem outbox leaf hints",
											sizeof(pg_uuid_t),
											sizeof(OutboxLeafHint),
											OUTBOX_LEAF_HINTS_MAX),
					   lo, HASH_ENTER, &found);
	if (!found)
		hint->blkno = InvalidBlockNumber;
	return hint;
}

/*
 * The leaf of the hint for lo, read-locked, if it has not changed since
 * (see OutboxLeafHint); InvalidBuffer if not.  *off: where to start.
 */
static Buffer
outbox_leaf_hinted(OutboxRels *r, Snapshot snap, pg_uuid_t *lo,
				   OffsetNumber *off)
{
	OutboxLeafHint *hint = outbox_leaf_hint(lo, false);
	Buffer		buf;
	Page		page;
	BTPageOpaque opaque;

	if (hint == NULL || hint->blkno == InvalidBlockNumber ||
		!RelFileNodeEquals(hint->node, r->pkey->rd_node) ||
		!RelationNeedsWAL(r->pkey))
		return InvalidBuffer;
	/* asked once per call: the lock held keeps the file from shrinking */
	if (r->pkey_nblocks == InvalidBlockNumber)
		r->pkey_nblocks = RelationGetNumberOfBlocks(r->pkey);
	if (hint->blkno >= r->pkey_nblocks)
		return InvalidBuffer;
	buf = ReadBuffer(r->pkey, hint->blkno);
	_bt_lockbuf(r->pkey, buf, BT_READ);
	page = BufferGetPage(buf);
	if (BufferGetLSNAtomic(buf) != hint->lsn || PageIsNew(page) ||
		PageGetSpecialSize(page) != MAXALIGN(sizeof(BTPageOpaqueData)))
	{
		_bt_relbuf(r->pkey, buf);
		return InvalidBuffer;
	}
	opaque = BTPageGetOpaque(page);
	if (!P_ISLEAF(opaque) || P_IGNORE(opaque) ||
		hint->off < P_FIRSTDATAKEY(opaque) ||
		hint->off > PageGetMaxOffsetNumber(page) + 1)
	{
		_bt_relbuf(r->pkey, buf);
		return InvalidBuffer;
	}
	TestForOldSnapshot(snap, r->pkey, page);
	*off = hint->off;
	return buf;
}

static OutboxLeafProbe
outbox_head_leaf(OutboxRels *r, Snapshot snap, pg_uuid_t *lo, pg_uuid_t *hi,
				 text *t, text *k)
{
	BTScanInsert key;
	BTStack		stack;
	Buffer		buf;
	Form_pg_attribute att = TupleDescAttr(RelationGetDescr(r->pkey), 0);
	uint8		after[UUID_LEN];	/* the last entry taken: its id */
	ItemPointerData after_tid;	/* and its heap TID */
	bool		have_after = false;
	OffsetNumber offs[OUTBOX_LEAF_CHUNK];
	ItemPointerData tids[OUTBOX_LEAF_CHUNK];
	bool		dead[OUTBOX_LEAF_CHUNK];
	IndexFetchTableData *fetch;
	OutboxLeafProbe result = LEAF_UNSURE;
	OutboxLeafHint *hint;
	bool		first = true;	/* the leaf that holds the range's start */
	OffsetNumber start = InvalidOffsetNumber;	/* from the hint */
	BlockNumber start_blkno = InvalidBlockNumber;	/* to remember */
	XLogRecPtr	start_lsn = InvalidXLogRecPtr;
	OffsetNumber start_off = InvalidOffsetNumber;

	/* a standby's scans neither mark entries dead nor skip those marked */
	if (att->atttypid != UUIDOID || att->attalign != TYPALIGN_CHAR ||
		RecoveryInProgress())
		return LEAF_UNSURE;

	buf = outbox_leaf_hinted(r, snap, lo, &start);
	if (!BufferIsValid(buf))
	{
		key = _bt_mkscankey(r->pkey, NULL);
		_bt_metaversion(r->pkey, &key->heapkeyspace, &key->allequalimage);
		/* entries of one id come in the order of their heap TIDs only then */
		if (!key->heapkeyspace)
		{
			pfree(key);
			return LEAF_UNSURE;
		}
		key->anynullkeys = false;
		key->keysz = 1;
		key->scankeys[0].sk_flags &= ~SK_ISNULL;
		key->scankeys[0].sk_argument = UUIDPGetDatum(lo);
		stack = _bt_search(r->pkey, key, &buf, BT_READ, snap);
		_bt_freestack(stack);
		pfree(key);
		/* an index without a root has no entry */
		if (!BufferIsValid(buf))
		{
			pgstat_count_index_scan(r->pkey);
			PredicateLockRelation(r->pkey, snap);
			return LEAF_NONE;
		}
	}

	fetch = table_index_fetch_begin(r->rel);
	for (;;)
	{
		Page		page = BufferGetPage(buf);
		BTPageOpaque opaque = BTPageGetOpaque(page);
		OffsetNumber maxoff = PageGetMaxOffsetNumber(page);
		OffsetNumber off = P_FIRSTDATAKEY(opaque);
		OffsetNumber high = maxoff + 1;
		BlockNumber next = opaque->btpo_next;
		bool		rightmost = P_RIGHTMOST(opaque);
		bool		complete = false;
		bool		posting = false;
		bool		found = false;
		int			n = 0;
		int			ndead = 0;
		int			i;

		if (P_IGNORE(opaque))
			off = high;
		else
			PredicateLockPage(r->pkey, BufferGetBlockNumber(buf), snap);
		/*
		 * The first entry at or after lo, or after the last one taken: in
		 * the order of ids, then of heap TIDs (a row updated by hand off its
		 * HOT chain has two entries with its id).  Where the hint says, on the
		 * leaf it names, unchanged since.
		 */
		if (first && start != InvalidOffsetNumber && !P_IGNORE(opaque))
			off = high = start;
		while (off < high)
		{
			OffsetNumber mid = off + (high - off) / 2;
			IndexTuple	itup = (IndexTuple) PageGetItem(page,
														PageGetItemId(page, mid));
			const uint8 *id = outbox_leaf_id(itup);
			int			c;

			if (id == NULL)
				c = 1;
			else if (!have_after)
				c = memcmp(id, lo->data, UUID_LEN);
			else
			{
				c = memcmp(id, after, UUID_LEN);
				if (c == 0)
					c = BTreeTupleIsPosting(itup) ? 1 :
						ItemPointerCompare(&itup->t_tid, &after_tid);
				c = c <= 0 ? -1 : 1;
			}
			if (c < 0)
				off = mid + 1;
			else
				high = mid;
		}
		for (; off <= maxoff && n < OUTBOX_LEAF_CHUNK; off++)
		{
			ItemId		iid = PageGetItemId(page, off);
			IndexTuple	itup;
			const uint8 *id;

			if (ItemIdIsDead(iid))
				continue;
			if (first && start_off == InvalidOffsetNumber)
				start_off = off;
			itup = (IndexTuple) PageGetItem(page, iid);
			id = outbox_leaf_id(itup);
			if (BTreeTupleIsPosting(itup) || id == NULL)
			{
				posting = true;
				break;
			}
			if (memcmp(id, hi->data, UUID_LEN) > 0)
			{
				complete = true;
				break;
			}
			memcpy(after, id, UUID_LEN);
			after_tid = itup->t_tid;
			have_after = true;
			offs[n] = off;
			tids[n] = itup->t_tid;
			dead[n] = false;
			n++;
		}
		/*
		 * This leaf has no entry of the range after those taken, nor has
		 * any leaf to its right when its high key is past the range.
		 */
		if (off > maxoff && !complete && !posting && !P_IGNORE(opaque))
		{
			if (rightmost)
				complete = true;
			else
			{
				IndexTuple	hikey = (IndexTuple) PageGetItem(page,
															 PageGetItemId(page, P_HIKEY));
				const uint8 *id = outbox_leaf_id(hikey);

				if (BTreeTupleGetNAtts(hikey, r->pkey) >= 1 && id != NULL &&
					memcmp(id, hi->data, UUID_LEN) > 0)
					complete = true;
			}
		}
		if (first && !P_IGNORE(opaque))
		{
			start_blkno = BufferGetBlockNumber(buf);
			start_lsn = BufferGetLSNAtomic(buf);
			if (start_off == InvalidOffsetNumber)
				start_off = off;
		}
		first = false;
		_bt_unlockbuf(r->pkey, buf);

		for (i = 0; i < n && !found; i++)
		{
			bool		call_again = false;
			bool		all_dead = false;

			CHECK_FOR_INTERRUPTS();
			pgstat_count_index_tuples(r->pkey, 1);
			if (table_index_fetch_tuple(fetch, &tids[i], snap, r->slot,
										&call_again, &all_dead))
			{
				pgstat_count_heap_fetch(r->pkey);
				slot_getallattrs(r->slot);
				/* another (topic, key) with the same hash: not ours */
				found = outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_TOPIC]), t) &&
					outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_KEY]), k);
			}
			else if (all_dead)
			{
				dead[i] = true;
				ndead++;
			}
		}
		if (ndead > 0)
			outbox_leaf_kill(r->pkey, buf, offs, tids, dead, i);
		if (found)
			result = LEAF_FOUND;
		else if (complete)
			result = LEAF_NONE;
		if (found || complete || posting)
			break;
		if (off <= maxoff)
		{
			/* more of this leaf: read it again, after the last one taken */
			_bt_lockbuf(r->pkey, buf, BT_READ);
			continue;
		}
		/* the next leaf, as the scan steps to it */
		ReleaseBuffer(buf);
		CHECK_FOR_INTERRUPTS();
		buf = _bt_getbuf(r->pkey, next, BT_READ);
		TestForOldSnapshot(snap, r->pkey, BufferGetPage(buf));
	}
	ReleaseBuffer(buf);
	table_index_fetch_end(fetch);
	if (start_blkno != InvalidBlockNumber && RelationNeedsWAL(r->pkey))
	{
		hint = outbox_leaf_hint(lo, true);
		hint->node = r->pkey->rd_node;
		hint->blkno = start_blkno;
		hint->lsn = start_lsn;
		hint->off = start_off;
	}
	/* one scan of the index, as the index scan that answers otherwise counts */
	if (result != LEAF_UNSURE)
		pgstat_count_index_scan(r->pkey);
	if (result != LEAF_FOUND)
		ExecClearTuple(r->slot);
	return result;
}

/*
 * The head of a key, its oldest message not yet acknowledged, as it stands
 * now.  Leaves its columns in r->slot.  *busy: a transaction is deleting it
 * (an ack that has not committed), or has deleted it since this look's
 * snapshot: it is not to be leased now.
 */
bool
outbox_head(OutboxRels *r, Datum topic, Datum key, bool *busy)
{
	ScanKeyData skeys[2];
	pg_uuid_t	lo;
	pg_uuid_t	hi;
	IndexScanDesc scan;
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	text	   *t = DatumGetTextPP(topic);
	text	   *k = DatumGetTextPP(key);
	bool		found = false;

	outbox_key_range(skeys, &lo, &hi, outbox_key_hash(t, k));
	switch (outbox_head_leaf(r, snap, &lo, &hi, t, k))
	{
		case LEAF_FOUND:
			*busy = outbox_message_busy(r->slot);
			UnregisterSnapshot(snap);
			return true;
		case LEAF_NONE:
			UnregisterSnapshot(snap);
			return false;
		case LEAF_UNSURE:
			break;
	}
	scan = index_beginscan(r->rel, r->pkey, snap, 2, 0);
	outbox_scan_keep_pin(scan);
	index_rescan(scan, skeys, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, r->slot))
	{
		text	   *mt;
		text	   *mk;

		slot_getallattrs(r->slot);
		mt = DatumGetTextPP(r->slot->tts_values[OB_TOPIC]);
		mk = DatumGetTextPP(r->slot->tts_values[OB_KEY]);
		/* another (topic, key) with the same hash: not ours */
		if (outbox_text_eq(mt, t) && outbox_text_eq(mk, k))
		{
			found = true;
			*busy = outbox_message_busy(r->slot);
			break;
		}
	}
	index_endscan(scan);
	UnregisterSnapshot(snap);
	return found;
}

/*
 * ---- Where leased messages are ----
 *
 * A relay acknowledges the messages it leased, usually in the same session:
 * the lease remembers, per message id, where the message was and where it
 * left the key row's new version, and the ack looks there before it probes
 * the indexes.  What it finds there is checked (the message's id; the key
 * row's key, and that the version is still the latest), so a stale entry
 * (another relay's lease since, a rollback, DROP EXTENSION) only costs the
 * probes.  Entries are removed by the ack; the whole table is dropped when
 * it grows past OUTBOX_LEASED_MAX (leases never acknowledged here).
 */
#define OUTBOX_LEASED_MAX	65536

typedef struct OutboxLeased
{
	pg_uuid_t	id;				/* hash key */
	ItemPointerData msg_tid;
	ItemPointerData key_tid;
	int64		key_hash;		/* the message's: it never changes */
} OutboxLeased;

static HTAB *outbox_leased = NULL;

void
outbox_remember_lease(pg_uuid_t *id, ItemPointer msg_tid,
					  ItemPointerData key_tid, int64 key_hash)
{
	OutboxLeased *e;

	e = hash_search(outbox_session_table(&outbox_leased, "idem outbox leases",
										 sizeof(pg_uuid_t),
										 sizeof(OutboxLeased),
										 OUTBOX_LEASED_MAX),
					id, HASH_ENTER, NULL);
	e->msg_tid = *msg_tid;
	e->key_tid = key_tid;
	e->key_hash = key_hash;
}

/* Where a message leased by this session was, forgotten once asked. */
bool
outbox_recall_lease(pg_uuid_t *id, ItemPointer msg_tid, ItemPointer key_tid,
					int64 *key_hash)
{
	OutboxLeased *e;

	if (outbox_leased == NULL)
		return false;
	e = hash_search(outbox_leased, id, HASH_FIND, NULL);
	if (e == NULL)
		return false;
	*msg_tid = e->msg_tid;
	*key_tid = e->key_tid;
	*key_hash = e->key_hash;
	(void) hash_search(outbox_leased, id, HASH_REMOVE, NULL);
	return true;
}

/*
 * ---- Lease ----
 */

/*
 * A key row that may be leased now, as a pass's scan saw it: where it was
 * and when it became available.  Candidates are tried in the order of
 * (available_at, tid): the keys that have waited longest first.
 */
typedef struct LeaseCandidate
{
	TimestampTz available_at;
	ItemPointerData tid;		/* where the scan saw the key's row */
} LeaseCandidate;

/*
 * What a call of lease_key is for: a lease, or a look at whether the key's
 * head is dead though no lease has marked it so yet (its last lease ran
 * out, its topic's maximum attempts were lowered, a nack of its run made it
 * dead): only said (LEASE_JUDGE), or marked (LEASE_MARK).
 */
typedef enum LeaseMode
{
	LEASE_TAKE,
	LEASE_JUDGE,
	LEASE_MARK
} LeaseMode;

typedef struct LeaseArg
{
	LeaseMode	mode;
	OutboxRels *rels;
	OutboxTopic *topic;
	text	   *relay;
	TimestampTz now;
	int64		lease;
	int			per_key;		/* the most messages of one key */
	int			budget;			/* the most messages of this key, now */
	int64		max_bytes;		/* take no message once bytes reach it (0: none) */
	int64		bytes;			/* of the messages leased by this call */
	int64		key_bytes;		/* of this key's head and run, if leased */
	MemoryContext runcxt;		/* the copies of one key's run, reset */
	/* the answer */
	int			misses;			/* keys whose head was sought, and none found */
	bool		leased;			/* values hold a leased message */
	bool		died;			/* the head used up its attempts */
	bool		died_before;	/* a nack counted its death */
	Datum		values[OM_NATTS];
	bool		isnull[OM_NATTS];
	pg_uuid_t	head_id;
	ItemPointerData head_tid;	/* where the leased head is */
	int64		head_key_hash;
	/* the head's columns when the slot is needed for its run */
	Datum		head_values[OB_NATTS];
	bool		head_isnull[OB_NATTS];
	/* the messages after the head leased with it, and where they are */
	int			nrun;
	HeapTuple  *run;			/* per_key - 1 of them */
	ItemPointerData *run_tids;
} LeaseArg;

/*
 * What a message weighs against max_bytes: its payload and headers as
 * stored, uncompressed (an external value by its raw size, not read).
 */
static int64
lease_message_bytes(Datum payload, bool payload_null, Datum headers,
					bool headers_null)
{
	int64		n = 0;

	if (!payload_null)
		n += toast_raw_datum_size(payload);
	if (!headers_null)
		n += toast_raw_datum_size(headers);
	return n;
}

/* whether the messages leased by this call weigh max_bytes already */
static inline bool
lease_bytes_full(const LeaseArg *arg)
{
	return arg->max_bytes > 0 && arg->bytes >= arg->max_bytes;
}

static int
lease_candidate_cmp(const void *a, const void *b)
{
	const LeaseCandidate *ca = a;
	const LeaseCandidate *cb = b;

	if (ca->available_at != cb->available_at)
		return ca->available_at < cb->available_at ? -1 : 1;
	return ItemPointerCompare((ItemPointer) &ca->tid, (ItemPointer) &cb->tid);
}

/*
 * The best candidates of a scan, kept in a max-heap of at most "size"
 * entries: the worst kept is at the root, and a better one replaces it.
 */
typedef struct LeaseHeap
{
	LeaseCandidate *c;
	int			n;
	int			size;
} LeaseHeap;

static void
lease_heap_add(LeaseHeap *h, TimestampTz available_at, ItemPointer tid)
{
	LeaseCandidate cand;
	int			i;

	cand.available_at = available_at;
	cand.tid = *tid;
	if (h->n < h->size)
	{
		/* sift up */
		i = h->n++;
		while (i > 0 && lease_candidate_cmp(&h->c[(i - 1) / 2], &cand) < 0)
		{
			h->c[i] = h->c[(i - 1) / 2];
			i = (i - 1) / 2;
		}
		h->c[i] = cand;
		return;
	}
	if (lease_candidate_cmp(&cand, &h->c[0]) >= 0)
		return;
	/* replace the root, sift down */
	i = 0;
	for (;;)
	{
		int			child = 2 * i + 1;

		if (child >= h->n)
			break;
		if (child + 1 < h->n &&
			lease_candidate_cmp(&h->c[child + 1], &h->c[child]) > 0)
			child++;
		if (lease_candidate_cmp(&h->c[child], &cand) <= 0)
			break;
		h->c[i] = h->c[child];
		i = child;
	}
	h->c[i] = cand;
}

/* candidates a lease picks out before it sorts the rest */
#define LEASE_HEAP_PICKS	2

/*
 * Put the best candidate of h->c[i..] at i, the ones before it taken: the
 * first few are picked out, the rest sorted once.  A batch that runs fill
 * (per_key) takes one key or a few, and then sorts nothing.
 */
static void
lease_heap_next(LeaseHeap *h, int i)
{
	int			best = i;
	int			j;

	if (i > LEASE_HEAP_PICKS)
		return;
	if (i == LEASE_HEAP_PICKS)
	{
		qsort(h->c + i, h->n - i, sizeof(LeaseCandidate), lease_candidate_cmp);
		return;
	}
	for (j = i + 1; j < h->n; j++)
		if (lease_candidate_cmp(&h->c[j], &h->c[best]) < 0)
			best = j;
	if (best != i)
	{
		LeaseCandidate tmp = h->c[i];

		h->c[i] = h->c[best];
		h->c[best] = tmp;
	}
}

/*
 * The messages of the key (topic, key) after its head (whose seq is head),
 * up to limit, in the order of seq: copies in arg->run (in arg->runcxt),
 * where they are in arg->run_tids.
 *
 * The messages up to leased_through must all be leased by the run: a
 * message committed later with a smaller seq than the run's last (two
 * senders of the key committing out of their order of sending) would be
 * taken for one the run leased.  So, read with a dirty snapshot, there is
 * no run when the key has a message before its head (committed since the
 * head was read, or whose sender is still committing), and the run ends
 * before a message whose sender is still committing (or that a
 * transaction is deleting).
 *
 * Nor may a run take in a message an earlier lease handed out (seq up to
 * leased_max, -1 for none): one after a head whose sender committed late.
 * The late ack of that message, by the relay whose lease of it ran out,
 * would count for the run, and as its last end it while its head is held.
 *
 * A sender's message is in the primary key only after its seq is drawn: one
 * whose entry is not there yet, with a smaller seq than a message the run
 * would take, would not be seen at all.  Senders hold the key's sending lock
 * through that window (see idem_outbox_send), so there is no run while one
 * holds it, and one that takes it after this lease released it draws a seq
 * after every message read here.  (Rows written by hand or applied by
 * logical replication take no such lock.)  A lock table too full to take
 * it also means no run.
 */
static void
lease_run(LeaseArg *arg, text *topic, text *key, int64 head, int64 leased_max,
		  int limit)
{
	OutboxRels *r = arg->rels;
	ScanKeyData skeys[2];
	pg_uuid_t	lo;
	pg_uuid_t	hi;
	IndexScanDesc scan;
	SnapshotData dirty;
	MemoryContext oldcxt;
	LOCKTAG		sending;
	int64		key_hash = outbox_key_hash(topic, key);

	outbox_sending_locktag(&sending, key_hash);
	if (LockAcquireExtended(&sending, RowExclusiveLock, false, true, false,
							NULL) == LOCKACQUIRE_NOT_AVAIL)
		return;
	InitDirtySnapshot(dirty);
	outbox_key_range(skeys, &lo, &hi, key_hash);
	scan = index_beginscan(r->rel, r->pkey, &dirty, 2, 0);
	index_rescan(scan, skeys, 2, NULL, 0);
	while (arg->nrun < limit)
	{
		int64		seq;
		bool		busy;
		ItemPointer tid = index_getnext_tid(scan, ForwardScanDirection);

		if (tid == NULL)
			break;

		/*
		 * The version the entry points to, when it is visible, as the
		 * index's fetch returns it first, without what that fetch does first
		 * to every page it reads: prune it.  Each ack deletes a message of
		 * the outbox's pages, and the run's fetches would prune the same
		 * pages again and again.  The fetch would go on along the version's
		 * HOT chain for more (the snapshot is not MVCC), and find nothing a
		 * run takes: a version after a visible one is seen only when the
		 * visible one is being updated, and that one ends the run (busy).
		 * A version not visible there (a message already deleted, one
		 * updated by hand), or no tuple there, goes to the fetch.
		 */
		if (table_tuple_fetch_row_version(r->rel, tid, &dirty, r->slot))
			pgstat_count_heap_fetch(r->pkey);
		else if (!index_fetch_heap(scan, r->slot))
			continue;
		busy = TransactionIdIsValid(dirty.xmin) ||
			TransactionIdIsValid(dirty.xmax);

		slot_getallattrs(r->slot);
		/* another (topic, key) with the same hash: not ours */
		if (!outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_TOPIC]), topic) ||
			!outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_KEY]), key))
			continue;
		seq = DatumGetInt64(r->slot->tts_values[OB_SEQ]);
		if (seq < head)
		{
			/* the index gives these first: nothing was taken yet */
			Assert(arg->nrun == 0);
			break;
		}
		if (seq == head)
			continue;
		if (busy || seq <= leased_max)
			break;
		/* the head and the run so far weigh max_bytes: the run ends */
		if (arg->max_bytes > 0)
		{
			if (arg->bytes + arg->key_bytes >= arg->max_bytes)
				break;
			arg->key_bytes +=
				lease_message_bytes(r->slot->tts_values[OB_PAYLOAD],
									r->slot->tts_isnull[OB_PAYLOAD],
									r->slot->tts_values[OB_HEADERS],
									r->slot->tts_isnull[OB_HEADERS]);
		}
		oldcxt = MemoryContextSwitchTo(arg->runcxt);
		arg->run[arg->nrun] = ExecCopySlotHeapTuple(r->slot);
		MemoryContextSwitchTo(oldcxt);
		arg->run_tids[arg->nrun] = r->slot->tts_tid;
		arg->nrun++;
	}
	index_endscan(scan);
	ExecClearTuple(r->slot);
	LockRelease(&sending, RowExclusiveLock, false);
}

/*
 * The attempts kept for the head (whose seq is head), and the key row's
 * attempts_kept without them, with the attempts of the message keep_seq
 * (-1: none) added.  The message a key's row names can be passed by a head
 * before it: one whose sender committed late (see "Order per key" in
 * README), or a message of a run left unacknowledged before a message of
 * the run that was nacked.  Every lease counts, so its count is kept until
 * it is the head again.  Pairs before the head are of messages gone.
 * *kept: whether the head had a pair (its count is the head's, even 0: a
 * redrive's, see idem_outbox_redrive).
 */
static int32
lease_kept_attempts(Datum *values, bool *isnull, int64 head, int64 keep_seq,
					int32 keep_attempts, bool *kept)
{
	Datum	   *elems = NULL;
	bool	   *nulls = NULL;
	int			nelems = 0;
	int			n = 0;
	int			i;
	int32		found = 0;
	Datum	   *out;

	*kept = false;
	if (isnull[OK_ATTEMPTS_KEPT] && keep_seq < 0)
		return 0;
	if (!isnull[OK_ATTEMPTS_KEPT])
		deconstruct_array(DatumGetArrayTypeP(values[OK_ATTEMPTS_KEPT]),
						  INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
						  TYPALIGN_DOUBLE, &elems, &nulls, &nelems);
	out = palloc(sizeof(Datum) * (nelems + 2));
	for (i = 0; i + 1 < nelems; i += 2)
	{
		int64		seq;

		if (nulls[i] || nulls[i + 1])
			continue;
		seq = DatumGetInt64(elems[i]);
		if (seq == head)
		{
			found = (int32) Max(Min(DatumGetInt64(elems[i + 1]), PG_INT32_MAX), 0);
			*kept = true;
		}
		if (seq <= head || seq == keep_seq)
			continue;
		out[n++] = elems[i];
		out[n++] = elems[i + 1];
	}
	if (keep_seq >= 0)
	{
		out[n++] = Int64GetDatum(keep_seq);
		out[n++] = Int64GetDatum(keep_attempts);
	}
	isnull[OK_ATTEMPTS_KEPT] = (n == 0);
	if (n > 0)
		values[OK_ATTEMPTS_KEPT] =
			PointerGetDatum(construct_array(out, n, INT8OID, sizeof(int64),
											FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	return found;
}

/*
 * Called by the store with the latest version of a key row.
 *
 * A head leased for the first time, and not part of the key's last run,
 * may be leased with up to per_key - 1 messages after it (a run): every
 * one of them is at its first attempt, and leased_through keeps the seq
 * of the last.  A message up to leased_through that is not acknowledged
 * when its run ends (the lease ran out, a nack) was leased once, and is
 * leased alone from then on, at its second attempt: the attempts of every
 * message stay exact without a write of the message.
 */
static bool
lease_key(TupleDesc tupdesc, Datum *values, bool *isnull, void *argp)
{
	LeaseArg   *arg = argp;
	OutboxRels *r = arg->rels;
	TupleTableSlot *slot = r->slot;
	int32		attempts;
	int64		head_seq;
	bool		run_ok;
	bool		in_lease;
	bool		busy = false;
	bool		new_head;
	bool		before_last;
	int64		leased_max;
	int64		last_seq;
	bool		kept = false;
	bool		dead_kept = false;
	bool		locked = false;
	bool		expired;
	text	   *topic;
	text	   *key;

	arg->leased = false;
	arg->died = false;
	arg->died_before = false;
	arg->nrun = 0;
	if (DatumGetBool(values[OK_DEAD]))
		return false;
	in_lease = DatumGetTimestampTz(values[OK_AVAILABLE_AT]) > arg->now;
	/* the head dies when its lease has run out, not when it waits */
	expired = !in_lease && !isnull[OK_LEASED_BY];
	/* waiting for its retry: a look at its fate judges it as then */
	if (in_lease && isnull[OK_LEASED_BY])
	{
		if (arg->mode == LEASE_TAKE)
			return false;
		in_lease = false;
	}

	/*
	 * The head is read after the key row, as it stands now.  An ack that
	 * removed an earlier head has committed (the head read is another
	 * message), or is still running (its head is busy).  One that has not
	 * deleted its message yet is seen by idem_outbox_ack's second look at
	 * the row, if this lease locks the message (below) and writes the row.
	 */
	if (!outbox_head(r, values[OK_TOPIC], values[OK_KEY], &busy))
	{
		arg->misses++;
		return false;
	}
	if (busy)
		return false;

	head_seq = DatumGetInt64(slot->tts_values[OB_SEQ]);
	new_head = isnull[OK_HEAD_ID] ||
		!uuid_datum_eq(values[OK_HEAD_ID], DatumGetUUIDP(slot->tts_values[OB_ID]));
	/*
	 * The row names a message after the head: the head's sender committed
	 * late, or a nack named a message of a run.
	 */
	before_last = new_head && !isnull[OK_HEAD_ID] &&
		memcmp(DatumGetUUIDP(values[OK_HEAD_ID])->data,
			   DatumGetUUIDP(slot->tts_values[OB_ID])->data, UUID_LEN) > 0;

	/*
	 * Leased, and not run out: the lease holds while its message, or one of
	 * its run, is there (the ack of a head leased alone deletes it and
	 * leaves the key row as the lease wrote it: see ack_key).  Its message
	 * is the key's head, or a message after it when one sent before it
	 * committed since.  A leased message that would come before the head is
	 * gone.
	 */
	if (in_lease &&
		(!new_head ||
		 (outbox_key_in_run(values, isnull) &&
		  head_seq <= DatumGetInt64(values[OK_LEASED_THROUGH])) ||
		 (before_last &&
		  outbox_message_exists(r, DatumGetUUIDP(values[OK_HEAD_ID])))))
		return false;

	attempts = DatumGetInt32(values[OK_ATTEMPTS]);
	/* a head leased before is the same head only if its id says so */
	if (new_head)
	{
		/*
		 * The message the row names, after the head, had its lease run out:
		 * its attempts are kept for when it is the head again, and the head
		 * takes those kept for it, if it was such a message.
		 */
		int64		keep = -1;
		MemoryContext oldcxt;

		/* (in a lease, the message was looked for above, and is gone) */
		if (before_last && attempts > 0 && !in_lease &&
			outbox_message_exists(r, DatumGetUUIDP(values[OK_HEAD_ID])))
			keep = outbox_id_seq(DatumGetUUIDP(values[OK_HEAD_ID]));
		oldcxt = MemoryContextSwitchTo(arg->runcxt);
		attempts = lease_kept_attempts(values, isnull, head_seq, keep,
									   attempts, &kept);
		MemoryContextSwitchTo(oldcxt);
		/* the error was the last head's */
		isnull[OK_LAST_ERROR] = true;
		expired = false;
	}
	else if (arg->mode == LEASE_TAKE)
	{
		/*
		 * Handed out again (its lease ran out, or its retry is due), or
		 * dead: not while an ack deletes it, nor may that ack commit
		 * without seeing this row (see idem_outbox_ack).  A look at its
		 * fate locks it only if it writes its death (below).
		 */
		if (!outbox_lock_message(r, &slot->tts_tid, false))
			return false;
		locked = true;
	}
	/* past the last run: forgotten */
	if (!isnull[OK_LEASED_THROUGH] &&
		head_seq > DatumGetInt64(values[OK_LEASED_THROUGH]))
		isnull[OK_LEASED_THROUGH] = true;
	/*
	 * In it: leased once with it, unless a redrive reset its count, which
	 * ends the run for the messages after it too (as a redrive of a dead
	 * head does): a head at its first attempt with leased_through kept
	 * would be taken for a run's (outbox_key_in_run).
	 */
	if (kept && attempts == 0)
		isnull[OK_LEASED_THROUGH] = true;
	if (attempts == 0 && !isnull[OK_LEASED_THROUGH])
		attempts = 1;
	/* a message a nack of its run made dead (see nack_key), or one passed */
	if (!isnull[OK_DEAD_KEPT] &&
		head_seq >= DatumGetInt64(values[OK_DEAD_KEPT]))
	{
		dead_kept = head_seq == DatumGetInt64(values[OK_DEAD_KEPT]);
		if (dead_kept)
		{
			values[OK_LAST_ERROR] = isnull[OK_ERROR_KEPT] ?
				CStringGetTextDatum("a nack made the message dead") :
				values[OK_ERROR_KEPT];
			isnull[OK_LAST_ERROR] = false;
		}
		isnull[OK_DEAD_KEPT] = true;
		isnull[OK_ERROR_KEPT] = true;
	}
	/* a new head leased before (kept, or in the last run): as above */
	if (new_head && attempts > 0 && arg->mode == LEASE_TAKE)
	{
		if (!outbox_lock_message(r, &slot->tts_tid, false))
			return false;
		locked = true;
	}
	/* a look at its fate only: whether it dies now */
	if (arg->mode != LEASE_TAKE && !dead_kept &&
		attempts < arg->topic->max_attempts)
		return false;
	run_ok = (attempts == 0);
	leased_max = isnull[OK_LEASED_MAX] ? -1 : DatumGetInt64(values[OK_LEASED_MAX]);
	last_seq = head_seq;

	memcpy(&arg->head_id, DatumGetUUIDP(slot->tts_values[OB_ID]), UUID_LEN);
	arg->head_tid = slot->tts_tid;
	arg->head_key_hash = DatumGetInt64(slot->tts_values[OB_KEY_HASH]);
	values[OK_HEAD_ID] = UUIDPGetDatum(&arg->head_id);
	isnull[OK_HEAD_ID] = false;

	if (dead_kept || attempts >= arg->topic->max_attempts)
	{
		/*
		 * Its last lease ran out (or its topic's maximum attempts were
		 * lowered below its count, and its nack's error stays), or a nack
		 * made it dead: it is dead, and holds its key back.  The message is
		 * locked, as above, before its death is written.
		 */
		if (arg->mode != LEASE_JUDGE && !locked &&
			!outbox_lock_message(r, &slot->tts_tid, false))
			return false;
		values[OK_DEAD] = BoolGetDatum(true);
		values[OK_ATTEMPTS] = Int32GetDatum(attempts);
		isnull[OK_LEASED_BY] = true;
		if (!dead_kept && (expired || isnull[OK_LAST_ERROR]))
		{
			/* a later message of its run was nacked dead: see nack_key */
			values[OK_LAST_ERROR] =
				CStringGetTextDatum(!expired && !isnull[OK_DEAD_KEPT] ?
									OUTBOX_RUN_NACKED_ERROR :
									OUTBOX_EXPIRED_ERROR);
			isnull[OK_LAST_ERROR] = false;
		}
		arg->died = true;
		arg->died_before = dead_kept;
		/* a look only: what a lease would write is not written */
		return arg->mode != LEASE_JUDGE;
	}

	values[OK_ATTEMPTS] = Int32GetDatum(attempts + 1);
	values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now + arg->lease);
	values[OK_LEASED_BY] = PointerGetDatum(arg->relay);
	isnull[OK_LEASED_BY] = false;

	arg->values[0] = UUIDPGetDatum(&arg->head_id);
	arg->isnull[0] = false;
	arg->values[1] = slot->tts_values[OB_TOPIC];
	arg->isnull[1] = false;
	arg->values[2] = slot->tts_values[OB_KEY];
	arg->isnull[2] = false;
	arg->values[3] = slot->tts_values[OB_TYPE];
	arg->isnull[3] = slot->tts_isnull[OB_TYPE];
	arg->values[4] = slot->tts_values[OB_PAYLOAD];
	arg->isnull[4] = false;
	arg->values[5] = slot->tts_values[OB_HEADERS];
	arg->isnull[5] = slot->tts_isnull[OB_HEADERS];
	arg->values[6] = Int32GetDatum(attempts + 1);
	arg->isnull[6] = false;
	arg->values[7] = slot->tts_values[OB_CREATED_AT];
	arg->isnull[7] = false;
	arg->leased = true;
	/* weighed only against a limit: a lease without one pays nothing */
	arg->key_bytes = arg->max_bytes > 0 ?
		lease_message_bytes(arg->values[4], false, arg->values[5],
							arg->isnull[5]) : 0;

	if (run_ok && arg->per_key > 1 && arg->budget > 1)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(arg->runcxt);
		HeapTuple	head = ExecCopySlotHeapTuple(slot);

		/* the head's columns outlive the slot, which the run's scan reuses */
		MemoryContextSwitchTo(oldcxt);
		heap_deform_tuple(head, RelationGetDescr(r->rel), arg->head_values,
						  arg->head_isnull);
		arg->values[1] = arg->head_values[OB_TOPIC];
		arg->values[2] = arg->head_values[OB_KEY];
		arg->values[3] = arg->head_values[OB_TYPE];
		arg->values[4] = arg->head_values[OB_PAYLOAD];
		arg->values[5] = arg->head_values[OB_HEADERS];
		arg->values[7] = arg->head_values[OB_CREATED_AT];
		topic = DatumGetTextPP(arg->values[1]);
		key = DatumGetTextPP(arg->values[2]);
		lease_run(arg, topic, key, head_seq, leased_max,
				  Min(arg->per_key, arg->budget) - 1);
		if (arg->nrun > 0)
		{
			bool		isn;

			values[OK_LEASED_THROUGH] =
				heap_getattr(arg->run[arg->nrun - 1], OB_SEQ + 1,
							 RelationGetDescr(r->rel), &isn);
			isnull[OK_LEASED_THROUGH] = false;
			last_seq = DatumGetInt64(values[OK_LEASED_THROUGH]);
		}
	}
	/* the highest seq ever handed out (see lease_run) */
	if (last_seq > leased_max)
	{
		values[OK_LEASED_MAX] = Int64GetDatum(last_seq);
		isnull[OK_LEASED_MAX] = false;
	}
	return true;
}

static void
outbox_check_message_type(TupleDesc desc)
{
	static const Oid types[OM_NATTS] = {
		UUIDOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, INT4OID,
		TIMESTAMPTZOID
	};
	int			i;
	bool		ok = (desc->natts == OM_NATTS);

	for (i = 0; ok && i < OM_NATTS; i++)
		ok = !TupleDescAttr(desc, i)->attisdropped &&
			TupleDescAttr(desc, i)->atttypid == types[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("type idem_outbox_message does not have the expected attributes"),
				 errhint("Undo the change to the type.")));
}

/*
 * Whether the key row version in slot (pinned) has been updated or deleted
 * by a transaction that committed or, unless committed_only, is still
 * running: idem_store_try_update_at would then leave it, whatever lease_key
 * said.  A lock (held or not), a multixact and an aborted updater say no:
 * the update is tried, and decides.
 *
 * committed_only: the version will be said changed whenever it
 * is asked, and lease_try skip it.  With several relays, the keys that have
 * waited longest are the ones they all try at once, and the candidates a
 * relay kept would be mostly rows the others leased since its snapshot; a
 * pass leaves such rows out of its candidates.  (One an update still in
 * progress is changing is kept: that update may yet roll back, and
 * lease_try decides.)
 */
static bool
lease_row_changed_as(TupleTableSlot *slot, bool committed_only)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	HeapTupleHeader tup = bslot->base.tuple->t_data;
	uint16		infomask;
	TransactionId xmax;

	LockBuffer(bslot->buffer, BUFFER_LOCK_SHARE);
	infomask = tup->t_infomask;
	xmax = HeapTupleHeaderGetRawXmax(tup);
	LockBuffer(bslot->buffer, BUFFER_LOCK_UNLOCK);
	if ((infomask & HEAP_XMAX_INVALID) || (infomask & HEAP_XMAX_IS_MULTI) ||
		!TransactionIdIsValid(xmax) || HEAP_XMAX_IS_LOCKED_ONLY(infomask))
		return false;
	/* a hint bit says so without a look at the commit log */
	if (infomask & HEAP_XMAX_COMMITTED)
		return true;
	return committed_only ? TransactionIdDidCommit(xmax) :
		!TransactionIdDidAbort(xmax);
}

/*
 * The keys the last pass of this session found without a head, or would
 * have sought one of without lease_present_hashes: when they are more than
 * the index has pages, the next pass reads the index whole first.
 */
static int	lease_last_misses = 0;

static int
lease_hash_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : (x > y ? 1 : 0);
}

/*
 * The prefixes of key_hash (see outbox_make_id) that begin an id in the
 * primary key, in order, each once: those of the keys that may have a head.  The index is read
 * whole, without the table: one read of each of its pages instead of a
 * descent per key, which pays when it has fewer pages than a pass has
 * candidates (a short backlog, keys whose messages were all delivered).
 *
 * A key without an entry has no message that a probe of its head, at the
 * time of this read, could find: a message's entry is in the index before
 * its sender's transaction commits (and before that transaction looks at
 * the idle lock: see "Waking relays"), and the index drops (marks dead)
 * only entries of rows that no transaction can see any more.  Such a key
 * is skipped, as such a probe would have answered.  A key with an entry is
 * probed as usual, after its row is read again.
 */
static int64 *
lease_present_hashes(OutboxRels *r, int *n)
{
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	IndexScanDesc scan;
	int			size = 1024;
	int64	   *hashes = palloc(sizeof(int64) * size);

	*n = 0;
	scan = index_beginscan(r->rel, r->pkey, snap, 0, 0);
	scan->xs_want_itup = true;
	index_rescan(scan, NULL, 0, NULL, 0);
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		bool		isnull;
		Datum		id;
		int64		hash = 0;

		CHECK_FOR_INTERRUPTS();
		id = index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull);
		if (!isnull)
			hash = outbox_id_prefix(DatumGetUUIDP(id));
		/* the index is in order of key_hash: a repeat follows its first */
		if (isnull || (*n > 0 && hashes[*n - 1] == hash))
			continue;
		if (*n == size)
		{
			/* past 2^26 prefixes (keys), more than MaxAllocSize */
			size *= 2;
			hashes = repalloc_huge(hashes, sizeof(int64) * size);
		}
		hashes[(*n)++] = hash;
	}
	index_endscan(scan);
	UnregisterSnapshot(snap);
	return hashes;
}

/*
 * Lease the head of the key whose row version, as the pass's snapshot sees
 * it, is in kslot (pinned) at tid, and its run (see lease_key) within
 * budget messages.  Returns how many messages were leased (they are then
 * in the result, the head first).  kslot is left empty.
 */
static int
lease_try(IdemStore *store, TupleTableSlot *kslot, ItemPointer tid,
		  ReturnSetInfo *rsinfo, LeaseArg *arg, OutboxTopicCache *topics, int budget)
{
	IdemStoreUpdateResult res;
	text	   *topic;

	/*
	 * A version another transaction has updated since, or is updating, will
	 * not be updated here: skip it before the probe of its head.
	 */
	if (lease_row_changed_as(kslot, false))
	{
		ExecClearTuple(kslot);
		return 0;
	}
	slot_getallattrs(kslot);
	topic = DatumGetTextPCopy(kslot->tts_values[OK_TOPIC]);
	arg->topic = outbox_topic(topics, topic);

	/*
	 * The row is updated where the pass saw it, if no transaction has changed
	 * it since: one that has, or is changing it, is skipped.
	 */
	arg->budget = budget;
	res = idem_store_try_update_at(store, tid, kslot->tts_values,
								   kslot->tts_isnull, lease_key, arg);
	ExecClearTuple(kslot);
	if (res == IDEM_UPDATE_DONE && arg->leased)
	{
		ItemPointerData key_tid = idem_store_updated_tid(store);
		TupleDesc	desc = RelationGetDescr(arg->rels->rel);
		int			i;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
							 arg->values, arg->isnull);
		outbox_remember_lease(&arg->head_id, &arg->head_tid, key_tid,
							  arg->head_key_hash);
		for (i = 0; i < arg->nrun; i++)
		{
			Datum		mv[OB_NATTS];
			bool		mn[OB_NATTS];
			Datum		v[OM_NATTS];
			bool		n[OM_NATTS];

			heap_deform_tuple(arg->run[i], desc, mv, mn);
			v[0] = mv[OB_ID];
			n[0] = false;
			v[1] = mv[OB_TOPIC];
			n[1] = false;
			v[2] = mv[OB_KEY];
			n[2] = false;
			v[3] = mv[OB_TYPE];
			n[3] = mn[OB_TYPE];
			v[4] = mv[OB_PAYLOAD];
			n[4] = false;
			v[5] = mv[OB_HEADERS];
			n[5] = mn[OB_HEADERS];
			v[6] = Int32GetDatum(1);
			n[6] = false;
			v[7] = mv[OB_CREATED_AT];
			n[7] = false;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
			outbox_remember_lease(DatumGetUUIDP(mv[OB_ID]), &arg->run_tids[i],
								  key_tid, arg->head_key_hash);
		}
		MemoryContextReset(arg->runcxt);
		arg->bytes += arg->key_bytes;
		idem_stat_count_text(IDEM_KIND_OUTBOX, topic, IDEM_OUTBOX_LEASED,
							 1 + arg->nrun);
		if (DatumGetInt32(arg->values[6]) > 1)
			idem_stat_count_text(IDEM_KIND_OUTBOX, topic,
								 IDEM_OUTBOX_REDELIVERED, 1);
		return 1 + arg->nrun;
	}
	MemoryContextReset(arg->runcxt);
	if (res == IDEM_UPDATE_DONE && arg->died && !arg->died_before)
		idem_stat_count_text(IDEM_KIND_OUTBOX, topic, IDEM_OUTBOX_DEAD, 1);
	return 0;
}

/*
 * Whether the key row version in kslot makes its key a candidate of a
 * pass, and when it became available (*at, the order of candidates): not
 * dead, and available now, or leased (the ack of a head leased alone leaves
 * the row: see ack_key).  head: the key's head as the pass sees it, or NULL
 * when unknown; a lease holds while that head is its message or in its
 * run (lease_key decides the rest).  A leased key counts as available since
 * its lease began, as far as this call's lease tells.
 */
static bool
lease_candidate_at(TupleTableSlot *kslot, LeaseArg *arg, pg_uuid_t *head,
				   int64 head_seq, TimestampTz *at)
{
	bool		isnull;
	Datum		d;

	d = slot_getattr(kslot, OK_DEAD + 1, &isnull);
	if (isnull || DatumGetBool(d))
		return false;
	d = slot_getattr(kslot, OK_AVAILABLE_AT + 1, &isnull);
	if (isnull)
		return false;
	*at = DatumGetTimestampTz(d);
	if (*at <= arg->now)
		return true;
	/* waiting for its retry */
	(void) slot_getattr(kslot, OK_LEASED_BY + 1, &isnull);
	if (isnull)
		return false;
	if (head != NULL)
	{
		Datum	   *values = kslot->tts_values;
		bool	   *nulls = kslot->tts_isnull;

		slot_getallattrs(kslot);
		if (!nulls[OK_HEAD_ID] && uuid_datum_eq(values[OK_HEAD_ID], head))
			return false;
		if (outbox_key_in_run(values, nulls) &&
			head_seq <= DatumGetInt64(values[OK_LEASED_THROUGH]))
			return false;
	}
	*at -= arg->lease;
	return true;
}

/*
 * Fill heap with the candidates of a scan of every key row under snap: the
 * keys lease_candidate_at takes, less the rows whose update committed
 * (lease_row_changed_as) (after: the last candidate an earlier round tried,
 * or NULL; present: see lease_present_hashes).
 */
static void
lease_scan_keys(Relation keys_rel, Snapshot snap, TupleTableSlot *kslot,
				LeaseHeap *heap, LeaseCandidate *after, LeaseArg *arg,
				int64 *present, int npresent, bool *more)
{
	TableScanDesc scan = table_beginscan(keys_rel, snap, 0, NULL);

	while (table_scan_getnextslot(scan, ForwardScanDirection, kslot))
	{
		TimestampTz avail;
		int64		hash;

		if (!lease_candidate_at(kslot, arg, NULL, 0, &avail))
			continue;
		if (after != NULL)
		{
			LeaseCandidate cand;

			/* tried by an earlier round */
			cand.available_at = avail;
			cand.tid = kslot->tts_tid;
			if (lease_candidate_cmp(&cand, after) <= 0)
				continue;
		}
		if (lease_row_changed_as(kslot, true))
			continue;
		if (present != NULL)
		{
			bool		tnull;
			bool		knull;
			Datum		t = slot_getattr(kslot, OK_TOPIC + 1, &tnull);
			Datum		k = slot_getattr(kslot, OK_KEY + 1, &knull);

			/* no entry in the index: no head */
			if (tnull || knull)
				continue;
			hash = outbox_hash_prefix(outbox_key_hash(DatumGetTextPP(t),
													  DatumGetTextPP(k)));
			if (bsearch(&hash, present, npresent, sizeof(int64),
						lease_hash_cmp) == NULL)
			{
				arg->misses++;
				continue;
			}
		}
		if (heap->n == heap->size)
			*more = true;
		lease_heap_add(heap, avail, &kslot->tts_tid);
		CHECK_FOR_INTERRUPTS();
	}
	table_endscan(scan);
}

/*
 * ---- Finding keys through their messages ----
 *
 * A pass that scans the key rows reads every one, however few keys have
 * messages: with many idle keys (keys are often the ids of orders or
 * accounts, and a key's row stays until idem_outbox_purge) and a short
 * backlog, as when relays keep up, that is most of a lease's work, paid
 * again by every lease that finds nothing.  So a pass first reads the
 * primary key of idem.outbox (ids in the order of key_hash, then seq) in
 * order, under the pass's snapshot, and finds the key row of each key seen
 * there through the primary key of idem.outbox_keys: the candidates a
 * scan of the key rows would give, kept and tried in the same order, from
 * the keys that have messages only (the others have no head to lease),
 * less the keys whose lease holds on the head the read sees (a scan of the
 * key rows cannot tell those from keys whose leased head was acknowledged,
 * and leaves them to lease_key).
 *
 * The read gives up once it has cost more than a scan of the key rows would
 * (a long backlog, counted in messages: many messages of a few keys count
 * as many): the pass then scans the key rows, and so do the session's next
 * passes, LEASE_MESSAGES_SKIP of them, twice as many after each read given
 * up in a row, up to LEASE_MESSAGES_SKIP_MAX, so that a long backlog pays
 * little for the reads given up, and a backlog gone is noticed within that
 * many passes.  (A pass that leases nothing is no sign of that: the heads
 * may all be leased, waiting for a retry, or behind dead keys.)  Every
 * index entry read counts (one the snapshot cannot see costs its heap fetch
 * too), a key row found LEASE_PROBE_COST; a scan of the key rows is priced
 * at LEASE_ROWS_PER_PAGE rows per page of the table, plus LEASE_MIN_BUDGET.
 */
#define LEASE_MESSAGES_SKIP 16
#define LEASE_MESSAGES_SKIP_MAX 64
#define LEASE_ROWS_PER_PAGE 40
#define LEASE_MIN_BUDGET	64
#define LEASE_PROBE_COST	2

/*
 * Passes of this session that scan the key rows without trying the index,
 * and how many the next read given up sets.
 */
static int	lease_messages_skip = 0;
static int	lease_messages_backoff = LEASE_MESSAGES_SKIP;

/* A (topic, key) seen in the index, among those of one prefix of ids. */
typedef struct LeaseSeenKey
{
	text	   *topic;
	text	   *key;
} LeaseSeenKey;

/* Frees a run of keys seen, with their copies of topic and key. */
static void
lease_free_run(List *run)
{
	ListCell   *lc;

	foreach(lc, run)
	{
		LeaseSeenKey *seen = lfirst(lc);

		pfree(seen->topic);
		pfree(seen->key);
	}
	list_free_deep(run);
}

/*
 * Where the row of each key (by key_hash) is, as the primary key of
 * idem.outbox_keys last said: the root of the row's chain of versions.  A
 * key row's updates are HOT, so the root stays where it is until the row is
 * deleted (idem_outbox_purge), or an update finds no room on its page.  A
 * pass that finds keys through their messages fetches the row from there,
 * as the primary key's own fetch of that entry would, and takes what it
 * finds when it is the key's row (a snapshot sees one version of a key's
 * row at most); anything else, a slot reused by another key's row, nothing
 * visible there, goes through the primary key, which then says where the
 * root is now.  This saves the descent of the primary key (text
 * comparisons on every level) for each key seen.  Entries are kept for one
 * file of the table (another after TRUNCATE or DROP EXTENSION), and all
 * dropped past LEASE_KEY_ROOTS_MAX.
 */
typedef struct LeaseKeyRoot
{
	int64		key_hash;		/* hash key */
	RelFileNode node;
	ItemPointerData tid;
} LeaseKeyRoot;

#define LEASE_KEY_ROOTS_MAX 65536

static HTAB *lease_key_roots = NULL;

static LeaseKeyRoot *
lease_key_root(int64 key_hash, bool enter)
{
	if (!enter)
		return lease_key_roots == NULL ? NULL :
			hash_search(lease_key_roots, &key_hash, HASH_FIND, NULL);
	return hash_search(outbox_session_table(&lease_key_roots,
											"idem outbox key rows",
											sizeof(int64),
											sizeof(LeaseKeyRoot),
											LEASE_KEY_ROOTS_MAX),
					   &key_hash, HASH_ENTER, NULL);
}

/*
 * The row of the key (topic, key) visible to snap, in kslot: from where
 * lease_key_root says, or through the primary key (kscan, with skeys on
 * topic and key).  nblocks: the table's size, asked once per pass (the lock
 * held keeps it from shrinking).
 */
static bool
lease_key_row(Relation keys_rel, IndexScanDesc kscan,
			  IndexFetchTableData *kfetch, Snapshot snap,
			  TupleTableSlot *kslot, ScanKey skeys, int64 key_hash,
			  text *topic, text *key, BlockNumber nblocks)
{
	LeaseKeyRoot *root = lease_key_root(key_hash, false);

	if (root != NULL && RelFileNodeEquals(root->node, keys_rel->rd_node) &&
		ItemPointerGetBlockNumber(&root->tid) < nblocks)
	{
		bool		call_again = false;
		bool		all_dead = false;
		ItemPointerData tid = root->tid;

		if (table_index_fetch_tuple(kfetch, &tid, snap, kslot, &call_again,
									&all_dead))
		{
			bool		tnull;
			bool		knull;
			Datum		t = slot_getattr(kslot, OK_TOPIC + 1, &tnull);
			Datum		k = slot_getattr(kslot, OK_KEY + 1, &knull);

			if (!tnull && !knull &&
				outbox_text_eq(DatumGetTextPP(t), topic) &&
				outbox_text_eq(DatumGetTextPP(k), key))
			{
				/* counted as the scan of the index that answers otherwise */
				pgstat_count_index_scan(kscan->indexRelation);
				pgstat_count_index_tuples(kscan->indexRelation, 1);
				pgstat_count_heap_fetch(kscan->indexRelation);
				return true;
			}
			ExecClearTuple(kslot);
		}
	}
	/* index_getnext_slot, keeping the entry's TID (the fetch moves it on) */
	index_rescan(kscan, skeys, 2, NULL, 0);
	for (;;)
	{
		ItemPointer tid = index_getnext_tid(kscan, ForwardScanDirection);
		ItemPointerData entry;

		if (tid == NULL)
			return false;
		entry = *tid;
		if (index_fetch_heap(kscan, kslot))
		{
			root = lease_key_root(key_hash, true);
			root->node = keys_rel->rd_node;
			root->tid = entry;
			return true;
		}
	}
}

/*
 * Fill heap with the candidates among the keys that have a message visible
 * to snap, as lease_scan_keys does from every key row (after: the last
 * candidate an earlier round tried, or NULL).  False when that cost more
 * than the scan: heap is then to be filled by the scan.
 */
static bool
lease_candidates_by_messages(IdemStore *store, OutboxRels *r,
							 Relation keys_rel, Snapshot snap,
							 TupleTableSlot *kslot, LeaseHeap *heap,
							 LeaseCandidate *after, LeaseArg *arg,
							 bool *more)
{
	Relation	keys_index = idem_store_index(store);
	int64		budget;
	int64		cost = 0;
	int64		run_hash = 0;
	List	   *run = NIL;		/* LeaseSeenKey of run_hash */
	IndexScanDesc scan;
	IndexScanDesc kscan;
	IndexFetchTableData *kfetch;
	ScanKeyData skeys[2];
	bool		ok = true;
	BlockNumber nblocks = RelationGetNumberOfBlocks(keys_rel);

	Assert(keys_index != NULL);
	budget = (int64) nblocks * LEASE_ROWS_PER_PAGE + LEASE_MIN_BUDGET;

	scan = index_beginscan(r->rel, r->pkey, snap, 0, 0);
	outbox_scan_keep_pin(scan);
	index_rescan(scan, NULL, 0, NULL, 0);
	kscan = index_beginscan(keys_rel, keys_index, snap, 2, 0);
	kfetch = table_index_fetch_begin(keys_rel);
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		int64		hash;
		text	   *topic;
		text	   *key;
		bool		known = false;
		ListCell   *lc;
		LeaseSeenKey *seen;
		TimestampTz avail;

		CHECK_FOR_INTERRUPTS();
		/* every entry counts, also one whose message the snapshot cannot see */
		if (++cost > budget)
		{
			ok = false;
			break;
		}
		if (!index_fetch_heap(scan, r->slot))
			continue;
		slot_getallattrs(r->slot);
		/* the index gives the entries of each prefix of ids together */
		hash = outbox_id_prefix(DatumGetUUIDP(r->slot->tts_values[OB_ID]));
		topic = DatumGetTextPP(r->slot->tts_values[OB_TOPIC]);
		key = DatumGetTextPP(r->slot->tts_values[OB_KEY]);
		if (run != NIL && hash == run_hash)
		{
			/* a later message of a key seen, or a key with the same prefix */
			foreach(lc, run)
			{
				seen = lfirst(lc);
				if (outbox_text_eq(seen->topic, topic) &&
					outbox_text_eq(seen->key, key))
				{
					known = true;
					break;
				}
			}
			if (known)
				continue;
		}
		else
		{
			lease_free_run(run);
			run = NIL;
			run_hash = hash;
		}
		seen = palloc(sizeof(LeaseSeenKey));
		seen->topic = DatumGetTextPCopy(PointerGetDatum(topic));
		seen->key = DatumGetTextPCopy(PointerGetDatum(key));
		run = lappend(run, seen);

		/*
		 * The key's row, as the scan of the key rows would see it.  The
		 * primary key is on (topic, key), both text in the "C" collation, as
		 * outbox_keys_open checked.
		 */
		cost += LEASE_PROBE_COST;
		ScanKeyEntryInitialize(&skeys[0], 0, 1, BTEqualStrategyNumber,
							   InvalidOid, C_COLLATION_OID, F_TEXTEQ,
							   PointerGetDatum(topic));
		ScanKeyEntryInitialize(&skeys[1], 0, 2, BTEqualStrategyNumber,
							   InvalidOid, C_COLLATION_OID, F_TEXTEQ,
							   PointerGetDatum(key));
		if (!lease_key_row(keys_rel, kscan, kfetch, snap, kslot, skeys,
						   DatumGetInt64(r->slot->tts_values[OB_KEY_HASH]),
						   topic, key, nblocks))
			continue;
		if (lease_candidate_at(kslot, arg,
							   DatumGetUUIDP(r->slot->tts_values[OB_ID]),
							   DatumGetInt64(r->slot->tts_values[OB_SEQ]),
							   &avail) &&
			!lease_row_changed_as(kslot, true))
		{
			LeaseCandidate cand;

			cand.available_at = avail;
			cand.tid = kslot->tts_tid;
			if (after == NULL || lease_candidate_cmp(&cand, after) > 0)
			{
				if (heap->n == heap->size)
					*more = true;
				lease_heap_add(heap, cand.available_at, &cand.tid);
			}
		}
		ExecClearTuple(kslot);
	}
	ExecClearTuple(kslot);
	table_index_fetch_end(kfetch);
	index_endscan(kscan);
	index_endscan(scan);
	ExecClearTuple(r->slot);
	lease_free_run(run);
	return ok;
}

/*
 * One look for keys whose head may be leased now: their heads go into the
 * result, up to max_messages.  Returns how many.
 *
 * The candidates come from the primary key (lease_candidates_by_messages)
 * or, past its cost, from a scan of every key row (lease_scan_keys).  The
 * pass keeps only the best candidates, about twice as many as may be
 * leased; the rows are read again when they are tried, under the pass's
 * snapshot, which keeps the versions it saw where they were.  When fewer
 * than max_messages could be leased and the pass saw more candidates than
 * it kept, it runs again under the same snapshot for the next ones.
 */
/* the largest set of candidates a round keeps (16 bytes each) */
#define LEASE_HEAP_MAX		(1 << 20)

static int
lease_pass(IdemStore *store, OutboxRels *r, ReturnSetInfo *rsinfo,
		   LeaseArg *arg, int max_messages, OutboxTopicCache *topics)
{
	Relation	keys_rel;
	Snapshot	snap;
	TupleTableSlot *kslot;
	LeaseHeap	heap;
	LeaseCandidate last;
	bool		have_last = false;
	bool		more;
	bool		by_messages = false;
	int64	   *present = NULL;
	int			npresent = 0;
	int			nleased = 0;
	int			i;

	arg->now = GetCurrentTimestamp();
	heap.size = max_messages * 2 + 16;
	heap.c = palloc(sizeof(LeaseCandidate) * heap.size);

	/*
	 * When the last pass sought the head of more keys without one than the
	 * index has pages, reading the index whole costs less than a descent
	 * per such key: see lease_present_hashes.
	 */
	arg->misses = 0;
	/* the keys with messages through the index, or every key row */
	if (lease_messages_skip > 0)
		lease_messages_skip--;
	else
		by_messages = idem_store_index(store) != NULL;
	if (!by_messages && lease_last_misses > 0 &&
		RelationGetNumberOfBlocks(r->pkey) < (BlockNumber) lease_last_misses)
		present = lease_present_hashes(r, &npresent);
	/* this call's own updates (a first pass) must be seen */
	CommandCounterIncrement();
	keys_rel = table_open(outbox_keys_relid, RowExclusiveLock);
	snap = RegisterSnapshot(GetLatestSnapshot());
	kslot = table_slot_create(keys_rel, NULL);
	do
	{
		heap.n = 0;
		more = false;
		if (by_messages &&
			!lease_candidates_by_messages(store, r, keys_rel, snap, kslot,
										  &heap, have_last ? &last : NULL,
										  arg, &more))
		{
			/* a long backlog: the key rows, for a while */
			by_messages = false;
			lease_messages_skip = lease_messages_backoff;
			lease_messages_backoff = Min(lease_messages_backoff * 2,
										 LEASE_MESSAGES_SKIP_MAX);
			heap.n = 0;
			more = false;
		}
		else if (by_messages)
			lease_messages_backoff = LEASE_MESSAGES_SKIP;
		if (!by_messages)
			lease_scan_keys(keys_rel, snap, kslot, &heap,
							have_last ? &last : NULL, arg, present, npresent,
							&more);

		/* the worst kept (the root): where the next round starts */
		if (heap.n > 0)
		{
			last = heap.c[0];
			have_last = true;
		}
		for (i = 0; i < heap.n && nleased < max_messages &&
			 !lease_bytes_full(arg); i++)
		{
			CHECK_FOR_INTERRUPTS();
			/* the keys that have waited longest first */
			lease_heap_next(&heap, i);
			/* the version the pass saw: the snapshot keeps it there */
			if (!table_tuple_fetch_row_version(keys_rel, &heap.c[i].tid, snap,
											   kslot))
				continue;
			nleased += lease_try(store, kslot, &heap.c[i].tid, rsinfo, arg,
								 topics, max_messages - nleased);
		}

		/*
		 * Each round tries a bounded set of candidates and reads every key
		 * row (or the primary key) again.  Among many keys without a head
		 * (all delivered, not purged yet) a pass of rounds of one size would
		 * cost the square of their number: each round's set is twice the
		 * last's, so a pass takes a number of rounds that grows as the
		 * logarithm of theirs.  Once they outnumber the index's pages, the
		 * rest of the pass also skips those the index shows without a head.
		 */
		if (more && nleased < max_messages && !lease_bytes_full(arg))
		{
			if (heap.size < LEASE_HEAP_MAX)
			{
				heap.size = Min(heap.size * 2, LEASE_HEAP_MAX);
				heap.c = repalloc(heap.c, sizeof(LeaseCandidate) * heap.size);
			}
			if (!by_messages && present == NULL && arg->misses > 0 &&
				RelationGetNumberOfBlocks(r->pkey) < (BlockNumber) arg->misses)
				present = lease_present_hashes(r, &npresent);
		}
	} while (more && nleased < max_messages && !lease_bytes_full(arg));
	ExecDropSingleTupleTableSlot(kslot);
	UnregisterSnapshot(snap);
	table_close(keys_rel, NoLock);
	pfree(heap.c);
	if (present != NULL)
		pfree(present);
	lease_last_misses = arg->misses;
	return nleased;
}

/*
 * idem_outbox_lease(relay, max_messages, lease, per_key, max_bytes) returns
 * setof idem_outbox_message
 *
 * Up to max_messages heads of keys that may be leased now, the keys that
 * have waited longest first, each followed by the rest of its run when
 * per_key is above 1 (see lease_key).  A key another relay is leasing at
 * this very moment is skipped, not waited for.  Once the messages taken
 * weigh max_bytes (see lease_message_bytes), no more is taken: at least
 * one message, and less than max_bytes and the last one's weight.
 */
PG_FUNCTION_INFO_V1(idem_outbox_lease);
Datum
idem_outbox_lease(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *relay = idem_arg_key(fcinfo, 0, "relay", OUTBOX_MAX_RELAY_LEN);
	int32		max_messages;
	int64		lease;
	int32		per_key;
	int64		max_bytes;
	IdemStore  *store;
	OutboxRels	r;
	int			nleased = 0;
	OutboxTopicCache topics = OUTBOX_TOPIC_CACHE_INIT;
	LeaseArg	arg;
	MemoryContext callcxt;
	MemoryContext oldcxt;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_messages must not be null")));
	max_messages = PG_GETARG_INT32(1);
	if (max_messages < 1 || max_messages > OUTBOX_MAX_LEASE_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_messages must be between 1 and %d",
						OUTBOX_MAX_LEASE_BATCH),
				 errdetail("The value given was %d.", max_messages)));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease must not be null")));
	lease = outbox_span(PG_GETARG_INTERVAL_P(2), "lease", false,
						"Give how long a relay may take to deliver a batch, such as '30 seconds'.");
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("per_key must not be null"),
				 errhint("Give 1 to lease only the oldest message of each key.")));
	per_key = PG_GETARG_INT32(3);
	if (per_key < 1 || per_key > OUTBOX_MAX_LEASE_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("per_key must be between 1 and %d",
						OUTBOX_MAX_LEASE_BATCH),
				 errdetail("The value given was %d.", per_key)));
	/* NULL (or a definition without it): no limit */
	max_bytes = PG_NARGS() <= 4 || PG_ARGISNULL(4) ? 0 : PG_GETARG_INT64(4);
	if (PG_NARGS() > 4 && !PG_ARGISNULL(4) && max_bytes < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_bytes must be positive"),
				 errdetail("The value given was " INT64_FORMAT ".", max_bytes),
				 errhint("Give NULL for no limit.")));
	idem_check_writable("idem_outbox_lease()");

	InitMaterializedSRF(fcinfo, 0);
	outbox_check_message_type(rsinfo->setDesc);

	callcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_outbox_lease",
									ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(callcxt);

	store = outbox_keys_open();
	outbox_open(&r, RowExclusiveLock);

	arg.mode = LEASE_TAKE;
	arg.rels = &r;
	arg.relay = relay;
	arg.lease = lease;
	arg.per_key = per_key;
	arg.max_bytes = max_bytes;
	arg.bytes = 0;
	arg.key_bytes = 0;
	arg.nrun = 0;
	arg.run = NULL;
	arg.run_tids = NULL;
	arg.runcxt = AllocSetContextCreate(callcxt, "idem_outbox_lease run",
									   ALLOCSET_DEFAULT_SIZES);
	if (per_key > 1)
	{
		int			most = Min(per_key, max_messages) - 1;

		arg.run = palloc(sizeof(HeapTuple) * Max(most, 1));
		arg.run_tids = palloc(sizeof(ItemPointerData) * Max(most, 1));
	}
	/* idle since an earlier call: this look is the last one */
	if (outbox_relay_is_idle())
		outbox_wake_owe();
	nleased = lease_pass(store, &r, rsinfo, &arg, max_messages, &topics);
	if (nleased == 0 && !outbox_relay_is_idle())
	{
		/* idle from now on, then a last look: see "Waking relays" */
		outbox_set_relay_idle(true);
		if (outbox_relay_is_idle())
			outbox_wake_owe();
		nleased = lease_pass(store, &r, rsinfo, &arg, max_messages, &topics);
	}
	if (nleased > 0)
		outbox_set_relay_idle(false);

	outbox_close(&r);
	idem_store_close(store);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(callcxt);
	return (Datum) 0;
}

/*
 * Whether the key row's columns may make its head dead now without a lease
 * having said so: a count at the topic's maximum, kept counts, a run's
 * messages at their first attempt with a maximum of 1, or a nack's mark.
 * A head with none of these has had at most the row's attempts, or one.
 */
static bool
dead_heads_candidate(Datum *v, bool *n, OutboxTopic *topic)
{
	if (DatumGetBool(v[OK_DEAD]))
		return false;
	return DatumGetInt32(v[OK_ATTEMPTS]) >= topic->max_attempts ||
		!n[OK_ATTEMPTS_KEPT] || !n[OK_DEAD_KEPT] ||
		(!n[OK_LEASED_THROUGH] && topic->max_attempts <= 1);
}

/* Whether the key (topic, key) has a message of this seq, as it stands now. */
static bool
outbox_key_has_seq(OutboxRels *r, text *topic, text *key, int64 seq)
{
	ScanKeyData skeys[2];
	pg_uuid_t	lo;
	pg_uuid_t	hi;
	IndexScanDesc scan;
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	bool		found = false;

	outbox_key_range(skeys, &lo, &hi, outbox_key_hash(topic, key));
	scan = index_beginscan(r->rel, r->pkey, snap, 2, 0);
	index_rescan(scan, skeys, 2, NULL, 0);
	while (!found && index_getnext_slot(scan, ForwardScanDirection, r->slot))
	{
		slot_getallattrs(r->slot);
		found = DatumGetInt64(r->slot->tts_values[OB_SEQ]) == seq &&
			outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_TOPIC]), topic) &&
			outbox_text_eq(DatumGetTextPP(r->slot->tts_values[OB_KEY]), key);
	}
	index_endscan(scan);
	ExecClearTuple(r->slot);
	UnregisterSnapshot(snap);
	return found;
}

/* A key a redrive or a look visits: its topic and key, and their hash. */
typedef struct DeadHeadsKey
{
	int64		hash;
	text	   *topic;
	text	   *key;
} DeadHeadsKey;

static int
dead_heads_key_cmp(const void *a, const void *b)
{
	const DeadHeadsKey *x = a;
	const DeadHeadsKey *y = b;

	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	return 0;
}

/*
 * The keys (of a topic, of a key, or all) whose rows, as the transaction's
 * snapshot has them, are dead, keep a message a nack made dead (only for a
 * redrive), or may have a head dead without a lease having said so; in the
 * order of their hashes, which is the order in which an ack locks the rows
 * of its keys.
 */
static DeadHeadsKey *
dead_heads_keys(IdemStore *store, LOCKMODE lockmode, text *topic, text *key,
				bool redrive, OutboxTopicCache *topics, int *nkeys)
{
	DeadHeadsKey *keys;
	int			n = 0;
	int			size = 16;
	Relation	keys_rel;
	TupleTableSlot *kslot;
	TableScanDesc scan;

	keys = palloc(sizeof(DeadHeadsKey) * size);
	if (topic != NULL && key != NULL)
	{
		keys[0].hash = outbox_key_hash(topic, key);
		keys[0].topic = topic;
		keys[0].key = key;
		*nkeys = 1;
		return keys;
	}
	keys_rel = table_open(outbox_keys_relid, lockmode);
	kslot = table_slot_create(keys_rel, NULL);
	scan = table_beginscan(keys_rel, GetActiveSnapshot(), 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, kslot))
	{
		Datum	   *v;
		bool	   *nl;
		text	   *ktopic;

		CHECK_FOR_INTERRUPTS();
		slot_getallattrs(kslot);
		v = kslot->tts_values;
		nl = kslot->tts_isnull;
		ktopic = DatumGetTextPP(v[OK_TOPIC]);
		if (topic != NULL && !outbox_text_eq(ktopic, topic))
			continue;
		if (!(redrive && (DatumGetBool(v[OK_DEAD]) || !nl[OK_DEAD_KEPT])) &&
			!dead_heads_candidate(v, nl, outbox_topic(topics, ktopic)))
			continue;
		if (n == size)
		{
			size *= 2;
			keys = repalloc_huge(keys, sizeof(DeadHeadsKey) * size);
		}
		keys[n].topic = DatumGetTextPCopy(v[OK_TOPIC]);
		keys[n].key = DatumGetTextPCopy(v[OK_KEY]);
		keys[n].hash = outbox_key_hash(keys[n].topic, keys[n].key);
		n++;
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(kslot);
	table_close(keys_rel, NoLock);
	qsort(keys, n, sizeof(DeadHeadsKey), dead_heads_key_cmp);
	*nkeys = n;
	return keys;
}

static LeaseArg *
dead_heads_arg(OutboxRels *r, LeaseMode mode, MemoryContext cxt)
{
	LeaseArg   *arg = palloc0(sizeof(LeaseArg));

	arg->mode = mode;
	arg->rels = r;
	arg->per_key = 1;
	arg->budget = 1;
	arg->runcxt = AllocSetContextCreate(cxt, "idem outbox key",
										ALLOCSET_DEFAULT_SIZES);
	return arg;
}

/*
 * idem._outbox_dead_heads(topic, key) returns table (topic, key, id)
 *
 * The heads of keys (of a topic, of a key, or all) that are dead though no
 * lease has marked them so yet: their last lease ran out, their topic's
 * maximum attempts were lowered to their count or below, or a nack of their
 * run made them dead (see nack_key).  Such a death is written when a lease
 * next visits the key, which may be never while every relay is down: this
 * is what idem_outbox_stats counts them by.  The judgement is lease_key's
 * own, on each row's last committed version; nothing is written or locked
 * (the relations are opened with ACCESS SHARE, as a SELECT does), so that
 * a standby judges as its primary would.
 */
PG_FUNCTION_INFO_V1(idem_outbox_dead_heads);
Datum
idem_outbox_dead_heads(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *topic = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	text	   *key = PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1);
	IdemStore  *store;
	OutboxRels	r;
	LeaseArg   *arg;
	OutboxTopicCache topics = OUTBOX_TOPIC_CACHE_INIT;
	DeadHeadsKey *keys;
	int			nkeys;
	int			i;
	MemoryContext callcxt;
	MemoryContext oldcxt;

	InitMaterializedSRF(fcinfo, 0);
	callcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_outbox_dead_heads",
									ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(callcxt);
	store = outbox_keys_open_lock(AccessShareLock);
	outbox_open(&r, AccessShareLock);
	arg = dead_heads_arg(&r, LEASE_JUDGE, callcxt);
	keys = dead_heads_keys(store, AccessShareLock, topic, key, false,
						   &topics, &nkeys);
	for (i = 0; i < nkeys; i++)
	{
		Datum		v[OK_NATTS];
		bool		n[OK_NATTS];

		CHECK_FOR_INTERRUPTS();
		if (!idem_store_read(store, PointerGetDatum(keys[i].topic),
							 PointerGetDatum(keys[i].key), v, n))
			continue;
		arg->topic = outbox_topic(&topics, keys[i].topic);
		if (!dead_heads_candidate(v, n, arg->topic))
			continue;
		arg->now = GetCurrentTimestamp();
		(void) lease_key(idem_store_tupdesc(store), v, n, arg);
		if (arg->died)
		{
			Datum		values[3];
			bool		isnull[3] = {false, false, false};

			values[0] = PointerGetDatum(keys[i].topic);
			values[1] = PointerGetDatum(keys[i].key);
			values[2] = UUIDPGetDatum(&arg->head_id);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
								 values, isnull);
		}
		MemoryContextReset(arg->runcxt);
	}
	outbox_close(&r);
	idem_store_close(store);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(callcxt);
	return (Datum) 0;
}

typedef struct RedriveArg
{
	LeaseArg   *lease;
	TimestampTz now;
	text	   *topic;
	text	   *key;
	int			redriven;		/* messages put back */
	bool		died;			/* a death written here */
} RedriveArg;

/*
 * Called by the store with the latest version of a key row: the death no
 * lease has written yet is written (lease_key, on a copy of the row, which
 * it leaves half changed when it does not write), then the dead head and
 * the message a nack made dead (see nack_key) are put back.
 */
static bool
redrive_key(TupleDesc tupdesc, Datum *values, bool *isnull, void *argp)
{
	RedriveArg *arg = argp;
	bool		changed = false;

	arg->redriven = 0;
	arg->died = false;
	if (!DatumGetBool(values[OK_DEAD]) &&
		dead_heads_candidate(values, isnull, arg->lease->topic))
	{
		Datum		v[OK_NATTS];
		bool		n[OK_NATTS];

		memcpy(v, values, sizeof(v));
		memcpy(n, isnull, sizeof(n));
		arg->lease->now = arg->now;
		if (lease_key(tupdesc, v, n, arg->lease) && arg->lease->died)
		{
			memcpy(values, v, sizeof(v));
			memcpy(isnull, n, sizeof(n));
			arg->died = !arg->lease->died_before;
			changed = true;
		}
	}
	if (!isnull[OK_DEAD_KEPT])
	{
		int64		seq = DatumGetInt64(values[OK_DEAD_KEPT]);

		/* its count starts again: a pair of its seq and 0 */
		if (outbox_key_has_seq(arg->lease->rels, arg->topic, arg->key, seq))
		{
			Datum	   *elems = NULL;
			bool	   *nulls = NULL;
			int			nelems = 0;
			Datum	   *out;
			bool	   *outnulls;
			int			dims[1];
			int			lbs[1] = {1};

			if (!isnull[OK_ATTEMPTS_KEPT])
				deconstruct_array(DatumGetArrayTypeP(values[OK_ATTEMPTS_KEPT]),
								  INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
								  TYPALIGN_DOUBLE, &elems, &nulls, &nelems);
			/* an odd last element (written by hand) is dropped */
			nelems -= nelems % 2;
			out = palloc(sizeof(Datum) * (nelems + 2));
			outnulls = palloc0(sizeof(bool) * (nelems + 2));
			if (nelems > 0)
			{
				memcpy(out, elems, sizeof(Datum) * nelems);
				memcpy(outnulls, nulls, sizeof(bool) * nelems);
			}
			out[nelems] = Int64GetDatum(seq);
			out[nelems + 1] = Int64GetDatum(0);
			dims[0] = nelems + 2;
			values[OK_ATTEMPTS_KEPT] =
				PointerGetDatum(construct_md_array(out, outnulls, 1, dims, lbs,
												   INT8OID, sizeof(int64),
												   FLOAT8PASSBYVAL,
												   TYPALIGN_DOUBLE));
			isnull[OK_ATTEMPTS_KEPT] = false;
			arg->redriven++;
		}
		isnull[OK_DEAD_KEPT] = true;
		isnull[OK_ERROR_KEPT] = true;
		changed = true;
	}
	if (DatumGetBool(values[OK_DEAD]))
	{
		/* back to pending, its count (and its run's) from the start */
		values[OK_DEAD] = BoolGetDatum(false);
		values[OK_ATTEMPTS] = Int32GetDatum(0);
		values[OK_AVAILABLE_AT] = TimestampTzGetDatum(arg->now);
		isnull[OK_LEASED_BY] = true;
		isnull[OK_LEASED_THROUGH] = true;
		arg->redriven++;
		changed = true;
	}
	return changed;
}

/*
 * idem._outbox_redrive(topic, key) returns bigint
 *
 * What idem_outbox_redrive does, once its arguments are checked: the dead
 * messages of keys (of a topic, of a key, or all) back to pending, their
 * deaths that no lease has written yet included.  The key rows are visited
 * in the order of their keys' hashes, the order in which an ack (of one
 * call) locks them, and waited for: a redrive and an ack, or two redrives,
 * cannot deadlock.  A head is locked only when its death is written.
 * Returns how many messages were put back.
 */
PG_FUNCTION_INFO_V1(idem_outbox_redrive_keys);
Datum
idem_outbox_redrive_keys(PG_FUNCTION_ARGS)
{
	text	   *topic = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	text	   *key = PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1);
	IdemStore  *store;
	OutboxRels	r;
	RedriveArg	arg;
	OutboxTopicCache topics = OUTBOX_TOPIC_CACHE_INIT;
	DeadHeadsKey *keys;
	int			nkeys;
	int			i;
	int64		redriven = 0;
	MemoryContext callcxt;
	MemoryContext oldcxt;

	idem_check_writable("idem_outbox_redrive()");
	callcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_outbox_redrive",
									ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(callcxt);
	store = outbox_keys_open();
	/* under REPEATABLE READ, a row written since the snapshot is 40001 */
	idem_store_require_snapshot(store);
	outbox_open(&r, RowExclusiveLock);
	arg.lease = dead_heads_arg(&r, LEASE_MARK, callcxt);
	arg.now = GetCurrentTimestamp();
	keys = dead_heads_keys(store, RowExclusiveLock, topic, key, true,
						   &topics, &nkeys);
	for (i = 0; i < nkeys; i++)
	{
		CHECK_FOR_INTERRUPTS();
		arg.lease->topic = outbox_topic(&topics, keys[i].topic);
		arg.topic = keys[i].topic;
		arg.key = keys[i].key;
		if (idem_store_update(store, PointerGetDatum(keys[i].topic),
							  PointerGetDatum(keys[i].key), redrive_key,
							  &arg) == IDEM_UPDATE_DONE)
		{
			redriven += arg.redriven;
			if (arg.died)
				idem_stat_count_text(IDEM_KIND_OUTBOX, keys[i].topic,
									 IDEM_OUTBOX_DEAD, 1);
		}
		MemoryContextReset(arg.lease->runcxt);
	}
	outbox_close(&r);
	idem_store_close(store);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(callcxt);
	PG_RETURN_INT64(redriven);
}
