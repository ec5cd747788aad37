# magic_sync: the extension (PGXS), the sender, the reference replica, and their tests.
#
#   make            build everything (the extension, the programs, the tests)
#   make install    install the extension into the PostgreSQL found by pg_config
#   make test       install what is missing, build, install, run every test
#   make demo       a throwaway cluster with magic_sync, to look at

PG_CONFIG ?= pg_config

# The default goal: the extension (PGXS's `all`) and our programs and tests.
everything: all programs

MODULE_big = magic_sync
EXTENSION = magic_sync
# The features of the extension, a folder each with its C++ and its SQL side by side (see
# docs/ARCHITECTURE.md); src/pg/ holds the bridge and the wrappers, src/protocol/ the pure wire.
FEATURES := state capture declare relay filing verify wire
# The install script is assembled from the features' SQL parts, in this order: each part uses
# only what the parts before it created.
SQL_PARTS := src/state/schema.sql src/relay/relay_lock.sql src/declare/declare.sql \
	src/state/codec.sql src/wire/wire.sql src/relay/relay.sql src/relay/outbox.sql \
	src/filing/set_aside.sql src/filing/receive.sql src/relay/pass.sql src/relay/relay_loop.sql \
	src/verify/repair.sql src/verify/truth.sql src/verify/fleet.sql src/state/comments.sql \
	src/state/privileges.sql
# The version being built: the control file's default_version, the one place it is written.
EXT_VERSION := $(shell sed -n "s/^default_version = '\(.*\)'$$/\1/p" magic_sync.control)
# The install script of this version, and an update script from each release before it: the part
# that sets the old state aside, this version's install script whole, and the part that brings the
# state back (src/upgrade/).
UPGRADES_FROM := 0.1.0
DATA_built = build/magic_sync--$(EXT_VERSION).sql \
	$(foreach old,$(UPGRADES_FROM),build/magic_sync--$(old)--$(EXT_VERSION).sql)

EXT_SRCS := $(wildcard $(foreach feature,$(FEATURES) pg,src/$(feature)/*.cpp))
PROTOCOL_SRCS := $(wildcard src/protocol/*.cpp)
PROTOCOL_OBJS := $(patsubst src/protocol/%.cpp,build/protocol/%.o,$(PROTOCOL_SRCS))
OBJS = $(EXT_SRCS:.cpp=.o) $(PROTOCOL_OBJS)

WARNINGS := -Wall -Wextra -Werror
# PostgreSQL's headers as system headers: our warnings are errors, theirs are not ours to fix.
PG_CPPFLAGS = -DMAGIC_SYNC_VERSION='"$(EXT_VERSION)"' -Isrc -isystem $(shell $(PG_CONFIG) --includedir-server) -isystem $(shell $(PG_CONFIG) --includedir)/internal
PG_CXXFLAGS = -std=c++17 $(WARNINGS)
SHLIB_LINK = -lstdc++ -lcrypto -lz

# No JIT bitcode: the extension is C++ and gains nothing from inlining into JIT-compiled queries.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
# Replace the library by rename, never in place: clusters that run while we install keep working.
INSTALL_SHLIB = $(CURDIR)/scripts/install-shlib.sh $(INSTALL_SHLIB_OPTS)

# Everything below is ours: the pure C++ protocol library and the programs and tests built on it,
# compiled without PostgreSQL's headers (the barrier makes including postgres.h an error).
HOST_CXX ?= g++
HOST_CXXFLAGS ?= -O2 -g
HOST_FLAGS = -std=c++17 $(WARNINGS) -fPIC $(HOST_CXXFLAGS) $(SANITIZE)
PROTOCOL_INCLUDES = -Isrc/protocol/barrier -Isrc
PROTOCOL_BUILD = -DMAGIC_SYNC_PROTOCOL_BUILD
PQ_INCLUDES = -I$(shell $(PG_CONFIG) --includedir)

build/magic_sync--$(EXT_VERSION).sql: $(SQL_PARTS)
	@mkdir -p $(dir $@)
	cat $(SQL_PARTS) > $@

build/magic_sync--%--$(EXT_VERSION).sql: src/upgrade/%--$(EXT_VERSION).before.sql $(SQL_PARTS) \
		src/upgrade/%--$(EXT_VERSION).after.sql
	@mkdir -p $(dir $@)
	cat $^ > $@

# Our objects record the headers they include (-MMD): a header changed rebuilds what includes it.
DEPFLAGS = -MMD -MP

build/protocol/%.o: src/protocol/%.cpp
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(DEPFLAGS) $(PROTOCOL_BUILD) $(PROTOCOL_INCLUDES) -c -o $@ $<

# The extension's objects include the protocol headers too.
$(EXT_SRCS:.cpp=.o): $(wildcard $(foreach folder,$(FEATURES) pg protocol,src/$(folder)/*.hpp))

# The sender: sender/main.cpp is the program, the other sources its library.
SENDER_SRCS := $(filter-out sender/main.cpp,$(wildcard sender/*.cpp))
SENDER_OBJS := $(patsubst sender/%.cpp,build/sender/%.o,$(SENDER_SRCS))
SENDER_LIBS = -lpq -lcurl -lnats -lcrypto -lz -lpthread $(HTTPLIB_LIBS)
build/sender/%.o: sender/%.cpp
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(DEPFLAGS) $(PROTOCOL_INCLUDES) $(PQ_INCLUDES) $(HTTPLIB_CFLAGS) -Isender -c -o $@ $<
build/bin/magic-sync-sender: build/sender/main.o $(SENDER_OBJS) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) -o $@ $^ $(SENDER_LIBS)

# The reference replica: replica/lib/ is libmagic_sync_replica, replica/cli/ the program.
REPLICA_LIB_SRCS := $(wildcard replica/lib/*.cpp)
REPLICA_LIB_OBJS := $(patsubst replica/lib/%.cpp,build/replica/lib/%.o,$(REPLICA_LIB_SRCS))
REPLICA_CLI_SRCS := $(wildcard replica/cli/*.cpp)
REPLICA_CLI_OBJS := $(patsubst replica/cli/%.cpp,build/replica/cli/%.o,$(REPLICA_CLI_SRCS))
REPLICA_LIBS = -lsqlite3 -lpq -lnats -lcurl -lcrypto -lz -lpthread
build/replica/%.o: replica/%.cpp
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(DEPFLAGS) $(PROTOCOL_INCLUDES) $(PQ_INCLUDES) -Ireplica -c -o $@ $<
build/lib/libmagic_sync_replica.a: $(REPLICA_LIB_OBJS) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
build/bin/magic-sync-replica: $(REPLICA_CLI_OBJS) build/lib/libmagic_sync_replica.a
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) -o $@ $^ $(REPLICA_LIBS)

# Connecting through libpq (src/libpq/connection.hpp, header-only), for the sender, the reference
# replica and the tests: what includes it needs the protocol's conninfo object too.
LIBPQ_HELPER := src/libpq/connection.hpp build/protocol/conninfo.o

# Debian builds cpp-httplib as a library with TLS and compression: its header needs the same
# definitions.
HTTPLIB_CFLAGS = $(shell pkg-config --cflags cpp-httplib 2>/dev/null)
HTTPLIB_LIBS = $(shell pkg-config --libs cpp-httplib 2>/dev/null)
HTTPLIB = $(HTTPLIB_CFLAGS) $(HTTPLIB_LIBS)

# The tests' own code (tests/): compiled by clang at -O0, an object per source, so that the cores
# share the work and a change rebuilds one file. What they test is the product's build; their own
# speed is not what they measure (clang compiles them in half of g++ -O2's time). DWARF 4: the
# valgrind of Debian 12 cannot read clang 14's default, DWARF 5.
TEST_CXX ?= clang++
TEST_CXXFLAGS ?= -O0 -gdwarf-4
TEST_FLAGS = -std=c++17 $(WARNINGS) $(TEST_CXXFLAGS) $(SANITIZE) $(DEPFLAGS)
TEST_INCLUDES = $(PROTOCOL_INCLUDES) $(PQ_INCLUDES) $(HTTPLIB_CFLAGS) -Isender -Ireplica -Itests
# GoogleTest, nlohmann/json and cpp-httplib are parsed once into a precompiled header
# (tests/support/precompiled.hpp) that every test object starts from: they cost about a second of
# each object's compile, ~60 objects. clang takes a header only with the flags it was made with:
# one for the tests, one for the sanitizers. (The server tests and the simulation were built at -O1
# while they read replicas through JSON; they read them through the replica library now, and at
# -O0 their objects compile in half the time, 58 against 87 CPU-s, for the same CPU in their runs.)
build/tests/pch/O0.pch build/asan/tests/pch/O0.pch: tests/support/precompiled.hpp
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) $(TEST_INCLUDES) -x c++-header -o $@ $<
compile_test = $(TEST_CXX) $(TEST_FLAGS) $(TEST_INCLUDES) -include-pch $(filter %.pch,$^) -c -o $@ $<
build/tests/obj/%.o: tests/%.cpp build/tests/pch/O0.pch
	@mkdir -p $(dir $@)
	$(compile_test)
# The objects of tests/<folder>/*.cpp (the folder's _test sources when a pattern is given) in
# build directory $(1).
test_objs = $(patsubst tests/%.cpp,$(1)/tests/obj/%.o,$(wildcard $(2)))

# GoogleTest binaries: one per folder of tests/, each linked with what it tests and with
# tests/support/ (a throwaway cluster, processes).
GTEST_LIBS = -lgtest -lgtest_main -lpthread
TEST_SUPPORT_SRCS := $(wildcard tests/support/*.cpp)
TEST_SUPPORT_OBJS = $(call test_objs,build,tests/support/*.cpp)

UNIT_SRCS := $(wildcard tests/unit/*_test.cpp)
build/tests/unit_tests: $(call test_objs,build,tests/unit/*_test.cpp) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) -lcrypto -lz
SENDER_TEST_SRCS := $(wildcard tests/sender/*_test.cpp)
build/tests/sender_tests: $(call test_objs,build,tests/sender/*_test.cpp) $(TEST_SUPPORT_OBJS) \
		$(SENDER_OBJS) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) $(SENDER_LIBS)
REPLICA_TEST_SRCS := $(wildcard tests/replica/*_test.cpp)
build/tests/replica_tests: $(call test_objs,build,tests/replica/*_test.cpp) $(TEST_SUPPORT_OBJS) \
		build/lib/libmagic_sync_replica.a
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) $(REPLICA_LIBS)
# The replica library's own tests (SQLite only, no processes), unsanitized, for valgrind: `make
# test` builds this binary and not the whole of replica_tests, which runs under the sanitizers.
build/tests/replica_library_tests: build/tests/obj/replica/replica_library_test.o $(TEST_SUPPORT_OBJS) \
		build/lib/libmagic_sync_replica.a
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) $(REPLICA_LIBS)

# Tests against a real server: the relay worker, poolers, end to end (and the sender's /metrics).
SERVER_TEST_SRCS := $(wildcard tests/server/*_test.cpp)
# They read what a replica's file holds through the replica library.
build/tests/server_tests: $(call test_objs,build,tests/server/*_test.cpp) $(TEST_SUPPORT_OBJS) \
		build/lib/libmagic_sync_replica.a
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) $(REPLICA_LIBS) $(HTTPLIB_LIBS)

# The seeded whole-system simulation (issue 19): a program, not GoogleTest; `make sim`.
SIM_SRCS := $(wildcard tests/sim/*.cpp)
build/tests/sim: $(call test_objs,build,tests/sim/*.cpp) $(TEST_SUPPORT_OBJS) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ -lpq -lcrypto -lz -lpthread $(HTTPLIB_LIBS)

# tests/conformance: any replica implementation against a real server (docs/PROTOCOL.md).
build/tests/conformance: $(call test_objs,build,tests/conformance/*.cpp) $(TEST_SUPPORT_OBJS) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ -lpq -lcrypto -lz -lpthread

# clients/js: the TypeScript replica (docs/PROTOCOL.md), its dependencies from the lock (npm ci)
# and compiled once with tsc; the conformance suite runs its CLI (conformance:js) and the browser
# test its page.
clients/js/node_modules/.package-lock.json: clients/js/package.json clients/js/package-lock.json
	cd clients/js && npm ci --no-audit --no-fund --loglevel=error
clients/js/dist/cli.js: clients/js/node_modules/.package-lock.json clients/js/tsconfig.json \
		$(wildcard clients/js/src/*.ts)
	cd clients/js && node_modules/.bin/tsc -p .
	@touch $@

PROGRAMS := build/tests/unit_tests
PROGRAMS += $(if $(SERVER_TEST_SRCS),build/tests/server_tests)
PROGRAMS += $(if $(wildcard sender/main.cpp),build/bin/magic-sync-sender)
PROGRAMS += $(if $(SENDER_TEST_SRCS),build/tests/sender_tests)
PROGRAMS += $(if $(REPLICA_LIB_SRCS),build/lib/libmagic_sync_replica.a)
PROGRAMS += $(if $(REPLICA_CLI_SRCS),build/bin/magic-sync-replica)
PROGRAMS += $(if $(REPLICA_TEST_SRCS),build/tests/replica_tests)
PROGRAMS += $(if $(SIM_SRCS),build/tests/sim)
programs: $(PROGRAMS)

.PHONY: everything programs setup test demo format format-check

setup:
	@scripts/setup.sh

# What `make test` runs, built at once on every core: the extension and the programs; the server
# tests and the simulation; the unit, replica and sender tests with the sanitizers (they run there
# only: unsanitized they would run the same assertions again); the replica library's tests
# unsanitized, for valgrind; the fuzz targets; and release 0.1.0's extension, for the update test.
JOBS ?= $(shell nproc)
TEST_BUILDS = all build/bin/magic-sync-sender build/bin/magic-sync-replica build/tests/server_tests \
	build/tests/sim build/tests/replica_library_tests build/tests/conformance clients/js/dist/cli.js \
	$(ASAN_BUILDS) fuzz-build release-builds
.PHONY: test-builds release-builds
# A clone without the releases' history skips them here (the update test says so).
release-builds:
	+@for version in $(UPGRADES_FROM); do scripts/build-release.sh $$version >/dev/null || \
		[ $$? -eq 77 ] || exit 1; done

# `make test` is what CI runs: set up, build, install, then every test runner, each part timed.
test: setup
	@start=$$(date +%s); $(MAKE) -s -j$(JOBS) test-builds && \
		echo "make test: built in $$(($$(date +%s) - start)) s"
	$(MAKE) -s install
	scripts/run-tests.sh

demo: setup
	$(MAKE) everything
	$(MAKE) install
	scripts/demo.sh

FORMATTED := $(shell git ls-files '*.cpp' '*.hpp' 2>/dev/null)

format:
	clang-format -i $(FORMATTED)

format-check:
	@clang-format --dry-run --Werror $(FORMATTED) && echo "format-check: $(words $(FORMATTED)) files formatted"

EXTRA_CLEAN = build

# Commit-to-outbox latency with the relay worker idle (issue 5); figures in bench/README.md.
build/bench/latency: bench/latency/latency.cpp $(TEST_SUPPORT_SRCS) $(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/latency/latency.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq

.PHONY: bench-latency
bench-latency: build/bench/latency
	$(MAKE) install
	build/bench/latency 200

# Benchmarks (bench/README.md): each runs in a throwaway cluster and prints its figures and ratios.
.PHONY: bench-capture bench-relay
bench-capture:
	$(MAKE) install
	bench/capture/run.sh
bench-relay:
	$(MAKE) install
	bench/relay/run.sh
# bench/idle: an idle relay's CPU at 100,000 live replicas (issue 38, bench/README.md).
.PHONY: bench-idle
bench-idle:
	$(MAKE) install
	bench/idle/run.sh

# bench/sender: the sender's messages/s against each transport's own baseline (bench/README.md).
build/bench/sender_bench: bench/sender/sender_bench.cpp $(TEST_SUPPORT_SRCS) $(wildcard tests/sender/*.hpp)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) -Itests -o $@ bench/sender/sender_bench.cpp $(TEST_SUPPORT_SRCS) -lnats -lpthread
.PHONY: bench-sender
bench-sender: build/bin/magic-sync-sender build/bench/sender_bench
	build/bench/sender_bench

# bench/receive: uploads through sync.receive against plain multi-row INSERTs (bench/README.md).
.PHONY: bench-receive
bench-receive:
	$(MAKE) install
	bench/receive/run.sh

# Fuzzing (tests/fuzz/README.md): libFuzzer targets linked with the protocol objects of the
# sanitizer build (build/asan/protocol/, below), which are compiled for both: -O1 with libFuzzer's
# coverage instrumentation (which the sanitizers' runtime answers when no fuzzer is linked); the
# normal objects are untouched. `make fuzz` runs each target FUZZ_SECONDS, `make fuzz-quick` 20 s
# (as `make test` does).
FUZZ_CXX ?= clang++
ASAN_PROTOCOL_OBJS := $(patsubst src/protocol/%.cpp,build/asan/protocol/%.o,$(PROTOCOL_SRCS))
FUZZ_SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_FLAGS = -std=c++17 $(WARNINGS) -g -O1 -fno-omit-frame-pointer $(FUZZ_SANITIZE)
FUZZ_TARGETS := decode canonical upload
FUZZ_SECONDS ?= 600
build/fuzz/%: tests/fuzz/%_fuzz.cpp $(wildcard tests/fuzz/*.hpp) $(ASAN_PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer $(PROTOCOL_INCLUDES) -Itests/fuzz -o $@ $< \
		$(ASAN_PROTOCOL_OBJS) -lcrypto -lz
build/fuzz/make_seeds: tests/fuzz/make_seeds.cpp $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PROTOCOL_INCLUDES) -o $@ $< $(PROTOCOL_OBJS) -lcrypto -lz
.PHONY: fuzz fuzz-quick fuzz-build
fuzz-build: $(addprefix build/fuzz/,$(FUZZ_TARGETS))
fuzz:
	scripts/fuzz.sh --seconds $(FUZZ_SECONDS)
fuzz-quick:
	scripts/fuzz.sh --seconds 20

# The GoogleTest binaries, the sender and the replica under AddressSanitizer and
# UndefinedBehaviorSanitizer, in build/asan/ (`make test-asan` runs them), compiled by
# clang, which builds them with the sanitizers in half of GCC's time.
ASAN_CXX ?= clang++
ASAN_SANITIZE = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
ASAN_SENDER_OBJS := $(patsubst sender/%.cpp,build/asan/sender/%.o,$(SENDER_SRCS))
ASAN_REPLICA_LIB_OBJS := $(patsubst replica/lib/%.cpp,build/asan/replica/lib/%.o,$(REPLICA_LIB_SRCS))
ASAN_REPLICA_CLI_OBJS := $(patsubst replica/cli/%.cpp,build/asan/replica/cli/%.o,$(REPLICA_CLI_SRCS))
ASAN_CXXFLAGS ?= -O0 -g
ASAN_TEST_SUPPORT_OBJS = $(call test_objs,build/asan,tests/support/*.cpp)
build/asan/%: SANITIZE = $(ASAN_SANITIZE)
build/asan/%: HOST_CXX = $(ASAN_CXX)
build/asan/%: HOST_CXXFLAGS = $(ASAN_CXXFLAGS)
build/asan/%: TEST_CXX = $(ASAN_CXX)
# The protocol's objects serve the fuzz targets too (see Fuzzing above).
build/asan/protocol/%.o: src/protocol/%.cpp
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fPIC -fsanitize=fuzzer-no-link $(DEPFLAGS) $(PROTOCOL_BUILD) \
		$(PROTOCOL_INCLUDES) -c -o $@ $<
build/asan/sender/%.o: sender/%.cpp
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(DEPFLAGS) $(PROTOCOL_INCLUDES) $(PQ_INCLUDES) $(HTTPLIB_CFLAGS) -Isender -c -o $@ $<
build/asan/replica/%.o: replica/%.cpp
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(DEPFLAGS) $(PROTOCOL_INCLUDES) $(PQ_INCLUDES) -Ireplica -c -o $@ $<
build/asan/tests/obj/%.o: tests/%.cpp build/asan/tests/pch/O0.pch
	@mkdir -p $(dir $@)
	$(compile_test)
build/asan/tests/unit_tests: $(call test_objs,build/asan,tests/unit/*_test.cpp) $(ASAN_PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) -lcrypto -lz
build/asan/bin/magic-sync-sender: build/asan/sender/main.o $(ASAN_SENDER_OBJS) $(ASAN_PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) -o $@ $^ $(SENDER_LIBS)
build/asan/tests/sender_tests: $(call test_objs,build/asan,tests/sender/*_test.cpp) \
		$(ASAN_TEST_SUPPORT_OBJS) $(ASAN_SENDER_OBJS) $(ASAN_PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) $(SENDER_LIBS)
build/asan/lib/libmagic_sync_replica.a: $(ASAN_REPLICA_LIB_OBJS) $(ASAN_PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
build/asan/bin/magic-sync-replica: $(ASAN_REPLICA_CLI_OBJS) build/asan/lib/libmagic_sync_replica.a
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) -o $@ $^ $(REPLICA_LIBS)
build/asan/tests/replica_tests: $(call test_objs,build/asan,tests/replica/*_test.cpp) \
		$(ASAN_TEST_SUPPORT_OBJS) build/asan/lib/libmagic_sync_replica.a
	@mkdir -p $(dir $@)
	$(TEST_CXX) $(TEST_FLAGS) -o $@ $^ $(GTEST_LIBS) $(REPLICA_LIBS)
ASAN_BUILDS = build/asan/tests/unit_tests build/asan/tests/replica_tests build/asan/bin/magic-sync-replica \
	build/asan/tests/sender_tests build/asan/bin/magic-sync-sender
.PHONY: test-asan
test-asan: setup
	$(MAKE) -s -j$(JOBS) $(ASAN_BUILDS) build/tests/replica_library_tests
	MAGIC_SYNC_TESTS=sanitizers scripts/run-tests.sh

# End to end (issue 8): commit-to-applied latency and rows/s delivered to 100 replicas over http.
build/bench/e2e: bench/e2e/e2e_bench.cpp $(TEST_SUPPORT_SRCS) $(wildcard tests/server/*.hpp) \
		$(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/e2e/e2e_bench.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq $(HTTPLIB) -lpthread

.PHONY: bench-e2e
bench-e2e: build/bench/e2e build/bin/magic-sync-sender build/bin/magic-sync-replica
	$(MAKE) install
	build/bench/e2e 100 50

# Fan-out measured at the server (issue 38): N replicas answered by one ack-only sink over http
# and over nats, commit to last ack and CPU per delivered message; provisioning at 100,000, which
# gives up after 5 minutes (bench/README.md).
build/bench/fanout: bench/fanout/fanout_bench.cpp bench/fanout/sink.hpp $(TEST_SUPPORT_SRCS) \
		$(wildcard tests/server/*.hpp) $(LIBPQ_HELPER) $(PROTOCOL_OBJS)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -Ibench -o $@ \
		bench/fanout/fanout_bench.cpp $(TEST_SUPPORT_SRCS) $(PROTOCOL_OBJS) -lpq -lnats -lcrypto -lz \
		$(HTTPLIB) -lpthread

.PHONY: bench-fanout
bench-fanout: build/bench/fanout build/bin/magic-sync-sender
	$(MAKE) install
	build/bench/fanout --transport http
	build/bench/fanout --transport nats
	build/bench/fanout --transport nats --gzip
	build/bench/fanout --replicas 100000 --rounds 0 --patience 300

# Pull against push (issue 26): the same backlog to N replicas by each, in one run (bench/README.md).
build/bench/pull_bench: bench/pull/pull_bench.cpp $(TEST_SUPPORT_SRCS) $(wildcard tests/server/*.hpp) \
		$(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/pull/pull_bench.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq $(HTTPLIB) -lpthread

# The pull gateway under load: N devices long-polling at once, one epoll thread of the benchmark;
# the gateway's threads, memory, CPU and commit-to-answer latency with all N waiting and with 100,
# side by side (build/bench/pull_load --help). Both include tests/server/ (-Ireplica: its
# holdings.hpp includes the replica library's header).
build/bench/pull_load: bench/pull/pull_load.cpp $(TEST_SUPPORT_SRCS) $(wildcard tests/server/*.hpp) \
		$(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/pull/pull_load.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq $(HTTPLIB) -lpthread

.PHONY: bench-pull
bench-pull: build/bench/pull_bench build/bench/pull_load build/bin/magic-sync-sender \
		build/bin/magic-sync-replica
	$(MAKE) install
	build/bench/pull_bench 50 2000
	build/bench/pull_load 10000

# Long transactions (issue 10): delivery throughput while a session holds the xmin horizon open
# (BEGIN; SELECT txid_current();) against the same run without it (bench/README.md).
LONGTX_SECONDS ?= 180
build/bench/longtx: bench/longtx/longtx_bench.cpp $(TEST_SUPPORT_SRCS) $(wildcard tests/server/*.hpp) \
		$(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/longtx/longtx_bench.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq $(HTTPLIB) -lpthread

.PHONY: bench-longtx soak
bench-longtx: build/bench/longtx build/bin/magic-sync-sender build/bin/magic-sync-replica
	$(MAKE) install
	build/bench/longtx $(LONGTX_SECONDS) 10

# The fault suite of `make test` (tests/server/fault_test.cpp) for SOAK_ROUNDS rounds with
# SOAK_LOAD_MS of load around each fault, then the long-transaction benchmark (RELIABILITY.md).
SOAK_ROUNDS ?= 5
SOAK_LOAD_MS ?= 10000
soak: build/tests/server_tests build/bench/longtx build/bin/magic-sync-sender build/bin/magic-sync-replica
	$(MAKE) install
	MAGIC_SYNC_SOAK_ROUNDS=$(SOAK_ROUNDS) MAGIC_SYNC_SOAK_LOAD_MS=$(SOAK_LOAD_MS) \
		build/tests/server_tests --gtest_filter='Fault*'
	build/bench/longtx $(LONGTX_SECONDS) 10

# Drift repair (issue 9): bytes both ways and round trips to repair d differences in 100,000 rows,
# against provisioning the scope whole (bench/README.md).
build/bench/repair: bench/repair/repair_bench.cpp $(TEST_SUPPORT_SRCS) $(wildcard tests/server/*.hpp) \
		$(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/repair/repair_bench.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq

.PHONY: bench-repair
bench-repair: build/bench/repair build/bin/magic-sync-replica
	$(MAKE) install
	build/bench/repair 100000 1 10 100 1000

# The retry of kept uploads (issue 21): time per kept row from 2,000 to 100,000 kept rows, and
# commit-to-outbox latency of a catalog change while the relay worker retries 100,000 of them
# (bench/README.md).
build/bench/retry: bench/retry/retry_bench.cpp $(TEST_SUPPORT_SRCS) tests/server/pq.hpp \
		$(LIBPQ_HELPER)
	@mkdir -p $(dir $@)
	$(HOST_CXX) $(HOST_FLAGS) $(PQ_INCLUDES) $(PROTOCOL_INCLUDES) -Ireplica -Itests -o $@ \
		bench/retry/retry_bench.cpp $(TEST_SUPPORT_SRCS) build/protocol/conninfo.o -lpq

.PHONY: bench-retry
bench-retry: build/bench/retry
	$(MAKE) install
	build/bench/retry 3 3

# The simulation: `make sim SEED=n` replays one seed, `make sim SEEDS=200` runs seeds 1..200,
# `make conformance REPLICA='command'`: the conformance suite of docs/PROTOCOL.md against any
# replica implementation (the reference replica when REPLICA is not given).
REPLICA ?= build/bin/magic-sync-replica
.PHONY: conformance
conformance: build/tests/conformance build/bin/magic-sync-replica
	$(MAKE) install
	build/tests/conformance --replica '$(REPLICA)'

# `make sim` the seeds of `make test`; SIM_ARGS passes options (build/tests/sim --help).
SIM_TEST_SEEDS ?= $(shell sed -n 's/^sim_seeds="\(.*\)"/\1/p' scripts/run-tests.sh)
.PHONY: sim
sim: build/tests/sim build/bin/magic-sync-sender build/bin/magic-sync-replica
	$(MAKE) install
	$(if $(SEED),build/tests/sim --seed $(SEED) $(SIM_ARGS),$(if $(SEEDS),build/tests/sim --seeds $(SEEDS) $(SIM_ARGS),\
		for seed in $(SIM_TEST_SEEDS); do build/tests/sim --seed $$seed $(SIM_ARGS) || status=1; done; exit $${status:-0}))

# Last: its prerequisites name targets defined above.
test-builds: $(TEST_BUILDS)

# The headers each of our objects included when it was last built (DEPFLAGS).
-include $(shell find build -name '*.d' 2>/dev/null)
