// The pull transport end to end, with every real part: PostgreSQL with magic_sync preloaded (the
// relay worker), one magic-sync-sender --transport pull, and magic-sync-replica processes that
// pull from it with their own tokens. Each replica is compared with the oracle (sync.expected:
// what the declarations and the tables say it must hold), row by row.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/process.hpp"
#include "support/pull_gateway.hpp"
#include "support/raw_connection.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;

// Registers hold the hash of their device's token; device n's token is "device-n".
const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.stores (id int PRIMARY KEY, name text NOT NULL);
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, store_id int NOT NULL REFERENCES shop.stores,
                                 active boolean NOT NULL DEFAULT true, token_hash text UNIQUE);
    CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
    CREATE TABLE shop.prices (store_id int, product_id int, price numeric(10, 2) NOT NULL,
                              PRIMARY KEY (store_id, product_id));
    CREATE TABLE shop.sales (id uuid PRIMARY KEY, register_id uuid NOT NULL, product_id int NOT NULL,
                             qty int NOT NULL);
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.products');
    SELECT sync.catalog('shop.prices', "to" => 'store_id = store_id');
    SELECT sync.record('shop.sales');
    INSERT INTO shop.stores VALUES (1, 'north'), (2, 'south');
    INSERT INTO shop.products SELECT i, 'product ' || i, i FROM generate_series(1, 120) i;
    INSERT INTO shop.prices SELECT s, p, p + s / 10.0 FROM generate_series(1, 2) s, generate_series(1, 40) p;
)sql";

size_t line_count(const std::string& text) {
    return text.empty() ? 0 : std::count(text.begin(), text.end(), '\n') + 1;
}

const char* const kTokenQuery =
    "SELECT id FROM shop.registers WHERE token_hash = encode(sha256(convert_to($1, 'UTF8')), "
    "'hex')";

class Pull : public ::testing::Test {
  protected:
    void SetUp() override {
        deployment_ = std::make_unique<Deployment>(
            "pull",
            std::vector<std::string>{"magic_sync.idle = 100", "magic_sync.rows_per_message = 50"},
            "shop", kShop);
        port_ = free_port();
    }
    void TearDown() override {
        replicas_.clear();
        deployment_.reset();
    }

    Connection& db() { return deployment_->db(); }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

    void add_registers(int first, int last) {
        db().query(
            "INSERT INTO shop.registers (id, store_id, token_hash) SELECT "
            "('00000000-0000-0000-0000-' || lpad(n::text, 12, '0'))::uuid, 1 + n % 2, "
            "encode(sha256(convert_to('device-' || n, 'UTF8')), 'hex') "
            "FROM generate_series($1::int, $2::int) n",
            {std::to_string(first), std::to_string(last)});
        for (int n = first; n <= last; ++n) replicas_[n] = deployment_->replica(replica_id(n));
    }

    // The gateway, with `options` after the usual ones.
    void start_sender(const std::vector<std::string>& options = {}) {
        deployment_->sender() = std::make_unique<Process>(
            pull_gateway_command(deployment_->bin() + "/magic-sync-sender", deployment_->conninfo(),
                                 port_, kTokenQuery, "5", options),
            deployment_->directory() + "/sender.log");
    }

    // The replica's process pulling with its device's token; `options` after the usual ones.
    void start_replica(int n, const std::vector<std::string>& options = {}) {
        ReplicaProcess& replica = replicas_[n];
        std::vector<std::string> arguments = deployment_->replica_program(replica);
        for (const std::string& argument : {std::string("pull"), std::string("--url"), url(),
                                            std::string("--token"), "device-" + std::to_string(n)})
            arguments.push_back(argument);
        arguments.insert(arguments.end(), options.begin(), options.end());
        replica.process = std::make_unique<Process>(
            arguments, deployment_->directory() + "/" + replica.id + ".log");
    }

    std::string expected(const ReplicaProcess& replica) {
        return db().value(kExpectedHoldings, {replica.id});
    }

    // Every replica holds exactly what the oracle says, and nothing is left unsent to any.
    void converge(const std::string& scenario, std::chrono::seconds limit = 120s) {
        std::cerr << "converging: " << scenario << std::endl;
        std::string ids = "{";
        for (const auto& [n, replica] : replicas_) ids += (ids.size() > 1 ? "," : "") + replica.id;
        ids += "}";
        const bool converged = eventually(
            [&] {
                if (db().value("SELECT count(*) FROM sync.note") != "0") return false;
                if (db().value("SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL AND "
                               "replica = ANY ($1::uuid[])",
                               {ids}) != "0")
                    return false;
                for (auto& [n, replica] : replicas_)
                    if (deployment_->held(replica) != expected(replica)) return false;
                return true;
            },
            limit);
        if (converged) return;
        std::string report = "not converged: " + scenario + "\n";
        for (auto& [n, replica] : replicas_) {
            const std::string held = deployment_->held(replica);
            if (held == expected(replica)) continue;
            report += "replica " + replica.id + " holds " + std::to_string(held.size()) +
                      " bytes of lines, expected " + std::to_string(expected(replica).size()) +
                      "\n" + (replica.process ? replica.process->log() : "") + "\n";
            break;
        }
        FAIL() << report << "sender log:\n" << deployment_->sender()->log();
    }

    std::string head_of(int n) {
        return db().value(
            "SELECT sync_internal.message_id(gen, seq) FROM sync.outbox WHERE replica = $1::uuid "
            "AND "
            "sent_at IS "
            "NULL ORDER BY seq LIMIT 1",
            {replica_id(n)});
    }

    std::unique_ptr<Deployment> deployment_;
    int port_ = 0;
    std::map<int, ReplicaProcess> replicas_;
};

// The gateway runs with --gzip: the reference replica asks for gzip (Accept-Encoding), and inflates
// every head it is served.
TEST_F(Pull, AHundredReplicasPullingFromOneSenderHoldWhatTheTablesSay) {
    add_registers(1, 100);
    start_sender({"--gzip"});
    for (int n = 1; n <= 100; ++n) start_replica(n);
    converge("provisioning 100 replicas by pull");
    // 120 products and 40 prices of its store, in messages of at most 50 rows: several each.
    EXPECT_EQ(line_count(expected(replicas_[7])), 160u);
    EXPECT_GE(std::stoi(db().value("SELECT min(next_seq) FROM sync.replica")), 4);

    db().query("UPDATE shop.products SET price = price * 2 WHERE id <= 60");
    db().query("DELETE FROM shop.products WHERE id = 120");
    db().query("INSERT INTO shop.prices VALUES (2, 41, 5.55)");
    converge("catalog and store changes by pull");
}

TEST_F(Pull, AReplicaKilledAfterApplyingBeforeItsAckGetsTheSameHeadAgain) {
    add_registers(1, 2);
    start_sender();
    start_replica(2);
    start_replica(1, {"--die-before-ack", "2", "--up-via-pull", "--upload-every", "0.2"});
    ASSERT_TRUE(eventually([&] { return !replicas_[1].process->running(); }, 60s))
        << replicas_[1].process->log();
    const std::string log = replicas_[1].process->log();
    const std::string marker = "test fault: dying before acknowledging message ";
    const size_t at = log.find(marker);
    ASSERT_NE(at, std::string::npos) << log;
    const std::string unacked =
        log.substr(at + marker.size(), log.find('\n', at) - at - marker.size());
    // Applied (the replica's file is at its seq) and not acknowledged: still the head.
    EXPECT_EQ(head_of(1), unacked);
    const std::string seq = unacked.substr(unacked.find('.') + 1);
    std::string holds;
    ASSERT_EQ(run(deployment_->replica_cli(replicas_[1]) + " show --json", &holds), 0);
    EXPECT_NE(holds.find("\"applied\":" + seq + ","), std::string::npos) << holds;

    // Restarted (without the fault): the same head again, recognised as applied, acknowledged.
    replicas_[1].process.reset();
    start_replica(1, {"--up-via-pull", "--gzip-up", "--upload-every", "0.2"});
    converge("the killed replica restarted", 60s);
    EXPECT_NE(replicas_[1].process->log().find("message " + unacked + ": already applied"),
              std::string::npos)
        << replicas_[1].process->log();

    // Its uploads go through the sender too, gzip, filed under the replica the path names.
    const std::string sale = "10000000-0000-0000-0000-000000000001";
    std::string output;
    ASSERT_EQ(run(deployment_->replica_cli(replicas_[1]) + " write shop.sales '{\"id\":\"" + sale +
                      "\",\"register_id\":\"" + replica_id(1) + "\",\"product_id\":3,\"qty\":2}'",
                  &output),
              0)
        << output;
    ASSERT_TRUE(eventually(
        [&] {
            return db().value("SELECT count(*) FROM shop.sales WHERE id = $1::uuid", {sale}) == "1";
        },
        30s))
        << replicas_[1].process->log();
    converge("an upload by pull", 60s);
}

// A message the device can never apply is refused, and the refusal is recorded on the server as a
// push transport's is: the operator sees it in sync.replica (and the alarm on refusals), and the
// message stays the head.
TEST_F(Pull, AMessageTheDeviceCannotApplyIsRecordedAsRefused) {
    add_registers(1, 1);
    start_sender();
    start_replica(1);
    converge("one replica by pull");
    const std::string seq = db().value(
        "WITH bogus AS (INSERT INTO sync.outbox (replica, seq, gen, kind, body) "
        "SELECT id, next_seq, gen, 'rows', '\\x00'::bytea FROM sync.replica WHERE id = $1::uuid "
        "RETURNING seq) "
        "UPDATE sync.replica r SET next_seq = r.next_seq + 1 FROM bogus WHERE r.id = $1::uuid "
        "RETURNING bogus.seq",
        {replica_id(1)});
    db().query("NOTIFY magic_sync");
    ASSERT_TRUE(eventually(
        [&] {
            return db().value("SELECT refusals > 0 FROM sync.delivery WHERE replica = $1::uuid",
                              {replica_id(1)}) == "t";
        },
        30s))
        << replicas_[1].process->log();
    EXPECT_EQ(
        db().value(
            "SELECT split_part(last_error, ':', 1) FROM sync.delivery WHERE replica = $1::uuid",
            {replica_id(1)}),
        "malformed");
    EXPECT_EQ(head_of(1), db().value("SELECT sync_internal.message_id(gen, $1::bigint) FROM "
                                     "sync.replica WHERE id = $2::uuid",
                                     {seq, replica_id(1)}));
}

// What a process holds, from /proc: "Threads", "VmHWM" (its peak memory, in kB), ...
long proc_status(pid_t pid, const std::string& field) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
    return -1;
}

// The gateway faces the internet (issue 36): while hostile clients do their worst, a real device
// keeps converging. A thousand idle connections, slow heads and slow bodies (the old gateway gave
// each a thread of --devices, and 256 of them stopped it), unauthenticated 60 MB uploads (refused
// on their headers), garbage uploads past what a replica may keep (refused, nothing stored), and
// one upload sent again and again (one answer). The gateway's threads stay few and its memory
// small.
TEST_F(Pull, HostileClientsDoNotStopADeviceFromConverging) {
    db().query("ALTER DATABASE " + db().value("SELECT quote_ident(current_database())") +
               " SET magic_sync.max_kept_items = 2");
    add_registers(1, 1);
    // Device 2 is the hostile one's own: a real token, no replica process.
    db().query(
        "INSERT INTO shop.registers (id, store_id, token_hash) VALUES ($1::uuid, 2, "
        "encode(sha256(convert_to('device-2', 'UTF8')), 'hex'))",
        {replica_id(2)});
    start_sender({"--header-timeout", "2", "--idle-timeout", "4"});
    start_replica(1);
    converge("one device before the hostile clients");

    const std::string up = "POST /replicas/" + replica_id(2) + "/up HTTP/1.1\r\n";
    const std::string own = "Authorization: Bearer device-2\r\n";
    std::vector<std::unique_ptr<Raw>> idle, slow_heads, slow_bodies, unauthenticated;
    for (int i = 0; i < 1000; ++i) idle.push_back(std::make_unique<Raw>(port_));
    for (int i = 0; i < 300; ++i) {
        slow_heads.push_back(std::make_unique<Raw>(port_));
        slow_heads.back()->write("GET /replicas/" + replica_id(2) + "/next HTTP/1.1\r\n");
    }
    for (int i = 0; i < 20; ++i) {
        slow_bodies.push_back(std::make_unique<Raw>(port_));
        slow_bodies.back()->write(up + own + "Content-Length: 100000\r\n\r\n{");
    }
    const std::string megabyte(1 << 20, 'x');
    for (int i = 0; i < 8; ++i) {
        unauthenticated.push_back(std::make_unique<Raw>(port_));
        unauthenticated.back()->write(up + "Content-Length: 60000000\r\n\r\n");
        unauthenticated.back()->write(megabyte);
    }
    // The slow ones go on sending, a line and a byte a second, until the gateway ends them.
    struct Trickle {
        std::atomic<bool> stop{false};
        std::thread thread;
        ~Trickle() {
            stop = true;
            thread.join();
        }
    } trickle;
    trickle.thread = std::thread([&] {
        while (!trickle.stop) {
            for (auto& slow : slow_heads) slow->write("X-Slow: 1\r\n");
            for (auto& slow : slow_bodies) slow->write("1");
            std::this_thread::sleep_for(1s);
        }
    });

    // The real device converges meanwhile.
    db().query("UPDATE shop.products SET price = price + 1 WHERE id <= 60");
    db().query("INSERT INTO shop.prices VALUES (1, 41, 4.10)");
    converge("changes while hostile clients hold the gateway");

    // Garbage past the bound: kept twice, then refused.
    const auto post_up = [&](const std::string& body) {
        Raw device(port_);
        device.write(up + own + "Connection: close\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
        return status_line(device.read_until_closed(10s));
    };
    EXPECT_EQ(post_up("garbage 1"), "HTTP/1.1 200 OK");
    EXPECT_EQ(post_up("garbage 2"), "HTTP/1.1 200 OK");
    EXPECT_EQ(post_up("garbage 3"), "HTTP/1.1 507 Insufficient Storage");
    EXPECT_EQ(
        db().value("SELECT count(*) FROM sync.set_aside WHERE replica = $1::uuid", {replica_id(2)}),
        "2");
    // One upload sent again and again: one answer waits for the device.
    const std::string upload =
        R"({"v":1,"id":"20000000-0000-0000-0000-000000000001","rows":[)"
        R"({"t":"shop.sales","r":{"id":"30000000-0000-0000-0000-000000000001",)"
        R"("register_id":")" +
        replica_id(2) + R"(","product_id":1,"qty":1}}]})";
    for (int i = 0; i < 30; ++i) EXPECT_EQ(post_up(upload), "HTTP/1.1 200 OK") << i;
    EXPECT_EQ(db().value("SELECT count(*) FROM shop.sales"), "1");
    EXPECT_EQ(db().value("SELECT (SELECT count(*) FROM sync.outbox o WHERE o.replica = $1::uuid "
                         "AND o.upload = $2::uuid) + (SELECT count(*) FROM sync.answer a WHERE "
                         "a.replica = $1::uuid AND a.payload->>'upload' = $2::text)",
                         {replica_id(2), "20000000-0000-0000-0000-000000000001"}),
              "1");

    // Every unauthenticated upload was refused on its headers; the slow and the idle were ended.
    for (auto& refused : unauthenticated)
        EXPECT_EQ(status_line(refused->read_until_closed(5s)), "HTTP/1.1 401 Unauthorized");
    for (auto& slow : slow_heads)
        EXPECT_EQ(status_line(slow->read_until_closed(5s)), "HTTP/1.1 408 Request Timeout");
    for (auto& slow : slow_bodies)
        EXPECT_EQ(status_line(slow->read_until_closed(5s)), "HTTP/1.1 408 Request Timeout");
    for (auto& connection : idle) {
        EXPECT_EQ(connection->read_until_closed(5s), "");
        EXPECT_TRUE(connection->closed());
    }
    const pid_t gateway = deployment_->sender()->pid();
    EXPECT_LE(proc_status(gateway, "Threads"), 12);
    EXPECT_LT(proc_status(gateway, "VmHWM"), 100 * 1024) << "kB at its peak";
    db().query("UPDATE shop.products SET price = price + 1 WHERE id <= 10");
    converge("after the hostile clients");
}

// Two pull gateways behind one address (a proxy that sends each request to the next of them in
// turn), for the proxy's count of what each device was served.
class RoundRobin {
  public:
    explicit RoundRobin(std::vector<int> gateways) : port_(free_port()), gateways_(gateways) {
        server_.new_task_queue = [] { return new httplib::ThreadPool(16); };
        const auto forward = [this](const httplib::Request& request, httplib::Response& response) {
            int gateway = 0;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                gateway = gateways_[turn_++ % gateways_.size()];
            }
            httplib::Client client("127.0.0.1", gateway);
            client.set_read_timeout(60, 0);
            httplib::Headers headers{{"Authorization", request.get_header_value("Authorization")}};
            auto result = request.method == "GET"
                              ? client.Get(request.path.c_str(), headers)
                              : client.Post(request.path.c_str(), headers, request.body,
                                            "application/octet-stream");
            if (!result) {
                response.status = 502;
                return;
            }
            response.status = result->status;
            response.set_content(result->body, result->get_header_value("Content-Type"));
            if (result->has_header("message-id")) {
                const std::string id = result->get_header_value("message-id");
                response.set_header("message-id", id);
                std::lock_guard<std::mutex> lock(mutex_);
                ++served_[request.path + " " + id];
                ++by_gateway_[gateway];
            }
        };
        server_.Get(".*", forward);
        server_.Post(".*", forward);
        if (!server_.bind_to_port("127.0.0.1", port_))
            throw std::runtime_error("the proxy cannot listen on its port");
        thread_ = std::thread([this] { server_.listen_after_bind(); });
    }
    ~RoundRobin() {
        server_.stop();
        thread_.join();
    }
    int port() const { return port_; }
    // "path message-id" of every head served more than once.
    std::vector<std::string> served_twice() {
        std::lock_guard<std::mutex> lock(mutex_);
        std::vector<std::string> twice;
        for (const auto& [what, times] : served_)
            if (times > 1) twice.push_back(what);
        return twice;
    }
    // How many heads each gateway served.
    std::map<int, int> by_gateway() {
        std::lock_guard<std::mutex> lock(mutex_);
        return by_gateway_;
    }

  private:
    int port_;
    std::vector<int> gateways_;
    httplib::Server server_;
    std::thread thread_;
    std::mutex mutex_;
    size_t turn_ = 0;
    std::map<std::string, int> served_;
    std::map<int, int> by_gateway_;
};

// Push and pull on one database (issue 36): each replica is delivered by the transport its row
// names. The push sender never posts a pull device's messages (before: it leased every live
// replica's head, and a catch-all endpoint would have had them recorded sent), and two pull
// gateways behind one address serve each device each head once.
TEST_F(Pull, PushAndPullShareADatabaseAndTwoGatewaysServeEachHeadOnce) {
    db().query("ALTER TABLE shop.registers ADD COLUMN delivery text NOT NULL DEFAULT 'pull'");
    db().query(
        "SELECT sync.replicas('shop.registers', 'registers', live => 'active', transport => "
        "'delivery')");
    add_registers(1, 4);
    db().query("UPDATE shop.registers SET delivery = 'http' WHERE id IN ($1::uuid, $2::uuid)",
               {replica_id(3), replica_id(4)});
    std::vector<int> ports;
    std::vector<std::unique_ptr<Process>> gateways;
    for (const char* name : {"/gateway_1.log", "/gateway_2.log"}) {
        ports.push_back(free_port());
        gateways.push_back(std::make_unique<Process>(
            pull_gateway_command(deployment_->bin() + "/magic-sync-sender", deployment_->conninfo(),
                                 ports.back(), kTokenQuery, "5"),
            deployment_->directory() + name));
    }
    RoundRobin proxy(ports);
    port_ = proxy.port();  // the devices' url()
    deployment_->start_http_sender();
    for (int n : {3, 4}) deployment_->start_http_replica(replicas_[n]);
    for (int n : {1, 2}) start_replica(n);
    converge("two devices pushed, two pulling through two gateways");
    db().query("UPDATE shop.products SET price = price + 1 WHERE id <= 80");
    db().query("INSERT INTO shop.prices VALUES (1, 41, 1.50), (2, 41, 2.50)");
    converge("changes for both kinds of device");

    const std::map<std::string, size_t> posted = deployment_->router().largest();
    EXPECT_EQ(posted.count(replica_id(1)) + posted.count(replica_id(2)), 0u)
        << "the push sender posted a pull device's messages";
    EXPECT_EQ(posted.count(replica_id(3)) + posted.count(replica_id(4)), 2u);
    EXPECT_EQ(proxy.served_twice(), std::vector<std::string>{});
    const std::map<int, int> served = proxy.by_gateway();
    for (int port : ports) EXPECT_GT(served.count(port) ? served.at(port) : 0, 0) << port;
    EXPECT_EQ(db().value("SELECT count(*) FROM sync.delivery WHERE last_error IS NOT NULL"), "0");
}

}  // namespace
}  // namespace magic_sync::test
