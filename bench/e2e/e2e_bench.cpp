// End to end on this machine, every real part: the relay worker, magic-sync-sender over http, and
// magic-sync-replica processes (each answers 2xx only after its SQLite commit).
//   1. commit-to-applied latency: a row committed at the head office until a replica took the
//      message carrying it, with the worker idle, and under a steady write load;
//   2. rows/s delivered: one statement changing many catalog rows, fanned out to 100 replicas,
//      until every replica took all of them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "server/cpu.hpp"
#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"
#include "server/router.hpp"
#include "support/cluster.hpp"

namespace {

using namespace magic_sync::test;
using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> values, double p) {
    std::sort(values.begin(), values.end());
    return values[static_cast<size_t>(p * (values.size() - 1) + 0.5)];
}

// Where the machine's CPU went: the server (its postmaster and every process under it), the
// sender, the replica processes, and this benchmark (its router).
struct CpuUse {
    double server = 0, sender = 0, replicas = 0, bench = 0;
};

const char* const kShop = R"sql(
    CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
    SELECT sync.replicas('registers', 'registers', live => 'active');
    SELECT sync.catalog('products');
    INSERT INTO products SELECT i, 'product ' || i, i FROM generate_series(1, 10000) i;
)sql";

struct Rig {
    explicit Rig(int replicas) : deployment("bench", {"max_connections = 200"}, "shop", kShop) {
        deployment.router().observe([this](const std::string&, const std::string& message) {
            std::lock_guard<std::mutex> lock(mutex);
            ++taken;
            for (auto& [marker, seen] : waiting)
                if (!seen && message.find(marker) != std::string::npos) seen = true;
            changed.notify_all();
        });
        for (int n = 1; n <= replicas; ++n) {
            std::string id = replica_id(n);
            deployment.db().query("INSERT INTO registers (id) VALUES ($1::uuid)", {id});
            deployment.start_http_replica(processes.emplace_back(deployment.replica(id)), {}, "");
        }
        deployment.start_http_sender({"--concurrency", "64"});
        drained(std::chrono::minutes(10));
    }
    ~Rig() { processes.clear(); }

    // Every replica took everything: nothing noted, no cursor behind, nothing unsent.
    bool drained(std::chrono::milliseconds timeout) {
        return eventually(
            [&] {
                return deployment.db().value(
                           "SELECT (SELECT count(*) FROM sync.note) +"
                           " (SELECT count(*) FROM sync.member m JOIN sync.scope s"
                           "  ON s.id = m.scope WHERE m.sent < s.head) +"
                           " (SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL)") == "0";
            },
            timeout);
    }

    // Commits a change carrying `marker` and waits until a replica took a message with it.
    double latency_ms(Connection& writer, int product, const std::string& marker) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            waiting[marker] = false;
        }
        writer.query("UPDATE products SET name = $1 WHERE id = $2::int",
                     {marker, std::to_string(product)});
        auto committed = Clock::now();
        std::unique_lock<std::mutex> lock(mutex);
        bool seen =
            changed.wait_for(lock, std::chrono::seconds(10), [&] { return waiting[marker]; });
        waiting.erase(marker);
        return seen ? std::chrono::duration<double, std::milli>(Clock::now() - committed).count()
                    : -1;
    }

    CpuUse cpu_use() {
        CpuUse use;
        use.server =
            cluster_cpu_seconds(postmaster_pid(deployment.cluster().directory() + "/data"));
        use.sender = cpu_seconds(deployment.sender()->pid());
        for (const ReplicaProcess& replica : processes)
            use.replicas += cpu_seconds(replica.process->pid());
        rusage self{};
        getrusage(RUSAGE_SELF, &self);
        use.bench = self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 + self.ru_stime.tv_sec +
                    self.ru_stime.tv_usec / 1e6;
        return use;
    }

    Deployment deployment;
    std::vector<ReplicaProcess> processes;
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::string, bool> waiting;
    long taken = 0;
};

void latency(Rig& rig, const char* label, int samples) {
    Connection writer(rig.deployment.conninfo());
    std::vector<double> values;
    int missed = 0;
    for (int i = 0; i < samples; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        double ms = rig.latency_ms(writer, 1 + i % 100,
                                   "marker-" + std::string(label) + "-" + std::to_string(i));
        if (ms < 0)
            ++missed;
        else
            values.push_back(ms);
    }
    if (values.empty()) {
        std::printf("  %-34s no change arrived\n", label);
        return;
    }
    std::printf("  %-34s p50 %7.2f ms   p99 %7.2f ms   (%zu changes, %d missed)\n", label,
                percentile(values, 0.5), percentile(values, 0.99), values.size(), missed);
}

}  // namespace

int main(int argc, char** argv) {
    int replicas = argc > 1 ? std::stoi(argv[1]) : 100;
    int samples = argc > 2 ? std::stoi(argv[2]) : 50;
    std::printf("end to end over http, relay worker + sender + replica processes, %d replicas\n",
                replicas);
    {
        Rig one(1);
        std::printf("commit-to-applied latency, one replica:\n");
        latency(one, "worker idle", samples);
        std::atomic<bool> stop{false};
        std::thread load([&] {
            Connection writer(one.deployment.conninfo());
            int i = 0;
            while (!stop) {
                writer.query("UPDATE products SET price = price + 0.01 WHERE id = $1::int",
                             {std::to_string(200 + i++ % 5000)});
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
        });
        latency(one, "under load (~200 writes/s)", samples);
        stop = true;
        load.join();
    }
    Rig many(replicas);
    const int rows = 2000;
    {
        std::lock_guard<std::mutex> lock(many.mutex);
        many.taken = 0;
    }
    const CpuUse before = many.cpu_use();
    auto start = Clock::now();
    const std::string committed = many.deployment.db().value("SELECT clock_timestamp()");
    many.deployment.db().query("UPDATE products SET price = price + 1 WHERE id <= " +
                               std::to_string(rows));
    if (!many.drained(std::chrono::minutes(10))) {
        std::printf("the fan-out did not drain\n");
        return 1;
    }
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const CpuUse after = many.cpu_use();
    std::printf(
        "fan-out: %d rows changed in one statement to %d replicas: %.1f s,"
        " %.0f rows/s delivered (%ld messages)\n",
        rows, replicas, seconds, rows * replicas / seconds, many.taken);
    // Where the time went: when the passes wrote the messages (each pass's messages carry its
    // start), and when the sender recorded them sent, from the statement's start.
    std::printf("  %s\n", many.deployment.db()
                              .value(R"sql(
        SELECT format('messages written by %s passes from %s to %s ms, sent from %s to %s ms',
         count(DISTINCT created_at),
         round(extract(epoch FROM min(created_at) - $1::timestamptz) * 1000),
         round(extract(epoch FROM max(created_at) - $1::timestamptz) * 1000),
         round(extract(epoch FROM min(sent_at) - $1::timestamptz) * 1000),
         round(extract(epoch FROM max(sent_at) - $1::timestamptz) * 1000))
        FROM sync.outbox WHERE created_at > $1::timestamptz)sql",
                                     {committed})
                              .c_str());
    std::printf(
        "  CPU used meanwhile: replicas %.2f s, server %.2f s, sender %.2f s, this benchmark"
        " (its router) %.2f s; %ld cores\n",
        after.replicas - before.replicas, after.server - before.server,
        after.sender - before.sender, after.bench - before.bench, sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}
