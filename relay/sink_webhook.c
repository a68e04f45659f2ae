/*
 * idem-relay: the webhook sink.  Each message is an HTTP POST (libcurl) of
 * its payload to a URL, one at a time in the order of the batch, with the
 * headers
 *
 *	Content-Type: application/json
 *	Idempotency-Key: <message id>
 *	X-Idem-Topic, X-Idem-Key, X-Idem-Type: percent-encoded (RFC 3986)
 *	X-Idem-Attempt: <attempt>
 *	X-Idem-Headers: <the message's headers, JSON>, when it has some
 *
 * and those of the settings header.<Name> (not one of the above, nor
 * Content-Length, Host, Expect or Transfer-Encoding).  The final answer
 * decides (an interim 1xx, such as 103 Early Hints, is passed over):
 *
 *	2xx					delivered, once its headers are in, whatever becomes
 *						of its body
 *	408, 425, 429, 5xx	retried, after Retry-After (seconds or an HTTP date)
 *						when the answer has one, else the topic's backoff
 *						(408 Request Timeout and 425 Too Early say to try
 *						again, as 429 does)
 *	other 4xx			refused for good (the message goes dead)
 *	1xx, 3xx			retried (redirections are not followed: the URL is
 *						the configuration's, not the message's)
 *	no answer			retried (connection refused, timeout, ...)
 *
 * A message whose headers make a request head larger than libcurl builds
 * is refused for good.
 *
 * Settings: url (required, http or https), header.<Name> = value.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>

#include "relay.h"

#define BODY_EXCERPT 200

/*
 * libcurl builds a request's head (request line and headers, and a body of
 * less than 64 KiB with them) in a buffer of less than 1 MiB, and fails with
 * CURLE_OUT_OF_MEMORY past it: a message whose headers do not fit would be
 * retried until it died.  HEAD_SLACK is for the request line's method and
 * version, Host, User-Agent, Accept and Content-Length.
 */
#define CURL_MAX_REQUEST_HEAD	(1024 * 1024)
#define CURL_INLINE_BODY		(64 * 1024)
#define HEAD_SLACK				1024

typedef struct WebhookSink
{
	Sink		base;
	CURL	   *curl;
	char	   *url;
	long		timeout_ms;
	struct curl_slist *fixed;	/* Content-Type, Expect, header.* settings */
	char		errbuf[CURL_ERROR_SIZE];
	/* per answer (reset at each status line, 1xx included) */
	long		retry_after_ms;
	int			status;			/* of the status line, or 0 */
	int			final_2xx;		/* the headers of a 2xx answer ended */
	/* per request */
	char		body[BODY_EXCERPT + 1];
	size_t		body_len;
	const PublishControl *ctl;
} WebhookSink;

static const char *const webhook_settings[] = {"url", "header.", NULL};

static int
webhook_global_init(char *err, size_t errlen)
{
	CURLcode	rc = curl_global_init(CURL_GLOBAL_DEFAULT);

	if (rc != CURLE_OK)
	{
		snprintf(err, errlen, "could not initialise libcurl: %s", curl_easy_strerror(rc));
		return 0;
	}
	return 1;
}

static void
webhook_global_cleanup(void)
{
	curl_global_cleanup();
}

/* A header name is an HTTP token. */
static int
valid_header_name(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s; s++)
		if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') ||
			  ('0' <= *s && *s <= '9') || strchr("!#$%&'*+-.^_`|~", *s) != NULL))
			return 0;
	return 1;
}

/*
 * Headers the relay sets itself, or libcurl does: a second copy from the
 * configuration would be sent beside the first (a receiver reading the
 * first Idempotency-Key and another the second), or break the request.
 */
static const char *const reserved_headers[] = {
	"Content-Type", "Idempotency-Key", "Content-Length", "Host", "Expect",
	"Transfer-Encoding", NULL
};

static int
reserved_header(const char *name)
{
	int			i;

	if (strncasecmp(name, "X-Idem-", 7) == 0)
		return 1;
	for (i = 0; reserved_headers[i]; i++)
		if (strcasecmp(name, reserved_headers[i]) == 0)
			return 1;
	return 0;
}

typedef struct HeaderArg
{
	WebhookSink *s;
	char	   *err;
	size_t		errlen;
	int			ok;
} HeaderArg;

static void
add_setting_header(void *argp, const char *name, const char *value)
{
	HeaderArg  *arg = argp;
	StrBuf		sb;
	const unsigned char *p;

	if (!arg->ok)
		return;
	if (!valid_header_name(name))
	{
		snprintf(arg->err, arg->errlen,
				 "webhook.header.%s: not a valid HTTP header name (a token: letters, digits and "
				 "!#$%%&'*+-.^_`|~)", name);
		arg->ok = 0;
		return;
	}

	/*
	 * A line break would end the header and start another of the value's
	 * making; a receiver may refuse any other control character with a 400,
	 * and every message would die of it.  A tab is allowed (RFC 9110
	 * field-value), and a NUL cannot be in a setting.
	 */
	for (p = (const unsigned char *) value; *p; p++)
		if ((*p < 0x20 && *p != '\t') || *p == 0x7f)
			break;
	if (*p != '\0')
	{
		snprintf(arg->err, arg->errlen,
				 "webhook.header.%s: the value holds a control character (byte 0x%02x); "
				 "a header's value may hold tabs, but no other control character", name, *p);
		arg->ok = 0;
		return;
	}
	if (reserved_header(name))
	{
		snprintf(arg->err, arg->errlen,
				 "webhook.header.%s: the relay sets this header itself "
				 "(Content-Type, Content-Length, Host, Expect, Transfer-Encoding, "
				 "Idempotency-Key and X-Idem-*)", name);
		arg->ok = 0;
		return;
	}
	sb_init(&sb);
	/* "Name:" with no value would tell libcurl to remove the header */
	if (value[strspn(value, " \t")] == '\0')
		sb_printf(&sb, "%s;", name);
	else
		sb_printf(&sb, "%s: %s", name, value);
	arg->s->fixed = curl_slist_append(arg->s->fixed, sb.data);
	sb_free(&sb);
}

static size_t
on_header(char *buf, size_t size, size_t nitems, void *userdata)
{
	WebhookSink *s = userdata;
	size_t		len = size * nitems;
	char		line[256];
	char	   *v;
	char	   *end;

	/*
	 * libcurl passes the headers of interim answers (1xx) too: what one of
	 * them said is not the final answer's.
	 */
	if (len >= 5 && strncmp(buf, "HTTP/", 5) == 0)
	{
		const char *sp = memchr(buf, ' ', len);

		s->retry_after_ms = -1;
		s->status = 0;
		s->final_2xx = 0;
		if (sp != NULL && sp + 4 <= buf + len &&
			sp[1] >= '1' && sp[1] <= '5' &&
			sp[2] >= '0' && sp[2] <= '9' && sp[3] >= '0' && sp[3] <= '9')
			s->status = (sp[1] - '0') * 100 + (sp[2] - '0') * 10 + (sp[3] - '0');
		return len;
	}
	/* the end of an answer's headers: a 2xx past it is the final answer */
	if ((len == 2 && buf[0] == '\r' && buf[1] == '\n') || (len == 1 && buf[0] == '\n'))
	{
		if (s->status >= 200 && s->status < 300)
			s->final_2xx = 1;
		return len;
	}
	if (len < 12 || len >= sizeof(line) || strncasecmp(buf, "retry-after:", 12) != 0)
		return len;
	memcpy(line, buf, len);
	line[len] = '\0';
	v = line + 12;
	while (*v == ' ' || *v == '\t')
		v++;
	end = v + strlen(v);
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
		*--end = '\0';
	if (*v == '\0')
		return len;
	if (strspn(v, "0123456789") == strlen(v))
	{
		/* delta-seconds */
		double		secs = strtod(v, NULL);

		s->retry_after_ms = secs * 1000 > RELAY_MAX_RETRY_AFTER_MS ?
			RELAY_MAX_RETRY_AFTER_MS : (long) secs * 1000;
	}
	else
	{
		/* an HTTP date */
		time_t		t = curl_getdate(v, NULL);

		if (t != (time_t) -1)
		{
			double		secs = difftime(t, time(NULL));

			if (secs < 0)
				secs = 0;
			s->retry_after_ms = secs * 1000 > RELAY_MAX_RETRY_AFTER_MS ?
				RELAY_MAX_RETRY_AFTER_MS : (long) secs * 1000;
		}
	}
	return len;
}

/* The first bytes of the answer's body, for the error of a failure. */
static size_t
on_body(char *buf, size_t size, size_t nmemb, void *userdata)
{
	WebhookSink *s = userdata;
	size_t		len = size * nmemb;
	size_t		room = BODY_EXCERPT - s->body_len;

	/*
	 * A 2xx's body says nothing more: it is read only so that the
	 * connection can be used again, and does not have to arrive whole.
	 */
	if (s->final_2xx)
		return len;
	if (room > len)
		room = len;
	memcpy(s->body + s->body_len, buf, room);
	s->body_len += room;
	s->body[s->body_len] = '\0';
	return len;
}

/* A second SIGTERM aborts the request in flight. */
static int
on_progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow,
			curl_off_t ultotal, curl_off_t ulnow)
{
	WebhookSink *s = userdata;

	return *s->ctl->stop_now ? 1 : 0;
}

static Sink *
webhook_init(const SinkSettings *ss, char *err, size_t errlen)
{
	const char *url = sink_setting(ss, "url");
	WebhookSink *s;
	HeaderArg	harg;
	char		shown_url[1024];

	if (url == NULL || *url == '\0')
	{
		if (ss->topic)
			snprintf(err, errlen, "the webhook sink of topic \"%s\" needs a URL: "
					 "set topic.%s.webhook.url or webhook.url (--webhook-url)",
					 ss->topic, ss->topic);
		else
			snprintf(err, errlen, "the webhook sink needs a URL: set webhook.url (--webhook-url)");
		return NULL;
	}
	url_for_message(url, shown_url, sizeof(shown_url));
	if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0)
	{
		snprintf(err, errlen, "webhook.url \"%s\" is not http:// or https://", shown_url);
		return NULL;
	}
	/* a URL libcurl cannot use would fail every message until it is dead */
	{
		CURLU	   *u = curl_url();
		CURLUcode	uc;
		char	   *port = NULL;
		int			port_zero;

		if (u == NULL)
		{
			snprintf(err, errlen, "could not create a libcurl URL handle");
			*ss->cannot_start = 1;
			return NULL;
		}
		uc = curl_url_set(u, CURLUPART_URL, url, 0);
		/* libcurl takes port 0, to which no connection can be made */
		port_zero = uc == CURLUE_OK &&
			curl_url_get(u, CURLUPART_PORT, &port, 0) == CURLUE_OK && atol(port) == 0;
		curl_free(port);
		curl_url_cleanup(u);
		if (uc != CURLUE_OK)
		{
			snprintf(err, errlen, "webhook.url \"%s\" is not valid: %s", shown_url, curl_url_strerror(uc));
			return NULL;
		}
		if (port_zero)
		{
			snprintf(err, errlen, "webhook.url \"%s\" is not valid: the port must be from 1 to 65535", shown_url);
			return NULL;
		}
	}
	s = xmalloc(sizeof(WebhookSink));
	memset(s, 0, sizeof(WebhookSink));
	s->base.type = &sink_webhook_type;
	s->url = xstrdup(url);
	s->timeout_ms = ss->timeout_ms;
	s->fixed = curl_slist_append(NULL, "Content-Type: application/json");
	/* no "100 Continue" round trip */
	s->fixed = curl_slist_append(s->fixed, "Expect:");
	harg.s = s;
	harg.err = err;
	harg.errlen = errlen;
	harg.ok = 1;
	sink_setting_each(ss, "header.", add_setting_header, &harg);
	s->curl = curl_easy_init();
	if (!harg.ok || s->curl == NULL)
	{
		if (harg.ok)
		{
			snprintf(err, errlen, "could not create a libcurl handle");
			*ss->cannot_start = 1;
		}
		curl_slist_free_all(s->fixed);
		if (s->curl)
			curl_easy_cleanup(s->curl);
		free(s->url);
		free(s);
		return NULL;
	}
	curl_easy_setopt(s->curl, CURLOPT_URL, s->url);
	curl_easy_setopt(s->curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(s->curl, CURLOPT_POST, 1L);
	curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, s->timeout_ms);
	curl_easy_setopt(s->curl, CURLOPT_CONNECTTIMEOUT_MS, s->timeout_ms);
	curl_easy_setopt(s->curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(s->curl, CURLOPT_USERAGENT, "idem-relay/" RELAY_VERSION);
	curl_easy_setopt(s->curl, CURLOPT_ERRORBUFFER, s->errbuf);
	/* a proxy's answer to CONNECT is not the receiver's */
	curl_easy_setopt(s->curl, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
	curl_easy_setopt(s->curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(s->curl, CURLOPT_HEADERDATA, s);
	curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(s->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(s->curl, CURLOPT_XFERINFODATA, s);
	curl_easy_setopt(s->curl, CURLOPT_NOPROGRESS, 0L);
	return &s->base;
}

/* "Name: <percent-encoded value>" appended to list */
static struct curl_slist *
add_encoded(struct curl_slist *list, CURL *curl, const char *name, const char *value)
{
	char	   *enc = curl_easy_escape(curl, value, 0);
	StrBuf		sb;

	sb_init(&sb);
	sb_printf(&sb, "%s: %s", name, enc ? enc : "");
	list = curl_slist_append(list, sb.data);
	sb_free(&sb);
	curl_free(enc);
	return list;
}

static void
post_one(WebhookSink *s, const RelayMessage *m, Outcome *out)
{
	struct curl_slist *h = NULL;
	struct curl_slist *f;
	StrBuf		sb;
	CURLcode	rc;
	long		status = 0;
	char		excerpt[BODY_EXCERPT + 1];
	size_t		head = 0;
	long		sent = 0;
	size_t		plen;

	for (f = s->fixed; f; f = f->next)
		h = curl_slist_append(h, f->data);
	sb_init(&sb);
	sb_printf(&sb, "Idempotency-Key: %s", m->id);
	h = curl_slist_append(h, sb.data);
	h = add_encoded(h, s->curl, "X-Idem-Topic", m->topic);
	h = add_encoded(h, s->curl, "X-Idem-Key", m->key);
	if (m->type)
		h = add_encoded(h, s->curl, "X-Idem-Type", m->type);
	sb_reset(&sb);
	sb_printf(&sb, "X-Idem-Attempt: %d", m->attempt);
	h = curl_slist_append(h, sb.data);
	if (m->headers)
	{
		const char *p;

		/*
		 * jsonb's text has no line breaks or other control characters:
		 * they are escaped in strings.  DEL, which JSON leaves as it is, is
		 * not allowed in an HTTP header value: it is escaped too (it can
		 * only be inside a string).
		 */
		sb_reset(&sb);
		sb_puts(&sb, "X-Idem-Headers: ");
		for (p = m->headers; *p; p++)
		{
			if (*p == '\x7f')
				sb_puts(&sb, "\\u007f");
			else
				sb_putc(&sb, *p);
		}
		h = curl_slist_append(h, sb.data);
	}
	sb_free(&sb);

	for (f = h; f; f = f->next)
		head += strlen(f->data) + 2;
	plen = strlen(m->payload);
	if (head + strlen(s->url) + HEAD_SLACK + (plen < CURL_INLINE_BODY ? plen : 0) >= CURL_MAX_REQUEST_HEAD)
	{
		curl_slist_free_all(h);
		out->kind = OUTCOME_PERMANENT;
		out->retry_after_ms = -1;
		snprintf(out->error, sizeof(out->error),
				 "webhook: the request's headers take %zu bytes (X-Idem-Headers: %zu); "
				 "libcurl sends at most %d with the URL and a short body",
				 head, m->headers ? strlen(m->headers) : 0, CURL_MAX_REQUEST_HEAD);
		return;
	}

	s->retry_after_ms = -1;
	s->status = 0;
	s->final_2xx = 0;
	s->body_len = 0;
	s->body[0] = '\0';
	s->errbuf[0] = '\0';
	curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, m->payload);
	curl_easy_setopt(s->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) plen);
	rc = curl_easy_perform(s->curl);
	curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, NULL);
	curl_slist_free_all(h);

	out->retry_after_ms = -1;

	/*
	 * Once the headers of a 2xx answer are in, the message is delivered,
	 * whatever becomes of its body (slow, cut short, longer than its
	 * Content-Length said, or a shutdown while it comes).
	 */
	if (rc != CURLE_OK && s->final_2xx)
	{
		relay_log(LOG_DEBUG, "webhook: HTTP %d, the body not read to its end: %s",
				  s->status, s->errbuf[0] ? s->errbuf : curl_easy_strerror(rc));
		out->kind = OUTCOME_DELIVERED;
		return;
	}
	if (rc != CURLE_OK)
	{
		out->kind = OUTCOME_RETRY;
		if (rc == CURLE_ABORTED_BY_CALLBACK)
		{
			snprintf(out->error, sizeof(out->error), "webhook: interrupted by shutdown");
			out->retry_after_ms = 0;
		}
		else
			snprintf(out->error, sizeof(out->error), "webhook: %s",
					 s->errbuf[0] ? s->errbuf : curl_easy_strerror(rc));

		/*
		 * Out of memory before anything was sent, with large headers: the
		 * request is more than libcurl builds (should its limit be lower
		 * than the one checked above), and would be every time.
		 */
		if (rc == CURLE_OUT_OF_MEMORY && head >= CURL_INLINE_BODY &&
			curl_easy_getinfo(s->curl, CURLINFO_REQUEST_SIZE, &sent) == CURLE_OK && sent == 0)
		{
			out->kind = OUTCOME_PERMANENT;
			snprintf(out->error, sizeof(out->error),
					 "webhook: libcurl could not build a request whose headers take %zu bytes: %s",
					 head, s->errbuf[0] ? s->errbuf : curl_easy_strerror(rc));
		}
		return;
	}
	curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
	printable_copy(excerpt, sizeof(excerpt), s->body, s->body_len);
	if (status >= 200 && status < 300)
		out->kind = OUTCOME_DELIVERED;
	else if (status == 408 || status == 425 || status == 429 || status >= 500)
	{
		out->kind = OUTCOME_RETRY;
		out->retry_after_ms = s->retry_after_ms;
	}
	else if (status >= 400)
		out->kind = OUTCOME_PERMANENT;
	else
		out->kind = OUTCOME_RETRY;
	if (out->kind != OUTCOME_DELIVERED)
		snprintf(out->error, sizeof(out->error), "webhook: HTTP %ld%s%s", status,
				 excerpt[0] ? ": " : "", excerpt);
}

static int
webhook_publish(Sink *sink, const RelayMessage *msgs, int n, Outcome *out,
				const PublishControl *ctl)
{
	WebhookSink *s = (WebhookSink *) sink;
	int			i;

	s->ctl = ctl;
	for (i = 0; i < n; i++)
	{
		if (*ctl->stop_now || now_ms() >= ctl->deadline_ms)
		{
			out[i].kind = OUTCOME_UNSENT;
			continue;
		}
		post_one(s, &msgs[i], &out[i]);
	}
	return 0;
}

static void
webhook_close(Sink *sink)
{
	WebhookSink *s = (WebhookSink *) sink;

	curl_easy_cleanup(s->curl);
	curl_slist_free_all(s->fixed);
	free(s->url);
	free(s);
}

const SinkType sink_webhook_type = {
	.name = "webhook",
	.settings = webhook_settings,
	.global_init = webhook_global_init,
	.global_cleanup = webhook_global_cleanup,
	.init = webhook_init,
	.publish = webhook_publish,
	.close = webhook_close,
};
