/*
 * idem-relay: strings, time, durations and the log.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "relay.h"

int			log_verbose = 0;

void *
xmalloc(size_t n)
{
	void	   *p = malloc(n ? n : 1);

	if (p == NULL)
	{
		fprintf(stderr, "idem-relay: out of memory\n");
		exit(EXIT_RELAY_SINK);
	}
	return p;
}

void *
xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (p == NULL)
	{
		fprintf(stderr, "idem-relay: out of memory\n");
		exit(EXIT_RELAY_SINK);
	}
	return p;
}

char *
xstrdup(const char *s)
{
	size_t		n = strlen(s) + 1;
	char	   *p = xmalloc(n);

	memcpy(p, s, n);
	return p;
}

void
sb_init(StrBuf *sb)
{
	sb->cap = 256;
	sb->data = xmalloc(sb->cap);
	sb->len = 0;
	sb->data[0] = '\0';
}

void
sb_reset(StrBuf *sb)
{
	sb->len = 0;
	sb->data[0] = '\0';
}

void
sb_free(StrBuf *sb)
{
	free(sb->data);
	sb->data = NULL;
	sb->len = sb->cap = 0;
}

static void
sb_reserve(StrBuf *sb, size_t more)
{
	if (sb->len + more + 1 > sb->cap)
	{
		while (sb->len + more + 1 > sb->cap)
			sb->cap *= 2;
		sb->data = xrealloc(sb->data, sb->cap);
	}
}

void
sb_putn(StrBuf *sb, const char *s, size_t n)
{
	sb_reserve(sb, n);
	memcpy(sb->data + sb->len, s, n);
	sb->len += n;
	sb->data[sb->len] = '\0';
}

void
sb_puts(StrBuf *sb, const char *s)
{
	sb_putn(sb, s, strlen(s));
}

void
sb_putc(StrBuf *sb, char c)
{
	sb_putn(sb, &c, 1);
}

void
sb_printf(StrBuf *sb, const char *fmt,...)
{
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vsnprintf(sb->data + sb->len, sb->cap - sb->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t) n >= sb->cap - sb->len)
	{
		sb_reserve(sb, (size_t) n);
		va_start(ap, fmt);
		vsnprintf(sb->data + sb->len, sb->cap - sb->len, fmt, ap);
		va_end(ap);
	}
	sb->len += (size_t) n;
}

/*
 * A JSON string.  The text is UTF-8 (the relay connects with
 * client_encoding UTF8): quotes, backslashes and control characters are
 * escaped, every other byte is copied.
 */
void
sb_json_string(StrBuf *sb, const char *s)
{
	const unsigned char *p;

	if (s == NULL)
	{
		sb_puts(sb, "null");
		return;
	}
	sb_putc(sb, '"');
	for (p = (const unsigned char *) s; *p; p++)
	{
		switch (*p)
		{
			case '"':
				sb_puts(sb, "\\\"");
				break;
			case '\\':
				sb_puts(sb, "\\\\");
				break;
			case '\n':
				sb_puts(sb, "\\n");
				break;
			case '\r':
				sb_puts(sb, "\\r");
				break;
			case '\t':
				sb_puts(sb, "\\t");
				break;
			default:
				if (*p < 0x20 || *p == 0x7f)
					sb_printf(sb, "\\u%04x", *p);
				else
					sb_putc(sb, (char) *p);
		}
	}
	sb_putc(sb, '"');
}

int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * A duration: a number of seconds (decimals allowed), or a number followed
 * by ms, s, min or h.  Returns milliseconds, or -1 when s is not one or is
 * longer than a day, or -2 when it is above zero and under a millisecond
 * (rounded, it would be 0, which turns some settings off).
 */
long
parse_duration_ms(const char *s)
{
	char	   *end;
	double		v;
	double		unit = 1000;
	size_t		ndigits;
	size_t		nfrac = 0;

	if (s == NULL)
		return -1;

	/*
	 * Decimal digits with an optional fraction, as the usage says: strtod
	 * alone would also take "0x10" (16), "1e3" and "inf".
	 */
	ndigits = strspn(s, "0123456789");
	if (s[ndigits] == '.')
		nfrac = strspn(s + ndigits + 1, "0123456789");
	if (ndigits == 0 && nfrac == 0)
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end != s + ndigits + (s[ndigits] == '.' ? 1 + nfrac : 0))
		return -1;
	while (*end == ' ')
		end++;
	if (*end == '\0' || strcmp(end, "s") == 0)
		unit = 1000;
	else if (strcmp(end, "ms") == 0)
		unit = 1;
	else if (strcmp(end, "min") == 0)
		unit = 60000;
	else if (strcmp(end, "h") == 0)
		unit = 3600000;
	else
		return -1;
	v *= unit;
	if (v < 0 || v > (double) RELAY_MAX_RETRY_AFTER_MS)
		return -1;
	if (v > 0 && v < 0.5)
		return -2;
	return (long) (v + 0.5);
}

int
valid_utf8(const char *s)
{
	const unsigned char *p = (const unsigned char *) s;

	while (*p)
	{
		unsigned int cp;
		int			n;
		int			i;

		if (*p < 0x80)
		{
			p++;
			continue;
		}
		if ((*p & 0xe0) == 0xc0)
		{
			n = 1;
			cp = *p & 0x1f;
		}
		else if ((*p & 0xf0) == 0xe0)
		{
			n = 2;
			cp = *p & 0x0f;
		}
		else if ((*p & 0xf8) == 0xf0)
		{
			n = 3;
			cp = *p & 0x07;
		}
		else
			return 0;
		for (i = 1; i <= n; i++)
		{
			if ((p[i] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
			cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		p += n + 1;
	}
	return 1;
}

/*
 * url into buf (cut to size) for a message, with the password of its user
 * information ("scheme://user:password@host...") written "xxxxx": the
 * relay's messages go to logs that others may read.  A URL that comes to a
 * message is often one that could not be parsed, with a "/", "?" or "#" in
 * its password: so everything from the first ":" after the scheme to the
 * last "@" is masked (a path with an "@" loses some of itself too).
 */
const char *
url_for_message(const char *url, char *buf, size_t size)
{
	const char *start = url;
	const char *at;
	const char *colon;
	size_t		n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");

	/* a scheme: a letter, then letters, digits, "+", "-" and "." */
	if (n > 0 && isalpha((unsigned char) url[0]) && strncmp(url + n, "://", 3) == 0)
		start = url + n + 3;
	at = strrchr(start, '@');
	colon = at ? memchr(start, ':', (size_t) (at - start)) : NULL;
	if (colon == NULL)
		snprintf(buf, size, "%s", url);
	else
		snprintf(buf, size, "%.*sxxxxx%s", (int) (colon + 1 - url), url, at);
	return buf;
}

/*
 * Copies at most len bytes of s into dst (NUL-terminated, cut to fit),
 * replacing control characters and bytes outside ASCII with '?': the error
 * text of a nack must be valid in any server encoding, and a log line one
 * line.
 */
void
printable_copy(char *dst, size_t dstsize, const char *s, size_t len)
{
	size_t		i;
	size_t		j = 0;

	if (dstsize == 0)
		return;
	for (i = 0; i < len && s[i] != '\0' && j + 1 < dstsize; i++)
	{
		unsigned char c = (unsigned char) s[i];

		dst[j++] = (c < 0x20 || c >= 0x7f) ? '?' : (char) c;
	}
	dst[j] = '\0';
}

/*
 * A message made one line, in place: each line break, with the blanks that
 * indent the next line (libpq's messages have both), becomes one space, and
 * blanks at the end go.
 */
void
one_line(char *s)
{
	char	   *c = s;
	char	   *d = s;

	while (*c)
	{
		if (*c == '\n' || *c == '\r')
		{
			while (*c == '\n' || *c == '\r' || *c == ' ' || *c == '\t')
				c++;
			if (d > s && d[-1] != ' ')
				*d++ = ' ';
		}
		else
			*d++ = *c++;
	}
	while (d > s && (d[-1] == ' ' || d[-1] == '\t'))
		d--;
	*d = '\0';
}

#define FNV64_OFFSET	UINT64_C(0xcbf29ce484222325)
#define FNV64_PRIME		UINT64_C(0x100000001b3)

static uint64_t
fnv64_bytes(uint64_t h, const unsigned char *p, size_t len)
{
	while (len-- > 0)
	{
		h ^= *p++;
		h *= FNV64_PRIME;
	}
	return h;
}

/*
 * FNV-1a over the topic's length (4 bytes, least significant first), the
 * topic and the key, as idem computes key_hash from its bytes of them (in
 * the database's encoding).
 */
int64_t
relay_key_hash(const unsigned char *topic, size_t topic_len,
			   const unsigned char *key, size_t key_len)
{
	unsigned char lenbytes[4];
	uint64_t	h;

	lenbytes[0] = (unsigned char) topic_len;
	lenbytes[1] = (unsigned char) (topic_len >> 8);
	lenbytes[2] = (unsigned char) (topic_len >> 16);
	lenbytes[3] = (unsigned char) (topic_len >> 24);
	h = fnv64_bytes(FNV64_OFFSET, lenbytes, sizeof(lenbytes));
	h = fnv64_bytes(h, topic, topic_len);
	h = fnv64_bytes(h, key, key_len);
	return (int64_t) h;
}

/*
 * One line on stderr: the time (UTC), the process and the level.  Debug
 * lines only with --verbose.
 */
void
relay_log(LogLevel level, const char *fmt,...)
{
	static const char *const names[] = {"DEBUG", "LOG", "WARNING", "ERROR"};
	char		stamp[64];
	struct timeval tv;
	struct tm	tm;
	va_list		ap;
	StrBuf		sb;
	int			n;

	if (level == LOG_DEBUG && !log_verbose)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
	sb_init(&sb);
	sb_printf(&sb, "%s.%03d UTC idem-relay[%d] %s:  ", stamp,
			  (int) (tv.tv_usec / 1000), (int) getpid(), names[level]);
	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n > 0)
	{
		char	   *msg = xmalloc((size_t) n + 1);

		va_start(ap, fmt);
		vsnprintf(msg, (size_t) n + 1, fmt, ap);
		va_end(ap);
		one_line(msg);
		sb_puts(&sb, msg);
		free(msg);
	}
	sb_putc(&sb, '\n');
	/* one write, so that lines of several relays sharing a file stay whole */
	if (write(STDERR_FILENO, sb.data, sb.len) < 0)
	{
		/* nowhere to report it */
	}
	sb_free(&sb);
}
