// The nats transport through the real program, against a real `nats-server -js` of the test's
// own on a free loopback port, with its store in a temporary directory.
#include <gtest/gtest.h>
#include <nats/nats.h>

#include <algorithm>
#include <map>

#include "protocol/gzip.hpp"
#include "sender/harness.hpp"
#include "support/nats_server.hpp"

namespace magic_sync::test::sender {
namespace {

class NatsServer {
  public:
    NatsServer()
        : port_(free_port()),
          process_({nats_server_program(), "-js", "-a", "127.0.0.1", "-p", std::to_string(port_),
                    "-sd", store_.path()},
                   store_.path() + "/server.log") {
        if (!eventually(
                [&] { return natsConnection_ConnectTo(&connection_, url().c_str()) == NATS_OK; },
                20s) ||
            natsConnection_JetStream(&js_, connection_, nullptr) != NATS_OK)
            throw std::runtime_error("nats-server did not start: " + process_.log());
    }
    ~NatsServer() {
        jsCtx_Destroy(js_);
        natsConnection_Destroy(connection_);
        process_.signal(SIGTERM);
        process_.wait(10s);
    }

    std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

    // Messages in the stream.
    uint64_t count(const std::string& stream) {
        jsStreamInfo* info = nullptr;
        if (js_GetStreamInfo(&info, js_, stream.c_str(), nullptr, nullptr) != NATS_OK) return 0;
        const uint64_t messages = info->State.Msgs;
        jsStreamInfo_Destroy(info);
        return messages;
    }

    // The message ids in the stream, per subject, in stream order, with their bodies checked:
    // gzip-compressed and said so by a Content-Encoding header with `gzip` (the sender's --gzip).
    std::map<std::string, std::vector<std::string>> ids(const std::string& stream,
                                                        bool gzip = false) {
        std::map<std::string, std::vector<std::string>> ids;
        const uint64_t messages = count(stream);
        for (uint64_t seq = 1; seq <= messages; ++seq) {
            natsMsg* message = nullptr;
            if (js_GetMsg(&message, js_, stream.c_str(), seq, nullptr, nullptr) != NATS_OK)
                continue;
            const char* id = nullptr;
            const char* stream_id = nullptr;
            natsMsgHeader_Get(message, "message-id", &id);
            natsMsgHeader_Get(message, "Nats-Msg-Id", &stream_id);
            const std::string subject = natsMsg_GetSubject(message);
            const std::string named = subject.substr(subject.find('.') + 1) + "." + id + "@";
            EXPECT_EQ(std::string(stream_id).substr(0, named.size()), named);
            std::string body(natsMsg_GetData(message), natsMsg_GetDataLength(message));
            const char* encoding = nullptr;
            natsMsgHeader_Get(message, "Content-Encoding", &encoding);
            EXPECT_EQ(std::string(encoding == nullptr ? "" : encoding), gzip ? "gzip" : "");
            EXPECT_EQ(protocol::is_gzip(body), gzip);
            if (gzip) body = protocol::gunzip(body, 1 << 20);
            const int replica = std::stoi(subject.substr(subject.size() - 12), nullptr, 16);
            EXPECT_EQ(body, message_body(replica, std::stoi(std::string(id).substr(2))));
            ids[subject].push_back(id);
            natsMsg_Destroy(message);
        }
        return ids;
    }

  private:
    int port_;
    TempDir store_;
    Process process_;
    natsConnection* connection_ = nullptr;
    jsCtx* js_ = nullptr;
};

std::vector<std::string> ids_through(int messages) {
    std::vector<std::string> ids;
    for (int seq = 1; seq <= messages; ++seq) ids.push_back(message_id(seq));
    return ids;
}

std::vector<std::string> nats_arguments(const NatsServer& nats, bool once = true) {
    std::vector<std::string> arguments = {"--transport",   "nats",          "--nats-url",
                                          nats.url(),      "--nats-prefix", "shop",
                                          "--nats-stream", "SHOP",          "--nats-create-stream"};
    if (once) arguments.push_back("--once");
    return arguments;
}

TEST(NatsSender, PublishesEveryReplicaInOrderAndTheStreamDropsAResend) {
    constexpr int kReplicas = 16, kMessages = 20;
    Outbox outbox("nats_order", kReplicas, kMessages);
    NatsServer nats;
    TempDir dir;
    {
        SenderProcess sender(outbox, dir, nats_arguments(nats), "first.log");
        ASSERT_EQ(sender.wait(60s), 0) << sender.log();
        EXPECT_NE(sender.log().find("created NATS stream SHOP"), std::string::npos) << sender.log();
    }
    EXPECT_EQ(outbox.unsent(), 0);
    EXPECT_EQ(nats.count("SHOP"), static_cast<uint64_t>(kReplicas * kMessages));
    auto ids = nats.ids("SHOP");
    EXPECT_EQ(ids.size(), static_cast<size_t>(kReplicas));
    for (int r = 1; r <= kReplicas; ++r)
        EXPECT_EQ(ids["shop." + replica_id(r)], ids_through(kMessages));

    // Every message goes again (as after leases that ran out): same ids, so the stream keeps one
    // copy of each and acknowledges the resends as taken.
    outbox.sql("UPDATE sync.outbox SET sent_at = NULL");
    SenderProcess again(outbox, dir, nats_arguments(nats), "again.log");
    ASSERT_EQ(again.wait(60s), 0) << again.log();
    EXPECT_EQ(sent_count(again.log()), kReplicas * kMessages) << again.log();
    EXPECT_NE(again.log().find("NATS stream SHOP exists"), std::string::npos) << again.log();
    EXPECT_EQ(outbox.unsent(), 0);
    EXPECT_EQ(nats.count("SHOP"), static_cast<uint64_t>(kReplicas * kMessages));
}

// With --gzip the stream stores each message gzip-compressed, with a Content-Encoding header: what
// a device reads inflates to the message.
TEST(NatsSender, WithGzipTheStreamHoldsEachMessageCompressedAndSaysSo) {
    constexpr int kReplicas = 2, kMessages = 3;
    Outbox outbox("nats_gzip", kReplicas, kMessages);
    NatsServer nats;
    TempDir dir;
    std::vector<std::string> arguments = nats_arguments(nats);
    arguments.push_back("--gzip");
    SenderProcess sender(outbox, dir, arguments);
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    EXPECT_EQ(outbox.unsent(), 0);
    auto ids = nats.ids("SHOP", true);
    for (int r = 1; r <= kReplicas; ++r)
        EXPECT_EQ(ids["shop." + replica_id(r)], ids_through(kMessages));
}

// After a point-in-time recovery or a re-created extension, a replica's messages are numbered
// again from where that history stands: the same "<gen>.<seq>" is another message. The stream's
// id names the history (the origin) too, so its duplicate window does not drop them as resends.
TEST(NatsSender, AMessageOfAnotherHistoryIsNotTakenForAResend) {
    constexpr int kReplicas = 2, kMessages = 5;
    Outbox outbox("nats_history", kReplicas, kMessages);
    NatsServer nats;
    TempDir dir;
    {
        SenderProcess sender(outbox, dir, nats_arguments(nats), "first.log");
        ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    }
    ASSERT_EQ(nats.count("SHOP"), static_cast<uint64_t>(kReplicas * kMessages));
    outbox.sql("UPDATE sync.relay_state SET origin = gen_random_uuid()");
    outbox.sql("UPDATE sync.outbox SET sent_at = NULL");
    SenderProcess again(outbox, dir, nats_arguments(nats), "again.log");
    ASSERT_EQ(again.wait(60s), 0) << again.log();
    EXPECT_EQ(outbox.unsent(), 0);
    EXPECT_EQ(nats.count("SHOP"), static_cast<uint64_t>(2 * kReplicas * kMessages));
}

TEST(NatsSender, KillNineMidSendThenRestartDeliversEachMessageOnce) {
    constexpr int kReplicas = 8, kMessages = 400;
    Outbox outbox("nats_kill", kReplicas, kMessages);
    NatsServer nats;
    TempDir dir;
    std::vector<std::string> arguments = nats_arguments(nats, false);
    arguments.insert(arguments.end(), {"--send-timeout", "0.5", "--lease", "1"});
    {
        SenderProcess doomed(outbox, dir, arguments, "doomed.log");
        ASSERT_TRUE(eventually([&] { return nats.count("SHOP") >= 300; }, 60s)) << doomed.log();
        doomed.signal(SIGKILL);
        doomed.wait(10s);
    }
    EXPECT_GT(outbox.unsent(), 0) << "killed too late to prove anything";
    std::this_thread::sleep_for(1200ms);  // the dead sender's leases expire
    arguments.push_back("--once");
    SenderProcess again(outbox, dir, arguments, "again.log");
    ASSERT_EQ(again.wait(120s), 0) << again.log();
    EXPECT_EQ(outbox.unsent(), 0);
    // Whatever was in flight at the kill went again under the same id and the stream dropped it.
    EXPECT_EQ(nats.count("SHOP"), static_cast<uint64_t>(kReplicas * kMessages));
    auto ids = nats.ids("SHOP");
    for (int r = 1; r <= kReplicas; ++r)
        EXPECT_EQ(ids["shop." + replica_id(r)], ids_through(kMessages));
}

// The servers of a cluster, named as one list: the sender connects through any that answers
// (here the only one; the list's other server is down).
TEST(NatsSender, ConnectsThroughAnyServerOfTheList) {
    Outbox outbox("nats_list", 2, 3);
    NatsServer nats;
    TempDir dir;
    std::vector<std::string> arguments = nats_arguments(nats);
    const auto url = std::find(arguments.begin(), arguments.end(), nats.url());
    *url = "nats://127.0.0.1:" + std::to_string(free_port()) + ", " + nats.url();
    SenderProcess sender(outbox, dir, arguments);
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    EXPECT_EQ(outbox.unsent(), 0);
    EXPECT_EQ(nats.count("SHOP"), 6u);
}

TEST(NatsSender, NoStreamForTheSubjectIsTransient) {
    Outbox outbox("nats_nostream", 2, 2);
    NatsServer nats;
    TempDir dir;
    SenderProcess sender(outbox, dir,
                         {"--transport", "nats", "--nats-url", nats.url(), "--nats-prefix",
                          "nobody", "--send-timeout", "1", "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    EXPECT_EQ(outbox.unsent(), 4);
    EXPECT_EQ(
        outbox.number("SELECT count(*) FROM sync.delivery WHERE last_error LIKE 'nats: %' AND "
                      "refusals = 0 AND backoff IS NOT NULL"),
        2)
        << outbox.sql("SELECT last_error FROM sync.delivery");
}

TEST(NatsSender, ExitsWhenNatsIsAway) {
    Outbox outbox("nats_away", 1, 1);
    TempDir dir;
    SenderProcess sender(outbox, dir,
                         {"--transport", "nats", "--nats-url",
                          "nats://127.0.0.1:" + std::to_string(free_port()), "--once"});
    EXPECT_EQ(sender.wait(30s), 1);
    EXPECT_NE(sender.log().find("cannot connect to NATS"), std::string::npos) << sender.log();
}

}  // namespace
}  // namespace magic_sync::test::sender
