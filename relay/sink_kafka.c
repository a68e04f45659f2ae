/*
 * idem-relay: the kafka sink.  Each message is produced (librdkafka) by an
 * idempotent producer (enable.idempotence=true, which implies acks=all and
 * keeps the order of each partition across retries):
 *
 *	topic		the setting topic, where {topic}, {key} and {type} stand for
 *				the message's; "{topic}" by default
 *	key			the outbox key, so that a key's messages share a partition
 *	value		the payload
 *	headers		idem-message-id, idem-type (when the message has one),
 *				idem-attempt, idem-headers (their JSON, when it has some)
 *
 * A batch is produced in its order, and then its delivery reports are
 * awaited, at most the timeout after the last produce: a report without an
 * error is delivered, one with an error (or none in time: what is left is
 * purged) is retried with the topic's backoff.  A message whose topic name
 * Kafka would refuse, that the producer refuses itself, or that the broker
 * refuses as a record (invalid, too large), is refused for good; a produce
 * refused for another reason retries the rest of the batch.
 *
 * Settings: brokers (bootstrap.servers), topic, and property.NAME = value
 * for any librdkafka setting (property.test.mock.num.brokers = 3 runs
 * librdkafka's mock cluster inside the relay, for tests), but those that
 * would weaken the guarantees, and a message.timeout.ms of 0 or above the
 * timeout.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "relay.h"

typedef struct KafkaSink
{
	Sink		base;
	rd_kafka_t *rk;
	rd_kafka_conf_t *conf;		/* a copy, to make the producer again */
	char	   *topic;			/* a template */
	long		timeout_ms;
	int			pending;		/* delivery reports awaited */
} KafkaSink;

/* What a delivery report sets: the outcome of its message. */
typedef struct KafkaPending
{
	KafkaSink  *s;
	Outcome    *out;
} KafkaPending;

static const char *const kafka_settings[] = {"brokers", "topic", "property.", NULL};

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	KafkaPending *p = m->_private;

	if (p == NULL || p->out == NULL)
		return;
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		p->out->kind = OUTCOME_DELIVERED;
	else if (rd_kafka_message_status(m) == RD_KAFKA_MSG_STATUS_NOT_PERSISTED &&
			 (m->err == RD_KAFKA_RESP_ERR_INVALID_RECORD ||
			  m->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
			  m->err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE ||
			  m->err == RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION))
	{
		/* the broker refused the message itself: it would refuse it again */
		p->out->kind = OUTCOME_PERMANENT;
		snprintf(p->out->error, sizeof(p->out->error), "kafka: %s", rd_kafka_err2str(m->err));
	}
	else
	{
		p->out->kind = OUTCOME_RETRY;
		p->out->retry_after_ms = -1;
		snprintf(p->out->error, sizeof(p->out->error), "kafka: %s", rd_kafka_err2str(m->err));
	}
	p->s->pending--;
}

static void
on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	relay_log(level <= 3 ? LOG_ERROR : level <= 4 ? LOG_WARNING : level <= 6 ? LOG_INFO : LOG_DEBUG,
			  "kafka: %s: %s", fac, buf);
}

typedef struct PropArg
{
	rd_kafka_conf_t *conf;
	char	   *err;
	size_t		errlen;
	int			ok;
	const char *acks;			/* the property that set acks last: "acks"
								 * or its alias */
	const char *msg_timeout;	/* likewise for message.timeout.ms */
} PropArg;

static void
set_property(void *argp, const char *name, const char *value)
{
	PropArg    *arg = argp;
	char		e[512];

	if (!arg->ok)
		return;
	if (strcmp(name, "acks") == 0 || strcmp(name, "request.required.acks") == 0)
		arg->acks = name;
	if (strcmp(name, "message.timeout.ms") == 0 || strcmp(name, "delivery.timeout.ms") == 0)
		arg->msg_timeout = name;
	if (rd_kafka_conf_set(arg->conf, name, value, e, sizeof(e)) != RD_KAFKA_CONF_OK)
	{
		snprintf(arg->err, arg->errlen, "kafka.property.%s: %s", name, e);
		arg->ok = 0;
	}
}

/*
 * Whether Kafka takes name as a topic's: 1 to 249 of [A-Za-z0-9._-], not
 * "." or "..".  librdkafka sends any name, and the broker's refusal would
 * be retried until the message died.
 */
static int
valid_topic(const char *name, size_t len)
{
	size_t		i;

	if (len == 0 || len > 249 || (len <= 2 && strspn(name, ".") >= len))
		return 0;
	for (i = 0; i < len; i++)
	{
		char		c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

/*
 * Whether a topic template can give a valid name: its text besides the
 * placeholders is of the characters Kafka allows, and one without
 * placeholders is a valid name itself (a configuration error, not a reason
 * for every message to die).
 */
static int
valid_topic_template(const char *tmpl)
{
	const char *p = tmpl;
	int			placeholders = 0;

	while (*p)
	{
		size_t		n = sink_placeholder(p);

		if (n > 0)
		{
			p += n;
			placeholders++;
		}
		else if (strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", *p) == NULL)
			return 0;
		else
			p++;
	}
	return placeholders > 0 || valid_topic(tmpl, strlen(tmpl));
}

/*
 * What is wrong with a bootstrap.servers list ([PROTO://]HOST[:PORT],
 * comma-separated) as librdkafka reads it, or NULL; the entry at fault in
 * *entry and *len, and how many brokers the list names in *nbrokers.
 * librdkafka reads a port with atoi: 0, an empty port or one that is not a
 * number would be port 0, where it would try to connect for ever, and one
 * past 65535 another port.  A host with more than one colon and no
 * brackets is an IPv6 address without a port; what follows PROTO://HOST
 * after a "/" is left out; a blank inside an entry makes one host of two
 * brokers written without the comma between them.
 */
static const char *
brokers_problem(const char *list, const char **entry, size_t *len, int *nbrokers)
{
	const char *b = list;

	*nbrokers = 0;
	while (*b)
	{
		size_t		n = strcspn(b, ",");
		const char *end = b + n;
		const char *host = b;
		const char *port = NULL;
		const char *p;

		while (host < end && isspace((unsigned char) *host))
			host++;
		while (end > host && isspace((unsigned char) end[-1]))
			end--;
		*entry = host;
		*len = (size_t) (end - host);
		for (p = host; p + 3 <= end; p++)
			if (strncmp(p, "://", 3) == 0)
			{
				host = p + 3;
				p = memchr(host, '/', (size_t) (end - host));
				if (p != NULL)
					end = p;
				break;
			}
		if (host < end)
		{
			for (p = host; p < end; p++)
				if (isspace((unsigned char) *p))
					return "a blank in it (separate brokers with commas)";
			(*nbrokers)++;
			if (*host == '[')
			{
				p = memchr(host, ']', (size_t) (end - host));
				if (p != NULL && p + 1 < end && p[1] == ':')
					port = p + 2;
			}
			else
			{
				const char *colon = memchr(host, ':', (size_t) (end - host));

				if (colon != NULL && memchr(colon + 1, ':', (size_t) (end - colon - 1)) == NULL)
					port = colon + 1;
			}
		}
		if (port != NULL)
		{
			size_t		digits;

			/* atoi skips leading zeros */
			while (port + 1 < end && *port == '0')
				port++;
			digits = strspn(port, "0123456789");
			if (port + digits != end || digits == 0 || digits > 5 ||
				atol(port) < 1 || atol(port) > 65535)
				return "the port must be from 1 to 65535";
		}
		b += n;
		if (*b == ',')
			b++;
	}
	return NULL;
}

static Sink *
kafka_init(const SinkSettings *ss, char *err, size_t errlen)
{
	const char *brokers = sink_setting(ss, "brokers");
	const char *topic = sink_setting(ss, "topic");
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	KafkaSink  *s;
	PropArg		parg;
	char		e[512];
	char		tmo[32];

	if (topic == NULL)
		topic = "{topic}";
	parg.conf = conf;
	parg.err = err;
	parg.errlen = errlen;
	parg.ok = 1;
	parg.acks = "acks";
	parg.msg_timeout = "message.timeout.ms";
	snprintf(tmo, sizeof(tmo), "%ld", ss->timeout_ms);
	set_property(&parg, "enable.idempotence", "true");
	set_property(&parg, "acks", "all");
	/* a report for every message within the timeout */
	set_property(&parg, "message.timeout.ms", tmo);
	if (brokers != NULL)
		set_property(&parg, "bootstrap.servers", brokers);
	sink_setting_each(ss, "property.", set_property, &parg);
	if (parg.ok)
	{
		/* the settings may not weaken the guarantees */
		size_t		len = sizeof(e);

		if (rd_kafka_conf_get(conf, "enable.idempotence", e, &len) == RD_KAFKA_CONF_OK &&
			strcmp(e, "true") != 0)
		{
			snprintf(err, errlen, "kafka.property.enable.idempotence must stay true");
			parg.ok = 0;
		}
		len = sizeof(e);
		if (parg.ok && rd_kafka_conf_get(conf, "acks", e, &len) == RD_KAFKA_CONF_OK &&
			strcmp(e, "all") != 0 && strcmp(e, "-1") != 0)
		{
			snprintf(err, errlen, "kafka.property.%s must stay all", parg.acks);
			parg.ok = 0;
		}
		/* a key's messages share a partition (random ignores the key) */
		len = sizeof(e);
		if (parg.ok &&
			rd_kafka_conf_get(conf, "partitioner", e, &len) == RD_KAFKA_CONF_OK &&
			strcmp(e, "random") == 0)
		{
			snprintf(err, errlen, "kafka.property.partitioner must not be random: a key's messages must share a partition");
			parg.ok = 0;
		}
		/* a message is delivered only by a report that says so */
		len = sizeof(e);
		if (parg.ok &&
			rd_kafka_conf_get(conf, "delivery.report.only.error", e, &len) == RD_KAFKA_CONF_OK &&
			strcmp(e, "false") != 0)
		{
			snprintf(err, errlen, "kafka.property.delivery.report.only.error must stay false");
			parg.ok = 0;
		}

		/*
		 * The reports of a batch are awaited for timeout after its last
		 * produce, and what has none by then is purged and retried: a longer
		 * message.timeout.ms, or 0 (no limit), gives librdkafka no more time,
		 * and leaves every slow delivery to the purge, which ignores the
		 * broker's acknowledgement should it come.  To wait longer, timeout
		 * is the one to raise.
		 */
		len = sizeof(e);
		if (parg.ok &&
			rd_kafka_conf_get(conf, "message.timeout.ms", e, &len) == RD_KAFKA_CONF_OK &&
			(atol(e) < 1 || atol(e) > ss->timeout_ms))
		{
			snprintf(err, errlen, "kafka.property.%s must be from 1 to timeout (%ld ms, %s), not \"%s\": "
					 "the relay waits for a delivery report no longer than timeout, and then purges the message",
					 parg.msg_timeout, ss->timeout_ms, config_origin(ss->cfg, "timeout"), e);
			parg.ok = 0;
		}
	}
	/* a name longer than Kafka allows, whatever the placeholders give */
	if (parg.ok && sink_template_text_len(topic) > 249)
	{
		snprintf(err, errlen, "kafka.topic is %zu bytes long without its placeholders; "
				 "a Kafka topic name has at most 249", sink_template_text_len(topic));
		parg.ok = 0;
	}
	if (parg.ok && !valid_topic_template(topic))
	{
		snprintf(err, errlen, "kafka.topic \"%s\" cannot give a valid Kafka topic name: besides {topic}, {key} "
				 "and {type}, it may hold only a-z, A-Z, 0-9, \".\", \"_\" and \"-\"", topic);
		parg.ok = 0;
	}
	if (parg.ok)
	{
		/*
		 * Without brokers the producer starts all the same, and every
		 * message dies of its attempts: a configuration error, unless the
		 * mock cluster of librdkafka is the broker.  So is a list with a
		 * broker librdkafka would not reach (see brokers_problem).
		 */
		char		mock[32];
		size_t		len = 0;
		size_t		mlen = sizeof(mock);
		char	   *servers = NULL;
		const char *why = NULL;
		const char *entry = NULL;
		size_t		elen = 0;
		int			nbrokers = 0;

		if (rd_kafka_conf_get(conf, "bootstrap.servers", NULL, &len) == RD_KAFKA_CONF_OK && len > 1)
		{
			servers = xmalloc(len);
			if (rd_kafka_conf_get(conf, "bootstrap.servers", servers, &len) != RD_KAFKA_CONF_OK)
				servers[0] = '\0';
		}
		if (servers != NULL)
			why = brokers_problem(servers, &entry, &elen, &nbrokers);
		if (why != NULL)
		{
			snprintf(err, errlen, "kafka.brokers (bootstrap.servers) \"%.200s\" is not valid: "
					 "broker \"%.*s\": %s", servers, elen < 200 ? (int) elen : 200, entry, why);
			parg.ok = 0;
		}
		else if (nbrokers == 0 &&
				 (rd_kafka_conf_get(conf, "test.mock.num.brokers", mock, &mlen) != RD_KAFKA_CONF_OK ||
				  atoi(mock) <= 0))
		{
			if (ss->topic)
				snprintf(err, errlen, "the kafka sink of topic \"%s\" needs brokers: "
						 "set topic.%s.kafka.brokers or kafka.brokers",
						 ss->topic, ss->topic);
			else
				snprintf(err, errlen, "the kafka sink needs brokers: set kafka.brokers");
			parg.ok = 0;
		}
		free(servers);
	}
	if (!parg.ok)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_log_cb(conf, on_log);
	s = xmalloc(sizeof(KafkaSink));
	memset(s, 0, sizeof(KafkaSink));
	s->base.type = &sink_kafka_type;
	s->conf = rd_kafka_conf_dup(conf);
	s->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, e, sizeof(e));
	if (s->rk == NULL)
	{
		snprintf(err, errlen, "could not create a Kafka producer: %s", e);
		rd_kafka_conf_destroy(conf);
		rd_kafka_conf_destroy(s->conf);
		free(s);
		return NULL;
	}
	s->topic = xstrdup(topic);
	s->timeout_ms = ss->timeout_ms;
	return &s->base;
}

static int
kafka_publish(Sink *sink, const RelayMessage *msgs, int n, Outcome *out,
			  const PublishControl *ctl)
{
	KafkaSink  *s = (KafkaSink *) sink;
	KafkaPending *pend = xmalloc(sizeof(KafkaPending) * (size_t) n);
	StrBuf		topic;
	int64_t		until;
	int			i,
				j;

	sb_init(&topic);
	s->pending = 0;
	for (i = 0; i < n; i++)
	{
		out[i].kind = OUTCOME_UNSENT;
		out[i].retry_after_ms = -1;
		pend[i].s = s;
		pend[i].out = NULL;		/* set once produced */
	}
	/* no producer (making one failed since the last lease): nothing starts */
	for (i = 0; i < n && s->rk != NULL; i++)
	{
		const RelayMessage *m = &msgs[i];
		char		attempt[16];
		rd_kafka_headers_t *hdrs;
		rd_kafka_resp_err_t rc;

		if (*ctl->stop_now || now_ms() >= ctl->deadline_ms)
			continue;
		sink_expand(&topic, s->topic, m);
		if (!valid_topic(topic.data, topic.len))
		{
			/* the message (its key or type in the name): refused for good */
			out[i].kind = OUTCOME_PERMANENT;
			snprintf(out[i].error, sizeof(out[i].error),
					 "kafka: \"%.200s\" is not a valid Kafka topic name (1 to 249 of a-z, A-Z, 0-9, \".\", \"_\" and \"-\")",
					 topic.data);
			continue;
		}
		pend[i].out = &out[i];
		snprintf(attempt, sizeof(attempt), "%d", m->attempt);
		hdrs = rd_kafka_headers_new(4);
		rd_kafka_header_add(hdrs, "idem-message-id", -1, m->id, -1);
		if (m->type)
			rd_kafka_header_add(hdrs, "idem-type", -1, m->type, -1);
		rd_kafka_header_add(hdrs, "idem-attempt", -1, attempt, -1);
		if (m->headers)
			rd_kafka_header_add(hdrs, "idem-headers", -1, m->headers, -1);
		for (;;)
		{
			rc = rd_kafka_producev(s->rk,
								   RD_KAFKA_V_TOPIC(topic.data),
								   RD_KAFKA_V_KEY(m->key, strlen(m->key)),
								   RD_KAFKA_V_VALUE((void *) m->payload, strlen(m->payload)),
								   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								   RD_KAFKA_V_HEADERS(hdrs),
								   RD_KAFKA_V_OPAQUE(&pend[i]),
								   RD_KAFKA_V_END);
			/* a full queue empties as reports come: waited for, in the lease */
			if (rc != RD_KAFKA_RESP_ERR__QUEUE_FULL ||
				*ctl->stop_now || now_ms() >= ctl->deadline_ms)
				break;
			rd_kafka_poll(s->rk, 100);
		}
		if (rc != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			/* the headers are the caller's unless the produce succeeded */
			rd_kafka_headers_destroy(hdrs);
			pend[i].out = NULL;
			snprintf(out[i].error, sizeof(out[i].error), "kafka: could not produce: %s",
					 rd_kafka_err2str(rc));
			if (rc == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
				rc == RD_KAFKA_RESP_ERR__INVALID_ARG)
			{
				/* the message itself: refused for good, the batch goes on */
				out[i].kind = OUTCOME_PERMANENT;
				continue;
			}
			if (rc == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
				rc == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION)
			{
				/* its topic, not the others': retried, the batch goes on */
				out[i].kind = OUTCOME_RETRY;
				continue;
			}
			if (rc == RD_KAFKA_RESP_ERR__QUEUE_FULL)
			{
				/* still full at the end of the lease: the rest is released */
				out[i].kind = OUTCOME_UNSENT;
				break;
			}

			/*
			 * The producer (a fatal error, a setting that keeps it from
			 * producing): this one and the rest of the batch are retried
			 * after the topic's backoff, not leased again at once.
			 */
			out[i].kind = OUTCOME_RETRY;
			for (j = i + 1; j < n; j++)
			{
				out[j].kind = OUTCOME_RETRY;
				memcpy(out[j].error, out[i].error, sizeof(out[j].error));
			}
			break;
		}
		s->pending++;
	}
	sb_free(&topic);

	/* the reports, in the order of each partition */
	until = now_ms() + s->timeout_ms;
	while (s->pending > 0)
	{
		if (*ctl->stop_now || now_ms() >= until)
		{
			int64_t		purged_until = now_ms() + 5000;

			/* what is left gets a report with an error: retried */
			rd_kafka_purge(s->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
			while (s->pending > 0 && now_ms() < purged_until)
				rd_kafka_poll(s->rk, 100);
			break;
		}
		rd_kafka_poll(s->rk, 100);
	}
	if (s->pending > 0)
	{
		/*
		 * Reports that did not come even after the purge: those messages
		 * are retried, and the producer, which would report them into pend,
		 * is made again before the next lease (reports are only served by
		 * rd_kafka_poll: none comes once it is destroyed).
		 */
		for (i = 0; i < n; i++)
			if (pend[i].out != NULL && out[i].kind == OUTCOME_UNSENT)
			{
				out[i].kind = OUTCOME_RETRY;
				snprintf(out[i].error, sizeof(out[i].error),
						 "kafka: no delivery report within the timeout, nor after a purge");
			}
		relay_log(LOG_WARNING, "sink kafka: %d delivery reports did not come: making a new producer",
				  s->pending);
		rd_kafka_destroy(s->rk);
		s->rk = NULL;
	}
	free(pend);
	return 0;
}

/*
 * A producer that had a fatal error (its idempotence can no longer be kept,
 * say) refuses every message from then on: it is made again before the next
 * lease.  Its messages in flight then were reported failed and retried.
 */
static int
kafka_ready(Sink *sink, volatile sig_atomic_t *stop_now, long *retry_ms)
{
	KafkaSink  *s = (KafkaSink *) sink;
	char		e[512];
	rd_kafka_resp_err_t fatal;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;

	if (s->rk != NULL)
	{
		fatal = rd_kafka_fatal_error(s->rk, e, sizeof(e));
		if (fatal == RD_KAFKA_RESP_ERR_NO_ERROR)
			return 1;
		relay_log(LOG_WARNING, "sink kafka: the producer had a fatal error (%s): making a new one", e);
		/* nothing is pending between batches */
		rd_kafka_destroy(s->rk);
		s->rk = NULL;
	}
	conf = rd_kafka_conf_dup(s->conf);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, e, sizeof(e));
	if (rk == NULL)
	{
		/* the configuration is the caller's unless the producer was made */
		rd_kafka_conf_destroy(conf);
		relay_log(LOG_WARNING, "sink kafka: could not create a producer: %s", e);
		*retry_ms = 1000;
		return 0;
	}
	s->rk = rk;
	return 1;
}

static void
kafka_close(Sink *sink)
{
	KafkaSink  *s = (KafkaSink *) sink;

	/* nothing is pending between batches */
	if (s->rk != NULL)
		rd_kafka_destroy(s->rk);
	rd_kafka_conf_destroy(s->conf);
	free(s->topic);
	free(s);
}

const SinkType sink_kafka_type = {
	.name = "kafka",
	.settings = kafka_settings,
	.global_init = NULL,
	.global_cleanup = NULL,
	.init = kafka_init,
	.publish = kafka_publish,
	.close = kafka_close,
	.ready = kafka_ready,
};
