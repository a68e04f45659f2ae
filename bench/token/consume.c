/*
 * consume: the PostgreSQL side of the token benchmark, a libpq client.
 *
 *   consume idem|delete CONNINFO CLIENTS FILE
 *
 * FILE holds the tokens to consume, one per line: the client number (0 ..
 * CLIENTS-1), a tab and the token, as COPY writes them.  Each of CLIENTS
 * connections, one per thread, consumes its own tokens one at a time, each
 * in a transaction of its own (autocommit), through a prepared statement:
 *
 *   idem:   SELECT idem_token_consume($1, 'bench')
 *   delete: DELETE FROM bench.tokens
 *            WHERE scope = 'bench' AND digest = sha256(convert_to($1, 'UTF8'))
 *              AND expires_at > now()
 *           RETURNING 1
 *
 * where $1 is, for delete, the token's first 43 characters: the random part,
 * which is the whole token in a hand-written scheme.  Settings such as
 * synchronous_commit come from PGOPTIONS.  The clock runs from the moment
 * every connection is made and prepared to the end of the last one, as
 * pgbench counts.  Prints the consumptions, the seconds, the rate and the
 * number of consumptions that did not consume (which must be 0).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#define SECRET_LEN 43

typedef struct Client
{
	char	  **tokens;
	long		ntokens;
	long		cap;
	long		done;
	long		misses;
	int			failed;
} Client;

static const char *method;
static const char *conninfo;
static pthread_barrier_t barrier;

static const char *const idem_sql =
"SELECT idem_token_consume($1, 'bench')";
static const char *const delete_sql =
"DELETE FROM bench.tokens WHERE scope = 'bench' "
"AND digest = sha256(convert_to($1, 'UTF8')) AND expires_at > now() RETURNING 1";

static void *
run_client(void *arg)
{
	Client	   *cl = arg;
	PGconn	   *conn = PQconnectdb(conninfo);
	int			is_idem = (strcmp(method, "idem") == 0);
	PGresult   *res;
	long		i;

	if (PQstatus(conn) != CONNECTION_OK)
	{
		fprintf(stderr, "connection failed: %s", PQerrorMessage(conn));
		cl->failed = 1;
	}
	else
	{
		res = PQprepare(conn, "consume", is_idem ? idem_sql : delete_sql, 1, NULL);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			fprintf(stderr, "prepare failed: %s", PQerrorMessage(conn));
			cl->failed = 1;
		}
		PQclear(res);
	}
	pthread_barrier_wait(&barrier);
	for (i = 0; i < cl->ntokens && !cl->failed; i++)
	{
		char		secret[SECRET_LEN + 1];
		const char *param = cl->tokens[i];

		if (!is_idem)
		{
			snprintf(secret, sizeof(secret), "%s", cl->tokens[i]);
			param = secret;
		}
		res = PQexecPrepared(conn, "consume", 1, &param, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			fprintf(stderr, "consumption failed: %s", PQerrorMessage(conn));
			cl->failed = 1;
		}
		else if (is_idem ? strcmp(PQgetvalue(res, 0, 0), "t") != 0 :
				 PQntuples(res) != 1)
			cl->misses++;
		PQclear(res);
		cl->done++;
	}
	PQfinish(conn);
	return NULL;
}

static void
add_token(Client *cl, const char *token)
{
	if (cl->ntokens == cl->cap)
	{
		cl->cap = cl->cap ? cl->cap * 2 : 1024;
		cl->tokens = realloc(cl->tokens, cl->cap * sizeof(char *));
		if (cl->tokens == NULL)
		{
			perror("realloc");
			exit(2);
		}
	}
	cl->tokens[cl->ntokens++] = strdup(token);
}

int
main(int argc, char **argv)
{
	int			clients;
	pthread_t  *threads;
	Client	   *cls;
	FILE	   *f;
	char		line[256];
	struct timespec t0;
	struct timespec t1;
	double		secs;
	long		total = 0;
	long		misses = 0;
	int			failed = 0;
	int			c;

	if (argc != 5 || (strcmp(argv[1], "idem") != 0 && strcmp(argv[1], "delete") != 0))
	{
		fprintf(stderr, "usage: %s idem|delete CONNINFO CLIENTS FILE\n", argv[0]);
		return 2;
	}
	method = argv[1];
	conninfo = argv[2];
	clients = atoi(argv[3]);
	if (clients < 1 || clients > 1000)
	{
		fprintf(stderr, "bad number of clients\n");
		return 2;
	}
	cls = calloc(clients, sizeof(Client));
	threads = calloc(clients, sizeof(pthread_t));
	if ((f = fopen(argv[4], "r")) == NULL)
	{
		perror(argv[4]);
		return 2;
	}
	while (fgets(line, sizeof(line), f) != NULL)
	{
		char	   *tab = strchr(line, '\t');
		int			cn;

		line[strcspn(line, "\n")] = '\0';
		if (tab == NULL || (cn = atoi(line)) < 0 || cn >= clients ||
			strlen(tab + 1) < SECRET_LEN)
		{
			fprintf(stderr, "bad line in %s: %s\n", argv[4], line);
			return 2;
		}
		add_token(&cls[cn], tab + 1);
	}
	fclose(f);

	pthread_barrier_init(&barrier, NULL, clients + 1);
	for (c = 0; c < clients; c++)
	{
		if (pthread_create(&threads[c], NULL, run_client, &cls[c]) != 0)
		{
			perror("pthread_create");
			return 2;
		}
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
