/*
 * idem-relay: delivers idem's transactional outbox to sinks.
 *
 * The relay leases batches of messages with idem_outbox_lease, hands each
 * batch to the sinks its topics are routed to, acknowledges what a sink
 * confirmed with idem_outbox_ack and reports every other outcome with
 * idem_outbox_nack.  This header is the interface between the relay
 * (main.c), its configuration (config.c), the sink registry (sink.c) and the
 * sinks themselves (sink_*.c).
 */
#ifndef IDEM_RELAY_H
#define IDEM_RELAY_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#ifndef RELAY_VERSION
#define RELAY_VERSION "unknown"
#endif

#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))

/* Exit codes, documented in --help and the README. */
#define EXIT_RELAY_OK			0	/* stopped by SIGTERM or SIGINT, or --once */
#define EXIT_RELAY_USAGE		1	/* bad flag or configuration */
#define EXIT_RELAY_CONNECT		2	/* --exit-on-error: cannot reach the database */
#define EXIT_RELAY_QUERY		3	/* --exit-on-error: a statement failed */
#define EXIT_RELAY_SINK			4	/* a sink cannot start or go on */

/* the longest name idem_outbox_lease takes */
#define RELAY_MAX_NAME_LEN		255

/* The longest wait idem_outbox_nack accepts: one day. */
#define RELAY_MAX_RETRY_AFTER_MS (24L * 3600 * 1000)

/* ---- Small helpers (util.c) ---- */

typedef struct StrBuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
} StrBuf;

extern void sb_init(StrBuf *sb);
extern void sb_reset(StrBuf *sb);
extern void sb_free(StrBuf *sb);
extern void sb_putn(StrBuf *sb, const char *s, size_t n);
extern void sb_puts(StrBuf *sb, const char *s);
extern void sb_putc(StrBuf *sb, char c);
extern void sb_printf(StrBuf *sb, const char *fmt,...) PRINTF_LIKE(2, 3);
/* a JSON string, quoted, or null */
extern void sb_json_string(StrBuf *sb, const char *s);

extern void *xmalloc(size_t n);
extern void *xrealloc(void *p, size_t n);
extern char *xstrdup(const char *s);

/* milliseconds of a monotonic clock */
extern int64_t now_ms(void);

/* "30", "30s", "1.5", "500ms", "2min": milliseconds, or -1 */
extern long parse_duration_ms(const char *s);

/* s made one line, in place: line breaks and the indents after them as a space */
extern void one_line(char *s);
/* url for a message: the password of its user information, if any, as "xxxxx" */
extern const char *url_for_message(const char *url, char *buf, size_t size);
/* a copy of s cut to at most max bytes, control and non-ASCII bytes as '?' */
extern void printable_copy(char *dst, size_t dstsize, const char *s, size_t len);

/*
 * idem's key_hash of a (topic, key) given as the server's bytes
 * (outbox_key_hash in idem's outbox.c): nacks are sent in its order, the
 * order in which an ack locks key rows
 */
extern int64_t relay_key_hash(const unsigned char *topic, size_t topic_len,
							  const unsigned char *key, size_t key_len);

/* whether the NUL-terminated s is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) */
extern int	valid_utf8(const char *s);

typedef enum LogLevel
{
	LOG_DEBUG,
	LOG_INFO,
	LOG_WARNING,
	LOG_ERROR
} LogLevel;

extern int	log_verbose;
extern void relay_log(LogLevel level, const char *fmt,...) PRINTF_LIKE(2, 3);

/* ---- Configuration (config.c) ---- */

/*
 * Settings are key = value pairs, from the configuration file and then from
 * the command line (which wins).  Keys:
 *
 *	dbname, name, batch, per_key, max_bytes, lease, poll, linger, timeout, log_interval,
 *	exit_on_error, connect_attempts, reconnect_max, once, verbose, sink,
 *	<sink>.<setting>				a setting of a sink, for every topic
 *	topic.<topic>.sink				the sink of one topic
 *	topic.<topic>.<sink>.<setting>	a setting of a sink, for one topic
 *
 * A topic with a dot is written in double quotes: topic."orders.v1".sink.
 */
typedef struct ConfigItem
{
	char	   *key;
	char	   *value;
	char	   *origin;			/* "FILE:LINE" or "command line" */
} ConfigItem;

typedef struct Config
{
	ConfigItem *items;
	int			nitems;
	int			cap;
} Config;

extern void config_set(Config *cfg, const char *key, const char *value,
					   const char *origin);
extern void config_free(Config *cfg);
/* the "=" that ends the key of "key=value" (a quoted topic may hold "="), or NULL */
extern char *config_key_end(const char *s);
/* reads FILE; false with a message in err */
extern int	config_read_file(Config *cfg, const char *path, char *err, size_t errlen);
/* the last value of key, or NULL */
extern const char *config_get(const Config *cfg, const char *key);
/* the origin of the last value of key, for error messages */
extern const char *config_origin(const Config *cfg, const char *key);

/*
 * Splits a key "topic.<topic>.<rest>": the topic (unquoted) into topic and a
 * pointer to rest; false if the key does not name a topic or is malformed.
 */
extern int	config_split_topic(const char *key, char *topic, size_t topicsize,
							   const char **rest);

/* ---- Sinks (sink.c, sink_*.c) ---- */

/* A leased message.  The strings belong to the relay and live until the
 * batch is acknowledged; type and headers may be NULL. */
typedef struct RelayMessage
{
	const char *id;				/* UUID, the message id */
	const char *topic;
	const char *key;
	const char *type;
	const char *payload;		/* JSON text (an object or an array) */
	const char *headers;		/* JSON text (an object), or NULL */
	const char *created_at;		/* timestamptz, ISO 8601 */
	int			attempt;		/* 1 on the first lease */
	int64_t		key_hash;		/* idem's key_hash of (topic, key) */
} RelayMessage;

typedef enum OutcomeKind
{
	OUTCOME_DELIVERED,			/* the sink confirmed: acknowledge */
	OUTCOME_RETRY,				/* a transient failure: nack, retry later */
	OUTCOME_PERMANENT,			/* refused for good: nack as dead */
	OUTCOME_UNSENT,				/* not tried (shutdown, lease running out) */
	OUTCOME_SKIPPED				/* not tried: an earlier message of its key in
								 * the batch was not delivered, and its nack
								 * released this one */
} OutcomeKind;

#define OUTCOME_ERROR_LEN 512

typedef struct Outcome
{
	OutcomeKind kind;
	long		retry_after_ms; /* RETRY: -1 for the topic's backoff */
	char		error[OUTCOME_ERROR_LEN];	/* RETRY, PERMANENT: why */
} Outcome;

/*
 * What the relay gives a publish call: no message may be started once
 * now_ms() >= deadline_ms (the lease would run out before the sink's timeout
 * ends a publish), and every message should be given up (OUTCOME_UNSENT, or
 * RETRY when aborted half-way) as soon as *stop_now is set.
 */
typedef struct PublishControl
{
	int64_t		deadline_ms;
	volatile sig_atomic_t *stop_now;
} PublishControl;

/* The settings of one sink instance: those of its topic first, then those
 * for every topic. */
typedef struct SinkSettings
{
	const Config *cfg;
	const char *sink;			/* the sink's name, such as "webhook" */
	const char *topic;			/* NULL for the default instance */
	long		timeout_ms;		/* the longest a publish of one message may take */
	int		   *cannot_start;	/* init sets it to 1: the sink failed, not its
								 * settings (exit code 4, not 1) */
} SinkSettings;

/* A setting NAME of the sink ("url" for webhook.url), or NULL */
extern const char *sink_setting(const SinkSettings *ss, const char *name);

/* " (KEY: ORIGIN; ...)" of the settings in force that msg names, or "" */
extern void sink_setting_origins(const SinkSettings *ss, const char *msg,
								 char *buf, size_t len);

/* Calls fn for each setting "<prefix><suffix>" in force (suffix given), in
 * the order written, those of every topic first; a suffix set for the topic
 * hides the one for every topic. */
extern void sink_setting_each(const SinkSettings *ss, const char *prefix,
							  void (*fn) (void *arg, const char *suffix, const char *value),
							  void *arg);

typedef struct Sink Sink;

typedef struct SinkType
{
	const char *name;

	/*
	 * The settings the sink accepts (after "<name>."); a name ending in '.'
	 * is a prefix ("header." accepts "header.Authorization").
	 */
	const char *const *settings;

	/* Once at start and at exit, before any instance and after all (may be
	 * NULL): the sink's library.  false with a message in err. */
	int			(*global_init) (char *err, size_t errlen);
	void		(*global_cleanup) (void);

	/* A new instance, or NULL with a message in err (a configuration error). */
	Sink	   *(*init) (const SinkSettings *ss, char *err, size_t errlen);

	/*
	 * Publishes msgs[0..n-1] in this order, setting out[i] for each.  A
	 * message of a key is never given before the previous one of that key
	 * was confirmed (a call holds one message per key: the messages of a
	 * key's run are given one call after the other).  Returns 0, or -1
	 * when the sink cannot go on (the relay then stops with exit code 4,
	 * after reporting the outcomes set).
	 */
	int			(*publish) (Sink *sink, const RelayMessage *msgs, int n,
							Outcome *out, const PublishControl *ctl);

	void		(*close) (Sink *sink);

	/*
	 * Whether the sink can publish now (NULL: always): a connection idle
	 * since the last batch is checked, and one that is down is made again
	 * when the sink's backoff allows.  False when the sink is down, with
	 * *retry_ms set to how long until it should be asked again.  The relay
	 * asks every sink before each lease and leases nothing while one is
	 * down, since each lease costs its messages an attempt.
	 */
	int			(*ready) (Sink *sink, volatile sig_atomic_t *stop_now, long *retry_ms);
} SinkType;

/* Every sink instance starts with this. */
struct Sink
{
	const SinkType *type;
};

extern const SinkType sink_stdout_type;
extern const SinkType sink_webhook_type;
extern const SinkType sink_rabbitmq_type;
extern const SinkType sink_kafka_type;
extern const SinkType sink_nats_type;

/* the sink named name, or NULL */
extern const SinkType *sink_type_find(const char *name);
/* "stdout, webhook, nats" */
extern const char *sink_type_names(void);
/* whether "<sink>.<setting>" is a setting some sink accepts */
extern int	sink_setting_known(const char *key);

/* The length of the placeholder ({topic}, {key} or {type}) p starts with, or 0 */
extern size_t sink_placeholder(const char *p);
/* The bytes of tmpl besides its placeholders: the least it expands to */
extern size_t sink_template_text_len(const char *tmpl);
/* tmpl with each placeholder replaced by the message's topic, key or type
 * (empty when it has none), into sb */
extern void sink_expand(StrBuf *sb, const char *tmpl, const RelayMessage *m);

/* global init / cleanup of the sinks' libraries */
extern int	sink_global_init(char *err, size_t errlen);
extern void sink_global_cleanup(void);

#endif							/* IDEM_RELAY_H */
