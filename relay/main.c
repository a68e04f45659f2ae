/*
 * idem-relay: delivers idem's transactional outbox.
 *
 * The loop: connect (libpq: a connection string, or the PG* environment),
 * LISTEN idem_outbox, then lease a batch with idem_outbox_lease, publish
 * it through the sinks its topics are routed to, acknowledge what they
 * confirmed with idem_outbox_ack and nack the rest with idem_outbox_nack;
 * lease again at once while leases bring messages, and when one comes back
 * empty wait for a notification on idem_outbox, or the poll interval,
 * whichever comes first.  A relay that dies at any point loses nothing:
 * what it leased comes back when its leases run out.
 *
 * See --help (usage() below) and the README's "Running the relay".
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "relay.h"

/* ---- Settings ---- */

typedef struct Settings
{
	const char *dbname;			/* NULL: the libpq environment */
	char	   *name;
	int			batch;
	int			per_key;		/* runs of up to this many messages a key */
	long long	max_bytes;		/* of one lease's messages; 0: no limit */
	long		lease_ms;
	long		poll_ms;
	long		linger_ms;		/* after a lease of fewer than batch */
	long		timeout_ms;
	long		log_interval_ms;
	long		reconnect_max_ms;
	int			connect_attempts;
	int			exit_on_error;
	int			once;
	const char *sink;
} Settings;

static Settings settings;

static const char *const global_keys[] = {
	"dbname", "name", "batch", "per_key", "max_bytes", "lease", "poll", "linger", "timeout", "log_interval",
	"reconnect_max", "connect_attempts", "exit_on_error", "once", "verbose",
	"sink", NULL
};

/* ---- Routes: a sink instance per configured topic, and a default ---- */

typedef struct Route
{
	char	   *topic;			/* NULL: every other topic */
	const SinkType *type;
	Sink	   *sink;
} Route;

static Route *routes;
static int	nroutes;
/* the route of routes[] that sinks_ready found down, or -1 */
static int	sink_down = -1;

/* ---- Counts ---- */

typedef struct Counts
{
	long		leased;
	long		delivered;
	long		retried;
	long		dead;
	long		errors;
} Counts;

static Counts interval_counts;
static Counts total_counts;
static char last_error[OUTCOME_ERROR_LEN];
static int64_t interval_start;
static int64_t next_log;

/* ---- Signals ---- */

static volatile sig_atomic_t stop_requested = 0;	/* finish the batch */
static volatile sig_atomic_t stop_now = 0;	/* release it */
static volatile sig_atomic_t reload_requested = 0;	/* SIGHUP */
static int	wake_pipe[2] = {-1, -1};

/* ---- The connection ---- */

static PGconn *conn = NULL;

static void
usage(FILE *f)
{
	fprintf(f,
			"idem-relay delivers the messages of idem's transactional outbox.\n"
			"\n"
			"Usage:\n"
			"  idem-relay [OPTION]...\n"
			"\n"
			"Connection:\n"
			"  -d, --dbname=CONNINFO    a libpq connection string or URI; without it, the\n"
			"                           environment (PGHOST, PGPORT, PGDATABASE, PGUSER,\n"
			"                           PGPASSWORD, PGSERVICE, ~/.pgpass) as for psql\n"
			"  -n, --name=NAME          the relay's name in the leases (default HOST:PID:RANDOM)\n"
			"      --reconnect-max=DUR  longest wait between reconnections (default 30s)\n"
			"      --exit-on-error      exit instead of retrying: 2 after CONNECT_ATTEMPTS\n"
			"                           failed connections, 3 when a statement fails\n"
			"      --connect-attempts=N connections tried before exit code 2 (default 5)\n"
			"\n"
			"Delivery:\n"
			"  -b, --batch=N            messages leased at once, 1 to 10000 (default 100)\n"
			"      --per-key=N          lease runs of up to N consecutive messages of a key,\n"
			"                           1 to 10000 (default 1); a run is published one\n"
			"                           message after the other and stops at a failure\n"
			"      --max-bytes=SIZE     take no more message into a lease once those taken\n"
			"                           hold SIZE of payload and headers (at least one is\n"
			"                           taken); 0 for no limit (default 64MB)\n"
			"  -l, --lease=DUR          how long a lease lasts (default 30s)\n"
			"  -p, --poll=DUR           wait for a notification at most this long (default 1s)\n"
			"      --linger=DUR         after a lease of fewer than --batch messages, wait\n"
			"                           this long before the next, so that one lease takes\n"
			"                           what several commits sent; not while waiting gains\n"
			"                           nothing (few keys ready); at most --poll (default\n"
			"                           1ms, 0 for none)\n"
			"  -t, --timeout=DUR        longest publish of one message; at most half the\n"
			"                           lease; no message is started with less left (default 10s)\n"
			"      --once               stop (exit 0) when a lease comes back empty\n"
			"\n"
			"Sinks:\n"
			"      --sink=NAME          the sink of every topic: %s (default stdout)\n"
			"      --webhook-url=URL    the webhook sink's URL (webhook.url)\n"
			"      --nats-url=URL       the nats sink's server, nats://HOST:PORT (nats.url,\n"
			"                           default nats://127.0.0.1:4222)\n"
			"  -s, --set=KEY=VALUE      any setting of the configuration file, such as\n"
			"                           topic.orders.sink=webhook\n"
			"  -c, --config=FILE        read settings (key = value lines) from FILE; the\n"
			"                           options above win over it\n"
			"\n"
			"Output:\n"
			"      --log-interval=DUR   one line of counts on stderr this often, 0 for none\n"
			"                           (default 10s)\n"
			"  -v, --verbose            one line per message outcome\n"
			"  -V, --version            print the version and exit\n"
			"  -h, --help               print this help and exit\n"
			"\n"
			"DUR is seconds (decimals allowed) or a number with ms, s, min or h.\n"
			"SIZE is bytes, or a number with kB, MB, GB or TB (1024 based).\n"
			"\n"
			"Exit codes:\n"
			"  0  stopped by SIGTERM or SIGINT (the batch in hand is finished; a second\n"
			"     signal releases what is not yet published), or --once found no message\n"
			"  1  bad option or configuration\n"
			"  2  --exit-on-error: could not connect to the database\n"
			"  3  --exit-on-error: a statement failed (idem missing, no privilege, ...)\n"
			"  4  a sink cannot start or go on (standard output closed, ...), or, with\n"
			"     --once, a sink is down (its broker cannot be reached)\n",
			sink_type_names());
}

/* ---- Logging of counts ---- */

static void
log_counts(int final)
{
	int64_t		now = now_ms();
	const Counts *c = final ? &total_counts : &interval_counts;

	if (final)
		relay_log(LOG_INFO, "stopped: leased %ld, delivered %ld, retried %ld, dead %ld, errors %ld in all",
				  c->leased, c->delivered, c->retried, c->dead, c->errors);
	else
		relay_log(LOG_INFO, "leased %ld, delivered %ld, retried %ld, dead %ld, errors %ld in %.0f s%s%s",
				  c->leased, c->delivered, c->retried, c->dead, c->errors,
				  (double) (now - interval_start) / 1000.0,
				  last_error[0] ? "; last error: " : "", last_error);
	memset(&interval_counts, 0, sizeof(interval_counts));
	last_error[0] = '\0';
	interval_start = now;
	next_log = settings.log_interval_ms > 0 ? now + settings.log_interval_ms : INT64_MAX;
}

static void
maybe_log(void)
{
	if (now_ms() >= next_log)
		log_counts(0);
}

static void
count(long *field_of_interval, long *field_of_total, long n)
{
	*field_of_interval += n;
	*field_of_total += n;
}

#define COUNT(field, n) count(&interval_counts.field, &total_counts.field, (n))

static void
note_error(const char *msg)
{
	COUNT(errors, 1);
	printable_copy(last_error, sizeof(last_error), msg, strlen(msg));
}

/* ---- Signals and waiting ---- */

static void
on_signal(int signo)
{
	int			save = errno;

	if (stop_requested)
		stop_now = 1;
	stop_requested = 1;
	if (write(wake_pipe[1], "x", 1) < 0)
	{
		/* the pipe is full: the loop wakes up anyway */
	}
	errno = save;
}

static void
on_sighup(int signo)
{
	int			save = errno;

	reload_requested = 1;
	if (write(wake_pipe[1], "x", 1) < 0)
	{
		/* the pipe is full: the loop wakes up anyway */
	}
	errno = save;
}

/*
 * Standard input, output and error that the relay was started without are
 * opened on /dev/null before anything takes their numbers: the wake pipe
 * on descriptor 1 would receive what the stdout sink writes, and the relay
 * would acknowledge messages that nobody read.  Standard output is opened
 * for reading only, so that the stdout sink's writes fail as they would on
 * a closed descriptor.
 */
static void
open_standard_fds(void)
{
	int			fd;

	for (fd = 0; fd <= 2; fd++)
	{
		int			got;

		if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
			continue;
		got = open("/dev/null", fd == 2 ? O_WRONLY : O_RDONLY);
		if (got != fd)
			exit(EXIT_RELAY_SINK);
	}
}

static void
setup_signals(void)
{
	struct sigaction sa;

	if (pipe(wake_pipe) != 0)
	{
		relay_log(LOG_ERROR, "could not create a pipe: %s", strerror(errno));
		exit(EXIT_RELAY_SINK);
	}
	fcntl(wake_pipe[0], F_SETFL, O_NONBLOCK);
	fcntl(wake_pipe[1], F_SETFL, O_NONBLOCK);
	fcntl(wake_pipe[0], F_SETFD, FD_CLOEXEC);
	fcntl(wake_pipe[1], F_SETFD, FD_CLOEXEC);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_sighup;
	sigaction(SIGHUP, &sa, NULL);
	/* a closed pipe on stdout is an error of write(2), not a death */
	signal(SIGPIPE, SIG_IGN);
}

/*
 * SIGHUP before setup_signals (the sinks are still starting): the reload is
 * made once the relay runs, as for one that comes later.  Without it, a
 * reload right after a start ended the relay (SIGHUP's default action).
 */
static void
on_early_sighup(int signo)
{
	reload_requested = 1;
}

/* Drops the notifications received so far; returns whether there were any. */
static int
drain_notifications(void)
{
	PGnotify   *n;
	int			any = 0;

	if (conn == NULL)
		return 0;
	while ((n = PQnotifies(conn)) != NULL)
	{
		PQfreemem(n);
		any = 1;
	}
	return any;
}

static void drop_connection(void);

/*
 * Waits until deadline, a signal, or (when listen) a notification or the
 * loss of the connection; logs the counts when due.  Returns 1 when a
 * notification came.
 */
static int
wait_until(int64_t deadline, int listen)
{
	for (;;)
	{
		struct pollfd fds[2];
		int			nfds = 1;
		int64_t		now = now_ms();
		int64_t		until;
		int			timeout;
		char		buf[16];

		if (stop_requested || reload_requested)
			return 0;
		if (now >= next_log)
			log_counts(0);
		if (now >= deadline)
			return 0;
		until = deadline < next_log ? deadline : next_log;
		timeout = until - now > INT_MAX ? INT_MAX : (int) (until - now);
		fds[0].fd = wake_pipe[0];
		fds[0].events = POLLIN;
		if (listen && conn != NULL)
		{
			fds[1].fd = PQsocket(conn);
			fds[1].events = POLLIN;
			nfds = 2;
		}
		if (poll(fds, (nfds_t) nfds, timeout) < 0)
		{
			if (errno == EINTR)
				continue;
			relay_log(LOG_ERROR, "poll failed: %s", strerror(errno));
			return 0;
		}
		while (read(wake_pipe[0], buf, sizeof(buf)) > 0)
			;
		if (nfds == 2 && fds[1].revents != 0)
		{
			PGnotify   *n;
			int			got = 0;

			if (!PQconsumeInput(conn))
			{
				relay_log(LOG_WARNING, "connection lost: %s", PQerrorMessage(conn));
				note_error("connection lost");
				drop_connection();
				return 0;
			}
			while ((n = PQnotifies(conn)) != NULL)
			{
				relay_log(LOG_DEBUG, "notified: topic %s", n->extra);
				PQfreemem(n);
				got = 1;
			}
			if (got)
				return 1;
		}
	}
}

/* ---- The database ---- */

static char *schema = NULL;		/* idem's schema, quoted */

static void
drop_connection(void)
{
	if (conn != NULL)
		PQfinish(conn);
	conn = NULL;
}

/* The primary message and SQLSTATE of a failed result, on one line. */
static void
result_error(PGresult *res, char *buf, size_t size)
{
	const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	char		line[400];

	if (msg == NULL)
		msg = PQerrorMessage(conn);
	/* libpq's own messages span lines */
	snprintf(line, sizeof(line), "%s", msg);
	one_line(line);
	printable_copy(line, sizeof(line), line, strlen(line));
	if (state)
		snprintf(buf, size, "%s (SQLSTATE %s)", line, state);
	else
		snprintf(buf, size, "%s", line);
}

/*
 * A statement failed.  Returns 0 when the connection was lost, -1
 * otherwise; either way the connection is dropped and made again after a
 * backoff (a missing extension or privilege may be fixed meanwhile), or,
 * with --exit-on-error, the relay exits.
 */
static int
statement_failed(PGresult *res, const char *what)
{
	char		msg[512];
	int			lost = PQstatus(conn) == CONNECTION_BAD;

	result_error(res, msg, sizeof(msg));
	if (stop_now && res != NULL && PQresultErrorField(res, PG_DIAG_SQLSTATE) != NULL &&
		strcmp(PQresultErrorField(res, PG_DIAG_SQLSTATE), "57014") == 0)
	{
		/* cancelled by a second signal: the relay stops, as asked */
		PQclear(res);
		relay_log(LOG_INFO, "%s cancelled: stopping", what);
		drop_connection();
		return -1;
	}
	if (res)
		PQclear(res);
	relay_log(LOG_ERROR, "%s failed: %s", what, msg);
	note_error(msg);
	drop_connection();
	if (lost)
		return 0;
	if (settings.exit_on_error)
	{
		relay_log(LOG_ERROR, "exiting (--exit-on-error)");
		log_counts(1);
		exit(EXIT_RELAY_QUERY);
	}
	return -1;
}

/*
 * PQexecPrepared that a second signal can interrupt: a statement may wait
 * for a lock for long (ALTER EXTENSION idem UPDATE locks idem's tables), and
 * a relay asked twice to stop must not wait with it.  A statement still
 * running STOP_CANCEL_GRACE_MS after it was sent and after the second
 * signal is cancelled, and fails with 57014: the ack and nack that wind up
 * a batch after the second signal take that long only when they wait.  A
 * cancel without an answer within STOP_GIVE_UP_MS drops the connection.
 */
#define STOP_CANCEL_GRACE_MS	1000
#define STOP_GIVE_UP_MS			5000

static PGresult *
exec_prepared(const char *name, int nparams, const char *const *params)
{
	PGresult   *res = NULL;
	PGresult   *r;
	int64_t		sent = now_ms();
	int64_t		stop_seen = 0;
	int64_t		cancelled = 0;

	if (!PQsendQueryPrepared(conn, name, nparams, params, NULL, NULL, 0))
		return NULL;
	for (;;)
	{
		struct pollfd fds[2];
		int64_t		now;

		if (PQconsumeInput(conn) == 0)
			break;
		if (!PQisBusy(conn))
			break;
		now = now_ms();
		if (stop_now && stop_seen == 0)
			stop_seen = now;
		if (stop_now && cancelled == 0 &&
			now - (sent > stop_seen ? sent : stop_seen) >= STOP_CANCEL_GRACE_MS)
		{
			PGcancel   *c = PQgetCancel(conn);
			char		errbuf[256];

			if (c == NULL || !PQcancel(c, errbuf, sizeof(errbuf)))
				relay_log(LOG_WARNING, "could not cancel the statement in flight: %s",
						  c == NULL ? "out of memory" : errbuf);
			if (c != NULL)
				PQfreeCancel(c);
			cancelled = now;
		}
		if (cancelled != 0 && now - cancelled >= STOP_GIVE_UP_MS)
		{
			relay_log(LOG_WARNING, "the statement in flight did not end %d ms after its cancel: "
					  "closing the connection", STOP_GIVE_UP_MS);
			drop_connection();
			return NULL;
		}
		fds[0].fd = PQsocket(conn);
		fds[0].events = POLLIN;
		fds[1].fd = wake_pipe[0];
		fds[1].events = POLLIN;
		if (poll(fds, 2, 250) < 0 && errno != EINTR)
			break;
		if (fds[1].revents & POLLIN)
		{
			char		buf[64];

			/* the signals are in their flags, which the main loop reads */
			while (read(wake_pipe[0], buf, sizeof(buf)) > 0)
				;
		}
	}
	/* the last result is the statement's; the others are cleared */
	while ((r = PQgetResult(conn)) != NULL)
	{
		if (res != NULL)
			PQclear(res);
		res = r;
	}
	return res;
}

/* Runs sql, which returns nothing or rows; the result, or NULL (handled). */
static PGresult *
run(const char *sql, const char *what, ExecStatusType want, int *failure)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != want)
	{
		*failure = statement_failed(res, what);
		return NULL;
	}
	return res;
}

static int
prepare(const char *name, const char *sql, int *failure)
{
	PGresult   *res = PQprepare(conn, name, sql, 0, NULL);

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		*failure = statement_failed(res, "preparing a statement");
		return 0;
	}
	PQclear(res);
	return 1;
}

/*
 * A notice (a NOTICE of the server, or its FATAL before it ends a session),
 * which libpq would print on stderr as it is: a log line of the relay, a
 * warning from WARNING up (by the severity's name in English, whatever the
 * server's lc_messages).
 */
static void
log_notice(void *arg, const PGresult *res)
{
	const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
	LogLevel	level = LOG_WARNING;

	if (severity != NULL &&
		(strcmp(severity, "NOTICE") == 0 || strcmp(severity, "INFO") == 0 ||
		 strcmp(severity, "LOG") == 0 || strncmp(severity, "DEBUG", 5) == 0))
		level = LOG_INFO;
	relay_log(level, "server: %s", PQresultErrorMessage(res));
}

/*
 * Whether the database's encoding is another than UTF8 (or SQL_ASCII, whose
 * bytes the server does not convert): the lease then also returns the
 * server's bytes of each topic and key, which key_hash is computed from,
 * since the relay reads the text as UTF-8.
 */
static int	hash_server_bytes = 0;

/*
 * The parameters of the connection to dbname (NULL: the environment's) into
 * keys and vals, NULL-terminated, with room for one more; their number.
 */
static int
connect_params(const char *dbname, const char **keys, const char **vals)
{
	int			k = 0;

	/* the caller's connection string or environment may override these */
	if (getenv("PGCONNECT_TIMEOUT") == NULL)
	{
		keys[k] = "connect_timeout";
		vals[k++] = "10";
	}

	/*
	 * Over TCP, a server that is gone (a network partition, a crashed host)
	 * must not hold a call for the kernel's two hours of keepalive: a dead
	 * peer is found within about a minute.  The connection string may say
	 * otherwise.
	 */
	keys[k] = "keepalives_idle";
	vals[k++] = "30";
	keys[k] = "keepalives_interval";
	vals[k++] = "10";
	keys[k] = "keepalives_count";
	vals[k++] = "3";
	keys[k] = "tcp_user_timeout";
	vals[k++] = "60000";
	keys[k] = "dbname";
	vals[k++] = dbname;
	keys[k] = "fallback_application_name";
	vals[k++] = "idem-relay";
	/* JSON is UTF-8, whatever the database's encoding */
	keys[k] = "client_encoding";
	vals[k++] = "UTF8";
	keys[k] = NULL;
	vals[k] = NULL;
	return k;
}

/*
 * Whether libpq takes the connection parameters of dbname (NULL: the
 * environment's), without connecting: a connection string it cannot parse
 * or a service it cannot find would otherwise be taken for a database that
 * is down, and retried for ever.  False with libpq's message in err.
 *
 * No libpq call adds the defaults (the service above all) with an error
 * but the one that connects.  So target_session_attrs, the last option it
 * checks before it connects, is given a value it refuses: its error says
 * that all the rest passed, and it never connects.
 */
static int
connect_params_valid(const char *dbname, char *err, size_t errlen)
{
	static const char marker[] = "idem-relay: checking the parameters";
	const char *keys[12];
	const char *vals[12];
	int			k = connect_params(dbname, keys, vals);
	PGconn	   *c;
	int			ok = 1;

	keys[k] = "target_session_attrs";
	vals[k++] = marker;
	keys[k] = NULL;
	vals[k] = NULL;
	c = PQconnectStartParams(keys, vals, 1);
	if (c != NULL && PQstatus(c) == CONNECTION_BAD &&
		strstr(PQerrorMessage(c), marker) == NULL)
	{
		snprintf(err, errlen, "%s", PQerrorMessage(c));
		one_line(err);
		printable_copy(err, errlen, err, strlen(err));
		ok = 0;
	}
	PQfinish(c);
	return ok;
}

/*
 * Connects, finds idem's schema, LISTENs and prepares the statements.
 * Returns 1, 0 when the connection failed, -1 when a statement failed.
 */
static int
db_connect(void)
{
	const char *keys[12];
	const char *vals[12];
	PGresult   *res;
	int			failure = 0;
	char		sql[1024];

	connect_params(settings.dbname, keys, vals);
	conn = PQconnectdbParams(keys, vals, 1);
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK)
	{
		char		msg[512];
		const char *e = conn ? PQerrorMessage(conn) : "out of memory";

		snprintf(msg, sizeof(msg), "%s", e);
		one_line(msg);
		printable_copy(msg, sizeof(msg), msg, strlen(msg));
		relay_log(LOG_ERROR, "could not connect: %s", msg);
		note_error(msg);
		drop_connection();
		return 0;
	}
	/* the server's notices, and its FATAL before it ends the session: logged */
	PQsetNoticeReceiver(conn, log_notice, NULL);

	res = run("SELECT pg_catalog.quote_ident(n.nspname) "
			  "FROM pg_catalog.pg_extension e "
			  "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace "
			  "WHERE e.extname OPERATOR(pg_catalog.=) 'idem'",
			  "finding the extension idem", PGRES_TUPLES_OK, &failure);
	if (res == NULL)
		return failure;
	if (PQntuples(res) != 1)
	{
		char		msg[512];

		PQclear(res);
		snprintf(msg, sizeof(msg), "the extension idem is not installed in database \"%s\"",
				 PQdb(conn));
		relay_log(LOG_ERROR, "%s", msg);
		note_error(msg);
		drop_connection();
		if (settings.exit_on_error)
		{
			relay_log(LOG_ERROR, "exiting (--exit-on-error)");
			log_counts(1);
			exit(EXIT_RELAY_QUERY);
		}
		return -1;
	}
	free(schema);
	schema = xstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	{
		const char *enc = PQparameterStatus(conn, "server_encoding");

		hash_server_bytes = enc != NULL && strcmp(enc, "UTF8") != 0 &&
			strcmp(enc, "SQL_ASCII") != 0;
	}

	/*
	 * Leases, acks and nacks each run in a transaction of their own at READ
	 * COMMITTED, whatever the database's or the role's default: at
	 * REPEATABLE READ or SERIALIZABLE, relays working at once would fail
	 * with serialization errors.  A nack's array literal writes NULL for
	 * "no retry time", which array_nulls = off would read as a string; and
	 * the relay is idle between leases for as long as its poll, which an
	 * idle_session_timeout would cut again and again.
	 */
	res = run("SET default_transaction_isolation TO 'read committed'; SET array_nulls TO on; "
			  "SET idle_session_timeout TO 0",
			  "setting the session's isolation level, array_nulls and idle_session_timeout",
			  PGRES_COMMAND_OK, &failure);
	if (res == NULL)
		return failure;
	PQclear(res);

	/* before the first lease, so that no notification is missed */
	res = run("LISTEN idem_outbox", "LISTEN idem_outbox", PGRES_COMMAND_OK, &failure);
	if (res == NULL)
		return failure;
	PQclear(res);

	snprintf(sql, sizeof(sql),
			 "SELECT id, topic, key, type, payload, headers, attempt, "
			 "pg_catalog.to_char(pg_catalog.timezone('UTC', created_at), "
			 "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')%s "
			 "FROM %s.idem_outbox_lease($1::pg_catalog.text, $2::pg_catalog.int4, $3::pg_catalog.interval, "
			 "$4::pg_catalog.int4, $5::pg_catalog.int8)",
			 hash_server_bytes ?
			 ", pg_catalog.convert_to(topic, pg_catalog.getdatabaseencoding()), "
			 "pg_catalog.convert_to(key, pg_catalog.getdatabaseencoding())" : "",
			 schema);
	if (!prepare("lease", sql, &failure))
		return failure;
	snprintf(sql, sizeof(sql), "SELECT %s.idem_outbox_ack($1::pg_catalog.uuid[])", schema);
	if (!prepare("ack", sql, &failure))
		return failure;
	snprintf(sql, sizeof(sql),
			 "SELECT pg_catalog.count(*) FROM ROWS FROM ("
			 "pg_catalog.unnest($1::pg_catalog.uuid[]), pg_catalog.unnest($2::pg_catalog.text[]), "
			 "pg_catalog.unnest($3::pg_catalog.interval[]), pg_catalog.unnest($5::pg_catalog.bool[])) "
			 "AS u(id, error, retry_after, permanent) "
			 "WHERE %s.idem_outbox_nack(u.id, u.error, u.retry_after, $4::pg_catalog.text, u.permanent)", schema);
	if (!prepare("nack", sql, &failure))
		return failure;

	relay_log(LOG_INFO, "connected to database \"%s\" as \"%s\" (%s%s%s), listening on idem_outbox",
			  PQdb(conn), PQuser(conn),
			  PQhost(conn) ? PQhost(conn) : "", PQport(conn) ? " port " : "",
			  PQport(conn) ? PQport(conn) : "");
	return 1;
}

/* ---- Publishing and reporting ---- */

static int
route_of(const char *topic)
{
	int			i;

	for (i = 1; i < nroutes; i++)
		if (strcmp(routes[i].topic, topic) == 0)
			return i;
	return 0;
}

/*
 * Hands the batch to the sinks, each its messages in lease order.  Returns
 * 0, or -1 when a sink cannot go on (its and later sinks' messages stay
 * UNSENT).
 */
static int
publish_batch(const RelayMessage *msgs, int n, Outcome *out, const PublishControl *ctl)
{
	int		   *route = xmalloc(sizeof(int) * (size_t) n);
	int		   *done = xmalloc(sizeof(int) * (size_t) nroutes);
	RelayMessage *sub = xmalloc(sizeof(RelayMessage) * (size_t) n);
	Outcome    *subout = xmalloc(sizeof(Outcome) * (size_t) n);
	int		   *subidx = xmalloc(sizeof(int) * (size_t) n);
	int			i;
	int			j;
	int			rc = 0;

	for (i = 0; i < n; i++)
		route[i] = route_of(msgs[i].topic);
	memset(done, 0, sizeof(int) * (size_t) nroutes);
	for (i = 0; i < n && rc == 0; i++)
	{
		int			r = route[i];
		int			m = 0;

		if (done[r])
			continue;
		done[r] = 1;
		for (j = i; j < n; j++)
			if (route[j] == r)
			{
				sub[m] = msgs[j];
				subout[m] = out[j];
				subidx[m++] = j;
			}
		rc = routes[r].type->publish(routes[r].sink, sub, m, subout, ctl);
		for (j = 0; j < m; j++)
			out[subidx[j]] = subout[j];
	}
	free(route);
	free(done);
	free(sub);
	free(subout);
	free(subidx);
	return rc;
}

/*
 * A batch of runs: the messages of a key's run follow its head, in order.
 * They are published in rounds, each with the next message of every run
 * whose previous one was delivered (so a sink is never given two messages
 * of a key at once), until every run is done or stopped at a message that
 * was not delivered: the messages after it are SKIPPED, neither
 * acknowledged nor nacked, since that message's nack releases them.
 */
static int
publish_runs(const RelayMessage *msgs, int n, Outcome *out, const PublishControl *ctl)
{
	int		   *start = xmalloc(sizeof(int) * (size_t) n);
	int		   *len = xmalloc(sizeof(int) * (size_t) n);
	RelayMessage *sub = xmalloc(sizeof(RelayMessage) * (size_t) n);
	Outcome    *subout = xmalloc(sizeof(Outcome) * (size_t) n);
	int		   *subidx = xmalloc(sizeof(int) * (size_t) n);
	int			nruns = 0;
	int			round;
	int			i;
	int			rc = 0;

	for (i = 0; i < n; i++)
	{
		if (nruns > 0 &&
			strcmp(msgs[i].topic, msgs[start[nruns - 1]].topic) == 0 &&
			strcmp(msgs[i].key, msgs[start[nruns - 1]].key) == 0)
		{
			len[nruns - 1]++;
			continue;
		}
		start[nruns] = i;
		len[nruns++] = 1;
	}
	for (round = 0; rc == 0; round++)
	{
		int			m = 0;
		int			r;

		for (r = 0; r < nruns; r++)
			if (round < len[r] &&
				(round == 0 || out[start[r] + round - 1].kind == OUTCOME_DELIVERED))
			{
				sub[m] = msgs[start[r] + round];
				subout[m] = out[start[r] + round];
				subidx[m++] = start[r] + round;
			}
		if (m == 0)
			break;
		rc = publish_batch(sub, m, subout, ctl);
		for (i = 0; i < m; i++)
			out[subidx[i]] = subout[i];
	}
	/* what follows a message of its run that was not delivered */
	for (i = 0; i < nruns; i++)
	{
		int			j;

		for (j = 1; j < len[i]; j++)
			if (out[start[i] + j - 1].kind != OUTCOME_DELIVERED &&
				out[start[i] + j].kind == OUTCOME_UNSENT)
				out[start[i] + j].kind = OUTCOME_SKIPPED;
	}
	free(start);
	free(len);
	free(sub);
	free(subout);
	free(subidx);
	return rc;
}

/* an element of a text array literal */
static void
array_elem(StrBuf *sb, const char *s)
{
	if (sb->len > 1)
		sb_putc(sb, ',');
	if (s == NULL)
	{
		sb_puts(sb, "NULL");
		return;
	}
	sb_putc(sb, '"');
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			sb_putc(sb, '\\');
		sb_putc(sb, *s);
	}
	sb_putc(sb, '"');
}

/* A message of a batch and its key's key_hash, to order the nacks. */
typedef struct ReportOrder
{
	int64_t		hash;
	int			index;
} ReportOrder;

static int
report_order_cmp(const void *a, const void *b)
{
	const ReportOrder *x = a;
	const ReportOrder *y = b;

	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	return x->index - y->index;
}

/*
 * The ack and the nack of a batch that the connection's loss cut: sent again
 * on the next connection to the same database, so that a relay that lost
 * its connection after publishing neither waits for the leases to run out
 * (holding back the keys' next messages) nor publishes the batch again.
 * Only while more than the timeout is left of the leases, as for a
 * publish: later, another relay may hold the messages, which an ack would
 * not know; they are then left to the end of their leases, as a relay that
 * stopped leaves them.
 */
typedef struct PendingReport
{
	char	   *dbname;			/* settings.dbname when saved, or NULL */
	int64_t		until;			/* sent again only before this */
	char	   *ack;			/* the ack's ids, or NULL */
	int			ndelivered;
	char	   *nack[5];		/* the nack's parameters, or NULLs */
	int			nretried;
	int			ndead;
} PendingReport;

static PendingReport pending;

static char *
xstrdup_or_null(const char *s)
{
	return s ? xstrdup(s) : NULL;
}

static void
pending_clear(void)
{
	int			i;

	free(pending.dbname);
	free(pending.ack);
	for (i = 0; i < 5; i++)
		free(pending.nack[i]);
	memset(&pending, 0, sizeof(pending));
}

/* Forget what the connection's loss cut, saying so. */
static void
pending_drop(void)
{
	if (pending.ack == NULL && pending.nack[0] == NULL)
		return;
	relay_log(LOG_WARNING, "%d delivered and %d released messages of a batch cut by the lost connection "
			  "are left to the end of their leases",
			  pending.ndelivered, pending.nretried + pending.ndead);
	pending_clear();
}

/*
 * Whether what the connection's loss cut may still be sent: to the same
 * database, and an ack only before the deadline.  A nack alone may come at
 * any time: it names this relay, and ends no lease another relay took
 * since.  (A nack that follows a cut ack waits for it: sent alone, the nack
 * of a run's later message would leave the key to messages after an
 * earlier one that was never acknowledged.)
 */
static int
pending_sendable(void)
{
	if ((pending.dbname == NULL) != (settings.dbname == NULL) ||
		(pending.dbname != NULL && strcmp(pending.dbname, settings.dbname) != 0))
		return 0;
	return pending.ack == NULL || now_ms() < pending.until;
}

/* Send what the connection's loss cut: see PendingReport. */
static void
send_pending(void)
{
	PGresult   *res;

	if (pending.ack == NULL && pending.nack[0] == NULL)
		return;
	if (!pending_sendable())
	{
		pending_drop();
		return;
	}
	if (pending.ack != NULL)
	{
		const char *params[1] = {pending.ack};

		res = exec_prepared("ack", 1, params);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			/* lost again: tried on the next connection, while there is time */
			if (statement_failed(res, "idem_outbox_ack") != 0)
				pending_clear();
			return;
		}
		relay_log(LOG_INFO, "acknowledged on the new connection: %d messages delivered before the last was lost",
				  pending.ndelivered);
		/* the lost one may have committed: only its answer was lost */
		if (atoi(PQgetvalue(res, 0, 0)) != pending.ndelivered)
			relay_log(LOG_DEBUG, "%d of %d delivered messages were acknowledged before",
					  pending.ndelivered - atoi(PQgetvalue(res, 0, 0)), pending.ndelivered);
		PQclear(res);
		COUNT(delivered, pending.ndelivered);
		free(pending.ack);
		pending.ack = NULL;
		pending.ndelivered = 0;
	}
	if (pending.nack[0] != NULL)
	{
		res = exec_prepared("nack", 5, (const char *const *) pending.nack);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			if (statement_failed(res, "idem_outbox_nack") != 0)
				pending_clear();
			return;
		}
		PQclear(res);
		COUNT(retried, pending.nretried);
		COUNT(dead, pending.ndead);
	}
	pending_clear();
}

/*
 * Acks what was delivered and nacks the rest.  False when the database failed.
 *
 * The messages go in the order of their keys' key_hash (those of a key in
 * the order of the lease), the order in which idem_outbox_ack updates key
 * rows: a nack of several keys and the ack of another relay that holds
 * messages of the same keys (after a lease ran out) lock the rows in one
 * order, and cannot deadlock (but for two keys with one hash, which the
 * ack orders by seq: once in 2^64 pairs of keys).
 */
static int
report(const RelayMessage *msgs, int n, const Outcome *out, int64_t deadline,
	   int exiting)
{
	StrBuf		ids;
	StrBuf		errs;
	StrBuf		waits;
	StrBuf		perms;
	StrBuf		nids;
	int			nacks = 0;
	int			ndelivered = 0;
	int			nretried = 0;
	int			nleft = 0;		/* of runs, released by the nack of a failure */
	int			ndead = 0;
	int			nlate = 0;
	int			i;
	int			j;
	int			ok = 1;
	int			lost = 0;		/* the connection, by the ack or the nack */
	int			nack_failed = 0;	/* the ack passed, the nack did not */
	ReportOrder *order = xmalloc(sizeof(ReportOrder) * (size_t) (n > 0 ? n : 1));

	for (i = 0; i < n; i++)
	{
		order[i].hash = msgs[i].key_hash;
		order[i].index = i;
	}
	qsort(order, (size_t) n, sizeof(ReportOrder), report_order_cmp);
	sb_init(&ids);
	sb_init(&nids);
	sb_init(&errs);
	sb_init(&waits);
	sb_init(&perms);
	sb_putc(&perms, '{');
	sb_putc(&ids, '{');
	sb_putc(&nids, '{');
	sb_putc(&errs, '{');
	sb_putc(&waits, '{');
	for (j = 0; j < n; j++)
	{
		const RelayMessage *m;
		char		error[OUTCOME_ERROR_LEN + 64];
		char		wait[64];
		char		topic[64];
		char		key[64];
		const char *w = NULL;
		const char *perm = "f";

		i = order[j].index;
		m = &msgs[i];
		printable_copy(topic, sizeof(topic), m->topic, strlen(m->topic));
		printable_copy(key, sizeof(key), m->key, strlen(m->key));
		switch (out[i].kind)
		{
			case OUTCOME_DELIVERED:
				array_elem(&ids, m->id);
				ndelivered++;
				relay_log(LOG_DEBUG, "delivered %s (topic %s, key %s, attempt %d)",
						  m->id, topic, key, m->attempt);
				continue;
			case OUTCOME_RETRY:
				printable_copy(error, sizeof(error), out[i].error, strlen(out[i].error));
				if (out[i].retry_after_ms >= 0)
				{
					snprintf(wait, sizeof(wait), "%ld milliseconds",
							 out[i].retry_after_ms > RELAY_MAX_RETRY_AFTER_MS ?
							 RELAY_MAX_RETRY_AFTER_MS : out[i].retry_after_ms);
					w = wait;
				}
				nretried++;
				printable_copy(last_error, sizeof(last_error), error, strlen(error));
				relay_log(LOG_DEBUG, "retry %s (topic %s, key %s, attempt %d) after %s: %s",
						  m->id, topic, key, m->attempt, w ? w : "the topic's backoff", error);
				break;
			case OUTCOME_PERMANENT:

				/* dead at once: later messages of its key wait for a redrive */
				snprintf(error, sizeof(error), "permanent: %s", out[i].error);
				printable_copy(error, sizeof(error), error, strlen(error));
				perm = "t";
				ndead++;
				printable_copy(last_error, sizeof(last_error), error, strlen(error));
				relay_log(LOG_WARNING, "message %s (topic %s, key %s, attempt %d) refused for good, "
						  "dead: %s", m->id, topic, key, m->attempt, error);
				break;
			case OUTCOME_SKIPPED:
				nleft++;
				relay_log(LOG_DEBUG, "left %s (topic %s, key %s): an earlier message of its key "
						  "was not delivered", m->id, topic, key);
				continue;
			case OUTCOME_UNSENT:

				/*
				 * Released for another relay at once when this one stops (asked
				 * to, or its sink cannot go on);
				 * otherwise after the topic's backoff, as a failure: a
				 * sink that hangs or fails leaves most of each batch unsent,
				 * and every lease is an attempt, so that released at once
				 * they died of their attempts within seconds, never sent,
				 * whatever backoff the topic has for outages.
				 */
				w = NULL;
				if (stop_now)
				{
					snprintf(error, sizeof(error), "not published: idem-relay was stopped");
					w = "0";
				}
				else if (exiting)
				{
					snprintf(error, sizeof(error), "not published: idem-relay stops, its sink cannot go on");
					w = "0";
				}
				else if (now_ms() >= deadline)
				{
					snprintf(error, sizeof(error), "not published: its lease was running out");
					nlate++;
				}
				else
					snprintf(error, sizeof(error), "not published: the sink failed");
				nretried++;
				relay_log(LOG_DEBUG, "released %s (topic %s, key %s): %s", m->id, topic, key, error);
				break;
		}
		array_elem(&nids, m->id);
		array_elem(&errs, error);
		array_elem(&waits, w);
		if (perms.len > 1)
			sb_putc(&perms, ',');
		sb_puts(&perms, perm);
		nacks++;
	}
	if (nlate > 0)
		relay_log(LOG_WARNING, "%d of %d messages were not published: less than the timeout (%ld ms) "
				  "was left of their lease (%ld ms); they are released for another attempt "
				  "after the topic's backoff (lower --batch or --per-key, or raise --lease)",
				  nlate, n, settings.timeout_ms, settings.lease_ms);
	sb_putc(&ids, '}');
	sb_putc(&nids, '}');
	sb_putc(&errs, '}');
	sb_putc(&waits, '}');
	sb_putc(&perms, '}');

	/* counted once the database has them: a failed statement wrote nothing */
	if (ndelivered > 0)
	{
		const char *params[1] = {ids.data};
		PGresult   *res = exec_prepared("ack", 1, params);

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			lost = statement_failed(res, "idem_outbox_ack") == 0;
			ok = 0;
		}
		else
		{
			if (atoi(PQgetvalue(res, 0, 0)) != ndelivered)
				relay_log(LOG_DEBUG, "%d of %d delivered messages were acknowledged before",
						  ndelivered - atoi(PQgetvalue(res, 0, 0)), ndelivered);
			PQclear(res);
			COUNT(delivered, ndelivered);
		}
	}
	if (ok && nacks > 0)
	{
		/* naming itself: a nack never ends a lease another relay took since */
		const char *params[5] = {nids.data, errs.data, waits.data, settings.name, perms.data};
		PGresult   *res = exec_prepared("nack", 5, params);

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			lost = statement_failed(res, "idem_outbox_nack") == 0;
			nack_failed = 1;
			ok = 0;
		}
		else
		{
			PQclear(res);
			/* those left are leased again, as released unpublished */
			COUNT(retried, nretried + nleft);
			COUNT(dead, ndead);
		}
	}
	if (lost)
	{
		const char *nack[5] = {nids.data, errs.data, waits.data, settings.name, perms.data};

		pending_clear();
		pending.dbname = xstrdup_or_null(settings.dbname);
		pending.until = deadline;
		if (ndelivered > 0 && !nack_failed)
		{
			pending.ack = xstrdup(ids.data);
			pending.ndelivered = ndelivered;
		}
		if (nacks > 0)
		{
			for (i = 0; i < 5; i++)
				pending.nack[i] = xstrdup(nack[i]);
			pending.nretried = nretried + nleft;
			pending.ndead = ndead;
		}
	}
	drain_notifications();
	sb_free(&ids);
	sb_free(&nids);
	sb_free(&errs);
	sb_free(&waits);
	sb_free(&perms);
	free(order);
	return ok;
}

/*
 * key_hash of the message in row i of a lease: from its text, or from the
 * server's bytes when the database's encoding is not UTF-8's.  A value that
 * cannot be decoded only orders that nack as another key's would.
 */
static int64_t
message_key_hash(const PGresult *res, int i)
{
	unsigned char *t;
	unsigned char *k;
	size_t		tlen;
	size_t		klen;
	int64_t		h;
	const char *topic = PQgetvalue(res, i, 1);
	const char *key = PQgetvalue(res, i, 2);

	if (!hash_server_bytes || PQnfields(res) < 10)
		return relay_key_hash((const unsigned char *) topic, strlen(topic),
							  (const unsigned char *) key, strlen(key));
	t = PQunescapeBytea((const unsigned char *) PQgetvalue(res, i, 8), &tlen);
	k = PQunescapeBytea((const unsigned char *) PQgetvalue(res, i, 9), &klen);
	if (t == NULL || k == NULL)
		h = relay_key_hash((const unsigned char *) topic, strlen(topic),
						   (const unsigned char *) key, strlen(key));
	else
		h = relay_key_hash(t, tlen, k, klen);
	if (t != NULL)
		PQfreemem(t);
	if (k != NULL)
		PQfreemem(k);
	return h;
}

/*
 * Leases a batch, publishes and reports it.  Returns how many messages
 * were leased, or -1 when the database failed (the connection is then
 * dropped), or LEASE_AGAIN when it leased nothing but a notification came
 * meanwhile.  A sink that cannot go on ends the relay here.
 */
#define LEASE_AGAIN	(-2)

static int
lease_and_publish(void)
{
	int			notified;
	char		batch[16];
	char		lease[32];
	char		per_key[16];
	char		max_bytes[24];
	const char *params[5];
	PGresult   *res;
	int64_t		start = now_ms();
	int			n;
	int			i;
	RelayMessage *msgs;
	Outcome    *out;
	PublishControl ctl;
	int			rc;
	int			ok;

	snprintf(batch, sizeof(batch), "%d", settings.batch);
	snprintf(lease, sizeof(lease), "%ld milliseconds", settings.lease_ms);
	params[0] = settings.name;
	params[1] = batch;
	params[2] = lease;
	snprintf(per_key, sizeof(per_key), "%d", settings.per_key);
	params[3] = per_key;
	snprintf(max_bytes, sizeof(max_bytes), "%lld", settings.max_bytes);
	params[4] = settings.max_bytes > 0 ? max_bytes : NULL;
	res = exec_prepared("lease", 5, params);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		statement_failed(res, "idem_outbox_lease");
		return -1;
	}
	notified = drain_notifications();
	n = PQntuples(res);
	if (n == 0)
	{
		PQclear(res);
		/*
		 * A notification that came during the lease is of a commit its
		 * snapshot may not have seen, and no other will come for it (idem
		 * notifies once until a relay looks again): look again at once.
		 */
		return notified ? LEASE_AGAIN : 0;
	}
	COUNT(leased, n);
	msgs = xmalloc(sizeof(RelayMessage) * (size_t) n);
	out = xmalloc(sizeof(Outcome) * (size_t) n);
	for (i = 0; i < n; i++)
	{
		msgs[i].id = PQgetvalue(res, i, 0);
		msgs[i].topic = PQgetvalue(res, i, 1);
		msgs[i].key = PQgetvalue(res, i, 2);
		msgs[i].type = PQgetisnull(res, i, 3) ? NULL : PQgetvalue(res, i, 3);
		msgs[i].payload = PQgetvalue(res, i, 4);
		msgs[i].headers = PQgetisnull(res, i, 5) ? NULL : PQgetvalue(res, i, 5);
		msgs[i].attempt = atoi(PQgetvalue(res, i, 6));
		msgs[i].created_at = PQgetvalue(res, i, 7);
		msgs[i].key_hash = message_key_hash(res, i);
		out[i].kind = OUTCOME_UNSENT;
		out[i].retry_after_ms = -1;
		out[i].error[0] = '\0';
	}

	/*
	 * The server's lease began after start: no message is started once less
	 * than the sink's timeout is left of it, so that no publish outlives
	 * the lease (another relay could lease the message again and deliver
	 * the key's next one first).
	 */
	ctl.deadline_ms = start + settings.lease_ms - settings.timeout_ms;
	ctl.stop_now = &stop_now;
	rc = settings.per_key > 1 ? publish_runs(msgs, n, out, &ctl) :
		publish_batch(msgs, n, out, &ctl);
	ok = report(msgs, n, out, ctl.deadline_ms, rc != 0);
	free(msgs);
	free(out);
	PQclear(res);
	if (rc != 0)
	{
		relay_log(LOG_ERROR, "a sink cannot go on: exiting");
		pending_drop();
		log_counts(1);
		exit(EXIT_RELAY_SINK);
	}
	return ok ? n : -1;
}

/* ---- Configuration ---- */

static void
config_error(const char *fmt,...) PRINTF_LIKE(1, 2);

/* set while a reload applies a new configuration: errors come back there */
static sigjmp_buf *reload_jmp = NULL;
static char reload_error[4096];	/* room for a sink's error and its origins */

static void
config_error(const char *fmt,...)
{
	va_list		ap;

	if (reload_jmp != NULL)
	{
		va_start(ap, fmt);
		vsnprintf(reload_error, sizeof(reload_error), fmt, ap);
		va_end(ap);
		siglongjmp(*reload_jmp, 1);
	}
	fprintf(stderr, "idem-relay: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry \"idem-relay --help\" for more information.\n");
	exit(EXIT_RELAY_USAGE);
}

static int
parse_bool(const char *v, int *out)
{
	if (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "on") == 0 ||
		strcasecmp(v, "yes") == 0)
		*out = 1;
	else if (strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 ||
			 strcasecmp(v, "off") == 0 || strcasecmp(v, "no") == 0)
		*out = 0;
	else
		return 0;
	return 1;
}

static int
get_int(const Config *cfg, const char *key, int def, int min, int max)
{
	const char *v = config_get(cfg, key);
	char	   *end;
	long		n;

	if (v == NULL)
		return def;
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || n < min || n > max)
		config_error("%s must be an integer from %d to %d, not \"%s\" (%s)",
					 key, min, max, v, config_origin(cfg, key));
	return (int) n;
}

/* bytes, or a whole number with kB, MB, GB or TB (of 1024), as the server's */
static long long
get_size(const Config *cfg, const char *key, long long def)
{
	const char *v = config_get(cfg, key);
	char	   *end;
	long long	n;
	long long	unit = 1;

	if (v == NULL)
		return def;
	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno == 0 && end != v && n >= 0)
	{
		while (*end == ' ' || *end == '\t')
			end++;
		if (strcmp(end, "kB") == 0)
			unit = 1024;
		else if (strcmp(end, "MB") == 0)
			unit = 1024 * 1024;
		else if (strcmp(end, "GB") == 0)
			unit = 1024 * 1024 * 1024;
		else if (strcmp(end, "TB") == 0)
			unit = 1024LL * 1024 * 1024 * 1024;
		else if (*end != '\0')
			unit = 0;
		if (unit > 0 && n <= LLONG_MAX / unit)
			return n * unit;
	}
	config_error("%s must be a size of zero or more, in bytes or with kB, MB, GB or TB, such as 64MB, not \"%s\" (%s)",
				 key, v, config_origin(cfg, key));
	return def;
}

static long
get_duration(const Config *cfg, const char *key, long def, long min)
{
	const char *v = config_get(cfg, key);
	long		ms;

	if (v == NULL)
		return def;
	ms = parse_duration_ms(v);
	if (ms == -2)
		config_error("%s must be %sat least 1ms (durations are counted in whole milliseconds), not \"%s\" (%s)",
					 key, min > 0 ? "" : "0 or ", v, config_origin(cfg, key));
	if (ms < 0 || ms < min)
		config_error("%s must be a duration %s and at most a day, such as 5s or 500ms, not \"%s\" (%s)",
					 key, min > 0 ? "above zero" : "of zero or more", v, config_origin(cfg, key));
	return ms;
}

static int
get_bool(const Config *cfg, const char *key)
{
	const char *v = config_get(cfg, key);
	int			b = 0;

	if (v != NULL && !parse_bool(v, &b))
		config_error("%s must be true or false, not \"%s\" (%s)", key, v, config_origin(cfg, key));
	return b;
}

static void
check_keys(const Config *cfg)
{
	int			i;
	int			j;

	for (i = 0; i < cfg->nitems; i++)
	{
		const char *key = cfg->items[i].key;
		char		topic[1100];
		const char *rest;
		int			known = 0;

		for (j = 0; global_keys[j] != NULL; j++)
			if (strcmp(key, global_keys[j]) == 0)
				known = 1;
		if (!known && strncmp(key, "topic.", 6) == 0)
		{
			int			split = config_split_topic(key, topic, sizeof(topic), &rest);

			if (split < 0)
				config_error("a setting of a topic whose name is too long (%s): a topic has at most 255 bytes",
							 cfg->items[i].origin);
			if (split == 0)
				config_error("malformed setting \"%s\" (%s): expected topic.NAME.sink or "
							 "topic.NAME.SINK.SETTING, with NAME in double quotes if it has a dot",
							 key, cfg->items[i].origin);
			known = strcmp(rest, "sink") == 0 || sink_setting_known(rest);
		}
		else if (!known)
			known = sink_setting_known(key);
		if (!known)
			config_error("unknown setting \"%s\" (%s)", key, cfg->items[i].origin);
	}
}

static const SinkType *
get_sink_type(const Config *cfg, const char *key, const char *name)
{
	const SinkType *t = sink_type_find(name);

	if (t == NULL)
		config_error("unknown sink \"%s\" for %s (%s): the sinks are %s",
					 name, key, config_origin(cfg, key), sink_type_names());
	return t;
}

static void
add_route(const Config *cfg, const char *topic, const SinkType *type)
{
	SinkSettings ss;
	char		err[1024];
	int			cannot_start;
	Sink	   *sink;

	ss.cfg = cfg;
	ss.sink = type->name;
	ss.topic = topic;
	ss.timeout_ms = settings.timeout_ms;
	cannot_start = 0;
	ss.cannot_start = &cannot_start;
	err[0] = '\0';
	sink = type->init(&ss, err, sizeof(err));
	if (sink == NULL && cannot_start && reload_jmp == NULL)
	{
		if (topic)
			relay_log(LOG_ERROR, "sink %s of topic \"%s\" cannot start: %s", type->name, topic, err);
		else
			relay_log(LOG_ERROR, "sink %s cannot start: %s", type->name, err);
		exit(EXIT_RELAY_SINK);
	}
	if (sink == NULL)
	{
		char		origins[2048];

		sink_setting_origins(&ss, err, origins, sizeof(origins));
		config_error("%s%s", err, origins);
	}
	routes = xrealloc(routes, sizeof(Route) * (size_t) (nroutes + 1));
	routes[nroutes].topic = topic ? xstrdup(topic) : NULL;
	routes[nroutes].type = type;
	routes[nroutes].sink = sink;
	nroutes++;
}

/*
 * The topics with a route of their own, and their sinks, while apply_config
 * works: kept here, so that a configuration error that jumps out of it
 * leaves nothing unreachable.
 */
static char **topics;
static const SinkType **types;
static int	ntopics;

static void
free_topics(void)
{
	int			i;

	for (i = 0; i < ntopics; i++)
		free(topics[i]);
	free(topics);
	free(types);
	topics = NULL;
	types = NULL;
	ntopics = 0;
}

/*
 * Refuses a sink's setting that no route uses (a setting for every topic
 * when no topic goes to that sink, a topic's own when the topic goes to
 * another): the relay would start without it, and deliver elsewhere than
 * intended.  The routes are the default one (deftype) and those of
 * topics[] with types[].
 */
static void
check_unused_settings(const Config *cfg, const SinkType *deftype)
{
	int			i;
	int			j;

	for (i = 0; i < cfg->nitems; i++)
	{
		const char *key = cfg->items[i].key;
		char		topic[1100];
		const char *rest;
		const char *dot;
		size_t		len;
		int			used;

		if (config_split_topic(key, topic, sizeof(topic), &rest) == 1)
		{
			if (strcmp(rest, "sink") == 0)
				continue;
			for (j = 0; j < ntopics; j++)
				if (strcmp(topics[j], topic) == 0)
					break;
			if ((dot = strchr(rest, '.')) == NULL)
				continue;
			len = (size_t) (dot - rest);
			if (j < ntopics && (strncmp(rest, types[j]->name, len) != 0 || types[j]->name[len] != '\0'))
				config_error("%s is set, but the sink of topic \"%s\" is %s (%s)",
							 key, topic, types[j]->name, cfg->items[i].origin);
			continue;
		}
		/* dbname, batch, ...: not a sink's */
		if ((dot = strchr(key, '.')) == NULL)
			continue;
		len = (size_t) (dot - key);
		used = strncmp(key, deftype->name, len) == 0 && deftype->name[len] == '\0';
		for (j = 0; j < ntopics && !used; j++)
			used = strncmp(key, types[j]->name, len) == 0 && types[j]->name[len] == '\0';
		if (!used)
			config_error("%s is set, but no topic's sink is %.*s (%s)",
						 key, (int) len, key, cfg->items[i].origin);
	}
}

static void
apply_config(const Config *cfg)
{
	const char *v;
	const SinkType *deftype;
	int			i;
	int			j;
	int			verbose;
	char		err[1024];

	free_topics();
	check_keys(cfg);
	settings.dbname = config_get(cfg, "dbname");
	if (!connect_params_valid(settings.dbname, err, sizeof(err)))
	{
		if (settings.dbname != NULL)
			config_error("dbname is not valid: %s (%s)", err, config_origin(cfg, "dbname"));
		config_error("the connection settings of the environment are not valid: %s", err);
	}
	v = config_get(cfg, "name");
	if (v != NULL && *v == '\0')
		config_error("name must not be empty (%s)", config_origin(cfg, "name"));
	/* as idem_outbox_lease and idem_outbox_nack take it */
	if (v != NULL && strlen(v) > RELAY_MAX_NAME_LEN)
		config_error("name must be at most %d bytes long (%s)", RELAY_MAX_NAME_LEN,
					 config_origin(cfg, "name"));
	/* the relay speaks UTF-8 to the database, which would refuse it */
	if (v != NULL && !valid_utf8(v))
		config_error("name must be valid UTF-8 (%s)", config_origin(cfg, "name"));
	if (v != NULL)
		settings.name = xstrdup(v);
	else
	{
		char		host[256];
		char		name[300];
		uint32_t	tag;

		if (gethostname(host, sizeof(host)) != 0)
			snprintf(host, sizeof(host), "localhost");
		host[sizeof(host) - 1] = '\0';

		/*
		 * Relays in containers share host names and PIDs; a nack names its
		 * relay, so two relays with one name could nack each other's leases.
		 */
		if (getentropy(&tag, sizeof(tag)) != 0)
			tag = (uint32_t) time(NULL) ^ ((uint32_t) getpid() << 16);
		snprintf(name, sizeof(name), "%s:%d:%08x", host, (int) getpid(),
				 (unsigned int) tag);
		settings.name = xstrdup(name);
	}
	settings.batch = get_int(cfg, "batch", 100, 1, 10000);
	settings.per_key = get_int(cfg, "per_key", 1, 1, 10000);
	settings.max_bytes = get_size(cfg, "max_bytes", 64LL * 1024 * 1024);
	settings.lease_ms = get_duration(cfg, "lease", 30000, 1);
	settings.poll_ms = get_duration(cfg, "poll", 1000, 1);
	settings.linger_ms = get_duration(cfg, "linger", 1, 0);
	if (settings.linger_ms > settings.poll_ms)
		config_error("linger (%ld ms, %s) must be at most the poll interval (%ld ms, %s): a relay "
					 "that found messages would wait longer than an idle one",
					 settings.linger_ms, config_origin(cfg, "linger"),
					 settings.poll_ms, config_origin(cfg, "poll"));
	settings.timeout_ms = get_duration(cfg, "timeout", 10000, 1);
	settings.log_interval_ms = get_duration(cfg, "log_interval", 10000, 0);
	settings.reconnect_max_ms = get_duration(cfg, "reconnect_max", 30000, 1);
	settings.connect_attempts = get_int(cfg, "connect_attempts", 5, 1, INT_MAX);
	settings.exit_on_error = get_bool(cfg, "exit_on_error");
	settings.once = get_bool(cfg, "once");
	verbose = get_bool(cfg, "verbose");
	if (verbose)
		log_verbose = 1;
	if (settings.timeout_ms > settings.lease_ms / 2)
		config_error("timeout (%ld ms, %s) must be at most half the lease (%ld ms, %s): no message "
					 "is published with less than the timeout left of its lease, and the rest of a "
					 "batch is released at the cost of an attempt",
					 settings.timeout_ms, config_origin(cfg, "timeout"),
					 settings.lease_ms, config_origin(cfg, "lease"));

	settings.sink = config_get(cfg, "sink");
	if (settings.sink == NULL)
		settings.sink = "stdout";
	deftype = get_sink_type(cfg, "sink", settings.sink);

	/* a route per topic the configuration names, besides the default one */
	for (i = 0; i < cfg->nitems; i++)
	{
		char		topic[1100];
		const char *rest;
		const SinkType *t = deftype;

		if (config_split_topic(cfg->items[i].key, topic, sizeof(topic), &rest) != 1)
			continue;
		for (j = 0; j < ntopics; j++)
			if (strcmp(topics[j], topic) == 0)
				break;
		if (j < ntopics)
			continue;
		/* the last topic.<topic>.sink, whichever way the topic is written */
		for (j = cfg->nitems - 1; j >= 0; j--)
		{
			char		t2[1100];
			const char *r2;

			if (config_split_topic(cfg->items[j].key, t2, sizeof(t2), &r2) == 1 &&
				strcmp(t2, topic) == 0 && strcmp(r2, "sink") == 0)
			{
				t = get_sink_type(cfg, cfg->items[j].key, cfg->items[j].value);
				break;
			}
		}
		topics = xrealloc(topics, sizeof(char *) * (size_t) (ntopics + 1));
		types = xrealloc(types, sizeof(SinkType *) * (size_t) (ntopics + 1));
		topics[ntopics] = xstrdup(topic);
		types[ntopics++] = t;
	}
	check_unused_settings(cfg, deftype);

	/* the sinks are made once all of that is known to be right */
	add_route(cfg, NULL, deftype);
	for (i = 0; i < ntopics; i++)
		add_route(cfg, topics[i], types[i]);
	free_topics();
}

static void
close_routes(void)
{
	int			i;

	for (i = 0; i < nroutes; i++)
	{
		routes[i].type->close(routes[i].sink);
		free(routes[i].topic);
	}
	free(routes);
	routes = NULL;
	nroutes = 0;
}

/* ---- Reloading the configuration (SIGHUP) ---- */

static const char *config_file = NULL;
static Config cmdline_cfg;		/* the settings of the command line */
static Config cfg;				/* the settings in force */

/* the file's settings, then the command line's (which win); false with err */
static int
read_config(Config *c, char *err, size_t errlen)
{
	int			i;

	if (config_file != NULL && !config_read_file(c, config_file, err, errlen))
		return 0;
	for (i = 0; i < cmdline_cfg.nitems; i++)
		config_set(c, cmdline_cfg.items[i].key, cmdline_cfg.items[i].value,
				   cmdline_cfg.items[i].origin);
	return 1;
}

/*
 * Reads the configuration file again and applies it between two batches:
 * every setting but name (the leases in hand are in that name) and once;
 * the sinks are closed and made again with their new settings, and a new
 * dbname makes a new connection.  A configuration with an error is not
 * applied: the relay goes on with the one it had and logs why.
 */
static void
reload_config(void)
{
	static Config newcfg;
	static Settings old;
	static Route *old_routes;
	static int	old_nroutes;
	static int	old_verbose;
	sigjmp_buf	jb;
	char		err[1024];
	int			dbname_changed;

	reload_requested = 0;
	if (config_file == NULL)
	{
		relay_log(LOG_INFO, "SIGHUP: no configuration file (--config) to read again");
		return;
	}
	memset(&newcfg, 0, sizeof(newcfg));
	if (!read_config(&newcfg, err, sizeof(err)))
	{
		relay_log(LOG_ERROR, "configuration not reloaded, the one in force is kept: %s", err);
		config_free(&newcfg);
		return;
	}
	old = settings;
	old_routes = routes;
	old_nroutes = nroutes;
	old_verbose = log_verbose;
	routes = NULL;
	nroutes = 0;
	log_verbose = 0;
	if (sigsetjmp(jb, 0) != 0)
	{
		/* an error: back to the configuration in force */
		reload_jmp = NULL;
		close_routes();
		if (settings.name != old.name)
			free(settings.name);
		settings = old;
		routes = old_routes;
		nroutes = old_nroutes;
		log_verbose = old_verbose;
		config_free(&newcfg);
		relay_log(LOG_ERROR, "configuration not reloaded, the one in force is kept: %s", reload_error);
		return;
	}
	reload_jmp = &jb;
	apply_config(&newcfg);
	reload_jmp = NULL;

	/* the name stays: the leases in hand are in it */
	if (config_get(&newcfg, "name") != NULL && strcmp(settings.name, old.name) != 0)
		relay_log(LOG_WARNING, "the name cannot change while the relay runs: still \"%s\"", old.name);
	free(settings.name);
	settings.name = old.name;
	settings.once = old.once;
	dbname_changed = (old.dbname == NULL) != (settings.dbname == NULL) ||
		(old.dbname != NULL && strcmp(old.dbname, settings.dbname) != 0);

	/* routes[] is made anew: an index into the old one means nothing */
	sink_down = -1;

	/* the old sinks go, and the configuration they were made from */
	{
		Route	   *new_routes = routes;
		int			new_nroutes = nroutes;

		routes = old_routes;
		nroutes = old_nroutes;
		close_routes();
		routes = new_routes;
		nroutes = new_nroutes;
	}
	config_free(&cfg);
	cfg = newcfg;
	memset(&newcfg, 0, sizeof(newcfg));
	if (dbname_changed)
		drop_connection();
	next_log = settings.log_interval_ms > 0 ? now_ms() + settings.log_interval_ms : INT64_MAX;
	relay_log(LOG_INFO, "configuration reloaded from %s: batch %d, per key %d, max bytes %lld, lease %ld ms, "
			  "poll %ld ms, linger %ld ms, timeout %ld ms, sink %s%s%s", config_file, settings.batch,
			  settings.per_key, settings.max_bytes, settings.lease_ms,
			  settings.poll_ms, settings.linger_ms, settings.timeout_ms, settings.sink,
			  nroutes > 1 ? " (and per topic)" : "",
			  dbname_changed ? ", connecting to the new dbname" : "");
}

/* ---- main ---- */

/*
 * Whether every sink can publish.  A lease costs each of its messages an
 * attempt, and a message that has had its topic's max_attempts dies: while
 * a sink is down (its broker restarting, unreachable), the relay leases
 * nothing and waits until the sink's next attempt to connect, instead of
 * nacking batch after batch until the messages are dead.  Messages of
 * other sinks' topics wait too: lease and publish cannot pick topics.
 */
static int
sinks_ready(void)
{
	int			i;

	for (i = 0; i < nroutes; i++)
	{
		long		retry_ms = 0;

		if (routes[i].type->ready == NULL ||
			routes[i].type->ready(routes[i].sink, &stop_now, &retry_ms))
			continue;
		if (settings.once)
		{
			relay_log(LOG_ERROR, "sink %s%s%s is down: exiting (--once)",
					  routes[i].type->name, routes[i].topic ? " of topic " : "",
					  routes[i].topic ? routes[i].topic : "");
			close_routes();
			drop_connection();
			log_counts(1);
			exit(EXIT_RELAY_SINK);
		}
		if (sink_down != i)
			relay_log(LOG_WARNING, "sink %s%s%s is down: leasing nothing until it is back",
					  routes[i].type->name, routes[i].topic ? " of topic " : "",
					  routes[i].topic ? routes[i].topic : "");
		sink_down = i;
		/* at least a little, at most a poll interval: a signal ends it */
		if (retry_ms < 10)
			retry_ms = 10;
		if (retry_ms > settings.poll_ms)
			retry_ms = settings.poll_ms;
		wait_until(now_ms() + retry_ms, 0);
		return 0;
	}
	if (sink_down >= 0)
		relay_log(LOG_INFO, "sink %s is back: leasing again", routes[sink_down].type->name);
	sink_down = -1;
	return 1;
}

static long
backoff_ms(int failures)
{
	double		ms = 500;
	int			i;

	for (i = 1; i < failures && ms < settings.reconnect_max_ms; i++)
		ms *= 2;
	if (ms > settings.reconnect_max_ms)
		ms = settings.reconnect_max_ms;
	/* jitter: half to all of it, so that relays do not come back together */
	return (long) (ms * (0.5 + 0.5 * ((double) random() / RAND_MAX)));
}

int
main(int argc, char **argv)
{
	static const struct option options[] = {
		{"dbname", required_argument, NULL, 'd'},
		{"config", required_argument, NULL, 'c'},
		{"name", required_argument, NULL, 'n'},
		{"batch", required_argument, NULL, 'b'},
		{"lease", required_argument, NULL, 'l'},
		{"poll", required_argument, NULL, 'p'},
		{"timeout", required_argument, NULL, 't'},
		{"set", required_argument, NULL, 's'},
		{"verbose", no_argument, NULL, 'v'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{"sink", required_argument, NULL, 1},
		{"webhook-url", required_argument, NULL, 2},
		{"log-interval", required_argument, NULL, 3},
		{"exit-on-error", no_argument, NULL, 4},
		{"connect-attempts", required_argument, NULL, 5},
		{"reconnect-max", required_argument, NULL, 6},
		{"once", no_argument, NULL, 7},
		{"nats-url", required_argument, NULL, 8},
		{"per-key", required_argument, NULL, 9},
		{"linger", required_argument, NULL, 10},
		{"max-bytes", required_argument, NULL, 11},
		{NULL, 0, NULL, 0}
	};
	Config	   *cmdline = &cmdline_cfg;
	char		err[1024];
	int			c;
	int			i;
	int			failures = 0;
	int			connect_failures = 0;
	int			announced = 0;
	int			exit_code = EXIT_RELAY_OK;
	int			lingered_after = -1;	/* messages of the lease before a wait */
	int			linger_off = 0;

	{
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_early_sighup;
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = SA_RESTART;
		sigaction(SIGHUP, &sa, NULL);
	}
	open_standard_fds();
	while ((c = getopt_long(argc, argv, "d:c:n:b:l:p:t:s:vVh", options, NULL)) != -1)
	{
		const char *key = NULL;
		const char *value = optarg;

		switch (c)
		{
			case 'd':
				key = "dbname";
				break;
			case 'c':
				config_file = optarg;
				break;
			case 'n':
				key = "name";
				break;
			case 'b':
				key = "batch";
				break;
			case 'l':
				key = "lease";
				break;
			case 'p':
				key = "poll";
				break;
			case 't':
				key = "timeout";
				break;
			case 's':
				{
					char	   *eq = config_key_end(optarg);
					char	   *k;

					if (eq == NULL || eq == optarg)
						config_error("--set takes KEY=VALUE, not \"%s\"", optarg);
					k = xstrdup(optarg);
					k[eq - optarg] = '\0';
					config_set(cmdline, k, eq + 1, "command line");
					free(k);
				}
				break;
			case 'v':
				key = "verbose";
				value = "true";
				break;
			case 'V':
				printf("idem-relay %s\n", RELAY_VERSION);
				return EXIT_RELAY_OK;
			case 'h':
				usage(stdout);
				return EXIT_RELAY_OK;
			case 1:
				key = "sink";
				break;
			case 2:
				key = "webhook.url";
				break;
			case 3:
				key = "log_interval";
				break;
			case 4:
				key = "exit_on_error";
				value = "true";
				break;
			case 5:
				key = "connect_attempts";
				break;
			case 9:
				key = "per_key";
				break;
			case 10:
				key = "linger";
				break;
			case 11:
				key = "max_bytes";
				break;
			case 6:
				key = "reconnect_max";
				break;
			case 7:
				key = "once";
				value = "true";
				break;
			case 8:
				key = "nats.url";
				break;
			default:
				fprintf(stderr, "Try \"idem-relay --help\" for more information.\n");
				return EXIT_RELAY_USAGE;
		}
		if (key != NULL)
			config_set(cmdline, key, value, "command line");
	}
	if (optind < argc)
		config_error("unexpected argument \"%s\"", argv[optind]);

	if (!read_config(&cfg, err, sizeof(err)))
		config_error("%s", err);

	{
		/* relays started together must not draw the same jitter */
		unsigned int seed;

		if (getentropy(&seed, sizeof(seed)) != 0)
			seed = (unsigned int) (time(NULL) ^ getpid());
		srandom(seed);
	}
	if (!sink_global_init(err, sizeof(err)))
	{
		relay_log(LOG_ERROR, "%s", err);
		return EXIT_RELAY_SINK;
	}
	apply_config(&cfg);
	setup_signals();

	relay_log(LOG_INFO, "idem-relay %s starting as \"%s\": batch %d, per key %d, max bytes %lld, lease %ld ms, "
			  "poll %ld ms, linger %ld ms, timeout %ld ms, sink %s%s", RELAY_VERSION, settings.name, settings.batch,
			  settings.per_key, settings.max_bytes, settings.lease_ms, settings.poll_ms, settings.linger_ms,
			  settings.timeout_ms, settings.sink,
			  nroutes > 1 ? " (and per topic)" : "");
	for (i = 1; i < nroutes; i++)
		relay_log(LOG_INFO, "topic \"%s\": sink %s", routes[i].topic, routes[i].type->name);

	interval_start = now_ms();
	next_log = settings.log_interval_ms > 0 ? interval_start + settings.log_interval_ms : INT64_MAX;

	while (!stop_requested)
	{
		int			n;

		if (reload_requested)
			reload_config();
		maybe_log();
		if (conn == NULL)
		{
			int			r = db_connect();

			if (r == 1)
			{
				connect_failures = 0;
				send_pending();
				if (conn == NULL)
				{
					/* lost again at once: a new one after a backoff */
					failures++;
					wait_until(now_ms() + backoff_ms(failures), 0);
				}
				continue;
			}
			failures++;
			if (r == 0 && ++connect_failures >= settings.connect_attempts &&
				settings.exit_on_error)
			{
				relay_log(LOG_ERROR, "could not connect after %d attempts: exiting (--exit-on-error)",
						  connect_failures);
				exit_code = EXIT_RELAY_CONNECT;
				break;
			}
			wait_until(now_ms() + backoff_ms(failures), 0);
			continue;
		}

		if (!sinks_ready())
			continue;
		n = lease_and_publish();
		if (n == LEASE_AGAIN)
			continue;
		if (n < 0)
		{
			/* the connection was dropped: a new one after a backoff */
			failures++;
			wait_until(now_ms() + backoff_ms(failures), 0);
			continue;
		}
		failures = 0;
		if (n == 0)
		{
			if (settings.once)
				break;
			/* idle: a notification, or the poll interval */
			wait_until(now_ms() + settings.poll_ms, 1);
		}
		else if (n < settings.batch && settings.linger_ms > 0)
		{
			/*
			 * Caught up, it seems: the next lease would find what one or two
			 * commits sent meanwhile, at the cost of a lease and an ack each.
			 * But a lease also comes back short when fewer keys than batch
			 * have a message ready (the rest of a key's backlog waits for
			 * its head): once a lease after a wait found no more than the
			 * one before it, the relay leases at once until a lease comes
			 * back empty or full.
			 */
			if (lingered_after >= 0 && n <= lingered_after)
				linger_off = 1;
			lingered_after = -1;
			if (!linger_off)
			{
				lingered_after = n;
				wait_until(now_ms() + settings.linger_ms, 0);
				/* commits of the wait: the next lease sees them */
				if (conn != NULL)
					(void) PQconsumeInput(conn);
				drain_notifications();
			}
		}
		if (n == 0 || n >= settings.batch)
		{
			linger_off = 0;
			lingered_after = -1;
		}
		if (stop_requested && !announced)
		{
			relay_log(LOG_INFO, "stopping");
			announced = 1;
		}
	}
	if (stop_requested && !announced)
		relay_log(LOG_INFO, "stopping");
	/* what a lost connection cut, once more before leaving (not on a second signal) */
	if ((pending.ack != NULL || pending.nack[0] != NULL) && !stop_now && pending_sendable() &&
		conn == NULL && db_connect() == 1)
		send_pending();
	pending_drop();

	close_routes();
	drop_connection();
	sink_global_cleanup();
	log_counts(1);
	free(schema);
	free(settings.name);
	config_free(&cfg);
	config_free(&cmdline_cfg);
	close(wake_pipe[0]);
	close(wake_pipe[1]);
	return exit_code;
}
