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

Any other error of the database is retried the same way: the connection to
the broker is closed, and the unacknowledged deliveries come back.  A
serialization failure or a deadlock (40001, 40P01) is rolled back and tried
again at once.  A business write that fails the same way every time (an error
of SQLSTATE class 22, data exception, or 23, integrity constraint violation,
such as a CHECK the message violates) would come back forever and hold the
queue up: it is rolled back, and a new transaction claims the message and
records it in dead_letters, after which the delivery is acknowledged:

    CREATE TABLE dead_letters (
        message_id text NOT NULL,          -- text: a bad id is kept too
        key        text NOT NULL,
        error      text NOT NULL,
        sqlstate   text NOT NULL
    );

A delivery whose message_id idem_claim cannot take is not from idem-relay
and has nothing to deduplicate it by: it is logged and rejected without
requeue (to the queue's dead-letter exchange, if a policy gives it one),
never delivered again.  idem_claim cannot take a message_id that is
missing or empty, not UTF-8 (pika gives it as bytes) or with a NUL
character (text has none), nor one it refuses with an error of SQLSTATE
class 22 (one over 512 bytes would be, but AMQP's message_id holds at most
255).  A delivery without x-idem-key has an empty key, as a message without
a key has in the other example consumers: its message_id deduplicates it.
--namespace is checked at start-up: idem_claim would refuse an empty one,
or one over 63 bytes, for every message.

A delivery with a message_id idem_claim takes, but whose x-idem-key or body
PostgreSQL's text cannot hold, is not from idem-relay either, and would fail
the same way each time: it is claimed and recorded in dead_letters, without
a business write, and acknowledged.  Its SQLSTATE is 22021, what
PostgreSQL says of bytes that are not UTF-8 (pika gives such an x-idem-key
as bytes) or of a NUL character, or 42804 (datatype mismatch) for an
x-idem-key that is not a string (a number, a table, an array), as
idem-relay's is; its key is written as Python
writes such a value ('\\xff', '\\x00', repr()).  A body that is not JSON
(22P02) fails the business write itself.

A database not in UTF-8 (LATIN1, say) holds fewer characters: a message_id
with a character its encoding has no equivalent of cannot be claimed, and
is rejected as above; an x-idem-key or a body with one is dead-lettered
with SQLSTATE 22P05, what PostgreSQL says of such a character, the key
written as Python writes it ('\\u20ac'), so that the dead letter can be
stored.  --namespace and --name (written with each business row) are checked
against the database's encoding when it is first reached: with a character
it has no equivalent of, the consumer exits with status 2, before it
processes a message.
"""

import argparse
import os
import random
import signal
import sys
import time

import pika
import psycopg2

stopping = False

# SQLSTATE classes of a business write that fails again each time the message
# comes back: 22 data exception, 23 integrity constraint violation
DEAD_CLASSES = ("22", "23")
# a transaction that lost to another one: worth trying again at once
CONFLICTS = ("40001", "40P01")


def on_signal(signo, frame):
    global stopping
    stopping = True


def log(name, msg):
    print(f"{name}: {msg}", flush=True)


def backoff(failures):
    return min(0.1 * 2 ** failures, 5.0) * random.uniform(0.5, 1.0)


def declare(channel, queue):
    channel.queue_declare(queue=queue, durable=True,
                          arguments={"x-single-active-consumer": True})


def apply(cur, msg_id, key, body, consumer):
    """The business write, in the transaction of the claim: the key and the
    body as text."""
    cur.execute("INSERT INTO order_events (message_id, key, payload, consumer) "
                "VALUES (%s, %s, %s, %s)",
                (msg_id, key, body, consumer))


def dead_letter(cur, msg_id, key, error, sqlstate):
    """A message whose business write failed for good, kept for a person."""
    cur.execute("INSERT INTO dead_letters (message_id, key, error, sqlstate) "
                "VALUES (%s, %s, %s, %s)", (msg_id, key, error, sqlstate))


def text(value, what):
    """VALUE (str, or bytes that pika could not decode) as text: (text, None),
    or, when PostgreSQL's text cannot hold it (not UTF-8, a NUL character,
    not a string), (what Python writes of it, (error, SQLSTATE)), the
    SQLSTATE PostgreSQL gives such a value."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            value = value.decode("utf-8", "backslashreplace")
            return value.replace("\x00", "\\x00"), (f"{what} is not UTF-8", "22021")
    if not isinstance(value, str):
        return repr(value).replace("\x00", "\\x00"), (f"{what} is not a string", "42804")
    if "\x00" in value:
        return value.replace("\x00", "\\x00"), (f"{what} has a NUL character", "22021")
    return value, None


def encodable(db, value):
    """VALUE (text) as the connection and the database can take it: (VALUE,
    None), or, when a character of it has no equivalent in the encoding of
    either (a database not in UTF-8, such as LATIN1: psycopg2 would raise
    UnicodeEncodeError, PostgreSQL 22P05), (VALUE with such characters
    written as Python writes them ('\\u20ac'), the name of that encoding)."""
    names = [db.encoding]
    server = db.info.parameter_status("server_encoding")
    # the server converts from the connection's encoding to the database's,
    # but for SQL_ASCII, which takes any bytes
    if server not in (None, db.encoding, "SQL_ASCII"):
        names.append(server)
    missing = None
    for name in names:
        codec = psycopg2.extensions.encodings.get(name)
        if codec is None:
            continue
        escaped = value.encode(codec, "backslashreplace").decode(codec)
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


def process(db, msg_id, key, body, args, unfit=None):
    """idem_claim and the business write in one transaction: "applied", or
    "duplicate" when the message was claimed before.  A business write that
    fails for good is rolled back and the message dead-lettered: "dead"; a
    message UNFIT for it (error, SQLSTATE) is dead-lettered in its place, as
    is one whose key or body the database's encoding cannot hold.  An id
    idem_claim refuses (SQLSTATE class 22) is rolled back, nothing written:
    "refused", a message without an id; so is, before anything is sent, an
    id the database's encoding cannot hold.  Other errors are raised."""
    # A database not in UTF-8 holds fewer characters: an id it cannot hold
    # cannot be claimed (written as Python writes it, two ids could become
    # one); a key or a body it cannot hold is dead-lettered, its key written
    # so that the dead letter can be stored.
    missing = encodable(db, msg_id)[1]
    if missing:
        log(args.name, "idem_claim cannot take a message_id with a character with no equivalent in "
            + missing)
        return "refused"
    key, missing = encodable(db, key)
    if missing and not unfit:
        unfit = (f"x-idem-key has a character with no equivalent in {missing}", "22P05")
    if not unfit:
        missing = encodable(db, body)[1]
        if missing:
            unfit = (f"the body has a character with no equivalent in {missing}", "22P05")
    while True:
        claimed = False
        try:
            with db.cursor() as cur:
                cur.execute("SELECT idem_claim(%s, %s)", (msg_id, args.namespace))
                first = cur.fetchone()[0]
                claimed = True
                if first and unfit:
                    dead_letter(cur, msg_id, key, *unfit)
                elif first:
                    apply(cur, msg_id, key, body, args.name)
            db.commit()
            if first and unfit:
                log(args.name, f"dead letter {msg_id}: {unfit[0]} (SQLSTATE {unfit[1]})")
                return "dead"
            return "applied" if first else "duplicate"
        except psycopg2.Error as e:
            if db.closed:
                raise
            db.rollback()
            sqlstate = e.pgcode or ""
            if sqlstate in CONFLICTS:
                log(args.name, f"database: {sqlstate}; trying {msg_id} again")
                continue
            if not claimed and sqlstate[:2] == "22":
                # the claim itself refuses the id (the namespace was checked
                # at start-up): it would refuse it again each time, and a
                # dead letter needs the claim too
                error = e.diag.message_primary or str(e).strip()
                log(args.name, f"idem_claim refuses a message_id: {error} (SQLSTATE {sqlstate})")
                return "refused"
            if sqlstate[:2] not in DEAD_CLASSES:
                raise
            error = e.diag.message_primary or str(e).strip()
            break
    # The claim too, in a new transaction: the message, delivered again, is a
    # duplicate, not a second dead letter.
    with db.cursor() as cur:
        cur.execute("SELECT idem_claim(%s, %s)", (msg_id, args.namespace))
        first = cur.fetchone()[0]
        if first:
            dead_letter(cur, msg_id, key, error, sqlstate)
    db.commit()
    if first:
        log(args.name, f"dead letter {msg_id}: {error} (SQLSTATE {sqlstate})")
    return "dead" if first else "duplicate"


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
    # idem_claim would refuse such a namespace for every message
    if not 0 < len(args.namespace.encode("utf-8")) <= 63:
        ap.error("--namespace must be 1 to 63 bytes long")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    params = pika.URLParameters(args.amqp)
    params.heartbeat = 10
    params.blocked_connection_timeout = 10
    db = None
    db_failures = 0
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
                check_names(db, args)
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
                # without x-idem-key, the key is empty, as in the other
                # example consumers: the message_id is what deduplicates
                key = (props.headers or {}).get("x-idem-key", "")
                # a message_id that is not UTF-8 comes as bytes; PostgreSQL's
                # text holds no NUL: nothing idem_claim can take
                if not isinstance(msg_id, str) or not msg_id or "\x00" in msg_id:
                    result = "no id"
                else:
                    # an x-idem-key or a body PostgreSQL's text cannot hold:
                    # dead-lettered
                    key, unfit = text(key, "x-idem-key")
                    body, unfit_body = text(body, "the body")
                    result = process(db, msg_id, key, body, args, unfit or unfit_body)
                    db_failures = 0
                if result in ("no id", "refused"):
                    # not from idem-relay (no message_id idem_claim can
                    # take): nothing to deduplicate it by.  Refused for
                    # good, not requeued to come back forever.
                    log(args.name, f"delivery {method.delivery_tag} without a message_id idem_claim takes "
                        f"({msg_id!r:.80}): rejected")
                    channel.basic_reject(method.delivery_tag, requeue=False)
                    continue
                commits += 1
                log(args.name, f"{result} {msg_id} key {key} redelivered {method.redelivered}")
                if args.die_after_commit and commits >= args.die_after_commit:
                    log(args.name, "dying between commit and ack")
                    os.kill(os.getpid(), signal.SIGKILL)
                channel.basic_ack(method.delivery_tag)
        except (pika.exceptions.AMQPError, OSError) as e:
            log(args.name, f"broker: {type(e).__name__} {e}; reconnecting")
            time.sleep(0.5)
        except psycopg2.Error as e:
            # the connection lost, or another error: the delivery was not
            # acked and comes back (the channel is closed below), to be
            # tried again on a new connection after a backoff
            db_failures += 1
            log(args.name, f"database: {' '.join(str(e).split())}; reconnecting")
            try:
                db.close()
            except Exception:
                pass
            db = None
            time.sleep(backoff(db_failures))
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
