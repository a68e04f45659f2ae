/*
 * kafka_mock: librdkafka's mock cluster as a process of its own, for the
 * tests of idem-relay's kafka sink and examples/consumer_kafka.py.
 *
 *	kafka_mock BROKERS TOPIC PARTITIONS
 *
 * Starts a mock cluster of BROKERS brokers (each listening on a loopback
 * TCP port), creates TOPIC with PARTITIONS partitions, prints the bootstrap
 * servers ("127.0.0.1:PORT,...") on a line of its own, and serves until
 * its standard input is closed or it gets SIGTERM.  A line "produce-errors
 * CODE COUNT" on its standard input makes the next COUNT produce requests
 * fail with the Kafka error CODE; it answers "pushed" on a line; so does
 * "commit-errors CODE COUNT", for the next COUNT offset commits.  A line
 * "topic-error TOPIC CODE" makes the cluster's metadata give TOPIC the error
 * CODE (0: none, 3: the topic does not exist); it answers "set".  The mock speaks the
 * Kafka protocol: produce, fetch, and consumer groups (join, sync,
 * heartbeat, offset commit and fetch).  Built by t/093_relay_kafka.pl.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

static volatile sig_atomic_t stop = 0;

static void
on_signal(int signo)
{
	stop = 1;
}

int
main(int argc, char **argv)
{
	char		err[512];
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	rd_kafka_resp_err_t rc;
	char		buf[512];
	struct sigaction sa;

	if (argc != 4)
	{
		fprintf(stderr, "usage: kafka_mock BROKERS TOPIC PARTITIONS\n");
		return 1;
	}
	conf = rd_kafka_conf_new();
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "kafka_mock: %s\n", err);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, atoi(argv[1]));
	if (mc == NULL)
	{
		fprintf(stderr, "kafka_mock: could not create the mock cluster\n");
		return 1;
	}
	rc = rd_kafka_mock_topic_create(mc, argv[2], atoi(argv[3]), 1);
	if (rc != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		fprintf(stderr, "kafka_mock: could not create topic %s: %s\n", argv[2], rd_kafka_err2str(rc));
		return 1;
	}
	printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);
	/* no SA_RESTART: the signal ends the read below */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	/* until stdin is closed, or a signal */
	while (!stop && fgets(buf, sizeof(buf), stdin) != NULL)
	{
		char		topic[256];
		int			code;
		int			count;
		int			i;

		if (sscanf(buf, "topic-error %255s %d", topic, &code) == 2)
		{
			rd_kafka_mock_topic_set_error(mc, topic, (rd_kafka_resp_err_t) code);
			printf("set\n");
			fflush(stdout);
		}
		else if (sscanf(buf, "produce-errors %d %d", &code, &count) == 2 && count > 0)
		{
			for (i = 0; i < count; i++)
				rd_kafka_mock_push_request_errors(mc, 0 /* Produce */ , 1,
												  (rd_kafka_resp_err_t) code);
			printf("pushed\n");
			fflush(stdout);
		}
		else if (sscanf(buf, "commit-errors %d %d", &code, &count) == 2 && count > 0)
		{
			for (i = 0; i < count; i++)
				rd_kafka_mock_push_request_errors(mc, 8 /* OffsetCommit */ , 1,
												  (rd_kafka_resp_err_t) code);
			printf("pushed\n");
			fflush(stdout);
		}
	}
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}
