// End to end with every real part: PostgreSQL with magic_sync preloaded (the relay worker running
// by itself), magic-sync-sender, and magic-sync-replica processes, over http (through a router of
// the test's own, which can cut a replica's line) and over NATS JetStream. After every scenario
// each live replica's content is compared with what the server says it should hold, row by row
// (table, key and version hash), and the server's state with its tables.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "protocol/messages.hpp"
#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"
#include "server/router.hpp"
#include "support/cluster.hpp"
#include "support/nats_server.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;

// What syncs and how: made with the shop, and again after the extension is.
const char* const kDeclarations = R"sql(
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.products');
    SELECT sync.catalog('shop.prices', "to" => 'store_id = store_id');
    SELECT sync.record('shop.sales');
    SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted', 'closed_at']);
    SELECT sync.both('shop.shelves', "to" => 'store_id = store_id', replica_columns => ARRAY['stock']);
)sql";

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.stores (id int PRIMARY KEY, name text NOT NULL);
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, store_id int NOT NULL REFERENCES shop.stores,
                                 active boolean NOT NULL DEFAULT true);
    CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
    CREATE TABLE shop.prices (store_id int, product_id int, price numeric(10, 2) NOT NULL,
                              PRIMARY KEY (store_id, product_id));
    CREATE TABLE shop.sales (id uuid PRIMARY KEY, register_id uuid NOT NULL, product_id int NOT NULL,
                             qty int NOT NULL);
    CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, counted numeric(10, 2),
                               closed_at timestamptz, opened_by text);
    CREATE TABLE shop.shelves (store_id int, product_id int, stock int NOT NULL DEFAULT 0, label text,
                               PRIMARY KEY (store_id, product_id));
    INSERT INTO shop.stores VALUES (1, 'north'), (2, 'south');
    INSERT INTO shop.products SELECT i, 'product ' || i, i FROM generate_series(1, 30) i;
    INSERT INTO shop.prices SELECT s, p, p + s / 10.0 FROM generate_series(1, 2) s, generate_series(1, 10) p;
    INSERT INTO shop.shelves SELECT s, p, 10, 'shelf ' || p FROM generate_series(1, 2) s, generate_series(1, 5) p;
)sql";

// Rows of the synced tables whose planned version is not their current content (should be none
// once the relay caught up).
const char* const kServerDrift = R"sql(
    SELECT (SELECT count(*) FROM shop.products t FULL JOIN (SELECT r.* FROM sync.row r JOIN sync.codec c
                ON c.id = r.codec WHERE c.table_name = 'shop.products' AND NOT r.gone) r
            ON r.key = jsonb_build_object('id', t.id)
            WHERE r.hash IS DISTINCT FROM sha256(convert_to(sync_internal.canonical(to_jsonb(t)), 'UTF8')))
         + (SELECT count(*) FROM shop.prices t FULL JOIN (SELECT r.* FROM sync.row r JOIN sync.codec c
                ON c.id = r.codec WHERE c.table_name = 'shop.prices' AND NOT r.gone) r
            ON r.key = jsonb_build_object('store_id', t.store_id, 'product_id', t.product_id)
            WHERE r.hash IS DISTINCT FROM sha256(convert_to(sync_internal.canonical(to_jsonb(t)), 'UTF8')))
)sql";

size_t line_count(const std::string& text) {
    return text.empty() ? 0 : std::count(text.begin(), text.end(), '\n') + 1;
}

// The rows a down message carries (in chunks or a repair).
size_t rows_in(const std::string& message) {
    const protocol::DownMessage decoded = protocol::decode_down(message);
    size_t rows = 0;
    if (const auto* chunked = std::get_if<protocol::RowsMessage>(&decoded)) {
        for (const protocol::Chunk& chunk : chunked->chunks) rows += chunk.rows.size();
    } else if (const auto* repair = std::get_if<protocol::RepairMessage>(&decoded)) {
        rows += repair->rows.size();
    }
    return rows;
}

using Replica = ReplicaProcess;

class EndToEnd : public ::testing::Test {
  protected:
    void SetUp() override {
        deployment_ = std::make_unique<Deployment>(
            "e2e",
            std::vector<std::string>{"magic_sync.idle = 100", "magic_sync.backoff = 200",
                                     "magic_sync.backoff_max = 1000",
                                     "magic_sync.rows_per_message = 50"},
            "shop", std::string(kShop) + kDeclarations);
    }
    void TearDown() override {
        replicas_.clear();
        nats_.reset();
        deployment_.reset();
    }

    Connection& db() { return deployment_->db(); }
    Cluster& cluster() { return deployment_->cluster(); }
    const std::string& directory() const { return deployment_->directory(); }
    std::unique_ptr<Process>& sender() { return deployment_->sender(); }

    // A new register of `store`; its replica process is started by start_replica.
    Replica& add_register(int n, int store) {
        db().query("INSERT INTO shop.registers (id, store_id) VALUES ($1::uuid, $2::int)",
                   {replica_id(n), std::to_string(store)});
        return replicas_[n] = deployment_->replica(replica_id(n));
    }

    void start_http_replica(int n) { deployment_->start_http_replica(replicas_[n]); }

    void start_nats_replica(int n) { deployment_->start_nats_replica(replicas_[n], nats_url_); }

    void start_http_sender() { deployment_->start_http_sender({"--send-timeout", "5"}); }

    void start_nats() {
        int port = free_port();
        nats_url_ = "nats://127.0.0.1:" + std::to_string(port);
        nats_ = std::make_unique<Process>(
            std::vector<std::string>{nats_server_program(), "-js", "-a", "127.0.0.1", "-p",
                                     std::to_string(port), "-sd", directory() + "/nats"},
            directory() + "/nats.log");
        ASSERT_TRUE(eventually(
            [&] {
                return run("bash -c 'exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(port) +
                           "' 2>/dev/null") == 0;
            },
            10s))
            << nats_->log();
    }

    void start_nats_sender(const std::vector<std::string>& options = {}) {
        deployment_->start_nats_sender(nats_url_, options);
    }

    // What the replica holds, in the form of kExpectedHoldings.
    std::string held(const Replica& replica) { return held_by(replica.id, replica.db); }

    std::string expected(const Replica& replica) {
        return db().value(kExpectedHoldings, {replica.id});
    }

    bool live(const Replica& replica) {
        return db().value("SELECT live FROM sync.replica WHERE id = $1::uuid", {replica.id}) == "t";
    }

    // Every live replica holds exactly what the server says, and the server's state is its
    // tables'; `skip` names a replica not to wait for.
    void converge(const std::string& scenario, int skip = 0) {
        std::cerr << "converging: " << scenario << std::endl;
        bool converged = eventually(
            [&] {
                try {
                    if (db().value("SELECT count(*) FROM sync.note") != "0") return false;
                    if (db().value(kServerDrift) != "0") return false;
                    for (auto& [n, replica] : replicas_) {
                        if (n == skip || !live(replica)) continue;
                        if (held(replica) != expected(replica)) return false;
                    }
                    return true;
                } catch (const std::exception&) {
                    return false;  // the server is restarting
                }
            },
            60s);
        if (converged) return;
        std::string report = "not converged after " + scenario + "\n";
        for (auto& [n, replica] : replicas_) {
            if (n == skip) continue;
            report += "replica " + replica.id + (live(replica) ? "" : " (not live)") +
                      "\n  expected:\n" + expected(replica) + "\n  held:\n" + held(replica) + "\n";
        }
        report += "server drift: " + db().value(kServerDrift) + "\n";
        report += "sender log:\n" + (sender() ? sender()->log() : "") + "\n";
        FAIL() << report << "server log:\n" << cluster().log();
    }

    void write_local(int n, const std::string& table, const std::string& json,
                     const std::string& key = "") {
        Replica& replica = replicas_[n];
        std::string output;
        std::string command = "build/bin/magic-sync-replica --id " + replica.id + " --db " +
                              replica.db + " write " + table + " '" + json + "'";
        if (!key.empty()) command += " --key " + key;
        ASSERT_EQ(run(command, &output), 0) << output;
    }

    // Waits until the relay runs again after a crash, on a new backend.
    void await_relay_other_than(const std::string& pid) {
        ASSERT_TRUE(eventually(
            [&] {
                try {
                    std::string holder = db().value("SELECT sync_internal.relay_lock_holder()");
                    return !holder.empty() && holder != pid;
                } catch (const std::exception&) {
                    return false;
                }
            },
            60s))
            << cluster().log();
    }

    std::unique_ptr<Deployment> deployment_;
    std::unique_ptr<Process> nats_;
    std::string nats_url_;
    std::map<int, Replica> replicas_;
};

TEST_F(EndToEnd, OverHttpThroughChangesMovesUploadsCutsAndKills) {
    for (int n : {1, 2, 3}) add_register(n, n <= 2 ? 1 : 2);
    db().query("INSERT INTO shop.drawers VALUES ($1::uuid, 100.00, NULL, 'ann')", {replica_id(1)});
    start_http_sender();
    for (int n : {1, 2, 3}) start_http_replica(n);
    converge("provisioning: catalog to all, prices to each store, a drawer to its register");
    // 30 products, 10 prices and 5 shelves of its store, its drawer.
    EXPECT_EQ(line_count(expected(replicas_[1])), 46);
    EXPECT_EQ(held(replicas_[3]).find("shop.drawers"), std::string::npos);

    db().query("UPDATE shop.products SET price = price * 2 WHERE id <= 10");
    db().query("DELETE FROM shop.products WHERE id = 30");
    db().query("INSERT INTO shop.prices VALUES (2, 11, 5.55)");
    converge("catalog and store changes");

    add_register(4, 2);
    start_http_replica(4);
    converge("a register joining late");

    db().query("UPDATE shop.registers SET active = false WHERE id = $1::uuid", {replica_id(2)});
    db().query("UPDATE shop.products SET name = 'renamed' WHERE id = 1");
    converge("a register leaving");
    db().query("UPDATE shop.registers SET active = true WHERE id = $1::uuid", {replica_id(2)});
    converge("the register coming back");
    EXPECT_EQ(db().value("SELECT gen FROM sync.replica WHERE id = $1::uuid", {replica_id(2)}), "2");

    db().query("UPDATE shop.registers SET store_id = 1 WHERE id = $1::uuid", {replica_id(3)});
    converge("a register moved to another store");

    // Uploads: a sale (record), the register's own drawer and a shelf of its store (both).
    const std::string sale = "10000000-0000-0000-0000-000000000001";
    write_local(1, "shop.sales",
                R"({"id":")" + sale + R"(","register_id":")" + replica_id(1) +
                    R"(","product_id":3,"qty":2})");
    write_local(1, "shop.drawers",
                R"({"register_id":")" + replica_id(1) + R"(","counted":123.45,"opened_by":"eve"})",
                "register_id");
    write_local(1, "shop.shelves", R"({"store_id":1,"product_id":2,"stock":7,"label":"no"})",
                "store_id,product_id");
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT count(*) FROM shop.sales WHERE id = $1::uuid", {sale}) == "1" &&
               db().value("SELECT counted FROM shop.drawers WHERE register_id = $1::uuid",
                          {replica_id(1)}) == "123.45" &&
               db().value("SELECT stock FROM shop.shelves WHERE store_id = 1 AND product_id = 2") ==
                   "7";
    })) << replicas_[1].process->log();
    // Only the replica's columns were taken.
    EXPECT_EQ(db().value("SELECT opened_by FROM shop.drawers WHERE register_id = $1::uuid",
                         {replica_id(1)}),
              "ann");
    EXPECT_EQ(db().value("SELECT label FROM shop.shelves WHERE store_id = 1 AND product_id = 2"),
              "shelf 2");
    converge("uploads reaching the server and the other registers of the store");

    // A count that the server files exactly as the register holds it then: not sent back to the
    // register (its drawer's scope has no other member); the register holds the version the
    // server has, by the answer alone.
    write_local(1, "shop.drawers", R"({"register_id":")" + replica_id(1) + R"(","counted":150.00})",
                "register_id");
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT counted FROM shop.drawers WHERE register_id = $1::uuid",
                          {replica_id(1)}) == "150.00";
    })) << replicas_[1].process->log();
    converge("a count filed as the register holds it");
    EXPECT_EQ(db().value("SELECT r.echo_of FROM sync.row r JOIN sync.codec c ON c.id = r.codec"
                         " WHERE c.table_name = 'shop.drawers' AND r.key->>'register_id' = $1",
                         {replica_id(1)}),
              replica_id(1))
        << "the relay did not take the count for the register's own, as it holds it";

    // A cut line: register 4 backs off while the others carry on; healed, it catches up.
    deployment_->router().cut(replica_id(4), true);
    db().query("UPDATE shop.products SET price = price + 1 WHERE id BETWEEN 11 AND 20");
    converge("changes while register 4's line is cut", 4);
    EXPECT_TRUE(eventually([&] {
        return db().value(
                   "SELECT last_error IS NOT NULL FROM sync.delivery WHERE replica = $1::uuid",
                   {replica_id(4)}) == "t";
    }));
    deployment_->router().cut(replica_id(4), false);
    converge("the line healed");

    // kill -9 of the sender in the middle of traffic, then a new one.
    db().query("UPDATE shop.products SET price = price + 0.01");
    sender()->stop(SIGKILL);
    start_http_sender();
    converge("kill -9 of the sender");

    // kill -9 of a replica in the middle of traffic, then restarted on the same file.
    db().query("UPDATE shop.prices SET price = price + 0.02");
    replicas_[1].process->stop(SIGKILL);
    replicas_[1].process->start();
    converge("kill -9 of a replica");

    // kill -9 of the relay's backend: the postmaster restarts, the worker comes back.
    db().query("UPDATE shop.products SET price = price + 0.03");
    std::string relay = db().value("SELECT sync_internal.relay_lock_holder()");
    ASSERT_FALSE(relay.empty());
    kill(std::stoi(relay), SIGKILL);
    await_relay_other_than(relay);
    converge("kill -9 of the relay's backend");

    // An immediate restart of PostgreSQL itself in the middle of traffic.
    db().query("UPDATE shop.products SET price = price + 0.04");
    relay = db().value("SELECT sync_internal.relay_lock_holder()");
    cluster().stop("immediate");
    cluster().start();
    await_relay_other_than(relay);
    db().query("UPDATE shop.products SET name = name || '.' WHERE id <= 5");
    converge("an immediate restart of PostgreSQL");

    // Nothing was filed twice.
    EXPECT_EQ(db().value("SELECT count(*) FROM shop.sales"), "1");
    EXPECT_EQ(db().value("SELECT count(*) FROM sync.upload WHERE kept <> '[]'"), "0");
}

// The database's own operations break its history: the extension dropped and created again, the
// database dumped and restored. The relay starts again at generation 1, seq 1; replicas that
// applied later seqs of the old history take the new one's messages as they come (the origin in
// their header changed) instead of skipping them as applied, and hold what the tables say.
TEST_F(EndToEnd, AfterTheExtensionIsMadeAgainAndTheDatabaseRestoredEveryReplicaConverges) {
    for (int n : {1, 2}) add_register(n, n);
    start_http_sender();
    for (int n : {1, 2}) start_http_replica(n);
    converge("provisioning");
    for (int i = 1; i <= 6; ++i) {
        db().query("UPDATE shop.products SET price = price + 1 WHERE id = $1::int",
                   {std::to_string(i)});
        converge("change " + std::to_string(i));
    }
    const std::string seqs = "SELECT string_agg(next_seq::text, ',' ORDER BY id) FROM sync.replica";
    EXPECT_EQ(db().value(seqs), "8,8") << "the replicas are at 1.7";

    sender()->stop(SIGTERM);
    cluster().sql("shop", "DROP EXTENSION magic_sync CASCADE; CREATE EXTENSION magic_sync;");
    cluster().sql("shop", kDeclarations);
    db().query("UPDATE shop.products SET name = 'after the extension' WHERE id <= 3");
    start_http_sender();
    converge("the extension dropped and created again");
    EXPECT_LT(std::stoi(db().value("SELECT max(next_seq) FROM sync.replica")), 8)
        << "the new history did not start again";

    sender()->stop(SIGTERM);
    const std::string dump = directory() + "/shop.dump";
    const std::string bin = pg_bindir();
    std::string output;
    ASSERT_EQ(
        run(bin + "/pg_dump -Fc -f " + dump + " -d '" + deployment_->conninfo() + "'", &output), 0)
        << output;
    cluster().sql("postgres", "DROP DATABASE shop WITH (FORCE)");
    cluster().sql("postgres", "CREATE DATABASE shop TEMPLATE template0");
    ASSERT_EQ(run(bin + "/pg_restore -d '" + deployment_->conninfo() + "' " + dump, &output), 0)
        << output;
    deployment_->reconnect();
    db().query("UPDATE shop.products SET name = 'after the restore' WHERE id >= 28");
    // The devices hold what was dumped: they prove it, and are sent only what differs (the three
    // products changed since), not every row again.
    std::mutex mutex;
    size_t rows_sent = 0;
    deployment_->router().observe([&](const std::string&, const std::string& message) {
        std::lock_guard<std::mutex> lock(mutex);
        rows_sent += rows_in(message);
    });
    start_http_sender();
    converge("the database dumped, dropped and restored");
    deployment_->router().observe(nullptr);
    EXPECT_LT(rows_sent, line_count(expected(replicas_[1])))
        << "a device that held what was dumped was provisioned whole again";
    EXPECT_EQ(db().value("SELECT count(*) FROM shop.sales"), "0");
}

// What a device must still hold and have filed after PostgreSQL itself moves on: a streaming
// standby promoted after the primary stops, and a base backup recovered to an earlier point.
class History : public EndToEnd {
  protected:
    // A section of `magic-sync-replica show` for replica `n`: "" when it has none.
    std::string shown(int n, const std::string& heading) {
        std::string output;
        run(deployment_->replica_cli(replicas_[n]) + " show", &output);
        const size_t at = output.find(heading);
        if (at == std::string::npos) return "";
        return output.substr(at, output.find("\n\n", at) - at);
    }
    // The replica's local writes not filed yet.
    std::string unfiled(int n) { return shown(n, "local writes not filed yet"); }
    // The writes of the replica's uploads the server kept.
    std::string kept(int n) { return shown(n, "kept by the server (not filed)"); }

    // A sale written on register `n`'s device; returns its id.
    std::string sell(int n, int number) {
        char id[40];
        snprintf(id, sizeof id, "20000000-0000-0000-0000-%012d", number);
        write_local(n, "shop.sales",
                    R"({"id":")" + std::string(id) + R"(","register_id":")" + replica_id(n) +
                        R"(","product_id":3,"qty":1})");
        return id;
    }
};

// A standby named in synchronous_standby_names, while the database commits locally
// (synchronous_commit = local for every session: the standby is asynchronous for the data). The
// standby stops, the primary goes on taking changes and uploads, then stops at once; the standby
// is promoted in its place. No device was told of anything the standby did not have: the sender's
// leases wait for it, so the filed answer of an upload the standby lacks never left, the device
// offers the upload again to the promoted standby, and it is filed there once.
TEST_F(History, AStandbyPromotedAfterThePrimaryStopsHoldsWhatDevicesWereTold) {
    cluster().sql("postgres", "ALTER SYSTEM SET synchronous_commit = local");
    cluster().sql("postgres", "SELECT pg_reload_conf()");
    for (int n : {1, 2}) add_register(n, n);
    start_http_sender();
    for (int n : {1, 2}) start_http_replica(n);
    converge("provisioning");

    const std::string base = make_postgres_directory("magic_sync_standby");
    cluster().base_backup(base + "/data", true);
    auto standby = Cluster::from_backup(base + "/data", {"cluster_name = 'magic_sync_standby'"});
    cluster().sql("postgres", "ALTER SYSTEM SET synchronous_standby_names = 'magic_sync_standby'");
    cluster().sql("postgres", "SELECT pg_reload_conf()");
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") ==
               "1";
    }));
    db().query("UPDATE shop.products SET price = price + 1 WHERE id <= 10");
    const std::string first = sell(1, 1);
    ASSERT_TRUE(eventually([&] { return unfiled(1).empty(); })) << unfiled(1);
    converge("changes and an upload with the standby streaming");

    // The standby stops; the primary files an upload and takes changes.
    standby->stop("fast");
    const std::string second = sell(2, 2);
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT count(*) FROM shop.sales WHERE id = $1::uuid", {second}) == "1";
    }));
    db().query("UPDATE shop.products SET name = 'lost with the primary' WHERE id <= 5");
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT count(*) FROM sync.note") == "0" &&
               db().value("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") !=
                   "0";
    })) << "the sender's lease does not wait for the standby";
    EXPECT_NE(unfiled(2), "")
        << "the device was told its upload was filed before the standby had it";

    // The primary stops at once; the standby takes its place, on its port. The devices hold what
    // it holds: they are sent no row again, only where they stand.
    std::mutex mutex;
    size_t rows_sent = 0;
    deployment_->router().observe([&](const std::string&, const std::string& message) {
        std::lock_guard<std::mutex> lock(mutex);
        rows_sent += rows_in(message);
    });
    const int port = cluster().port();
    cluster().stop("immediate");
    standby->move_to_port(port);
    standby->start();
    standby->promote();
    deployment_->replace_cluster(std::move(standby));
    converge("the standby promoted in the primary's place");
    EXPECT_TRUE(eventually([&] { return unfiled(2).empty(); })) << unfiled(2);
    EXPECT_EQ(db().value("SELECT string_agg(id::text, ',' ORDER BY id) FROM shop.sales"),
              first + "," + second);
    deployment_->router().observe(nullptr);
    EXPECT_EQ(rows_sent, 0u) << "devices that held what the promoted standby holds were sent rows";
}

// A base backup recovered to a point before the last changes (pg_basebackup, the WAL archived,
// recovery_target_name): the relay's counters go back while the devices hold later messages. Each
// device takes the recovered history as it comes and holds what the recovered tables say. A write
// the server kept before the point and filed after it (the column it needed came) is kept again:
// its device, told in the lost history that it was filed, lists it as kept again.
TEST_F(History, ABaseBackupRecoveredToAnEarlierPointEveryReplicaConverges) {
    const std::string archive = make_postgres_directory("magic_sync_archive");
    cluster().sql("postgres", "ALTER SYSTEM SET archive_mode = on");
    cluster().sql("postgres", "ALTER SYSTEM SET archive_command = 'cp %p " + archive + "/%f'");
    cluster().stop();
    cluster().start();
    deployment_->reconnect();
    for (int n : {1, 2}) add_register(n, n);
    start_http_sender();
    for (int n : {1, 2}) start_http_replica(n);
    converge("provisioning");
    const std::string base = make_postgres_directory("magic_sync_base");
    cluster().base_backup(base + "/data", false);

    db().query("UPDATE shop.products SET price = price + 1 WHERE id <= 10");
    const std::string sale = sell(1, 1);
    ASSERT_TRUE(eventually([&] { return unfiled(1).empty(); })) << unfiled(1);
    write_local(2, "shop.sales",
                R"({"id":"30000000-0000-0000-0000-000000000001","register_id":")" + replica_id(2) +
                    R"(","product_id":3,"qty":1,"note":"gift"})");
    const std::string kept_sale =
        "kept by the server (not filed)\n  shop.sales {\"id\":\"30000000-0000-0000-0000-"
        "000000000001\"}: table shop.sales has no column \"note\": the row is kept until it has, "
        "never filed without it";
    ASSERT_TRUE(eventually([&] { return kept(2) == kept_sale; })) << kept(2);
    converge("changes and an upload before the point");
    db().value("SELECT pg_create_restore_point('before_the_mistake')");
    db().query("ALTER TABLE shop.sales ADD COLUMN note text");
    ASSERT_TRUE(eventually([&] { return kept(2).empty(); })) << kept(2);
    db().query("UPDATE shop.products SET name = 'a mistake' WHERE id <= 20");
    db().query("DELETE FROM shop.prices WHERE store_id = 2 AND product_id > 5");
    db().query("INSERT INTO shop.prices VALUES (1, 11, 2.5)");
    converge("the mistake, on every device");
    const std::string segment = db().value("SELECT pg_walfile_name(pg_switch_wal())");
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT last_archived_wal >= $1 FROM pg_stat_archiver", {segment}) == "t";
    }));

    const int port = cluster().port();
    cluster().stop("immediate");
    deployment_->replace_cluster(Cluster::from_backup(
        base + "/data",
        {"restore_command = 'cp " + archive + "/%f %p'",
         "recovery_target_name = 'before_the_mistake'", "recovery_target_action = 'promote'"},
        port, true));
    ASSERT_TRUE(eventually([&] { return db().value("SELECT pg_is_in_recovery()") == "f"; }));
    EXPECT_EQ(db().value("SELECT count(*) FROM shop.products WHERE name = 'a mistake'"), "0");
    converge("a base backup recovered to the point before the mistake");
    EXPECT_EQ(db().value("SELECT string_agg(id::text, ',') FROM shop.sales"), sale);
    EXPECT_TRUE(eventually([&] { return kept(2) == kept_sale; })) << kept(2);
}

// With --gzip: the stream holds the messages compressed, and the replicas inflate them.
TEST_F(EndToEnd, OverNatsJetStream) {
    start_nats();
    for (int n : {1, 2}) add_register(n, n);
    start_nats_sender({"--gzip"});
    for (int n : {1, 2}) start_nats_replica(n);
    converge("provisioning over NATS");
    EXPECT_EQ(line_count(held(replicas_[2])), 45);
    db().query("UPDATE shop.products SET price = price * 3 WHERE id <= 15");
    db().query("INSERT INTO shop.prices VALUES (1, 12, 1.23)");
    converge("changes over NATS");
    write_local(2, "shop.shelves", R"({"store_id":2,"product_id":4,"stock":3})",
                "store_id,product_id");
    ASSERT_TRUE(eventually([&] {
        return db().value("SELECT stock FROM shop.shelves WHERE store_id = 2 AND product_id = 4") ==
               "3";
    }));
    converge("an upload over NATS");
    db().query("UPDATE shop.products SET price = price + 1");
    sender()->stop(SIGKILL);
    start_nats_sender({"--gzip"});
    replicas_[1].process->stop(SIGKILL);
    replicas_[1].process->start();
    converge("kill -9 of the sender and of a replica over NATS");
}

}  // namespace
}  // namespace magic_sync::test
