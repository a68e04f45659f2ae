#!/usr/bin/env python3
"""JetStream administration for t/092_relay_nats.pl, over the NATS protocol
(the client of examples/consumer_nats.py):

    nats_js.py HOST:PORT stream-create NAME SUBJECT DUPLICATE_WINDOW_SECONDS [MAX_MSGS [MAX_MSG_SIZE]]
                                               (with MAX_MSGS, a full stream
                                               refuses new messages; -1: no
                                               limit; with MAX_MSG_SIZE, it
                                               refuses larger messages)
    nats_js.py HOST:PORT stream-info NAME      the stream's state, JSON
    nats_js.py HOST:PORT stream-dump NAME      one JSON line per stored message:
                                               seq, msg_id, headers, payload
    nats_js.py HOST:PORT consumer-info STREAM DURABLE
                                               the durable consumer's info, JSON
    nats_js.py HOST:PORT publish SUBJECT PAYLOAD
                                               PAYLOAD published without
                                               headers; the stream's answer
    nats_js.py HOST:PORT publish-headers SUBJECT PAYLOAD [NAME HEXVALUE]...
                                               with those headers (their
                                               values in hex: any bytes)
    nats_js.py HOST:PORT publish-raw SUBJECT HEADERSHEX PAYLOADHEX
                                               with that header block and
                                               payload, in hex, as they are

HOST:PORT may be USER:PASSWORD@HOST:PORT or TOKEN@HOST:PORT, for a server
that requires them.
"""

import base64
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'examples'))
from consumer_nats import Nats, parse_headers  # noqa: E402


def main():
    creds, _, address = sys.argv[1].rpartition('@')
    host, port = address.rsplit(':', 1)
    auth = None
    if ':' in creds:
        user, password = creds.split(':', 1)
        auth = {'user': user, 'pass': password}
    elif creds:
        auth = {'auth_token': creds}
    cmd, args = sys.argv[2], sys.argv[3:]
    nc = Nats(host, port, name='nats_js.py', auth=auth)
    if cmd == 'stream-create':
        name, subject, window = args[:3]
        config = {'name': name, 'subjects': [subject], 'storage': 'file', 'retention': 'limits',
                  'duplicate_window': int(float(window) * 1e9)}
        if len(args) > 3:
            config.update({'max_msgs': int(args[3]), 'discard': 'new'})
        if len(args) > 4:
            config.update({'max_msg_size': int(args[4])})
        print(json.dumps(nc.js_api('$JS.API.STREAM.CREATE.' + name, config)))
    elif cmd == 'stream-info':
        print(json.dumps(nc.js_api('$JS.API.STREAM.INFO.' + args[0], None)['state']))
    elif cmd == 'stream-dump':
        name = args[0]
        state = nc.js_api('$JS.API.STREAM.INFO.' + name, None)['state']
        for seq in range(state['first_seq'], state['last_seq'] + 1):
            m = nc.js_api('$JS.API.STREAM.MSG.GET.' + name, {'seq': seq})['message']
            _, headers = parse_headers(base64.b64decode(m.get('hdrs', '')))
            print(json.dumps({'seq': m['seq'], 'subject': m['subject'],
                              'msg_id': headers.get('Nats-Msg-Id'), 'headers': headers,
                              'payload': json.loads(base64.b64decode(m.get('data', '')) or 'null')}))
    elif cmd == 'consumer-info':
        print(json.dumps(nc.js_api('$JS.API.CONSUMER.INFO.%s.%s' % tuple(args), None)))
    elif cmd == 'publish':
        op = nc.request(args[0], args[1].encode())
        print(op[5].decode())
    elif cmd in ('publish-headers', 'publish-raw'):
        if cmd == 'publish-raw':
            subject, head, payload = args[0], bytes.fromhex(args[1]), bytes.fromhex(args[2])
        else:
            subject, payload, pairs = args[0], args[1].encode(), args[2:]
            head = b'NATS/1.0\r\n' + b''.join(pairs[i].encode() + b': ' + bytes.fromhex(pairs[i + 1]) + b'\r\n'
                                               for i in range(0, len(pairs), 2)) + b'\r\n'
        nc.next += 1
        reply = '%s.%d' % (nc.inbox, nc.next)
        nc._send(('HPUB %s %s %d %d\r\n' % (subject, reply, len(head), len(head) + len(payload))).encode()
                 + head + payload + b'\r\n')
        while True:
            op = nc._op(5.0)
            if op[0] == 'MSG' and op[1] == reply:
                break
        print(op[5].decode())
    else:
        sys.exit('unknown command ' + cmd)
    nc.close()


if __name__ == '__main__':
    main()
