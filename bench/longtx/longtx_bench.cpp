// Long transactions (issue 10): does the relay keep passing and the outbox keep draining while a
// session sits in `BEGIN; SELECT txid_current();` for minutes, holding the xmin horizon so that
// VACUUM removes nothing the relay deleted after it began? Two clusters side by side, each with
// every real part: the relay worker, magic-sync-sender over http, magic-sync-replica processes
// (uploading their confirmations, so the outbox is pruned). One round: an UPDATE of 2,000 catalog
// rows, then wait until every replica was sent all of it. Rounds alternate between the cluster
// without and the cluster with the open transaction, so whatever else loads the machine hits both
// alike; throughput is rows delivered (rows x replicas) per second of their rounds, reported per
// 30 s and over the run.
//
//   build/bench/longtx [seconds held open (180)] [replicas per cluster (10)] [rows a round (2000)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"
#include "server/router.hpp"
#include "support/cluster.hpp"

namespace {

using namespace magic_sync::test;
using Clock = std::chrono::steady_clock;

constexpr int kProducts = 5000;
int rows_per_round = 2000;

const char* const kShop = R"sql(
    CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
    SELECT sync.replicas('registers', 'registers', live => 'active');
    SELECT sync.catalog('products');
    INSERT INTO products SELECT i, 'product ' || i, i FROM generate_series(1, 5000) i;
)sql";

struct Rig {
    explicit Rig(int replicas)
        : replicas(replicas),
          deployment("longtx",
                     {"max_connections = 100",
                      // Autovacuum as eager as it gets: what it cannot remove is the long
                      // transaction's doing.
                      "autovacuum_naptime = '5s'", "magic_sync.prune_every = '5s'"},
                     "shop", kShop) {
        for (int n = 1; n <= replicas; ++n) {
            std::string id = replica_id(n);
            db().query("INSERT INTO registers (id) VALUES ($1::uuid)", {id});
            deployment.start_http_replica(processes.emplace_back(deployment.replica(id)), {}, "1");
        }
        deployment.start_http_sender();
        if (!drained(std::chrono::minutes(5))) throw std::runtime_error("provisioning stalled");
        writer = std::make_unique<Connection>(deployment.conninfo());
    }
    ~Rig() {
        holder.reset();
        writer.reset();
        processes.clear();
    }

    Connection& db() { return deployment.db(); }

    // Every replica was sent everything: nothing noted, no cursor behind, nothing unsent.
    bool drained(std::chrono::milliseconds timeout) {
        return eventually(
            [&] {
                return db().value(
                           "SELECT (SELECT count(*) FROM sync.note) +"
                           " (SELECT count(*) FROM sync.member m JOIN sync.scope s"
                           "  ON s.id = m.scope WHERE m.sent < s.head) +"
                           " (SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL)") == "0";
            },
            timeout);
    }

    std::string dead(const std::string& table) {
        return db().value("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass",
                          {table});
    }
    std::string dead_tuples() {
        return "note " + dead("sync.note") + ", outbox " + dead("sync.outbox") + ", row " +
               dead("sync.row") + ", member " + dead("sync.member") + ", scope " +
               dead("sync.scope");
    }

    // One round: an UPDATE of rows_per_round products, until every replica was sent them.
    // Returns its seconds.
    double round() {
        int from = 1 + static_cast<int>((rounds * rows_per_round) % kProducts);
        auto start = Clock::now();
        writer->query(
            "UPDATE products SET price = price + 0.01 WHERE id BETWEEN $1::int AND $2::int",
            {std::to_string(from), std::to_string(from + rows_per_round - 1)});
        if (!drained(std::chrono::minutes(2)))
            throw std::runtime_error("a round did not drain within 2 minutes");
        ++rounds;
        return std::chrono::duration<double>(Clock::now() - start).count();
    }

    // A session that begins a transaction, takes an xid and stays open.
    void hold() {
        holder = std::make_unique<Connection>(deployment.conninfo());
        holder->query("BEGIN");
        holder->query("SELECT txid_current()");
        holder_pid = holder->value("SELECT pg_backend_pid()");
    }

    int replicas;
    long rounds = 0;
    Deployment deployment;
    std::vector<ReplicaProcess> processes;
    std::unique_ptr<Connection> writer;
    std::unique_ptr<Connection> holder;
    std::string holder_pid;
};

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values.empty() ? 0 : values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int seconds = argc > 1 ? std::stoi(argv[1]) : 180;
    int replicas = argc > 2 ? std::stoi(argv[2]) : 10;
    rows_per_round = argc > 3 ? std::stoi(argv[3]) : 2000;
    std::printf(
        "long transactions: two clusters side by side, each with the relay worker, a sender and "
        "%d replica processes over http; rounds of %d rows alternate between them for %d s while "
        "one of them has a transaction held open\n",
        replicas, rows_per_round, seconds);
    try {
        Rig plain(replicas);
        Rig held(replicas);
        for (int i = 0; i < 5; ++i) {
            plain.round();
            held.round();
        }
        held.hold();
        auto start = Clock::now();
        auto deadline = start + std::chrono::seconds(seconds);
        const double window = 30;
        std::vector<double> ratios;
        double plain_total = 0, held_total = 0, plain_window = 0, held_window = 0;
        long window_rounds = 0;
        auto window_start = start;
        double rows = rows_per_round * static_cast<double>(replicas);
        for (long i = 0; Clock::now() < deadline; ++i) {
            // Alternate which goes first, so neither always follows the other.
            double a = 0, b = 0;
            if (i % 2 == 0) {
                a = plain.round();
                b = held.round();
            } else {
                b = held.round();
                a = plain.round();
            }
            ratios.push_back(a / b);
            plain_total += a;
            held_total += b;
            plain_window += a;
            held_window += b;
            ++window_rounds;
            double since = std::chrono::duration<double>(Clock::now() - window_start).count();
            if (since >= window || Clock::now() >= deadline) {
                double at = std::chrono::duration<double>(Clock::now() - start).count();
                std::printf(
                    "  %4.0f s: %3ld rounds each: without %6.0f rows/s, with %6.0f rows/s, "
                    "ratio %.2f\n",
                    at, window_rounds, window_rounds * rows / plain_window,
                    window_rounds * rows / held_window, plain_window / held_window);
                std::fflush(stdout);
                plain_window = held_window = 0;
                window_rounds = 0;
                window_start = Clock::now();
            }
        }
        auto health = held.db().query(
            "SELECT horizon_held_by, horizon_pid, horizon_xmin_age, round(horizon_seconds),"
            " notes_backlog FROM sync.health");
        auto text = [&](int column) {
            return health.empty() || !health[0][column] ? std::string("NULL") : *health[0][column];
        };
        std::printf(
            "  sync.health of the held cluster: horizon_held_by %s, horizon_pid %s (the holder "
            "is %s), horizon_xmin_age %s, horizon_seconds %s, notes_backlog %s\n",
            text(0).c_str(), text(1).c_str(), held.holder_pid.c_str(), text(2).c_str(),
            text(3).c_str(), text(4).c_str());
        std::printf("  dead tuples without: %s\n  dead tuples with:    %s\n",
                    plain.dead_tuples().c_str(), held.dead_tuples().c_str());
        std::printf("  outbox rows left: without %s, with %s\n",
                    plain.db().value("SELECT count(*) FROM sync.outbox").c_str(),
                    held.db().value("SELECT count(*) FROM sync.outbox").c_str());
        std::printf(
            "  %zu rounds each: without %.0f rows/s, with %.0f rows/s delivered; ratio with / "
            "without %.2f (median of the rounds' ratios %.2f; goal >= 0.9)\n",
            ratios.size(), ratios.size() * rows / plain_total, ratios.size() * rows / held_total,
            plain_total / held_total, median(ratios));
    } catch (const std::exception& error) {
        std::fprintf(stderr, "longtx: %s\n", error.what());
        return 1;
    }
    return 0;
}
