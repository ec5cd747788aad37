// The fleet page (magic-sync-sender --metrics: GET / and /fleet.json) in a real browser: a fleet
// of three replicas over http, one of them killed, and headless Chromium loading the page once,
// running its script against the sender and dumping what it drew. The killed device is shown
// failing, the others in sync. A proxy on its line answers 503 with markup in the body: the page
// shows that error as text, and runs none of it. The screenshot and the DOM are
// kept in build/test-artifacts/ (fleet_page.png, fleet_page.html), whatever the outcome.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/process.hpp"
#include "support/cluster.hpp"
#include "support/eventually.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2) NOT NULL);
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.products');
    INSERT INTO shop.products SELECT i, 'product ' || i, i FROM generate_series(1, 20) i;
)sql";

const char* const kArtifacts = "build/test-artifacts";

// The state the page's table shows for `replica` in `dom`, or what it found instead.
std::string shown_state(const std::string& dom, const std::string& replica) {
    const size_t row = dom.find("data-replica=\"" + replica + "\"");
    if (row == std::string::npos) return "(no row for " + replica + ")";
    const size_t end = dom.find("</tr>", row);
    const std::string cell = "<td class=\"state ";
    const size_t at = dom.find(cell, row);
    if (at == std::string::npos || at > end) return "(no state cell)";
    const size_t text = dom.find('>', at) + 1;
    return dom.substr(text, dom.find("</td>", text) - text);
}

// The count the page's tile for `state` shows.
std::string tile_count(const std::string& dom, const std::string& state) {
    const size_t tile = dom.find("data-state=\"" + state + "\"");
    if (tile == std::string::npos) return "(no tile)";
    const std::string count = "<span class=\"count\">";
    const size_t at = dom.find(count, tile);
    if (at == std::string::npos) return "(no count)";
    const size_t text = at + count.size();
    return dom.substr(text, dom.find("</span>", text) - text);
}

std::string file_text(const std::string& path) {
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
}

std::string chromium_program() {
    std::string path;
    if (run("command -v chromium", &path) != 0) return "";
    while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
    return path;
}

TEST(Fleet, ThePageShowsTheDeviceThatWasCutFailing) {
    const std::string chromium = chromium_program();
    ASSERT_FALSE(chromium.empty()) << "Chromium is not installed: make setup installs it";

    Deployment deployment(
        "fleet",
        {"magic_sync.idle = 100", "magic_sync.backoff = 200", "magic_sync.backoff_max = 1000"},
        "shop", kShop);
    Connection& db = deployment.db();
    std::map<int, ReplicaProcess> replicas;
    for (int n : {1, 2, 3}) {
        db.query("INSERT INTO shop.registers (id) VALUES ($1::uuid)", {replica_id(n)});
        replicas[n] = deployment.replica(replica_id(n));
        deployment.start_http_replica(replicas[n]);
    }
    const int port = free_port();
    deployment.start_http_sender(
        {"--send-timeout", "5", "--metrics", "127.0.0.1:" + std::to_string(port)});
    const auto converged = [&](std::vector<int> which) {
        for (int n : which)
            if (deployment.held(replicas[n]) != db.value(kExpectedHoldings, {replica_id(n)}))
                return false;
        return true;
    };
    ASSERT_TRUE(eventually(
        [&] {
            return converged({1, 2, 3});
        },
        60s))
        << deployment.sender()->log();

    // Replica 2's device dies, and what answers on its line now is a proxy's error page with a
    // script in it; the prices change: its deliveries fail, the others take them.
    replicas[2].process->stop(SIGKILL);
    const std::string hostile = "<img src=x onerror=\"document.title='run'\"> proxy & co";
    httplib::Server proxy;
    proxy.Post(".*", [&](const httplib::Request&, httplib::Response& response) {
        response.status = 503;
        response.set_content(hostile, "text/html");
    });
    const int proxy_port = free_port();
    ASSERT_TRUE(proxy.bind_to_port("127.0.0.1", proxy_port));
    deployment.router().route(replica_id(2), proxy_port);
    std::thread proxying([&] { proxy.listen_after_bind(); });
    struct Stop {
        httplib::Server& server;
        std::thread& thread;
        ~Stop() {
            server.stop();
            thread.join();
        }
    } stop{proxy, proxying};
    db.query("UPDATE shop.products SET price = price + 1");

    // What the page will read says so first: one failing, two in sync (they confirmed).
    httplib::Client sender("127.0.0.1", port);
    nlohmann::json fleet;
    const auto states = [&] {
        std::map<std::string, std::string> shown;
        for (const auto& device : fleet["slowest"])
            shown[device["replica"].get<std::string>()] = device["state"].get<std::string>();
        return shown;
    };
    const std::map<std::string, std::string> expected_states = {
        {replica_id(1), "in sync"}, {replica_id(2), "failing"}, {replica_id(3), "in sync"}};
    const auto last_error = [&] {
        const nlohmann::json& error = fleet["slowest"][0]["last_error"];
        return error.is_string() ? error.get<std::string>() : "(none)";
    };
    ASSERT_TRUE(eventually(
        [&] {
            const auto answer = sender.Get("/fleet.json");
            if (!answer || answer->status != 200) return false;
            const nlohmann::json document = nlohmann::json::parse(answer->body);
            if (document["fleet"].is_null()) return false;
            fleet = document["fleet"];
            return states() == expected_states && last_error() == "HTTP 503: " + hostile;
        },
        60s))
        << fleet.dump(2) << deployment.sender()->log();
    ASSERT_TRUE(converged({1, 3}));

    // One browser, once: the page as its script drew it after reading /fleet.json, and a
    // screenshot of it.
    run("mkdir -p " + std::string(kArtifacts));
    const std::string screenshot = std::string(kArtifacts) + "/fleet_page.png";
    const std::string dom_file = std::string(kArtifacts) + "/fleet_page.html";
    std::remove(screenshot.c_str());
    std::string browser_log;
    const int status =
        run("(timeout 120 " + chromium +
                " --headless --no-sandbox --disable-gpu --user-data-dir=" + deployment.directory() +
                "/chromium --window-size=1280,1000 --virtual-time-budget=3000 "
                "--screenshot=" +
                screenshot + " --dump-dom http://127.0.0.1:" + std::to_string(port) + "/ 2>" +
                deployment.directory() + "/chromium.log >" + dom_file + ")",
            &browser_log);
    const std::string dom = file_text(dom_file);
    ASSERT_EQ(status, 0) << browser_log << file_text(deployment.directory() + "/chromium.log")
                         << dom;
    EXPECT_TRUE(std::ifstream(screenshot).good()) << "no screenshot at " << screenshot;
    std::cerr << "fleet page: " << screenshot << ", " << dom_file << std::endl;

    EXPECT_EQ(shown_state(dom, replica_id(2)), "failing") << dom;
    EXPECT_EQ(shown_state(dom, replica_id(1)), "in sync") << dom;
    EXPECT_EQ(shown_state(dom, replica_id(3)), "in sync") << dom;
    EXPECT_EQ(tile_count(dom, "failing"), "1") << dom;
    EXPECT_EQ(tile_count(dom, "in sync"), "2") << dom;
    // Its last error in its row, as text: the markup in it is shown, not made, and its script
    // did not run.
    EXPECT_EQ(fleet["slowest"][0]["replica"], replica_id(2));
    const size_t row = dom.find("data-replica=\"" + replica_id(2) + "\"");
    EXPECT_NE(
        dom.find("<td class=\"error\">HTTP 503: &lt;img src=x onerror=\"document.title='run'\"&gt; "
                 "proxy &amp; co</td>",
                 row),
        std::string::npos)
        << dom;
    EXPECT_EQ(dom.find("<img"), std::string::npos) << dom;
    EXPECT_NE(dom.find("<title>magic_sync fleet</title>"), std::string::npos) << dom;
    EXPECT_NE(dom.find("3 devices, read at"), std::string::npos) << dom;
}

}  // namespace
}  // namespace magic_sync::test
