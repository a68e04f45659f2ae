/*
 * idem-relay: the rabbitmq sink.  Each message is an AMQP 0-9-1
 * basic.publish (librabbitmq) on a channel in confirm mode:
 *
 *	exchange		the setting exchange ("" by default: the default exchange)
 *	routing key		the setting routing_key, where {topic}, {key} and {type}
 *					stand for the message's; "{topic}" by default
 *	properties		delivery_mode 2 (persistent), content_type
 *					application/json, message_id <message id>, type <type>,
 *					app_id idem-relay
 *	headers			x-idem-topic, x-idem-key, x-idem-attempt and, when the
 *					message has some, x-idem-headers (their JSON)
 *	body			the payload
 *
 * The messages of a batch are published one after the other, in the order
 * of the batch, and then the broker's confirmations are awaited (at most
 * the timeout after the last publish).  The broker decides:
 *
 *	basic.ack				delivered (the broker has the message, on disk
 *							for a durable queue)
 *	basic.nack				retried
 *	basic.return			retried (mandatory, the default: no queue is
 *							bound to the routing key, nobody would get it)
 *	no confirmation,		retried; the connection is closed and opened
 *	connection or channel	again (with a backoff) before the next publish
 *	lost or closed
 *
 * Before each lease the relay asks the sink whether it is ready: the idle
 * connection is checked (a broker that restarted or died closed it) and one
 * that is down is opened again when the backoff allows; until it is, the
 * relay leases nothing, so that an outage of the broker costs no message an
 * attempt.
 *
 * A message is confirmed by the broker at most once on one channel, but a
 * retried message may have reached the broker before the failure: it is
 * then published again with the same message_id, which consumers
 * deduplicate (idem_claim).
 *
 * Settings: url (amqp://user:password@host:port/vhost, default
 * amqp://guest:guest@localhost:5672, the virtual host "/"; a path names
 * the virtual host, %2f for "/"), exchange, routing_key, mandatory
 * (true or false, default true).  The connection is made again after a
 * backoff that doubles from 250 ms up to the relay's reconnect_max, and
 * keeps growing until a message is confirmed: a broker that takes
 * connections but no messages (a resource alarm blocks publishers) is not
 * given a batch, and an attempt of each of its messages, every 250 ms.
 *
 * librabbitmq sends a frame with no time limit, and a broker under a
 * resource alarm stops reading: amqp_basic_publish would wait for as long
 * as the alarm lasts, past the lease and deaf to signals.  While a message
 * is sent, a timer looks every 100 ms whether its timeout has passed or
 * the relay must stop, and then shuts the socket down: the send fails, and
 * the connection is dropped as when the broker goes away.
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

#include "relay.h"

#define RMQ_CHANNEL 1
#define RMQ_BACKOFF_MIN_MS 250

/* The send the timer watches: its socket (or -1), until when, and why stop. */
static volatile sig_atomic_t watch_fd = -1;
static volatile sig_atomic_t watch_fired = 0;
/* volatile: written before watch_fd, and read by the handler once it is set */
static volatile int64_t watch_until_ms;
static volatile sig_atomic_t *volatile watch_stop;

static void
rmq_watchdog(int signo)
{
	int			save = errno;
	int			fd = watch_fd;

	if (fd >= 0 && (*watch_stop || now_ms() >= watch_until_ms))
	{
		watch_fired = 1;
		shutdown(fd, SHUT_RDWR);
	}
	errno = save;
}

/* Watch the sends on the socket fd until until_ms, or until *stop is set. */
static void
watch_start(int fd, int64_t until_ms, volatile sig_atomic_t *stop)
{
	static int	installed = 0;
	struct itimerval it = {{0, 100000}, {0, 100000}};

	if (!installed)
	{
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = rmq_watchdog;
		sigemptyset(&sa.sa_mask);
		/* what the tick interrupts goes on: only the shutdown ends a send */
		sa.sa_flags = SA_RESTART;
		sigaction(SIGALRM, &sa, NULL);
		installed = 1;
	}
	watch_until_ms = until_ms;
	watch_stop = stop;
	watch_fired = 0;
	watch_fd = fd;
	setitimer(ITIMER_REAL, &it, NULL);
}

static void
watch_end(void)
{
	struct itimerval it = {{0, 0}, {0, 0}};

	/* first: a tick between the two must not shut down a send that ended */
	watch_fd = -1;
	setitimer(ITIMER_REAL, &it, NULL);
}

/* AMQP's short strings (exchange, routing key) hold at most this many bytes */
#define RMQ_SHORTSTR_MAX	255
/* what publish_one returns for a routing key longer than that */
#define RMQ_KEY_TOO_LONG	1
#define RMQ_BODY_TOO_LARGE	2
#define RMQ_HEADERS_TOO_LARGE 3
#define RMQ_TYPE_TOO_LONG	4

/*
 * RabbitMQ's max_message_size, by default 128 MiB and at most 512 MiB: a
 * larger body makes the broker close the channel (406), which would retry
 * the whole batch, for ever, for one message that can never be taken.
 */
#define RMQ_DEFAULT_MAX_MESSAGE_SIZE (128L * 1024 * 1024)
#define RMQ_MAX_MESSAGE_SIZE	(512L * 1024 * 1024)
/*
 * Room for what a content header frame holds beside the texts counted: the
 * frame's own 8 bytes, 14 of the header, the fixed properties and the table's
 * entries (about 130 bytes in all).
 */
#define RMQ_PROPERTIES_SLACK	192

typedef struct RabbitSink
{
	Sink		base;
	char	   *url;			/* as configured, for messages (no password) */
	char	   *url_copy;		/* parsed in place by amqp_parse_url */
	struct amqp_connection_info info;
	char	   *exchange;
	char	   *routing_key;	/* a template */
	long		max_message_size;	/* bytes of a body the broker takes */
	int			mandatory;
	long		timeout_ms;
	long		reconnect_max_ms;	/* the relay's reconnect_max */

	amqp_connection_state_t conn;	/* NULL: not connected */
	uint64_t	next_tag;		/* the delivery tag of the next publish */
	int			failures;		/* connections failed in a row */
	int64_t		connected_ms;	/* when the connection was made, or 0 */
	int64_t		next_connect_ms;	/* no attempt before */
	char		last_error[OUTCOME_ERROR_LEN];
} RabbitSink;

static const char *const rabbitmq_settings[] = {
	"url", "exchange", "routing_key", "mandatory", "max_message_size", NULL
};

static void
rmq_drop(RabbitSink *s)
{
	if (s->conn == NULL)
		return;
	/* no goodbye: the connection may be dead, and a close would wait */
	amqp_destroy_connection(s->conn);
	s->conn = NULL;
}

/* Something failed: the connection is dropped, the next one after a backoff. */
static void
rmq_fail(RabbitSink *s, const char *fmt,...) PRINTF_LIKE(2, 3);

static void
rmq_fail(RabbitSink *s, const char *fmt,...)
{
	va_list		ap;
	long		wait = RMQ_BACKOFF_MIN_MS;
	int			i;

	va_start(ap, fmt);
	vsnprintf(s->last_error, sizeof(s->last_error), fmt, ap);
	va_end(ap);
	rmq_drop(s);
	/* a connection that lasted (closed while idle, say) starts the backoff over */
	if (s->connected_ms > 0 && now_ms() - s->connected_ms >= s->reconnect_max_ms)
		s->failures = 0;
	s->connected_ms = 0;
	s->failures++;
	for (i = 1; i < s->failures && wait < s->reconnect_max_ms; i++)
		wait *= 2;
	if (wait > s->reconnect_max_ms)
		wait = s->reconnect_max_ms;
	s->next_connect_ms = now_ms() + wait;
	relay_log(LOG_WARNING, "%s", s->last_error);
}

/* The text of a failed RPC reply. */
static void
reply_text(amqp_rpc_reply_t r, char *buf, size_t size)
{
	switch (r.reply_type)
	{
		case AMQP_RESPONSE_NORMAL:
			snprintf(buf, size, "no error");
			break;
		case AMQP_RESPONSE_NONE:
			snprintf(buf, size, "no reply");
			break;
		case AMQP_RESPONSE_LIBRARY_EXCEPTION:
			snprintf(buf, size, "%s", amqp_error_string2(r.library_error));
			break;
		case AMQP_RESPONSE_SERVER_EXCEPTION:
			if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
			{
				amqp_connection_close_t *c = r.reply.decoded;

				snprintf(buf, size, "connection closed by the broker: %d %.*s", c->reply_code,
						 (int) c->reply_text.len, (char *) c->reply_text.bytes);
			}
			else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			{
				amqp_channel_close_t *c = r.reply.decoded;

				snprintf(buf, size, "channel closed by the broker: %d %.*s", c->reply_code,
						 (int) c->reply_text.len, (char *) c->reply_text.bytes);
			}
			else
				snprintf(buf, size, "unexpected method 0x%08X from the broker", r.reply.id);
			break;
	}
}

/* Connects, logs in, opens the channel in confirm mode; false on failure. */
static int
rmq_connect(RabbitSink *s)
{
	amqp_socket_t *sock;
	struct timeval tv;
	amqp_rpc_reply_t r;
	char		msg[OUTCOME_ERROR_LEN - 100];
	int			rc;

	s->conn = amqp_new_connection();
	if (s->conn == NULL)
	{
		rmq_fail(s, "rabbitmq: out of memory");
		return 0;
	}
	sock = amqp_tcp_socket_new(s->conn);
	if (sock == NULL)
	{
		rmq_fail(s, "rabbitmq: could not create a socket");
		return 0;
	}
	tv.tv_sec = s->timeout_ms / 1000;
	tv.tv_usec = (s->timeout_ms % 1000) * 1000;
	amqp_set_handshake_timeout(s->conn, &tv);
	amqp_set_rpc_timeout(s->conn, &tv);
	rc = amqp_socket_open_noblock(sock, s->info.host, s->info.port, &tv);
	if (rc != AMQP_STATUS_OK)
	{
		rmq_fail(s, "rabbitmq: could not connect to %s: %s", s->url, amqp_error_string2(rc));
		return 0;
	}
	/* no heartbeats: a connection that died is found before each batch */
	r = amqp_login(s->conn, s->info.vhost, 1, AMQP_DEFAULT_FRAME_SIZE, 0,
				   AMQP_SASL_METHOD_PLAIN, s->info.user, s->info.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		reply_text(r, msg, sizeof(msg));
		rmq_fail(s, "rabbitmq: could not log in to %s: %s", s->url, msg);
		return 0;
	}
	amqp_channel_open(s->conn, RMQ_CHANNEL);
	r = amqp_get_rpc_reply(s->conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
	{
		amqp_confirm_select(s->conn, RMQ_CHANNEL);
		r = amqp_get_rpc_reply(s->conn);
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		reply_text(r, msg, sizeof(msg));
		rmq_fail(s, "rabbitmq: could not open a channel in confirm mode on %s: %s", s->url, msg);
		return 0;
	}
	s->next_tag = 1;
	if (s->failures > 0)
		relay_log(LOG_INFO, "rabbitmq: connected to %s again", s->url);
	else
		relay_log(LOG_DEBUG, "rabbitmq: connected to %s", s->url);
	/* failures count on until a message is confirmed (see above) */
	s->connected_ms = now_ms();
	s->last_error[0] = '\0';
	return 1;
}

/*
 * Whether the connection, idle since the last batch, is still open: the
 * broker may have closed it (a restart sends connection.close, a crash
 * ends the socket).  Nothing else is expected between batches.
 */
static int
rmq_alive(RabbitSink *s)
{
	amqp_frame_t frame;
	struct timeval tv = {0, 0};
	int			rc;

	rc = amqp_simple_wait_frame_noblock(s->conn, &frame, &tv);
	if (rc == AMQP_STATUS_TIMEOUT)
		return 1;
	if (rc != AMQP_STATUS_OK)
		rmq_fail(s, "rabbitmq: connection to %s lost: %s", s->url, amqp_error_string2(rc));
	else
		rmq_fail(s, "rabbitmq: connection to %s closed by the broker (frame type %d, method 0x%08X)",
				 s->url, frame.frame_type,
				 frame.frame_type == AMQP_FRAME_METHOD ? frame.payload.method.id : 0);
	return 0;
}

static int
parse_bool_setting(const char *v, int *out)
{
	if (strcasecmp(v, "true") == 0 || strcasecmp(v, "on") == 0 ||
		strcasecmp(v, "yes") == 0 || strcmp(v, "1") == 0)
		*out = 1;
	else if (strcasecmp(v, "false") == 0 || strcasecmp(v, "off") == 0 ||
			 strcasecmp(v, "no") == 0 || strcmp(v, "0") == 0)
		*out = 0;
	else
		return 0;
	return 1;
}

/* Checks a routing key template: only {topic}, {key} and {type}. */
static int
valid_template(const char *t)
{
	const char *p;

	for (p = strchr(t, '{'); p != NULL; p = strchr(p + 1, '{'))
		if (sink_placeholder(p) == 0)
			return 0;
	return 1;
}

/*
 * Whether each "%" of url starts "%XX" with two hexadecimal digits, not
 * "%00": amqp_parse_url decodes "%00" (and "%+0", "% 0") to a NUL that
 * silently cuts the user, password or virtual host short.
 */
static int
valid_percent_encoding(const char *url)
{
	const char *p;

	for (p = strchr(url, '%'); p != NULL; p = strchr(p + 1, '%'))
		if (!isxdigit((unsigned char) p[1]) || !isxdigit((unsigned char) p[2]) ||
			(p[1] == '0' && p[2] == '0'))
			return 0;
	return 1;
}

/*
 * Whether the host amqp_parse_url found is one the URL (parsed in place in
 * copy, len bytes) names: without one, it leaves its default, localhost.
 */
static int
host_in_url(const char *host, const char *copy, size_t len)
{
	return (uintptr_t) host >= (uintptr_t) copy && (uintptr_t) host < (uintptr_t) (copy + len) &&
		host[0] != '\0';
}

static Sink *
rabbitmq_init(const SinkSettings *ss, char *err, size_t errlen)
{
	const char *url = sink_setting(ss, "url");
	const char *exchange = sink_setting(ss, "exchange");
	const char *rkey = sink_setting(ss, "routing_key");
	const char *mandatory = sink_setting(ss, "mandatory");
	const char *maxsize = sink_setting(ss, "max_message_size");
	long		max_message_size = RMQ_DEFAULT_MAX_MESSAGE_SIZE;
	RabbitSink *s;
	char		shown[512];
	char		shown_url[1024];
	const char *why = NULL;
	int			bad;
	int			m = 1;

	if (url == NULL || *url == '\0')
		url = "amqp://guest:guest@localhost:5672";
	url_for_message(url, shown_url, sizeof(shown_url));
	if (mandatory != NULL && !parse_bool_setting(mandatory, &m))
	{
		snprintf(err, errlen, "rabbitmq.mandatory must be true or false, not \"%s\"", mandatory);
		return NULL;
	}
	if (maxsize != NULL)
	{
		char	   *end;

		errno = 0;
		max_message_size = strtol(maxsize, &end, 10);
		if (errno != 0 || end == maxsize || *end != '\0' || max_message_size < 1 ||
			max_message_size > RMQ_MAX_MESSAGE_SIZE)
		{
			snprintf(err, errlen, "rabbitmq.max_message_size must be a number of bytes from 1 to %ld, not \"%s\"",
					 RMQ_MAX_MESSAGE_SIZE, maxsize);
			return NULL;
		}
	}
	if (rkey == NULL)
		rkey = "{topic}";
	if (!valid_template(rkey))
	{
		snprintf(err, errlen, "rabbitmq.routing_key \"%s\": only {topic}, {key} and {type} may be "
				 "written in braces", rkey);
		return NULL;
	}
	if (exchange != NULL && strlen(exchange) > RMQ_SHORTSTR_MAX)
	{
		snprintf(err, errlen, "rabbitmq.exchange is %zu bytes long; AMQP allows at most %d",
				 strlen(exchange), RMQ_SHORTSTR_MAX);
		return NULL;
	}
	/* every message's routing key would be too long: each would die */
	if (sink_template_text_len(rkey) > RMQ_SHORTSTR_MAX)
	{
		snprintf(err, errlen, "rabbitmq.routing_key is %zu bytes long without its placeholders; "
				 "AMQP allows at most %d", sink_template_text_len(rkey), RMQ_SHORTSTR_MAX);
		return NULL;
	}
	if (!valid_percent_encoding(url))
	{
		snprintf(err, errlen, "rabbitmq.url \"%s\" is not valid: each \"%%\" must be followed by two "
				 "hexadecimal digits, other than 00", shown_url);
		return NULL;
	}
	s = xmalloc(sizeof(RabbitSink));
	memset(s, 0, sizeof(RabbitSink));
	s->base.type = &sink_rabbitmq_type;
	s->url_copy = xstrdup(url);
	amqp_default_connection_info(&s->info);
	bad = amqp_parse_url(s->url_copy, &s->info) != AMQP_STATUS_OK || s->info.ssl;

	/*
	 * What amqp_parse_url takes but no broker can be reached at: port 0, and
	 * no host, which it makes localhost (a host left out of a URL built from
	 * an unset variable would go to whatever broker runs there).  An empty
	 * virtual host ("amqp://host/") is one RabbitMQ cannot grant access to:
	 * every login would be refused.
	 */
	if (!bad && s->info.port == 0)
		why = "the port must be from 1 to 65535";
	else if (!bad && !host_in_url(s->info.host, s->url_copy, strlen(url)))
		why = "it names no host";
	else if (!bad && s->info.vhost[0] == '\0')
		why = "the virtual host is empty (for the virtual host \"/\", leave out the path or write %2f)";
	if (bad || why != NULL)
	{
		if (bad)
			snprintf(err, errlen, "rabbitmq.url \"%s\" is not amqp://[USER[:PASSWORD]@]HOST[:PORT][/VHOST]",
					 shown_url);
		else
			snprintf(err, errlen, "rabbitmq.url \"%s\" is not valid: %s", shown_url, why);
		free(s->url_copy);
		free(s);
		return NULL;
	}
	/* the URL for messages: no password */
	snprintf(shown, sizeof(shown), "amqp://%s@%s:%d%s%s (virtual host \"%s\")",
			 s->info.user, s->info.host, s->info.port,
			 strcmp(s->info.vhost, "/") == 0 ? "" : "/",
			 strcmp(s->info.vhost, "/") == 0 ? "" : s->info.vhost, s->info.vhost);
	s->url = xstrdup(shown);
	s->exchange = xstrdup(exchange ? exchange : "");
	s->routing_key = xstrdup(rkey);
	s->mandatory = m;
	s->max_message_size = max_message_size;
	s->timeout_ms = ss->timeout_ms;
	/* checked by the relay already */
	s->reconnect_max_ms = config_get(ss->cfg, "reconnect_max") ?
		parse_duration_ms(config_get(ss->cfg, "reconnect_max")) : 30000;
	return &s->base;
}

/* Publishes one message; an AMQP status. */
static int
publish_one(RabbitSink *s, const RelayMessage *m, StrBuf *rk)
{
	amqp_basic_properties_t props;
	amqp_table_entry_t entries[4];
	int			n = 0;

	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes("application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.message_id = amqp_cstring_bytes(m->id);
	props.app_id = amqp_cstring_bytes("idem-relay");
	if (m->type)
	{
		props._flags |= AMQP_BASIC_TYPE_FLAG;
		props.type = amqp_cstring_bytes(m->type);
	}
	entries[n].key = amqp_cstring_bytes("x-idem-topic");
	entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
	entries[n++].value.value.bytes = amqp_cstring_bytes(m->topic);
	entries[n].key = amqp_cstring_bytes("x-idem-key");
	entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
	entries[n++].value.value.bytes = amqp_cstring_bytes(m->key);
	entries[n].key = amqp_cstring_bytes("x-idem-attempt");
	entries[n].value.kind = AMQP_FIELD_KIND_I32;
	entries[n++].value.value.i32 = m->attempt;
	if (m->headers)
	{
		entries[n].key = amqp_cstring_bytes("x-idem-headers");
		entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
		entries[n++].value.value.bytes = amqp_cstring_bytes(m->headers);
	}
	props.headers.num_entries = n;
	props.headers.entries = entries;
	sink_expand(rk, s->routing_key, m);
	/* AMQP's short strings: the message, not the connection, is at fault */
	if (rk->len > RMQ_SHORTSTR_MAX)
		return RMQ_KEY_TOO_LONG;
	/* 255 bytes in the database's encoding can be more in UTF-8 */
	if (m->type && strlen(m->type) > RMQ_SHORTSTR_MAX)
		return RMQ_TYPE_TOO_LONG;
	if ((long) strlen(m->payload) > s->max_message_size)
		return RMQ_BODY_TOO_LARGE;

	/*
	 * The properties go in one frame, which librabbitmq cannot encode past
	 * the frame size: it fails and the connection is dropped.
	 */
	if (strlen(m->id) + strlen(m->topic) + strlen(m->key) +
		(m->type ? strlen(m->type) : 0) + (m->headers ? strlen(m->headers) : 0) +
		RMQ_PROPERTIES_SLACK > (size_t) amqp_get_frame_max(s->conn))
		return RMQ_HEADERS_TOO_LARGE;
	return amqp_basic_publish(s->conn, RMQ_CHANNEL, amqp_cstring_bytes(s->exchange),
							  amqp_cstring_bytes(rk->data), s->mandatory, 0, &props,
							  amqp_cstring_bytes(m->payload));
}

/* Every message still pending: retried, with error. */
static void
retry_pending(int n, const uint64_t *tags, Outcome *out, const char *error, long retry_after_ms)
{
	int			i;

	for (i = 0; i < n; i++)
		if (tags[i] != 0 && out[i].kind == OUTCOME_UNSENT)
		{
			out[i].kind = OUTCOME_RETRY;
			out[i].retry_after_ms = retry_after_ms;
			snprintf(out[i].error, sizeof(out[i].error), "%s", error);
		}
}

/* The confirmation of tag (or of every tag up to it): outcomes set. */
static void
confirm(int n, const uint64_t *tags, const int *returned, Outcome *out,
		uint64_t tag, int multiple, int ack)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		if (tags[i] == 0 || out[i].kind != OUTCOME_UNSENT)
			continue;
		if (tags[i] == tag || (multiple && tags[i] < tag))
		{
			out[i].retry_after_ms = -1;
			if (!ack)
			{
				out[i].kind = OUTCOME_RETRY;
				snprintf(out[i].error, sizeof(out[i].error),
						 "rabbitmq: the broker refused the message (basic.nack)");
			}
			else if (returned[i])
			{
				out[i].kind = OUTCOME_RETRY;
				snprintf(out[i].error, sizeof(out[i].error),
						 "rabbitmq: unroutable: no queue is bound to the routing key "
						 "(basic.return)");
			}
			else
				out[i].kind = OUTCOME_DELIVERED;
		}
	}
}

/*
 * Reads the broker's frames until every message published is confirmed, the
 * time runs out, the connection fails or a second signal stops the relay.
 */
static void
await_confirms(RabbitSink *s, const RelayMessage *msgs, int n, const uint64_t *tags,
			   Outcome *out, int npending, const PublishControl *ctl)
{
	int		   *returned = xmalloc(sizeof(int) * (size_t) (n > 0 ? n : 1));
	int64_t		until = now_ms() + s->timeout_ms;
	int			i;

	memset(returned, 0, sizeof(int) * (size_t) (n > 0 ? n : 1));
	while (npending > 0)
	{
		amqp_frame_t frame;
		struct timeval tv;
		int64_t		left = until - now_ms();
		int			rc;
		int			before;

		if (*ctl->stop_now)
		{
			retry_pending(n, tags, out, "rabbitmq: interrupted by shutdown", 0);
			rmq_fail(s, "rabbitmq: interrupted by shutdown while awaiting confirmations");
			break;
		}
		if (left <= 0)
		{
			char		e[OUTCOME_ERROR_LEN];

			snprintf(e, sizeof(e), "rabbitmq: no confirmation from the broker within %ld ms",
					 s->timeout_ms);
			retry_pending(n, tags, out, e, -1);
			rmq_fail(s, "%s", e);
			break;
		}
		if (left > 200)
			left = 200;
		tv.tv_sec = 0;
		tv.tv_usec = (long) left * 1000;
		rc = amqp_simple_wait_frame_noblock(s->conn, &frame, &tv);
		if (rc == AMQP_STATUS_TIMEOUT)
			continue;
		if (rc != AMQP_STATUS_OK)
		{
			char		e[OUTCOME_ERROR_LEN];

			snprintf(e, sizeof(e), "rabbitmq: connection to %s lost: %s", s->url,
					 amqp_error_string2(rc));
			retry_pending(n, tags, out, e, -1);
			rmq_fail(s, "%s", e);
			break;
		}
		if (frame.frame_type != AMQP_FRAME_METHOD)
			continue;
		before = 0;
		for (i = 0; i < n; i++)
			if (tags[i] != 0 && out[i].kind == OUTCOME_UNSENT)
				before++;
		switch (frame.payload.method.id)
		{
			case AMQP_BASIC_ACK_METHOD:
				{
					amqp_basic_ack_t *a = frame.payload.method.decoded;

					confirm(n, tags, returned, out, a->delivery_tag, a->multiple, 1);
					s->failures = 0;
					break;
				}
			case AMQP_BASIC_NACK_METHOD:
				{
					amqp_basic_nack_t *a = frame.payload.method.decoded;

					confirm(n, tags, returned, out, a->delivery_tag, a->multiple, 0);
					break;
				}
			case AMQP_BASIC_RETURN_METHOD:
				{
					amqp_message_t message;
					amqp_rpc_reply_t r;

					/*
					 * The message follows; its basic.ack comes after it.
					 * librabbitmq reads it without a time limit: the timer
					 * ends a broker that stops in the middle of it, as it
					 * ends a send.
					 */
					watch_start(amqp_get_sockfd(s->conn), until, ctl->stop_now);
					r = amqp_read_message(s->conn, frame.channel, &message, 0);
					watch_end();
					if (r.reply_type != AMQP_RESPONSE_NORMAL)
					{
						char		e[OUTCOME_ERROR_LEN];
						char		t[300];

						reply_text(r, t, sizeof(t));
						if (watch_fired && *ctl->stop_now)
							snprintf(e, sizeof(e), "rabbitmq: interrupted by shutdown");
						else if (watch_fired)
							snprintf(e, sizeof(e), "rabbitmq: no confirmation from the broker within %ld ms",
									 s->timeout_ms);
						else
							snprintf(e, sizeof(e), "rabbitmq: connection to %s lost: %s", s->url, t);
						retry_pending(n, tags, out, e, -1);
						rmq_fail(s, "%s", e);
						goto done;
					}
					if (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
						for (i = 0; i < n; i++)
							if (tags[i] != 0 && strlen(msgs[i].id) == message.properties.message_id.len &&
								memcmp(msgs[i].id, message.properties.message_id.bytes,
									   message.properties.message_id.len) == 0)
								returned[i] = 1;
					amqp_destroy_message(&message);
					break;
				}
			case AMQP_CHANNEL_CLOSE_METHOD:
			case AMQP_CONNECTION_CLOSE_METHOD:
				{
					/* both start with reply_code and reply_text */
					amqp_channel_close_t *c = frame.payload.method.decoded;
					char		e[OUTCOME_ERROR_LEN];

					snprintf(e, sizeof(e), "rabbitmq: %s closed by the broker: %d %.*s",
							 frame.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ?
							 "channel" : "connection", c->reply_code,
							 (int) c->reply_text.len, (char *) c->reply_text.bytes);
					retry_pending(n, tags, out, e, -1);
					rmq_fail(s, "%s", e);
					goto done;
				}
			default:
				break;
		}
		for (i = 0; i < n; i++)
			if (tags[i] != 0 && out[i].kind == OUTCOME_UNSENT)
				before--;
		npending -= before;
		amqp_maybe_release_buffers(s->conn);
	}
done:
	free(returned);
}

static int
rabbitmq_publish(Sink *sink, const RelayMessage *msgs, int n, Outcome *out,
				 const PublishControl *ctl)
{
	RabbitSink *s = (RabbitSink *) sink;
	uint64_t   *tags = xmalloc(sizeof(uint64_t) * (size_t) n);
	StrBuf		rk;
	int			npending = 0;
	int			i;

	memset(tags, 0, sizeof(uint64_t) * (size_t) n);
	for (i = 0; i < n; i++)
	{
		out[i].kind = OUTCOME_UNSENT;
		out[i].retry_after_ms = -1;
	}
	if (s->conn != NULL)
		rmq_alive(s);
	if (s->conn == NULL)
	{
		int64_t		now = now_ms();

		if (now < s->next_connect_ms || !rmq_connect(s))
		{
			/* not now: every message waits until the next attempt */
			for (i = 0; i < n; i++)
			{
				out[i].kind = OUTCOME_RETRY;
				out[i].retry_after_ms = s->next_connect_ms > now ? s->next_connect_ms - now : 0;
				snprintf(out[i].error, sizeof(out[i].error), "%s", s->last_error);
			}
			free(tags);
			return 0;
		}
	}

	sb_init(&rk);
	for (i = 0; i < n; i++)
	{
		int			rc;

		if (*ctl->stop_now || now_ms() >= ctl->deadline_ms)
			break;
		watch_start(amqp_get_sockfd(s->conn), now_ms() + s->timeout_ms, ctl->stop_now);
		rc = publish_one(s, &msgs[i], &rk);
		watch_end();
		if (rc == RMQ_KEY_TOO_LONG || rc == RMQ_BODY_TOO_LARGE || rc == RMQ_HEADERS_TOO_LARGE ||
			rc == RMQ_TYPE_TOO_LONG)
		{
			/* nothing was sent: refused for good, the batch goes on */
			tags[i] = 0;
			out[i].kind = OUTCOME_PERMANENT;
			if (rc == RMQ_KEY_TOO_LONG)
				snprintf(out[i].error, sizeof(out[i].error),
						 "rabbitmq: the routing key is %zu bytes long; AMQP allows at most %d",
						 rk.len, RMQ_SHORTSTR_MAX);
			else if (rc == RMQ_TYPE_TOO_LONG)
				snprintf(out[i].error, sizeof(out[i].error),
						 "rabbitmq: the type is %zu bytes long in UTF-8; AMQP's type property holds at most %d",
						 strlen(msgs[i].type), RMQ_SHORTSTR_MAX);
			else if (rc == RMQ_BODY_TOO_LARGE)
				snprintf(out[i].error, sizeof(out[i].error),
						 "rabbitmq: the payload is %zu bytes long; rabbitmq.max_message_size is %ld",
						 strlen(msgs[i].payload), s->max_message_size);
			else
				snprintf(out[i].error, sizeof(out[i].error),
						 "rabbitmq: the message's properties (its headers) do not fit in an AMQP frame of %d bytes",
						 amqp_get_frame_max(s->conn));
			continue;
		}
		if (rc != AMQP_STATUS_OK)
		{
			char		e[OUTCOME_ERROR_LEN];

			/* this one may or may not have left: retried, as the others */
			tags[i] = s->next_tag++;
			if (watch_fired && *ctl->stop_now)
				snprintf(e, sizeof(e), "rabbitmq: interrupted by shutdown while publishing to %s", s->url);
			else if (watch_fired)
				snprintf(e, sizeof(e), "rabbitmq: %s took no message within %ld ms (a resource alarm?)",
						 s->url, s->timeout_ms);
			else
				snprintf(e, sizeof(e), "rabbitmq: could not publish to %s: %s", s->url,
						 amqp_error_string2(rc));
			retry_pending(n, tags, out, e, -1);
			rmq_fail(s, "%s", e);
			npending = 0;
			break;
		}
		tags[i] = s->next_tag++;
		npending++;
	}
	sb_free(&rk);
	if (npending > 0)
		await_confirms(s, msgs, n, tags, out, npending, ctl);
	free(tags);
	/* the rest stay UNSENT: the relay releases them */
	return 0;
}

/* Checks the idle connection, or connects when the backoff allows. */
static int
rabbitmq_ready(Sink *sink, volatile sig_atomic_t *stop_now, long *retry_ms)
{
	RabbitSink *s = (RabbitSink *) sink;
	int64_t		now;

	if (s->conn != NULL && rmq_alive(s))
		return 1;
	if (now_ms() >= s->next_connect_ms && rmq_connect(s))
		return 1;
	now = now_ms();
	*retry_ms = s->next_connect_ms > now ? (long) (s->next_connect_ms - now) : 0;
	return 0;
}

static void
rabbitmq_close(Sink *sink)
{
	RabbitSink *s = (RabbitSink *) sink;

	if (s->conn != NULL)
	{
		amqp_channel_close(s->conn, RMQ_CHANNEL, AMQP_REPLY_SUCCESS);
		amqp_connection_close(s->conn, AMQP_REPLY_SUCCESS);
		rmq_drop(s);
	}
	free(s->url);
	free(s->url_copy);
	free(s->exchange);
	free(s->routing_key);
	free(s);
}

const SinkType sink_rabbitmq_type = {
	.name = "rabbitmq",
	.settings = rabbitmq_settings,
	.global_init = NULL,
	.global_cleanup = NULL,
	.init = rabbitmq_init,
	.publish = rabbitmq_publish,
	.close = rabbitmq_close,
	.ready = rabbitmq_ready,
};
