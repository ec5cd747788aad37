// The relay worker against a real server: it starts by itself, relays without anyone calling
// anything, is woken by commits, waits (never crash-loops) when it cannot relay, hands over the
// lock to a standby, survives kill -9 and an immediate restart without losing a note, reloads
// its settings on SIGHUP, raises alarms and retries what was set aside on its timers.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "server/pq.hpp"
#include "support/cluster.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;

const char* const kShop = R"sql(
    CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL);
    SELECT sync.replicas('registers', 'registers', live => 'active');
    SELECT sync.catalog('products');
    INSERT INTO registers VALUES ('00000000-0000-0000-0000-000000000001');
)sql";

// How many times each product reached the register's outbox, as "id:count" pairs.
const char* const kDeliveries = R"sql(
    SELECT coalesce(string_agg(id || ':' || n, ',' ORDER BY id::int), '') FROM (
        SELECT r->'k'->>'id' AS id, count(*) AS n
        FROM sync.outbox o,
             jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c,
             jsonb_array_elements(c->'rows') r
        WHERE r->>'t' = 'public.products' GROUP BY 1) d
)sql";

std::string deliveries(Connection& db) { return db.value(kDeliveries); }

// What the relay holds, for a failure's message: notes, rows, members, chunks, outbox, set aside.
std::string relay_state(Connection& db) {
    return db.value(R"sql(
        SELECT format(E'notes %s\nrows %s\nmembers %s\nchunks %s\noutbox %s\nset aside %s\n',
            (SELECT count(*) FROM sync.note),
            (SELECT string_agg(format('%s/%s seq %s withheld %s', scope, key, seq, withheld), '; ')
             FROM sync.row),
            (SELECT string_agg(format('%s/%s sent %s', replica, scope, sent), '; ') FROM sync.member),
            (SELECT string_agg(format('%s %s..%s rows %s withheld %s', scope, from_seq, to_seq, rows,
                                      withheld), '; ') FROM sync.chunk),
            (SELECT string_agg(format('%s seq %s %s', replica, seq, kind), '; ') FROM sync.outbox),
            (SELECT string_agg(format('%s %s %s', kind, key, reason), '; ') FROM sync.set_aside)))sql");
}

int count_in_log(const Cluster& cluster, const std::string& text) {
    std::string log = cluster.log();
    int count = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
    return count;
}

// A cluster whose relay worker serves database `shop`, with the shop declared.
struct Shop {
    explicit Shop(std::vector<std::string> settings = {}) : cluster(with_database(settings)) {
        cluster.create_database("shop");
        cluster.sql("shop", kShop);
    }
    static std::vector<std::string> with_database(std::vector<std::string> settings) {
        settings.push_back("magic_sync.database = 'shop'");
        return settings;
    }
    std::string holder() { return cluster.sql("shop", "SELECT sync_internal.relay_lock_holder()"); }
    Cluster cluster;
};

TEST(Worker, RelaysByItself) {
    Shop shop;
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return !shop.holder().empty(); })) << "no relay took the lock\n"
                                                                    << shop.cluster.log();
    EXPECT_EQ(
        db.value("SELECT backend_type FROM pg_stat_activity WHERE pid = $1::int", {shop.holder()}),
        "magic_sync relay");
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; }, 1s))
        << "not relayed within a second: " << deliveries(db);
    // The backlog drains. (Not at once: a row committed while the first pass ran reaches the
    // register's first message, read after the notes were taken, and its note waits for the next
    // pass; under load the test saw it there.)
    EXPECT_TRUE(
        eventually([&] { return db.value("SELECT notes_backlog FROM sync.health") == "0"; }));
}

TEST(Worker, ACommitWakesIt) {
    // A ten-second poll would miss the deadline below: only the commit's wake-up can meet it.
    Shop shop({"magic_sync.idle = '10s'"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return deliveries(db).empty() && !shop.holder().empty(); }));
    // It settles into its ten-second wait on its latch (wait_event "Extension").
    ASSERT_TRUE(eventually([&] {
        return db.value(
                   "SELECT wait_event FROM pg_stat_activity"
                   " WHERE backend_type = 'magic_sync relay'") == "Extension";
    })) << shop.cluster.log();
    auto start = std::chrono::steady_clock::now();
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; }, 3s)) << shop.cluster.log();
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    RecordProperty("commit_to_outbox_ms", std::to_string(took.count()));
}

// An idle relay runs no pass: with nothing committed, nothing due, its last pass stays its last
// (it used to run one every magic_sync.idle, 100 ms here); a commit with work wakes it at once.
TEST(Worker, AnIdleRelayRunsNoPass) {
    Shop shop({"magic_sync.idle = 100"});
    Connection db(shop.cluster.conninfo("shop"));
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << shop.cluster.log();
    // The passes after it end: the relay waits on its latch, and still does, its last pass the
    // same, 300 ms later (half a second without a pass was not enough on a loaded machine: a
    // relay kept off the cores between two passes looked idle). A relay that ran a pass at every
    // tick of `idle` (100 ms) never gets there.
    const auto relay_waits = [&] {
        return db.value(
                   "SELECT state || ' ' || wait_event FROM pg_stat_activity"
                   " WHERE backend_type = 'magic_sync relay'") == "idle Extension";
    };
    std::string last;
    ASSERT_TRUE(eventually([&] {
        last = db.value("SELECT last_pass_at FROM sync.relay_state");
        if (!relay_waits()) return false;
        std::this_thread::sleep_for(300ms);
        return relay_waits() && db.value("SELECT last_pass_at FROM sync.relay_state") == last;
    })) << shop.cluster.log();
    // Two seconds, looked at every 100 ms: a relay that passed at every tick would show about
    // twenty passes. One is allowed: once, under load, a pass came 0.7 s after the relay was seen
    // idle (what woke it was not found; no timer is that short here).
    std::set<std::string> passes_seen;
    for (int look = 0; look < 20; ++look) {
        std::this_thread::sleep_for(100ms);
        const std::string now_last = db.value("SELECT last_pass_at FROM sync.relay_state");
        if (now_last != last) passes_seen.insert(now_last);
    }
    EXPECT_LE(passes_seen.size(), 1u) << shop.cluster.log();
    last = db.value("SELECT last_pass_at FROM sync.relay_state");
    db.query("INSERT INTO products VALUES (2, 'coffee')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1,2:1"; })) << shop.cluster.log();
    EXPECT_NE(db.value("SELECT last_pass_at FROM sync.relay_state"), last);
}

TEST(Worker, WaitsForTheExtensionWithoutCrashLooping) {
    Cluster cluster({"magic_sync.database = 'shop'", "magic_sync.idle = 100"});
    cluster.sql("postgres", "CREATE DATABASE shop");
    const std::string line = "the magic_sync extension is not installed in database \"shop\"";
    ASSERT_TRUE(eventually([&] { return count_in_log(cluster, line) == 1; })) << cluster.log();
    std::string pid = cluster.sql(
        "shop", "SELECT pid FROM pg_stat_activity WHERE backend_type = 'magic_sync relay'");
    std::this_thread::sleep_for(3s);
    EXPECT_EQ(count_in_log(cluster, line), 1) << "said more than once";
    EXPECT_EQ(
        cluster.sql("shop",
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'magic_sync relay'"),
        pid)
        << "the worker restarted";
    cluster.sql("shop", "CREATE EXTENSION magic_sync");
    cluster.sql("shop", kShop);
    Connection db(cluster.conninfo("shop"));
    db.query("INSERT INTO products VALUES (1, 'tea')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << cluster.log();
}

// A database named in magic_sync.database that does not exist yet, or is dropped: said once, not
// a FATAL every few seconds, and relayed as soon as it exists.
TEST(Worker, WaitsForItsDatabaseWithoutCrashLooping) {
    Cluster cluster({"magic_sync.database = 'shop'", "magic_sync.idle = 100"});
    const std::string missing =
        "magic_sync.database names database \"shop\", which does not exist; its relay starts "
        "once it is created (looking every second)";
    ASSERT_TRUE(eventually([&] { return count_in_log(cluster, missing) == 1; })) << cluster.log();
    std::this_thread::sleep_for(6s);
    EXPECT_EQ(count_in_log(cluster, missing), 1) << cluster.log();
    EXPECT_EQ(count_in_log(cluster, "FATAL"), 0) << cluster.log();
    EXPECT_EQ(cluster.sql("postgres",
                          "SELECT count(*) FROM pg_stat_activity"
                          " WHERE backend_type = 'magic_sync launcher' AND datname IS NULL"),
              "1");

    cluster.create_database("shop");
    cluster.sql("shop", kShop);
    Connection db(cluster.conninfo("shop"));
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << cluster.log();
    EXPECT_EQ(db.value("SELECT count(*) FROM pg_stat_activity"
                       " WHERE backend_type = 'magic_sync relay' AND datname = 'shop'"),
              "1");

    cluster.sql("postgres", "DROP DATABASE shop WITH (FORCE)");
    ASSERT_TRUE(eventually([&] { return count_in_log(cluster, missing) == 2; })) << cluster.log();
    std::this_thread::sleep_for(3s);
    EXPECT_EQ(count_in_log(cluster, missing), 2) << cluster.log();
    // The relay ended once, terminated by the drop; nothing tried to connect to it since.
    EXPECT_EQ(count_in_log(cluster, "background worker \"magic_sync relay\" (PID"), 1)
        << cluster.log();
    EXPECT_EQ(count_in_log(cluster, "FATAL:  database"), 0) << cluster.log();
}

// A launcher that ends and starts again finds the relay worker its predecessor left running and
// starts none beside it, then starts its own once that one ends.
TEST(Worker, ALauncherStartedAgainLeavesOneRelay) {
    Shop shop({"magic_sync.idle = 100"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return !shop.holder().empty(); })) << shop.cluster.log();
    const std::string left = shop.holder();
    const char* const launcher =
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'magic_sync launcher'";
    const char* const relays =
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'magic_sync relay'";
    std::string first = db.value(launcher);
    db.query("SELECT pg_terminate_backend($1::int, 10000)", {first});
    ASSERT_TRUE(eventually([&] {
        std::string now = db.value(launcher);
        return !now.empty() && now != first;
    })) << shop.cluster.log();
    std::this_thread::sleep_for(3s);
    EXPECT_EQ(db.value(relays), "1") << shop.cluster.log();
    EXPECT_EQ(shop.holder(), left);
    db.query("INSERT INTO products VALUES (1, 'tea')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << shop.cluster.log();

    db.query("SELECT pg_terminate_backend($1::int, 10000)", {left});
    ASSERT_TRUE(eventually([&] {
        std::string holder = shop.holder();
        return !holder.empty() && holder != left;
    })) << "the launcher did not start a relay of its own\n"
        << shop.cluster.log();
    EXPECT_EQ(db.value(relays), "1");
    db.query("INSERT INTO products VALUES (2, 'coffee')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1,2:1"; })) << deliveries(db);
}

TEST(Worker, WaitsForItsRoleAndTheTemporaryPrivilege) {
    Shop shop({"magic_sync.role = 'relay'", "magic_sync.idle = 100"});
    ASSERT_TRUE(eventually([&] {
        return count_in_log(shop.cluster,
                            "magic_sync.role names role \"relay\", which does not exist") == 1;
    })) << shop.cluster.log();
    shop.cluster.sql("shop", R"sql(
        CREATE ROLE relay;
        REVOKE TEMPORARY ON DATABASE shop FROM PUBLIC;
        GRANT USAGE ON SCHEMA sync, sync_internal TO relay;
        GRANT ALL ON ALL TABLES IN SCHEMA sync TO relay;
        GRANT ALL ON ALL SEQUENCES IN SCHEMA sync TO relay;
        GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA sync, sync_internal TO relay;
        GRANT SELECT ON registers, products TO relay;
    )sql");
    ASSERT_TRUE(eventually([&] {
        return count_in_log(shop.cluster,
                            "role \"relay\" (magic_sync.role) lacks the TEMPORARY privilege on "
                            "database \"shop\"") == 1;
    })) << shop.cluster.log();
    Connection db(shop.cluster.conninfo("shop"));
    db.query("INSERT INTO products VALUES (1, 'tea')");
    std::this_thread::sleep_for(1s);
    EXPECT_EQ(deliveries(db), "") << "relayed without the privilege";
    db.query("GRANT TEMPORARY ON DATABASE shop TO relay");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << shop.cluster.log();
    // The pass ran as the role: its temporary tables belong to it.
    EXPECT_EQ(db.value("SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
                       " WHERE relname LIKE 'magic_sync_%' AND relpersistence = 't'"),
              "relay");
}

TEST(Worker, AStandbyTakesOverWhenTheHolderIsTerminated) {
    Shop shop({"magic_sync.idle = 100"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return !shop.holder().empty(); }));
    std::string first = shop.holder();
    std::string second = db.value("SELECT sync.start_relay()");
    ASSERT_NE(second, first);
    ASSERT_TRUE(eventually([&] {
        return count_in_log(shop.cluster,
                            "standing by: the relay lock of database \"shop\" is "
                            "held by pid " +
                                first) >= 1;
    })) << shop.cluster.log();
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; }))
        << "deliveries " << deliveries(db) << "\n"
        << shop.cluster.log();

    db.query("SELECT pg_terminate_backend($1::int, 10000)", {first});
    ASSERT_TRUE(eventually([&] { return shop.holder() == second; }, 10s))
        << "the standby did not take over\n"
        << shop.cluster.log();
    db.query("INSERT INTO products VALUES (2, 'coffee')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1,2:1"; })) << deliveries(db);
}

TEST(Worker, KillMinus9OfTheHolderLosesNothing) {
    Shop shop({"magic_sync.idle = 100", "restart_after_crash = on"});
    Connection before(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return !shop.holder().empty(); }));
    before.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(before) == "1:1"; }));
    std::string holder = shop.holder();
    // Committed while the relay is being killed: must not be lost.
    before.query("INSERT INTO products VALUES (2, 'coffee')");
    ASSERT_EQ(kill(std::stoi(holder), SIGKILL), 0);
    std::unique_ptr<Connection> after;
    ASSERT_TRUE(eventually(
        [&] {
            // Asked through the connection itself: one made in the instant before the
            // postmaster ended every backend would be dead when the test used it.
            try {
                after = std::make_unique<Connection>(shop.cluster.conninfo("shop"));
                std::string now = after->value("SELECT sync_internal.relay_lock_holder()::text");
                return !now.empty() && now != holder;
            } catch (const std::exception&) {
                return false;
            }
        },
        30s))
        << shop.cluster.log();
    after->query("INSERT INTO products VALUES (3, 'cake')");
    EXPECT_TRUE(eventually([&] { return deliveries(*after) == "1:1,2:1,3:1"; }))
        << deliveries(*after) << "\n"
        << shop.cluster.log();
}

// A relay killed with kill -9 leaves its working tables (temporary, pg_temp_N.magic_sync_*) in the
// catalog after the restart; the relay that takes the lock next drops them and says so, instead
// of autovacuum dropping them one by one, each with a LOG line, whenever it comes to them (issue
// 37 item 6). Ten sessions are open while the first relay starts, so that it gets a temporary
// schema the next one does not take over (a session that does clears it itself).
TEST(Worker, TheNextRelayDropsTheWorkingTablesOfOneKilled) {
    Cluster cluster(
        {"magic_sync.idle = 100", "restart_after_crash = on", "magic_sync.database = 'shop'"});
    std::vector<std::unique_ptr<Connection>> others;
    for (int i = 0; i < 10; ++i)
        others.push_back(std::make_unique<Connection>(cluster.conninfo("postgres")));
    cluster.create_database("shop");
    cluster.sql("shop", kShop);
    Connection before(cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] {
        return before.value("SELECT count(*) FROM sync.replica") == "1";
    })) << cluster.log();
    const std::string schema = before.value(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = 'magic_sync_note'");
    ASSERT_FALSE(schema.empty());
    const std::string holder = before.value("SELECT sync_internal.relay_lock_holder()");
    const std::string left_behind =
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = '" +
        schema + "' AND c.relkind = 'r' AND c.relname LIKE 'magic\\_sync\\_%'";
    const std::string tables = before.value(left_behind);
    others.clear();
    ASSERT_EQ(kill(std::stoi(holder), SIGKILL), 0);
    std::string after;
    ASSERT_TRUE(eventually(
        [&] {
            try {
                Connection db(cluster.conninfo("shop"));
                const std::string now = db.value("SELECT sync_internal.relay_lock_holder()::text");
                after = db.value(left_behind);
                return !now.empty() && now != holder && after == "0";
            } catch (const std::exception&) {
                return false;
            }
        },
        30s))
        << schema << " still has " << after << " tables\n"
        << cluster.log();
    EXPECT_NE(cluster.log().find("LOG:  magic_sync relay: dropped " + tables +
                                 " working tables a relay left when its session ended (killed)"),
              std::string::npos)
        << cluster.log();
    EXPECT_EQ(cluster.log().find("dropping orphan temp table"), std::string::npos) << cluster.log();
}

TEST(Worker, AnImmediateRestartMidPassLosesNothing) {
    Shop shop(
        {"magic_sync.idle = 100", "magic_sync.notes_per_pass = 500", "magic_sync.window = 10000"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return !shop.holder().empty(); }));
    db.query("INSERT INTO products SELECT i, 'p' || i FROM generate_series(1, 500) i");
    ASSERT_TRUE(eventually([&] { return db.value("SELECT count(*) FROM sync.note") == "0"; }));
    // The rest of the backlog comes while a session keeps the relay from writing sync.row: the
    // stop then finds a pass part way through its work, whatever the machine's speed (polling for
    // "some planned, not all" lost the race once passes became fast).
    Connection blocker(shop.cluster.conninfo("shop"));
    blocker.query("BEGIN");
    blocker.query("LOCK TABLE sync.row IN EXCLUSIVE MODE");
    db.query("INSERT INTO products SELECT i, 'p' || i FROM generate_series(501, 20000) i");
    ASSERT_TRUE(eventually([&] {
        return db.value("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1::int",
                        {shop.holder()}) == "Lock";
    })) << "the relay never reached sync.row";
    EXPECT_EQ(db.value("SELECT count(*) FROM sync.row"), "500");
    shop.cluster.stop("immediate");
    shop.cluster.start();
    Connection again(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(
        eventually([&] { return again.value("SELECT count(*) FROM sync.note") == "0"; }, 60s));
    ASSERT_TRUE(eventually(
        [&] {
            return again.value(
                       "SELECT count(*) FROM sync.outbox WHERE NOT EXISTS ("
                       " SELECT FROM sync.member m JOIN sync.scope s ON s.id = m.scope"
                       " WHERE m.sent < s.head)") != "0" &&
                   again.value(
                       "SELECT bool_and(m.sent = s.head) FROM sync.member m"
                       " JOIN sync.scope s ON s.id = m.scope") == "t";
        },
        60s));
    // Every product reached the register exactly once.
    EXPECT_EQ(again.value("SELECT count(*) FROM sync.row WHERE NOT gone"), "20000");
    EXPECT_EQ(again.value(R"sql(
        SELECT count(*) FILTER (WHERE n = 1) || '/' || count(*) FROM (
            SELECT r->'k'->>'id' AS id, count(*) AS n
            FROM sync.outbox o,
                 jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c,
                 jsonb_array_elements(c->'rows') r
            GROUP BY 1) d
    )sql"),
              "20000/20000");
}

TEST(Worker, SighupPicksUpAChangedRowsPerMessage) {
    Shop shop({"magic_sync.idle = 100"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return !shop.holder().empty(); }));
    db.query("ALTER SYSTEM SET magic_sync.rows_per_message = 3");
    db.query("SELECT pg_reload_conf()");
    std::this_thread::sleep_for(1s);
    db.query("INSERT INTO products SELECT i, 'p' || i FROM generate_series(1, 10) i");
    ASSERT_TRUE(eventually([&] { return db.value("SELECT count(*) FROM sync.note") == "0"; }));
    ASSERT_TRUE(eventually([&] { return deliveries(db).size() > 0; }));
    ASSERT_TRUE(eventually([&] {
        return db.value("SELECT count(*) FROM sync.outbox WHERE cardinality(chunks) > 0") == "4";
    })) << "10 rows at 3 a message make 4 messages";
    EXPECT_EQ(db.value(R"sql(
        SELECT max(n) FROM (SELECT sum(jsonb_array_length(c->'rows')) AS n FROM sync.outbox o,
            jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c
            GROUP BY o.seq) m)sql"),
              "3");
}

TEST(Worker, ReprovisionsAReplicaThatRefusesOrDoesNotConfirm) {
    Shop shop({"magic_sync.idle = 100", "magic_sync.max_refusals = 3",
               "magic_sync.unconfirmed_after = '2s'"});
    Connection db(shop.cluster.conninfo("shop"));
    // An operator's pager, listening for the relay's alarms.
    Connection pager(shop.cluster.conninfo("shop"));
    pager.query("LISTEN magic_sync_alarm");
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; }));
    // A sender's refusals, the third of which wakes the relay for its alarm.
    for (int refusal = 0; refusal < 3; ++refusal)
        db.query(
            "SELECT sync.failed(o.replica, o.seq, false, 'HTTP 400: bad request') "
            "FROM sync.outbox o ORDER BY o.seq LIMIT 1");
    ASSERT_TRUE(eventually([&] { return db.value("SELECT gen FROM sync.replica") == "2"; }))
        << shop.cluster.log();
    EXPECT_EQ(
        count_in_log(shop.cluster,
                     "WARNING:  magic_sync relay: replica 00000000-0000-0000-0000-000000000001 "
                     "is provisioned again: its messages were refused 3 times (last: HTTP "
                     "400: bad request)"),
        1);
    // The same alarm, as a NOTIFY magic_sync_alarm with a JSON payload.
    const auto payload = await_payload(pager.raw(), "magic_sync_alarm", 10s);
    ASSERT_TRUE(payload) << "no NOTIFY magic_sync_alarm";
    EXPECT_EQ(std::regex_replace(*payload, std::regex(R"("at" : "[-0-9T:.+]+")"), R"("at" : "…")"),
              R"({"alarm" : "provisioned_again", "level" : "WARNING", )"
              R"("replica" : "00000000-0000-0000-0000-000000000001", )"
              R"("detail" : "replica 00000000-0000-0000-0000-000000000001 is provisioned again: )"
              R"x(its messages were refused 3 times (last: HTTP 400: bad request)", "at" : "…"})x");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << "provisioned again";
    db.query("SELECT sync.sent(o.replica, o.seq) FROM sync.outbox o");
    ASSERT_TRUE(eventually([&] { return db.value("SELECT gen FROM sync.replica") == "3"; }, 10s))
        << shop.cluster.log();
    EXPECT_EQ(count_in_log(shop.cluster,
                           "is provisioned again: it left messages unconfirmed for "
                           "more than 00:00:02"),
              1);
}

TEST(Worker, RetriesWhatWasSetAsideAndReportsIt) {
    Shop shop({"magic_sync.idle = 100", "magic_sync.bytes_per_message = 400",
               "magic_sync.window = 1000", "magic_sync.retry_every = '2s'",
               "magic_sync.report_every = '1s'"});
    Connection db(shop.cluster.conninfo("shop"));
    Connection pager(shop.cluster.conninfo("shop"));
    pager.query("LISTEN magic_sync_alarm");
    db.query("INSERT INTO products VALUES (1, repeat('x', 1000))");
    ASSERT_TRUE(eventually([&] {
        return db.value("SELECT count(*) FROM sync.set_aside WHERE kind = 'row'") == "1";
    })) << relay_state(db)
        << shop.cluster.log();
    ASSERT_TRUE(eventually([&] {
        return count_in_log(
                   shop.cluster,
                   "set aside: 1 rows that could not be sent (the first because too big: ") >= 1;
    })) << shop.cluster.log();
    // Raised as an alarm too: the line the relay logs, as a NOTIFY.
    const auto payload = await_payload(pager.raw(), "magic_sync_alarm", 10s);
    ASSERT_TRUE(payload) << "no NOTIFY magic_sync_alarm";
    EXPECT_EQ(
        payload->substr(0, 144),
        R"({"alarm" : "set_aside", "level" : "WARNING", "replica" : null, )"
        R"("detail" : "set aside: 1 rows that could not be sent (the first because too big: )");
    // A deploy raises the limit: the next retry sends the row.
    db.query("ALTER SYSTEM SET magic_sync.bytes_per_message = '64kB'");
    db.query("SELECT pg_reload_conf()");
    ASSERT_TRUE(eventually([&] { return deliveries(db) == "1:1"; }, 10s)) << shop.cluster.log();
    EXPECT_EQ(db.value("SELECT count(*) FROM sync.set_aside"), "0");
}

// A kept upload whose retry fails is kept with that failure as its reason, and the relay goes
// on: here a message kept whole for its size which, once the limit is back, speaks a later
// protocol version (an ERROR in sync.receive).
TEST(Worker, AKeptUploadWhoseRetryFailsDoesNotStopTheRelay) {
    Shop shop({"magic_sync.idle = 100", "magic_sync.retry_every = '1s'"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return db.value("SELECT count(*) FROM sync.replica") == "1"; }))
        << shop.cluster.log();
    db.query("ALTER SYSTEM SET magic_sync.max_upload_bytes = 2048");
    db.query("SELECT pg_reload_conf()");
    ASSERT_TRUE(eventually([&] {
        Connection route(shop.cluster.conninfo("shop"));
        return route.value("SHOW magic_sync.max_upload_bytes") == "2kB";
    }));
    Connection route(shop.cluster.conninfo("shop"));
    EXPECT_EQ(route.value("SELECT sync.receive('00000000-0000-0000-0000-000000000001', convert_to("
                          "'{\"v\":3,\"id\":\"10000000-0000-0000-0000-000000000001\",\"rows\":"
                          "[{\"t\":\"public.products\",\"r\":{\"id\":1,\"name\":\"' ||"
                          " repeat('x', 3000) || '\"}}]}', 'UTF8'))"),
              "kept");
    db.query("ALTER SYSTEM RESET magic_sync.max_upload_bytes");
    db.query("SELECT pg_reload_conf()");
    ASSERT_TRUE(eventually([&] {
        return db.value("SELECT reason FROM sync.set_aside WHERE kind = 'upload'") ==
               "upload: message speaks protocol version 3; this build speaks up to version 2";
    })) << shop.cluster.log();
    db.query("INSERT INTO products VALUES (2, 'tea')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "2:1"; })) << shop.cluster.log();
}

// A kept upload is tried again within seconds of what may cure it, not after magic_sync.retry_every
// (an hour here): a declaration (sync.record) for a row of a table not declared yet, then a row
// inserted into the table its foreign key references, while its backoff still runs. And a retry
// asked for by hand while the worker runs is the worker's to do, not an error (issue 37 item 4:
// the fix waited an hour, and sync.retry_set_aside() failed on the relay lock).
TEST(Worker, AKeptUploadIsTriedAgainWithinSecondsOfWhatMayCureIt) {
    Shop shop({"magic_sync.idle = 100"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return db.value("SELECT count(*) FROM sync.replica") == "1"; }))
        << shop.cluster.log();
    db.query("CREATE TABLE sites (id int PRIMARY KEY)");
    db.query("CREATE TABLE visits (id int PRIMARY KEY, site int NOT NULL REFERENCES sites)");
    const auto upload = [&](const std::string& id, const std::string& row) {
        return db.value(
            "SELECT sync.receive('00000000-0000-0000-0000-000000000001', convert_to("
            "'{\"v\":1,\"id\":\"" +
            id + "\",\"rows\":[{\"t\":\"public.visits\",\"r\":" + row + "}]}', 'UTF8'))");
    };
    const auto kept = [&] {
        return db.value(
            "SELECT coalesce(string_agg(format('%s tries %s', key, tries), '; ' ORDER BY id), "
            "'none') FROM sync.set_aside WHERE kind = 'upload'");
    };
    EXPECT_EQ(upload("10000000-0000-0000-0000-000000000001", "{\"id\":1,\"site\":7}"), "filed");
    ASSERT_EQ(db.value("SELECT reason FROM sync.set_aside WHERE kind = 'upload'"),
              "table public.visits does not sync: uploads are filed only into tables declared "
              "with sync.record() or sync.both()");
    db.query("SELECT sync.record('visits')");
    // Tried again under the declaration: now it waits for site 7, backed off an hour.
    ASSERT_TRUE(eventually([&] { return kept() == "{\"id\": 1} tries 2"; }, 20s))
        << kept() << "\n"
        << shop.cluster.log();
    EXPECT_EQ(db.value("SELECT next_try_at > now() + interval '50 minutes' FROM sync.set_aside"),
              "t");
    db.query("INSERT INTO sites VALUES (7)");
    EXPECT_TRUE(eventually([&] { return kept() == "none"; }, 20s)) << kept() << "\n"
                                                                   << shop.cluster.log();
    EXPECT_EQ(db.value("SELECT string_agg(id || ' at ' || site, ', ') FROM visits"), "1 at 7");

    // By hand while the worker runs: the worker is asked, and does it.
    EXPECT_EQ(upload("10000000-0000-0000-0000-000000000002", "{\"id\":2,\"site\":8}"), "filed");
    ASSERT_TRUE(eventually([&] { return kept() == "{\"id\": 2} tries 2"; }, 20s)) << kept();
    EXPECT_EQ(db.value("SELECT string_agg(level || ': ' || line, E'\\n') FROM "
                       "sync.retry_set_aside()"),
              "LOG: the relay (pid " + shop.holder() +
                  ") tries again what was set aside and every kept upload as soon as this "
                  "commits; its log says what came of it");
    EXPECT_TRUE(eventually([&] { return kept() == "{\"id\": 2} tries 3"; }, 20s)) << kept();
}

// A pass that fails again and again (a trigger refuses every message the relay writes) is tried
// again backed off, doubling from magic_sync.idle, not at every idle tick, and said once per try
// with a count; the error itself is reported once. Once a pass succeeds the back-off ends and the
// log says so (issue 37: it used to try and log five times a second).
TEST(Worker, APersistentErrorIsTriedAgainBackedOff) {
    Shop shop({"magic_sync.idle = 100"});
    Connection db(shop.cluster.conninfo("shop"));
    ASSERT_TRUE(eventually([&] { return db.value("SELECT count(*) FROM sync.replica") == "1"; }))
        << shop.cluster.log();
    db.query(
        "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE "
        "EXCEPTION 'injected: no message may be written'; END $$");
    db.query(
        "CREATE TRIGGER refuse BEFORE INSERT ON sync.outbox FOR EACH STATEMENT EXECUTE FUNCTION "
        "public.refuse()");
    db.query("INSERT INTO products VALUES (1, 'tea')");
    ASSERT_TRUE(eventually([&] {
        return shop.cluster.log().find("failed 4 times in a row") != std::string::npos;
    })) << shop.cluster.log();
    std::this_thread::sleep_for(1s);
    const std::string log = shop.cluster.log();
    const auto count = [&](const std::string& what) {
        size_t n = 0;
        for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
        return n;
    };
    // Four tries take at least 0.1 + 0.2 + 0.4 s; a second more holds at most two more (0.8, 1.6).
    EXPECT_EQ(count("ERROR:  injected: no message may be written"), 1u) << log;
    EXPECT_LE(count("times in a row"), 6u) << log;
    EXPECT_NE(log.find("magic_sync relay: the pass failed 2 times in a row (the last: injected: no "
                       "message may be written); next try in 200 ms"),
              std::string::npos)
        << log;
    db.query("DROP TRIGGER refuse ON sync.outbox");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1"; })) << shop.cluster.log();
    EXPECT_TRUE(eventually([&] {
        return shop.cluster.log().find("magic_sync relay: relaying again after ") !=
               std::string::npos;
    })) << shop.cluster.log();
}

TEST(Relay, CallSyncRelayRelaysUntilCancelled) {
    Cluster cluster({"magic_sync.database = ''"});
    cluster.create_database("shop");
    cluster.sql("shop", kShop);
    Connection relay(cluster.conninfo("shop"));
    Connection db(cluster.conninfo("shop"));
    EXPECT_THROW(db.query("BEGIN; CALL sync.relay(); COMMIT"), std::runtime_error);
    db.query("ROLLBACK");
    ASSERT_EQ(PQsendQuery(relay.raw(), "CALL sync.relay()"), 1);
    ASSERT_TRUE(
        eventually([&] { return db.value("SELECT sync_internal.relay_lock_holder()") != ""; }));
    db.query("INSERT INTO products VALUES (1, 'tea')");
    EXPECT_TRUE(eventually([&] { return deliveries(db) == "1:1"; }));
    PGcancel* cancel = PQgetCancel(relay.raw());
    char error[256];
    ASSERT_EQ(PQcancel(cancel, error, sizeof error), 1);
    PQfreeCancel(cancel);
    PGresult* result = PQgetResult(relay.raw());
    EXPECT_STREQ(PQresultErrorField(result, PG_DIAG_SQLSTATE), "57014");
    PQclear(result);
    while ((result = PQgetResult(relay.raw())) != nullptr) PQclear(result);
}

TEST(Relay, ThroughPgBouncerInTransactionModeAPassIsRefused) {
    Cluster cluster({"magic_sync.database = ''"});
    cluster.create_database("shop");
    cluster.sql("shop", kShop);
    int port = free_port();
    std::string dir = cluster.directory() + "/pgbouncer";
    run(as_postgres("mkdir -p " + dir));
    std::ofstream(dir + "/users.txt") << "\"postgres\" \"\"\n";
    std::ofstream(dir + "/pgbouncer.ini")
        << "[databases]\nshop = host=127.0.0.1 port=" << cluster.port() << " dbname=shop\n"
        << "[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = " << port
        << "\nauth_type = trust\nauth_file = " << dir << "/users.txt\npool_mode = transaction\n"
        << "default_pool_size = 2\nunix_socket_dir =\nlogfile = " << dir << "/pgbouncer.log\n"
        << "pidfile = " << dir << "/pgbouncer.pid\n";
    run("chown -R postgres: " + dir + " 2>/dev/null");
    std::string output;
    ASSERT_EQ(run(as_postgres("pgbouncer -d " + dir + "/pgbouncer.ini"), &output), 0) << output;
    struct Stop {
        std::string pidfile;
        ~Stop() { run("kill $(cat " + pidfile + ") 2>/dev/null"); }
    } stop{dir + "/pgbouncer.pid"};
    std::string through =
        "host=127.0.0.1 port=" + std::to_string(port) + " user=postgres dbname=shop";
    ASSERT_TRUE(eventually(
        [&] {
            try {
                Connection probe(through);
                return true;
            } catch (const std::exception&) {
                return false;
            }
        },
        10s));
    Connection first(through);
    Connection second(through);
    // The first client's transaction takes the lock on one server connection and keeps it busy;
    // the second client's pass runs on the other one.
    first.query("BEGIN");
    first.query("SELECT sync.pass()");
    std::string holder = first.value("SELECT pg_backend_pid()");
    try {
        second.query("SELECT sync.pass()");
        FAIL() << "a pass ran on a session that does not hold the lock";
    } catch (const std::runtime_error& e) {
        std::string message = e.what();
        EXPECT_NE(message.find("the magic_sync relay lock is held by another session (pid " +
                               holder + ")"),
                  std::string::npos)
            << message;
        EXPECT_NE(message.find("pooler in transaction mode"), std::string::npos) << message;
    }
    first.query("COMMIT");
}

}  // namespace
}  // namespace magic_sync::test
