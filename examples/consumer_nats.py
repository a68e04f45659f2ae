#!/usr/bin/env python3
"""A consumer of idem's outbox through NATS JetStream, exactly once.

idem-relay publishes each outbox message to JetStream with its id in the
Nats-Msg-Id header.  This consumer pulls from a durable pull consumer with
explicit acks and, for each message, in one PostgreSQL transaction:

    SELECT idem_claim(<Nats-Msg-Id>, 'nats');   -- true the first time
    <the business write>                         -- only when it was true
    COMMIT;

and acknowledges the message (+ACK) only after the commit.  A consumer that
dies between the commit and the ack gets the message again (from JetStream,
after ack_wait, here or in another consumer): idem_claim then says false,
nothing is written twice, and the message is acknowledged.

With max_ack_pending = 1 (the default here), JetStream hands out one message
at a time across every consumer process sharing the durable, so the business
writes happen in the stream's order, which is the outbox's order per key.

Debian's python3-psycopg2 for PostgreSQL; NATS through the minimal client
below, over the socket module (the text protocol: INFO, CONNECT, SUB, PUB,
HMSG, PING/PONG).  No TLS.

    consumer_nats.py --dsn 'dbname=shop' --nats 127.0.0.1:4222 \\
        --stream ORDERS --durable shop-workers --name worker-1

The business write is apply() below: it inserts the message into a table
"applied" (msg_id text, key text, payload jsonb, consumer text); write yours
in its place.

A lost connection to PostgreSQL (the server restarted, the backend was
terminated) or any other error of the database is retried: the same message
again, on a new connection made with a backoff, not acknowledged meanwhile.
A serialization failure or a deadlock (40001, 40P01) is rolled back and
tried again at once.  A business write that fails the same way every time
(an error of SQLSTATE class 22, data exception, or 23, integrity constraint
violation, such as a CHECK the message violates) would be redelivered
forever and, with max_ack_pending 1, hold back every message after it: it is
rolled back, and a new transaction claims the message and records it in
"dead_letters" (msg_id text, key text, error text, sqlstate text), after
which the message is acknowledged.  A message without Nats-Msg-Id, or whose
Nats-Msg-Id idem_claim cannot take, is not from idem-relay and has nothing
to deduplicate it by: it is logged and terminated (+TERM), never
redelivered.  idem_claim cannot take a Nats-Msg-Id that is not UTF-8 or
has a NUL character (text has none), nor one it refuses with an error of
SQLSTATE class 22 (over 512 bytes).  --namespace is checked at start-up:
idem_claim would refuse an empty one, or one over 63 bytes, for every
message.

A message with a Nats-Msg-Id idem_claim takes, but whose key (Idem-Key,
percent-encoded) or payload PostgreSQL's text cannot hold (not UTF-8, or
with a NUL character), is not from idem-relay either, and would fail the
same way each time: it is claimed and recorded in dead_letters, without a
business write, with SQLSTATE 22021 (what PostgreSQL says of such bytes)
and the key as Python writes such bytes ('\\xff', '\\x00'), and
acknowledged.  An Idem-Key header that is not UTF-8 comes with U+FFFD in
place of its bytes (idem-relay's has none: it percent-encodes every byte
but [A-Za-z0-9._~-]).  A payload that is not JSON (22P02) fails the
business write itself.

A database not in UTF-8 (LATIN1, say) holds fewer characters: a Nats-Msg-Id
with a character its encoding has no equivalent of cannot be claimed, and
is terminated as above; an Idem-Key or a payload with one is dead-lettered
with SQLSTATE 22P05, what PostgreSQL says of such a character, the key
written as Python writes it ('\\u20ac'), so that the dead letter can be
stored.  --namespace and --name (written with each business row) are checked
against the database's encoding when it is first reached: with a character
it has no equivalent of, the consumer exits with status 2, before it
processes a message.

The subject of a message is only logged: one that is not UTF-8, which a
stream of wildcard subjects (orders.>) stores as it is given, is written
as Python writes such bytes ('\\xff'), and the message processed as any
other.
"""

import argparse
import json
import os
import random
import signal
import socket
import sys
import time
import urllib.parse

import psycopg2

# SQLSTATE classes of a business write that fails again each time the message
# comes back: 22 data exception, 23 integrity constraint violation
DEAD_CLASSES = ('22', '23')
# a transaction that lost to another one: worth trying again at once
CONFLICTS = ('40001', '40P01')


class NatsError(Exception):
    pass


def parse_headers(raw):
    """b'NATS/1.0 503\\r\\nName: value\\r\\n\\r\\n' -> (status or None, {name: value})."""
    if not raw:
        return None, {}
    lines = raw.decode('utf-8', 'replace').split('\r\n')
    first = lines[0]
    status = first[9:].strip() or None if first.startswith('NATS/1.0') else None
    headers = {}
    for line in lines[1:]:
        if ':' in line:
            name, value = line.split(':', 1)
            headers[name.strip()] = value.strip()
    return status, headers


class Nats:
    """A NATS connection: publish, and request/reply over one inbox."""

    def __init__(self, host, port, timeout=5.0, name='consumer_nats.py', auth=None):
        """auth: the CONNECT fields of a server that requires them, such as
        {'user': ..., 'pass': ...} or {'auth_token': ...}."""
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buf = b''
        self.inbox = '_INBOX.%016x' % random.getrandbits(64)
        self.next = 0
        op = self._op(timeout)
        if op[0] != 'INFO':
            raise NatsError('not a NATS server: %r' % (op,))
        self.info = json.loads(op[1][5:])
        if self.info.get('tls_required'):
            raise NatsError('the server requires TLS, which this client does not speak')
        opts = {'verbose': False, 'pedantic': False, 'headers': True, 'no_responders': True,
                'protocol': 1, 'lang': 'python', 'version': '0', 'name': name}
        opts.update(auth or {})
        self._send(b'CONNECT ' + json.dumps(opts).encode() + b'\r\n'
                   + ('SUB %s.* 1\r\nPING\r\n' % self.inbox).encode())
        while True:
            op = self._op(timeout)
            if op[0] == 'PONG':
                break

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError('no answer from the NATS server')
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError('no answer from the NATS server')
        if not data:
            raise NatsError('the NATS server closed the connection')
        self.buf += data

    def _op(self, timeout):
        """The next operation: ('MSG', subject, reply, status, headers, payload),
        or (verb, line).  Nothing is consumed until it is all there."""
        deadline = time.monotonic() + timeout
        while True:
            end = self.buf.find(b'\r\n')
            if end < 0:
                self._fill(deadline)
                continue
            line = self.buf[:end]
            verb = line.split(b' ', 1)[0].upper()
            if verb in (b'MSG', b'HMSG'):
                f = line.split()
                if verb == b'MSG':
                    reply = f[3] if len(f) == 5 else None
                    hlen, tlen = 0, int(f[-1])
                else:
                    reply = f[3] if len(f) == 6 else None
                    hlen, tlen = int(f[-2]), int(f[-1])
                if len(self.buf) < end + 2 + tlen + 2:
                    self._fill(deadline)
                    continue
                data = self.buf[end + 2:end + 2 + tlen]
                self.buf = self.buf[end + 2 + tlen + 2:]
                status, headers = parse_headers(data[:hlen])
                # a subject not in UTF-8 (a stream of wildcard subjects
                # stores what it is given) as Python writes such bytes
                # ('\\xff'): it is only logged, and compared with the
                # inbox's; a reply subject as it is, to be published to
                return ('MSG', f[1].decode('utf-8', 'backslashreplace'),
                        reply.decode('utf-8', 'surrogateescape') if reply else None,
                        status, headers, data[hlen:])
            self.buf = self.buf[end + 2:]
            if verb == b'PING':
                self._send(b'PONG\r\n')
                continue
            if verb == b'-ERR':
                raise NatsError(line.decode('utf-8', 'replace'))
            if verb == b'+OK':
                continue
            return (verb.decode(), line.decode('utf-8', 'replace'))

    def publish(self, subject, payload=b'', reply=None):
        head = 'PUB %s %s%d\r\n' % (subject, reply + ' ' if reply else '', len(payload))
        self._send(head.encode('utf-8', 'surrogateescape') + payload + b'\r\n')

    def request(self, subject, payload, timeout=5.0, pull=False):
        """Publishes with a reply subject of its own; the first answer.  A
        pull request's answer is a status on that subject, or a message of the
        stream, which keeps its own subject and has an ack subject as reply."""
        self.next += 1
        reply = '%s.%d' % (self.inbox, self.next)
        self.publish(subject, payload, reply)
        deadline = time.monotonic() + timeout
        while True:
            op = self._op(max(deadline - time.monotonic(), 0.001))
            # answers to earlier requests that timed out are dropped (a
            # message of the stream comes again after ack_wait)
            if op[0] == 'MSG' and (op[1] == reply or (pull and op[1] != reply and not op[1].startswith(
                    self.inbox + '.') and (op[2] or '').startswith('$JS.ACK.'))):
                return op

    def js_api(self, subject, obj, timeout=5.0):
        """A JetStream API request; its JSON answer, or NatsError."""
        op = self.request(subject, json.dumps(obj).encode() if obj is not None else b'', timeout)
        if op[3] is not None and op[3].startswith('503'):
            raise NatsError('no JetStream answers %s (503 no responders)' % subject)
        answer = json.loads(op[5] or b'{}')
        if 'error' in answer:
            raise NatsError('%s: %s' % (subject, answer['error'].get('description', answer['error'])))
        return answer


def ensure_consumer(nc, stream, durable, ack_wait, max_ack_pending):
    """The durable pull consumer, created unless it exists."""
    config = {'durable_name': durable, 'ack_policy': 'explicit',
              'ack_wait': int(ack_wait * 1e9), 'max_ack_pending': max_ack_pending,
              'deliver_policy': 'all', 'max_deliver': -1, 'replay_policy': 'instant'}
    try:
        nc.js_api('$JS.API.CONSUMER.INFO.%s.%s' % (stream, durable), None)
    except NatsError:
        nc.js_api('$JS.API.CONSUMER.DURABLE.CREATE.%s.%s' % (stream, durable),
                  {'stream_name': stream, 'config': config})


def apply(cur, msg_id, key, payload, consumer):
    """The business write, in the transaction of the claim: the key and the
    payload as text."""
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
        log(args.name, 'idem_claim cannot take a Nats-Msg-Id with a character with no equivalent in %s'
            % missing)
        return 'refused'
    key, missing = encodable(db, key)
    if missing and not unfit:
        unfit = ('the key has a character with no equivalent in %s' % missing, '22P05')
    if not unfit:
        missing = encodable(db, payload)[1]
        if missing:
            unfit = ('the payload has a character with no equivalent in %s' % missing, '22P05')
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
                log(args.name, 'idem_claim refuses a Nats-Msg-Id: %s (SQLSTATE %s)' % (error, sqlstate))
                return 'refused'
            if sqlstate[:2] not in DEAD_CLASSES:
                raise
            error = e.diag.message_primary or str(e).strip()
            break
    # The claim too, in a new transaction: the message, delivered again, is a
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--dsn', default='', help='libpq connection string (default: the PG* environment)')
    ap.add_argument('--nats', default='127.0.0.1:4222', help='HOST:PORT of the NATS server')
    ap.add_argument('--stream', required=True)
    ap.add_argument('--durable', required=True, help='the durable pull consumer, shared by the workers')
    ap.add_argument('--name', default='consumer-%d' % os.getpid())
    ap.add_argument('--namespace', default='nats', help="idem_claim's namespace")
    ap.add_argument('--ack-wait', type=float, default=30.0, help='seconds before JetStream redelivers')
    ap.add_argument('--max-ack-pending', type=int, default=1)
    ap.add_argument('--die-after-commit', type=int, default=0, metavar='N',
                    help='for tests: exit with 3 after the Nth commit, before its ack')
    args = ap.parse_args()
    # idem_claim would refuse such a namespace for every message
    if not 0 < len(args.namespace.encode('utf-8')) <= 63:
        ap.error('--namespace must be 1 to 63 bytes long')

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    host, port = args.nats.rsplit(':', 1)
    db = None
    next_subject = '$JS.API.CONSUMER.MSG.NEXT.%s.%s' % (args.stream, args.durable)
    nc = None
    failures = 0
    applied = 0
    while not stopping:
        try:
            if nc is None:
                nc = Nats(host, port, name=args.name)
                ensure_consumer(nc, args.stream, args.durable, args.ack_wait, args.max_ack_pending)
                log(args.name, 'connected')
                failures = 0
            # one message, waiting for it at most a second
            op = nc.request(next_subject, b'{"batch": 1, "expires": 1000000000}', timeout=3.0,
                            pull=True)
            _, _, reply, status, headers, payload = op
            if reply is None:
                continue        # a status: 404 no messages, 408 request timeout
            # a message of the stream (its reply subject acknowledges it),
            # even with a status line in its headers, which another
            # publisher may have written there
            msg_id = headers.get('Nats-Msg-Id')
            # a key or a payload PostgreSQL's text cannot hold: dead-lettered
            # (parse_headers put U+FFFD in place of bytes that are not UTF-8)
            key = headers.get('Idem-Key', '')
            if '\ufffd' in key:
                key, unfit = key.replace('\x00', '\\x00'), ('the key is not UTF-8', '22021')
            else:
                key, unfit = text(urllib.parse.unquote_to_bytes(key), 'the key')
            payload, unfit_payload = text(payload, 'the payload')
            unfit = unfit or unfit_payload
            # none, not UTF-8 (parse_headers replaced its bytes with U+FFFD:
            # two ids could become one), or with a NUL (text has none):
            # nothing idem_claim can take
            result = 'no id' if not msg_id or '\x00' in msg_id or '\ufffd' in msg_id else None
            db_failures = 0
            while result is None and not stopping:
                try:
                    if db is None:
                        db = psycopg2.connect(args.dsn)
                        check_names(db, args)
                    result = process(db, msg_id, key, payload, args, unfit)
                except psycopg2.Error as e:
                    # the connection lost (the server restarted, the backend
                    # was terminated), or another error: the same message
                    # again on a new connection, after a backoff (a database
                    # that is still down fails the connect), not acknowledged
                    db_failures += 1
                    log(args.name, 'PostgreSQL: %s; reconnecting' % (' '.join(str(e).split()) or type(e).__name__))
                    if db is not None:
                        db.close()
                    db = None
                    time.sleep(backoff(db_failures))
            if result is None:
                break       # stopping: JetStream delivers it again after ack_wait
            if result in ('no id', 'refused'):
                # not from idem-relay: nothing to deduplicate it by.  Left
                # unacknowledged, it would come back after every ack_wait,
                # and hold back the messages after it.  (The server handles
                # the +TERM before this connection's next pull.)
                if not msg_id:
                    log(args.name, 'no Nats-Msg-Id on a message of %s: terminated' % op[1])
                else:
                    log(args.name, 'a Nats-Msg-Id idem_claim cannot take (%.80r) on a message of %s: '
                        'terminated' % (msg_id, op[1]))
                nc.publish(reply, b'+TERM')
                continue
            log(args.name, '%s %s' % (result, msg_id))
            if result == 'applied':
                applied += 1
                if applied == args.die_after_commit:
                    log(args.name, 'dying after the commit of %s, before its ack' % msg_id)
                    os._exit(3)
            # after the commit; the server confirms the ack (a reply subject)
            nc.request(reply, b'+ACK', timeout=3.0)
        except (OSError, NatsError, TimeoutError) as e:
            failures += 1
            log(args.name, 'NATS: %s; reconnecting' % e)
            if nc is not None:
                nc.close()
            nc = None
            time.sleep(min(0.1 * 2 ** failures, 2.0) * random.uniform(0.5, 1.0))
    if nc is not None:
        nc.close()
    if db is not None:
        db.close()
    log(args.name, 'stopped: %d applied' % applied)


if __name__ == '__main__':
    main()
