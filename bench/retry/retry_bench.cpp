// bench/retry: the retry of kept uploads (docs/DESIGN.md §6, §13; bench/README.md).
//
// (a) Time per kept row. For 2,000, 8,000, 32,000 and 100,000 kept rows (lines of sales the server
//     does not have: a foreign key), the retry as the relay runs it, slice after slice
//     (sync.retry_uploads(), each slice its own transaction) until none is due: once with every
//     row kept again (the sales still missing), once with every row filed (the sales came).
//     Median of RUNS runs each. Linear means the time per row stays flat from the smallest to the
//     largest: goal within 1.5x.
// (b) While the relay worker retries 100,000 such rows, a catalog change commits every 100 ms:
//     its commit-to-outbox latency (the NOTIFY of the pass that wrote its message). Goal: p99 at
//     most 1 s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "server/pq.hpp"
#include "support/cluster.hpp"

namespace {

using magic_sync::test::await_notify;
using magic_sync::test::Cluster;
using magic_sync::test::Connection;
using Clock = std::chrono::steady_clock;

const char* const kSchema = R"sql(
    CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric);
    CREATE TABLE sales (id int PRIMARY KEY);
    CREATE TABLE lines (sale_id int NOT NULL REFERENCES sales, n int NOT NULL, qty int NOT NULL,
                        PRIMARY KEY (sale_id, n));
    SELECT sync.replicas('registers', 'registers', live => 'active');
    SELECT sync.catalog('products');
    SELECT sync.record('sales');
    SELECT sync.record('lines');
    INSERT INTO registers VALUES ('00000000-0000-0000-0000-000000000001');
    INSERT INTO products VALUES (1, 'tea', 1);
)sql";

// Keeps `rows` lines of missing sales: uploads of 1,000 rows through sync.receive, each row kept
// (the foreign key). Lines of sale s are (s, 1..10); `first_sale` onwards.
void keep_lines(Connection& db, int rows, int first_sale) {
    for (int done = 0; done < rows; done += 1000) {
        int count = std::min(1000, rows - done);
        db.query(
            "SELECT sync.receive('00000000-0000-0000-0000-000000000001', convert_to("
            "json_build_object('v', 1, 'id', gen_random_uuid(), 'rows', json_agg(json_build_object("
            "'t', 'public.lines', 'r', json_build_object('sale_id', $1::int + i / 10, 'n', i % 10,"
            " 'qty', 1))))::text, 'UTF8'))"
            " FROM generate_series($2::int, $2::int + $3::int - 1) i",
            {std::to_string(first_sale), std::to_string(done), std::to_string(count)});
    }
}

// The retry as the relay runs it: slices, each its own transaction, until none is due. Seconds.
double retry_all(Connection& db) {
    auto started = Clock::now();
    while (db.value("SELECT more FROM sync.retry_uploads()") == "t") {
    }
    return std::chrono::duration<double>(Clock::now() - started).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    size_t n = values.size();
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double percentile(std::vector<double> values, double p) {
    std::sort(values.begin(), values.end());
    return values[static_cast<size_t>(p * (values.size() - 1) + 0.5)];
}

struct PerRow {
    int rows;
    double kept_again;  // seconds, median
    double filed;
};

PerRow measure(Connection& db, int rows, int runs) {
    std::vector<double> kept_again, filed;
    for (int run = 0; run < runs; ++run) {
        db.query("TRUNCATE sync.set_aside, sync.upload, sync.answer, sync.note, lines, sales");
        keep_lines(db, rows, 1);
        db.query("VACUUM ANALYZE sync.set_aside");
        db.query("VACUUM ANALYZE sync.upload");
        kept_again.push_back(retry_all(db));
        // Every row kept again, backed off: a change makes them due, and the sales come.
        db.query("INSERT INTO sales SELECT generate_series(1, $1::int / 10 + 1)",
                 {std::to_string(rows)});
        db.query("COMMENT ON TABLE lines IS 'the sales came'");
        db.query("VACUUM ANALYZE sync.set_aside");
        filed.push_back(retry_all(db));
        if (db.value("SELECT count(*) FROM lines") != std::to_string(rows) ||
            db.value("SELECT count(*) FROM sync.set_aside") != "0") {
            std::fprintf(stderr, "the retry did not file every row\n");
            std::exit(1);
        }
    }
    return {rows, median(kept_again), median(filed)};
}

void time_per_row(int runs) {
    Cluster cluster;  // no relay worker: the retry is run by hand, slice by slice
    cluster.create_database("hand");
    cluster.sql("hand", kSchema);
    Connection db(cluster.conninfo("hand"));
    db.query("SELECT sync.pass()");
    std::vector<PerRow> results;
    for (int rows : {2000, 8000, 32000, 100000}) results.push_back(measure(db, rows, runs));
    std::printf(
        "(a) retry of kept rows, slice by slice (sync.retry_uploads(): at most 1,000 items or "
        "100 ms a slice, each its own transaction), median of %d runs:\n",
        runs);
    std::printf("  %10s  %14s  %12s  %14s  %12s\n", "kept rows", "kept again (s)", "us per row",
                "filed now (s)", "us per row");
    for (const PerRow& r : results)
        std::printf("  %10d  %14.3f  %12.1f  %14.3f  %12.1f\n", r.rows, r.kept_again,
                    r.kept_again / r.rows * 1e6, r.filed, r.filed / r.rows * 1e6);
    double kept_ratio = (results.back().kept_again / results.back().rows) /
                        (results.front().kept_again / results.front().rows);
    double filed_ratio = (results.back().filed / results.back().rows) /
                         (results.front().filed / results.front().rows);
    std::printf(
        "  per row, 100,000 over 2,000: kept again %.2fx, filed now %.2fx (goal: within 1.5x): "
        "%s\n",
        kept_ratio, filed_ratio, kept_ratio <= 1.5 && filed_ratio <= 1.5 ? "met" : "NOT met");
}

// Something is due and a slice of this round has run (an item was tried under the current change,
// or is backed off): the worker's retry is under way.
bool retrying(Connection& db) {
    return db.value(
               "SELECT EXISTS (SELECT FROM sync.set_aside WHERE kind = 'upload'"
               "  AND change_seen < (SELECT last_value FROM sync.filing_change))") == "t";
}

void latency_while_retrying(int rounds) {
    Cluster cluster({"magic_sync.database = 'shop'", "magic_sync.window = 10000",
                     "magic_sync.retry_every = '1h'"});
    cluster.create_database("shop");
    cluster.sql("shop", kSchema);
    Connection db(cluster.conninfo("shop"));
    Connection writer(cluster.conninfo("shop"));
    Connection listener(cluster.conninfo("shop"));
    listener.query("LISTEN magic_sync");
    if (!magic_sync::test::eventually(
            [&] { return db.value("SELECT count(*) FROM sync.replica") == "1"; })) {
        std::fprintf(stderr, "the register was not provisioned\n");
        std::exit(1);
    }
    keep_lines(db, 100000, 1);
    db.query("ALTER SYSTEM SET magic_sync.retry_every = '1s'");
    db.query("SELECT pg_reload_conf()");
    std::vector<double> latencies;
    int missed = 0;
    auto started = Clock::now();
    for (int round = 0; round < rounds; ++round) {
        // Everything due again, under a new change; the worker takes it up on its timer.
        db.query("COMMENT ON TABLE lines IS 'round " + std::to_string(round) + "'");
        magic_sync::test::eventually(
            [&] {
                return db.value(
                           "SELECT EXISTS (SELECT FROM sync.set_aside WHERE change_seen ="
                           " (SELECT last_value FROM sync.filing_change))") == "t";
            },
            std::chrono::seconds(30));
        while (await_notify(listener.raw(), std::chrono::milliseconds(0))) {
        }
        for (int i = 0; retrying(db); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            writer.query("UPDATE products SET price = price + 1 WHERE id = 1");
            auto committed = Clock::now();
            if (!await_notify(listener.raw(), std::chrono::seconds(10))) {
                ++missed;
                continue;
            }
            latencies.push_back(
                std::chrono::duration<double, std::milli>(Clock::now() - committed).count());
            while (await_notify(listener.raw(), std::chrono::milliseconds(0))) {
            }
        }
    }
    double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    if (latencies.empty()) {
        std::fprintf(stderr, "no change reached the outbox while the retry ran\n");
        std::exit(1);
    }
    std::printf(
        "(b) commit-to-outbox latency of a catalog change every 100 ms while the relay worker "
        "retries 100,000 kept rows (%d rounds, %.0f s, %zu changes):\n",
        rounds, seconds, latencies.size());
    std::printf("  median %.1f ms   p90 %.1f ms   p99 %.1f ms   max %.1f ms   missed %d\n",
                percentile(latencies, 0.5), percentile(latencies, 0.9), percentile(latencies, 0.99),
                percentile(latencies, 1.0), missed);
    std::printf("  goal: p99 at most 1 s: %s\n",
                percentile(latencies, 0.99) <= 1000.0 && missed == 0 ? "met" : "NOT met");
}

}  // namespace

int main(int argc, char** argv) {
    int runs = argc > 1 ? std::stoi(argv[1]) : 3;
    int rounds = argc > 2 ? std::stoi(argv[2]) : 3;
    time_per_row(runs);
    latency_while_retrying(rounds);
    return 0;
}
