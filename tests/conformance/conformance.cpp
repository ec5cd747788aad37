// The conformance suite (docs/PROTOCOL.md, "Conformance"): drives any replica implementation
// through the interface the reference replica's command line offers, against a real server, and
// prints which cases pass. The suite plays the sender (it leases each message with sync.next, adds
// its origin as a sender does and hands it to the replica's `apply`) and the app's upload route
// (the replica's `upload` goes to sync.receive). What the replica must hold is sync.expected(),
// worked out from the tables and declarations alone.
//
//   build/tests/conformance --replica 'COMMAND'
//
// COMMAND is run as `COMMAND --id UUID --db FILE <operation>` for each operation of the interface.
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "protocol/fingerprint.hpp"
#include "protocol/gzip.hpp"
#include "protocol/messages.hpp"
#include "server/pq.hpp"
#include "support/cluster.hpp"
#include "support/temp_dir.hpp"

namespace magic_sync::test {
namespace {

using nlohmann::json;

const char* const kUsage = R"(usage: conformance --replica 'COMMAND' [--verbose]

Runs the conformance cases of docs/PROTOCOL.md against the replica COMMAND, with a real
PostgreSQL and magic_sync (installed: make install), and prints one line per case. Exit status 0
when every case passes. COMMAND is run as `COMMAND --id UUID --db FILE OPERATION`, OPERATION one
of: apply - (a message on stdin; exit 0 taken, 65 refused, 75 try again), show --json,
write TABLE JSON --key COLUMNS, upload, upload --sent ID. --verbose prints each operation, its
exit status and how long it took, on standard error.
)";

const char* const kSchema = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE shop.items (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2),
                             ratio float8, tags text[], doc jsonb, changed_at timestamptz);
    CREATE TABLE shop.sales (id uuid PRIMARY KEY, register_id uuid NOT NULL,
                             item_id int NOT NULL REFERENCES shop.items,
                             qty int NOT NULL CHECK (qty > 0));
    INSERT INTO shop.items
    SELECT i, 'item ' || i || ' ✓', i * 1.25, 1.0 / i, ARRAY['a', 'b' || i],
           jsonb_build_object('n', i, 'deep', jsonb_build_array(true, null, 1.50)),
           '2026-12-01 10:00:00+00'::timestamptz + i * interval '1 minute'
    FROM generate_series(1, 40) i;
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.items');
    SELECT sync.record('shop.sales');
)sql";

const std::string kReplicaId = "7a3e5c1d-0000-4000-8000-000000000001";

// A failed check: what differed.
struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void require(bool condition, const std::string& what) {
    if (!condition) throw Failure(what);
}

std::string excerpt(const std::string& text) {
    return text.size() > 300 ? text.substr(0, 300) + "..." : text;
}

class Suite {
  public:
    ~Suite() {
        std::error_code ignored;  // a destructor has no one to tell
        if (!dump_directory_.empty()) std::filesystem::remove_all(dump_directory_, ignored);
    }
    Suite(const Suite&) = delete;
    Suite& operator=(const Suite&) = delete;

    Suite(std::string command, bool verbose) : command_(std::move(command)), verbose_(verbose) {
        cluster_.create_database("shop");
        db_ = std::make_unique<Connection>(cluster_.conninfo("shop"));
        cluster_.sql("shop", kSchema);
        db_->query("INSERT INTO shop.registers (id) VALUES ($1::uuid)", {kReplicaId});
    }

    // Runs every case in order (each builds on what the ones before left); returns the failures.
    int run_cases() {
        int failed = 0;
        for (const auto& [name, body] : cases()) {
            const auto started = std::chrono::steady_clock::now();
            const auto took = [&] {
                return " (" +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - started)
                                          .count()) +
                       " ms)";
            };
            try {
                body();
                std::cout << "ok    " << name << took() << std::endl;
            } catch (const std::exception& e) {
                ++failed;
                std::cout << "FAIL  " << name << took() << ": " << e.what() << std::endl;
            }
        }
        std::cout << (failed == 0 ? "every case passed" : std::to_string(failed) + " failed")
                  << std::endl;
        return failed;
    }

  private:
    using Case = std::pair<std::string, std::function<void()>>;

    std::vector<Case> cases() {
        return {
            {"rows: provisioned, it holds what the tables say", [&] { converge_and_compare(); }},
            {"rows: changes, moves of values and deletes reach it",
             [&] {
                 db_->query(
                     "UPDATE shop.items SET ratio = '1e-320', doc = '{\"s\": \"é\\\"q\"}' "
                     "WHERE id = 1");
                 db_->query("UPDATE shop.items SET ratio = 'NaN', tags = '{}' WHERE id = 2");
                 db_->query("UPDATE shop.items SET price = NULL, name = 'renamed' WHERE id <= 5");
                 db_->query("DELETE FROM shop.items WHERE id BETWEEN 30 AND 34");
                 db_->query("INSERT INTO shop.items (id, name) VALUES (41, 'new')");
                 converge_and_compare();
             }},
            {"faults: a message applied again changes nothing",
             [&] {
                 require(!last_rows_.empty(), "no rows message was delivered");
                 unchanged_by(last_rows_, 0);
             }},
            {"faults: a message of a newer protocol version is not taken now (exit 75: after an "
             "upgrade) and changes nothing",
             [&] {
                 json message = json::parse(last_rows_);
                 message["v"] = 99;
                 message["seq"] = message["seq"].get<int64_t>() + 1000;
                 unchanged_by(message.dump(), 75);
             }},
            {"compressed: messages sent gzip (a sender's --gzip) are applied as their JSON",
             [&] {
                 gzip_ = true;
                 db_->query("UPDATE shop.items SET name = 'sent gzip' WHERE id BETWEEN 6 AND 9");
                 db_->query("DELETE FROM shop.items WHERE id = 35");
                 sent_gzip_ = 0;
                 converge_and_compare();
                 gzip_ = false;
                 require(sent_gzip_ > 0, "no message was delivered gzip");
             }},
            {"faults: a message it cannot read is refused and changes nothing",
             [&] { unchanged_by("{\"v\":1,\"kind\":\"rows\",", 65); }},
            {"faults: a message to another replica is refused and changes nothing",
             [&] {
                 json message = json::parse(last_rows_);
                 message["replica"] = "7a3e5c1d-0000-4000-8000-000000000099";
                 message["seq"] = message["seq"].get<int64_t>() + 1000;
                 unchanged_by(message.dump(), 65);
             }},
            {"uploads: a local row is filed, and the app sees the server's row",
             [&] {
                 write("shop.sales", sale("00000000-0000-4000-8000-0000000000a1", 3, 2));
                 converge_and_compare();
                 require(db_->value("SELECT qty FROM shop.sales WHERE id = "
                                    "'00000000-0000-4000-8000-0000000000a1'") == "2",
                         "the sale is not in shop.sales");
                 require(shown()["local_writes"].empty(),
                         "local writes left: " + shown()["local_writes"].dump());
                 require(shown()["kept"].empty(), "kept: " + shown()["kept"].dump());
             }},
            {"uploads: a row the server cannot file is kept, with the server's reason",
             [&] {
                 write("shop.sales", sale("00000000-0000-4000-8000-0000000000a2", 3, 0));
                 write("shop.sales", sale("00000000-0000-4000-8000-0000000000a3", 999, 1));
                 converge_and_compare();
                 compare_kept();
                 require(shown()["kept"].size() == 2, "kept: " + shown()["kept"].dump());
             }},
            {"uploads: a kept row filed later is no longer kept",
             [&] {
                 db_->query("INSERT INTO shop.items (id, name) VALUES (999, 'late')");
                 db_->query("SELECT count(*) FROM sync.retry_set_aside()");
                 converge_and_compare();
                 compare_kept();
                 require(shown()["kept"].size() == 1, "kept: " + shown()["kept"].dump());
             }},
            {"generations: provisioned again, it holds the new generation's rows",
             [&] {
                 older_generation_ = last_rows_;
                 db_->query("UPDATE shop.registers SET active = false");
                 pass_until_quiet();
                 db_->query("DELETE FROM shop.items WHERE id BETWEEN 20 AND 24");
                 db_->query("UPDATE shop.registers SET active = true");
                 converge_and_compare();
             }},
            {"generations: a message of the generation before is not applied",
             [&] { unchanged_by(older_generation_, 0); }},
            {"fingerprints: what it reports holding is what the server proves",
             [&] {
                 compare_holds();
                 require(db_->value("SELECT state FROM sync.status WHERE replica = $1::uuid",
                                    {kReplicaId}) == "in sync",
                         "sync.status does not say in sync: " +
                             db_->value("SELECT row_to_json(s)::text FROM sync.status s"));
             }},
            {"history: restored to an earlier dump, it proves what it holds and is repaired",
             [&] {
                 dump_directory_ = make_postgres_directory("magic_sync_conformance_dump");
                 const std::string dump = dump_directory_ + "/shop.dump";
                 pg("pg_dump -Fc -f " + dump + " -d '" + cluster_.conninfo("shop") + "'");
                 db_->query("DELETE FROM shop.items WHERE id BETWEEN 10 AND 12");
                 db_->query("UPDATE shop.items SET name = 'lost with the restore' WHERE id = 13");
                 converge_and_compare();
                 db_.reset();
                 cluster_.sql("postgres", "DROP DATABASE shop WITH (FORCE)");
                 cluster_.sql("postgres", "CREATE DATABASE shop TEMPLATE template0");
                 pg("pg_restore -d '" + cluster_.conninfo("shop") + "' " + dump);
                 db_ = std::make_unique<Connection>(cluster_.conninfo("shop"));
                 kinds_.clear();
                 converge_and_compare();
                 require(kinds_.count("ranges") && kinds_.count("repair"),
                         "it was not asked for ranges and repaired (kinds delivered: " +
                             json(kinds_).dump() + ")");
                 compare_holds();
             }},
        };
    }

    // ---- the replica's interface ---------------------------------------------------------

    // Runs an operation; returns its exit status, its standard output in `out`.
    int replica(const std::string& operation, std::string* out = nullptr,
                const std::string& input = "") {
        const std::string in = dir_.file("stdin"), err = dir_.file("stderr");
        std::ofstream(in, std::ios::binary) << input;
        std::string output;
        const auto started = std::chrono::steady_clock::now();
        const int status =
            run("(" + command_ + " --id " + kReplicaId + " --db " + dir_.file("replica.db") + " " +
                    operation + " <" + in + " 2>" + err + ")",
                &output);
        if (out) *out = output;
        last_error_ = read(err);
        if (verbose_) {
            std::cerr << "  " << operation.substr(0, 60) << " → exit " << status << " "
                      << excerpt(output.substr(0, output.find('\n'))) << " in "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - started)
                             .count()
                      << " ms" << std::endl;
        }
        return status;
    }

    json shown() {
        std::string out;
        require(replica("show --json", &out) == 0, "show --json failed: " + last_error_);
        return json::parse(out);
    }

    void write(const std::string& table, const json& row) {
        std::string out;
        require(replica("write " + table + " " + quote(row.dump()) + " --key id", &out) == 0,
                "write failed: " + last_error_);
    }

    // ---- the sender and the route -----------------------------------------------------------

    void pass_until_quiet() {
        for (int i = 0; i < 200; ++i) {
            const auto started = std::chrono::steady_clock::now();
            auto counts = db_->query("SELECT notes, messages FROM sync.pass()");
            if (verbose_) {
                std::cerr << "  pass → " << *counts.front()[0] << " notes, " << *counts.front()[1]
                          << " messages in "
                          << std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now() - started)
                                 .count()
                          << " ms" << std::endl;
            }
            if (counts.front()[0] == "0" && counts.front()[1] == "0") return;
        }
        throw Failure("the relay's passes did not end");
    }

    // Every unsent message leased, given to the replica with its origin as a sender does, and
    // its outcome reported; returns how many.
    int deliver() {
        int delivered = 0;
        for (;;) {
            auto leased = db_->query(
                "SELECT replica, seq, convert_from(message, 'UTF8'), origin "
                "FROM sync.next(100, '1 minute')");
            if (leased.empty()) return delivered;
            for (const auto& row : leased) {
                const std::string message = protocol::with_origin(*row[2], *row[3]);
                const std::string kind = json::parse(message)["kind"];
                ++kinds_[kind];
                if (verbose_) std::cerr << "  deliver " << excerpt(message) << std::endl;
                std::string out;
                if (gzip_) ++sent_gzip_;
                const int status =
                    replica("apply -", &out, gzip_ ? protocol::gzip(message) : message);
                if (status == 0) {
                    db_->query("SELECT sync.sent($1::uuid, $2::bigint)", {*row[0], *row[1]});
                } else {
                    db_->query("SELECT sync.failed($1::uuid, $2::bigint, $3, $4)",
                               {*row[0], *row[1], status == 75 ? "true" : "false",
                                "apply exited " + std::to_string(status) + ": " + last_error_});
                    throw Failure("the replica did not take a " + kind + " message (exit " +
                                  std::to_string(status) + "): " + last_error_ + "\n  message " +
                                  excerpt(message));
                }
                if (kind == "rows") last_rows_ = message;
                ++delivered;
            }
        }
    }

    // The replica's next upload through sync.receive, then confirmed; false when it has none.
    bool upload() {
        std::string body;
        require(replica("upload", &body) == 0, "upload failed: " + last_error_);
        if (body.find_first_not_of(" \n") == std::string::npos) return false;
        db_->query("SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))", {kReplicaId, body});
        const std::string id = json::parse(body)["id"];
        require(replica("upload --sent " + id) == 0, "upload --sent failed: " + last_error_);
        return true;
    }

    // Passes, deliveries and uploads until nothing moves.
    void converge() {
        for (int round = 0; round < 100; ++round) {
            pass_until_quiet();
            const int delivered = deliver();
            const bool uploaded = upload();
            if (delivered == 0 && !uploaded) return;
        }
        throw Failure("it did not settle in 100 rounds");
    }

    // ---- what it must hold ------------------------------------------------------------------

    void converge_and_compare() {
        converge();
        std::map<std::pair<std::string, std::string>, std::pair<json, std::string>> expected, held;
        for (const auto& row :
             db_->query("SELECT table_name, key, \"row\", h FROM sync.expected($1::uuid) "
                        "WHERE NOT withheld",
                        {kReplicaId}))
            expected[{*row[0], json::parse(*row[1]).dump()}] = {json::parse(*row[2]), *row[3]};
        json state = shown();
        for (auto& [table, rows] : state["held"].items())
            for (const json& row : rows)
                held[{table, row["k"].dump()}] = {row["r"], row["h"].get<std::string>()};
        for (const auto& [key, want] : expected) {
            auto got = held.find(key);
            require(got != held.end(), "missing " + key.first + " " + key.second);
            require(got->second.first == want.first, "different " + key.first + " " + key.second +
                                                         ": expected " + want.first.dump() +
                                                         ", held " + got->second.first.dump());
            require(got->second.second == want.second, "h of " + key.first + " " + key.second +
                                                           ": expected " + want.second + ", held " +
                                                           got->second.second);
        }
        for (const auto& [key, row] : held)
            require(expected.count(key), "held but not expected: " + key.first + " " + key.second);
    }

    // The replica's kept rows are the ones the server's last answer to each of its uploads
    // names, with their reasons.
    void compare_kept() {
        std::set<std::string> server, device;
        for (const auto& row :
             db_->query("SELECT e->>'t', e->>'k', e->>'why' FROM sync.upload u, "
                        "jsonb_array_elements(u.kept) e WHERE u.replica = $1::uuid",
                        {kReplicaId}))
            server.insert(*row[0] + " " + json::parse(*row[1]).dump() + ": " + *row[2]);
        const json state = shown();
        for (const json& kept : state["kept"])
            device.insert(kept["t"].get<std::string>() + " " + kept["k"].dump() + ": " +
                          kept["why"].get<std::string>());
        require(server == device, "kept differ: the server's answers keep " + json(server).dump() +
                                      ", it lists " + json(device).dump());
    }

    // Its holds are the fingerprints of what sync.expected says it holds, scope by scope.
    void compare_holds() {
        std::map<std::string, protocol::Fingerprint> expected;
        for (const auto& row : db_->query(
                 "SELECT table_name, key, h, scope FROM sync.expected($1::uuid) WHERE NOT withheld",
                 {kReplicaId}))
            expected[*row[3]].add(protocol::element(protocol::key_hash(*row[0], *row[1]),
                                                    protocol::digest_from_hex(*row[2])));
        json holds = shown()["holds"];
        for (const auto& [scope, fingerprint] : expected) {
            require(holds.contains(scope), "it does not report holding " + scope);
            require(
                holds[scope]["fp"] == fingerprint.hex() && holds[scope]["n"] == fingerprint.count,
                "scope " + scope + ": it reports " + holds[scope].dump());
        }
    }

    // `message` given to the replica exits with `status` and leaves what it shows as it was.
    void unchanged_by(const std::string& message, int status) {
        json before = shown();
        before.erase("notices");
        std::string out;
        const int got = replica("apply -", &out, message);
        require(got == status, "exit " + std::to_string(got) + ", not " + std::to_string(status) +
                                   ": " + last_error_ + excerpt(out));
        json after = shown();
        after.erase("notices");
        require(after == before, "what it holds changed: " + excerpt(after.dump()));
    }

    // ---- helpers -----------------------------------------------------------------------------

    static json sale(const std::string& id, int item, int qty) {
        return {{"id", id}, {"register_id", kReplicaId}, {"item_id", item}, {"qty", qty}};
    }

    static std::string quote(const std::string& text) {
        std::string quoted = "'";
        for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
        return quoted + "'";
    }

    static std::string read(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
    }

    void pg(const std::string& command) {
        std::string output;
        require(run(as_postgres(pg_bindir() + "/" + command), &output) == 0,
                command + ": " + output);
    }

    std::string command_;
    bool verbose_;
    Cluster cluster_{{"magic_sync.database = ''"}};
    std::unique_ptr<Connection> db_;
    TempDir dir_{"magic_sync_conformance"};
    std::string last_error_;
    std::string last_rows_;
    std::string older_generation_;
    bool gzip_ = false;  // messages delivered gzip-compressed, as a sender's --gzip sends them
    int sent_gzip_ = 0;
    std::string dump_directory_;  // made for the postgres user, who writes the dump
    std::map<std::string, int> kinds_;
};

}  // namespace
}  // namespace magic_sync::test

int main(int argc, char** argv) {
    std::string command;
    bool verbose = false;
    for (int i = 1; i < argc; ++i) {
        const std::string argument = argv[i];
        if (argument == "--help" || argument == "-h") {
            std::cout << magic_sync::test::kUsage;
            return 0;
        }
        if (argument == "--replica" && i + 1 < argc) {
            command = argv[++i];
        } else if (argument == "--verbose") {
            verbose = true;
        } else {
            std::cerr << "conformance: unknown argument " << argument << "\n"
                      << magic_sync::test::kUsage;
            return 2;
        }
    }
    if (command.empty()) {
        std::cerr << magic_sync::test::kUsage;
        return 2;
    }
    try {
        magic_sync::test::Suite suite(command, verbose);
        return suite.run_cases() == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::cerr << "conformance: " << e.what() << std::endl;
        return 1;
    }
}
