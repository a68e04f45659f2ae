/*
 * idem-relay: the nats sink.  Publishes to NATS JetStream over the NATS
 * client protocol, spoken directly over TCP (Debian has no package of the
 * NATS C client, libnats): the text protocol is small, and the sink needs
 * only a part of it.
 *
 * On connection: the server's INFO, then CONNECT (headers, no_responders),
 * a SUB on an inbox of the connection's own, "_INBOX.<random>.*", and a
 * PING whose PONG confirms both.  A batch is pipelined: one HPUB per message,
 * in the order of the batch, each with a reply subject "<inbox>.<n>" of its
 * own and the headers
 *
 *	Nats-Msg-Id: <message id>		the stream's duplicate window drops a
 *									redelivery with the same id
 *	Idem-Topic, Idem-Key, Idem-Type	percent-encoded (RFC 3986)
 *	Idem-Attempt: <attempt>
 *	Idem-Headers: <the message's headers, JSON>, when it has some
 *	Content-Type: application/json
 *
 * then the acknowledgements are matched to the messages by their reply
 * subject.  The stream's answer decides:
 *
 *	{"stream":..., "seq":...}			delivered (also with "duplicate":true:
 *										the stream had it already)
 *	{"error": {...}}					retried
 *	503 status (no responders)			retried: no stream takes the subject
 *	no answer within the timeout		retried; the connection is dropped
 *	connection lost, refused			retried after the reconnection backoff
 *
 * A message larger than the server's max_payload, or whose subject is not a
 * valid NATS subject, is refused for good.  The server's PINGs are answered.
 * Before each lease the relay asks the sink whether it is ready: what the
 * server sent to the idle connection is read (its end too), and a connection
 * that is down is made again when the backoff allows; until it is, the relay
 * leases nothing, so that an outage costs no message an attempt.
 * No TLS; authentication by user and password or by token.
 *
 * Settings: url (nats://host:port, default nats://127.0.0.1:4222), subject
 * (default: the message's topic), user, password, token.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "relay.h"

#define NATS_DEFAULT_URL "nats://127.0.0.1:4222"
#define NATS_RECONNECT_MIN_MS 100
#define NATS_RECONNECT_MAX_MS 5000
#define NATS_EXCERPT 200
/* JetStream's err_codes of a message it refuses for what the message is */
#define NATS_ERR_MSG_TOO_LARGE	10054	/* over the stream's max_msg_size */
#define NATS_ERR_HDR_TOO_LARGE	10097	/* headers over 64 kB */

typedef struct NatsSink
{
	Sink		base;
	char	   *url;			/* as configured, for messages */
	char	   *host;
	char	   *port;
	char	   *subject;		/* NULL: the message's topic */
	char	   *user;
	char	   *password;
	char	   *token;
	long		timeout_ms;

	/* the connection */
	int			fd;				/* -1: not connected */
	char		inbox[48];		/* "_INBOX.<random>" */
	unsigned long next_reply;
	long		max_payload;
	char		server[160];	/* name and version, for the log */
	StrBuf		in;				/* received, not yet parsed from in_off */
	size_t		in_off;
	StrBuf		out;			/* to send, not yet sent from out_off */
	size_t		out_off;
	char		error[OUTCOME_ERROR_LEN];	/* why the connection failed */

	/* reconnection */
	int			failures;		/* failed connections in a row */
	int64_t		next_connect_ms;
} NatsSink;

/* One operation from the server. */
typedef enum NatsOpKind
{
	NOP_INFO,
	NOP_MSG,
	NOP_PING,
	NOP_PONG,
	NOP_OK,
	NOP_ERR
} NatsOpKind;

typedef struct NatsOp
{
	NatsOpKind	kind;
	char		line[1024];		/* the control line, without CRLF */
	const char *subject;		/* MSG, HMSG: pointers into line */
	const char *data;			/* MSG, HMSG: headers then payload */
	size_t		hdr_len;
	size_t		total_len;
} NatsOp;

/* A message of the batch in flight. */
typedef struct Pending
{
	int			sent;
	int			done;
} Pending;

static const char *const nats_settings[] = {"url", "subject", "user", "password", "token", NULL};

/* ---- Settings ---- */

/*
 * A NATS subject one may publish to: tokens of printable ASCII without
 * spaces, separated by dots, none empty and none a wildcard, and not one of
 * the server's own ($JS.API, $SYS, $KV...: a message there is a request to
 * the server, such as deleting a stream, which whoever may send to the
 * outbox could otherwise make the relay ask with its own credentials).
 */
static int
valid_subject(const char *s)
{
	const char *tok = s;
	const char *p;

	if (*s == '\0' || *s == '$')
		return 0;
	for (p = s;; p++)
	{
		if (*p == '.' || *p == '\0')
		{
			size_t		n = (size_t) (p - tok);

			if (n == 0 || (n == 1 && (*tok == '*' || *tok == '>')))
				return 0;
			if (*p == '\0')
				return 1;
			tok = p + 1;
		}
		else if ((unsigned char) *p <= ' ' || (unsigned char) *p == 0x7f)
			return 0;
	}
}

/* "nats://host:port", "host:port", "host", "[::1]:4222" into host and port */
static int
parse_url(NatsSink *s, const char *url, char *err, size_t errlen)
{
	const char *p = url;
	const char *end;
	char		host[256];
	const char *port = "4222";
	size_t		n;
	char		shown_url[1024];

	url_for_message(url, shown_url, sizeof(shown_url));

	if (strncasecmp(p, "nats://", 7) == 0)
		p += 7;
	else if (strstr(p, "://") != NULL)
	{
		snprintf(err, errlen, "nats.url \"%s\" is not nats:// (the nats sink has no TLS)", shown_url);
		return 0;
	}
	if (strchr(p, '@') != NULL)
	{
		snprintf(err, errlen, "nats.url \"%s\": give the credentials in nats.user and "
				 "nats.password, or nats.token, not in the URL", shown_url);
		return 0;
	}
	if (*p == '[')
	{
		end = strchr(p, ']');
		if (end == NULL)
			goto bad;
		n = (size_t) (end - p - 1);
		if (n == 0 || n >= sizeof(host))
			goto bad;
		memcpy(host, p + 1, n);
		host[n] = '\0';
		end++;
	}
	else
	{
		end = strchr(p, ':');
		if (end == NULL)
			end = p + strlen(p);
		while (end > p && end[-1] == '/')
			end--;
		n = (size_t) (end - p);
		/* a path ("nats://host/x") would be taken for part of the host */
		if (n == 0 || n >= sizeof(host) || memchr(p, '/', n) != NULL)
			goto bad;
		memcpy(host, p, n);
		host[n] = '\0';
	}
	if (*end == ':')
	{
		port = end + 1;
		n = strspn(port, "0123456789");
		if (n == 0 || n > 5 || (port[n] != '\0' && strcmp(port + n, "/") != 0) ||
			atoi(port) < 1 || atoi(port) > 65535)
			goto bad;
	}
	else if (*end != '\0' && strcmp(end, "/") != 0)
		goto bad;
	s->host = xstrdup(host);
	s->port = xstrdup(port);
	s->port[strspn(s->port, "0123456789")] = '\0';
	return 1;

bad:
	snprintf(err, errlen, "nats.url \"%s\" is not nats://HOST:PORT", shown_url);
	return 0;
}

static Sink *
nats_init(const SinkSettings *ss, char *err, size_t errlen)
{
	const char *url = sink_setting(ss, "url");
	const char *subject = sink_setting(ss, "subject");
	const char *user = sink_setting(ss, "user");
	const char *password = sink_setting(ss, "password");
	const char *token = sink_setting(ss, "token");
	NatsSink   *s;

	if (url == NULL || *url == '\0')
		url = NATS_DEFAULT_URL;
	if (subject != NULL && !valid_subject(subject))
	{
		snprintf(err, errlen, "nats.subject \"%s\"%s%s%s is not a valid NATS subject to publish to "
				 "(dot-separated tokens without spaces or wildcards, not beginning with $)", subject,
				 ss->topic ? " (topic \"" : "", ss->topic ? ss->topic : "", ss->topic ? "\")" : "");
		return NULL;
	}
	if ((user != NULL) != (password != NULL))
	{
		snprintf(err, errlen, "nats.user and nats.password go together");
		return NULL;
	}
	if (user != NULL && token != NULL)
	{
		snprintf(err, errlen, "nats.token and nats.user cannot both be set");
		return NULL;
	}
	s = xmalloc(sizeof(NatsSink));
	memset(s, 0, sizeof(NatsSink));
	s->base.type = &sink_nats_type;
	if (!parse_url(s, url, err, errlen))
	{
		free(s);
		return NULL;
	}
	s->url = xstrdup(url);
	s->subject = subject ? xstrdup(subject) : NULL;
	s->user = user ? xstrdup(user) : NULL;
	s->password = password ? xstrdup(password) : NULL;
	s->token = token ? xstrdup(token) : NULL;
	s->timeout_ms = ss->timeout_ms;
	s->fd = -1;
	sb_init(&s->in);
	sb_init(&s->out);
	return &s->base;
}

/* ---- The connection ---- */

static void
disconnect(NatsSink *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	sb_reset(&s->in);
	s->in_off = 0;
	sb_reset(&s->out);
	s->out_off = 0;
}

/* The connection failed: drop it, with why in s->error. */
static void
fail(NatsSink *s, const char *fmt,...) PRINTF_LIKE(2, 3);

static void
fail(NatsSink *s, const char *fmt,...)
{
	va_list		ap;
	char		msg[OUTCOME_ERROR_LEN];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	printable_copy(s->error, sizeof(s->error), msg, strlen(msg));
	disconnect(s);
}

/*
 * Waits for the socket (POLLIN, and POLLOUT while there is something to
 * send) until deadline, at most 100 ms at a time so that *stop is seen;
 * sends and receives what it can.  Returns 1 when something was received,
 * 0 otherwise, -1 when the connection failed (dropped, s->error says why).
 */
static int
pump(NatsSink *s, int64_t deadline, volatile sig_atomic_t *stop)
{
	struct pollfd pfd;
	int64_t		wait = deadline - now_ms();
	int			r;

	if (wait < 0)
		wait = 0;
	if (wait > 100)
		wait = 100;
	pfd.fd = s->fd;
	pfd.events = POLLIN | (s->out_off < s->out.len ? POLLOUT : 0);
	pfd.revents = 0;
	r = poll(&pfd, 1, (int) wait);
	if (r < 0)
		return errno == EINTR ? 0 : (fail(s, "nats: poll failed: %s", strerror(errno)), -1);
	if (r == 0)
		return 0;
	if (pfd.revents & POLLOUT)
	{
		ssize_t		n = send(s->fd, s->out.data + s->out_off, s->out.len - s->out_off,
							 MSG_NOSIGNAL);

		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
		{
			fail(s, "nats: connection to %s lost: %s", s->url, strerror(errno));
			return -1;
		}
		if (n > 0)
		{
			s->out_off += (size_t) n;
			if (s->out_off == s->out.len)
			{
				sb_reset(&s->out);
				s->out_off = 0;
			}
		}
	}
	if (pfd.revents & (POLLIN | POLLHUP | POLLERR))
	{
		char		buf[16384];
		ssize_t		n = recv(s->fd, buf, sizeof(buf), 0);

		if (n == 0)
		{
			fail(s, "nats: connection to %s closed by the server", s->url);
			return -1;
		}
		if (n < 0)
		{
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				return 0;
			fail(s, "nats: connection to %s lost: %s", s->url, strerror(errno));
			return -1;
		}
		/* what was parsed goes first, when it is most of the buffer */
		if (s->in_off > 0 && s->in_off * 2 >= s->in.len)
		{
			memmove(s->in.data, s->in.data + s->in_off, s->in.len - s->in_off);
			s->in.len -= s->in_off;
			s->in.data[s->in.len] = '\0';
			s->in_off = 0;
		}
		sb_putn(&s->in, buf, (size_t) n);
		return 1;
	}
	return 0;
}

/* the n-th space-separated field of line (from 0) into buf; false if none */
static int
field(const char *line, int n, char *buf, size_t size)
{
	const char *p = line;
	size_t		len;

	for (;;)
	{
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '\0')
			return 0;
		len = strcspn(p, " \t");
		if (n-- == 0)
		{
			if (len >= size)
				return 0;
			memcpy(buf, p, len);
			buf[len] = '\0';
			return 1;
		}
		p += len;
	}
}

static int
count_fields(const char *line)
{
	const char *p = line;
	int			n = 0;

	for (;;)
	{
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '\0')
			return n;
		n++;
		p += strcspn(p, " \t");
	}
}

/*
 * The next operation received, consumed from the buffer: 1, 0 when it is
 * not all there yet, -1 on a protocol error (the connection is dropped).
 * The pointers of op stay valid until the next call of pump().
 */
static int
next_op(NatsSink *s, NatsOp *op)
{
	const char *start = s->in.data + s->in_off;
	size_t		avail = s->in.len - s->in_off;
	const char *eol = avail > 0 ? memchr(start, '\n', avail) : NULL;
	size_t		linelen;
	char		verb[8];

	if (eol == NULL)
	{
		if (avail > sizeof(op->line) * 64)
		{
			fail(s, "nats: protocol error: a line of more than %zu bytes", avail);
			return -1;
		}
		return 0;
	}
	linelen = (size_t) (eol - start);
	if (linelen > 0 && start[linelen - 1] == '\r')
		linelen--;
	if (linelen >= sizeof(op->line))
	{
		/* an INFO with many connect_urls: only its start matters */
		if (strncasecmp(start, "INFO", 4) != 0)
		{
			fail(s, "nats: protocol error: a line of %zu bytes", linelen);
			return -1;
		}
		linelen = sizeof(op->line) - 1;
	}
	memcpy(op->line, start, linelen);
	op->line[linelen] = '\0';
	if (!field(op->line, 0, verb, sizeof(verb)))
		verb[0] = '\0';
	if (strcasecmp(verb, "MSG") == 0 || strcasecmp(verb, "HMSG") == 0)
	{
		int			hmsg = strcasecmp(verb, "HMSG") == 0;
		int			nf = count_fields(op->line);
		char		num[24];
		size_t		need;

		/* MSG subject sid [reply] len; HMSG subject sid [reply] hlen len */
		if (nf < (hmsg ? 5 : 4) || nf > (hmsg ? 6 : 5) || !field(op->line, nf - 1, num, sizeof(num)))
		{
			fail(s, "nats: protocol error: \"%.100s\"", op->line);
			return -1;
		}
		op->total_len = strtoul(num, NULL, 10);
		op->hdr_len = 0;
		if (hmsg && field(op->line, nf - 2, num, sizeof(num)))
			op->hdr_len = strtoul(num, NULL, 10);
		if (op->hdr_len > op->total_len || op->total_len > 64 * 1024 * 1024)
		{
			fail(s, "nats: protocol error: \"%.100s\"", op->line);
			return -1;
		}
		need = (size_t) (eol - start) + 1 + op->total_len + 2;
		if (avail < need)
			return 0;
		op->kind = NOP_MSG;
		op->data = eol + 1;
		/* the subject: the second field, cut in place */
		{
			char	   *p = op->line + strspn(op->line, " \t");

			p += strcspn(p, " \t");
			p += strspn(p, " \t");
			op->subject = p;
			p[strcspn(p, " \t")] = '\0';
		}
		s->in_off += need;
		return 1;
	}
	s->in_off += (size_t) (eol - start) + 1;
	if (strcasecmp(verb, "PING") == 0)
		op->kind = NOP_PING;
	else if (strcasecmp(verb, "PONG") == 0)
		op->kind = NOP_PONG;
	else if (strcasecmp(verb, "+OK") == 0)
		op->kind = NOP_OK;
	else if (strcasecmp(verb, "-ERR") == 0)
		op->kind = NOP_ERR;
	else if (strcasecmp(verb, "INFO") == 0)
		op->kind = NOP_INFO;
	else
	{
		fail(s, "nats: protocol error: \"%.100s\"", op->line);
		return -1;
	}
	return 1;
}

/* In a JSON text, where the value of the first "key" starts, or NULL. */
static const char *
json_value(const char *json, size_t len, const char *key)
{
	size_t		klen = strlen(key);
	const char *p = json;
	const char *end = json + len;

	while (p + klen + 2 < end)
	{
		const char *q = memchr(p, '"', (size_t) (end - p));

		if (q == NULL || q + klen + 2 > end)
			return NULL;
		if (strncmp(q + 1, key, klen) == 0 && q[klen + 1] == '"')
		{
			q += klen + 2;
			while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
				q++;
			if (q < end && *q == ':')
			{
				q++;
				while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
					q++;
				return q < end ? q : NULL;
			}
		}
		p = q + 1;
	}
	return NULL;
}

/* a JSON string value at v, unescaped roughly (escapes kept), into buf */
static void
json_string(const char *v, const char *end, char *buf, size_t size)
{
	size_t		n = 0;

	if (v == NULL || v >= end || *v != '"')
	{
		snprintf(buf, size, "?");
		return;
	}
	for (v++; v < end && *v != '"' && n + 1 < size; v++)
	{
		if (*v == '\\' && v + 1 < end)
			v++;
		buf[n++] = *v;
	}
	buf[n] = '\0';
}

/* An operation that is not an acknowledgement: PING, INFO, -ERR.  False
 * when the connection failed. */
static int
handle_other(NatsSink *s, const NatsOp *op)
{
	switch (op->kind)
	{
		case NOP_PING:
			sb_puts(&s->out, "PONG\r\n");
			return 1;
		case NOP_ERR:
			/* a permission violation leaves the connection open */
			if (strcasestr(op->line, "Permissions Violation") != NULL)
			{
				char		msg[300];

				printable_copy(msg, sizeof(msg), op->line, strlen(op->line));
				relay_log(LOG_WARNING, "nats: %s", msg);
				return 1;
			}
			fail(s, "nats: the server at %s says %s", s->url, op->line);
			return 0;
		case NOP_INFO:
			{
				const char *v = json_value(op->line, strlen(op->line), "max_payload");

				if (v != NULL && atol(v) > 0)
					s->max_payload = atol(v);
				return 1;
			}
		default:
			return 1;
	}
}

/*
 * Waits for the next operation until deadline; 1 with op set, 0 at the
 * deadline or when *stop is set, -1 when the connection failed.
 */
static int
wait_op(NatsSink *s, NatsOp *op, int64_t deadline, volatile sig_atomic_t *stop)
{
	for (;;)
	{
		int			r = next_op(s, op);

		if (r != 0)
			return r;
		if ((stop && *stop) || now_ms() >= deadline)
			return 0;
		if (pump(s, deadline, stop) < 0)
			return -1;
	}
}

/* A TCP connection to host:port within deadline; the socket, or -1. */
static int
tcp_connect(NatsSink *s, int64_t deadline, volatile sig_atomic_t *stop)
{
	struct addrinfo hints;
	struct addrinfo *res;
	struct addrinfo *ai;
	int			rc;
	int			fd = -1;
	char		why[256] = "no address";

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(s->host, s->port, &hints, &res);
	if (rc != 0)
	{
		fail(s, "nats: could not resolve \"%s\": %s", s->host, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next)
	{
		int			one = 1;

		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0)
		{
			snprintf(why, sizeof(why), "%s", strerror(errno));
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
		{
			if (errno != EINPROGRESS)
			{
				snprintf(why, sizeof(why), "%s", strerror(errno));
				close(fd);
				fd = -1;
				continue;
			}
			for (;;)
			{
				struct pollfd pfd = {fd, POLLOUT, 0};
				int64_t		wait = deadline - now_ms();
				int			err = 0;
				socklen_t	len = sizeof(err);

				if (wait <= 0 || (stop && *stop))
				{
					snprintf(why, sizeof(why), "%s", wait <= 0 ? "timeout" : "interrupted by shutdown");
					close(fd);
					fd = -1;
					break;
				}
				rc = poll(&pfd, 1, wait > 100 ? 100 : (int) wait);
				if (rc == 0 || (rc < 0 && errno == EINTR))
					continue;
				if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
					break;
				snprintf(why, sizeof(why), "%s", strerror(rc < 0 ? errno : err));
				close(fd);
				fd = -1;
				break;
			}
		}
	}
	freeaddrinfo(res);
	if (fd < 0)
		fail(s, "nats: could not connect to %s: %s", s->url, why);
	return fd;
}

/*
 * Connects: INFO, CONNECT, SUB on the inbox, PING and its PONG.  True when
 * connected; false with s->error set.
 */
static int
nats_connect(NatsSink *s, volatile sig_atomic_t *stop)
{
	int64_t		deadline = now_ms() + s->timeout_ms;
	NatsOp		op;
	int			r;
	const char *v;
	char		name[64];
	char		version[32];
	size_t		len;

	disconnect(s);
	s->fd = tcp_connect(s, deadline, stop);
	if (s->fd < 0)
		return 0;
	r = wait_op(s, &op, deadline, stop);
	if (r <= 0 || op.kind != NOP_INFO)
	{
		if (r >= 0)
			fail(s, "nats: %s did not introduce itself with INFO: %s", s->url,
				 r == 0 ? "timeout" : "not a NATS server");
		return 0;
	}
	len = strlen(op.line);
	v = json_value(op.line, len, "tls_required");
	if (v != NULL && strncmp(v, "true", 4) == 0)
	{
		fail(s, "nats: the server at %s requires TLS, which the nats sink does not speak", s->url);
		return 0;
	}
	v = json_value(op.line, len, "headers");
	if (v == NULL || strncmp(v, "true", 4) != 0)
	{
		fail(s, "nats: the server at %s does not support headers (NATS 2.2 or later is needed)", s->url);
		return 0;
	}
	s->max_payload = 1024 * 1024;
	handle_other(s, &op);
	json_string(json_value(op.line, len, "server_name"), op.line + len, name, sizeof(name));
	json_string(json_value(op.line, len, "version"), op.line + len, version, sizeof(version));
	snprintf(s->server, sizeof(s->server), "%s %s", name, version);

	sb_puts(&s->out, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,"
			"\"no_responders\":true,\"protocol\":1,\"lang\":\"c\",\"version\":\"" RELAY_VERSION "\","
			"\"name\":\"idem-relay\"");
	if (s->user)
	{
		sb_puts(&s->out, ",\"user\":");
		sb_json_string(&s->out, s->user);
		sb_puts(&s->out, ",\"pass\":");
		sb_json_string(&s->out, s->password);
	}
	if (s->token)
	{
		sb_puts(&s->out, ",\"auth_token\":");
		sb_json_string(&s->out, s->token);
	}
	sb_puts(&s->out, "}\r\n");
	/*
	 * A JetStream ack does not say which message it is for: a relay that
	 * shared another's inbox would take the other's acks for its own and
	 * acknowledge what was never stored.  Relays in containers share PIDs
	 * and start in the same second, so the inbox is drawn from the kernel.
	 */
	{
		unsigned char r[16];
		int			n = snprintf(s->inbox, sizeof(s->inbox), "_INBOX.");

		if (getentropy(r, sizeof(r)) != 0)
		{
			fail(s, "nats: could not draw a random inbox name: %s", strerror(errno));
			return 0;
		}
		for (int i = 0; i < (int) sizeof(r); i++)
			n += snprintf(s->inbox + n, sizeof(s->inbox) - n, "%02x", r[i]);
	}
	sb_printf(&s->out, "SUB %s.* 1\r\nPING\r\n", s->inbox);
	for (;;)
	{
		r = wait_op(s, &op, deadline, stop);
		if (r < 0)
			return 0;
		if (r == 0)
		{
			fail(s, "nats: no answer from %s to CONNECT", s->url);
			return 0;
		}
		if (op.kind == NOP_PONG)
			break;
		if (op.kind == NOP_ERR)
		{
			fail(s, "nats: the server at %s refused the connection: %s", s->url, op.line);
			return 0;
		}
		if (!handle_other(s, &op))
			return 0;
	}
	s->failures = 0;
	relay_log(LOG_INFO, "nats: connected to %s (%s)", s->url, s->server);
	return 1;
}

/* ---- Publishing ---- */

static void
put_encoded(StrBuf *sb, const char *name, const char *value)
{
	const unsigned char *p;

	sb_printf(sb, "%s: ", name);
	for (p = (const unsigned char *) value; *p; p++)
	{
		if (('a' <= *p && *p <= 'z') || ('A' <= *p && *p <= 'Z') ||
			('0' <= *p && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~')
			sb_putc(sb, (char) *p);
		else
			sb_printf(sb, "%%%02X", *p);
	}
	sb_puts(sb, "\r\n");
}

/* The answer to message m; false if it is not one (a status to ignore). */
static void
read_ack(NatsSink *s, const RelayMessage *m, const char *subject, const NatsOp *op, Outcome *out)
{
	const char *body = op->data + op->hdr_len;
	size_t		blen = op->total_len - op->hdr_len;
	const char *v;
	char		excerpt[NATS_EXCERPT + 1];

	out->retry_after_ms = -1;
	if (op->hdr_len > 0)
	{
		/* "NATS/1.0 503\r\n...": a status, such as no responders */
		const char *eol = memchr(op->data, '\r', op->hdr_len);
		size_t		n = eol ? (size_t) (eol - op->data) : op->hdr_len;

		if (n > 9 && strncmp(op->data, "NATS/1.0 ", 9) == 0)
		{
			printable_copy(excerpt, sizeof(excerpt), op->data + 9, n - 9);
			out->kind = OUTCOME_RETRY;
			if (strncmp(excerpt, "503", 3) == 0)
				snprintf(out->error, sizeof(out->error),
						 "nats: no stream takes subject \"%s\" (503 no responders)", subject);
			else
				snprintf(out->error, sizeof(out->error), "nats: status %s", excerpt);
			return;
		}
	}
	if ((v = json_value(body, blen, "error")) != NULL)
	{
		char		desc[300];
		const char *code = json_value(body, blen, "err_code");

		const char *status = json_value(v, blen - (size_t) (v - body), "code");

		json_string(json_value(body, blen, "description"), body + blen, desc, sizeof(desc));

		/*
		 * The message itself refused (larger than the stream's max_msg_size,
		 * or its headers than 64 kB), which it would be at every attempt:
		 * refused for good, as the other sinks refuse such a message.  Told
		 * by err_code, not by code: 400 is also the answer of a clustered
		 * JetStream whose account is over its storage limits (10002), which
		 * may pass later.  Anything else (a full stream, 503) is retried.
		 */
		out->kind = status != NULL && atol(status) == 400 && code != NULL &&
			(atol(code) == NATS_ERR_MSG_TOO_LARGE || atol(code) == NATS_ERR_HDR_TOO_LARGE) ?
			OUTCOME_PERMANENT : OUTCOME_RETRY;
		snprintf(out->error, sizeof(out->error), "nats: the stream refused the message: %s (err_code %ld)",
				 desc, code ? atol(code) : 0L);
		return;
	}
	if (json_value(body, blen, "stream") != NULL && (v = json_value(body, blen, "seq")) != NULL)
	{
		const char *dup = json_value(body, blen, "duplicate");
		char		stream[128];

		out->kind = OUTCOME_DELIVERED;
		json_string(json_value(body, blen, "stream"), body + blen, stream, sizeof(stream));
		if (dup != NULL && strncmp(dup, "true", 4) == 0)
			relay_log(LOG_DEBUG, "nats: %s was a duplicate: stream %s has it already (seq %ld)",
					  m->id, stream, atol(v));
		else
			relay_log(LOG_DEBUG, "nats: %s stored in stream %s (seq %ld)", m->id, stream, atol(v));
		return;
	}
	printable_copy(excerpt, sizeof(excerpt), body, blen);
	out->kind = OUTCOME_RETRY;
	snprintf(out->error, sizeof(out->error), "nats: unexpected answer: %s", excerpt);
}

static long
reconnect_delay(int failures)
{
	double		ms = NATS_RECONNECT_MIN_MS;
	int			i;

	for (i = 1; i < failures && ms < NATS_RECONNECT_MAX_MS; i++)
		ms *= 2;
	if (ms > NATS_RECONNECT_MAX_MS)
		ms = NATS_RECONNECT_MAX_MS;
	return (long) (ms * (0.5 + 0.5 * ((double) random() / RAND_MAX)));
}

/*
 * Connects unless connected, when the backoff allows; false when not
 * connected, with *wait_ms set to the time left until the next attempt.
 */
static int
ensure_connected(NatsSink *s, volatile sig_atomic_t *stop, long *wait_ms)
{
	int64_t		now = now_ms();

	if (s->fd >= 0)
		return 1;
	if (now >= s->next_connect_ms)
	{
		if (nats_connect(s, stop))
			return 1;
		s->failures++;
		s->next_connect_ms = now_ms() + reconnect_delay(s->failures);
		relay_log(LOG_WARNING, "%s", s->error);
	}
	now = now_ms();
	*wait_ms = s->next_connect_ms > now ? (long) (s->next_connect_ms - now) : 0;
	return 0;
}

/*
 * Before a lease: what the server sent while the connection was idle (a
 * PING to answer, an INFO, or its end) is read, and a connection that is
 * down is made again when the backoff allows.
 */
static int
nats_ready(Sink *sink, volatile sig_atomic_t *stop_now, long *retry_ms)
{
	NatsSink   *s = (NatsSink *) sink;
	int			rounds;

	for (rounds = 0; rounds < 10 && s->fd >= 0; rounds++)
	{
		NatsOp		op;
		int			r = pump(s, now_ms(), stop_now);

		while (r >= 0 && s->fd >= 0 && (r = next_op(s, &op)) > 0)
		{
			/* a late acknowledgement of an earlier batch is ignored */
			if (op.kind != NOP_MSG && !handle_other(s, &op))
				r = -1;
		}
		if (r < 0 || s->fd < 0)
		{
			if (s->fd >= 0)
				fail(s, "nats: protocol error from %s", s->url);
			relay_log(LOG_WARNING, "%s", s->error);
			/* the first attempt at once, then with a backoff */
			s->next_connect_ms = 0;
			break;
		}
		if (s->out_off >= s->out.len)
			break;
		/* a PONG to send: another round */
	}
	return ensure_connected(s, stop_now, retry_ms);
}

static int
nats_publish(Sink *sink, const RelayMessage *msgs, int n, Outcome *out,
			 const PublishControl *ctl)
{
	NatsSink   *s = (NatsSink *) sink;
	Pending    *pend;
	StrBuf		hdr;
	unsigned long base;
	int64_t		deadline;
	int			left = 0;
	int			i;

	if (*ctl->stop_now || now_ms() >= ctl->deadline_ms)
	{
		for (i = 0; i < n; i++)
			out[i].kind = OUTCOME_UNSENT;
		return 0;
	}
	if (s->fd < 0)
	{
		long		wait;

		if (!ensure_connected(s, ctl->stop_now, &wait))
		{
			for (i = 0; i < n; i++)
			{
				out[i].kind = OUTCOME_RETRY;
				out[i].retry_after_ms = wait;
				snprintf(out[i].error, sizeof(out[i].error), "%s", s->error);
			}
			return 0;
		}

		/*
		 * The connection may have taken up to the timeout: a batch started
		 * now could be confirmed after its lease ran out.
		 */
		if (*ctl->stop_now || now_ms() >= ctl->deadline_ms)
		{
			for (i = 0; i < n; i++)
				out[i].kind = OUTCOME_UNSENT;
			return 0;
		}
	}

	/* the batch, pipelined: one HPUB each, acknowledgements matched by reply */
	pend = xmalloc(sizeof(Pending) * (size_t) n);
	memset(pend, 0, sizeof(Pending) * (size_t) n);
	sb_init(&hdr);
	base = s->next_reply;
	s->next_reply += (unsigned long) n;
	for (i = 0; i < n; i++)
	{
		const RelayMessage *m = &msgs[i];
		const char *subject = s->subject ? s->subject : m->topic;
		size_t		plen = strlen(m->payload);

		out[i].retry_after_ms = -1;
		if (!valid_subject(subject))
		{
			out[i].kind = OUTCOME_PERMANENT;
			snprintf(out[i].error, sizeof(out[i].error),
					 "nats: topic \"%.100s\" is not a valid NATS subject: set topic.NAME.nats.subject",
					 subject);
			continue;
		}
		sb_reset(&hdr);
		sb_printf(&hdr, "NATS/1.0\r\nNats-Msg-Id: %s\r\n", m->id);
		put_encoded(&hdr, "Idem-Topic", m->topic);
		put_encoded(&hdr, "Idem-Key", m->key);
		if (m->type)
			put_encoded(&hdr, "Idem-Type", m->type);
		sb_printf(&hdr, "Idem-Attempt: %d\r\n", m->attempt);
		/* jsonb's text has no line breaks: they are escaped in strings */
		if (m->headers)
			sb_printf(&hdr, "Idem-Headers: %s\r\n", m->headers);
		sb_puts(&hdr, "Content-Type: application/json\r\n\r\n");
		if ((long) (hdr.len + plen) > s->max_payload)
		{
			out[i].kind = OUTCOME_PERMANENT;
			snprintf(out[i].error, sizeof(out[i].error),
					 "nats: the message has %zu bytes, more than the server's max_payload (%ld)",
					 hdr.len + plen, s->max_payload);
			continue;
		}
		sb_printf(&s->out, "HPUB %s %s.%lu %zu %zu\r\n", subject, s->inbox, base + (unsigned long) i,
				  hdr.len, hdr.len + plen);
		sb_putn(&s->out, hdr.data, hdr.len);
		sb_putn(&s->out, m->payload, plen);
		sb_puts(&s->out, "\r\n");
		pend[i].sent = 1;
		left++;
	}
	sb_free(&hdr);

	deadline = now_ms() + s->timeout_ms;
	while (left > 0 && s->fd >= 0)
	{
		NatsOp		op;
		int			r = wait_op(s, &op, deadline, ctl->stop_now);
		size_t		ilen = strlen(s->inbox);

		if (r <= 0)
		{
			if (r == 0)
				fail(s, *ctl->stop_now ? "nats: interrupted by shutdown" :
					 "nats: no acknowledgement from the stream within %ld ms", s->timeout_ms);
			break;
		}
		if (op.kind == NOP_MSG && strncmp(op.subject, s->inbox, ilen) == 0 && op.subject[ilen] == '.')
		{
			char	   *end;
			unsigned long no = strtoul(op.subject + ilen + 1, &end, 10);

			/* late answers of an earlier batch are ignored */
			if (*end == '\0' && no >= base && no - base < (unsigned long) n &&
				pend[no - base].sent && !pend[no - base].done)
			{
				i = (int) (no - base);
				read_ack(s, &msgs[i], s->subject ? s->subject : msgs[i].topic, &op, &out[i]);
				pend[i].done = 1;
				left--;
			}
		}
		else if (op.kind != NOP_MSG && !handle_other(s, &op))
			break;
	}
	for (i = 0; i < n; i++)
		if (pend[i].sent && !pend[i].done)
		{
			out[i].kind = OUTCOME_RETRY;
			out[i].retry_after_ms = *ctl->stop_now ? 0 : -1;
			snprintf(out[i].error, sizeof(out[i].error), "%s", s->error);
		}
	if (left > 0)
	{
		relay_log(LOG_WARNING, "%s", s->error);
		/* the next batch connects again at once; then with a backoff */
		s->next_connect_ms = 0;
	}
	free(pend);
	return 0;
}

static void
nats_close(Sink *sink)
{
	NatsSink   *s = (NatsSink *) sink;

	disconnect(s);
	sb_free(&s->in);
	sb_free(&s->out);
	free(s->url);
	free(s->host);
	free(s->port);
	free(s->subject);
	free(s->user);
	free(s->password);
	free(s->token);
	free(s);
}

const SinkType sink_nats_type = {
	.name = "nats",
	.settings = nats_settings,
	.global_init = NULL,
	.global_cleanup = NULL,
	.init = nats_init,
	.publish = nats_publish,
	.close = nats_close,
	.ready = nats_ready,
};
