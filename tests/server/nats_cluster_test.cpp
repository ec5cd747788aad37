// Delivery through a NATS JetStream cluster (issue 38): three nats-server processes clustered on
// loopback, the stream on all three (--nats-replicas 3), the sender and four replicas each given
// the three URLs. Under a steady write load the server the sender is connected to, made the
// stream's leader first, is killed -9: the sender and the replicas connected to it move to the
// other two, the stream elects another leader, and every replica keeps taking messages through
// the two left, one restarted meanwhile too. The server comes back on its store and catches up.
// Then every replica holds exactly what the tables say (sync.expected), its log shows every
// message its outbox ever had applied once, in order, and the stream holds each message once:
// nothing lost, nothing applied twice.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nats/nats.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "lib/replica.hpp"
#include "program/nats_servers.hpp"
#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"
#include "support/cluster.hpp"
#include "support/eventually.hpp"
#include "support/nats_server.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;

constexpr int kReplicas = 4;
constexpr int kNodes = 3;
// The stream the sender creates (its default name).
const char* const kStream = "magic_sync";
// The products the load inserts have ids from here up.
constexpr int kFirstNewProduct = 1000;

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.stores (id int PRIMARY KEY);
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, store_id int NOT NULL REFERENCES shop.stores,
                                 active boolean NOT NULL DEFAULT true);
    CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
    CREATE TABLE shop.prices (store_id int, product_id int, price numeric(10, 2) NOT NULL,
                              PRIMARY KEY (store_id, product_id));
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.products');
    SELECT sync.catalog('shop.prices', "to" => 'store_id = store_id');
    INSERT INTO shop.stores VALUES (1), (2);
    INSERT INTO shop.products SELECT i, 'product ' || i, i FROM generate_series(1, 50) i;
    INSERT INTO shop.prices SELECT s, p, p + s / 10.0 FROM generate_series(1, 2) s, generate_series(1, 20) p;
)sql";

// Three nats-server processes with JetStream, clustered on loopback, each with its config file,
// store and log under `directory`; a server killed starts again on the same ones.
class NatsNodes {
  public:
    explicit NatsNodes(const std::string& directory) {
        run("mkdir -p " + directory);
        for (int i = 0; i < kNodes; ++i)
            nodes_.push_back({"n" + std::to_string(i + 1), directory + "/n" + std::to_string(i + 1),
                              free_port(), free_port(), free_port(), nullptr});
        for (Node& node : nodes_) {
            std::string routes;
            for (const Node& other : nodes_)
                if (&other != &node)
                    routes += std::string(routes.empty() ? "" : ", ") +
                              "\"nats-route://127.0.0.1:" + std::to_string(other.route_port) + "\"";
            std::ofstream(node.path + ".conf")
                << "server_name: " << node.name << "\n"
                << "listen: 127.0.0.1:" << node.port << "\n"
                << "http: 127.0.0.1:" << node.monitor_port << "\n"
                << "jetstream { store_dir: \"" << node.path << "\" }\n"
                << "cluster {\n  name: magic_sync_test\n  listen: 127.0.0.1:" << node.route_port
                << "\n  routes: [" << routes << "]\n}\n";
            node.process = std::make_unique<Process>(
                std::vector<std::string>{nats_server_program(), "-c", node.path + ".conf"},
                node.path + ".log");
        }
    }

    int size() const { return kNodes; }
    const std::string& name(int node) const { return nodes_[node].name; }
    std::string url(int node) const {
        return "nats://127.0.0.1:" + std::to_string(nodes_[node].port);
    }
    // Every server's URL, separated by commas.
    std::string urls() const {
        std::string list;
        for (int node = 0; node < size(); ++node) list += (node ? "," : "") + url(node);
        return list;
    }
    int node_named(const std::string& name) const {
        for (int node = 0; node < size(); ++node)
            if (nodes_[node].name == name) return node;
        return -1;
    }

    void kill(int node) { nodes_[node].process->stop(SIGKILL); }
    void start(int node) { nodes_[node].process->start(); }

    // The server a client named `client` is connected to (its monitoring's /connz), or -1.
    int node_of(const std::string& client) const {
        for (int node = 0; node < size(); ++node) {
            httplib::Client monitor("127.0.0.1", nodes_[node].monitor_port);
            monitor.set_connection_timeout(1s);
            const auto answer = monitor.Get("/connz?limit=1000");
            if (!answer || answer->status != 200) continue;
            const nlohmann::json connections = nlohmann::json::parse(answer->body);
            for (const auto& connection : connections["connections"])
                if (connection.value("name", "") == client) return node;
        }
        return -1;
    }

    // Every server's log, for a failure's report.
    std::string logs() const {
        std::string all;
        for (const Node& node : nodes_)
            all += "--- " + node.name + "\n" + node.process->log() + "\n";
        return all;
    }

  private:
    struct Node {
        std::string name;
        std::string path;  // the store directory; its config and log beside it
        int port;
        int route_port;
        int monitor_port;
        std::unique_ptr<Process> process;
    };
    std::vector<Node> nodes_;
};

void say_nothing(const std::string&) {}

// The test's own look at the cluster's JetStream, through a connection to any of its servers
// (made as the programs make theirs).
class JetStreamView {
  public:
    explicit JetStreamView(const std::string& urls)
        : options_(program::nats_options<say_nothing>(urls, "magic_sync test")) {
        jsOptions_Init(&js_options_);
        js_options_.Wait = 2000;
    }
    ~JetStreamView() {
        jsCtx_Destroy(js_);
        natsConnection_Destroy(connection_);
        natsOptions_Destroy(options_);
    }
    JetStreamView(const JetStreamView&) = delete;
    JetStreamView& operator=(const JetStreamView&) = delete;

    // Whether JetStream answers: the cluster has a meta leader.
    bool ready() {
        if (!connected()) return false;
        jsAccountInfo* info = nullptr;
        if (js_GetAccountInfo(&info, js_, &js_options_, nullptr) != NATS_OK) return false;
        jsAccountInfo_Destroy(info);
        return true;
    }

    // The stream's messages, its replica count, its leader's name ("" while it has none) and
    // whether every other server of it is current (has caught up); nothing when the stream cannot
    // be read.
    struct Stream {
        uint64_t messages = 0;
        int64_t replicas = 0;
        std::string leader;
        bool all_current = false;
    };
    std::optional<Stream> stream() {
        if (!connected()) return std::nullopt;
        jsStreamInfo* info = nullptr;
        if (js_GetStreamInfo(&info, js_, kStream, &js_options_, nullptr) != NATS_OK)
            return std::nullopt;
        Stream stream;
        stream.messages = info->State.Msgs;
        stream.replicas = info->Config->Replicas;
        if (info->Cluster != nullptr) {
            stream.leader = info->Cluster->Leader == nullptr ? "" : info->Cluster->Leader;
            stream.all_current = info->Cluster->ReplicasLen == stream.replicas - 1;
            for (int i = 0; i < info->Cluster->ReplicasLen; ++i)
                stream.all_current = stream.all_current && info->Cluster->Replicas[i]->Current;
        }
        jsStreamInfo_Destroy(info);
        return stream;
    }

    // Asks the stream's leader to hand over to another of its servers.
    void step_down() {
        natsMsg* reply = nullptr;
        natsConnection_RequestString(
            &reply, connection_, (std::string("$JS.API.STREAM.LEADER.STEPDOWN.") + kStream).c_str(),
            "", 2000);
        natsMsg_Destroy(reply);
    }

  private:
    bool connected() {
        if (connection_ != nullptr) return true;
        if (natsConnection_Connect(&connection_, options_) != NATS_OK) return false;
        return natsConnection_JetStream(&js_, connection_, nullptr) == NATS_OK;
    }

    natsOptions* options_ = nullptr;
    jsOptions js_options_;
    natsConnection* connection_ = nullptr;
    jsCtx* js_ = nullptr;
};

// The steady write load: a new product (for every replica) and a store's price changed in one
// statement, about 40 a second, until it stops. A write that fails ends it (the database stays
// up in this test), with the error kept.
class Load {
  public:
    explicit Load(const std::string& conninfo) : thread_([this, conninfo] { write(conninfo); }) {}
    ~Load() { stop(); }
    Load(const Load&) = delete;
    Load& operator=(const Load&) = delete;

    void stop() {
        stopping_ = true;
        if (thread_.joinable()) thread_.join();
    }
    // The id of the last product written (0 before the first).
    int last_product() const { return last_product_; }
    std::string error() {
        std::lock_guard<std::mutex> lock(mutex_);
        return error_;
    }

  private:
    void write(const std::string& conninfo) {
        try {
            Connection db(conninfo);
            for (int product = kFirstNewProduct; !stopping_; ++product) {
                db.query(
                    "WITH new AS (INSERT INTO shop.products VALUES ($1::int, 'new', 1))"
                    " UPDATE shop.prices SET price = price + 0.01"
                    " WHERE store_id = $1::int % 2 + 1 AND product_id = $1::int % 20 + 1",
                    {std::to_string(product)});
                last_product_ = product;
                std::this_thread::sleep_for(25ms);
            }
        } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(mutex_);
            error_ = e.what();
        }
    }

    std::atomic<bool> stopping_{false};
    std::atomic<int> last_product_{0};
    std::mutex mutex_;
    std::string error_;
    std::thread thread_;
};

// The "gen.seq" of each message the replica's log says it applied, in the order it applied them
// (its log line "message <replica>.<gen>.<seq>@<origin>: applied", the stream's Nats-Msg-Id).
std::vector<std::string> applied_messages(const std::string& log) {
    static const std::regex applied(R"(message [0-9a-f-]{36}\.([0-9]+\.[0-9]+)@[^ ]+: applied)");
    std::vector<std::string> messages;
    for (std::sregex_iterator match(log.begin(), log.end(), applied), end; match != end; ++match)
        messages.push_back((*match)[1]);
    return messages;
}

size_t occurrences(const std::string& text, const std::string& what) {
    size_t count = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++count;
    return count;
}

class NatsCluster : public ::testing::Test {
  protected:
    void SetUp() override {
        deployment_ = std::make_unique<Deployment>(
            "nats_cluster",
            std::vector<std::string>{"magic_sync.idle = 100", "magic_sync.backoff = 200",
                                     "magic_sync.backoff_max = 1000"},
            "shop", kShop);
        nats_ = std::make_unique<NatsNodes>(deployment_->directory() + "/nats");
        jetstream_ = std::make_unique<JetStreamView>(nats_->urls());
    }
    void TearDown() override {
        load_.reset();
        replicas_.clear();
        jetstream_.reset();
        nats_.reset();
        deployment_.reset();
    }

    Connection& db() { return deployment_->db(); }
    std::unique_ptr<Process>& sender() { return deployment_->sender(); }

    bool holds_product(const ReplicaProcess& replica, int product) {
        return deployment_->held(replica).find("shop.products {\"id\":" + std::to_string(product) +
                                               "} ") != std::string::npos;
    }

    // Waits until the load wrote a product after now and every replica holds it.
    void every_replica_takes_a_new_product(const std::string& when) {
        const int before = load_->last_product();
        ASSERT_TRUE(eventually([&] { return load_->last_product() > before; }, 10s))
            << load_->error();
        const int product = load_->last_product();
        std::cerr << when << ": every replica takes product " << product << std::endl;
        for (auto& numbered : replicas_) {
            const ReplicaProcess& replica = numbered.second;
            ASSERT_TRUE(eventually([&] { return holds_product(replica, product); }, 90s))
                << "replica " << numbered.first << " never took product " << product << " " << when
                << "\n"
                << replica.process->log() << "\nsender:\n"
                << sender()->log() << "\n"
                << nats_->logs();
        }
    }

    // Every replica holds what the tables say and has applied the last message written for it.
    void converge(const std::string& scenario) {
        std::cerr << "converging: " << scenario << std::endl;
        const bool converged = eventually(
            [&] {
                if (db().value("SELECT count(*) FROM sync.note") != "0") return false;
                for (auto& [n, replica] : replicas_)
                    if (applied_seq(replica) != last_seq(replica) ||
                        deployment_->held(replica) != expected(replica))
                        return false;
                return true;
            },
            90s);
        if (converged) return;
        std::string report = "not converged: " + scenario + "\n";
        for (auto& [n, replica] : replicas_)
            report += "replica " + replica.id + ": applied through " +
                      std::to_string(applied_seq(replica)) + " of " +
                      std::to_string(last_seq(replica)) + "\n  expected:\n" + expected(replica) +
                      "\n  held:\n" + deployment_->held(replica) + "\n  log:\n" +
                      replica.process->log() + "\n";
        FAIL() << report << "sender:\n" << sender()->log() << "\n" << nats_->logs();
    }

    std::string expected(const ReplicaProcess& replica) {
        return db().value(kExpectedHoldings, {replica.id});
    }
    // The seq of the last message the relay wrote for the replica.
    long last_seq(const ReplicaProcess& replica) {
        return std::stol(
            db().value("SELECT next_seq - 1 FROM sync.replica WHERE id = $1::uuid", {replica.id}));
    }
    static long applied_seq(const ReplicaProcess& replica) {
        try {
            return replica::Replica(replica.db, replica.id).applied_seq();
        } catch (const std::exception&) {
            return -1;
        }
    }

    std::unique_ptr<Deployment> deployment_;
    std::unique_ptr<NatsNodes> nats_;
    std::unique_ptr<JetStreamView> jetstream_;
    std::map<int, ReplicaProcess> replicas_;
    std::unique_ptr<Load> load_;
};

TEST_F(NatsCluster, ANodeKilledUnderLoadLosesNothingAndAppliesNothingTwice) {
    ASSERT_TRUE(eventually([&] { return jetstream_->ready(); }, 30s))
        << "JetStream has no meta leader\n"
        << nats_->logs();
    for (int n = 1; n <= kReplicas; ++n) {
        db().query("INSERT INTO shop.registers (id, store_id) VALUES ($1::uuid, $2::int)",
                   {replica_id(n), std::to_string(n % 2 + 1)});
        replicas_[n] = deployment_->replica(replica_id(n));
    }
    deployment_->start_nats_sender(nats_->urls(), {"--nats-replicas", "3"});
    for (auto& [n, replica] : replicas_) deployment_->start_nats_replica(replica, nats_->urls());
    std::optional<JetStreamView::Stream> stream;
    ASSERT_TRUE(eventually([&] { return (stream = jetstream_->stream()).has_value(); }, 30s))
        << sender()->log();
    EXPECT_EQ(stream->replicas, 3);
    converge("provisioning through the cluster");

    load_ = std::make_unique<Load>(deployment_->conninfo());
    every_replica_takes_a_new_product("under load");

    // The victim: the server the sender publishes through, made the stream's leader too (each
    // step-down hands the leadership to another of the stream's servers, picked at random).
    int victim = -1;
    ASSERT_TRUE(eventually([&] { return (victim = nats_->node_of("magic-sync-sender")) >= 0; }))
        << nats_->logs();
    std::string leader;
    for (int attempt = 0; attempt < 30; ++attempt) {
        const std::string before = leader;
        if (!before.empty()) jetstream_->step_down();
        ASSERT_TRUE(eventually(
            [&] {
                stream = jetstream_->stream();
                return stream && !stream->leader.empty() && stream->leader != before;
            },
            30s))
            << nats_->logs();
        leader = stream->leader;
        if (leader == nats_->name(victim)) break;
    }
    ASSERT_EQ(leader, nats_->name(victim));

    std::cerr << "kill -9 of " << nats_->name(victim) << ", the stream's leader and the sender's"
              << std::endl;
    const size_t sender_log_before = sender()->log().size();
    nats_->kill(victim);
    // A replica started while the server is down reaches the cluster through the others.
    replicas_[1].process->stop(SIGTERM);
    replicas_[1].process->start();
    every_replica_takes_a_new_product("with " + nats_->name(victim) + " down");
    const std::string sender_log = sender()->log();
    const std::string back = "connected to NATS again, at ";
    const size_t at = sender_log.find(back, sender_log_before);
    ASSERT_NE(at, std::string::npos) << sender_log;
    const size_t url_at = at + back.size();
    EXPECT_NE(sender_log.substr(url_at, sender_log.find('\n', url_at) - url_at),
              nats_->url(victim));

    nats_->start(victim);
    ASSERT_TRUE(eventually(
        [&] {
            stream = jetstream_->stream();
            return stream && stream->all_current;
        },
        60s))
        << nats_->logs();
    every_replica_takes_a_new_product("with " + nats_->name(victim) + " back");

    load_->stop();
    EXPECT_EQ(load_->error(), "");
    converge("the load stopped");
    uint64_t messages = 0;
    for (auto& [n, replica] : replicas_) {
        messages += last_seq(replica);
        EXPECT_EQ(db().value("SELECT gen FROM sync.replica WHERE id = $1::uuid", {replica.id}), "1")
            << "replica " << n << " was provisioned again";
        std::vector<std::string> every_message;
        for (long seq = 1; seq <= last_seq(replica); ++seq)
            every_message.push_back("1." + std::to_string(seq));
        const std::string log = replica.process->log();
        EXPECT_EQ(applied_messages(log), every_message) << "replica " << n << ":\n" << log;
        std::cerr << "replica " << n << ": " << every_message.size() << " messages applied, "
                  << occurrences(log, ": already applied") << " delivered again" << std::endl;
    }
    // A message published again (its acknowledgement lost with the server, or timed out while the
    // stream had no leader) goes under the same Nats-Msg-Id, within the duplicate window: the
    // stream holds each message once.
    stream = jetstream_->stream();
    ASSERT_TRUE(stream.has_value());
    EXPECT_EQ(stream->messages, messages);
}

}  // namespace
}  // namespace magic_sync::test
