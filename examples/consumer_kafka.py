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
"""

import argparse
import os
import signal
import sys

from confluent_kafka import Consumer, KafkaError, KafkaException


def apply(cur, msg_id, key, payload, consumer):
    """The business write, in the transaction of the claim."""
    cur.execute('INSERT INTO applied (msg_id, key, payload, consumer) VALUES (%s, %s, %s, %s)',
                (msg_id, key, payload.decode('utf-8'), consumer))


def log(name, text):
    print('%s %s' % (name, text), flush=True)


def header(msg, name):
    for k, v in msg.headers() or []:
        if k == name:
            return v.decode('utf-8') if v is not None else None
    return None


def main():
    import psycopg2

    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--dsn', default='', help='libpq connection string (default: the PG* environment)')
    ap.add_argument('--brokers', required=True, help='bootstrap.servers')
    ap.add_argument('--topic', required=True)
    ap.add_argument('--group', required=True, help='the consumer group, shared by the workers')
    ap.add_argument('--name', default='consumer-%d' % os.getpid())
    ap.add_argument('--namespace', default='kafka', help="idem_claim's namespace")
    ap.add_argument('--session-timeout', type=int, default=10000, metavar='MS',
                    help='session.timeout.ms: how soon a dead consumer\'s partitions move')
    ap.add_argument('--die-after-commit', type=int, default=0, metavar='N',
                    help='for tests: exit with 3 after the Nth commit, before its offset commit')
    args = ap.parse_args()

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    db = psycopg2.connect(args.dsn)
    consumer = Consumer({
        'bootstrap.servers': args.brokers,
        'group.id': args.group,
        'client.id': args.name,
        'enable.auto.commit': False,         # the offset is committed after the business commit
        'enable.auto.offset.store': False,
        'auto.offset.reset': 'earliest',     # a new group reads the topic from its start
        'session.timeout.ms': args.session_timeout,
        'heartbeat.interval.ms': max(args.session_timeout // 5, 100),
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
        key = msg.key().decode('utf-8') if msg.key() is not None else ''
        if msg_id is None:
            # not from idem-relay: nothing to deduplicate it by; skipped here
            log(args.name, 'no idem-message-id at %s[%d]@%d' % (msg.topic(), msg.partition(), msg.offset()))
            consumer.commit(message=msg, asynchronous=False)
            continue
        while True:
            try:
                with db:
                    with db.cursor() as cur:
                        cur.execute('SELECT idem_claim(%s, %s)', (msg_id, args.namespace))
                        first = cur.fetchone()[0]
                        if first:
                            apply(cur, msg_id, key, msg.value(), args.name)
                break
            except psycopg2.OperationalError as e:
                # the database went away: the same message again, on a new connection
                log(args.name, 'PostgreSQL: %s; reconnecting' % str(e).strip())
                db.close()
                db = psycopg2.connect(args.dsn)
        log(args.name, '%s %s (partition %d, offset %d)' % (
            'applied' if first else 'duplicate', msg_id, msg.partition(), msg.offset()))
        if first:
            applied += 1
            if applied == args.die_after_commit:
                log(args.name, 'dying after the commit of %s, before its offset commit' % msg_id)
                os._exit(3)
        # after the commit: the next message of the partition, from here on
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException as e:
            # the partition moved to another consumer (a rebalance): it reads
            # this message again, and its claim says duplicate
            log(args.name, 'offset commit failed: %s' % e)
    consumer.close()
    db.close()
    log(args.name, 'stopped: %d applied' % applied)
    return 0


if __name__ == '__main__':
    sys.exit(main())
