#!/usr/bin/env python3
"""An HTTP API made idempotent with idem's request keys and single-use tokens.

Python's standard library (http.server) and psycopg2 only.  Two resources:

  POST /payments     {"amount": 100, "currency": "EUR"}, with an
                     Idempotency-Key header.  In one transaction:
                     idem_request_begin(key, idem_request_fingerprint(body)),
                     the business row (payments), idem_request_finish(key,
                     201, response); then COMMIT.  The status of the begin
                     decides the answer:

                       new, resume  run the handler: 201 and the payment
                       replay       the first answer, its status and body
                       mismatch     422: the key was used with another body
                       in_flight    409: the first attempt is still running
                       (no key)     400
                       (a body that is not a JSON object, or that jsonb
                       cannot hold, such as a \u0000 in a string) 400
                       (new or resume, and the amount is not an integer
                       or the currency not a string) 400
                       (any other error) 500, once the transaction is
                       rolled back; the client may retry with the same key
                       (had the connection been lost during COMMIT, the
                       payment may have been committed: the retry then
                       gets its answer)

                     The body is checked after the begin: a retry written
                     otherwise ({"amount": 100.0}) is the same request, and
                     gets the first answer.  A body refused, or a business
                     write that fails, rolls the whole transaction back, the
                     request key with it: a retry runs anew.

  GET  /orders/form  a form's single-use token: {"token": "..."}
                     (idem_token_issue, scope "orders")
  POST /orders       {"token": "...", "item": "book"}.  In one transaction:
                     idem_token_consume(token, 'orders') and, when it says
                     true, the business row (orders); then COMMIT.  A token
                     used before is 409 (idem_token_status: consumed), any
                     other refused token 400, a token or an item that is not
                     a string text can hold 400, a database error 500 (the
                     token stays usable).

Each request has a connection of its own, from the libpq environment (PGHOST,
PGDATABASE, ...) or --dsn; the tables are created at start if missing:

    CREATE TABLE payments (id bigserial PRIMARY KEY, request_key text NOT NULL,
                           amount int NOT NULL CHECK (amount > 0),
                           currency text NOT NULL);
    CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL);

    http_handler.py [--dsn DSN] [--port N] [--port-file FILE]

It listens on 127.0.0.1 (port 8080 by default; 0 for any free port, written to
--port-file once it accepts connections) and stops on SIGTERM or SIGINT.  A
request whose body it does not read (an unknown path, a GET, a Content-Length
that is not a number, a Transfer-Encoding) is answered with "Connection:
close": on a kept-alive connection that body would be read as the next request.

--test-hooks (for tests) honours a header "X-Test-Hold: N": after its begin,
the request waits for the advisory lock N (pg_advisory_xact_lock), so that a
test can keep an attempt in flight for as long as it holds that lock.
"""

import argparse
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import psycopg2.errors

SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id          bigserial PRIMARY KEY,
    request_key text NOT NULL,
    amount      int NOT NULL CHECK (amount > 0),
    currency    text NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
    id   bigserial PRIMARY KEY,
    item text NOT NULL
);
"""

NAMESPACE = "payments"
TOKEN_SCOPE = "orders"

args = None


def dumps(obj):
    """The one way a body is written, so that a replay is byte for byte the same."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def is_text(value):
    """A string that PostgreSQL's text can hold: no NUL, no lone surrogate."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def rollback(conn):
    """Ends the transaction on the server; close() alone returns before it has."""
    if conn is None:
        return
    try:
        conn.rollback()
    except psycopg2.Error:
        pass  # the connection is lost: so is its transaction


def connect():
    conn = psycopg2.connect(args.dsn, application_name="http_handler")
    return conn


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):
        sys.stderr.write("http_handler: %s %s\n" % (self.address_string(), fmt % a))

    def parse_request(self):
        # per request: one handler serves the requests of a kept-alive connection
        self.body_read = False
        return super().parse_request()

    def answer(self, status, body):
        data = (body if isinstance(body, str) else dumps(body)).encode()
        # a body left unread would be parsed as the next request
        if not self.body_read and ("Transfer-Encoding" in self.headers
                                   or (self.headers.get("Content-Length") or "0").strip() != "0"):
            self.close_connection = True
        self.send_response(status)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or "Transfer-Encoding" in self.headers:
            return None, b""  # of unknown length: left unread, the connection closed
        raw = self.rfile.read(length)
        self.body_read = True
        try:
            # UTF-8 only, as PostgreSQL reads it; NaN and Infinity are not JSON
            body = json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
        except ValueError:
            return None, raw
        return (body if isinstance(body, dict) else None), raw

    def do_GET(self):
        if self.path != "/orders/form":
            return self.answer(404, {"error": "not found"})
        conn = None
        try:
            conn = connect()
            with conn, conn.cursor() as cur:
                cur.execute("SELECT idem_token_issue(%s)", (TOKEN_SCOPE,))
                status, response = 200, {"token": cur.fetchone()[0]}
        except Exception as e:
            sys.stderr.write("http_handler: %s\n" % e)
            status, response = 500, {"error": "no form could be made, retry"}
        finally:
            if conn is not None:
                conn.close()
        return self.answer(status, response)

    def do_POST(self):
        if self.path == "/payments":
            return self.post_payment()
        if self.path == "/orders":
            return self.post_order()
        return self.answer(404, {"error": "not found"})

    def post_payment(self):
        key = self.headers.get("Idempotency-Key")
        body, raw = self.read_json()
        if not key:
            return self.answer(400, {"error": "the Idempotency-Key header is missing"})
        if body is None:
            return self.answer(400, {"error": "the body is not a JSON object"})
        conn = None
        try:
            conn = connect()
            status, response = self.run_payment(conn, key, body, raw)
        except Exception as e:
            sys.stderr.write("http_handler: %s\n" % e)
            # rolled back before the answer: after an exception raised here, not
            # by the server, the transaction is still open, and a retry sent as
            # soon as the 500 arrives would find the key in flight
            rollback(conn)
            status, response = 500, {"error": "the payment could not be made, retry it"}
        finally:
            if conn is not None:
                conn.close()
        return self.answer(status, response)

    def run_payment(self, conn, key, body, raw):
        cur = conn.cursor()
        # the fingerprint of the body as JSON: key order and spaces do not matter
        try:
            cur.execute(
                "SELECT status, response_code, response_body"
                "  FROM idem_request_begin(%s, idem_request_fingerprint(%s::jsonb), %s)",
                (key, raw.decode(), NAMESPACE))
        except psycopg2.DataError as e:
            conn.rollback()
            # a key that is too long (22001) or otherwise malformed (22023)
            if e.pgcode in ("22001", "22023"):
                return 400, {"error": "invalid Idempotency-Key: %s" % e.diag.message_primary}
            # a body that is JSON but not jsonb: a \u0000 or a lone surrogate in a string
            return 400, {"error": "the body cannot be stored: %s" % e.diag.message_primary}
        status, code, stored = cur.fetchone()
        # a replay, a mismatch or a request in flight wrote nothing: the
        # transaction commits all the same, since idem_stats counts what
        # commits (the namespace's duplicate rate would otherwise stay 0)
        if status == "replay":
            conn.commit()
            return code, stored
        if status == "mismatch":
            conn.commit()
            return 422, {"error": "this Idempotency-Key was used with another request"}
        if status == "in_flight":
            conn.commit()
            return 409, {"error": "a request with this Idempotency-Key is in progress"}
        # new or resume: this transaction owns the key.  The body is checked
        # only now: a retry written otherwise (100.0 for 100) has the first
        # one's fingerprint and got its answer above.  The types the response
        # promises: an amount stored as it was given (100.5 would be rounded
        # into the integer column), a currency as text.  Refused, the key goes
        # with the rollback: the client may fix the body and retry with it.
        amount, currency = body.get("amount"), body.get("currency")
        if not isinstance(amount, int) or isinstance(amount, bool):
            conn.rollback()
            return 400, {"error": "invalid payment: the amount must be an integer"}
        if not isinstance(currency, str):
            conn.rollback()
            return 400, {"error": "invalid payment: the currency must be a string"}
        hold = self.headers.get("X-Test-Hold")
        if args.test_hooks and hold:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (int(hold),))
        try:
            cur.execute("INSERT INTO payments (request_key, amount, currency) VALUES (%s, %s, %s)"
                        " RETURNING id",
                        (key, body.get("amount"), body.get("currency")))
        except (psycopg2.errors.CheckViolation, psycopg2.errors.NotNullViolation,
                psycopg2.errors.InvalidTextRepresentation, psycopg2.errors.DatatypeMismatch,
                psycopg2.errors.NumericValueOutOfRange) as e:
            # the key goes with the rollback, as above
            conn.rollback()
            return 400, {"error": "invalid payment: %s" % e.diag.message_primary}
        payment = cur.fetchone()[0]
        response = {"payment": payment, "amount": amount, "currency": currency}
        cur.execute("SELECT idem_request_finish(%s, 201, %s::jsonb, %s)",
                    (key, dumps(response), NAMESPACE))
        conn.commit()
        return 201, response

    def post_order(self):
        body, _ = self.read_json()
        # strings only: psycopg2 cannot pass an object, nor text a \u0000
        if body is None or not is_text(body.get("token")) or not is_text(body.get("item")) \
                or not body["item"]:
            return self.answer(400, {"error": "expected {\"token\": ..., \"item\": ...}, two strings"})
        conn = None
        try:
            conn = connect()
            status, response = self.run_order(conn, body)
        except Exception as e:
            sys.stderr.write("http_handler: %s\n" % e)
            # nothing committed: the token can be used again
            rollback(conn)
            status, response = 500, {"error": "the order could not be made, retry it"}
        finally:
            if conn is not None:
                conn.close()
        return self.answer(status, response)

    def run_order(self, conn, body):
        cur = conn.cursor()
        cur.execute("SELECT idem_token_consume(%s, %s)", (body["token"], TOKEN_SCOPE))
        if not cur.fetchone()[0]:
            cur.execute("SELECT idem_token_status(%s, %s)", (body["token"], TOKEN_SCOPE))
            state = cur.fetchone()[0]
            # nothing written, but committed: idem_stats counts the duplicate
            conn.commit()
            if state == "consumed":
                return 409, {"error": "this form was submitted already"}
            return 400, {"error": "this form's token is %s" % state}
        cur.execute("INSERT INTO orders (item) VALUES (%s) RETURNING id", (body["item"],))
        order = cur.fetchone()[0]
        conn.commit()
        return 201, {"order": order, "item": body["item"]}


def main():
    global args
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default="", help="a libpq connection string (default: the PG* environment)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--port-file")
    p.add_argument("--test-hooks", action="store_true")
    args = p.parse_args()

    conn = connect()
    with conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
    conn.close()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True

    def stop(signo, frame):
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(server.server_address[1]))
        os.rename(tmp, args.port_file)
    sys.stderr.write("http_handler: listening on 127.0.0.1:%d\n" % server.server_address[1])
    sys.stderr.flush()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
