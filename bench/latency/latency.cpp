// Commit-to-outbox latency with the relay worker idle: a change commits, and the relay's NOTIFY
// (sent by the pass that wrote its message) arrives. The worker sleeps magic_sync.idle (200 ms by
// default) between passes when there is no work, so only the commit's wake-up can make the
// latency smaller than that.
#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "server/pq.hpp"
#include "support/cluster.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using magic_sync::test::await_notify;

PGconn* connect(const std::string& conninfo) {
    PGconn* connection = PQconnectdb(conninfo.c_str());
    if (PQstatus(connection) != CONNECTION_OK)
        throw std::runtime_error(std::string("cannot connect: ") + PQerrorMessage(connection));
    return connection;
}

void exec(PGconn* connection, const std::string& sql) {
    PGresult* result = PQexec(connection, sql.c_str());
    auto status = PQresultStatus(result);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        std::string error = PQresultErrorMessage(result);
        PQclear(result);
        throw std::runtime_error(error + " in: " + sql);
    }
    PQclear(result);
}

double percentile(std::vector<double> values, double p) {
    std::sort(values.begin(), values.end());
    size_t index = static_cast<size_t>(p * (values.size() - 1) + 0.5);
    return values[index];
}

}  // namespace

int main(int argc, char** argv) {
    int changes = argc > 1 ? std::stoi(argv[1]) : 200;
    magic_sync::test::Cluster cluster(
        {"magic_sync.database = 'shop'", "magic_sync.window = 10000"});
    cluster.create_database("shop");
    cluster.sql("shop", R"sql(
        CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
        CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric);
        SELECT sync.replicas('registers', 'registers', live => 'active');
        SELECT sync.catalog('products');
        INSERT INTO registers VALUES ('00000000-0000-0000-0000-000000000001');
        INSERT INTO products VALUES (1, 'tea', 1);
    )sql");
    PGconn* listener = connect(cluster.conninfo("shop"));
    PGconn* writer = connect(cluster.conninfo("shop"));
    exec(listener, "LISTEN magic_sync");
    // Let the provisioning pass finish and the worker settle into its idle wait.
    await_notify(listener, std::chrono::seconds(10));
    while (await_notify(listener, std::chrono::milliseconds(500))) {
    }
    std::vector<double> latencies;
    int missed = 0;
    for (int i = 0; i < changes; ++i) {
        // Idle between changes, longer than magic_sync.idle: the worker is asleep each time.
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        exec(writer, "UPDATE products SET price = " + std::to_string(i + 2) + " WHERE id = 1");
        auto committed = Clock::now();
        if (!await_notify(listener, std::chrono::seconds(5))) {
            ++missed;
            continue;
        }
        latencies.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - committed).count());
    }
    PQfinish(listener);
    PQfinish(writer);
    if (latencies.empty()) {
        std::fprintf(stderr, "no change reached the outbox\n");
        return 1;
    }
    std::printf("commit-to-outbox latency, worker idle (magic_sync.idle = 200 ms), %zu changes:\n",
                latencies.size());
    std::printf("  median %.2f ms   p90 %.2f ms   p99 %.2f ms   max %.2f ms   missed %d\n",
                percentile(latencies, 0.5), percentile(latencies, 0.9), percentile(latencies, 0.99),
                percentile(latencies, 1.0), missed);
    std::printf("  goal: median under 10 ms: %s\n",
                percentile(latencies, 0.5) < 10.0 ? "met" : "NOT met");
    return 0;
}
