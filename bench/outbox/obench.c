/*
 * obench: the libpq driver of the outbox benchmark (bench/outbox/run.sh).
 *
 *   obench -c CONNINFO -p PEER -P PHASE [-m single|batch] [-n N] [-k KEYS]
 *          [-w PRODUCERS] [-r RELAYS] [-b BATCH] [-t SECONDS] [-e EXPECT]
 *          [-s STEADY_SECONDS] [-R STEADY_RATE] [-i POLL_MS] [-L LINGER_MS]
 *          [-T]
 *
 * One invocation is one measured phase, for one way of writing an outbox:
 *
 *   idem  idem_outbox_send; idem_outbox_lease, then idem_outbox_ack of the
 *         batch, each in a transaction of its own; the relays LISTEN on
 *         idem_outbox, as idem's README says a relay does, and after a lease
 *         that found nothing wait for a notification or the poll interval,
 *         whichever comes first (the others sleep the poll interval)
 *   idemr the same, the lease handing out runs of up to 100 messages of a
 *         key (idem_outbox_lease's per_key)
 *   sl    hand-written, unordered: INSERT; SELECT ... ORDER BY id LIMIT B
 *         FOR UPDATE SKIP LOCKED, DELETE of the batch and COMMIT (the lease is
 *         the relay's transaction)
 *   ord   hand-written, ordered per key: INSERT of the message and of its key
 *         row (ON CONFLICT DO NOTHING); a relay locks up to B key rows that
 *         have messages FOR UPDATE SKIP LOCKED, reads each locked key's
 *         oldest message in a second statement (a snapshot taken after the
 *         locks), DELETEs them and commits
 *   pgq   PgQ: pgq.insert_event; pgq.next_batch, pgq.get_batch_events,
 *         pgq.finish_batch; a ticker thread calls pgq.ticker() every 1 ms
 *         (and, in the steady phase, runs pgq.maint_operations() every 10 s,
 *         as pgqd does)
 *
 * PHASE is one of
 *
 *   produce  W producers send N messages in all, one per transaction
 *            (single) or BATCH per transaction (batch)
 *   consume  R relays deliver EXPECT messages (default N) in leases of BATCH
 *   e2e      both at once; the relays stop when every message the producers
 *            committed is delivered
 *   steady   W producers send STEADY_RATE messages per second in all, one
 *            per transaction, for STEADY_SECONDS, while R relays deliver
 *            them; the relays then drain what is left
 *
 * Message j of producer p has key k%04d with index p + W * (j % (KEYS / W))
 * and sequence number j / (KEYS / W): every key belongs to one producer, so
 * its intended order is the order of its sequence numbers.  The payload is
 * about 200 bytes of JSON that carries the key and the sequence number.
 *
 * A relay "delivers" a message by recording its key, its sequence number, the
 * relay and the time; it records, for the whole batch, the time just before it
 * sent the acknowledgement.  At the end the records are checked, per key over
 * every relay: inversions (a message delivered after one of the same key with
 * a higher sequence number), overlaps (the next message of a key delivered by
 * another relay before the relay holding the previous one had sent its
 * acknowledgement: two messages of a key in flight at once), duplicates and
 * lost messages.
 *
 * A relay whose lease found messages, but fewer than BATCH, waits
 * LINGER_MS before its next lease (default 0: at once), so that the next
 * one finds more; PgQ's consumer waits for its ticker instead.  A lease
 * that found nothing waits for a notification (idem) or POLL_MS, as
 * without -L.
 *
 * -T (PgQ): no ticker thread; each producer calls pgq.ticker() after each
 * of its commits.  One producer of BATCH per transaction then fills the
 * queue with batches of exactly BATCH events (ticker_max_count), the
 * consume phase's input; producers that commit at once still share ticks.
 *
 * The clock starts when every connection is made and every statement
 * prepared.  -t bounds a phase (a steady phase's drain): a phase cut short
 * prints timed_out=1 and its rate is what it moved in that time.  Prints one
 * line: RESULT key=value ...
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

typedef enum
{
	PEER_IDEM,
	PEER_SL,
	PEER_ORD,
	PEER_PGQ,
	PEER_IDEMR					/* idem, leasing runs of up to 100 a key */
} Peer;

typedef enum
{
	PHASE_PRODUCE,
	PHASE_CONSUME,
	PHASE_E2E,
	PHASE_STEADY
} Phase;

static const char *peer_names[] = {"idem", "sl", "ord", "pgq", "idemr"};
static const char *phase_names[] = {"produce", "consume", "e2e", "steady"};

static const char *conninfo = "";
static Peer peer = PEER_SL;
static Phase phase = PHASE_PRODUCE;
static int	batch_mode = 0;
static long N = 100000;
static int	K = 1000;
static int	W = 4;
static int	R = 1;
static int	B = 100;
static double deadline_s = 60.0;
static long expect = -1;
static double steady_s = 600.0;
static double steady_rate = 1000.0;
static long poll_us = 1000;
static long linger_us = 0;

static int64_t t0_ns;
static pthread_barrier_t ready;
static pthread_barrier_t go;

static atomic_long produced;
static atomic_long consumed;
static atomic_int producers_done;
static atomic_int stop_all;
static atomic_int timed_out;
static atomic_long batches;
static atomic_long empty_leases;
static atomic_long prod_end_ns;

typedef struct
{
	int32_t		key;
	int32_t		seq;
	int16_t		relay;
	int64_t		t_del;
	int64_t		t_ack;
} Rec;

static Rec *recs;
static long rec_cap;
static atomic_long nrec;

static int64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double
elapsed(void)
{
	return (now_ns() - t0_ns) / 1e9;
}

static void
fail(PGconn *conn, const char *what, PGresult *res)
{
	fprintf(stderr, "obench %s %s: %s%s\n", peer_names[peer], what,
			res ? PQresultErrorMessage(res) : "", conn ? PQerrorMessage(conn) : "");
	exit(2);
}

static PGconn *
connect_db(void)
{
	PGconn	   *conn = PQconnectdb(conninfo);

	if (PQstatus(conn) != CONNECTION_OK)
		fail(conn, "connect", NULL);
	return conn;
}

static void
exec_ok(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
		fail(conn, sql, res);
	PQclear(res);
}

static void
prepare(PGconn *conn, const char *name, const char *sql)
{
	PGresult   *res = PQprepare(conn, name, sql, 0, NULL);

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		fail(conn, sql, res);
	PQclear(res);
}

static PGresult *
run(PGconn *conn, const char *name, int n, const char *const *values)
{
	PGresult   *res = PQexecPrepared(conn, name, n, values, NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
		fail(conn, name, res);
	return res;
}

/* ---------------------------------------------------------------- producers */

static void
make_msg(int p, long j, char *key, char *payload)
{
	int			per_producer = K / W;
	int			kidx = p + W * (int) (j % per_producer);
	long		seq = j / per_producer;
	int			n;

	sprintf(key, "k%04d", kidx);
	n = sprintf(payload,
				"{\"key\":\"%s\",\"seq\":%ld,\"producer\":%d,\"event\":\"order.updated\","
				"\"ts\":%lld,\"body\":\"",
				key, seq, p, (long long) (now_ns() / 1000));
	while (n < 196)
	{
		payload[n] = 'a' + (n % 26);
		n++;
	}
	payload[n++] = '"';
	payload[n++] = '}';
	payload[n] = '\0';
}

/* appends s to an array literal as a quoted element */
static char *
array_elem(char *o, const char *s)
{
	*o++ = '"';
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			*o++ = '\\';
		*o++ = *s;
	}
	*o++ = '"';
	return o;
}

static const char *
send_sql(void)
{
	switch (peer)
	{
		case PEER_IDEM:
		case PEER_IDEMR:
			return "SELECT idem_outbox_send('t', $1, $2::jsonb)";
		case PEER_SL:
			return "INSERT INTO sl.outbox (topic, key, payload) VALUES ('t', $1, $2::jsonb)";
		case PEER_ORD:
			return "WITH m AS (INSERT INTO ord.outbox (topic, key, payload) VALUES ('t', $1, $2::jsonb) "
				"RETURNING topic, key) "
				"INSERT INTO ord.outbox_keys (topic, key) SELECT topic, key FROM m ON CONFLICT DO NOTHING";
		case PEER_PGQ:
			return "SELECT pgq.insert_event('q', 'm', $2, $1, NULL, NULL, NULL)";
	}
	return NULL;
}

static const char *
send_batch_sql(void)
{
	switch (peer)
	{
		case PEER_IDEM:
		case PEER_IDEMR:
			return "SELECT count(idem_outbox_send('t', k, p)) "
				"FROM unnest($1::text[], $2::jsonb[]) AS u(k, p)";
		case PEER_SL:
			return "INSERT INTO sl.outbox (topic, key, payload) "
				"SELECT 't', k, p FROM unnest($1::text[], $2::jsonb[]) AS u(k, p)";
		case PEER_ORD:
			return "WITH m AS (INSERT INTO ord.outbox (topic, key, payload) "
				"SELECT 't', k, p FROM unnest($1::text[], $2::jsonb[]) AS u(k, p) RETURNING topic, key) "
				"INSERT INTO ord.outbox_keys (topic, key) SELECT DISTINCT topic, key FROM m "
				"ON CONFLICT DO NOTHING";
		case PEER_PGQ:
			return "SELECT count(pgq.insert_event('q', 'm', p, k, NULL, NULL, NULL)) "
				"FROM unnest($1::text[], $2::text[]) AS u(k, p)";
	}
	return NULL;
}

static void
sleep_until(int64_t t)
{
	int64_t		d = t - now_ns();

	if (d > 0)
	{
		struct timespec ts = {d / 1000000000LL, d % 1000000000LL};

		nanosleep(&ts, NULL);
	}
}

/* -T: each producer ticks after its commits instead (with one producer of
 * 100 per transaction, batches of exactly 100: a fill for the consume phase) */
static int	tick_each = 0;

static void *
producer(void *arg)
{
	int			p = (int) (intptr_t) arg;
	PGconn	   *conn = connect_db();
	long		per = N / W;
	double		gap_ns = phase == PHASE_STEADY ? 1e9 * W / steady_rate : 0;
	char		key[32];
	char		payload[512];
	char	   *keys = malloc((size_t) B * 64);
	char	   *payloads = malloc((size_t) B * 600);
	long		j = 0;

	prepare(conn, "send", batch_mode ? send_batch_sql() : send_sql());
	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);
	while (!stop_all && (phase == PHASE_STEADY || j < per))
	{
		if (phase == PHASE_STEADY)
		{
			int64_t		due = t0_ns + (int64_t) (j * gap_ns);

			if (due - t0_ns >= steady_s * 1e9)
				break;
			sleep_until(due);
		}
		else if (elapsed() > deadline_s)
		{
			timed_out = 1;
			stop_all = 1;
			break;
		}
		if (!batch_mode)
		{
			const char *v[2] = {key, payload};

			make_msg(p, j, key, payload);
			PQclear(run(conn, "send", 2, v));
			if (tick_each)
				exec_ok(conn, "SELECT pgq.ticker()");
			j++;
			atomic_fetch_add(&produced, 1);
		}
		else
		{
			char	   *ko = keys;
			char	   *po = payloads;
			const char *v[2] = {keys, payloads};
			int			cnt;

			*ko++ = '{';
			*po++ = '{';
			for (cnt = 0; cnt < B && j + cnt < per; cnt++)
			{
				make_msg(p, j + cnt, key, payload);
				if (cnt > 0)
				{
					*ko++ = ',';
					*po++ = ',';
				}
				ko = array_elem(ko, key);
				po = array_elem(po, payload);
			}
			*ko++ = '}';
			*ko = '\0';
			*po++ = '}';
			*po = '\0';
			PQclear(run(conn, "send", 2, v));
			if (tick_each)
				exec_ok(conn, "SELECT pgq.ticker()");
			j += cnt;
			atomic_fetch_add(&produced, cnt);
		}
	}
	PQfinish(conn);
	free(keys);
	free(payloads);
	atomic_store(&prod_end_ns, now_ns());
	atomic_fetch_add(&producers_done, 1);
	return NULL;
}

/* ------------------------------------------------------------------- relays */

typedef struct
{
	int32_t		key;
	int32_t		seq;
	int64_t		t_del;
} Delivery;

static int
parse_seq(const char *payload)
{
	const char *s = strstr(payload, "\"seq\"");

	if (s == NULL)
		return -1;
	s += 5;
	while (*s == ' ' || *s == ':')
		s++;
	return atoi(s);
}

/* hands the rows of a lease to the "sink", in order: records them */
static int
deliver(PGresult *res, int keycol, int paycol, Delivery *d)
{
	int			n = PQntuples(res);
	int			i;

	for (i = 0; i < n; i++)
	{
		d[i].key = atoi(PQgetvalue(res, i, keycol) + 1);
		d[i].seq = parse_seq(PQgetvalue(res, i, paycol));
		d[i].t_del = now_ns();
	}
	return n;
}

static void
record(int relay, Delivery *d, int n, int64_t t_ack)
{
	long		base = atomic_fetch_add(&nrec, n);
	int			i;

	for (i = 0; i < n && base + i < rec_cap; i++)
	{
		Rec		   *r = &recs[base + i];

		r->key = d[i].key;
		r->seq = d[i].seq;
		r->relay = (int16_t) relay;
		r->t_del = d[i].t_del;
		r->t_ack = t_ack;
	}
	atomic_fetch_add(&consumed, n);
	atomic_fetch_add(&batches, 1);
}

/* the ids of a lease's rows as an array literal */
static void
id_array(PGresult *res, char *out)
{
	int			i;

	*out++ = '{';
	for (i = 0; i < PQntuples(res); i++)
	{
		if (i > 0)
			*out++ = ',';
		out += sprintf(out, "%s", PQgetvalue(res, i, 0));
	}
	*out++ = '}';
	*out = '\0';
}

/* the notifications received so far, dropped: they only wake the relay */
static int
drain_notifies(PGconn *conn)
{
	PGnotify   *n;
	int			got = 0;

	if (!PQconsumeInput(conn))
		fail(conn, "PQconsumeInput", NULL);
	while ((n = PQnotifies(conn)) != NULL)
	{
		PQfreemem(n);
		got = 1;
	}
	return got;
}

/* an idem relay with nothing to do: a notification, or the poll interval */
static void
wait_notify(PGconn *conn)
{
	struct pollfd pfd;
	struct timespec ts = {poll_us / 1000000, (poll_us % 1000000) * 1000};

	if (drain_notifies(conn))
		return;
	pfd.fd = PQsocket(conn);
	pfd.events = POLLIN;
	pfd.revents = 0;
	if (ppoll(&pfd, 1, &ts, NULL) > 0)
		drain_notifies(conn);
}

static int
finished(void)
{
	if (stop_all)
		return 1;
	if (phase == PHASE_CONSUME)
	{
		if (atomic_load(&consumed) >= expect)
			return 1;
		if (elapsed() > deadline_s)
		{
			timed_out = 1;
			stop_all = 1;
			return 1;
		}
		return 0;
	}
	/* e2e and steady: every committed message delivered */
	if (atomic_load(&producers_done) == W && atomic_load(&consumed) >= atomic_load(&produced))
		return 1;
	if (elapsed() > (phase == PHASE_STEADY ? steady_s : 0) + deadline_s)
	{
		timed_out = 1;
		stop_all = 1;
		return 1;
	}
	return 0;
}

static void *
relay(void *arg)
{
	int			rid = (int) (intptr_t) arg;
	PGconn	   *conn = connect_db();
	int			cap = B + 16;
	Delivery   *d = malloc(sizeof(Delivery) * cap);
	char	   *ids = malloc((size_t) B * 48 + 16);
	char		bs[16];
	char		name[16];

	snprintf(bs, sizeof(bs), "%d", B);
	snprintf(name, sizeof(name), "relay-%d", rid);
	switch (peer)
	{
		case PEER_IDEM:
		case PEER_IDEMR:
			exec_ok(conn, "LISTEN idem_outbox");
			prepare(conn, "lease", peer == PEER_IDEMR ?
					"SELECT id, key, payload FROM idem_outbox_lease($1, $2, per_key => 100)" :
					"SELECT id, key, payload FROM idem_outbox_lease($1, $2)");
			prepare(conn, "ack", "SELECT idem_outbox_ack($1::uuid[])");
			break;
		case PEER_SL:
			prepare(conn, "lease",
					"SELECT id, key, payload FROM sl.outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED");
			prepare(conn, "ack", "DELETE FROM sl.outbox WHERE id = ANY ($1::bigint[])");
			break;
		case PEER_ORD:
			prepare(conn, "lockkeys",
					"SELECT array_agg(topic), array_agg(key) FROM (SELECT k.topic, k.key FROM ord.outbox_keys k "
					"WHERE EXISTS (SELECT 1 FROM ord.outbox o WHERE o.topic = k.topic AND o.key = k.key) "
					"LIMIT $1 FOR UPDATE OF k SKIP LOCKED) s");
			prepare(conn, "heads",
					"SELECT h.id, h.key, h.payload FROM unnest($1::text[], $2::text[]) AS u(topic, key) "
					"CROSS JOIN LATERAL (SELECT id, key, payload FROM ord.outbox o "
					"WHERE o.topic = u.topic AND o.key = u.key ORDER BY id LIMIT 1) h ORDER BY h.id");
			prepare(conn, "ack", "DELETE FROM ord.outbox WHERE id = ANY ($1::bigint[])");
			break;
		case PEER_PGQ:
			prepare(conn, "next", "SELECT pgq.next_batch('q', 'c1')");
			prepare(conn, "events", "SELECT ev_id, ev_extra1, ev_data FROM pgq.get_batch_events($1)");
			prepare(conn, "finish", "SELECT pgq.finish_batch($1)");
			break;
	}
	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);
	while (!finished())
	{
		int			n = 0;
		int64_t		t_ack = 0;
		PGresult   *res;

		switch (peer)
		{
			case PEER_IDEM:
			case PEER_IDEMR:
				{
					const char *v[2] = {name, bs};

					res = run(conn, "lease", 2, v);
					n = deliver(res, 1, 2, d);
					if (n > 0)
					{
						const char *a[1] = {ids};

						id_array(res, ids);
						t_ack = now_ns();
						PQclear(run(conn, "ack", 1, a));
					}
					PQclear(res);
				}
				break;
			case PEER_SL:
				{
					const char *v[1] = {bs};

					exec_ok(conn, "BEGIN");
					res = run(conn, "lease", 1, v);
					n = deliver(res, 1, 2, d);
					if (n > 0)
					{
						const char *a[1] = {ids};

						id_array(res, ids);
						PQclear(run(conn, "ack", 1, a));
					}
					PQclear(res);
					t_ack = now_ns();
					exec_ok(conn, "COMMIT");
				}
				break;
			case PEER_ORD:
				{
					const char *v[1] = {bs};
					PGresult   *rk;

					exec_ok(conn, "BEGIN");
					rk = run(conn, "lockkeys", 1, v);
					if (!PQgetisnull(rk, 0, 0))
					{
						const char *kv[2] = {PQgetvalue(rk, 0, 0), PQgetvalue(rk, 0, 1)};

						res = run(conn, "heads", 2, kv);
						n = deliver(res, 1, 2, d);
						if (n > 0)
						{
							const char *a[1] = {ids};

							id_array(res, ids);
							PQclear(run(conn, "ack", 1, a));
						}
						PQclear(res);
					}
					PQclear(rk);
					t_ack = now_ns();
					exec_ok(conn, "COMMIT");
				}
				break;
			case PEER_PGQ:
				{
					PGresult   *rb = run(conn, "next", 0, NULL);

					if (!PQgetisnull(rb, 0, 0))
					{
						const char *bv[1] = {PQgetvalue(rb, 0, 0)};

						res = run(conn, "events", 1, bv);
						if (PQntuples(res) > cap)
						{
							cap = PQntuples(res) + 16;
							d = realloc(d, sizeof(Delivery) * cap);
						}
						n = deliver(res, 1, 2, d);
						PQclear(res);
						t_ack = now_ns();
						PQclear(run(conn, "finish", 1, bv));
					}
					PQclear(rb);
				}
				break;
		}
		if (n > 0)
		{
			record(rid, d, n, t_ack);
			if (peer == PEER_IDEM || peer == PEER_IDEMR)
				drain_notifies(conn);
			/* not after the last lease: the phase ends when it is acked */
			if (n < B && linger_us > 0 && peer != PEER_PGQ && !finished())
				usleep(linger_us);
		}
		else
		{
			atomic_fetch_add(&empty_leases, 1);
			if (peer == PEER_IDEM || peer == PEER_IDEMR)
				wait_notify(conn);
			else
				usleep(poll_us);
		}
	}
	PQfinish(conn);
	free(d);
	free(ids);
	return NULL;
}

/* ------------------------------------------------------------- PgQ's ticker */

static atomic_int ticker_stop;

/* what pgqd does for maintenance: every operation pgq.maint_operations() lists */
static void
pgq_maintenance(PGconn *conn)
{
	PGresult   *ops = PQexec(conn, "SELECT func_name, func_arg FROM pgq.maint_operations()");
	int			i;

	if (PQresultStatus(ops) != PGRES_TUPLES_OK)
		fail(conn, "pgq.maint_operations()", ops);
	for (i = 0; i < PQntuples(ops); i++)
	{
		const char *fn = PQgetvalue(ops, i, 0);
		char		sql[1024];
		int			again;

		if (strcmp(fn, "vacuum") == 0)
		{
			snprintf(sql, sizeof(sql), "VACUUM %s", PQgetvalue(ops, i, 1));
			exec_ok(conn, sql);
			continue;
		}
		if (PQgetisnull(ops, i, 1))
			snprintf(sql, sizeof(sql), "SELECT %s()", fn);
		else
		{
			char	   *lit = PQescapeLiteral(conn, PQgetvalue(ops, i, 1), strlen(PQgetvalue(ops, i, 1)));

			snprintf(sql, sizeof(sql), "SELECT %s(%s)", fn, lit);
			PQfreemem(lit);
		}
		/* an operation returns 1 when it wants to be called again at once */
		for (again = 0; again < 100; again++)
		{
			PGresult   *res = PQexec(conn, sql);
			int			more;

			if (PQresultStatus(res) != PGRES_TUPLES_OK)
				fail(conn, sql, res);
			more = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "1") == 0;
			PQclear(res);
			if (!more)
				break;
		}
	}
	PQclear(ops);
}

static void *
ticker(void *arg)
{
	PGconn	   *conn = connect_db();
	int64_t		next_maint = now_ns() + 10000000000LL;

	(void) arg;
	while (!ticker_stop)
	{
		exec_ok(conn, "SELECT pgq.ticker()");
		if (phase == PHASE_STEADY && now_ns() >= next_maint)
		{
			pgq_maintenance(conn);
			next_maint = now_ns() + 10000000000LL;
		}
		/*
		 * A tick is made once ticker_max_count (100) events wait: calls
		 * every millisecond keep PgQ's batches near the other peers' 100
		 * after one-row producers (every 5 ms they held 130 to 465 events;
		 * after producers of 100 per transaction they still hold about 220).
		 */
		usleep(1000);
	}
	PQfinish(conn);
	return NULL;
}

/* ------------------------------------------------------------------- checks */

static int
cmp_key_time(const void *a, const void *b)
{
	const Rec  *x = a;
	const Rec  *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->t_del != y->t_del)
		return x->t_del < y->t_del ? -1 : 1;
	return 0;
}

static int
cmp_key_seq(const void *a, const void *b)
{
	const Rec  *x = a;
	const Rec  *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->seq != y->seq)
		return x->seq < y->seq ? -1 : 1;
	if (x->t_del != y->t_del)
		return x->t_del < y->t_del ? -1 : 1;
	return 0;
}

static void
usage(const char *argv0)
{
	fprintf(stderr, "usage: %s -c CONNINFO -p idem|idemr|sl|ord|pgq -P produce|consume|e2e|steady "
			"[-m single|batch] [-n N] [-k KEYS] [-w PRODUCERS] [-r RELAYS] [-b BATCH] "
			"[-t SECONDS] [-e EXPECT] [-s STEADY_SECONDS] [-R STEADY_RATE] [-i POLL_MS] [-L LINGER_MS] [-T]\n", argv0);
	exit(2);
}

int
main(int argc, char **argv)
{
	int			opt;
	int			do_prod;
	int			do_cons;
	int			nthreads;
	pthread_t  *prod;
	pthread_t  *rel;
	pthread_t	tick;
	struct rusage ru0;
	struct rusage ru1;
	int64_t		t1;
	double		secs;
	double		cpu;
	long		msgs;
	long		nr;
	long		dups = 0;
	long		missing = 0;
	long		inversions = 0;
	long		overlaps = 0;
	long		keys_bad = 0;
	long		overflow = 0;
	long		i;

	while ((opt = getopt(argc, argv, "c:p:P:m:n:k:w:r:b:t:e:s:R:i:L:T")) != -1)
	{
		switch (opt)
		{
			case 'c':
				conninfo = optarg;
				break;
			case 'p':
				for (i = 0; i < 5 && strcmp(optarg, peer_names[i]) != 0; i++);
				if (i == 5)
					usage(argv[0]);
				peer = (Peer) i;
				break;
			case 'P':
				for (i = 0; i < 4 && strcmp(optarg, phase_names[i]) != 0; i++);
				if (i == 4)
					usage(argv[0]);
				phase = (Phase) i;
				break;
			case 'm':
				batch_mode = strcmp(optarg, "batch") == 0;
				break;
			case 'n':
				N = atol(optarg);
				break;
			case 'k':
				K = atoi(optarg);
				break;
			case 'w':
				W = atoi(optarg);
				break;
			case 'r':
				R = atoi(optarg);
				break;
			case 'b':
				B = atoi(optarg);
				break;
			case 't':
				deadline_s = atof(optarg);
				break;
			case 'e':
				expect = atol(optarg);
				break;
			case 's':
				steady_s = atof(optarg);
				break;
			case 'R':
				steady_rate = atof(optarg);
				break;
			case 'i':
				poll_us = (long) (atof(optarg) * 1000);
				break;
			case 'L':
				linger_us = (long) (atof(optarg) * 1000);
				break;
			case 'T':
				tick_each = 1;
				break;
			default:
				usage(argv[0]);
		}
	}
	if (expect < 0)
		expect = N;
	do_prod = phase != PHASE_CONSUME;
	do_cons = phase != PHASE_PRODUCE;
	if (!do_prod)
		W = 0;
	if (!do_cons)
		R = 0;
	if (W < 0 || W > 64 || R < 0 || R > 64 || B < 1 || B > 10000 || K < 1 || steady_rate <= 0 ||
		(do_prod && (W == 0 || K % W != 0 || N % W != 0)) || (do_cons && R == 0))
	{
		fprintf(stderr, "obench: W and R between 1 and 64, KEYS and N multiples of W, 1 <= BATCH <= 10000\n");
		return 2;
	}
	if (phase == PHASE_STEADY)
	{
		batch_mode = 0;
		rec_cap = (long) (steady_rate * steady_s) * 2 + 1024;
	}
	else
		rec_cap = (phase == PHASE_CONSUME ? expect : N) * 2 + 1024;
	if (do_cons && (recs = calloc(rec_cap, sizeof(Rec))) == NULL)
	{
		perror("calloc");
		return 2;
	}

	nthreads = W + R;
	prod = calloc(W + 1, sizeof(pthread_t));
	rel = calloc(R + 1, sizeof(pthread_t));
	pthread_barrier_init(&ready, NULL, nthreads + 1);
	pthread_barrier_init(&go, NULL, nthreads + 1);
	for (i = 0; i < W; i++)
		pthread_create(&prod[i], NULL, producer, (void *) (intptr_t) i);
	for (i = 0; i < R; i++)
		pthread_create(&rel[i], NULL, relay, (void *) (intptr_t) i);
	pthread_barrier_wait(&ready);
	getrusage(RUSAGE_SELF, &ru0);
	t0_ns = now_ns();
	if (peer == PEER_PGQ && !tick_each)
		pthread_create(&tick, NULL, ticker, NULL);
	pthread_barrier_wait(&go);
	for (i = 0; i < W; i++)
		pthread_join(prod[i], NULL);
	for (i = 0; i < R; i++)
		pthread_join(rel[i], NULL);
	t1 = do_cons ? now_ns() : atomic_load(&prod_end_ns);
	getrusage(RUSAGE_SELF, &ru1);
	if (peer == PEER_PGQ && !tick_each)
	{
		/* after a produce phase, tick the last events for the consume phase */
		if (!do_cons)
			usleep(100000);
		ticker_stop = 1;
		pthread_join(tick, NULL);
	}
	secs = (t1 - t0_ns) / 1e9;
	cpu = (ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) + (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
		(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) + (ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
	msgs = do_cons ? atomic_load(&consumed) : atomic_load(&produced);

	nr = atomic_load(&nrec);
	if (nr > rec_cap)
	{
		overflow = nr - rec_cap;
		nr = rec_cap;
	}
	if (do_cons)
	{
		long		distinct_total = 0;
		long		want = phase == PHASE_CONSUME ? expect : atomic_load(&produced);
		char	   *bad = calloc(K, 1);
		long		start;

		qsort(recs, nr, sizeof(Rec), cmp_key_time);
		for (i = 1; i < nr; i++)
			if (recs[i].key == recs[i - 1].key && recs[i].seq < recs[i - 1].seq)
			{
				inversions++;
				bad[recs[i].key % K] = 1;
			}
		qsort(recs, nr, sizeof(Rec), cmp_key_seq);
		for (start = 0; start < nr; start = i)
		{
			for (i = start; i < nr && recs[i].key == recs[start].key; i++)
			{
				if (i == start || recs[i].seq != recs[i - 1].seq)
					distinct_total++;
				else
					dups++;
				/* the key's next message handed to another relay before the previous was acked */
				if (i > start && recs[i].seq != recs[i - 1].seq && recs[i].relay != recs[i - 1].relay &&
					recs[i].t_del < recs[i - 1].t_ack)
				{
					overlaps++;
					bad[recs[i].key % K] = 1;
				}
			}
		}
		if (!timed_out && distinct_total < want)
			missing = want - distinct_total;
		for (i = 0; i < K; i++)
			keys_bad += bad[i];
		free(bad);
	}
	printf("RESULT peer=%s phase=%s mode=%s producers=%d relays=%d n=%ld msgs=%ld produced=%ld "
		   "consumed=%ld secs=%.3f rate=%.0f client_cpu_s=%.2f batches=%ld avg_batch=%.1f "
		   "empty_leases=%ld dups=%ld missing=%ld inversions=%ld overlaps=%ld keys_out_of_order=%ld "
		   "rec_overflow=%ld timed_out=%d\n",
		   peer_names[peer], phase_names[phase], do_prod ? (batch_mode ? "batch" : "single") : "-",
		   W, R, N, msgs, (long) atomic_load(&produced), (long) atomic_load(&consumed), secs,
		   secs > 0 ? msgs / secs : 0, cpu, (long) atomic_load(&batches),
		   batches ? (double) atomic_load(&consumed) / atomic_load(&batches) : 0,
		   (long) atomic_load(&empty_leases), dups, missing, inversions, overlaps, keys_bad, overflow,
		   (int) timed_out);
	return 0;
}
