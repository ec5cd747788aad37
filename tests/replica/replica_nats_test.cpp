// `nats` against a real nats-server with JetStream: messages published with libnats are applied in
// order through a durable pull consumer with max_ack_pending 1, acknowledged after commit, and a
// kill -9 of the replica in the middle loses nothing. (A JetStream cluster, and a server of it
// killed, in tests/server/nats_cluster_test.cpp.)
#include <gtest/gtest.h>
#include <nats/nats.h>

#include <set>

#include "lib/replica.hpp"
#include "replica/support.hpp"
#include "support/cluster.hpp"
#include "support/nats_server.hpp"

namespace magic_sync::replica::test {
namespace {

const std::string kProducts = "shop.products";
const std::string kStream = "magic_sync";

std::string key_of(int id) { return R"({"id":)" + std::to_string(id) + "}"; }

// Message i puts rows 10i..10i+9 and deletes the rows message i-2 put.
std::string numbered_message(int i) {
    std::vector<protocol::DownRow> rows;
    for (int j = 0; j < 10; ++j) {
        rows.push_back(
            row(kProducts, key_of(10 * i + j), R"({"id":)" + std::to_string(10 * i + j) + "}"));
    }
    if (i > 2) {
        for (int j = 0; j < 10; ++j) rows.push_back(gone(kProducts, key_of(10 * (i - 2) + j)));
    }
    return rows_message(1, i, {chunk("all", i - 1, i, rows)},
                        i == 1 ? std::vector<std::string>{"*"} : std::vector<std::string>{});
}

std::set<std::string> expected_keys_after(int seq) {
    std::set<std::string> keys;
    for (int i = std::max(1, seq - 1); i <= seq && seq > 0; ++i) {
        for (int j = 0; j < 10; ++j) keys.insert(key_of(10 * i + j));
    }
    return keys;
}

class NatsServer {
  public:
    explicit NatsServer(const TempDir& dir)
        : port_(magic_sync::test::free_port()),
          process_({magic_sync::test::nats_server_program(), "-js", "-a", "127.0.0.1", "-p",
                    std::to_string(port_), "-sd", dir.file("jetstream")},
                   dir.file("nats-server.log")) {
        bool up = eventually([&] {
            natsConnection* connection = nullptr;
            bool ok = natsConnection_ConnectTo(&connection, url().c_str()) == NATS_OK;
            natsConnection_Destroy(connection);
            return ok;
        });
        if (!up) throw std::runtime_error("nats-server did not start: " + process_.log());
    }
    std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

  private:
    int port_;
    Process process_;
};

// What the sender does: a stream over <prefix>.>, messages published with Nats-Msg-Id.
class Publisher {
  public:
    explicit Publisher(const std::string& url) {
        EXPECT_EQ(natsConnection_ConnectTo(&connection_, url.c_str()), NATS_OK);
        EXPECT_EQ(natsConnection_JetStream(&jetstream_, connection_, nullptr), NATS_OK);
        jsStreamConfig config;
        jsStreamConfig_Init(&config);
        config.Name = kStream.c_str();
        const char* subjects[] = {"magic_sync.>"};
        config.Subjects = subjects;
        config.SubjectsLen = 1;
        jsStreamInfo* info = nullptr;
        jsErrCode error{};
        EXPECT_EQ(js_AddStream(&info, jetstream_, &config, nullptr, &error), NATS_OK);
        jsStreamInfo_Destroy(info);
    }
    ~Publisher() {
        jsCtx_Destroy(jetstream_);
        natsConnection_Destroy(connection_);
    }

    void publish(const std::string& replica, const std::string& id, const std::string& body) {
        natsMsg* message = nullptr;
        std::string subject = "magic_sync." + replica;
        ASSERT_EQ(natsMsg_Create(&message, subject.c_str(), nullptr, body.data(),
                                 static_cast<int>(body.size())),
                  NATS_OK);
        natsMsgHeader_Set(message, "Nats-Msg-Id", id.c_str());
        jsPubAck* ack = nullptr;
        jsErrCode error{};
        EXPECT_EQ(js_PublishMsg(&ack, jetstream_, message, nullptr, &error), NATS_OK);
        jsPubAck_Destroy(ack);
        natsMsg_Destroy(message);
    }

    jsConsumerInfo* consumer(const std::string& durable) {
        jsConsumerInfo* info = nullptr;
        jsErrCode error{};
        EXPECT_EQ(js_GetConsumerInfo(&info, jetstream_, kStream.c_str(), durable.c_str(), nullptr,
                                     &error),
                  NATS_OK);
        return info;
    }

  private:
    natsConnection* connection_ = nullptr;
    jsCtx* jetstream_ = nullptr;
};

size_t occurrences(const std::string& text, const std::string& what) {
    size_t count = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++count;
    return count;
}

int64_t applied_seq(const std::string& db) {
    Replica replica(db, kReplicaId);
    return replica.applied_seq();
}

TEST(NatsTest, AppliesInOrderAcksAfterCommitAndSurvivesKill) {
    const int kMessages = 40;
    TempDir dir;
    NatsServer server(dir);
    Publisher publisher(server.url());
    std::string db = dir.file("replica.db");
    // Another replica's message on the same stream: not ours to take. (The stream dedupes
    // Nats-Msg-Id over all its subjects, so the id names the replica too.)
    const std::string other = "99999999-2222-4333-8444-555555555555";
    publisher.publish(other, other + ".1.1", "for someone else");
    for (int i = 1; i <= kMessages; ++i) {
        publisher.publish(kReplicaId, kReplicaId + ".1." + std::to_string(i), numbered_message(i));
        // A message that can never be applied is terminated, not retried forever.
        if (i == 20) publisher.publish(kReplicaId, "garbage", "not a message");
    }

    // The servers of a cluster, named as one list: it connects through any that answers (here
    // the only one; the list's other server is down).
    const std::string servers =
        "nats://127.0.0.1:" + std::to_string(magic_sync::test::free_port()) + "," + server.url();
    std::vector<std::string> args = {replica_binary(), "--id",  kReplicaId, "--db", db,
                                     "nats",           "--url", servers};
    {
        Process replica(args, dir.file("replica.log"));
        ASSERT_TRUE(eventually([&] { return applied_seq(db) >= 10; })) << replica.log();
        replica.kill9();
    }
    // What was applied before the kill is whole: rows and seq together.
    {
        Replica replica(db, kReplicaId);
        std::set<std::string> keys;
        for (const HeldRow& row : replica.held_rows()) keys.insert(row.key);
        EXPECT_EQ(keys, expected_keys_after(static_cast<int>(replica.applied_seq())));
    }

    Process replica(args, dir.file("replica.log"));
    // The first may have applied every message before its kill: this one is stopped below only
    // once it consumes (a SIGTERM before it set its handlers ended it at once, 5 times in 12).
    ASSERT_TRUE(eventually([&] { return occurrences(replica.log(), "consuming ") == 2; }))
        << replica.log();
    ASSERT_TRUE(eventually([&] { return applied_seq(db) == kMessages; })) << replica.log();
    {
        Replica state(db, kReplicaId);
        std::set<std::string> keys;
        for (const HeldRow& row : state.held_rows()) keys.insert(row.key);
        EXPECT_EQ(keys, expected_keys_after(kMessages));
        EXPECT_EQ(state.holdings().at(0).fingerprint, state.recompute("all"));
        EXPECT_EQ(state.holdings().at(0).through, kMessages);
    }
    // Everything acknowledged (the garbage terminated), one at a time.
    bool settled = eventually([&] {
        jsConsumerInfo* info = publisher.consumer("magic_sync_" + kReplicaId);
        bool done = info && info->NumAckPending == 0 && info->NumPending == 0;
        jsConsumerInfo_Destroy(info);
        return done;
    });
    EXPECT_TRUE(settled);
    jsConsumerInfo* info = publisher.consumer("magic_sync_" + kReplicaId);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->Config->MaxAckPending, 1);
    EXPECT_EQ(info->Config->AckPolicy, js_AckExplicit);
    EXPECT_EQ(std::string(info->Config->FilterSubject), "magic_sync." + kReplicaId);
    jsConsumerInfo_Destroy(info);
    EXPECT_NE(replica.log().find("message garbage: malformed"), std::string::npos) << replica.log();
    EXPECT_EQ(replica.terminate(), 0) << replica.log();
}

}  // namespace
}  // namespace magic_sync::replica::test
