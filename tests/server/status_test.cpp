// What an operator sees (issue 40): under a steady write load, with every real part
// (PostgreSQL with the relay worker, magic-sync-sender over http through the test's router,
// magic-sync-replica processes), one replica's line is cut. sync.status must tell the fault
// from the busy fleet at every look: the cut replica is `failing`, with its error, while the
// others are only ever in sync, catching up or waiting for their report. Its line healed, the
// cut replica is delivered at its next probe (magic_sync.probe_every), long before the end of
// its backoff, and not noticed only once the backoff has run out.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/router.hpp"

namespace magic_sync::test {
namespace {

using namespace std::chrono_literals;

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
    CREATE TABLE shop.products (id int PRIMARY KEY, price int NOT NULL);
    SELECT sync.replicas('shop.registers', 'registers', live => 'active');
    SELECT sync.catalog('shop.products');
    INSERT INTO shop.products SELECT i, i FROM generate_series(1, 20) i;
    INSERT INTO shop.registers (id) SELECT ('00000000-0000-0000-0000-' || lpad(n::text, 12, '0'))::uuid
    FROM generate_series(1, 4) n;
)sql";

const std::set<std::string> kBusy{"in sync", "catching up", "waiting for its report"};

TEST(Status, ACutLineIsFailingWhileTheBusyFleetIsNotAndIsProbedWhenItAnswers) {
    // A first failure backs off for a minute: only a probe brings the healed line back sooner.
    Deployment deployment("status",
                          {"magic_sync.idle = 100", "magic_sync.backoff = '60s'",
                           "magic_sync.backoff_max = '10min'", "magic_sync.probe_every = '1s'"},
                          "shop", kShop);
    Connection& db = deployment.db();
    std::vector<ReplicaProcess> replicas;
    for (int n = 1; n <= 4; ++n) replicas.push_back(deployment.replica(replica_id(n)));
    // The victim (4) does not upload: an upload would end its backoff too (sync.receive), and
    // here only the probe may.
    for (int n = 0; n < 3; ++n) deployment.start_http_replica(replicas[n]);
    deployment.start_http_replica(replicas[3], {}, "");
    deployment.start_http_sender({"--send-timeout", "10"});
    ASSERT_TRUE(eventually(
        [&] {
            // Proven by reports of the products, not only of scopes the relay has not filled.
            return db.value(
                       "SELECT count(*) FROM sync.status s WHERE s.state = 'in sync' AND"
                       " EXISTS (SELECT FROM sync.holding h"
                       "         WHERE h.replica = s.replica AND h.n = 20)") == "3";
        },
        30s))
        << db.value("SELECT string_agg(replica || ': ' || state_detail, E'\\n') FROM sync.status");

    // The load: a product's price changes every 20 ms, each a message to every replica.
    std::atomic<bool> writing{true};
    std::thread writer([&] {
        Connection load(deployment.conninfo());
        for (int i = 0; writing; ++i) {
            load.query("UPDATE shop.products SET price = price + 1 WHERE id = $1::int",
                       {std::to_string(i % 20 + 1)});
            std::this_thread::sleep_for(20ms);
        }
    });
    struct StopWriting {
        std::atomic<bool>& writing;
        std::thread& writer;
        ~StopWriting() {
            writing = false;
            if (writer.joinable()) writer.join();
        }
    } stop_writing{writing, writer};

    // What sync.status says of each replica, at one look.
    const auto look = [&] {
        std::map<std::string, std::vector<std::string>> said;
        for (const auto& row : db.query(
                 "SELECT replica::text, state, state_detail FROM sync.status ORDER BY replica"))
            said[*row[0]] = {*row[1], *row[2]};
        return said;
    };
    std::set<std::string> others_were;
    const auto others_busy = [&](const std::map<std::string, std::vector<std::string>>& said) {
        for (int n = 1; n <= 3; ++n) {
            const auto& state = said.at(replica_id(n))[0];
            others_were.insert(state);
            if (!kBusy.count(state)) {
                ADD_FAILURE() << "replica " << n << " is " << state << ": "
                              << said.at(replica_id(n))[1];
                return false;
            }
        }
        return true;
    };

    std::this_thread::sleep_for(1s);
    deployment.router().cut(replica_id(4), true);
    std::string victim;
    ASSERT_TRUE(eventually(
        [&] {
            const auto said = look();
            if (!others_busy(said)) return true;  // failed above
            victim = said.at(replica_id(4))[0] + ": " + said.at(replica_id(4))[1];
            return said.at(replica_id(4))[0] == "failing";
        },
        30s))
        << victim;
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(victim.substr(0, victim.find(';')), "failing: delivery failing: HTTP 503");
    // It stays failing, probed, while the others carry on.
    for (int looks = 0; looks < 10; ++looks) {
        const auto said = look();
        ASSERT_TRUE(others_busy(said));
        ASSERT_EQ(said.at(replica_id(4))[0], "failing") << said.at(replica_id(4))[1];
        std::this_thread::sleep_for(200ms);
    }
    EXPECT_TRUE(others_were.count("catching up") || others_were.count("waiting for its report"))
        << "the load never showed";

    // Healed: delivered at its next probe, while its backoff (a minute at least) still runs.
    const std::string backoff_until =
        db.value("SELECT backoff_until FROM sync.current_delivery WHERE replica = $1::uuid",
                 {replica_id(4)});
    ASSERT_FALSE(backoff_until.empty());
    deployment.router().cut(replica_id(4), false);
    ASSERT_TRUE(eventually(
        [&] {
            // A delivery taken ends the backoff (sync.sent).
            return db.value(
                       "SELECT backoff IS NULL FROM sync.current_delivery"
                       " WHERE replica = $1::uuid",
                       {replica_id(4)}) == "t";
        },
        30s))
        << "not delivered since the line healed: " << look().at(replica_id(4))[1];
    EXPECT_EQ(db.value("SELECT now() < $1::timestamptz", {backoff_until}), "t")
        << "delivered only once the backoff ran out";

    // The load stops: the others are proven in sync; the victim, which does not upload, has had
    // everything delivered and waits for its report.
    writing = false;
    writer.join();
    ASSERT_TRUE(eventually(
        [&] {
            const auto said = look();
            return said.at(replica_id(1))[0] == "in sync" &&
                   said.at(replica_id(2))[0] == "in sync" &&
                   said.at(replica_id(3))[0] == "in sync" &&
                   said.at(replica_id(4))[0] == "waiting for its report";
        },
        30s))
        << db.value(
               "SELECT string_agg(replica || ': ' || state || ': ' || state_detail, E'\\n') "
               "FROM sync.status");
}

}  // namespace
}  // namespace magic_sync::test
