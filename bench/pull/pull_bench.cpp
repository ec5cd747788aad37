// Pull against push (issue 26): the same backlog delivered to N replicas, once pushed by
// magic-sync-sender --transport http to magic-sync-replica serve processes (through the tests'
// router), once pulled from magic-sync-sender --transport pull by magic-sync-replica pull
// processes, each in a fresh cluster with the relay worker. Timed from the sender's start until
// every replica took every message the relay planned (no unsent message, no member behind its
// scope's head: a message is taken only after the replica's commit). Prints both and the ratio.
//   build/bench/pull_bench [replicas] [rows]
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"

namespace {

using namespace magic_sync::test;
using Clock = std::chrono::steady_clock;

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, token text UNIQUE);
    CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
    SELECT sync.replicas('shop.registers', 'registers');
    SELECT sync.catalog('shop.products');
)sql";

const char* const kDelivered = R"sql(
    SELECT (SELECT count(*) FROM sync.note) + (SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL)
         + (SELECT count(*) FROM sync.member m JOIN sync.scope s ON s.id = m.scope WHERE m.sent < s.head)
)sql";

// Seconds from starting the sender and the replicas until everything was delivered.
double deliver(const std::string& name, int replicas, int rows,
               const std::function<void(Deployment&)>& start) {
    Deployment deployment(name, {"magic_sync.idle = 100"}, "shop", kShop);
    deployment.db().query(
        "INSERT INTO shop.registers SELECT ('00000000-0000-0000-0000-' || lpad(n::text, 12, "
        "'0'))::uuid, 'device-' || n FROM generate_series(1, $1::int) n",
        {std::to_string(replicas)});
    deployment.db().query(
        "INSERT INTO shop.products SELECT i, 'product ' || i, i FROM generate_series(1, $1::int) i",
        {std::to_string(rows)});
    // The relay plans the backlog before anything is delivered.
    eventually([&] { return deployment.db().value("SELECT count(*) FROM sync.note") == "0"; },
               std::chrono::seconds(120));
    const auto started = Clock::now();
    start(deployment);
    if (!eventually([&] { return deployment.db().value(kDelivered) == "0"; },
                    std::chrono::seconds(600)))
        throw std::runtime_error(name + ": not delivered in 10 minutes");
    return std::chrono::duration<double>(Clock::now() - started).count();
}

}  // namespace

int main(int argc, char** argv) {
    const int replicas = argc > 1 ? std::stoi(argv[1]) : 50;
    const int rows = argc > 2 ? std::stoi(argv[2]) : 2000;
    std::vector<std::unique_ptr<ReplicaProcess>> running;
    const double push = deliver("bench_push", replicas, rows, [&](Deployment& deployment) {
        deployment.start_http_sender();
        for (int n = 1; n <= replicas; ++n) {
            running.push_back(std::make_unique<ReplicaProcess>(deployment.replica(replica_id(n))));
            deployment.start_http_replica(*running.back(), {}, "");
        }
    });
    running.clear();
    const double pull = deliver("bench_pull", replicas, rows, [&](Deployment& deployment) {
        const std::string port = std::to_string(free_port());
        deployment.sender() = std::make_unique<Process>(
            std::vector<std::string>{deployment.bin() + "/magic-sync-sender", "--db",
                                     deployment.conninfo(), "--transport", "pull", "--listen",
                                     "127.0.0.1:" + port, "--token-query",
                                     "SELECT id FROM shop.registers WHERE token = $1"},
            deployment.directory() + "/sender.log");
        for (int n = 1; n <= replicas; ++n) {
            running.push_back(std::make_unique<ReplicaProcess>(deployment.replica(replica_id(n))));
            std::vector<std::string> arguments = deployment.replica_program(*running.back());
            for (const std::string& argument :
                 {std::string("pull"), std::string("--url"), "http://127.0.0.1:" + port,
                  std::string("--token"), "device-" + std::to_string(n)})
                arguments.push_back(argument);
            running.back()->process = std::make_unique<Process>(
                arguments, deployment.directory() + "/" + running.back()->id + ".log");
        }
    });
    running.clear();
    std::printf("%d replicas, %d catalog rows each (%d rows delivered)\n", replicas, rows,
                replicas * rows);
    std::printf("push (http): %.2f s, %.0f rows/s\n", push, replicas * rows / push);
    std::printf("pull:        %.2f s, %.0f rows/s\n", pull, replicas * rows / pull);
    std::printf("pull / push time: %.2f\n", pull / push);
    return 0;
}
