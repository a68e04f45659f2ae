# idem: PGXS build
EXTENSION = idem
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" idem.control)

MODULE_big = idem
OBJS = \
	src/idem.o \
	src/store.o \
	src/claim.o \
	src/token.o \
	src/guard.o \
	src/request.o \
	src/outbox.o

DATA = $(wildcard idem--*.sql)
PGFILEDESC = "idem - idempotency primitives"

# Every file in sql/ and specs/ is a test; t/*.pl are TAP tests.
REGRESS = $(sort $(basename $(notdir $(wildcard sql/*.sql))))
REGRESS_OPTS = --inputdir=. --load-extension=idem
ISOLATION = $(sort $(basename $(notdir $(wildcard specs/*.spec))))
ISOLATION_OPTS = --inputdir=. --load-extension=idem
TAP_TESTS = 1

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
