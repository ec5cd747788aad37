// Long transactions (issue 10): does the relay keep passing and the outbox keep draining while a
// session sits in `BEGIN; SELECT txid_current();` for minutes, holding the xmin horizon so that
// VACUUM removes nothing the relay deleted after it began? Every real part: the relay worker,
// magic-sync-sender over http, magic-sync-replica processes (uploading their confirmations, so
// the outbox is pruned). One round: an UPDATE of 500 catalog rows, then wait until every replica
// was sent all of it. Throughput is rows delivered (rows x replicas) per second over a run of
// rounds; the same run without the open transaction, before and after, is the baseline.
//
//   build/bench/longtx [seconds per run (120)] [replicas (10)]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"
#include "server/router.hpp"
#include "support/cluster.hpp"

namespace {

using namespace magic_sync::test;
using Clock = std::chrono::steady_clock;

constexpr int kProducts = 5000;
constexpr int kRowsPerRound = 500;

struct Rig {
    explicit Rig(int replicas) : replicas(replicas) {
        cluster = std::make_unique<Cluster>(
            std::vector<std::string>{"magic_sync.database = 'shop'", "max_connections = 100",
                                     // Autovacuum as eager as it gets: what it cannot remove is the
                                     // long transaction's doing.
                                     "autovacuum_naptime = '5s'", "magic_sync.prune_every = '5s'"});
        cluster->create_database("shop");
        cluster->sql("shop", R"sql(
            CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
            CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
            SELECT sync.replicas('registers', 'registers', live => 'active');
            SELECT sync.catalog('products');
            INSERT INTO products SELECT i, 'product ' || i, i FROM generate_series(1, 5000) i;
        )sql");
        char pattern[] = "/tmp/magic_sync_longtx.XXXXXX";
        directory = mkdtemp(pattern);
        db = std::make_unique<Connection>(cluster->conninfo("shop"));
        for (int n = 1; n <= replicas; ++n) {
            std::string id = replica_id(n);
            db->query("INSERT INTO registers (id) VALUES ($1::uuid)", {id});
            int port = free_port();
            router.route(id, port);
            processes.push_back(std::make_unique<Process>(
                std::vector<std::string>{"build/bin/magic-sync-replica", "--id", id, "--db",
                                         directory + "/" + id + ".db", "serve", "--listen",
                                         "127.0.0.1:" + std::to_string(port), "--up",
                                         cluster->conninfo("shop"), "--upload-every", "1"},
                directory + "/" + id + ".log"));
        }
        processes.push_back(std::make_unique<Process>(
            std::vector<std::string>{
                "build/bin/magic-sync-sender", "--db", cluster->conninfo("shop"), "--transport",
                "http", "--url",
                "http://127.0.0.1:" + std::to_string(router.port()) + "/replicas/{replica}",
                "--report", "0"},
            directory + "/sender.log"));
        if (!drained(std::chrono::minutes(5))) throw std::runtime_error("provisioning stalled");
    }
    ~Rig() {
        processes.clear();
        db.reset();
        cluster.reset();
        run("rm -rf " + directory);
    }

    // Every replica was sent everything: nothing noted, no cursor behind, nothing unsent.
    bool drained(std::chrono::milliseconds timeout) {
        return eventually(
            [&] {
                return db->value(
                           "SELECT (SELECT count(*) FROM sync.note) +"
                           " (SELECT count(*) FROM sync.member m JOIN sync.scope s"
                           "  ON s.id = m.scope WHERE m.sent < s.head) +"
                           " (SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL)") == "0";
            },
            timeout);
    }

    std::string dead(const std::string& table) {
        return db->value("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass",
                         {table});
    }

    // Rounds for `seconds`; returns rows delivered per second.
    double measure(const char* label, int seconds, bool hold) {
        std::unique_ptr<Connection> holder;
        std::string holder_pid;
        if (hold) {
            holder = std::make_unique<Connection>(cluster->conninfo("shop"));
            holder->query("BEGIN");
            holder->query("SELECT txid_current()");
            holder_pid = holder->value("SELECT pg_backend_pid()");
        }
        Connection writer(cluster->conninfo("shop"));
        auto start = Clock::now();
        auto deadline = start + std::chrono::seconds(seconds);
        long rounds = 0;
        while (Clock::now() < deadline) {
            int from = 1 + static_cast<int>((rounds * kRowsPerRound) % kProducts);
            writer.query(
                "UPDATE products SET price = price + 0.01 WHERE id BETWEEN $1::int AND $2::int",
                {std::to_string(from), std::to_string(from + kRowsPerRound - 1)});
            if (!drained(std::chrono::minutes(2))) {
                std::printf("  %s: a round did not drain within 2 minutes\n", label);
                break;
            }
            ++rounds;
        }
        double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        double rate = rounds * kRowsPerRound * static_cast<double>(replicas) / elapsed;
        std::printf("  %-34s %5ld rounds in %6.1f s: %8.0f rows/s delivered", label, rounds,
                    elapsed, rate);
        std::printf("; outbox %s rows; dead tuples: note %s, outbox %s, row %s, member %s\n",
                    db->value("SELECT count(*) FROM sync.outbox").c_str(),
                    dead("sync.note").c_str(), dead("sync.outbox").c_str(),
                    dead("sync.row").c_str(), dead("sync.member").c_str());
        if (hold) {
            auto health = db->query(
                "SELECT horizon_held_by, horizon_pid, horizon_xmin_age, round(horizon_seconds)"
                " FROM sync.health");
            auto text = [&](int column) {
                return health.empty() || !health[0][column] ? std::string("NULL")
                                                            : *health[0][column];
            };
            std::printf(
                "  sync.health while held: horizon_held_by %s, horizon_pid %s (the holder is "
                "%s), horizon_xmin_age %s, horizon_seconds %s\n",
                text(0).c_str(), text(1).c_str(), holder_pid.c_str(), text(2).c_str(),
                text(3).c_str());
            holder->query("ROLLBACK");
        }
        std::fflush(stdout);
        return rate;
    }

    int replicas;
    std::unique_ptr<Cluster> cluster;
    std::unique_ptr<Connection> db;
    std::string directory;
    Router router;
    std::vector<std::unique_ptr<Process>> processes;
};

}  // namespace

int main(int argc, char** argv) {
    int seconds = argc > 1 ? std::stoi(argv[1]) : 120;
    int replicas = argc > 2 ? std::stoi(argv[2]) : 10;
    std::printf(
        "long transactions: relay worker + sender + %d replica processes over http, %d rows a "
        "round, %d s a run\n",
        replicas, kRowsPerRound, seconds);
    try {
        Rig rig(replicas);
        rig.measure("warm-up", 15, false);
        double before = rig.measure("without (before)", seconds, false);
        double held = rig.measure("with a transaction held open", seconds, true);
        double after = rig.measure("without (after)", seconds, false);
        std::printf(
            "  ratio with / without: %.2f against before, %.2f against after (goal >= 0.9)\n",
            held / before, held / after);
    } catch (const std::exception& error) {
        std::fprintf(stderr, "longtx: %s\n", error.what());
        return 1;
    }
    return 0;
}
