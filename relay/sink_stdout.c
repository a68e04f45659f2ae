/*
 * idem-relay: the stdout sink.  One JSON object a line per message:
 *
 *	{"id": ..., "topic": ..., "key": ..., "type": ..., "payload": ...,
 *	 "headers": ..., "attempt": ..., "created_at": ...}
 *
 * A message is delivered once its line was written to the file descriptor
 * (a pipe, a file): each line is flushed before the next one is started,
 * and a regular file is synced before the messages count as delivered.
 * A write that fails (the reader of the pipe went away) stops the relay.
 * A line it cuts short has no newline, and its message is delivered again;
 * a relay that writes to a file (appends to it) whose last line has no
 * newline ends that line first, so that its own first line stands alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "relay.h"

typedef struct StdoutSink
{
	Sink		base;
	StrBuf		line;
	long		timeout_ms;		/* the longest the write of one line may take */
} StdoutSink;

/*
 * Whether standard output ends in a line cut short.  One for every route:
 * they all write to descriptor 1, and the line is ended once.
 */
static int	cut_line;

/* Whether standard output is a regular file, synced before an ack. */
static int	sync_lines;

static const char *const stdout_settings[] = {NULL};

/*
 * Whether fd is a regular file whose next write comes after a byte other
 * than a newline: the end of the file when it is opened to append, else its
 * offset.  A relay stopped in the middle of a line left it so (on a full
 * disk, say).
 */
static int
ends_in_cut_line(int fd)
{
	struct stat st;
	off_t		at;
	int			flags;
	char		c;
	ssize_t		n;

	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
		(flags = fcntl(fd, F_GETFL)) < 0)
		return 0;
	at = (flags & O_APPEND) ? st.st_size : lseek(fd, 0, SEEK_CUR);
	if (at <= 0)
		return 0;
	n = pread(fd, &c, 1, at - 1);
	if (n < 0 && errno == EBADF)
	{
		/* opened to write only (">>"): read it through another open */
		char		path[64];
		int			rfd;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		rfd = open(path, O_RDONLY);
		if (rfd < 0)
			return 0;
		n = pread(rfd, &c, 1, at - 1);
		close(rfd);
	}
	return n == 1 && c != '\n';
}

static Sink *
stdout_init(const SinkSettings *ss, char *err, size_t errlen)
{
	StdoutSink *s = xmalloc(sizeof(StdoutSink));

	s->base.type = &sink_stdout_type;
	sb_init(&s->line);
	s->timeout_ms = ss->timeout_ms;
	/* nothing was written since another route's init: the same answer */
	cut_line = ends_in_cut_line(STDOUT_FILENO);
	{
		struct stat st;

		sync_lines = fstat(STDOUT_FILENO, &st) == 0 && S_ISREG(st.st_mode);
	}
	return &s->base;
}

/*
 * Lines written to a regular file are in the page cache: the ack that
 * follows is committed, and a crash of the system would lose them.  So they
 * are synced first, once for what one call delivered.  (Whatever reads a
 * pipe is responsible for what it read.)  False when the sync failed: the
 * lines are then not delivered, and the relay stops.
 */
static int
sync_delivered(Outcome *out, int n)
{
	int			i;
	int			any = 0;
	int			r;

	for (i = 0; i < n; i++)
		if (out[i].kind == OUTCOME_DELIVERED)
			any = 1;
	if (!sync_lines || !any)
		return 1;
	while ((r = fdatasync(STDOUT_FILENO)) != 0 && errno == EINTR)
		;
	if (r == 0)
		return 1;
	r = errno;
	for (i = 0; i < n; i++)
		if (out[i].kind == OUTCOME_DELIVERED)
		{
			snprintf(out[i].error, sizeof(out[i].error),
					 "could not sync standard output: %s", strerror(r));
			out[i].kind = OUTCOME_RETRY;
			out[i].retry_after_ms = 0;
		}
	relay_log(LOG_ERROR, "could not sync standard output: %s", strerror(r));
	return 0;
}

/*
 * write(2) all of buf; false with errno set.  A reader that stops reading
 * (takes nothing for timeout_ms) must not hold the relay, nor must it past a
 * second signal: the descriptor is polled (a tenth of a second at a time)
 * before each write of at most PIPE_BUF bytes, which a pipe that polls
 * writable takes without blocking.  A slow reader that keeps reading is
 * waited for.
 */
static int
write_all(int fd, const char *buf, size_t len, long timeout_ms,
		  volatile sig_atomic_t *stop_now)
{
	int64_t		deadline_ms = now_ms() + timeout_ms;

	while (len > 0)
	{
		struct pollfd pfd = {.fd = fd,.events = POLLOUT};
		int64_t		left = deadline_ms - now_ms();
		ssize_t		n;
		int			r;

		if (*stop_now || left <= 0)
		{
			errno = ETIMEDOUT;
			return 0;
		}
		r = poll(&pfd, 1, (int) (left < 100 ? left : 100));
		if (r < 0 && errno != EINTR)
			return 0;
		if (r <= 0)
			continue;
		if ((pfd.revents & (POLLERR | POLLNVAL)) && !(pfd.revents & POLLOUT))
		{
			errno = EPIPE;
			return 0;
		}
		n = write(fd, buf, len < PIPE_BUF ? len : PIPE_BUF);
		if (n < 0)
		{
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return 0;
		}
		buf += n;
		len -= (size_t) n;
		deadline_ms = now_ms() + timeout_ms;
	}
	return 1;
}

static int
stdout_publish(Sink *sink, const RelayMessage *msgs, int n, Outcome *out,
			   const PublishControl *ctl)
{
	StdoutSink *s = (StdoutSink *) sink;
	int			i;

	for (i = 0; i < n; i++)
	{
		const RelayMessage *m = &msgs[i];
		StrBuf	   *l = &s->line;

		if (*ctl->stop_now || now_ms() >= ctl->deadline_ms)
		{
			out[i].kind = OUTCOME_UNSENT;
			continue;
		}
		sb_reset(l);
		if (cut_line)
			sb_puts(l, "\n");
		sb_puts(l, "{\"id\": ");
		sb_json_string(l, m->id);
		sb_puts(l, ", \"topic\": ");
		sb_json_string(l, m->topic);
		sb_puts(l, ", \"key\": ");
		sb_json_string(l, m->key);
		sb_puts(l, ", \"type\": ");
		sb_json_string(l, m->type);
		sb_puts(l, ", \"payload\": ");
		sb_puts(l, m->payload);
		sb_puts(l, ", \"headers\": ");
		sb_puts(l, m->headers ? m->headers : "null");
		sb_printf(l, ", \"attempt\": %d, \"created_at\": ", m->attempt);
		sb_json_string(l, m->created_at);
		sb_puts(l, "}\n");
		if (!write_all(STDOUT_FILENO, l->data, l->len, s->timeout_ms, ctl->stop_now))
		{
			int			e = errno;

			if (e == ETIMEDOUT && *ctl->stop_now)
			{
				/* a second signal abandons the line: the relay stops as asked */
				snprintf(out[i].error, sizeof(out[i].error),
						 "could not write to standard output: stopped");
				out[i].kind = OUTCOME_RETRY;
				out[i].retry_after_ms = 0;
				for (i++; i < n; i++)
					out[i].kind = OUTCOME_UNSENT;
				return sync_delivered(out, n) ? 0 : -1;
			}
			/* this one and the rest: the relay stops */
			if (e == ETIMEDOUT)
				snprintf(out[i].error, sizeof(out[i].error),
						 "could not write to standard output: %s",
						 *ctl->stop_now ? "stopped" : "the reader took nothing within the timeout");
			else
				snprintf(out[i].error, sizeof(out[i].error),
						 "could not write to standard output: %s", strerror(e));
			out[i].kind = OUTCOME_RETRY;
			out[i].retry_after_ms = 0;
			relay_log(LOG_ERROR, "%s", out[i].error);
			for (i++; i < n; i++)
				out[i].kind = OUTCOME_UNSENT;
			(void) sync_delivered(out, n);
			return -1;
		}
		cut_line = 0;
		out[i].kind = OUTCOME_DELIVERED;
	}
	return sync_delivered(out, n) ? 0 : -1;
}

static void
stdout_close(Sink *sink)
{
	StdoutSink *s = (StdoutSink *) sink;

	sb_free(&s->line);
	free(s);
}

const SinkType sink_stdout_type = {
	.name = "stdout",
	.settings = stdout_settings,
	.global_init = NULL,
	.global_cleanup = NULL,
	.init = stdout_init,
	.publish = stdout_publish,
	.close = stdout_close,
};
