#!/usr/bin/env python3
"""A RabbitMQ consumer that applies each message exactly once (psycopg2, pika).

idem-relay's rabbitmq sink publishes every outbox message at least once, with
the outbox's message id as the AMQP message_id.  This consumer makes the
effect exactly once: for each delivery, in one PostgreSQL transaction, it
claims the message id with idem_claim and, when the claim is new, does the
business write; it acknowledges the delivery only after the commit.  A
consumer that dies after the commit and before the ack gets the message
redelivered (to itself or another consumer), and the claim then says
"already done": the delivery is acknowledged and nothing is written twice.

The business write here records the message in order_events (the table of
the example; put yours in its place):

    CREATE TABLE order_events (
        id         bigserial PRIMARY KEY,  -- the order of application
        message_id uuid NOT NULL,
        key        text NOT NULL,
        payload    jsonb NOT NULL,
        consumer   text NOT NULL
    );

Order per key: the relay publishes a key's next message only after the
broker confirmed the previous one, so a queue holds each key's messages in
order.  Consumers keep that order if one of them at a time takes the queue:
the queue is declared with x-single-active-consumer, and a second consumer
waits as a standby that takes over when the first one goes away (its
unacknowledged deliveries come back first).

    consumer_rabbitmq.py --dsn 'dbname=shop' --amqp amqp://guest:guest@localhost:5672/ \\
                         --queue orders [--name NAME] [--namespace rabbit]

It reconnects to the broker and to the database when either goes away, and
stops on SIGTERM or SIGINT.  --die-after-commit N (for tests) kills the
process with SIGKILL right after its Nth commit, before the ack.
"""

import argparse
import os
import signal
import sys
import time

import pika
import psycopg2

stopping = False


def on_signal(signo, frame):
    global stopping
    stopping = True


def log(name, msg):
    print(f"{name}: {msg}", flush=True)


def declare(channel, queue):
    channel.queue_declare(queue=queue, durable=True,
                          arguments={"x-single-active-consumer": True})


def connect_db(dsn):
    db = psycopg2.connect(dsn)
    db.autocommit = False
    return db


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", required=True, help="libpq connection string")
    ap.add_argument("--amqp", default="amqp://guest:guest@localhost:5672/")
    ap.add_argument("--queue", default="orders")
    ap.add_argument("--namespace", default="rabbit", help="idem_claim's namespace")
    ap.add_argument("--name", default=f"consumer-{os.getpid()}")
    ap.add_argument("--prefetch", type=int, default=10)
    ap.add_argument("--declare-only", action="store_true",
                    help="declare the queue and exit")
    ap.add_argument("--die-after-commit", type=int, default=0, metavar="N")
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    params = pika.URLParameters(args.amqp)
    params.heartbeat = 10
    params.blocked_connection_timeout = 10
    db = None
    commits = 0

    if args.declare_only:
        conn = pika.BlockingConnection(params)
        declare(conn.channel(), args.queue)
        conn.close()
        return 0

    conn = None
    while not stopping:
        try:
            if db is None or db.closed:
                db = connect_db(args.dsn)
            conn = pika.BlockingConnection(params)
            channel = conn.channel()
            declare(channel, args.queue)
            channel.basic_qos(prefetch_count=args.prefetch)
            log(args.name, "connected")
            # inactivity_timeout: wake up now and then to see a SIGTERM
            for method, props, body in channel.consume(args.queue, auto_ack=False,
                                                       inactivity_timeout=0.2):
                if stopping:
                    break
                if method is None:
                    continue
                msg_id = props.message_id
                key = (props.headers or {}).get("x-idem-key")
                if msg_id is None or key is None:
                    # not from idem-relay: refuse it for good
                    channel.basic_reject(method.delivery_tag, requeue=False)
                    continue
                with db.cursor() as cur:
                    cur.execute("SELECT idem_claim(%s, %s)", (msg_id, args.namespace))
                    first = cur.fetchone()[0]
                    if first:
                        cur.execute("INSERT INTO order_events (message_id, key, payload, consumer) "
                                    "VALUES (%s, %s, %s, %s)",
                                    (msg_id, key, body.decode("utf-8"), args.name))
                db.commit()
                commits += 1
                log(args.name, f"{'applied' if first else 'duplicate'} {msg_id} key {key} "
                               f"redelivered {method.redelivered}")
                if args.die_after_commit and commits >= args.die_after_commit:
                    log(args.name, "dying between commit and ack")
                    os.kill(os.getpid(), signal.SIGKILL)
                channel.basic_ack(method.delivery_tag)
        except (pika.exceptions.AMQPError, OSError) as e:
            log(args.name, f"broker: {type(e).__name__} {e}; reconnecting")
            time.sleep(0.5)
        except psycopg2.Error as e:
            # the transaction is gone with the connection: the delivery
            # was not acked and comes back
            log(args.name, f"database: {e}; reconnecting")
            try:
                db.close()
            except Exception:
                pass
            db = None
            time.sleep(0.5)
        finally:
            # unacknowledged deliveries go back to the queue
            if conn is not None and conn.is_open:
                try:
                    conn.close()
                except Exception:
                    pass
            conn = None
    log(args.name, "stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
