# idem: PGXS build
EXTENSION = idem
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" idem.control)

MODULE_big = idem
OBJS = \
	src/idem.o \
	src/store.o \
	src/claim.o \
	src/token.o \
	src/guard_machine.o \
	src/guard_trigger.o \
	src/guard_transition.o \
	src/request.o \
	src/outbox.o \
	src/outbox_send.o \
	src/outbox_wake.o \
	src/outbox_lease.o \
	src/outbox_ack.o \
	src/stream.o \
	src/stats.o \
	src/worker.o \
	src/citus.o \
	src/session.o

DATA = $(wildcard idem--*.sql)
PGFILEDESC = "idem - idempotency primitives"

# Every file in sql/ and specs/ is a test; t/*.pl are TAP tests.
REGRESS = $(sort $(basename $(notdir $(wildcard sql/*.sql))))
REGRESS_OPTS = --inputdir=. --load-extension=idem
ISOLATION = $(sort $(basename $(notdir $(wildcard specs/*.spec))))
ISOLATION_OPTS = --inputdir=. --load-extension=idem
TAP_TESTS = 1

# idem-relay, the program that delivers the outbox (relay/): a client of
# libpq, libcurl, librabbitmq and librdkafka (and NATS, spoken over its protocol:
# relay/sink_nats.c), built with the module's flags and installed beside the
# server's programs.
RELAY = relay/idem-relay
RELAY_OBJS = \
	relay/main.o \
	relay/config.o \
	relay/util.o \
	relay/sink.o \
	relay/sink_stdout.o \
	relay/sink_webhook.o \
	relay/sink_rabbitmq.o \
	relay/sink_kafka.o \
	relay/sink_nats.o
EXTRA_CLEAN = $(RELAY) $(RELAY_OBJS)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header of its own: an object (or the bitcode that JIT
# inlining reads) built against an older layout of a table's columns would
# read and write beyond them
$(OBJS) $(OBJS:.o=.bc): src/idem.h
$(filter src/outbox%,$(OBJS) $(OBJS:.o=.bc)): src/outbox.h
$(filter src/guard%,$(OBJS) $(OBJS:.o=.bc)): src/guard.h

all: $(RELAY)

$(RELAY_OBJS): override CPPFLAGS := -I$(includedir) $(CPPFLAGS) -DRELAY_VERSION='"$(EXTVERSION)"'
$(RELAY_OBJS): relay/relay.h

$(RELAY): $(RELAY_OBJS)
	$(CC) $(CFLAGS) $(RELAY_OBJS) $(LDFLAGS) $(LDFLAGS_EX) -L$(libdir) -lpq -lcurl -lrabbitmq -lrdkafka -o $@

install: install-relay
uninstall: uninstall-relay

install-relay: $(RELAY)
	$(MKDIR_P) '$(DESTDIR)$(bindir)'
	$(INSTALL_PROGRAM) $(RELAY) '$(DESTDIR)$(bindir)/idem-relay'

uninstall-relay:
	rm -f '$(DESTDIR)$(bindir)/idem-relay'

.PHONY: install-relay uninstall-relay
