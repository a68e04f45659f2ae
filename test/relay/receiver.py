#!/usr/bin/env python3
"""A webhook receiver for the tests of idem-relay.

    receiver.py PORTFILE LOGFILE

Listens on 127.0.0.1 on a free port, which it writes to PORTFILE once it
accepts connections.  Every POST is logged to LOGFILE as one JSON line,
written before the answer is sent (so a request the relay was killed in the
middle of is logged too):

    {"path", "idempotency_key", "topic", "key", "type", "attempt",
     "headers", "content_type", "authorization", "x_empty", "body", "n",
     "reply"}

where topic, key and type are the X-Idem-* headers as sent
(percent-encoded), body the JSON received, n how many requests with the
same Idempotency-Key came before this one, and reply the rule applied.

The answer is chosen by the payload: its "reply" member, when there is
one, is a list of rules, the n-th for the n-th request of the message (the
last one once the list is used up); without it the answer is 200.  A rule
is a status code followed by options:

    "200"               200
    "500 ra=0"          500 with "Retry-After: 0"
    "503 date=+7200"    503 with Retry-After an HTTP date two hours ahead
    "200 sleep=2"       wait 2 seconds, then 200
    "503 early=3600"    first "103 Early Hints" with "Retry-After: 3600",
                        then 503 without one
    "200 stall=3"       200 with a Content-Length 100 bytes longer than the
                        body sent, and the connection left open 3 seconds
    "200 cut"           the same, but the connection is closed at once
"""

import email.utils
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port_file, log_file = sys.argv[1], sys.argv[2]
lock = threading.Lock()
seen = {}
log = open(log_file, "a", encoding="utf-8")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
        idem_key = self.headers.get("Idempotency-Key")
        rules = ["200"]
        if isinstance(body, dict) and isinstance(body.get("reply"), list) and body["reply"]:
            rules = body["reply"]
        with lock:
            n = seen.get(idem_key, 0)
            seen[idem_key] = n + 1
            rule = rules[min(n, len(rules) - 1)]
            entry = {
                "path": self.path,
                "idempotency_key": idem_key,
                "topic": self.headers.get("X-Idem-Topic"),
                "key": self.headers.get("X-Idem-Key"),
                "type": self.headers.get("X-Idem-Type"),
                "attempt": self.headers.get("X-Idem-Attempt"),
                "headers": self.headers.get("X-Idem-Headers"),
                "content_type": self.headers.get("Content-Type"),
                "authorization": self.headers.get("Authorization"),
                "x_empty": self.headers.get("X-Empty"),
                "body": body,
                "n": n,
                "reply": rule,
            }
            log.write(json.dumps(entry) + "\n")
            log.flush()

        words = rule.split()
        status = int(words[0])
        extra = []
        early = None
        stall = None
        for opt in words[1:]:
            name, _, value = opt.partition("=")
            if name == "ra":
                extra.append(("Retry-After", value))
            elif name == "date":
                when = time.time() + int(value)
                extra.append(("Retry-After", email.utils.formatdate(when, usegmt=True)))
            elif name == "sleep":
                time.sleep(float(value))
            elif name == "early":
                early = value
            elif name == "stall":
                stall = float(value)
            elif name == "cut":
                stall = 0
        answer = json.dumps({"status": status}).encode()
        try:
            if early is not None:
                self.send_response_only(103)
                self.send_header("Retry-After", early)
                self.end_headers()
            self.send_response(status)
            for name, value in extra:
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            length = len(answer) + (100 if stall is not None else 0)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(answer)
            if stall is not None:
                # the rest of the body never comes
                self.wfile.flush()
                time.sleep(stall)
                self.close_connection = True
        except OSError:
            pass                # the relay went away


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
