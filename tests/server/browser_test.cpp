// The TypeScript replica (clients/js) in a real browser against a real pull gateway: PostgreSQL
// with magic_sync preloaded, magic-sync-sender --transport pull with --cors-origin and --gzip (the
// browser asks for gzip and inflates the heads before the page reads them), and the
// replica's page in Debian's chromium, driven by clients/js/test/browser.js (puppeteer-core),
// which serves the page from another origin than the gateway's. The page must hold what the
// oracle (sync.expected: the tables and the declarations) says, take a local write and upload it
// gzip (filed in the server's table: the preflight allows Content-Encoding), and survive a
// reload: the same rows and position from IndexedDB, and converging on the next change. Its
// screenshots are kept in build/artifacts/browser/.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "support/pull_gateway.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true,
                                 token_hash text UNIQUE);
    CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2),
                                ratio float8, tags text[], doc jsonb);
    CREATE TABLE shop.sales (id uuid PRIMARY KEY, register_id uuid NOT NULL,
                             product_id int NOT NULL, qty int NOT NULL);
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.products');
    SELECT sync.record('shop.sales');
    INSERT INTO shop.products
    SELECT i, 'product ' || i || ' ✓', i * 1.25, 1.0 / i, ARRAY['a', 'b' || i],
           jsonb_build_object('n', i, 'deep', jsonb_build_array(true, null, 1.50))
    FROM generate_series(1, 60) i;
    INSERT INTO shop.registers (id, token_hash)
    VALUES ('00000000-0000-0000-0000-000000000001', encode(sha256('device-1'), 'hex'));
)sql";

const char* const kTokenQuery =
    "SELECT id FROM shop.registers WHERE token_hash = encode(sha256(convert_to($1, 'UTF8')), "
    "'hex')";

const std::string kReplica = "00000000-0000-0000-0000-000000000001";
const std::string kDriver = "clients/js/test/browser.js";

// The driver: node with its standard input and output on pipes, its standard error in a log.
class Driver {
  public:
    explicit Driver(const std::string& log) : log_(log) {
        int in[2], out[2];
        if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe failed");
        pid_ = fork();
        if (pid_ < 0) throw std::runtime_error("fork failed");
        if (pid_ == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            dup2(fd, 2);
            close(in[1]);
            close(out[0]);
            execlp("node", "node", kDriver.c_str(), nullptr);
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        to_ = in[1];
        from_ = out[0];
    }
    ~Driver() {
        if (to_ >= 0) {
            const std::string quit = "{\"do\":\"quit\"}\n";
            [[maybe_unused]] const ssize_t n = write(to_, quit.data(), quit.size());
            close(to_);
        }
        // The driver closes chromium on quit; past 10 s it is killed with what it started.
        bool ended = false;
        for (int i = 0; i < 100 && !ended; ++i) {
            int status = 0;
            ended = waitpid(pid_, &status, WNOHANG) == pid_;
            if (!ended) usleep(100000);
        }
        if (!ended) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        close(from_);
    }
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    // The next line it writes, within `wait`; throws when none comes.
    json line(std::chrono::milliseconds wait = 60s) {
        const auto deadline = std::chrono::steady_clock::now() + wait;
        for (;;) {
            const size_t end = buffer_.find('\n');
            if (end != std::string::npos) {
                const std::string text = buffer_.substr(0, end);
                buffer_.erase(0, end + 1);
                return json::parse(text);
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            pollfd readable{from_, POLLIN, 0};
            if (left.count() <= 0 || poll(&readable, 1, static_cast<int>(left.count())) <= 0)
                throw std::runtime_error("the browser driver did not answer:\n" + log());
            char chunk[65536];
            const ssize_t n = read(from_, chunk, sizeof chunk);
            if (n <= 0) throw std::runtime_error("the browser driver ended:\n" + log());
            buffer_.append(chunk, static_cast<size_t>(n));
        }
    }

    // Sends a command; returns its answer, which must say ok.
    json ask(const json& command) {
        const std::string text = command.dump() + "\n";
        if (write(to_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
            throw std::runtime_error("cannot write to the browser driver");
        json answer = line();
        if (!answer.value("ok", false))
            throw std::runtime_error(command.dump() + ": " + answer.dump() + "\n" + log());
        return answer;
    }

    std::string log() const {
        std::ifstream file(log_);
        std::stringstream text;
        text << file.rdbuf();
        return text.str();
    }

  private:
    std::string log_;
    pid_t pid_ = -1;
    int to_ = -1;
    int from_ = -1;
    std::string buffer_;
};

// Sorted lines joined, whatever order they came in.
std::string sorted(std::vector<std::string> lines) {
    std::sort(lines.begin(), lines.end());
    std::string joined;
    for (size_t i = 0; i < lines.size(); ++i) joined += (i ? "\n" : "") + lines[i];
    return joined;
}

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> lines;
    std::stringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

class Browser : public ::testing::Test {
  protected:
    void SetUp() override {
        if (access("/usr/bin/chromium", X_OK) != 0 ||
            access("clients/js/node_modules/puppeteer-core", F_OK) != 0 ||
            access("clients/js/dist/browser.js", F_OK) != 0)
            FAIL() << "the browser test needs Debian's chromium (make setup) and clients/js built "
                      "(make test-builds: npm ci and tsc)";
        deployment_ = std::make_unique<Deployment>(
            "browser", std::vector<std::string>{"magic_sync.idle = 100"}, "shop", kShop);
        port_ = free_port();
        driver_ = std::make_unique<Driver>(deployment_->directory() + "/browser.log");
        origin_ = driver_->line()["origin"];
        deployment_->sender() = std::make_unique<Process>(
            pull_gateway_command(deployment_->bin() + "/magic-sync-sender", deployment_->conninfo(),
                                 port_, kTokenQuery, "5", {"--cors-origin", origin_, "--gzip"}),
            deployment_->directory() + "/sender.log");
        artifacts_ = "build/artifacts/browser";
        run("mkdir -p " + artifacts_);
    }
    void TearDown() override {
        if (HasFailure() && deployment_) {
            deployment_->keep_directory();
            std::cerr << "kept " << deployment_->directory() << std::endl;
        }
        driver_.reset();
        deployment_.reset();
    }

    Connection& db() { return deployment_->db(); }

    std::string expected() { return sorted(split(db().value(kExpectedHoldings, {kReplica}))); }
    std::string held() {
        return sorted(driver_->ask({{"do", "held"}})["lines"].get<std::vector<std::string>>());
    }
    json shown() { return driver_->ask({{"do", "show"}})["shown"]; }

    // The page holds what the oracle says and nothing is left unsent to it.
    void converge(const std::string& scenario) {
        std::cerr << "converging: " << scenario << std::endl;
        const bool converged = eventually(
            [&] {
                return db().value("SELECT count(*) FROM sync.note") == "0" &&
                       db().value(
                           "SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL AND "
                           "replica = $1::uuid",
                           {kReplica}) == "0" &&
                       held() == expected();
            },
            60s);
        ASSERT_TRUE(converged) << "not converged: " << scenario << "\nthe page holds\n"
                               << held().substr(0, 2000) << "\nexpected\n"
                               << expected().substr(0, 2000) << "\nbrowser log:\n"
                               << driver_->log() << "\nsender log:\n"
                               << deployment_->sender()->log();
    }

    std::unique_ptr<Deployment> deployment_;
    std::unique_ptr<Driver> driver_;
    int port_ = 0;
    std::string origin_;
    std::string artifacts_;
};

TEST_F(Browser, ThePageConvergesUploadsAWriteAndSurvivesAReload) {
    driver_->ask({{"do", "open"},
                  {"gateway", "http://127.0.0.1:" + std::to_string(port_)},
                  {"token", "device-1"},
                  {"replica", kReplica},
                  {"gzipUp", true}});
    converge("provisioned");
    ASSERT_EQ(split(expected()).size(), 60u);

    // A change of values of every kind, a delete and an insert.
    db().query(
        "UPDATE shop.products SET ratio = 'NaN', doc = '{\"s\": \"é\\\"q\"}', tags = '{}' "
        "WHERE id = 1");
    db().query("UPDATE shop.products SET price = NULL, name = 'renamed' WHERE id <= 5");
    db().query("DELETE FROM shop.products WHERE id BETWEEN 30 AND 34");
    db().query("INSERT INTO shop.products (id, name) VALUES (61, 'new')");
    converge("changed");

    // A local write goes up through the gateway and is filed.
    const std::string sale = "10000000-0000-4000-8000-000000000001";
    driver_->ask(
        {{"do", "write"},
         {"table", "shop.sales"},
         {"row",
          json{{"id", sale}, {"register_id", kReplica}, {"product_id", 3}, {"qty", 2}}.dump()},
         {"key", {"id"}}});
    ASSERT_TRUE(eventually(
        [&] { return db().value("SELECT count(*) FROM shop.sales WHERE id = $1", {sale}) == "1"; },
        60s))
        << driver_->log();
    EXPECT_EQ(db().value("SELECT register_id || ' ' || product_id || ' ' || qty FROM shop.sales"),
              kReplica + " 3 2");
    EXPECT_NE(driver_->log().find(" (gzip): filed"), std::string::npos) << driver_->log();
    // Its answer came down: no local write left, nothing kept.
    ASSERT_TRUE(eventually([&] { return shown()["local_writes"].empty(); }, 60s)) << shown().dump();
    EXPECT_TRUE(shown()["kept"].empty()) << shown().dump();
    converge("the write filed");
    driver_->ask({{"do", "screenshot"}, {"file", artifacts_ + "/converged.png"}});

    // Reloaded: the same rows and position, kept in IndexedDB.
    const json before = shown();
    driver_->ask({{"do", "reload"}});
    const json after = shown();
    EXPECT_EQ(after["position"], before["position"]);
    EXPECT_EQ(after["held"], before["held"]);
    EXPECT_EQ(after["holds"], before["holds"]);
    EXPECT_EQ(held(), expected());
    EXPECT_NE(before["position"]["gen"], 0);

    // And it goes on converging.
    db().query("UPDATE shop.products SET price = price + 1 WHERE id BETWEEN 40 AND 45");
    db().query("DELETE FROM shop.products WHERE id = 60");
    converge("changed after the reload");
    EXPECT_GT(shown()["position"]["seq"].get<int64_t>(), before["position"]["seq"].get<int64_t>());
    // Its uploads confirmed what it applied and proved what it holds.
    EXPECT_TRUE(eventually([&] {
        return db().value("SELECT state FROM sync.status WHERE replica = $1::uuid", {kReplica}) ==
               "in sync";
    })) << db().value("SELECT row_to_json(s)::text FROM sync.status s");
    driver_->ask({{"do", "screenshot"}, {"file", artifacts_ + "/after-reload.png"}});
}

}  // namespace
}  // namespace magic_sync::test
