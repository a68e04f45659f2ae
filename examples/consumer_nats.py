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
"""

import argparse
import base64
import json
import os
import random
import signal
import socket
import sys
import time
import urllib.parse


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
                return ('MSG', f[1].decode(), reply.decode() if reply else None,
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
        self._send(head.encode() + payload + b'\r\n')

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
    """The business write, in the transaction of the claim."""
    cur.execute('INSERT INTO applied (msg_id, key, payload, consumer) VALUES (%s, %s, %s, %s)',
                (msg_id, key, payload.decode('utf-8'), consumer))


def log(name, text):
    print('%s %s' % (name, text), flush=True)


def main():
    import psycopg2

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

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    host, port = args.nats.rsplit(':', 1)
    db = psycopg2.connect(args.dsn)
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
            if status is not None:
                continue        # 404 no messages, 408 request timeout
            msg_id = headers['Nats-Msg-Id']
            key = urllib.parse.unquote(headers.get('Idem-Key', ''))
            with db:
                with db.cursor() as cur:
                    cur.execute('SELECT idem_claim(%s, %s)', (msg_id, args.namespace))
                    first = cur.fetchone()[0]
                    if first:
                        apply(cur, msg_id, key, payload, args.name)
            log(args.name, '%s %s' % ('applied' if first else 'duplicate', msg_id))
            if first:
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
    db.close()
    log(args.name, 'stopped: %d applied' % applied)


if __name__ == '__main__':
    main()
