/*-------------------------------------------------------------------------
 *
 * chaos.c
 *	  Exactly-once under faults: producers, consumers and a checker for
 *	  idem, driven through libpq.
 *
 * The source is a table of deliveries, src: every message is one row, and a
 * share of the messages get extra rows (injected redeliveries), shuffled so
 * that copies come early, late and out of order.  Consumers lease batches of
 * rows (a lease expires, so a row leased by a consumer that died is handed
 * out again), apply a business effect to each in its own transaction with
 * idem_claim, commit, and only then ack the batch's committed rows in a
 * separate transaction.  A consumer that dies anywhere before its ack sees
 * its messages redelivered: idem has to absorb every such redelivery.
 *
 * The business effect credits an account and writes a ledger row.  The
 * ledger has no unique constraint, so a message applied twice shows up as
 * two rows.
 *
 * Modes:
 *	  chaos setup    create the tables (dropping earlier ones)
 *	  chaos produce  fill the source (the outbox kind produces during the run)
 *	  chaos run      consume with several processes under faults: consumers
 *	                 exit abruptly at chosen points, a chaos process
 *	                 terminates their backends, the server is crashed and
 *	                 restarted by shell commands given on the command line
 *	  chaos check    verify that every message was applied exactly once and
 *	                 print the figures; exit status 1 if not
 *
 * Each consumer "kind" (the business effect and where it may die) is a row
 * of the kinds[] table below: later capabilities add their own.
 *
 * The outbox kind has no source table: producer processes, started by
 * "chaos run" beside the consumers, write a business row (orders) and send
 * its message with idem_outbox_send in one transaction; some transactions
 * roll back on purpose and some producers die before their commit.  The
 * consumers are relays: they lease messages with idem_outbox_lease, apply
 * each in a consumer transaction guarded by idem_claim(message id), and
 * then ack the batch with idem_outbox_ack; a consumer that fails rolls back
 * and nacks.  The orders committed are the truth: each of their messages
 * must be applied exactly once, in send order per key (each key belongs to
 * one producer, which sends to it one transaction after the other), and no
 * message of a transaction that rolled back may ever be leased.  With
 * --per-key above 1 the relays lease runs of a key's messages and stop a
 * key's run at its first failure (the nack releases the rest of it).
 *
 * The offset kind is a consumer group of an ordered log: "chaos produce"
 * fills a table of numbered messages per partition (offsets with gaps, as
 * a compacted topic has), and each consumer, for a partition it picks,
 * reads where to resume with idem_offset_get (after a restart it goes back
 * a little further, as a broker redelivering from a committed position
 * behind idem's would), fetches the next messages in offset order and
 * applies each in one transaction: idem_offset_advance, and the business
 * write only when it says true.  Consumers pick partitions at random, so
 * two of them often work on the same one: the second waits on the first's
 * offset row and skips what it applied.  Every message must be applied
 * exactly once, and in offset order per partition: the business write
 * records the offset applied before it in the partition, which must be the
 * message's predecessor in the log.
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#define MAX_CONSUMERS	64
#define MAX_CRASH_CMDS	8
#define MSG_ID_LEN		64
#define MAX_PRODUCERS	16
#define MAX_KEYS		4096

/* Exit codes of a consumer process. */
#define EXIT_DONE		0		/* every delivery acked */
#define EXIT_KILLED		77		/* died on purpose at a kill point */
#define EXIT_GAVE_UP	2		/* could not reach the server in time */

/* Where a consumer may die. */
typedef enum Point
{
	P_NONE = 0,
	P_BEFORE_CLAIM,				/* leased, transaction not started */
	P_AFTER_CLAIM,				/* claimed, effect not applied */
	P_BEFORE_COMMIT,			/* effect applied, not committed */
	P_AFTER_COMMIT,				/* committed, not acked */
	P_EXTERNAL,					/* SIGKILLed from outside, anywhere */
	N_POINTS
} Point;

/* Counters shared by every process of a run (an anonymous shared mapping). */
typedef struct Shared
{
	long		leased;			/* rows handed to consumers */
	long		committed;		/* business transactions committed */
	long		applied;		/* ... in which the effect was applied */
	long		absorbed;		/* ... in which idem said "duplicate" */
	long		acks;
	long		conn_lost;		/* connections lost mid-work */
	long		reconnects;
	long		unexpected;		/* errors other than a lost connection */
	long		terminations;	/* backends terminated by the chaos process */
	long		kills[N_POINTS];
	Point		slot_point[MAX_CONSUMERS];	/* where a slot's process died */
	long		nacks;			/* deliveries that failed and were nacked */
	/* the producers of the outbox kind */
	long		sends;			/* messages of committed transactions */
	long		rolled_back;	/* messages of transactions rolled back */
	long		producer_txns;	/* transactions committed */
	long		producer_kills; /* producers dead before their commit */
	long		attempted[MAX_PRODUCERS];	/* messages sent, whatever came of them */
	long		key_n[MAX_KEYS];	/* the last n sent to each key */
	int			producers_done; /* every producer has finished, and its backend */
} Shared;

typedef struct Options
{
	const char *conninfo;
	const char *kind;
	const char *ns;
	long		messages;
	double		redeliver;		/* share of messages given extra copies */
	int			max_copies;		/* at most this many extra copies */
	int			accounts;
	unsigned long seed;
	int			consumers;
	int			producers;		/* outbox kind: producer processes */
	int			keys;			/* outbox kind: keys messages are sent to */
	long		nack_every;		/* one failed delivery per this many, 0 none */
	int			batch;
	int			lease_ms;
	int			per_key;		/* outbox kind: runs of up to this many a key */
	long		kill_every;		/* one kill per this many deliveries, 0 none */
	int			sigkill_ms;		/* external SIGKILL of a consumer, 0 none */
	int			terminate_ms;	/* pg_terminate_backend period, 0 none */
	int			crashes;
	const char *crash_cmds[MAX_CRASH_CMDS];
	int			n_crash_cmds;
	const char *start_cmd;
	int			reconnect_s;	/* give up reaching the server after this */
	int			timeout_s;		/* give up a run after this */
	int			partitions;		/* offset kind: partitions of the log */
	const char *broken;			/* NULL, "no-idem", "ack-first", "unordered",
								 * "run-on" or "split" */
	bool		quiet;
} Options;

static Options opt = {
	.conninfo = "",
	.kind = "claim",
	.ns = "chaos",
	.messages = 100000,
	.redeliver = 0.35,
	.max_copies = 3,
	.accounts = 100,
	.seed = 1,
	.consumers = 4,
	.producers = 4,
	.keys = 64,
	.partitions = 8,
	.nack_every = 0,
	.batch = 32,
	.lease_ms = 1000,
	.per_key = 1,
	.kill_every = 0,
	.sigkill_ms = 0,
	.terminate_ms = 0,
	.crashes = 0,
	.start_cmd = NULL,
	.reconnect_s = 120,
	.timeout_s = 1800,
	.broken = NULL,
	.quiet = false,
};

static Shared *shared;

/* ---------- small helpers ---------- */

static void
die(const char *fmt,...)
{
	va_list		ap;

	fprintf(stderr, "chaos: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void
note(const char *fmt,...)
{
	va_list		ap;

	if (opt.quiet)
		return;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void
count(long *counter, long n)
{
	__atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

static long
get(long *counter)
{
	return __atomic_load_n(counter, __ATOMIC_RELAXED);
}

/* xorshift64*: a small, seedable generator per process */
typedef struct Rng
{
	uint64_t	s;
} Rng;

static void
rng_seed(Rng *r, uint64_t seed)
{
	r->s = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
	if (r->s == 0)
		r->s = 1;
}

static uint64_t
rng_next(Rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545F4914F6CDD1DULL;
}

static long
rng_below(Rng *r, long n)
{
	return (long) (rng_next(r) % (uint64_t) n);
}

/* ---------- connections ---------- */

static PGconn *
connect_once(const char *appname)
{
	const char *keys[] = {"dbname", "application_name", "connect_timeout", NULL};
	const char *vals[] = {opt.conninfo, appname, "5", NULL};

	return PQconnectdbParams(keys, vals, 1);
}

/* Notices (and the FATAL of a terminated idle connection) are expected. */
static void
quiet_notices(void *arg, const char *message)
{
	(void) arg;
	(void) message;
}

/* Connect, retrying while the server is down or starting up. */
static PGconn *
connect_retry(const char *appname)
{
	double		deadline = now_s() + opt.reconnect_s;

	for (;;)
	{
		PGconn	   *conn = connect_once(appname);

		if (PQstatus(conn) == CONNECTION_OK)
		{
			PQsetNoticeProcessor(conn, quiet_notices, NULL);
			return conn;
		}
		if (now_s() > deadline)
		{
			fprintf(stderr, "chaos: %s: cannot connect: %s", appname,
					PQerrorMessage(conn));
			PQfinish(conn);
			return NULL;
		}
		PQfinish(conn);
		sleep_ms(50);
	}
}

/* Run SQL that must succeed (setup, produce, check). */
static void
must_exec(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_COMMAND_OK &&
		PQresultStatus(res) != PGRES_TUPLES_OK)
		die("%s\n%s", PQerrorMessage(conn), sql);
	PQclear(res);
}

static PGresult *
must_query(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		die("%s\n%s", PQerrorMessage(conn), sql);
	return res;
}

static long
query_long(PGconn *conn, const char *sql)
{
	PGresult   *res = must_query(conn, sql);
	long		v;

	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0))
		die("expected one value from: %s", sql);
	v = atol(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

/* ---------- consumers ---------- */

typedef struct Delivery
{
	char		seq[40];		/* what the ack names: a row of src, a message id */
	char		msg_id[MSG_ID_LEN];
	char		amount[16];
	char		account[16];
	char		key[32];		/* outbox kind: the message's key ... */
	char		n[16];			/* ... and its place in the key's order */
} Delivery;

/* What became of one delivery. */
typedef enum Outcome
{
	O_DONE,						/* committed: ack it */
	O_FAILED,					/* rolled back: leave it for redelivery */
	O_LOST						/* connection lost: reconnect, abandon batch */
} Outcome;

typedef struct Consumer
{
	int			slot;
	char		appname[32];
	PGconn	   *conn;
	Rng			rng;
	Point		kill_at;		/* the point this delivery dies at, if any */
	bool		fail;			/* this delivery fails: roll back, nack */
	int			effect_params;	/* 4, or 6 with the key and n */
	bool		use_idem;
} Consumer;

/* Die here if this delivery was chosen to die here. */
static void
chaos_point(Consumer *c, Point p)
{
	if (c->kill_at != p)
		return;
	shared->slot_point[c->slot] = p;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	/* half the time the process vanishes at once, half it exits */
	if (rng_below(&c->rng, 2) == 0)
		kill(getpid(), SIGKILL);
	_exit(EXIT_KILLED);
}

/*
 * A statement failed: tell a lost connection (the server went away, or our
 * backend was terminated) from an error of the statement, which is counted
 * as unexpected and printed.
 */
static Outcome
failure(Consumer *c, PGresult *res, const char *what)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	if (PQstatus(c->conn) == CONNECTION_BAD || state == NULL ||
		strncmp(state, "57P", 3) == 0 || strncmp(state, "08", 2) == 0)
	{
		count(&shared->conn_lost, 1);
		return O_LOST;
	}
	count(&shared->unexpected, 1);
	fprintf(stderr, "chaos: %s: unexpected error in %s: %s %s", c->appname,
			what, state, PQerrorMessage(c->conn));
	PQclear(PQexec(c->conn, "ROLLBACK"));
	return PQstatus(c->conn) == CONNECTION_BAD ? O_LOST : O_FAILED;
}

/* Run a command with no result; O_DONE if it succeeded. */
static Outcome
run_command(Consumer *c, const char *sql, const char *what)
{
	PGresult   *res = PQexec(c->conn, sql);
	Outcome		o = O_DONE;

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		o = failure(c, res, what);
	PQclear(res);
	return o;
}

static Outcome
run_prepared(Consumer *c, const char *stmt, int n, const char *const *params,
			 ExecStatusType expect, PGresult **out)
{
	PGresult   *res = PQexecPrepared(c->conn, stmt, n, params, NULL, NULL, 0);
	Outcome		o = O_DONE;

	if (PQresultStatus(res) != expect)
	{
		o = failure(c, res, stmt);
		PQclear(res);
		res = NULL;
	}
	if (out)
		*out = res;
	else
		PQclear(res);
	return o;
}

/* COMMIT, telling a commit from a transaction that had failed. */
static Outcome
commit(Consumer *c)
{
	PGresult   *res = PQexec(c->conn, "COMMIT");
	Outcome		o = O_DONE;

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		o = failure(c, res, "COMMIT");
	else if (strcmp(PQcmdStatus(res), "COMMIT") != 0)
		o = O_FAILED;
	PQclear(res);
	return o;
}

/*
 * A kind of consumer: its extra setup, the statements it prepares on every
 * connection, the business transaction of one delivery, and extra checks.
 *
 * apply() runs the whole transaction of one delivery, from BEGIN to COMMIT,
 * and calls chaos_point() at P_BEFORE_CLAIM, P_AFTER_CLAIM and
 * P_BEFORE_COMMIT; the consumer loop takes care of P_AFTER_COMMIT and the
 * ack.  checks is a query returning rows (what, bad): every bad must be 0.
 */
typedef struct Kind
{
	const char *name;
	const char *setup_sql;
	const char *prepare_sql[6];
	Outcome		(*apply) (Consumer *c, const Delivery *d);
	const char *checks_sql;

	/*
	 * Where the deliveries come from, when not from src: statements "lease"
	 * (batch, lease in ms; returning seq, msg_id, amount, account, key, n),
	 * "ack" (an array of seq; returning how many were acked) and "nack" (one
	 * seq), a query telling whether anything is left to deliver, and the
	 * statement that creates the checker's "truth" table (msg_id, amount,
	 * account, rows, deliveries, acked).  producers: the deliveries are
	 * produced during the run, by producer processes.
	 */
	const char *lease_sql;
	const char *ack_sql;
	const char *nack_sql;
	const char *pending_sql;
	const char *truth_sql;
	bool		producers;
	int			effect_params;	/* parameters of "effect": 4 or 6 */

	/*
	 * A kind that consumes in a loop of its own (the offset kind), and the
	 * query counting what it has to apply (for the crashes of a run).
	 */
	int			(*consume) (int slot, unsigned long generation);
	const char *total_sql;
} Kind;

static int	offset_consume(int slot, unsigned long generation);

/*
 * The claim kind: idem_claim(msg_id) guards a credit and a ledger row.  The
 * outbox kind runs the same transaction, its effect also recording the key
 * and n of the message.  A delivery chosen to fail rolls back after its
 * effect.
 */
static Outcome
claim_apply(Consumer *c, const Delivery *d)
{
	Outcome		o;
	bool		first = true;
	char		consumer[16];

	chaos_point(c, P_BEFORE_CLAIM);
	if (!c->use_idem)
	{
		if ((o = run_command(c, "BEGIN", "BEGIN")) != O_DONE)
			return o;
	}
	else
	{
		/* BEGIN and the claim in one round trip */
		char	   *id = PQescapeLiteral(c->conn, d->msg_id, strlen(d->msg_id));
		char	   *ns = PQescapeLiteral(c->conn, opt.ns, strlen(opt.ns));
		char		sql[MSG_ID_LEN * 2 + 200];
		PGresult   *res;

		if (id == NULL || ns == NULL)
			return failure(c, NULL, "PQescapeLiteral");
		snprintf(sql, sizeof(sql), "BEGIN; SELECT idem_claim(%s, %s)", id, ns);
		PQfreemem(id);
		PQfreemem(ns);
		res = PQexec(c->conn, sql);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			o = failure(c, res, "idem_claim");
			PQclear(res);
			return o;
		}
		first = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
	}
	chaos_point(c, P_AFTER_CLAIM);
	if (first)
	{
		const char *params[] = {d->msg_id, d->amount, d->account, consumer, d->key, d->n};

		snprintf(consumer, sizeof(consumer), "%d", c->slot);
		if ((o = run_prepared(c, "effect", c->effect_params, params, PGRES_COMMAND_OK,
							  NULL)) != O_DONE)
			return o;
	}
	chaos_point(c, P_BEFORE_COMMIT);
	if (c->fail)
	{
		if ((o = run_command(c, "ROLLBACK", "ROLLBACK")) != O_DONE)
			return o;
		return O_FAILED;
	}
	if ((o = commit(c)) != O_DONE)
		return o;
	count(&shared->committed, 1);
	count(first ? &shared->applied : &shared->absorbed, 1);
	return O_DONE;
}

/*
 * The request kind: every delivery is a client's retry of one API request
 * (a payment), with the message id as its Idempotency-Key.  The request
 * spans two transactions, as one that calls an external service between
 * them would: the first begins it, applies the effect and records a
 * checkpoint; the second finishes it with the response.  A consumer killed
 * between them leaves a checkpointed request that the next delivery resumes
 * (at once: its owner's session is gone) without applying the effect again.
 * Every answer given to a client (the response of a finish, or a replayed
 * one) is written to "responses": every retry must get the first result.
 */
static Outcome
request_apply(Consumer *c, const Delivery *d)
{
	Outcome		o;
	PGresult   *res;
	char		consumer[16];
	char		status[16];
	char	   *body;
	bool		effect;
	const char *begin_params[] = {d->msg_id, d->amount, d->account};
	const char *finish_params[] = {d->msg_id, d->amount, d->account, consumer};

	snprintf(consumer, sizeof(consumer), "%d", c->slot);
	chaos_point(c, P_BEFORE_CLAIM);
	if ((o = run_command(c, "BEGIN", "BEGIN")) != O_DONE)
		return o;
	if (!c->use_idem)
	{
		const char *params[] = {d->msg_id, d->amount, d->account, consumer};

		chaos_point(c, P_AFTER_CLAIM);
		if ((o = run_prepared(c, "effect", 4, params, PGRES_COMMAND_OK, NULL)) != O_DONE)
			return o;
		chaos_point(c, P_BEFORE_COMMIT);
		if ((o = commit(c)) != O_DONE)
			return o;
		count(&shared->committed, 1);
		count(&shared->applied, 1);
		return O_DONE;
	}

	if ((o = run_prepared(c, "begin_request", 3, begin_params, PGRES_TUPLES_OK, &res)) != O_DONE)
		return o;
	snprintf(status, sizeof(status), "%s", PQgetvalue(res, 0, 0));
	/* resumed after the checkpoint: the effect is already committed */
	effect = strcmp(status, "new") == 0 ||
		(strcmp(status, "resume") == 0 && PQgetisnull(res, 0, 1));
	body = strdup(PQgetvalue(res, 0, 2));
	PQclear(res);
	if (strcmp(status, "replay") != 0)
		free(body);

	if (strcmp(status, "in_flight") == 0)
	{
		/* another consumer is on it: leave the delivery for later */
		PQclear(PQexec(c->conn, "ROLLBACK"));
		return O_FAILED;
	}
	if (strcmp(status, "replay") == 0)
	{
		const char *params[] = {d->msg_id, body};

		o = run_prepared(c, "record_replay", 2, params, PGRES_COMMAND_OK, NULL);
		free(body);
		if (o != O_DONE)
			return o;
		chaos_point(c, P_BEFORE_COMMIT);
		if ((o = commit(c)) != O_DONE)
			return o;
		count(&shared->committed, 1);
		count(&shared->absorbed, 1);
		return O_DONE;
	}
	if (strcmp(status, "new") != 0 && strcmp(status, "resume") != 0)
	{
		count(&shared->unexpected, 1);
		fprintf(stderr, "chaos: %s: idem_request_begin said %s for %s\n",
				c->appname, status, d->msg_id);
		PQclear(PQexec(c->conn, "ROLLBACK"));
		return O_FAILED;
	}

	if (effect)
	{
		const char *params[] = {d->msg_id, d->amount, d->account, consumer};

		if ((o = run_prepared(c, "effect", 4, params, PGRES_COMMAND_OK, NULL)) != O_DONE ||
			(o = run_prepared(c, "checkpoint", 1, params, PGRES_TUPLES_OK, NULL)) != O_DONE)
			return o;
		chaos_point(c, P_BEFORE_COMMIT);
		if ((o = commit(c)) != O_DONE)
			return o;
		count(&shared->applied, 1);
		/* between the two transactions: a kill here leaves it to be resumed */
		chaos_point(c, P_AFTER_CLAIM);
		if ((o = run_command(c, "BEGIN", "BEGIN")) != O_DONE)
			return o;
	}
	if ((o = run_prepared(c, "finish_request", 4, finish_params, PGRES_TUPLES_OK, NULL)) != O_DONE)
		return o;
	if ((o = commit(c)) != O_DONE)
		return o;
	count(&shared->committed, 1);
	return O_DONE;
}

static const Kind kinds[] = {
	{
		.name = "claim",
		.setup_sql = "",
		.prepare_sql = {
			"PREPARE effect(text, int, int, int) AS "
			"WITH credit AS (UPDATE accounts SET balance = balance + $2 WHERE id = $3) "
			"INSERT INTO ledger(msg_id, amount, account, consumer) VALUES ($1, $2, $3, $4)",
			NULL
		},
		.apply = claim_apply,
		/* with idem, one committed claim per message and none else */
		.checks_sql =
		"SELECT 'claims not matching a message', "
		"       CASE WHEN (SELECT value FROM chaos_stats WHERE name = 'no_idem') = 1 THEN 0 "
		"            ELSE (SELECT count(*) FROM ("
		"                    SELECT msg_id FROM idem.claims WHERE ns = $1 "
		"                    EXCEPT ALL SELECT DISTINCT msg_id FROM src) x) "
		"               + (SELECT count(*) FROM ("
		"                    SELECT DISTINCT msg_id FROM src "
		"                    EXCEPT ALL SELECT msg_id FROM idem.claims WHERE ns = $1) y) END",
	},
	{
		.name = "request",
		.setup_sql =
		"DROP TABLE IF EXISTS responses;"
		"CREATE TABLE responses (msg_id text NOT NULL, body jsonb NOT NULL);"
		"DELETE FROM idem.requests WHERE ns = 'chaos';",
		.prepare_sql = {
			"PREPARE effect(text, int, int, int) AS "
			"WITH credit AS (UPDATE accounts SET balance = balance + $2 WHERE id = $3) "
			"INSERT INTO ledger(msg_id, amount, account, consumer) VALUES ($1, $2, $3, $4)",
			"PREPARE begin_request(text, int, int) AS "
			"SELECT status, recovery_point, response_body FROM idem_request_begin($1, "
			"  idem_request_fingerprint(jsonb_build_object('amount', $2, 'account', $3)), 'chaos')",
			/* the checkpoint and the finish, each with the answer the client gets */
			"PREPARE checkpoint(text) AS "
			"SELECT idem_request_checkpoint($1, 'applied', NULL, 'chaos')",
			"PREPARE finish_request(text, int, int, int) AS "
			"WITH f AS (SELECT idem_request_finish($1, 201, jsonb_build_object('amount', $2, "
			"  'account', $3, 'consumer', $4), 'chaos')) "
			"INSERT INTO responses SELECT $1, jsonb_build_object('amount', $2, 'account', $3, "
			"  'consumer', $4) FROM f RETURNING 1",
			"PREPARE record_replay(text, jsonb) AS INSERT INTO responses VALUES ($1, $2)",
			NULL
		},
		.apply = request_apply,
		.checks_sql =
		"SELECT 'requests not finished once', "
		"       CASE WHEN (SELECT value FROM chaos_stats WHERE name = 'no_idem') = 1 THEN 0 "
		"            ELSE (SELECT count(*) FROM (SELECT DISTINCT msg_id FROM src) m "
		"                   WHERE NOT EXISTS (SELECT 1 FROM idem.requests r WHERE r.ns = $1 "
		"                                       AND r.key = m.msg_id AND r.response_code = 201)) END "
		"UNION ALL "
		"SELECT 'answers not the first result', "
		"       (SELECT count(*) FROM responses p "
		"         WHERE NOT EXISTS (SELECT 1 FROM idem.requests r WHERE r.ns = $1 "
		"                             AND r.key = p.msg_id AND r.response_body = p.body))",
	},
	{
		.name = "outbox",
		.setup_sql =
		"DROP TABLE IF EXISTS orders, key_state, deliveries;"
	/* the business rows: one per message sent, committed with it */
		"CREATE TABLE orders (msg_id uuid PRIMARY KEY, key text NOT NULL, n int NOT NULL,"
		"  amount int NOT NULL, account int NOT NULL);"
	/* the consumer's side: the last n applied per key */
		"CREATE TABLE key_state (key text PRIMARY KEY, last_n int NOT NULL, prev_n int);"
	/* every lease, committed with it, in the order leases were made */
		"CREATE TABLE deliveries (id bigserial PRIMARY KEY, msg_id uuid NOT NULL,"
		"  attempt int NOT NULL, lease bigint NOT NULL DEFAULT txid_current());"
		"CREATE INDEX ON orders (key, n);"
		"ALTER TABLE ledger ADD COLUMN key text, ADD COLUMN n int, ADD COLUMN prev_n int;"
		"DELETE FROM idem.outbox WHERE aggregatetype = 'chaos';"
		"DELETE FROM idem.outbox_keys WHERE topic = 'chaos';"
	/* relays die often: no message may run out of attempts */
		"SELECT idem_outbox_configure('chaos', 1000, '10 ms', '100 ms');",
		.prepare_sql = {
			"PREPARE effect(text, int, int, int, text, int) AS "
			"WITH k AS (INSERT INTO key_state(key, last_n) VALUES ($5, $6) "
			"           ON CONFLICT (key) DO UPDATE "
			"           SET prev_n = key_state.last_n, last_n = excluded.last_n "
			"           RETURNING prev_n), "
			"     credit AS (UPDATE accounts SET balance = balance + $2 WHERE id = $3) "
			"INSERT INTO ledger(msg_id, amount, account, consumer, key, n, prev_n) "
			"SELECT $1, $2, $3, $4, $5, $6, prev_n FROM k",
			NULL
		},
		.apply = claim_apply,
		.checks_sql =
	/*
	 * a message of a key leased after a lease of the key that began with a
	 * later message (a run's messages that were not delivered are leased
	 * again after the run's later ones, which were leased with them: that
	 * lease began at or before them)
	 */
		"SELECT 'leased out of order', "
		"       (SELECT count(*) FROM ("
		"          SELECT n, max(first) OVER (PARTITION BY key ORDER BY id "
		"                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before "
		"            FROM (SELECT d.id, o.key, o.n, "
		"                         min(o.n) OVER (PARTITION BY o.key, d.lease) AS first "
		"                    FROM deliveries d JOIN orders o USING (msg_id)) y) x "
		"         WHERE before > n) "
		"UNION ALL "
	/* a lease of a key's messages that skipped one */
		"SELECT 'leased with a gap', "
		"       (SELECT count(*) FROM ("
		"          SELECT o.key, d.lease, count(DISTINCT o.n) AS c, min(o.n) AS lo, max(o.n) AS hi "
		"            FROM deliveries d JOIN orders o USING (msg_id) GROUP BY o.key, d.lease) l "
		"         WHERE c <> (SELECT count(*) FROM orders w "
		"                      WHERE w.key = l.key AND w.n BETWEEN l.lo AND l.hi)) "
		"UNION ALL "
		"SELECT 'applied out of order', (SELECT count(*) FROM ledger WHERE prev_n > n) "
		"UNION ALL "
		"SELECT 'leased but rolled back', "
		"       (SELECT count(*) FROM deliveries d "
		"         WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.msg_id = d.msg_id)) "
		"UNION ALL "
		"SELECT 'left in the outbox', "
		"       (SELECT count(*) FROM idem.outbox WHERE aggregatetype = 'chaos') "
		"UNION ALL "
		"SELECT 'dead keys', "
		"       (SELECT count(*) FROM idem.outbox_keys WHERE topic = 'chaos' AND dead) "
		"UNION ALL "
		"SELECT 'claims not matching a message', "
		"       CASE WHEN (SELECT value FROM chaos_stats WHERE name = 'no_idem') = 1 THEN 0 "
		"            ELSE (SELECT count(*) FROM ("
		"                    SELECT msg_id FROM idem.claims WHERE ns = $1 "
		"                    EXCEPT ALL SELECT msg_id::text FROM orders) x) "
		"               + (SELECT count(*) FROM ("
		"                    SELECT msg_id::text FROM orders "
		"                    EXCEPT ALL SELECT msg_id FROM idem.claims WHERE ns = $1) y) END",
		.lease_sql =
		"PREPARE lease(int, int, int) AS "
		"WITH l AS (SELECT * FROM idem_outbox_lease(current_setting('application_name'), $1,"
		"                                          $2 * interval '1 ms', $3)), "
		"     d AS (INSERT INTO deliveries(msg_id, attempt) SELECT id, attempt FROM l) "
		"SELECT id, id::text, payload->>'amount', payload->>'account', key, payload->>'n' FROM l",
		.ack_sql = "PREPARE ack(uuid[]) AS SELECT idem_outbox_ack($1)",
		.nack_sql = "PREPARE nack(uuid) AS "
		"SELECT idem_outbox_nack($1, 'the consumer failed', '1 millisecond')",
		.pending_sql = "SELECT EXISTS (SELECT 1 FROM idem.outbox WHERE aggregatetype = 'chaos')",
		.truth_sql =
		"CREATE TEMP TABLE truth AS "
		"SELECT o.msg_id::text AS msg_id, o.amount, o.account, 1::bigint AS rows, "
		"       coalesce(d.n, 0) AS deliveries, "
		"       NOT EXISTS (SELECT 1 FROM idem.outbox x WHERE x.id = o.msg_id) AS acked "
		"  FROM orders o "
		"  LEFT JOIN (SELECT msg_id, count(*) AS n FROM deliveries GROUP BY msg_id) d USING (msg_id)",
		.producers = true,
		.effect_params = 6,
	},
	{
		.name = "offset",
		.setup_sql =
		"DROP TABLE IF EXISTS stream, part_state;"
	/* the log: numbered messages per partition */
		"CREATE TABLE stream (part int NOT NULL, off bigint NOT NULL, msg_id text NOT NULL,"
		"  amount int NOT NULL, account int NOT NULL, PRIMARY KEY (part, off));"
	/* the consumer's side: the last offset applied per partition */
		"CREATE TABLE part_state (part int PRIMARY KEY, last_off bigint NOT NULL, prev_off bigint);"
		"ALTER TABLE ledger ADD COLUMN part int, ADD COLUMN off bigint, ADD COLUMN prev_off bigint;"
		"SELECT idem_offset_reset(consumer, stream, part, NULL) FROM idem_offsets "
		" WHERE consumer = 'chaos' AND stream = 'chaos';",
		.prepare_sql = {
			"PREPARE position(int) AS SELECT idem_offset_get('chaos', 'chaos', $1)",
			"PREPARE next_messages(int, bigint, int) AS "
			"SELECT off, msg_id, amount, account FROM stream "
			" WHERE part = $1 AND off > $2 ORDER BY off LIMIT $3",
			"PREPARE advance(int, bigint) AS SELECT idem_offset_advance('chaos', 'chaos', $1, $2)",
			"PREPARE effect(text, int, int, int, int, bigint) AS "
			"WITH k AS (INSERT INTO part_state(part, last_off) VALUES ($5, $6) "
			"           ON CONFLICT (part) DO UPDATE "
			"           SET prev_off = part_state.last_off, last_off = excluded.last_off "
			"           RETURNING prev_off), "
			"     credit AS (UPDATE accounts SET balance = balance + $2 WHERE id = $3) "
			"INSERT INTO ledger(msg_id, amount, account, consumer, part, off, prev_off) "
			"SELECT $1, $2, $3, $4, $5, $6, prev_off FROM k",
			NULL
		},
		.checks_sql =
	/* each write must follow the write of the message before it in the log */
		"SELECT 'applied out of order', "
		"       (SELECT count(*) FROM ledger l "
		"          JOIN (SELECT part, off, lag(off) OVER (PARTITION BY part ORDER BY off) AS pred "
		"                  FROM stream) s USING (part, off) "
		"         WHERE l.prev_off IS DISTINCT FROM s.pred) "
		"UNION ALL "
		"SELECT 'offsets not at the end', "
		"       (SELECT count(*) FROM (SELECT part, max(off) AS last FROM stream GROUP BY part) m "
		"          LEFT JOIN idem_offsets o ON o.consumer = $1 AND o.stream = 'chaos' "
		"                                  AND o.part = m.part "
		"         WHERE o.\"offset\" IS DISTINCT FROM m.last) "
		"UNION ALL "
		"SELECT 'offset rows not one per partition', "
		"       abs((SELECT count(*) FROM idem.offsets WHERE consumer = $1 AND stream = 'chaos') "
		"           - (SELECT count(DISTINCT part) FROM stream))",
		.pending_sql =
		"SELECT EXISTS (SELECT 1 FROM (SELECT part, max(off) AS last FROM stream GROUP BY part) m "
		"                WHERE idem_offset_get('chaos', 'chaos', m.part) IS DISTINCT FROM m.last)",
	/* acked: at or below the offset idem stored for its partition */
		.truth_sql =
		"CREATE TEMP TABLE truth AS "
		"SELECT s.msg_id, s.amount, s.account, 1::bigint AS rows, 1::bigint AS deliveries, "
		"       s.off <= coalesce(o.\"offset\", -1) AS acked "
		"  FROM stream s "
		"  LEFT JOIN idem_offsets o ON o.consumer = 'chaos' AND o.stream = 'chaos' "
		"                          AND o.part = s.part",
		.effect_params = 6,
		.consume = offset_consume,
		.total_sql = "SELECT count(*) FROM stream",
	},
};

/*
 * Broken relays of the outbox kind, to prove the order check live: they take
 * any pending messages, in no order and without a lease, as a plain queue
 * would, and ack by deleting them.
 */
static const char *unordered_lease_sql =
"PREPARE lease(int, int, int) AS "
"WITH l AS (SELECT id, aggregateid AS key, payload, 1 AS attempt FROM idem.outbox "
"            WHERE aggregatetype = 'chaos' ORDER BY random() LIMIT $1), "
"     d AS (INSERT INTO deliveries(msg_id, attempt) SELECT id, attempt FROM l) "
"SELECT id, id::text, payload->>'amount', payload->>'account', key, payload->>'n' FROM l";
static const char *unordered_ack_sql =
"PREPARE ack(uuid[]) AS "
"WITH a AS (DELETE FROM idem.outbox WHERE id = ANY ($1) RETURNING 1) SELECT count(*) FROM a";

static const Kind *
find_kind(const char *name)
{
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strcmp(kinds[i].name, name) == 0)
			return &kinds[i];
	die("unknown kind \"%s\"", name);
	return NULL;
}

static bool
consumer_connect(Consumer *c, const Kind *kind)
{
	const char *lease_sql =
		"PREPARE lease(int, int) AS "
		"UPDATE src s SET leased_until = clock_timestamp() + $2 * interval '1 ms', "
		"       deliveries = s.deliveries + 1 "
		"FROM (SELECT seq FROM src WHERE NOT acked AND leased_until < clock_timestamp() "
		"      ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED) p "
		"WHERE s.seq = p.seq RETURNING s.seq, s.msg_id, s.amount, s.account";
	const char *ack_sql =
		"PREPARE ack(bigint[]) AS UPDATE src SET acked = true WHERE seq = ANY ($1)";
	Outcome		o;

	if (kind->consume)
		lease_sql = ack_sql = NULL;
	else if (kind->lease_sql)
	{
		bool		unordered = opt.broken && strcmp(opt.broken, "unordered") == 0;

		lease_sql = unordered ? unordered_lease_sql : kind->lease_sql;
		ack_sql = unordered ? unordered_ack_sql : kind->ack_sql;
	}
	c->conn = connect_retry(c->appname);
	if (c->conn == NULL)
		return false;
	if ((lease_sql && (o = run_command(c, lease_sql, "PREPARE lease")) != O_DONE) ||
		(ack_sql && (o = run_command(c, ack_sql, "PREPARE ack")) != O_DONE) ||
		(kind->nack_sql && (o = run_command(c, kind->nack_sql, "PREPARE nack")) != O_DONE) ||
		(o = run_command(c, "SET statement_timeout = '60s'", "SET")) != O_DONE)
		goto failed;
	for (int i = 0; kind->prepare_sql[i]; i++)
		if ((o = run_command(c, kind->prepare_sql[i], "PREPARE")) != O_DONE)
			goto failed;
	return true;

failed:
	PQfinish(c->conn);
	c->conn = NULL;
	/* a lost connection is tried again, an error in our own SQL is not */
	return o == O_LOST;
}

/*
 * Ack the deliveries listed in seqs (an array literal); empties the list.
 * The ack of src is an UPDATE, that of a kind with its own source returns
 * how many it acked.
 */
static Outcome
ack(Consumer *c, const Kind *kind, char *seqs)
{
	const char *params[] = {seqs};
	PGresult   *res;
	Outcome		o;

	if (strcmp(seqs, "{") == 0)
		return O_DONE;
	strcat(seqs, "}");
	o = run_prepared(c, "ack", 1, params,
					 kind->ack_sql ? PGRES_TUPLES_OK : PGRES_COMMAND_OK, &res);
	if (o == O_DONE)
	{
		count(&shared->acks, atol(kind->ack_sql ? PQgetvalue(res, 0, 0) : PQcmdTuples(res)));
		PQclear(res);
	}
	strcpy(seqs, "{");
	return o;
}

/* A delivery failed: give it back at once (kinds with a nack only). */
static Outcome
nack(Consumer *c, const Kind *kind, const Delivery *d)
{
	const char *params[] = {d->seq};
	PGresult   *res;
	Outcome		o;

	if (kind->nack_sql == NULL)
		return O_DONE;
	o = run_prepared(c, "nack", 1, params, PGRES_TUPLES_OK, &res);
	if (o == O_DONE)
	{
		if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
			count(&shared->nacks, 1);
		PQclear(res);
	}
	return o;
}

static void
ack_later(char *seqs, const Delivery *d)
{
	if (strcmp(seqs, "{") != 0)
		strcat(seqs, ",");
	strcat(seqs, d->seq);
}

/*
 * One message of the offset kind: idem_offset_advance and, when it says
 * true, the business write, in one transaction.  The broken "split"
 * consumer commits the advance on its own before the write.
 */
static Outcome
offset_apply(Consumer *c, const Delivery *d)
{
	Outcome		o;
	PGresult   *res;
	bool		first;
	char		consumer[16];
	const char *adv[] = {d->key, d->n};
	const char *params[] = {d->msg_id, d->amount, d->account, consumer, d->key, d->n};

	snprintf(consumer, sizeof(consumer), "%d", c->slot);
	chaos_point(c, P_BEFORE_CLAIM);
	if ((o = run_command(c, "BEGIN", "BEGIN")) != O_DONE ||
		(o = run_prepared(c, "advance", 2, adv, PGRES_TUPLES_OK, &res)) != O_DONE)
		return o;
	first = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (opt.broken && strcmp(opt.broken, "split") == 0)
	{
		/* deliberately wrong: the offset committed before the write */
		if ((o = commit(c)) != O_DONE)
			return o;
		chaos_point(c, P_AFTER_CLAIM);
		if ((o = run_command(c, "BEGIN", "BEGIN")) != O_DONE)
			return o;
	}
	chaos_point(c, P_AFTER_CLAIM);
	if (first &&
		(o = run_prepared(c, "effect", 6, params, PGRES_COMMAND_OK, NULL)) != O_DONE)
		return o;
	chaos_point(c, P_BEFORE_COMMIT);
	if ((o = commit(c)) != O_DONE)
		return o;
	count(&shared->committed, 1);
	count(first ? &shared->applied : &shared->absorbed, 1);
	if (first)
		count(&shared->acks, 1);
	return O_DONE;
}

/*
 * A consumer of the offset kind.  It picks a partition not known to be
 * drained, resumes after the offset idem stored for it (after a start or a
 * reconnection, up to a batch earlier: the source redelivers from a
 * position behind idem's), and applies the next batch of messages in
 * order.  It is done when every partition's stored offset is its last
 * message's.
 */
static int
offset_consume(int slot, unsigned long generation)
{
	const Kind *kind = find_kind(opt.kind);
	Consumer	c = {.slot = slot};
	Delivery   *batch = calloc(opt.batch, sizeof(Delivery));
	bool	   *resumed = calloc(opt.partitions, sizeof(bool));
	bool	   *drained = calloc(opt.partitions, sizeof(bool));
	bool		reconnecting = generation > 0;
	char		batch_n[16];

	snprintf(c.appname, sizeof(c.appname), "chaos-consumer-%d", slot);
	snprintf(batch_n, sizeof(batch_n), "%d", opt.batch);
	rng_seed(&c.rng, opt.seed * 1000003 + slot * 7919 + generation);
	c.use_idem = true;
	c.effect_params = 6;

	for (;;)
	{
		PGresult   *res;
		int			left = 0;
		int			part = 0;
		long long	from;
		char		part_s[16];
		char		from_s[24];
		const char *params[] = {part_s, from_s, batch_n};
		int			n;

		if (c.conn == NULL)
		{
			if (!consumer_connect(&c, kind))
				_exit(EXIT_GAVE_UP);
			if (c.conn == NULL)
				continue;
			if (reconnecting)
				count(&shared->reconnects, 1);
			reconnecting = true;
			memset(resumed, 0, opt.partitions * sizeof(bool));
		}

		for (int p = 0; p < opt.partitions; p++)
			left += !drained[p];
		if (left == 0)
		{
			/* every partition looked drained: done, unless some is not */
			res = PQexec(c.conn, kind->pending_sql);
			if (PQresultStatus(res) != PGRES_TUPLES_OK)
			{
				failure(&c, res, "done?");
				PQclear(res);
				PQfinish(c.conn);
				c.conn = NULL;
				continue;
			}
			if (strcmp(PQgetvalue(res, 0, 0), "f") == 0)
			{
				PQclear(res);
				PQfinish(c.conn);
				_exit(EXIT_DONE);
			}
			PQclear(res);
			memset(drained, 0, opt.partitions * sizeof(bool));
			sleep_ms(20);
			continue;
		}
		for (int k = (int) rng_below(&c.rng, left);; part++)
			if (!drained[part] && k-- == 0)
				break;
		snprintf(part_s, sizeof(part_s), "%d", part);

		if (run_prepared(&c, "position", 1, params, PGRES_TUPLES_OK, &res) != O_DONE)
		{
			PQfinish(c.conn);
			c.conn = NULL;
			continue;
		}
		from = PQgetisnull(res, 0, 0) ? -1 : atoll(PQgetvalue(res, 0, 0));
		PQclear(res);
		if (!resumed[part])
		{
			resumed[part] = true;
			from -= rng_below(&c.rng, opt.batch + 1);
			if (from < -1)
				from = -1;
		}
		snprintf(from_s, sizeof(from_s), "%lld", from);
		if (run_prepared(&c, "next_messages", 3, params, PGRES_TUPLES_OK, &res) != O_DONE)
		{
			PQfinish(c.conn);
			c.conn = NULL;
			continue;
		}
		n = PQntuples(res);
		for (int i = 0; i < n; i++)
		{
			snprintf(batch[i].seq, sizeof(batch[i].seq), "%s", PQgetvalue(res, i, 0));
			snprintf(batch[i].n, sizeof(batch[i].n), "%s", PQgetvalue(res, i, 0));
			snprintf(batch[i].msg_id, sizeof(batch[i].msg_id), "%s", PQgetvalue(res, i, 1));
			snprintf(batch[i].amount, sizeof(batch[i].amount), "%s", PQgetvalue(res, i, 2));
			snprintf(batch[i].account, sizeof(batch[i].account), "%s", PQgetvalue(res, i, 3));
			snprintf(batch[i].key, sizeof(batch[i].key), "%s", part_s);
		}
		PQclear(res);
		count(&shared->leased, n);
		if (n == 0)
		{
			drained[part] = true;
			continue;
		}

		for (int i = 0; i < n; i++)
		{
			Outcome		o;

			c.kill_at = P_NONE;
			if (opt.kill_every > 0 && rng_below(&c.rng, opt.kill_every) == 0)
				c.kill_at = (Point) (P_BEFORE_CLAIM + rng_below(&c.rng, 4));
			o = offset_apply(&c, &batch[i]);
			if (o == O_DONE)
				chaos_point(&c, P_AFTER_COMMIT);
			else
			{
				/* lost, or an unexpected error: resume from idem's offset */
				if (o == O_LOST)
				{
					PQfinish(c.conn);
					c.conn = NULL;
				}
				break;
			}
		}
	}
}

static int
consumer_main(int slot, unsigned long generation)
{
	const Kind *kind = find_kind(opt.kind);
	Consumer	c = {.slot = slot};
	Delivery   *batch = calloc(opt.batch, sizeof(Delivery));
	char	   *seqs = malloc(opt.batch * sizeof(batch->seq) + 4);
	bool		ack_first = opt.broken && strcmp(opt.broken, "ack-first") == 0;
	bool		run_on = opt.broken && strcmp(opt.broken, "run-on") == 0;
	bool	   *skip = calloc(opt.batch, sizeof(bool));
	char		lease_ms[16];
	char		batch_n[16];
	char		per_key[16];
	bool		reconnecting = generation > 0;

	snprintf(c.appname, sizeof(c.appname), "chaos-consumer-%d", slot);
	snprintf(lease_ms, sizeof(lease_ms), "%d", opt.lease_ms);
	snprintf(batch_n, sizeof(batch_n), "%d", opt.batch);
	snprintf(per_key, sizeof(per_key), "%d", opt.per_key);
	rng_seed(&c.rng, opt.seed * 1000003 + slot * 7919 + generation);
	c.use_idem = !(opt.broken && strcmp(opt.broken, "no-idem") == 0);
	c.effect_params = kind->effect_params ? kind->effect_params : 4;

	for (;;)
	{
		PGresult   *res;
		int			n;
		const char *params[] = {batch_n, lease_ms, per_key};

		if (c.conn == NULL)
		{
			if (!consumer_connect(&c, kind))
				_exit(EXIT_GAVE_UP);
			if (c.conn == NULL)
				continue;
			/* every connection but a slot's very first one replaces a lost one */
			if (reconnecting)
				count(&shared->reconnects, 1);
			reconnecting = true;
		}

		/* the outbox's lease also takes per_key */
		if (run_prepared(&c, "lease", kind->lease_sql ? 3 : 2, params,
						 PGRES_TUPLES_OK, &res) != O_DONE)
		{
			PQfinish(c.conn);
			c.conn = NULL;
			continue;
		}
		n = PQntuples(res);
		for (int i = 0; i < n; i++)
		{
			snprintf(batch[i].seq, sizeof(batch[i].seq), "%s", PQgetvalue(res, i, 0));
			snprintf(batch[i].msg_id, sizeof(batch[i].msg_id), "%s", PQgetvalue(res, i, 1));
			snprintf(batch[i].amount, sizeof(batch[i].amount), "%s", PQgetvalue(res, i, 2));
			snprintf(batch[i].account, sizeof(batch[i].account), "%s", PQgetvalue(res, i, 3));
			batch[i].key[0] = batch[i].n[0] = '\0';
			skip[i] = false;
			if (PQnfields(res) >= 6)
			{
				snprintf(batch[i].key, sizeof(batch[i].key), "%s", PQgetvalue(res, i, 4));
				snprintf(batch[i].n, sizeof(batch[i].n), "%s", PQgetvalue(res, i, 5));
			}
		}
		PQclear(res);
		count(&shared->leased, n);

		if (n == 0)
		{
			/*
			 * nothing to lease: done if nothing is left unacked, once every
			 * message is produced
			 */
			if (kind->producers && !__atomic_load_n(&shared->producers_done, __ATOMIC_SEQ_CST))
			{
				sleep_ms(20);
				continue;
			}
			res = PQexec(c.conn, kind->pending_sql ? kind->pending_sql :
						 "SELECT EXISTS (SELECT 1 FROM src WHERE NOT acked)");
			if (PQresultStatus(res) != PGRES_TUPLES_OK)
			{
				failure(&c, res, "done?");
				PQclear(res);
				PQfinish(c.conn);
				c.conn = NULL;
				continue;
			}
			if (strcmp(PQgetvalue(res, 0, 0), "f") == 0)
			{
				PQclear(res);
				PQfinish(c.conn);
				_exit(EXIT_DONE);
			}
			PQclear(res);
			sleep_ms(20);
			continue;
		}

		/*
		 * Each delivery is committed on its own; the batch is acked once all
		 * its transactions are committed, so a consumer that dies between a
		 * commit and the ack gets several committed messages redelivered.
		 */
		strcpy(seqs, "{");
		for (int i = 0; i < n && c.conn; i++)
		{
			Outcome		o;

			/*
			 * A run of a key stops at its first failure: the nack released
			 * the rest of it, to be leased again after the failed message.
			 */
			if (skip[i])
				continue;
			c.kill_at = P_NONE;
			if (opt.kill_every > 0 && rng_below(&c.rng, opt.kill_every) == 0)
				c.kill_at = (Point) (P_BEFORE_CLAIM + rng_below(&c.rng, 4));
			c.fail = opt.nack_every > 0 && rng_below(&c.rng, opt.nack_every) == 0;

			if (ack_first)
			{
				/* deliberately wrong: ack, then apply */
				ack_later(seqs, &batch[i]);
				o = ack(&c, kind, seqs);
				if (o == O_DONE)
					o = kind->apply(&c, &batch[i]);
			}
			else
			{
				o = kind->apply(&c, &batch[i]);
				if (o == O_DONE)
				{
					ack_later(seqs, &batch[i]);
					chaos_point(&c, P_AFTER_COMMIT);
				}
				else if (o == O_FAILED)
				{
					o = nack(&c, kind, &batch[i]);
					for (int j = i + 1; j < n && opt.per_key > 1 && !run_on; j++)
						if (strcmp(batch[j].key, batch[i].key) == 0)
							skip[j] = true;
				}
			}
			if (o == O_LOST)
			{
				/* the rest of the batch is redelivered when its lease ends */
				PQfinish(c.conn);
				c.conn = NULL;
			}
		}
		if (c.conn && ack(&c, kind, seqs) == O_LOST)
		{
			PQfinish(c.conn);
			c.conn = NULL;
		}
	}
}

/*
 * The chaos process: terminates a random consumer (or producer) backend now
 * and then.
 */
static int
terminator_main(void)
{
	PGconn	   *conn = NULL;

	for (;;)
	{
		PGresult   *res;

		sleep_ms(opt.terminate_ms);
		if (conn == NULL && (conn = connect_retry("chaos-terminator")) == NULL)
			_exit(EXIT_GAVE_UP);
		res = PQexec(conn,
					 "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
					 "FROM (SELECT pid FROM pg_stat_activity "
					 "      WHERE application_name LIKE 'chaos-consumer-%' "
					 "         OR application_name LIKE 'chaos-producer-%' "
					 "      ORDER BY random() LIMIT 1) s");
		if (PQresultStatus(res) == PGRES_TUPLES_OK)
			count(&shared->terminations, atol(PQgetvalue(res, 0, 0)));
		else
		{
			PQfinish(conn);
			conn = NULL;
		}
		PQclear(res);
	}
}

/* ---------- the supervisor of a run ---------- */

static pid_t
spawn(int (*fn) (int, unsigned long), int slot, unsigned long generation)
{
	pid_t		pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0)
		_exit(fn(slot, generation));
	return pid;
}

static int
terminator_entry(int slot, unsigned long generation)
{
	(void) slot;
	(void) generation;
	return terminator_main();
}

/* Run a shell command of the driver; its exit status. */
static int
shell(const char *cmd)
{
	int			rc;

	fflush(stdout);
	fflush(stderr);
	rc = system(cmd);
	return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void
crash_and_restart(int n, long done, long total)
{
	const char *cmd = opt.crash_cmds[n % opt.n_crash_cmds];
	double		t0 = now_s();

	note("chaos: crash %d at %ld of %ld rows acked: %s", n + 1, done, total, cmd);
	if (shell(cmd) != 0)
		die("crash command failed: %s", cmd);
	sleep_ms(100);
	for (;;)
	{
		if (shell(opt.start_cmd) == 0)
			break;
		if (now_s() - t0 > opt.reconnect_s)
			die("the server does not start again: %s", opt.start_cmd);
		sleep_ms(300);
	}
	note("chaos: restarted in %.1fs", now_s() - t0);
}

static void
save_stats(long crashes, double seconds)
{
	PGconn	   *conn = connect_retry("chaos-supervisor");
	char		sql[2048];
	long		kills = 0;

	if (conn == NULL)
		die("cannot save the figures of the run");
	for (int p = P_BEFORE_CLAIM; p < N_POINTS; p++)
		kills += shared->kills[p];
	snprintf(sql, sizeof(sql),
			 "INSERT INTO chaos_stats(name, value) VALUES "
			 "('consumers', %d), ('leased', %ld), ('committed', %ld), ('applied', %ld), "
			 "('absorbed', %ld), ('acks', %ld), ('conn_lost', %ld), ('reconnects', %ld), "
			 "('unexpected', %ld), ('terminations', %ld), ('crashes', %ld), ('kills', %ld), "
			 "('kills_before_claim', %ld), ('kills_after_claim', %ld), "
			 "('kills_before_commit', %ld), ('kills_after_commit', %ld), "
			 "('kills_external', %ld), ('no_idem', %d), ('ack_first', %d), ('ms', %ld), "
			 "('nacks', %ld), ('sends', %ld), ('rolled_back', %ld), ('producer_txns', %ld), "
			 "('producer_kills', %ld), ('per_key', %d) "
			 "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
			 opt.consumers, shared->leased, shared->committed, shared->applied,
			 shared->absorbed, shared->acks, shared->conn_lost, shared->reconnects,
			 shared->unexpected, shared->terminations, crashes, kills,
			 shared->kills[P_BEFORE_CLAIM], shared->kills[P_AFTER_CLAIM],
			 shared->kills[P_BEFORE_COMMIT], shared->kills[P_AFTER_COMMIT],
			 shared->kills[P_EXTERNAL],
			 opt.broken && strcmp(opt.broken, "no-idem") == 0,
			 opt.broken && strcmp(opt.broken, "ack-first") == 0,
			 (long) (seconds * 1000),
			 shared->nacks, shared->sends, shared->rolled_back, shared->producer_txns,
			 shared->producer_kills, opt.per_key);
	must_exec(conn, sql);
	PQfinish(conn);
}

static int
consumer_entry(int slot, unsigned long generation)
{
	const Kind *kind = find_kind(opt.kind);

	return kind->consume ? kind->consume(slot, generation) : consumer_main(slot, generation);
}

/* ---------- producers of the outbox kind ---------- */

/*
 * A producer sends transactions of one to three messages, each with its
 * business row, to keys of its own (key i belongs to producer i % producers),
 * so that its messages of one key are sent one transaction after the other
 * and must be applied in that order.  One transaction in ten rolls back on
 * purpose; with --kill-every, a producer now and then dies after its sends,
 * before its commit.  Where it stands (messages sent, the last n of each
 * key) is in shared memory, so that the producer started in place of one
 * that died goes on from there.
 */
static int
producer_main(int slot, unsigned long generation)
{
	Consumer	p = {.slot = slot};
	long		quota = opt.messages / opt.producers + (slot < opt.messages % opt.producers);
	long		own = (opt.keys - slot + opt.producers - 1) / opt.producers;

	snprintf(p.appname, sizeof(p.appname), "chaos-producer-%d", slot);
	rng_seed(&p.rng, opt.seed * 2000003 + slot * 6007 + generation);

	while (shared->attempted[slot] < quota)
	{
		long		k = 1 + rng_below(&p.rng, 3);
		bool		rollback = rng_below(&p.rng, 10) == 0;
		bool		die_here = opt.kill_every > 0 && rng_below(&p.rng, opt.kill_every) == 0;
		Outcome		o = O_DONE;

		if (p.conn == NULL)
		{
			p.conn = connect_retry(p.appname);
			if (p.conn == NULL)
				_exit(EXIT_GAVE_UP);
			o = run_command(&p,
							"PREPARE send(text, int, int, int) AS "
							"WITH m AS (SELECT idem_outbox_send('chaos', $1, jsonb_build_object("
							"  'n', $2, 'amount', $3, 'account', $4)) AS id) "
							"INSERT INTO orders(msg_id, key, n, amount, account) "
							"SELECT id, $1, $2, $3, $4 FROM m", "PREPARE send");
			if (o == O_DONE)
				o = run_command(&p, "SET statement_timeout = '60s'", "SET");
			if (o != O_DONE)
			{
				PQfinish(p.conn);
				p.conn = NULL;
				if (o == O_LOST)
					continue;
				_exit(EXIT_GAVE_UP);
			}
		}

		if (k > quota - shared->attempted[slot])
			k = quota - shared->attempted[slot];
		o = run_command(&p, "BEGIN", "BEGIN");
		for (long i = 0; i < k && o == O_DONE; i++)
		{
			long		key = slot + opt.producers * rng_below(&p.rng, own);
			char		key_s[32],
						n_s[24],
						amount_s[16],
						account_s[16];
			const char *params[] = {key_s, n_s, amount_s, account_s};

			snprintf(key_s, sizeof(key_s), "k%04ld", key);
			snprintf(n_s, sizeof(n_s), "%ld", ++shared->key_n[key]);
			snprintf(amount_s, sizeof(amount_s), "%d", 1 + (int) rng_below(&p.rng, 1000));
			snprintf(account_s, sizeof(account_s), "%d",
					 1 + (int) rng_below(&p.rng, opt.accounts));
			shared->attempted[slot]++;
			o = run_prepared(&p, "send", 4, params, PGRES_COMMAND_OK, NULL);
		}
		if (o == O_DONE && die_here)
		{
			count(&shared->producer_kills, 1);
			__atomic_thread_fence(__ATOMIC_SEQ_CST);
			if (rng_below(&p.rng, 2) == 0)
				kill(getpid(), SIGKILL);
			_exit(EXIT_KILLED);
		}
		if (o == O_DONE && rollback)
		{
			o = run_command(&p, "ROLLBACK", "ROLLBACK");
			if (o == O_DONE)
				count(&shared->rolled_back, k);
		}
		else if (o == O_DONE)
		{
			/* a commit whose answer is lost may have happened or not */
			o = commit(&p);
			if (o == O_DONE)
			{
				count(&shared->sends, k);
				count(&shared->producer_txns, 1);
			}
		}
		if (o == O_LOST)
		{
			PQfinish(p.conn);
			p.conn = NULL;
		}
		else if (o == O_FAILED)
			PQclear(PQexec(p.conn, "ROLLBACK"));
	}
	if (p.conn)
		PQfinish(p.conn);
	return EXIT_DONE;
}

static int
producer_entry(int slot, unsigned long generation)
{
	return producer_main(slot, generation);
}

/*
 * Every producer has finished: wait until their backends are gone too (one
 * that was terminated may still be on its way out), then let the consumers
 * end once nothing is left to deliver.
 */
static void
producers_finished(void)
{
	for (;;)
	{
		PGconn	   *conn = connect_retry("chaos-supervisor");
		PGresult   *res;
		bool		gone;

		if (conn == NULL)
			die("cannot connect");
		res = PQexec(conn, "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity "
					 "WHERE application_name LIKE 'chaos-producer-%')");
		gone = PQresultStatus(res) == PGRES_TUPLES_OK && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		PQfinish(conn);
		if (gone)
			break;
		sleep_ms(20);
	}
	__atomic_store_n(&shared->producers_done, 1, __ATOMIC_SEQ_CST);
	note("chaos: every producer is done");
}

static int
mode_run(void)
{
	pid_t		pids[MAX_CONSUMERS + MAX_PRODUCERS];
	bool		done[MAX_CONSUMERS + MAX_PRODUCERS];
	unsigned long generation[MAX_CONSUMERS + MAX_PRODUCERS];
	const Kind *kind = find_kind(opt.kind);
	/* slots 0 .. consumers - 1 are consumers, the next ones producers */
	int			nslots = opt.consumers + (kind->producers ? opt.producers : 0);
	int			producing = kind->producers ? opt.producers : 0;
	int			running;
	pid_t		terminator = 0;
	long		total;
	int			crashes = 0;
	double		t0 = now_s();
	double		next_sigkill;
	Rng			rng;
	PGconn	   *conn;

	if (opt.crashes > 0 && (opt.n_crash_cmds == 0 || opt.start_cmd == NULL))
		die("--crashes needs --crash-cmd and --start-cmd");
	rng_seed(&rng, opt.seed ^ 0xC4A05);

	shared = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	memset(shared, 0, sizeof(Shared));

	/* no connection of ours may cross a fork */
	if ((conn = connect_retry("chaos-supervisor")) == NULL)
		die("cannot connect");
	/* with producers, the messages to send (some will roll back) */
	total = kind->producers ? opt.messages :
		query_long(conn, kind->total_sql ? kind->total_sql :
				   "SELECT count(*) FROM src WHERE NOT acked");
	must_exec(conn, "DELETE FROM chaos_stats");
	PQfinish(conn);

	if (kind->producers)
		note("chaos: %d producers sending %ld messages to %d keys, %d %s consumers%s%s",
			 opt.producers, total, opt.keys, opt.consumers, opt.kind,
			 opt.broken ? ", broken: " : "", opt.broken ? opt.broken : "");
	else
		note("chaos: %d %s consumers on %ld deliveries%s%s", opt.consumers, opt.kind, total,
			 opt.broken ? ", broken: " : "", opt.broken ? opt.broken : "");
	for (int i = 0; i < nslots; i++)
	{
		generation[i] = 0;
		done[i] = false;
		pids[i] = i < opt.consumers ? spawn(consumer_entry, i, 0) :
			spawn(producer_entry, i - opt.consumers, 0);
	}
	running = nslots;
	if (opt.terminate_ms > 0)
		terminator = spawn(terminator_entry, 0, 0);
	next_sigkill = opt.sigkill_ms > 0 ? now_s() + opt.sigkill_ms / 1000.0 : 0;

	while (running > 0)
	{
		int			status;
		pid_t		pid;

		while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
		{
			int			slot = -1;

			for (int i = 0; i < nslots; i++)
				if (pids[i] == pid && !done[i])
					slot = i;
			if (slot < 0)
			{
				if (pid == terminator)
					die("the chaos process ended (status %d)", status);
				continue;
			}
			if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_DONE)
			{
				done[slot] = true;
				running--;
				if (slot >= opt.consumers && --producing == 0)
					producers_finished();
				continue;
			}
			if (slot >= opt.consumers &&
				((WIFEXITED(status) && WEXITSTATUS(status) == EXIT_KILLED) ||
				 (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)))
			{
				/* a producer died before its commit: another takes over */
				pids[slot] = spawn(producer_entry, slot - opt.consumers, ++generation[slot]);
				continue;
			}
			if ((WIFEXITED(status) && WEXITSTATUS(status) == EXIT_KILLED) ||
				(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
			{
				Point		p = shared->slot_point[slot];

				count(&shared->kills[p == P_NONE ? P_EXTERNAL : p], 1);
				shared->slot_point[slot] = P_NONE;
				pids[slot] = spawn(consumer_entry, slot, ++generation[slot]);
				continue;
			}
			for (int i = 0; i < nslots; i++)
				if (!done[i] && pids[i] != pid)
					kill(pids[i], SIGKILL);
			if (terminator)
				kill(terminator, SIGKILL);
			die("%s %d failed (%s %d)", slot < opt.consumers ? "consumer" : "producer",
				slot < opt.consumers ? slot : slot - opt.consumers,
				WIFEXITED(status) ? "exit status" : "signal",
				WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		}

		if (now_s() - t0 > opt.timeout_s)
		{
			for (int i = 0; i < nslots; i++)
				if (!done[i])
					kill(pids[i], SIGKILL);
			if (terminator)
				kill(terminator, SIGKILL);
			die("the run did not end in %d seconds (%ld of %ld rows acked)",
				opt.timeout_s, get(&shared->acks), total);
		}

		if (crashes < opt.crashes)
		{
			long		acked = get(&shared->acks);

			if (acked * (opt.crashes + 1) >= total * (crashes + 1))
			{
				crash_and_restart(crashes, acked, total);
				crashes++;
			}
		}

		if (next_sigkill > 0 && now_s() >= next_sigkill)
		{
			int			slot = (int) rng_below(&rng, opt.consumers);

			if (!done[slot])
			{
				shared->slot_point[slot] = P_EXTERNAL;
				kill(pids[slot], SIGKILL);
			}
			next_sigkill = now_s() + opt.sigkill_ms / 1000.0;
		}
		sleep_ms(5);
	}

	if (terminator)
	{
		kill(terminator, SIGKILL);
		waitpid(terminator, NULL, 0);
	}
	save_stats(crashes, now_s() - t0);
	note("chaos: run done in %.1fs", now_s() - t0);
	return 0;
}

/* ---------- setup, produce, check ---------- */

static int
mode_setup(void)
{
	PGconn	   *conn = connect_retry("chaos-setup");
	const Kind *kind = find_kind(opt.kind);
	const char *params[] = {opt.ns};
	PGresult   *res;

	if (conn == NULL)
		die("cannot connect");
	must_exec(conn, "SET client_min_messages = warning");
	must_exec(conn,
			  "CREATE EXTENSION IF NOT EXISTS idem;"
			  "DROP TABLE IF EXISTS src, accounts, ledger, chaos_stats;"
	/* the delivery log: one row per delivery, a row leased is redelivered
	 * when its lease ends unless it was acked */
			  "CREATE TABLE src ("
			  "  seq bigserial PRIMARY KEY,"
			  "  msg_id text NOT NULL,"
			  "  amount int NOT NULL,"
			  "  account int NOT NULL,"
			  "  acked bool NOT NULL DEFAULT false,"
			  "  leased_until timestamptz NOT NULL DEFAULT '-infinity',"
			  "  deliveries int NOT NULL DEFAULT 0"
			  ") WITH (fillfactor = 50);"
			  "CREATE INDEX src_pending ON src (seq) WHERE NOT acked;"
			  "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)"
			  "  WITH (fillfactor = 20);"
	/* deliberately no unique constraint: a message applied twice is two rows */
			  "CREATE TABLE ledger ("
			  "  msg_id text NOT NULL,"
			  "  amount int NOT NULL,"
			  "  account int NOT NULL,"
			  "  consumer int,"
			  "  at timestamptz NOT NULL DEFAULT clock_timestamp());"
			  "CREATE TABLE chaos_stats (name text PRIMARY KEY, value bigint NOT NULL);");
	if (kind->setup_sql[0])
		must_exec(conn, kind->setup_sql);
	if (kind->producers)
	{
		char		sql[200];

		snprintf(sql, sizeof(sql),
				 "INSERT INTO accounts(id) SELECT g FROM generate_series(1, %d) g", opt.accounts);
		must_exec(conn, sql);
	}
	res = PQexecParams(conn, "DELETE FROM idem.claims WHERE ns = $1", 1, NULL, params,
					   NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die("%s", PQerrorMessage(conn));
	PQclear(res);
	PQfinish(conn);
	return 0;
}

/*
 * The log of the offset kind: the messages spread over the partitions, each
 * partition numbered from a small offset up, with a gap now and then.
 */
static int
produce_offset(PGconn *conn)
{
	Rng			rng;
	char		buf[256];
	PGresult   *res;

	rng_seed(&rng, opt.seed);
	snprintf(buf, sizeof(buf),
			 "INSERT INTO accounts(id) SELECT g FROM generate_series(1, %d) g "
			 "ON CONFLICT DO NOTHING", opt.accounts);
	must_exec(conn, buf);
	res = PQexec(conn, "COPY stream (part, off, msg_id, amount, account) FROM STDIN");
	if (PQresultStatus(res) != PGRES_COPY_IN)
		die("%s", PQerrorMessage(conn));
	PQclear(res);
	for (int p = 0; p < opt.partitions; p++)
	{
		long		n = opt.messages / opt.partitions + (p < opt.messages % opt.partitions);
		long		off = rng_below(&rng, 3);

		for (long i = 0; i < n; i++)
		{
			int			len = snprintf(buf, sizeof(buf), "%d\t%ld\ts%lu-p%d-o%ld\t%d\t%d\n",
									   p, off, opt.seed, p, off,
									   1 + (int) rng_below(&rng, 1000),
									   1 + (int) rng_below(&rng, opt.accounts));

			if (PQputCopyData(conn, buf, len) != 1)
				die("%s", PQerrorMessage(conn));
			off += 1 + (rng_below(&rng, 10) == 0 ? 1 + rng_below(&rng, 3) : 0);
		}
	}
	if (PQputCopyEnd(conn, NULL) != 1)
		die("%s", PQerrorMessage(conn));
	res = PQgetResult(conn);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die("%s", PQerrorMessage(conn));
	PQclear(res);
	must_exec(conn, "ANALYZE stream");
	PQfinish(conn);
	note("chaos: produced %ld messages in %d partitions", opt.messages, opt.partitions);
	return 0;
}

static int
mode_produce(void)
{
	PGconn	   *conn = connect_retry("chaos-producer");
	Rng			rng;
	long		n = opt.messages;
	long		dups = (long) (n * opt.redeliver + 0.5);
	long	   *pick;
	long	   *copies;
	long	   *order;
	int		   *amount;
	int		   *account;
	long		ndeliveries = 0;
	char		buf[256];
	PGresult   *res;

	if (conn == NULL)
		die("cannot connect");
	if (find_kind(opt.kind)->producers)
		die("the %s kind produces during the run", opt.kind);
	if (n <= 0 || opt.redeliver < 0 || opt.redeliver > 1 || opt.max_copies < 1)
		die("bad --messages, --redeliver or --max-copies");
	if (find_kind(opt.kind)->consume)
		return produce_offset(conn);
	rng_seed(&rng, opt.seed);
	pick = malloc(n * sizeof(long));
	copies = calloc(n, sizeof(long));
	amount = malloc(n * sizeof(int));
	account = malloc(n * sizeof(int));

	/* exactly "dups" messages get 1 .. max_copies extra deliveries */
	for (long i = 0; i < n; i++)
	{
		pick[i] = i;
		amount[i] = 1 + (int) rng_below(&rng, 1000);
		account[i] = 1 + (int) rng_below(&rng, opt.accounts);
	}
	for (long i = 0; i < dups; i++)
	{
		long		j = i + rng_below(&rng, n - i);
		long		t = pick[i];
		int			extra = 1;

		pick[i] = pick[j];
		pick[j] = t;
		/* more copies, less often */
		while (extra < opt.max_copies && rng_below(&rng, 3) == 0)
			extra++;
		copies[pick[i]] = extra;
	}
	for (long i = 0; i < n; i++)
		ndeliveries += 1 + copies[i];

	/* every delivery, shuffled: copies land before and after the original */
	order = malloc(ndeliveries * sizeof(long));
	ndeliveries = 0;
	for (long i = 0; i < n; i++)
		for (long k = 0; k <= copies[i]; k++)
			order[ndeliveries++] = i;
	for (long i = ndeliveries - 1; i > 0; i--)
	{
		long		j = rng_below(&rng, i + 1);
		long		t = order[i];

		order[i] = order[j];
		order[j] = t;
	}

	snprintf(buf, sizeof(buf),
			 "INSERT INTO accounts(id) SELECT g FROM generate_series(1, %d) g "
			 "ON CONFLICT DO NOTHING", opt.accounts);
	must_exec(conn, buf);
	res = PQexec(conn, "COPY src (msg_id, amount, account) FROM STDIN");
	if (PQresultStatus(res) != PGRES_COPY_IN)
		die("%s", PQerrorMessage(conn));
	PQclear(res);
	for (long i = 0; i < ndeliveries; i++)
	{
		long		m = order[i];
		int			len = snprintf(buf, sizeof(buf), "m%lu-%07ld\t%d\t%d\n",
								   opt.seed, m + 1, amount[m], account[m]);

		if (PQputCopyData(conn, buf, len) != 1)
			die("%s", PQerrorMessage(conn));
	}
	if (PQputCopyEnd(conn, NULL) != 1)
		die("%s", PQerrorMessage(conn));
	res = PQgetResult(conn);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die("%s", PQerrorMessage(conn));
	PQclear(res);
	must_exec(conn, "ANALYZE src");
	PQfinish(conn);
	note("chaos: produced %ld messages in %ld deliveries (%ld messages with extra copies)",
		 n, ndeliveries, dups);
	free(pick);
	free(copies);
	free(order);
	free(amount);
	free(account);
	return 0;
}

static int
mode_check(void)
{
	PGconn	   *conn = connect_retry("chaos-check");
	const Kind *kind = find_kind(opt.kind);
	PGresult   *res;
	const char *params[] = {opt.ns};
	long		messages, deliveries, redelivered, unacked, lost, twice, extra_rows,
				strangers, rows;
	long		expected_sum, ledger_sum, balance_sum, bad_accounts;
	long		kind_bad = 0;
	bool		ok;

	if (conn == NULL)
		die("cannot connect");
	/* every message and how it was delivered */
	must_exec(conn, kind->truth_sql ? kind->truth_sql :
			  "CREATE TEMP TABLE truth AS "
			  "SELECT msg_id, min(amount) AS amount, min(account) AS account, "
			  "       count(*) AS rows, sum(deliveries) AS deliveries, "
			  "       bool_and(acked) AS acked "
			  "FROM src GROUP BY msg_id");
	must_exec(conn,
			  "CREATE TEMP TABLE applied AS "
			  "SELECT msg_id, count(*) AS n FROM ledger GROUP BY msg_id;");
	res = must_query(conn,
					 "SELECT count(*), coalesce(sum(deliveries), 0), "
					 "       count(*) FILTER (WHERE deliveries > 1), "
					 "       count(*) FILTER (WHERE NOT acked), "
					 "       coalesce(sum(amount), 0), sum(rows) "
					 "FROM truth");
	messages = atol(PQgetvalue(res, 0, 0));
	deliveries = atol(PQgetvalue(res, 0, 1));
	redelivered = atol(PQgetvalue(res, 0, 2));
	unacked = atol(PQgetvalue(res, 0, 3));
	expected_sum = atol(PQgetvalue(res, 0, 4));
	rows = atol(PQgetvalue(res, 0, 5));
	PQclear(res);

	lost = query_long(conn,
					  "SELECT count(*) FROM truth t "
					  "WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.msg_id = t.msg_id)");
	twice = query_long(conn, "SELECT count(*) FROM applied WHERE n > 1");
	extra_rows = query_long(conn, "SELECT coalesce(sum(n - 1), 0) FROM applied WHERE n > 1");
	strangers = query_long(conn,
						   "SELECT count(*) FROM applied a "
						   "WHERE NOT EXISTS (SELECT 1 FROM truth t WHERE t.msg_id = a.msg_id)");
	ledger_sum = query_long(conn, "SELECT coalesce(sum(amount), 0) FROM ledger");
	balance_sum = query_long(conn, "SELECT coalesce(sum(balance), 0) FROM accounts");
	/* each account holds exactly what its ledger rows say */
	bad_accounts = query_long(conn,
							  "SELECT count(*) FROM accounts a "
							  "FULL JOIN (SELECT account, sum(amount) AS s FROM ledger GROUP BY account) l "
							  "ON l.account = a.id "
							  "WHERE coalesce(a.balance, -1) <> coalesce(l.s, 0)");

	ok = lost == 0 && twice == 0 && strangers == 0 && unacked == 0 &&
		balance_sum == expected_sum && ledger_sum == expected_sum && bad_accounts == 0;

	printf("messages             %ld\n", messages);
	printf("source rows          %ld (%ld injected redeliveries)\n", rows, rows - messages);
	printf("deliveries           %ld\n", deliveries);
	printf("redeliveries         %ld\n", deliveries - messages);
	printf("redelivered messages %ld (%.1f%%)\n", redelivered,
		   messages ? 100.0 * redelivered / messages : 0.0);

	/* figures of the run, if it saved them */
	res = must_query(conn, "SELECT name, value FROM chaos_stats ORDER BY name");
	{
		long		v[32] = {0};
		const char *names[] = {
			"kills", "kills_before_claim", "kills_after_claim", "kills_before_commit",
			"kills_after_commit", "kills_external", "terminations", "crashes",
			"absorbed", "applied", "committed", "conn_lost", "reconnects", "unexpected",
			"consumers", "ms", NULL
		};

		for (int r = 0; r < PQntuples(res); r++)
			for (int k = 0; names[k]; k++)
				if (strcmp(PQgetvalue(res, r, 0), names[k]) == 0)
					v[k] = atol(PQgetvalue(res, r, 1));
		if (PQntuples(res) > 0)
		{
			printf("consumers            %ld, %.1fs\n", v[14], v[15] / 1000.0);
			printf("kills                %ld (before claim %ld, after claim %ld, "
				   "before commit %ld, after commit %ld, external %ld)\n",
				   v[0], v[1], v[2], v[3], v[4], v[5]);
			printf("backend terminations %ld\n", v[6]);
			printf("server crashes       %ld\n", v[7]);
			printf("connections lost     %ld, reconnects %ld\n", v[11], v[12]);
			printf("unexpected errors    %ld\n", v[13]);
			printf("duplicates absorbed  %ld (committed transactions where idem_claim said false)\n",
				   v[8]);
		}
		PQclear(res);
	}

	printf("messages applied     %ld\n", messages - lost);
	printf("lost                 %ld\n", lost);
	printf("applied twice        %ld (%ld extra ledger rows)\n", twice, extra_rows);
	if (strangers)
		printf("unknown messages     %ld\n", strangers);
	if (unacked)
		printf("unacked rows         %ld\n", unacked);
	printf("sum of amounts       %ld expected, %ld in the ledger, %ld in the accounts%s\n",
		   expected_sum, ledger_sum, balance_sum,
		   bad_accounts ? " (accounts not matching their ledger rows)" : "");

	if (kind->checks_sql)
	{
		res = PQexecParams(conn, kind->checks_sql, 1, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die("%s", PQerrorMessage(conn));
		for (int r = 0; r < PQntuples(res); r++)
		{
			long		bad = atol(PQgetvalue(res, r, 1));

			printf("%-20s %ld\n", PQgetvalue(res, r, 0), bad);
			kind_bad += bad;
		}
		PQclear(res);
	}
	ok = ok && kind_bad == 0;
	printf("every message applied exactly once: %s\n", ok ? "yes" : "NO");

	/* one line for scripts */
	res = must_query(conn, "SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM chaos_stats");
	printf("RESULT messages=%ld deliveries=%ld redeliveries=%ld redelivered=%ld lost=%ld "
		   "twice=%ld extra_rows=%ld strangers=%ld unacked=%ld sum_ok=%d kind_bad=%ld ok=%d %s\n",
		   messages, deliveries, deliveries - messages, redelivered, lost, twice, extra_rows,
		   strangers, unacked,
		   balance_sum == expected_sum && ledger_sum == expected_sum && bad_accounts == 0,
		   kind_bad, ok, PQgetisnull(res, 0, 0) ? "" : PQgetvalue(res, 0, 0));
	PQclear(res);
	PQfinish(conn);
	return ok ? 0 : 1;
}

/* ---------- main ---------- */

static void
usage(void)
{
	fprintf(stderr,
			"usage: chaos setup|produce|run|check [options]\n"
			"  -d, --dbname CONNINFO      where to connect (default: libpq environment)\n"
			"  --kind NAME                consumer kind: claim (default), request, outbox or offset\n"
			"  --ns NAME                  idem namespace (chaos)\n"
			"  --messages N               messages to produce, or for the outbox kind to send (100000)\n"
			"  --redeliver F              share of messages given extra copies (0.35)\n"
			"  --max-copies N             at most N extra copies of a message (3)\n"
			"  --accounts N               accounts credited (100)\n"
			"  --seed N                   random seed (1)\n"
			"  --consumers N              consumer processes (4)\n"
			"  --producers N              outbox kind: producer processes (4)\n"
			"  --keys N                   outbox kind: keys the messages are sent to (64)\n"
			"  --partitions N             offset kind: partitions of the log (8)\n"
			"  --nack-every N             one delivery in N fails and is nacked (outbox kind)\n"
			"  --batch N                  rows leased at a time (32)\n"
			"  --lease-ms N               lease of a row before redelivery (1000)\n"
			"  --per-key N                outbox kind: lease runs of up to N messages a key (1)\n"
			"  --kill-every N             a consumer dies once per N deliveries on average\n"
			"  --sigkill-ms N             SIGKILL a random consumer every N ms\n"
			"  --terminate-ms N           pg_terminate_backend a consumer every N ms\n"
			"  --crashes N                crash and restart the server N times\n"
			"  --crash-cmd CMD            shell command that crashes it (repeat: used in turn)\n"
			"  --start-cmd CMD            shell command that starts it again\n"
			"  --reconnect-s N            give up reaching the server after N seconds (120)\n"
			"  --timeout-s N              give up a run after N seconds (1800)\n"
			"  --no-idem                  broken consumer: skip idem_claim\n"
			"  --broken no-idem|ack-first|unordered|run-on|split\n"
			"                             broken consumer, to prove the checker live (run-on:\n"
			"                             goes on with a key's run after a failure)\n"
			"  -q, --quiet                no progress on stderr\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"dbname", required_argument, NULL, 'd'},
		{"kind", required_argument, NULL, 'k'},
		{"ns", required_argument, NULL, 'n'},
		{"messages", required_argument, NULL, 'm'},
		{"redeliver", required_argument, NULL, 'r'},
		{"max-copies", required_argument, NULL, 'x'},
		{"accounts", required_argument, NULL, 'a'},
		{"seed", required_argument, NULL, 's'},
		{"consumers", required_argument, NULL, 'c'},
		{"producers", required_argument, NULL, 'P'},
		{"keys", required_argument, NULL, 'y'},
		{"partitions", required_argument, NULL, 'Q'},
		{"nack-every", required_argument, NULL, 'F'},
		{"batch", required_argument, NULL, 'b'},
		{"lease-ms", required_argument, NULL, 'l'},
		{"per-key", required_argument, NULL, 'U'},
		{"kill-every", required_argument, NULL, 'K'},
		{"sigkill-ms", required_argument, NULL, 'S'},
		{"terminate-ms", required_argument, NULL, 'T'},
		{"crashes", required_argument, NULL, 'C'},
		{"crash-cmd", required_argument, NULL, 'X'},
		{"start-cmd", required_argument, NULL, 'Y'},
		{"reconnect-s", required_argument, NULL, 'R'},
		{"timeout-s", required_argument, NULL, 'W'},
		{"no-idem", no_argument, NULL, 'N'},
		{"broken", required_argument, NULL, 'B'},
		{"quiet", no_argument, NULL, 'q'},
		{NULL, 0, NULL, 0}
	};
	const char *mode;
	int			ch;

	if (argc < 2)
		usage();
	mode = argv[1];
	optind = 2;
	while ((ch = getopt_long(argc, argv, "d:q", longopts, NULL)) != -1)
	{
		switch (ch)
		{
			case 'd':
				opt.conninfo = optarg;
				break;
			case 'k':
				opt.kind = optarg;
				break;
			case 'n':
				opt.ns = optarg;
				break;
			case 'm':
				opt.messages = atol(optarg);
				break;
			case 'r':
				opt.redeliver = atof(optarg);
				break;
			case 'x':
				opt.max_copies = atoi(optarg);
				break;
			case 'a':
				opt.accounts = atoi(optarg);
				break;
			case 's':
				opt.seed = strtoul(optarg, NULL, 10);
				break;
			case 'c':
				opt.consumers = atoi(optarg);
				break;
			case 'P':
				opt.producers = atoi(optarg);
				break;
			case 'y':
				opt.keys = atoi(optarg);
				break;
			case 'Q':
				opt.partitions = atoi(optarg);
				break;
			case 'F':
				opt.nack_every = atol(optarg);
				break;
			case 'b':
				opt.batch = atoi(optarg);
				break;
			case 'l':
				opt.lease_ms = atoi(optarg);
				break;
			case 'U':
				opt.per_key = atoi(optarg);
				break;
			case 'K':
				opt.kill_every = atol(optarg);
				break;
			case 'S':
				opt.sigkill_ms = atoi(optarg);
				break;
			case 'T':
				opt.terminate_ms = atoi(optarg);
				break;
			case 'C':
				opt.crashes = atoi(optarg);
				break;
			case 'X':
				if (opt.n_crash_cmds == MAX_CRASH_CMDS)
					die("too many --crash-cmd");
				opt.crash_cmds[opt.n_crash_cmds++] = optarg;
				break;
			case 'Y':
				opt.start_cmd = optarg;
				break;
			case 'R':
				opt.reconnect_s = atoi(optarg);
				break;
			case 'W':
				opt.timeout_s = atoi(optarg);
				break;
			case 'N':
				opt.broken = "no-idem";
				break;
			case 'B':
				if (strcmp(optarg, "no-idem") != 0 && strcmp(optarg, "ack-first") != 0 &&
					strcmp(optarg, "unordered") != 0 && strcmp(optarg, "run-on") != 0 &&
					strcmp(optarg, "split") != 0)
					die("--broken takes no-idem, ack-first, unordered, run-on or split");
				opt.broken = optarg;
				break;
			case 'q':
				opt.quiet = true;
				break;
			default:
				usage();
		}
	}
	if (optind < argc)
		usage();
	if (opt.consumers < 1 || opt.consumers > MAX_CONSUMERS)
		die("--consumers must be between 1 and %d", MAX_CONSUMERS);
	if (opt.batch < 1 || opt.lease_ms < 1 || opt.accounts < 1)
		die("--batch, --lease-ms and --accounts must be positive");
	if (opt.producers < 1 || opt.producers > MAX_PRODUCERS)
		die("--producers must be between 1 and %d", MAX_PRODUCERS);
	if (opt.keys < opt.producers || opt.keys > MAX_KEYS)
		die("--keys must be between --producers and %d", MAX_KEYS);
	if (opt.broken && strcmp(opt.broken, "unordered") == 0 && !find_kind(opt.kind)->lease_sql)
		die("--broken unordered is for the outbox kind");
	if (opt.per_key < 1 || opt.per_key > 10000)
		die("--per-key must be between 1 and 10000");
	if ((opt.per_key > 1 || (opt.broken && strcmp(opt.broken, "run-on") == 0)) &&
		!find_kind(opt.kind)->lease_sql)
		die("--per-key and --broken run-on are for the outbox kind");
	if (opt.broken && (find_kind(opt.kind)->consume != NULL) != (strcmp(opt.broken, "split") == 0))
		die("the offset kind takes --broken split, and only it does");
	if (opt.partitions < 1)
		die("--partitions must be positive");
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (strcmp(mode, "setup") == 0)
		return mode_setup();
	if (strcmp(mode, "produce") == 0)
		return mode_produce();
	if (strcmp(mode, "run") == 0)
		return mode_run();
	if (strcmp(mode, "check") == 0)
		return mode_check();
	usage();
	return 2;
}
