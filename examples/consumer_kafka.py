#!/usr/bin/env python3
"""A Kafka consumer of idem's outbox, exactly once (confluent-kafka, psycopg2).

idem-relay's kafka sink produces each outbox message with the outbox key as
the Kafka key (a key's messages share a partition, in order) and the message
id in the header idem-message-id.  This consumer belongs to a consumer group
with automatic offset commits off and, for each message, in one PostgreSQL
transaction:

    SELECT idem_claim(<idem-message-id>, 'kafka');   -- true the first time
    <the business write>                              -- only when it was true
    COMMIT;

and commits the message's offset to Kafka (synchronously) only after that
commit.  A consumer that dies between the two gets the message again (it, or
the consumer that takes its partitions over, starts from the last committed
offset): idem_claim then says false, nothing is written twice, and the offset
is committed.  A partition is read by one consumer of the group at a time,
one message after the other, so a key's messages are applied in order.

Debian's python3-confluent-kafka and python3-psycopg2.

    consumer_kafka.py --dsn 'dbname=shop' --brokers kafka1:9092 \\
        --topic orders --group shop-workers --name worker-1

The business write is apply() below: it inserts the message into a table
"applied" (msg_id text, key text, payload jsonb, consumer text); write yours
in its place.  It stops on SIGTERM or SIGINT (leaving the group);
--die-after-commit N (for tests) exits with 3 right after its Nth
PostgreSQL commit, before the offset commit, without leaving the group.

A lost connection to PostgreSQL (the server restarted, the backend was
terminated) or any other error of the database is retried: the same message
again, on a new connection made with a backoff, its offset not committed.  A
serialization failure or a deadlock (40001, 40P01) is rolled back and tried
again at once.  A business write that fails the same way every time (an
error of SQLSTATE class 22, data exception, or 23, integrity constraint
violation, such as a CHECK the message violates) would stop its partition
for good: it is rolled back, and a new transaction claims the message and
records it in "dead_letters" (msg_id text, key text, error text, sqlstate
text), after which the offset is committed and the partition goes on.

A message without idem-message-id, or whose idem-message-id idem_claim
cannot take, is not from idem-relay and has nothing to deduplicate it by: it
is logged and skipped, its offset committed.  idem_claim cannot take an
idem-message-id that is not UTF-8 or has a NUL character (text has none),
nor one it refuses with an error of SQLSTATE class 22 (over 512 bytes).
--namespace is checked at start-up: idem_claim would refuse an empty one, or
one over 63 bytes, for every message.

A message with an idem-message-id idem_claim takes, but whose key or value
PostgreSQL's text cannot hold (not UTF-8, or with a NUL character), is not
from idem-relay either, and would fail the same way each time: it is
claimed and recorded in dead_letters, without a business write, with
SQLSTATE 22021 (what PostgreSQL says of such bytes) and the key as Python
writes such bytes ('\\xff', '\\x00'), and its offset committed.  A value
that is not JSON (22P02) or a null value (23502: payload is NOT NULL) fails
the business write itself.

A database not in UTF-8 (LATIN1, say) holds fewer characters: an
idem-message-id with a character its encoding has no equivalent of cannot
be claimed, and is skipped as above; a key or a value with one is
dead-lettered with SQLSTATE 22P05, what PostgreSQL says of such a
character, the key written as Python writes it ('\\u20ac'), so that the
dead letter can be stored.  --namespace and --name (written with each
business row) are checked against the database's encoding when it is first
reached: with a character it has no equivalent of, the consumer exits with
status 2, before it processes a message.

While it waits for the database, the consumer does not poll Kafka, so a
rebalance of its group (a consumer joining or leaving) waits for it; after
max.poll.interval.ms (--max-poll-interval, 5 minutes by default) librdkafka
takes it out of the group, and its partitions go to the other consumers,
which may have a database they can reach.  Once this consumer's message is
done, its offset commit fails (it is no longer a member: "Unknown member"),
which is logged and ignored, as any failed offset commit: its next poll
joins the group again, and whoever gets the partition reads the message
again from the last committed offset, a duplicate for idem_claim.
"""

import argparse
import os
import random
import signal
import sys
import time

import psycopg2
from confluent_kafka import Consumer, KafkaError, KafkaException

# SQLSTATE classes of a business write that fails again each time the message
# comes back: 22 data exception, 23 integrity constraint violation
DEAD_CLASSES = ('22', '23')
# a transaction that lost to another one: worth trying again at once
CONFLICTS = ('40001', '40P01')


def apply(cur, msg_id, key, payload, consumer):
    """The business write, in the transaction of the claim: the key and the
    payload as text (the payload None for a null value)."""
    cur.execute('INSERT INTO applied (msg_id, key, payload, consumer) VALUES (%s, %s, %s, %s)',
                (msg_id, key, payload, consumer))


def dead_letter(cur, msg_id, key, error, sqlstate):
    """A message whose business write failed for good, kept for a person."""
    cur.execute('INSERT INTO dead_letters (msg_id, key, error, sqlstate) VALUES (%s, %s, %s, %s)',
                (msg_id, key, error, sqlstate))


def log(name, text):
    print('%s %s' % (name, text), flush=True)


def backoff(failures):
    return min(0.1 * 2 ** failures, 5.0) * random.uniform(0.5, 1.0)


def text(raw, what):
    """RAW (bytes) as text: (text, None), or, when PostgreSQL's text cannot
    hold it (not UTF-8, or with a NUL character), (what Python writes of it,
    (error, SQLSTATE)), the SQLSTATE PostgreSQL gives such bytes."""
    try:
        value = raw.decode('utf-8')
        error = '%s has a NUL character' % what if '\x00' in value else None
    except UnicodeDecodeError:
        value = raw.decode('utf-8', 'backslashreplace')
        error = '%s is not UTF-8' % what
    if error is None:
        return value, None
    return value.replace('\x00', '\\x00'), (error, '22021')


def encodable(db, value):
    """VALUE (text) as the connection and the database can take it: (VALUE,
    None), or, when a character of it has no equivalent in the encoding of
    either (a database not in UTF-8, such as LATIN1: psycopg2 would raise
    UnicodeEncodeError, PostgreSQL 22P05), (VALUE with such characters
    written as Python writes them ('\\u20ac'), the name of that encoding)."""
    names = [db.encoding]
    server = db.info.parameter_status('server_encoding')
    # the server converts from the connection's encoding to the database's,
    # but for SQL_ASCII, which takes any bytes
    if server not in (None, db.encoding, 'SQL_ASCII'):
        names.append(server)
    missing = None
    for name in names:
        codec = psycopg2.extensions.encodings.get(name)
        if codec is None:
            continue
        escaped = value.encode(codec, 'backslashreplace').decode(codec)
        if escaped != value:
            value, missing = escaped, missing or name
    return value, missing


def check_names(db, args):
    """Exits with status 2 when --namespace or --name has a character the
    database's encoding has no equivalent of: idem_claim, or the business
    write, would fail the same way for every message."""
    for option, value in (('--namespace', args.namespace), ('--name', args.name)):
        missing = encodable(db, value)[1]
        if missing:
            sys.stderr.write('%s: error: %s has a character with no equivalent in %s\n'
                             % (os.path.basename(sys.argv[0]), option, missing))
            sys.exit(2)


def process(db, msg_id, key, payload, args, unfit=None):
    """idem_claim and the business write in one transaction: 'applied', or
    'duplicate' when the message was claimed before.  A business write that
    fails for good is rolled back and the message dead-lettered: 'dead'; a
    message UNFIT for it (error, SQLSTATE) is dead-lettered in its place, as
    is one whose key or payload the database's encoding cannot hold.  An id
    idem_claim refuses (SQLSTATE class 22) is rolled back, nothing written:
    'refused', a message without an id; so is, before anything is sent, an
    id the database's encoding cannot hold.  Other errors are raised."""
    # A database not in UTF-8 holds fewer characters: an id it cannot hold
    # cannot be claimed (written as Python writes it, two ids could become
    # one); a key or a payload it cannot hold is dead-lettered, its key
    # written so that the dead letter can be stored.
    missing = encodable(db, msg_id)[1]
    if missing:
        log(args.name, 'idem_claim cannot take an idem-message-id with a character with no equivalent '
            'in %s' % missing)
        return 'refused'
    key, missing = encodable(db, key)
    if missing and not unfit:
        unfit = ('the key has a character with no equivalent in %s' % missing, '22P05')
    if not unfit and payload is not None:
        missing = encodable(db, payload)[1]
        if missing:
            unfit = ('the value has a character with no equivalent in %s' % missing, '22P05')
    while True:
        claimed = False
        try:
            with db.cursor() as cur:
                cur.execute('SELECT idem_claim(%s, %s)', (msg_id, args.namespace))
                first = cur.fetchone()[0]
                claimed = True
                if first and unfit:
                    dead_letter(cur, msg_id, key, *unfit)
                elif first:
                    apply(cur, msg_id, key, payload, args.name)
            db.commit()
            if first and unfit:
                log(args.name, 'dead letter %s: %s (SQLSTATE %s)' % (msg_id, *unfit))
                return 'dead'
            return 'applied' if first else 'duplicate'
        except psycopg2.Error as e:
            if db.closed:
                raise
            db.rollback()
            sqlstate = e.pgcode or ''
            if sqlstate in CONFLICTS:
                log(args.name, 'PostgreSQL: %s; trying %s again' % (sqlstate, msg_id))
                continue
            if not claimed and sqlstate[:2] == '22':
                # the claim itself refuses the id (the namespace was checked
                # at start-up): it would refuse it again each time, and a
                # dead letter needs the claim too
                error = e.diag.message_primary or str(e).strip()
                log(args.name, 'idem_claim refuses an idem-message-id: %s (SQLSTATE %s)' % (error, sqlstate))
                return 'refused'
            if sqlstate[:2] not in DEAD_CLASSES:
                raise
            error = e.diag.message_primary or str(e).strip()
            break
    # The claim too, in a new transaction: the message, read again, is a
    # duplicate, not a second dead letter.
    with db.cursor() as cur:
        cur.execute('SELECT idem_claim(%s, %s)', (msg_id, args.namespace))
        first = cur.fetchone()[0]
        if first:
            dead_letter(cur, msg_id, key, error, sqlstate)
    db.commit()
    if first:
        log(args.name, 'dead letter %s: %s (SQLSTATE %s)' % (msg_id, error, sqlstate))
    return 'dead' if first else 'duplicate'


def header(msg, name):
    """The first value of the header NAME: text, bytes if it is not UTF-8, or
    None."""
    for k, v in msg.headers() or []:
        if k == name:
            try:
                return v.decode('utf-8') if v is not None else None
            except UnicodeDecodeError:
                return v
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--dsn', default='', help='libpq connection string (default: the PG* environment)')
    ap.add_argument('--brokers', required=True, help='bootstrap.servers')
    ap.add_argument('--topic', required=True)
    ap.add_argument('--group', required=True, help='the consumer group, shared by the workers')
    ap.add_argument('--name', default='consumer-%d' % os.getpid())
    ap.add_argument('--namespace', default='kafka', help="idem_claim's namespace")
    ap.add_argument('--session-timeout', type=int, default=10000, metavar='MS',
                    help='session.timeout.ms: how soon a dead consumer\'s partitions move')
    ap.add_argument('--max-poll-interval', type=int, default=300000, metavar='MS',
                    help='max.poll.interval.ms: how long a message may wait for the database '
                         'before this consumer leaves its group (at least --session-timeout)')
    ap.add_argument('--die-after-commit', type=int, default=0, metavar='N',
                    help='for tests: exit with 3 after the Nth commit, before its offset commit')
    args = ap.parse_args()
    # idem_claim would refuse such a namespace for every message
    if not 0 < len(args.namespace.encode('utf-8')) <= 63:
        ap.error('--namespace must be 1 to 63 bytes long')
    if args.max_poll_interval < args.session_timeout:
        ap.error('--max-poll-interval must be at least --session-timeout')

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    db = None
    consumer = Consumer({
        'bootstrap.servers': args.brokers,
        'group.id': args.group,
        'client.id': args.name,
        'enable.auto.commit': False,         # the offset is committed after the business commit
        'enable.auto.offset.store': False,
        'auto.offset.reset': 'earliest',     # a new group reads the topic from its start
        'session.timeout.ms': args.session_timeout,
        'heartbeat.interval.ms': max(args.session_timeout // 5, 100),
        'max.poll.interval.ms': args.max_poll_interval,
    })
    consumer.subscribe([args.topic], on_assign=lambda c, parts: log(
        args.name, 'assigned %s' % ','.join(str(p.partition) for p in parts)))
    log(args.name, 'connected')
    applied = 0
    while not stopping:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() != KafkaError._PARTITION_EOF:
                log(args.name, 'Kafka: %s' % msg.error())
            continue
        msg_id = header(msg, 'idem-message-id')
        # a key or a value PostgreSQL's text cannot hold: dead-lettered
        key, unfit = text(msg.key() or b'', 'the key')
        payload = None
        if msg.value() is not None:
            payload, unfit_value = text(msg.value(), 'the value')
            unfit = unfit or unfit_value
        # none, not UTF-8 (header() gives it as bytes), or with a NUL (text
        # has none): nothing idem_claim can take
        result = 'no id' if not isinstance(msg_id, str) or not msg_id or '\x00' in msg_id else None
        failures = 0
        while result is None and not stopping:
            try:
                if db is None:
                    db = psycopg2.connect(args.dsn)
                    check_names(db, args)
                result = process(db, msg_id, key, payload, args, unfit)
            except psycopg2.Error as e:
                # the connection lost (the server restarted, the backend was
                # terminated), or another error: the same message again on a
                # new connection, after a backoff (a database that is still
                # down fails the connect), its offset not committed
                failures += 1
                log(args.name, 'PostgreSQL: %s; reconnecting' % (' '.join(str(e).split()) or type(e).__name__))
                if db is not None:
                    db.close()
                db = None
                time.sleep(backoff(failures))
        if result is None:
            break       # stopping, the message not done: read again after a restart
        if result in ('no id', 'refused'):
            # not from idem-relay: nothing to deduplicate it by; skipped
            if msg_id is None:
                log(args.name, 'no idem-message-id at %s[%d]@%d: skipped' % (
                    msg.topic(), msg.partition(), msg.offset()))
            else:
                log(args.name, 'an idem-message-id idem_claim cannot take (%.80r) at %s[%d]@%d: skipped' % (
                    msg_id, msg.topic(), msg.partition(), msg.offset()))
        else:
            log(args.name, '%s %s (partition %d, offset %d)' % (
                result, msg_id, msg.partition(), msg.offset()))
            if result == 'applied':
                applied += 1
                if applied == args.die_after_commit:
                    log(args.name, 'dying after the commit of %s, before its offset commit' % msg_id)
                    os._exit(3)
        # after the commit (or the skip): the next message of the partition,
        # from here on
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException as e:
            # the partition moved to another consumer (a rebalance), or this
            # one left its group while it waited for the database longer
            # than max.poll.interval.ms (it joins again at its next poll):
            # whoever reads the partition reads this message again, and its
            # claim says duplicate (one without an id is skipped again)
            log(args.name, 'offset commit failed: %s' % e)
    consumer.close()
    if db is not None:
        db.close()
    log(args.name, 'stopped: %d applied' % applied)
    return 0


if __name__ == '__main__':
    sys.exit(main())
