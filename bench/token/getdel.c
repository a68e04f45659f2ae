/*
 * getdel: the Redis side of the token benchmark.
 *
 *   getdel load PORT CLIENTS PER_CLIENT BASE
 *   getdel run  PORT CLIENTS PER_CLIENT BASE
 *
 * Keys are "bench:" followed by a 43-character token, one for each client c
 * (0 .. CLIENTS-1) and each n (1 .. PER_CLIENT): the token is the number
 * BASE + c * 1000000 + n, left-padded with 'A' to 43 characters, as the
 * PostgreSQL side makes its tokens.  "load" stores them (SET key 1 EX 3600,
 * pipelined); "run" has CLIENTS connections, one per thread, each doing a
 * GETDEL of its own keys one at a time, waiting for every reply, like a
 * pgbench client.  It prints the operations, the seconds, the rate and the
 * number of GETDEL that found no key (which must be 0).
 *
 * Plain RESP over a socket: no client library needed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOKEN_LEN 43

static int	port;
static long per_client;
static long base;
static pthread_barrier_t barrier;

typedef struct Client
{
	int			id;
	long		done;
	long		misses;
	int			failed;
} Client;

static void
die(const char *msg)
{
	perror(msg);
	exit(2);
}

static int
connect_redis(void)
{
	struct sockaddr_in addr;
	int			fd = socket(AF_INET, SOCK_STREAM, 0);
	int			one = 1;

	if (fd < 0)
		die("socket");
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_port = htons(port);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0)
		die("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* the key of client c, number n: "bench:" and the padded token */
static int
make_key(char *dst, int c, long n)
{
	char		num[32];
	int			len = snprintf(num, sizeof(num), "%ld", base + c * 1000000L + n);
	int			pad = TOKEN_LEN - len;

	memcpy(dst, "bench:", 6);
	memset(dst + 6, 'A', pad);
	memcpy(dst + 6 + pad, num, len);
	return 6 + TOKEN_LEN;
}

static void
write_all(int fd, const char *buf, size_t len)
{
	while (len > 0)
	{
		ssize_t		w = write(fd, buf, len);

		if (w <= 0)
			die("write");
		buf += w;
		len -= w;
	}
}

/*
 * Read one reply into buf; returns 1 for a bulk string, 0 for a nil bulk
 * string, -1 for an error reply, and 2 for a simple string.  Only the
 * replies that GETDEL and SET give are understood.
 */
static int
read_reply(int fd, char *buf, size_t size, size_t *have)
{
	for (;;)
	{
		char	   *crlf = NULL;

		if (*have > 0)
			crlf = memmem(buf, *have, "\r\n", 2);
		if (crlf != NULL)
		{
			size_t		hdr = crlf - buf + 2;
			size_t		total = hdr;
			int			kind;

			if (buf[0] == '$')
			{
				long		blen = strtol(buf + 1, NULL, 10);

				if (blen < 0)
					kind = 0;
				else
				{
					total += blen + 2;
					kind = 1;
				}
			}
			else if (buf[0] == '+')
				kind = 2;
			else
				kind = -1;
			if (*have >= total)
			{
				if (kind == -1)
					fprintf(stderr, "redis error: %.*s\n", (int) hdr, buf);
				memmove(buf, buf + total, *have - total);
				*have -= total;
				return kind;
			}
		}
		if (*have >= size)
		{
			fprintf(stderr, "reply too long\n");
			exit(2);
		}
		{
			ssize_t		r = read(fd, buf + *have, size - *have);

			if (r <= 0)
				die("read");
			*have += r;
		}
	}
}

static void *
run_client(void *arg)
{
	Client	   *cl = arg;
	int			fd = connect_redis();
	char		cmd[128];
	char		buf[4096];
	size_t		have = 0;
	long		n;

	pthread_barrier_wait(&barrier);
	for (n = 1; n <= per_client; n++)
	{
		char		key[64];
		int			klen = make_key(key, cl->id, n);
		int			len = snprintf(cmd, sizeof(cmd),
								   "*2\r\n$6\r\nGETDEL\r\n$%d\r\n%.*s\r\n",
								   klen, klen, key);
		int			kind;

		write_all(fd, cmd, len);
		kind = read_reply(fd, buf, sizeof(buf), &have);
		if (kind == 0)
			cl->misses++;
		else if (kind != 1)
			cl->failed = 1;
		cl->done++;
	}
	close(fd);
	return NULL;
}

static void
load(int clients)
{
	int			fd = connect_redis();
	char		buf[4096];
	size_t		have = 0;
	int			c;

	for (c = 0; c < clients; c++)
	{
		long		n = 1;

		while (n <= per_client)
		{
			char		out[1 << 16];
			size_t		used = 0;
			int			batch = 0;
			int			i;

			for (; n <= per_client && batch < 500; n++, batch++)
			{
				char		key[64];
				int			klen = make_key(key, c, n);

				used += snprintf(out + used, sizeof(out) - used,
								 "*5\r\n$3\r\nSET\r\n$%d\r\n%.*s\r\n$1\r\n1\r\n$2\r\nEX\r\n$4\r\n3600\r\n",
								 klen, klen, key);
			}
			write_all(fd, out, used);
			for (i = 0; i < batch; i++)
			{
				if (read_reply(fd, buf, sizeof(buf), &have) != 2)
				{
					fprintf(stderr, "SET failed\n");
					exit(2);
				}
			}
		}
	}
	close(fd);
}

int
main(int argc, char **argv)
{
	int			clients;
	pthread_t  *threads;
	Client	   *cls;
	struct timespec t0;
	struct timespec t1;
	double		secs;
	long		total = 0;
	long		misses = 0;
	int			failed = 0;
	int			c;

	if (argc != 6)
	{
		fprintf(stderr, "usage: %s load|run PORT CLIENTS PER_CLIENT BASE\n", argv[0]);
		return 2;
	}
	port = atoi(argv[2]);
	clients = atoi(argv[3]);
	per_client = atol(argv[4]);
	base = atol(argv[5]);
	if (clients < 1 || per_client < 1 || per_client >= 1000000)
	{
		fprintf(stderr, "bad arguments\n");
		return 2;
	}

	if (strcmp(argv[1], "load") == 0)
	{
		load(clients);
		return 0;
	}
	if (strcmp(argv[1], "run") != 0)
	{
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}

	threads = calloc(clients, sizeof(pthread_t));
	cls = calloc(clients, sizeof(Client));
	pthread_barrier_init(&barrier, NULL, clients + 1);
	for (c = 0; c < clients; c++)
	{
		cls[c].id = c;
		if (pthread_create(&threads[c], NULL, run_client, &cls[c]) != 0)
			die("pthread_create");
	}
	pthread_barrier_wait(&barrier);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (c = 0; c < clients; c++)
	{
		pthread_join(threads[c], NULL);
		total += cls[c].done;
		misses += cls[c].misses;
		failed |= cls[c].failed;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("ops=%ld secs=%.3f ops_per_sec=%.1f misses=%ld\n",
		   total, secs, total / secs, misses);
	return failed ? 1 : 0;
}
