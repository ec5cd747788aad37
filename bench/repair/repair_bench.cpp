// Drift repair (issue 9, docs/DESIGN.md §7): what repairing d differences in a scope of n rows
// costs — bytes server→replica (the assembled messages), bytes replica→server (the uploads) and
// round trips — against provisioning the scope whole, in one run.
//
// The transport is played by the benchmark, so that every byte and every round trip is counted
// exactly: a round trip is one pass (sync.pass(), no relay worker), every message it left in the
// replica's outbox assembled by sync.message(), applied by the reference replica's CLI and marked
// sent, then the replica's next upload filed by sync.receive(). Drift is injected into the
// replica's SQLite file as in the server tests (tests/server/drift.hpp), and after each repair
// the replica's content is compared with the server's row by row.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/drift.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "support/cluster.hpp"

namespace {

using namespace magic_sync::test;

struct Traffic {
    long round_trips = 0;  // exchanges in which the server sent something
    long messages = 0;
    long long down_bytes = 0;
    long uploads = 0;
    long long up_bytes = 0;
};

std::string contents(const std::string& path) {
    std::stringstream text;
    text << std::ifstream(path).rdbuf();
    return text.str();
}

class Rig {
  public:
    explicit Rig(long rows) {
        cluster_ = std::make_unique<Cluster>();
        cluster_->create_database("shop");
        cluster_->sql("shop", R"sql(
            CREATE SCHEMA shop;
            CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
            CREATE TABLE shop.items (id int PRIMARY KEY, name text NOT NULL, price int NOT NULL);
            SELECT sync.replicas('shop.registers', 'registers', live => 'active');
            SELECT sync.catalog('shop.items');
        )sql");
        cluster_->sql("shop",
                      "INSERT INTO shop.items SELECT i, 'item ' || i, i % 97"
                      " FROM generate_series(1, " +
                          std::to_string(rows) + ") i");
        db_ = std::make_unique<Connection>(cluster_->conninfo("shop"));
        // Every row planned before the replica joins, so that it is provisioned from a scope at
        // rest.
        while (db_->value("SELECT count(*) FROM sync.note") != "0")
            db_->query("SELECT sync.pass()");
        char pattern[] = "/tmp/magic_sync_bench.XXXXXX";
        directory_ = mkdtemp(pattern);
        replica_ = replica_id(1);
        file_ = directory_ + "/replica.db";
        cli_ = "build/bin/magic-sync-replica --id " + replica_ + " --db " + file_;
        db_->query("INSERT INTO shop.registers (id) VALUES ($1::uuid)", {replica_});
    }
    ~Rig() {
        db_.reset();
        cluster_.reset();
        run("rm -rf " + directory_);
    }

    // Passes and exchanges until the server has nothing more to send and no repair under way.
    Traffic settle() {
        Traffic traffic;
        // Two quiet exchanges in a row: the second pass saw what the first one's upload said.
        for (int quiet = 0, exchanges = 0; quiet < 2; ++exchanges) {
            if (exchanges > 10000) throw std::runtime_error("the exchanges do not end");
            if (exchange(traffic) > 0) {
                ++traffic.round_trips;
                quiet = 0;
            } else if (db_->value("SELECT count(*) FROM sync.repair") == "0") {
                ++quiet;
            }
        }
        return traffic;
    }

    // Drift of `total` differences behind the replica's back; returns the traffic from its report
    // (the upload that carries the drifted fingerprint) until the server has nothing more to send.
    Traffic repair(int total, int round) {
        std::string error =
            inject_drift(cli_, file_,
                         drift_statements("shop.items", drift_of(total), 1000000 * round,
                                          R"({"name":"foreign","price":1})"),
                         directory_ + "/drift.sql");
        if (!error.empty()) throw std::runtime_error(error);
        if (held() == expected()) throw std::runtime_error("the drift changed nothing");
        Traffic traffic;
        upload(traffic);
        Traffic rest = settle();
        traffic.round_trips = rest.round_trips;
        traffic.messages = rest.messages;
        traffic.down_bytes = rest.down_bytes;
        traffic.uploads += rest.uploads;
        traffic.up_bytes += rest.up_bytes;
        return traffic;
    }

    // The replica holds exactly what the server says, row by row, and is shown in sync.
    void check() {
        if (held() != expected()) throw std::runtime_error("the replica's rows differ");
        std::string state =
            db_->value("SELECT state FROM sync.status WHERE replica = $1::uuid", {replica_});
        if (state != "in sync") throw std::runtime_error("the replica is " + state);
    }

    long scope_rows() {
        return std::stol(db_->value("SELECT n FROM sync.scope WHERE match = '*'"));
    }

  private:
    std::string held() { return held_by(cli_); }
    std::string expected() { return db_->value(kExpectedHoldings, {replica_}); }

    // One pass, its messages delivered and applied, then the replica's upload; returns the
    // number of messages the server sent.
    long exchange(Traffic& traffic) {
        db_->query("SELECT sync.pass()");
        long sent = 0;
        for (const auto& row : db_->query("SELECT seq FROM sync.outbox WHERE replica = $1::uuid"
                                          " AND sent_at IS NULL ORDER BY seq",
                                          {replica_})) {
            const std::string seq = row[0].value();
            auto message = db_->query(
                "SELECT octet_length(m), convert_from(m, 'UTF8') FROM sync.message($1::uuid,"
                " $2::bigint) m",
                {replica_, seq});
            traffic.down_bytes += std::stoll(message.front()[0].value());
            std::ofstream(directory_ + "/message.json") << message.front()[1].value();
            std::string output;
            if (run(cli_ + " apply " + directory_ + "/message.json", &output) != 0)
                throw std::runtime_error("apply: " + output);
            db_->query("SELECT sync.sent($1::uuid, $2::bigint)", {replica_, seq});
            ++sent;
        }
        traffic.messages += sent;
        upload(traffic);
        return sent;
    }

    // The replica's next upload, if it has one, filed.
    void upload(Traffic& traffic) {
        const std::string body_file = directory_ + "/upload.json";
        std::string output;
        if (run("(" + cli_ + " upload > " + body_file + " 2>" + directory_ + "/upload.err)",
                &output) != 0)
            throw std::runtime_error("upload: " + contents(directory_ + "/upload.err"));
        std::string text = contents(body_file);
        while (!text.empty() && text.back() == '\n') text.pop_back();
        if (text.empty()) return;
        db_->query("SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))", {replica_, text});
        if (run(cli_ + " upload --sent " + nlohmann::json::parse(text)["id"].get<std::string>(),
                &output) != 0)
            throw std::runtime_error("upload --sent: " + output);
        ++traffic.uploads;
        traffic.up_bytes += static_cast<long long>(text.size());
    }

    std::unique_ptr<Cluster> cluster_;
    std::unique_ptr<Connection> db_;
    std::string directory_;
    std::string replica_;
    std::string file_;
    std::string cli_;
};

std::string thousands(long long value) {
    std::string digits = std::to_string(value), out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    const long rows = argc > 1 ? std::stol(argv[1]) : 100000;
    std::vector<int> sizes;
    for (int i = 2; i < argc; ++i) sizes.push_back(std::stoi(argv[i]));
    if (sizes.empty()) sizes = {1, 10, 100, 1000};
    try {
        Rig rig(rows);
        Traffic whole = rig.settle();
        rig.check();
        const long n = rig.scope_rows();
        const int bound = static_cast<int>(std::ceil(std::log(n) / std::log(16.0) - 1e-9)) + 2;
        std::printf("drift repair, one scope of %s rows (one catalog table), one replica\n",
                    thousands(n).c_str());
        std::printf("provisioning the scope whole: %s bytes down in %s messages, %s bytes up\n\n",
                    thousands(whole.down_bytes).c_str(), thousands(whole.messages).c_str(),
                    thousands(whole.up_bytes).c_str());
        std::printf(
            "| d | bytes down (messages) | bytes up (uploads) | both ways / whole scope |"
            " round trips (goal ≤ %d) | time |\n",
            bound);
        std::printf("| --- | --- | --- | --- | --- | --- |\n");
        int round = 0;
        for (int d : sizes) {
            const auto started = std::chrono::steady_clock::now();
            Traffic t = rig.repair(d, ++round);
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
            rig.check();
            const double share = 100.0 * static_cast<double>(t.down_bytes + t.up_bytes) /
                                 static_cast<double>(whole.down_bytes);
            std::printf("| %s | %s (%ld) | %s (%ld) | %.3f %% | %ld | %.1f s |\n",
                        thousands(d).c_str(), thousands(t.down_bytes).c_str(), t.messages,
                        thousands(t.up_bytes).c_str(), t.uploads, share, t.round_trips, seconds);
            std::fflush(stdout);
        }
    } catch (const std::exception& error) {
        std::fprintf(stderr, "bench-repair: %s\n", error.what());
        return 1;
    }
    return 0;
}
