// magic-sync-replica as a real process: its commands, `serve` answering only after commit, and a
// kill -9 in the middle of a stream of messages.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <set>

#include "lib/replica.hpp"
#include "lib/sqlite.hpp"
#include "protocol/gzip.hpp"
#include "replica/support.hpp"
#include "support/cluster.hpp"

namespace magic_sync::replica::test {
namespace {

const std::string kProducts = "shop.products";

std::string key_of(int id) { return R"({"id":)" + std::to_string(id) + "}"; }
std::string body_of(int id) {
    return R"({"id":)" + std::to_string(id) + R"(,"name":"p)" + std::to_string(id) + "\"}";
}

class CliTest : public ::testing::Test {
  protected:
    TempDir dir;
    std::string db = dir.file("replica.db");

    std::vector<std::string> base() const { return {"--id", kReplicaId, "--db", db}; }
    std::vector<std::string> with(std::vector<std::string> args) const {
        std::vector<std::string> all = base();
        all.insert(all.end(), args.begin(), args.end());
        return all;
    }
    int cli(const std::vector<std::string>& args, std::string* out = nullptr) const {
        return run_cli(with(args), out);
    }
    std::unique_ptr<Process> serve(int port) const {
        std::vector<std::string> args = {replica_binary()};
        for (const std::string& arg :
             with({"serve", "--listen", "127.0.0.1:" + std::to_string(port)}))
            args.push_back(arg);
        return std::make_unique<Process>(args, dir.file("serve.log"));
    }
};

TEST_F(CliTest, CommandsWorkAndExplainThemselves) {
    std::string out;
    EXPECT_EQ(run_cli({"--help"}, &out), 0);
    EXPECT_NE(out.find("commands:"), std::string::npos);
    for (const char* command : {"serve", "nats", "apply", "show", "write", "upload", "holds"}) {
        EXPECT_EQ(run_cli({command, "--help"}, &out), 0) << command;
        EXPECT_NE(out.find(std::string("usage: magic-sync-replica --id UUID --db FILE ") + command),
                  std::string::npos)
            << out;
    }
    EXPECT_EQ(run_cli({"--id", kReplicaId, "--db", db, "frobnicate"}, &out), 2);
    EXPECT_NE(out.find("unknown command frobnicate"), std::string::npos);
    EXPECT_EQ(run_cli({"--db", db, "show"}, &out), 2);
    EXPECT_NE(out.find("--id UUID is required"), std::string::npos);
    EXPECT_EQ(run_cli({"--id", "not-a-uuid", "--db", db, "show"}, &out), 2);
    EXPECT_EQ(cli({"show", "--colour"}, &out), 2);
    EXPECT_NE(out.find("unknown option --colour"), std::string::npos);
    EXPECT_EQ(cli({"serve"}, &out), 2);
    EXPECT_NE(out.find("serve needs --listen"), std::string::npos);

    // apply: the exec transport's exit codes.
    write_file(dir.file("m1"), rows_message(1, 1,
                                            {chunk("all", 0, 3,
                                                   {row(kProducts, key_of(1), body_of(1)),
                                                    row(kProducts, key_of(2), body_of(2))})},
                                            {"*"}));
    write_file(dir.file("garbage"), "{\"v\":1}");
    EXPECT_EQ(cli({"apply", dir.file("m1")}, &out), 0);
    EXPECT_NE(out.find("applied rows 1.1"), std::string::npos) << out;
    EXPECT_EQ(cli({"apply", dir.file("m1")}, &out), 0);
    EXPECT_NE(out.find("already applied"), std::string::npos);
    EXPECT_EQ(cli({"apply", dir.file("garbage")}, &out), 65);
    EXPECT_EQ(run_cli(with({"apply", "-"}), &out, dir.file("m1")), 0);

    EXPECT_EQ(cli({"write", "shop.sales", R"({"id":9,"total":1.50})"}, &out), 0);
    EXPECT_NE(out.find(R"(queued shop.sales {"id":9})"), std::string::npos) << out;
    EXPECT_EQ(cli({"write", "shop.notes", R"({"code":"x"})"}, &out), 1);
    EXPECT_NE(out.find("--key"), std::string::npos) << out;

    EXPECT_EQ(cli({"show", "--json"}, &out), 0);
    EXPECT_NE(
        out.find(
            R"("held":{"shop.products":[{"k":{"id":1},"r":{"id":1,"name":"p1"},"scope":"all")"),
        std::string::npos)
        << out;
    EXPECT_NE(out.find(R"("shop.sales":[{"k":{"id":9},"r":{"id":9,"total":1.50},"local":true}])"),
              std::string::npos)
        << out;
    EXPECT_EQ(cli({"show"}, &out), 0);
    EXPECT_NE(out.find("shop.products (2 rows)"), std::string::npos) << out;

    // upload prints the same upload until it is confirmed sent.
    std::string first, second;
    EXPECT_EQ(cli({"upload"}, &first), 0);
    protocol::Upload upload = protocol::decode_upload(first);
    ASSERT_EQ(upload.rows.size(), 1u);
    EXPECT_EQ(upload.applied, 1);
    EXPECT_EQ(cli({"upload"}, &second), 0);
    EXPECT_EQ(first, second);
    EXPECT_EQ(cli({"upload", "--sent", upload.id}), 0);
    EXPECT_EQ(cli({"upload"}, &out), 0);
    EXPECT_EQ(out, "nothing to upload\n");

    EXPECT_EQ(cli({"holds", "--verify"}, &out), 0);
    EXPECT_NE(out.find("all through=3 n=2 fp="), std::string::npos) << out;
    EXPECT_NE(out.find("verified"), std::string::npos);
    // Drift behind the library's back (a row deleted in the file): the check finds it.
    {
        Database file(db);
        file.exec("DELETE FROM rows WHERE key = '{\"id\":2}'");
    }
    EXPECT_EQ(cli({"holds", "--verify"}, &out), 1);
    EXPECT_NE(out.find("DIFFERS from the stored rows: n=1"), std::string::npos) << out;
}

// Sends until answered 200 (the server may still be starting).
int post_until_answered(int port, const std::string& body) {
    std::optional<int> status;
    eventually([&] { return (status = http_post(port, body)).has_value(); });
    return status.value_or(-1);
}

TEST_F(CliTest, ServeAnswers2xxOnlyAfterCommit) {
    int port = magic_sync::test::free_port();
    std::string first =
        rows_message(1, 1, {chunk("all", 0, 1, {row(kProducts, key_of(1), body_of(1))})}, {"*"});
    std::string second =
        rows_message(1, 2, {chunk("all", 1, 2, {row(kProducts, key_of(2), body_of(2))})});

    auto server = serve(port);
    ASSERT_EQ(post_until_answered(port, first), 200) << server->log();
    // Killed right after answering: what it answered for is in the file.
    server->kill9();
    {
        Replica replica(db, kReplicaId);
        EXPECT_EQ(replica.applied_seq(), 1);
        EXPECT_EQ(replica.held_rows().size(), 1u);
    }

    // While it cannot commit (another writer holds the file), it does not answer 2xx.
    server = serve(port);
    ASSERT_EQ(post_until_answered(port, first), 200);  // already applied, taken
    {
        Database holder(db);
        Transaction lock(holder);
        EXPECT_FALSE(http_post(port, second, std::chrono::milliseconds(1500)).has_value());
        server->kill9();
    }
    {
        Replica replica(db, kReplicaId);
        EXPECT_EQ(replica.applied_seq(), 1);
        EXPECT_EQ(replica.held_rows().size(), 1u);
    }

    server = serve(port);
    std::string future = second;
    future.replace(future.find("\"v\":1"), 5, "\"v\":7");
    EXPECT_EQ(post_until_answered(port, "not json"), 400);
    EXPECT_EQ(post_until_answered(
                  port, rows_message(1, 2, {}, {}, {}, "99999999-2222-4333-8444-555555555555")),
              400);
    EXPECT_EQ(post_until_answered(port, future), 422);
    // A sender's --gzip: the message compressed and said so; an encoding it cannot read, refused.
    EXPECT_EQ(http_post(port, protocol::gzip(second), std::chrono::seconds(10), "1.2",
                        "Content-Encoding: br\r\n"),
              415);
    EXPECT_EQ(http_post(port, protocol::gzip(second), std::chrono::seconds(10), "1.2",
                        "Content-Encoding: GZIP\r\n"),
              200);
    EXPECT_EQ(post_until_answered(port, second), 200);  // twice: taken, nothing changes
    EXPECT_EQ(post_until_answered(port, rows_message(0, 9, {})), 200);  // older generation
    EXPECT_EQ(server->terminate(), 0);
    Replica replica(db, kReplicaId);
    EXPECT_EQ(replica.applied_seq(), 2);
    EXPECT_EQ(replica.held_rows().size(), 2u);
    EXPECT_EQ(replica.holdings().at(0).fingerprint, replica.recompute("all"));
}

// Message i puts rows 20i..20i+19 and deletes the rows message i-3 put.
std::string stream_message(int i) {
    std::vector<protocol::DownRow> rows;
    for (int j = 0; j < 20; ++j)
        rows.push_back(row(kProducts, key_of(20 * i + j), body_of(20 * i + j)));
    if (i > 3) {
        for (int j = 0; j < 20; ++j) rows.push_back(gone(kProducts, key_of(20 * (i - 3) + j)));
    }
    return rows_message(1, i, {chunk("all", i - 1, i, rows)},
                        i == 1 ? std::vector<std::string>{"*"} : std::vector<std::string>{});
}

std::set<std::string> expected_keys_after(int seq) {
    std::set<std::string> keys;
    for (int i = std::max(1, seq - 2); i <= seq; ++i) {
        for (int j = 0; j < 20; ++j) keys.insert(key_of(20 * i + j));
    }
    if (seq == 0) keys.clear();
    return keys;
}

void expect_consistent(const std::string& db, int at_least) {
    Replica replica(db, kReplicaId);
    int seq = static_cast<int>(replica.applied_seq());
    EXPECT_GE(seq, at_least);
    std::set<std::string> keys;
    for (const HeldRow& row : replica.held_rows()) keys.insert(row.key);
    EXPECT_EQ(keys, expected_keys_after(seq)) << "at seq " << seq;
    for (const ScopeHolding& holding : replica.holdings()) {
        EXPECT_EQ(holding.fingerprint, replica.recompute(holding.scope));
        EXPECT_EQ(holding.through, seq);
    }
}

TEST_F(CliTest, KillMinusNineMidStreamLosesNothing) {
    const int kMessages = 150;
    int port = magic_sync::test::free_port();
    std::atomic<int> acknowledged{0};
    std::mt19937 random(7);
    for (int round = 0; round < 3; ++round) {
        auto server = serve(port);
        // The kill comes at a random moment while messages are in flight.
        int kill_after = acknowledged + 10 + static_cast<int>(random() % 30);
        auto pause = std::chrono::microseconds(random() % 3000);
        std::thread killer([&] {
            eventually([&] { return acknowledged >= kill_after; });
            std::this_thread::sleep_for(pause);
            server->kill9();
        });
        // The first one waits for the server to listen; after that a missing answer is the kill.
        ASSERT_EQ(post_until_answered(port, stream_message(acknowledged + 1)), 200);
        ++acknowledged;
        while (acknowledged < kMessages) {
            std::optional<int> status = http_post(port, stream_message(acknowledged + 1));
            if (!status) break;
            ASSERT_EQ(*status, 200);
            ++acknowledged;
        }
        killer.join();
        ASSERT_LT(acknowledged, kMessages) << "the kill came too late to be mid-stream";
        // Every acknowledged message is in the file, with its rows, and nothing half applied.
        expect_consistent(db, acknowledged);
    }
    // The rest, after a last restart; the message in flight at the kill comes again and is
    // recognised as applied if it was.
    auto server = serve(port);
    ASSERT_EQ(post_until_answered(port, stream_message(acknowledged)), 200) << server->log();
    for (int i = acknowledged + 1; i <= kMessages; ++i) {
        ASSERT_EQ(http_post(port, stream_message(i)), 200) << server->log();
    }
    EXPECT_EQ(server->terminate(), 0);
    expect_consistent(db, kMessages);
}

}  // namespace
}  // namespace magic_sync::replica::test
