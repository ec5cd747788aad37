// libmagic_sync_replica against real SQLite files: applying messages, generations, idempotence,
// fingerprints, range fingerprints and repair, local writes, filed answers and upload building.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "lib/replica.hpp"
#include "replica/support.hpp"

namespace magic_sync::replica::test {
namespace {

using protocol::Fingerprint;

const std::string kProducts = "shop.products";
const std::string kDrawers = "shop.drawers";
const std::string kSales = "shop.sales";

std::string product(int id, const std::string& name) {
    return R"({"id":)" + std::to_string(id) + R"(,"name":")" + name + R"("})";
}
std::string id_key(int id) { return R"({"id":)" + std::to_string(id) + "}"; }

// Everything the replica holds, as one comparable value.
std::vector<std::string> snapshot(Replica& replica) {
    std::vector<std::string> state;
    for (const HeldRow& row : replica.held_rows()) {
        state.push_back(row.table + " " + row.key + " " + row.scope + " " + row.json);
    }
    for (const ScopeHolding& holding : replica.holdings()) {
        state.push_back(holding.scope + " " + std::to_string(holding.through) + " " +
                        holding.fingerprint.hex() + " " +
                        std::to_string(holding.fingerprint.count));
    }
    state.push_back("gen " + std::to_string(replica.generation()) + " seq " +
                    std::to_string(replica.applied_seq()));
    return state;
}

std::map<std::string, std::string> held_by_key(Replica& replica) {
    std::map<std::string, std::string> rows;
    for (const HeldRow& row : replica.held_rows()) rows[row.table + row.key] = row.json;
    return rows;
}

class ReplicaTest : public ::testing::Test {
  protected:
    TempDir dir;
    std::string path = dir.file("replica.db");
    Replica replica{path, kReplicaId};
};

TEST_F(ReplicaTest, AppliesUpsertsAndDeletesByKey) {
    auto first =
        replica.apply(rows_message(1, 1,
                                   {chunk("all", 0, 3,
                                          {row(kProducts, id_key(1), product(1, "tea")),
                                           row(kProducts, id_key(2), product(2, "coffee"))})},
                                   {"*"}));
    EXPECT_EQ(first.outcome, Outcome::kApplied);
    auto second = replica.apply(rows_message(
        1, 2,
        {chunk("all", 3, 5,
               {row(kProducts, id_key(1), product(1, "green tea")), gone(kProducts, id_key(2))})}));
    EXPECT_EQ(second.outcome, Outcome::kApplied);

    std::vector<HeldRow> rows = replica.held_rows();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].key, id_key(1));
    EXPECT_EQ(rows[0].json, protocol::canonical_json(product(1, "green tea")));
    EXPECT_EQ(rows[0].scope, "all");
    EXPECT_EQ(rows[0].hash, protocol::row_hash(rows[0].json));
    std::vector<ScopeHolding> holdings = replica.holdings();
    ASSERT_EQ(holdings.size(), 1u);
    EXPECT_EQ(holdings[0].through, 5);
    EXPECT_EQ(holdings[0].fingerprint.count, 1);
    EXPECT_EQ(holdings[0].fingerprint, replica.recompute("all"));
    EXPECT_EQ(replica.applied_seq(), 2);
    EXPECT_EQ(replica.generation(), 1);
}

TEST_F(ReplicaTest, StoresTheHashAsGivenAndKeepsNumbersAsWritten) {
    protocol::DownRow priced = row(kProducts, id_key(1), R"({"id":1,"price":12.50})");
    priced.body->hash = protocol::sha256("whatever the server says");
    replica.apply(rows_message(1, 1, {chunk("all", 0, 1, {priced})}, {"*"}));
    EXPECT_EQ(replica.held_rows().at(0).hash, protocol::sha256("whatever the server says"));
    EXPECT_EQ(replica.held_rows().at(0).json, R"({"id":1,"price":12.50})");
    EXPECT_EQ(replica.rows(kProducts).at(0).json, R"({"id":1,"price":12.50})");
}

TEST_F(ReplicaTest, ResetAndDropEmptyScopes) {
    replica.apply(
        rows_message(1, 1,
                     {chunk("all", 0, 2, {row(kProducts, id_key(1), product(1, "a"))}),
                      chunk("store_id=1", 0, 4, {row("shop.prices", id_key(1), "{}")}),
                      chunk("id=" + kReplicaId, 0, 6, {row(kDrawers, id_key(1), R"({"id":1})")})},
                     {"*"}));
    ASSERT_EQ(replica.held_rows().size(), 3u);

    // A reset empties the scope (it stays held, through 0) and then takes the chunk.
    replica.apply(rows_message(
        1, 2, {chunk("all", 0, 9, {row(kProducts, id_key(2), product(2, "b"))})}, {"all"}));
    // A drop leaves the scope.
    replica.apply(rows_message(1, 3, {}, {}, {"store_id=1"}));

    auto rows = held_by_key(replica);
    EXPECT_EQ(rows.size(), 2u);
    EXPECT_TRUE(rows.count(kProducts + id_key(2)));
    EXPECT_TRUE(rows.count(kDrawers + id_key(1)));
    std::vector<ScopeHolding> holdings = replica.holdings();
    ASSERT_EQ(holdings.size(), 2u);
    EXPECT_EQ(holdings[0].scope, "all");
    EXPECT_EQ(holdings[0].through, 9);
    EXPECT_EQ(holdings[1].scope, "id=" + kReplicaId);

    // "*" drops everything held.
    replica.apply(rows_message(1, 4, {}, {"*"}));
    EXPECT_TRUE(replica.held_rows().empty());
    EXPECT_TRUE(replica.holdings().empty());
}

// A table dropped on the wire goes from every scope that holds rows of it, and the scopes'
// fingerprints with them; the other tables stay.
TEST_F(ReplicaTest, DropTablesEmptiesThoseTablesInEveryScope) {
    replica.apply(rows_message(
        1, 1,
        {chunk("all", 0, 2,
               {row(kProducts, id_key(1), product(1, "a")), row(kDrawers, id_key(7), "{}")}),
         chunk("store_id=1", 0, 4, {row(kProducts, id_key(2), product(2, "b"))})},
        {"*"}));
    protocol::RowsMessage drop;
    drop.header = {kReplicaId, 1, 2, ""};
    drop.drop_tables = {kProducts};
    drop.chunks.push_back(chunk("all", 2, 3, {row(kProducts, id_key(3), product(3, "c"))}));
    ASSERT_EQ(replica.apply(protocol::encode(drop)).outcome, Outcome::kApplied);
    auto rows = held_by_key(replica);
    EXPECT_EQ(rows.size(), 2u);
    EXPECT_TRUE(rows.count(kDrawers + id_key(7)));
    EXPECT_TRUE(rows.count(kProducts + id_key(3)));  // the chunks come after the drop
    for (const ScopeHolding& holding : replica.holdings()) {
        EXPECT_EQ(holding.fingerprint, replica.recompute(holding.scope)) << holding.scope;
    }
    std::vector<ScopeHolding> holdings = replica.holdings();
    ASSERT_EQ(holdings.size(), 2u);
    EXPECT_EQ(holdings[1].scope, "store_id=1");
    EXPECT_EQ(holdings[1].fingerprint.count, 0);
}

// A row the server withholds is outside both sides' fingerprints: a version of it held from
// before goes, and the replica is told why.
TEST_F(ReplicaTest, AWithheldRowGoesFromWhereItWasHeld) {
    replica.apply(rows_message(1, 1,
                               {chunk("all", 0, 2,
                                      {row(kProducts, id_key(1), product(1, "a")),
                                       row(kProducts, id_key(2), product(2, "b"))})},
                               {"*"}));
    protocol::RowsMessage withheld;
    withheld.header = {kReplicaId, 1, 2, ""};
    withheld.chunks.push_back(chunk("all", 2, 3, {}));
    withheld.withheld.push_back({kProducts, id_key(1), "too big"});
    ASSERT_EQ(replica.apply(protocol::encode(withheld)).outcome, Outcome::kApplied);
    auto rows = held_by_key(replica);
    EXPECT_EQ(rows.size(), 1u);
    EXPECT_TRUE(rows.count(kProducts + id_key(2)));
    std::vector<ScopeHolding> holdings = replica.holdings();
    ASSERT_EQ(holdings.size(), 1u);
    EXPECT_EQ(holdings[0].fingerprint, replica.recompute("all"));
    EXPECT_EQ(holdings[0].fingerprint.count, 1);
    std::vector<std::string> notices = replica.notices();
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_EQ(notices[0].substr(notices[0].find("withheld")),
              "withheld by the server: " + kProducts + " " + id_key(1) + ": too big");
}

// A withheld row whose key is too long for the server's note is named by its key's hash: the
// held row with that hash goes all the same.
TEST_F(ReplicaTest, AWithheldRowNamedByItsKeyHashGoes) {
    replica.apply(rows_message(1, 1,
                               {chunk("all", 0, 2,
                                      {row(kProducts, id_key(1), product(1, "a")),
                                       row(kProducts, id_key(2), product(2, "b"))})},
                               {"*"}));
    protocol::RowsMessage withheld;
    withheld.header = {kReplicaId, 1, 2, ""};
    withheld.chunks.push_back(chunk("all", 2, 3, {}));
    protocol::KeyNote note{kProducts, "", "too big"};
    note.key_hash = protocol::key_hash(kProducts, id_key(1));
    withheld.withheld.push_back(note);
    ASSERT_EQ(replica.apply(protocol::encode(withheld)).outcome, Outcome::kApplied);
    auto rows = held_by_key(replica);
    EXPECT_EQ(rows.size(), 1u);
    EXPECT_TRUE(rows.count(kProducts + id_key(2)));
    EXPECT_EQ(replica.holdings().at(0).fingerprint, replica.recompute("all"));
    const std::string notice = replica.notices().back();
    EXPECT_EQ(notice.substr(notice.find("withheld")),
              "withheld by the server: " + kProducts + " (key hash " +
                  protocol::to_hex(*note.key_hash) + "): too big");
}

TEST_F(ReplicaTest, GenerationRules) {
    replica.apply(rows_message(
        2, 5, {chunk("all", 0, 1, {row(kProducts, id_key(1), product(1, "a"))})}, {"*"}));
    std::vector<std::string> before = snapshot(replica);

    // Older generation: ignored, still taken.
    ApplyResult older = replica.apply(
        rows_message(1, 9, {chunk("all", 1, 2, {row(kProducts, id_key(9), product(9, "old"))})}));
    EXPECT_EQ(older.outcome, Outcome::kOlderGeneration);
    EXPECT_TRUE(older.taken());
    // Same generation, seq not after the last applied: ignored, still taken.
    ApplyResult again = replica.apply(
        rows_message(2, 4, {chunk("all", 1, 2, {row(kProducts, id_key(9), product(9, "old"))})}));
    EXPECT_EQ(again.outcome, Outcome::kAlreadyApplied);
    EXPECT_TRUE(again.taken());
    EXPECT_EQ(snapshot(replica), before);

    // A newer generation is a provision again: what the old one held goes, even unasked.
    ApplyResult newer = replica.apply(
        rows_message(3, 1, {chunk("all", 0, 1, {row(kProducts, id_key(2), product(2, "b"))})}));
    EXPECT_EQ(newer.outcome, Outcome::kApplied);
    EXPECT_EQ(replica.generation(), 3);
    EXPECT_EQ(replica.applied_seq(), 1);
    auto rows = held_by_key(replica);
    EXPECT_EQ(rows.size(), 1u);
    EXPECT_TRUE(rows.count(kProducts + id_key(2)));
}

// A message of another history than the one applied last (the server restored, its extension
// made again, a standby promoted) is not judged by gen and seq: the restored server's 1.1 is
// applied, not skipped as applied already; the replica says so, reports what it holds again,
// and refuses what still comes from the history it left.
TEST_F(ReplicaTest, AnotherHistoryIsTakenAsItComesAndTheOldOneRefused) {
    const std::string before = "7391841912345678901/1/0b0e3f7e-5bb4-4d3f-9d6e-2f3c4b5a6978";
    const std::string after = "7391841912345678901/1/5c1d2e3f-0000-4000-8000-000000000001";
    replica.apply(protocol::with_origin(
        rows_message(1, 1, {chunk("all", 0, 1, {row(kProducts, id_key(1), product(1, "a"))})},
                     {"*"}),
        before));
    ASSERT_EQ(
        replica
            .apply(protocol::with_origin(
                rows_message(1, 2,
                             {chunk("all", 1, 15, {row(kProducts, id_key(2), product(2, "b"))})}),
                before))
            .outcome,
        Outcome::kApplied);
    ASSERT_TRUE(replica.prepare_upload());  // its holdings said once
    replica.mark_sent(replica.prepare_upload()->id);

    // The restored server starts again at 1.1, a reset: applied.
    ApplyResult restored = replica.apply(protocol::with_origin(
        rows_message(1, 1, {chunk("all", 0, 3, {row(kProducts, id_key(1), product(1, "new"))})},
                     {"*"}),
        after));
    EXPECT_EQ(restored.outcome, Outcome::kApplied);
    EXPECT_EQ(held_by_key(replica),
              (std::map<std::string, std::string>{{kProducts + id_key(1), product(1, "new")}}));
    EXPECT_EQ(replica.applied_seq(), 1);
    std::vector<std::string> notices = replica.notices();
    ASSERT_FALSE(notices.empty());
    EXPECT_EQ(notices.back().substr(notices.back().find(' ', 11) + 1),
              "the server's history changed (origin " + before + " to " + after +
                  "): a restore, a re-created extension or a failover; what this "
                  "replica holds is proven again");
    std::optional<PreparedUpload> report = replica.prepare_upload();
    ASSERT_TRUE(report);
    EXPECT_EQ(report->upload.holds["all"].through, 3);

    // Its next message applies; the same again, by its counters, does not.
    const std::string next = protocol::with_origin(
        rows_message(1, 2, {chunk("all", 3, 4, {row(kProducts, id_key(2), product(2, "c"))})}),
        after);
    EXPECT_EQ(replica.apply(next).outcome, Outcome::kApplied);
    EXPECT_EQ(replica.apply(next).outcome, Outcome::kAlreadyApplied);
    // A late message of the history it left is refused, and changes nothing.
    std::vector<std::string> held = snapshot(replica);
    ApplyResult late = replica.apply(protocol::with_origin(
        rows_message(1, 16, {chunk("all", 15, 16, {row(kProducts, id_key(9), product(9, "x"))})}),
        before));
    EXPECT_EQ(late.outcome, Outcome::kOlderGeneration);
    EXPECT_EQ(late.detail, "written in a history this replica left (origin " + before + ")");
    EXPECT_EQ(snapshot(replica), held);
    // A message that names no origin is judged by the counters, as before.
    EXPECT_EQ(replica.apply(rows_message(1, 2, {})).outcome, Outcome::kAlreadyApplied);
}

TEST_F(ReplicaTest, ApplyingTheSameMessageTwiceChangesNothing) {
    std::string message = rows_message(
        1, 1,
        {chunk("all", 0, 2,
               {row(kProducts, id_key(1), product(1, "a")), gone(kProducts, id_key(3))})},
        {"*"});
    EXPECT_EQ(replica.apply(message).outcome, Outcome::kApplied);
    std::vector<std::string> once = snapshot(replica);
    // Something local changes in between: the repeat must not undo it either.
    replica.apply(rows_message(1, 2, {chunk("all", 2, 3, {gone(kProducts, id_key(1))})}));
    std::vector<std::string> after_second = snapshot(replica);
    EXPECT_NE(once, after_second);
    ApplyResult repeat = replica.apply(message);
    EXPECT_EQ(repeat.outcome, Outcome::kAlreadyApplied);
    EXPECT_TRUE(repeat.taken());
    EXPECT_EQ(snapshot(replica), after_second);
}

TEST_F(ReplicaTest, RefusesWhatCanNeverApplyAndIgnoresUnknownVersions) {
    replica.apply(rows_message(1, 1, {}, {"*"}));
    std::vector<std::string> before = snapshot(replica);

    ApplyResult garbage = replica.apply("this is not a message");
    EXPECT_EQ(garbage.outcome, Outcome::kMalformed);
    EXPECT_FALSE(garbage.taken());

    ApplyResult foreign =
        replica.apply(rows_message(1, 2, {}, {"*"}, {}, "99999999-2222-4333-8444-555555555555"));
    EXPECT_EQ(foreign.outcome, Outcome::kMalformed);
    EXPECT_NE(foreign.detail.find("addressed to replica"), std::string::npos);

    std::string future = rows_message(1, 2, {}, {"*"});
    future.replace(future.find("\"v\":1"), 5, "\"v\":3");
    ApplyResult unknown = replica.apply(future);
    EXPECT_EQ(unknown.outcome, Outcome::kUnknownVersion);
    EXPECT_FALSE(unknown.taken());
    EXPECT_EQ(snapshot(replica), before);
    std::vector<std::string> notices = replica.notices();
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_NE(notices[0].find("version 3"), std::string::npos);
}

TEST_F(ReplicaTest, ARowLivesInOneScopeAndMovesWithIt) {
    replica.apply(rows_message(
        1, 1, {chunk("store_id=1", 0, 1, {row("shop.prices", id_key(7), R"({"id":7,"p":1})")})},
        {"*"}));
    // The row moves: it arrives in the new scope before the old scope's tombstone.
    replica.apply(rows_message(
        1, 2, {chunk("store_id=2", 0, 1, {row("shop.prices", id_key(7), R"({"id":7,"p":2})")})}));
    replica.apply(
        rows_message(1, 3, {chunk("store_id=1", 1, 2, {gone("shop.prices", id_key(7))})}));

    std::vector<HeldRow> rows = replica.held_rows();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].scope, "store_id=2");
    for (const ScopeHolding& holding : replica.holdings()) {
        EXPECT_EQ(holding.fingerprint, replica.recompute(holding.scope)) << holding.scope;
        EXPECT_EQ(holding.fingerprint.count, holding.scope == "store_id=2" ? 1 : 0);
    }
}

// An independent model of what the replica should hold, with fingerprints computed from scratch.
struct Model {
    std::map<std::string, std::map<std::pair<std::string, std::string>, protocol::Digest>> scopes;

    void put(const std::string& scope, const protocol::DownRow& row) {
        for (auto& entry : scopes) entry.second.erase({row.table, row.key});
        scopes[scope][{row.table, row.key}] = row.body->hash;
    }
    void remove(const std::string& scope, const protocol::DownRow& row) {
        scopes[scope].erase({row.table, row.key});
    }
    Fingerprint fingerprint(const std::string& scope,
                            const protocol::KeyRange& range = protocol::KeyRange{}) const {
        Fingerprint fingerprint;
        auto found = scopes.find(scope);
        if (found == scopes.end()) return fingerprint;
        for (const auto& [table_key, hash] : found->second) {
            protocol::Digest k = protocol::key_hash(table_key.first, table_key.second);
            if (protocol::contains(range, k)) fingerprint.add(protocol::element(k, hash));
        }
        return fingerprint;
    }
};

TEST_F(ReplicaTest, IncrementalFingerprintsEqualRecomputedAfterRandomOperations) {
    std::mt19937 random(20261201);
    const std::vector<std::string> scopes = {"all", "store_id=1", "store_id=2", "id=x"};
    Model model;
    int64_t seq = 0;
    replica.apply(rows_message(1, ++seq, {}, {"*"}));
    for (int round = 0; round < 150; ++round) {
        std::vector<protocol::Chunk> chunks;
        std::vector<std::string> reset;
        if (random() % 40 == 0) {
            reset.push_back(scopes[random() % scopes.size()]);
            model.scopes.erase(reset.back());
        }
        for (int c = 0; c < 3; ++c) {
            std::string scope = scopes[random() % scopes.size()];
            std::vector<protocol::DownRow> rows;
            for (int r = 0; r < 10; ++r) {
                int id = static_cast<int>(random() % 60);
                std::string table = random() % 2 ? kProducts : kDrawers;
                if (random() % 4 == 0) {
                    rows.push_back(gone(table, id_key(id)));
                    model.remove(scope, rows.back());
                } else {
                    rows.push_back(
                        row(table, id_key(id), product(id, std::to_string(random() % 5))));
                    model.put(scope, rows.back());
                }
            }
            chunks.push_back(chunk(scope, seq, seq + 1, rows));
        }
        ASSERT_EQ(replica.apply(rows_message(1, ++seq, chunks, reset)).outcome, Outcome::kApplied);
    }
    for (const ScopeHolding& holding : replica.holdings()) {
        EXPECT_EQ(holding.fingerprint, replica.recompute(holding.scope)) << holding.scope;
        EXPECT_EQ(holding.fingerprint, model.fingerprint(holding.scope)) << holding.scope;
    }
    for (const std::string& scope : scopes) {
        for (const protocol::KeyRange& range : split_key_space(16)) {
            EXPECT_EQ(replica.range_fingerprint(scope, range), model.fingerprint(scope, range));
        }
    }
}

TEST_F(ReplicaTest, RangeFingerprintsAddUpToTheScope) {
    std::vector<protocol::DownRow> rows;
    for (int id = 0; id < 200; ++id) rows.push_back(row(kProducts, id_key(id), product(id, "x")));
    replica.apply(rows_message(1, 1, {chunk("all", 0, 1, rows)}, {"*"}));
    Fingerprint total;
    int64_t count = 0;
    for (const protocol::KeyRange& range : split_key_space(16)) {
        Fingerprint part = replica.range_fingerprint("all", range);
        protocol::add_mod(total.sum, part.sum);
        count += part.count;
        EXPECT_GT(part.count, 0);  // 200 random keys over 16 ranges leave none empty
    }
    total.count = count;
    EXPECT_EQ(total, replica.holdings().at(0).fingerprint);
    EXPECT_EQ(replica.range_fingerprint("nowhere", protocol::KeyRange{}), Fingerprint{});
}

TEST_F(ReplicaTest, RepairReplacesExactlyTheRange) {
    // Rows of one scope, on both sides of a range; one row of another scope.
    std::vector<protocol::DownRow> rows;
    for (int id = 0; id < 64; ++id) rows.push_back(row(kProducts, id_key(id), product(id, "v1")));
    replica.apply(rows_message(
        1, 1,
        {chunk("all", 0, 10, rows), chunk("store_id=1", 0, 3, {row(kDrawers, id_key(1), "{}")})},
        {"*"}));
    protocol::KeyRange range = split_key_space(4)[1];  // [0x40.., 0x80..)
    Model server;
    for (const auto& r : rows) server.put("all", r);

    std::vector<protocol::DownRow> repair_rows;
    int stale = 0;
    for (int id = 0; id < 64; ++id) {
        if (!protocol::contains(range, protocol::key_hash(kProducts, id_key(id)))) continue;
        // The server's truth in the range: some rows changed, some gone (the replica's extra).
        if (stale++ % 3 == 0) {
            server.remove("all", gone(kProducts, id_key(id)));
            continue;
        }
        repair_rows.push_back(row(kProducts, id_key(id), product(id, "v2")));
        server.put("all", repair_rows.back());
    }
    // A row the replica lacks.
    for (int id = 100;; ++id) {
        if (!protocol::contains(range, protocol::key_hash(kProducts, id_key(id)))) continue;
        repair_rows.push_back(row(kProducts, id_key(id), product(id, "new")));
        server.put("all", repair_rows.back());
        break;
    }
    ASSERT_GT(stale, 3);

    ApplyResult result = replica.apply(repair_message(1, 2, "all", range, repair_rows));
    EXPECT_EQ(result.outcome, Outcome::kApplied);
    EXPECT_EQ(result.untaken, 0u);
    EXPECT_EQ(replica.range_fingerprint("all", range), server.fingerprint("all", range));
    EXPECT_EQ(replica.recompute("all"), server.fingerprint("all"));
    for (const ScopeHolding& holding : replica.holdings()) {
        EXPECT_EQ(holding.fingerprint, replica.recompute(holding.scope));
        if (holding.scope == "all") {
            EXPECT_EQ(holding.through, 10);  // a repair moves no seq
        }
    }
    EXPECT_EQ(held_by_key(replica).count(kDrawers + id_key(1)), 1u);  // other scope untouched

    // A row outside the range is not applied: it is reported.
    protocol::DownRow outside;
    for (int id = 0;; ++id) {
        if (protocol::contains(range, protocol::key_hash(kProducts, id_key(id)))) continue;
        outside = row(kProducts, id_key(id), product(id, "sneaky"));
        break;
    }
    ApplyResult refused = replica.apply(repair_message(1, 3, "all", range, {outside}));
    EXPECT_EQ(refused.untaken, 1u);
    EXPECT_EQ(held_by_key(replica)[kProducts + outside.key],
              protocol::canonical_json(product(std::stoi(outside.key.substr(6)), "v1")));
}

TEST_F(ReplicaTest, LocalWritesStayOnTopUntilFiled) {
    replica.apply(
        rows_message(1, 1,
                     {chunk("id=r", 0, 1,
                            {row(kDrawers, id_key(1), R"({"id":1,"counted":0,"opened":"8:00"})")})},
                     {"*"}));
    replica.write(kDrawers, R"({"id":1,"counted":120})");
    // The key columns come from the rows that came down; the write shows over the server's row.
    std::vector<VisibleRow> rows = replica.rows(kDrawers);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_TRUE(rows[0].local);
    EXPECT_EQ(rows[0].json, R"({"counted":120,"id":1,"opened":"8:00"})");

    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    ASSERT_EQ(upload->upload.rows.size(), 1u);
    replica.mark_sent(upload->id);

    // The server's older version comes down again: the local write stays on top.
    replica.apply(rows_message(
        1, 2,
        {chunk("id=r", 1, 2,
               {row(kDrawers, id_key(1), R"({"id":1,"counted":0,"opened":"9:00"})")})}));
    rows = replica.rows(kDrawers);
    EXPECT_TRUE(rows[0].local);
    EXPECT_EQ(rows[0].json, R"({"counted":120,"id":1,"opened":"9:00"})");

    // Filed: the write is no longer a local write; it is the row the replica holds, over the row
    // it was written on, under the version the server gives that body, until the server's own
    // version comes down.
    replica.apply(filed_message(1, 3, upload->id));
    EXPECT_TRUE(replica.local_writes().empty());
    rows = replica.rows(kDrawers);
    EXPECT_FALSE(rows[0].local);
    EXPECT_EQ(rows[0].json, R"({"counted":120,"id":1,"opened":"9:00"})");
    std::vector<HeldRow> held = replica.held_rows();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_EQ(held[0].hash, protocol::row_hash(R"({"counted":120,"id":1,"opened":"9:00"})"));
    std::vector<ScopeHolding> holdings = replica.holdings();
    ASSERT_EQ(holdings.size(), 1u);
    EXPECT_EQ(holdings[0].fingerprint, replica.recompute("id=r"));
    replica.apply(rows_message(
        1, 4,
        {chunk("id=r", 2, 3,
               {row(kDrawers, id_key(1), R"({"id":1,"counted":120,"opened":"9:00"})")})}));
    rows = replica.rows(kDrawers);
    EXPECT_FALSE(rows[0].local);
    EXPECT_EQ(rows[0].json, R"({"counted":120,"id":1,"opened":"9:00"})");
}

TEST_F(ReplicaTest, FiledAnswerKeepsRejectedRowsWithTheirReason) {
    replica.write(kSales, R"({"id":1,"total":5})");
    replica.write(kSales, R"({"id":2,"total":7})");
    replica.write("shop.notes", R"({"code":"a","text":"x"})", {"code"});
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    EXPECT_EQ(upload->upload.rows.size(), 3u);
    EXPECT_FALSE(upload->upload.applied);  // nothing applied yet: not said
    replica.mark_sent(upload->id);

    replica.apply(filed_message(1, 1, upload->id,
                                {{kSales, id_key(2), "duplicate key"},
                                 {"shop.notes", R"({"code":"a"})", "unknown table"}}));
    EXPECT_TRUE(replica.local_writes().empty());
    std::vector<KeptWrite> kept = replica.kept();
    ASSERT_EQ(kept.size(), 2u);
    std::map<std::string, KeptWrite> by_table;
    for (const KeptWrite& write : kept) by_table[write.table] = write;
    EXPECT_EQ(by_table[kSales].key, id_key(2));
    EXPECT_EQ(by_table[kSales].why, "duplicate key");
    EXPECT_EQ(by_table[kSales].json, protocol::canonical_json(R"({"id":2,"total":7})"));
    EXPECT_EQ(by_table["shop.notes"].why, "unknown table");
    // The filed ones are not on top any more, the kept ones are listed, not shown as rows.
    EXPECT_TRUE(replica.rows(kSales).empty());

    // The same answer again (the server answered a resend) changes nothing.
    replica.apply(filed_message(1, 2, upload->id,
                                {{kSales, id_key(2), "duplicate key"},
                                 {"shop.notes", R"({"code":"a"})", "unknown table"}}));
    EXPECT_EQ(replica.kept().size(), 2u);
}

// The server files a kept row later (its retry) and answers the upload again under its own id,
// naming what is still kept of it: a row it no longer names was filed, and is not kept any more.
TEST_F(ReplicaTest, ALaterAnswerToAnUploadSaysWhichOfItsKeptRowsWereFiled) {
    for (int id = 1; id <= 4; ++id)
        replica.write(kSales, R"({"id":)" + std::to_string(id) + R"(,"total":5})");
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    replica.mark_sent(upload->id);
    replica.apply(filed_message(1, 1, upload->id,
                                {{kSales, id_key(2), "no such sale"},
                                 {kSales, id_key(3), "no such sale"},
                                 {kSales, id_key(4), "negative total"}}));
    ASSERT_EQ(replica.kept().size(), 3u);
    auto kept_now = [&] {
        std::vector<std::string> kept;
        for (const KeptWrite& write : replica.kept()) kept.push_back(write.key + " " + write.why);
        return kept;
    };

    // Row 2 was filed on a retry; row 3 is kept for another reason now.
    ApplyResult result = replica.apply(filed_message(
        1, 2, upload->id,
        {{kSales, id_key(3), "still no such sale"}, {kSales, id_key(4), "negative total"}}));
    EXPECT_EQ(result.outcome, Outcome::kApplied);
    EXPECT_EQ(kept_now(), (std::vector<std::string>{id_key(3) + " still no such sale",
                                                    id_key(4) + " negative total"}));
    // A notice says so (after its time).
    const std::string notice = replica.notices().back();
    const std::string said = "filed by the server after it was kept: " + kSales + " " + id_key(2);
    EXPECT_EQ(notice.substr(notice.size() - std::min(notice.size(), said.size())), said);
    // It is applied like any message: the next upload says so.
    std::optional<PreparedUpload> acknowledgement = replica.prepare_upload();
    ASSERT_TRUE(acknowledgement);
    EXPECT_EQ(acknowledgement->upload.applied, 2);

    // An answer in parts: what no part names is filed once the last part has come.
    replica.apply(filed_message(1, 3, upload->id, {{kSales, id_key(4), "negative total"}}, true));
    EXPECT_EQ(replica.kept().size(), 2u);
    replica.apply(filed_message(1, 4, upload->id));
    EXPECT_EQ(kept_now(), (std::vector<std::string>{id_key(4) + " negative total"}));

    // Everything filed.
    replica.apply(filed_message(1, 5, upload->id));
    EXPECT_TRUE(replica.kept().empty());
}

// After the server's history changed (a point-in-time recovery), its answer to an upload is the
// one it gave last in that history: rows the lost history filed are kept again, and listed again,
// under the reason the answer gives (their bodies were the writes, filed and gone from here).
TEST_F(ReplicaTest, AnAnswerAgainListsRowsKeptAgainAfterTheHistoryChanged) {
    for (int id = 1; id <= 2; ++id)
        replica.write(kSales, R"({"id":)" + std::to_string(id) + R"(,"total":5})");
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    replica.mark_sent(upload->id);
    const std::string lost = "7391841912345678901/1/0b0e3f7e-5bb4-4d3f-9d6e-2f3c4b5a6978";
    const std::string recovered = "7391841912345678901/2/5c1d2e3f-0000-4000-8000-000000000001";
    replica.apply(protocol::with_origin(
        filed_message(1, 1, upload->id, {{kSales, id_key(2), "no such sale"}}), lost));
    // The lost history filed row 2 on a retry.
    replica.apply(protocol::with_origin(filed_message(1, 2, upload->id), lost));
    ASSERT_TRUE(replica.kept().empty());

    ApplyResult again = replica.apply(protocol::with_origin(
        filed_message(1, 1, upload->id, {{kSales, id_key(2), "no such sale"}}), recovered));
    EXPECT_EQ(again.outcome, Outcome::kApplied);
    std::vector<KeptWrite> kept = replica.kept();
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_EQ(kept[0].table + " " + kept[0].key + " " + kept[0].why + " " + kept[0].upload,
              kSales + " " + id_key(2) + " no such sale " + upload->id);
    EXPECT_FALSE(kept[0].json);
    const std::string notice = replica.notices().back();
    const std::string said =
        "kept again by the server: " + kSales + " " + id_key(2) + ": no such sale";
    EXPECT_EQ(notice.substr(notice.size() - std::min(notice.size(), said.size())), said);
    // The same answer again changes nothing.
    replica.apply(protocol::with_origin(
        filed_message(1, 2, upload->id, {{kSales, id_key(2), "no such sale"}}), recovered));
    EXPECT_EQ(replica.kept().size(), 1u);
}

// An upload the server kept whole (it could not read it: over magic_sync.max_upload_bytes, a NUL)
// is answered with one note of no table: every write of it is kept with that reason, none taken
// as filed; a later answer that names it again keeps them, one that names nothing files them.
TEST_F(ReplicaTest, AnUploadKeptWholeKeepsEveryWriteOfIt) {
    replica.write(kSales, R"({"id":1,"total":5})");
    replica.write(kSales, R"({"id":2,"total":7})");
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    replica.mark_sent(upload->id);
    const std::string why = "the upload is over magic_sync.max_upload_bytes";
    auto kept_now = [&] {
        std::vector<std::string> kept;
        for (const KeptWrite& write : replica.kept())
            kept.push_back(write.table + " " + write.key + " " + write.why);
        return kept;
    };
    replica.apply(filed_message(1, 1, upload->id, {{"", "{}", why}}));
    EXPECT_EQ(kept_now(), (std::vector<std::string>{kSales + " " + id_key(1) + " " + why,
                                                    kSales + " " + id_key(2) + " " + why}));
    EXPECT_TRUE(replica.local_writes().empty());
    EXPECT_TRUE(replica.held_rows().empty());

    replica.apply(filed_message(1, 2, upload->id, {{"", "{}", why + ", still"}}));
    EXPECT_EQ(kept_now(),
              (std::vector<std::string>{kSales + " " + id_key(1) + " " + why + ", still",
                                        kSales + " " + id_key(2) + " " + why + ", still"}));

    replica.apply(filed_message(1, 3, upload->id));
    EXPECT_TRUE(replica.kept().empty());
}

// A key too long for the server's messages is named by its hash: the write it names is kept, the
// others filed; a later answer naming it so keeps it, one naming nothing files it.
TEST_F(ReplicaTest, AKeptKeyNamedByItsHashKeepsItsWrite) {
    const std::string long_id = std::string(2000, 'x');
    replica.write(kSales, R"({"id":")" + long_id + R"(","total":5})");
    replica.write(kSales, R"({"id":2,"total":7})");
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    replica.mark_sent(upload->id);
    const std::string key = R"({"id":")" + long_id + R"("})";
    protocol::KeyNote note{kSales, "", "index row size exceeds the maximum"};
    note.key_hash = protocol::key_hash(kSales, key);
    protocol::FiledMessage answer{
        protocol::MessageHeader{kReplicaId, 1, 1, ""}, upload->id, {note}};
    replica.apply(protocol::encode(answer));
    ASSERT_EQ(replica.kept().size(), 1u);
    EXPECT_EQ(replica.kept()[0].key, key);
    EXPECT_EQ(replica.kept()[0].why, "index row size exceeds the maximum");
    EXPECT_TRUE(replica.kept()[0].json.has_value());
    EXPECT_TRUE(replica.local_writes().empty());

    answer.header.seq = 2;
    replica.apply(protocol::encode(answer));
    EXPECT_EQ(replica.kept().size(), 1u);
    answer.header.seq = 3;
    answer.kept.clear();
    replica.apply(protocol::encode(answer));
    EXPECT_TRUE(replica.kept().empty());
}

// An answer in parts: each part settles the writes it names as kept; the upload and its other
// writes stay until the last part, which files them.
TEST_F(ReplicaTest, FiledAnswerInPartsFilesTheUploadWithItsLastPart) {
    replica.write(kSales, R"({"id":1,"total":5})");
    replica.write(kSales, R"({"id":2,"total":7})");
    replica.write(kSales, R"({"id":3,"total":9})");
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    ASSERT_TRUE(upload);
    replica.mark_sent(upload->id);

    replica.apply(filed_message(1, 1, upload->id, {{kSales, id_key(2), "duplicate key"}}, true));
    ASSERT_EQ(replica.kept().size(), 1u);
    EXPECT_EQ(replica.kept()[0].key, id_key(2));
    std::vector<std::string> waiting;
    for (const auto& write : replica.local_writes()) waiting.push_back(write.key);
    EXPECT_EQ(waiting, (std::vector<std::string>{id_key(1), id_key(3)}));

    replica.apply(filed_message(1, 2, upload->id, {{kSales, id_key(3), "negative total"}}));
    EXPECT_TRUE(replica.local_writes().empty());
    std::vector<std::string> kept;
    for (const KeptWrite& write : replica.kept()) kept.push_back(write.key + " " + write.why);
    std::sort(kept.begin(), kept.end());
    EXPECT_EQ(kept, (std::vector<std::string>{id_key(2) + " duplicate key",
                                              id_key(3) + " negative total"}));
    // The last part filed the upload: the same answer again (the server answered a resend)
    // changes nothing.
    replica.apply(filed_message(1, 3, upload->id, {{kSales, id_key(2), "duplicate key"}}, true));
    replica.apply(filed_message(1, 4, upload->id, {{kSales, id_key(3), "negative total"}}));
    EXPECT_EQ(replica.kept().size(), 2u);
}

TEST_F(ReplicaTest, WriteNeedsAKnownKey) {
    EXPECT_THROW(replica.write(kSales, "[1]"), std::invalid_argument);
    EXPECT_THROW(replica.write(kSales, "{not json"), std::invalid_argument);
    EXPECT_THROW(replica.write("shop.notes", R"({"code":"a"})"), std::invalid_argument);
    EXPECT_THROW(replica.write("shop.notes", R"({"code":"a"})", {"missing"}),
                 std::invalid_argument);
    // A newer write to a row not yet uploaded replaces it; one in an upload is kept apart.
    replica.write(kSales, R"({"id":1,"total":5})");
    replica.write(kSales, R"({"id":1,"total":6})");
    ASSERT_EQ(replica.local_writes().size(), 1u);
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    replica.write(kSales, R"({"id":1,"total":7})");
    std::vector<LocalWrite> writes = replica.local_writes();
    ASSERT_EQ(writes.size(), 2u);
    EXPECT_EQ(writes[0].upload, upload->id);
    EXPECT_EQ(writes[0].json, R"({"id":1,"total":6})");
    EXPECT_FALSE(writes[1].upload);
    EXPECT_EQ(replica.rows(kSales).at(0).json, R"({"id":1,"total":7})");
}

TEST_F(ReplicaTest, UploadsSayEachHoldingOnceAndResendUnderTheSameId) {
    EXPECT_FALSE(replica.prepare_upload());  // nothing to say

    replica.apply(rows_message(
        1, 1, {chunk("all", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})}, {"*"}));
    replica.write(kSales, R"({"id":1,"total":5})");
    std::optional<PreparedUpload> first = replica.prepare_upload();
    ASSERT_TRUE(first);
    EXPECT_EQ(first->upload.applied, 1);
    ASSERT_EQ(first->upload.holds.count("all"), 1u);
    EXPECT_EQ(first->upload.holds["all"].through, 4);
    EXPECT_EQ(first->upload.holds["all"].fingerprint, replica.recompute("all"));
    EXPECT_EQ(protocol::decode_upload(first->body), first->upload);

    // Not confirmed sent: the same id and rows again, brought up to date.
    replica.write(kSales, R"({"id":2,"total":6})");
    replica.apply(
        rows_message(1, 2, {chunk("all", 4, 6, {row(kProducts, id_key(2), product(2, "b"))})}));
    std::optional<PreparedUpload> resend = replica.prepare_upload();
    ASSERT_TRUE(resend);
    EXPECT_EQ(resend->id, first->id);
    EXPECT_EQ(resend->upload.rows, first->upload.rows);
    EXPECT_EQ(resend->upload.applied, 2);
    EXPECT_EQ(resend->upload.holds["all"].through, 6);
    replica.mark_sent(resend->id);

    // Next: a new id, the new write, no holds (unchanged since said), the applied seq unchanged
    // is still there since there is a row to send.
    std::optional<PreparedUpload> next = replica.prepare_upload();
    ASSERT_TRUE(next);
    EXPECT_NE(next->id, first->id);
    ASSERT_EQ(next->upload.rows.size(), 1u);
    EXPECT_EQ(next->upload.rows[0].row, R"({"id":2,"total":6})");
    EXPECT_TRUE(next->upload.holds.empty());
    replica.mark_sent(next->id);
    EXPECT_FALSE(replica.prepare_upload());  // the same advertisement is never sent twice

    // A change: said once more.
    replica.apply(rows_message(1, 3, {chunk("all", 6, 7, {gone(kProducts, id_key(2))})}));
    std::optional<PreparedUpload> changed = replica.prepare_upload();
    ASSERT_TRUE(changed);
    EXPECT_EQ(changed->upload.applied, 3);
    EXPECT_EQ(changed->upload.holds["all"].through, 7);
    EXPECT_EQ(changed->upload.holds["all"].fingerprint.count, 1);
    replica.mark_sent(changed->id);
    EXPECT_FALSE(replica.prepare_upload());
}

TEST_F(ReplicaTest, AnswersToAcknowledgementsAreNotAcknowledged) {
    replica.apply(rows_message(1, 1, {}, {"*"}));
    std::optional<PreparedUpload> acknowledgement = replica.prepare_upload();
    ASSERT_TRUE(acknowledgement);
    EXPECT_TRUE(acknowledgement->upload.rows.empty());
    replica.mark_sent(acknowledgement->id);
    // The server answers the rowless upload: saying so would be answered again, forever.
    replica.apply(filed_message(1, 2, acknowledgement->id));
    EXPECT_FALSE(replica.prepare_upload());

    // The answer to an upload with rows is acknowledged (it carries the seq along).
    replica.write(kSales, R"({"id":1,"total":5})");
    std::optional<PreparedUpload> with_rows = replica.prepare_upload();
    replica.mark_sent(with_rows->id);
    replica.apply(filed_message(1, 3, with_rows->id));
    std::optional<PreparedUpload> after = replica.prepare_upload();
    ASSERT_TRUE(after);
    EXPECT_EQ(after->upload.applied, 3);
    replica.mark_sent(after->id);
    replica.apply(filed_message(1, 4, after->id));
    EXPECT_FALSE(replica.prepare_upload());
}

TEST_F(ReplicaTest, WhatIsTakenAsSaidIsWhatWasSent) {
    replica.apply(rows_message(
        1, 1, {chunk("all", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})}, {"*"}));
    replica.write(kSales, R"({"id":1,"total":5})");
    std::optional<PreparedUpload> sent = replica.prepare_upload();
    ASSERT_TRUE(sent);
    EXPECT_EQ(sent->upload.holds["all"].through, 4);
    // While it is on its way, the upload is taken again (by the app, or another process on the
    // file), brought up to date under the same id.
    replica.apply(
        rows_message(1, 2, {chunk("all", 4, 6, {row(kProducts, id_key(2), product(2, "b"))})}));
    std::optional<PreparedUpload> again = replica.prepare_upload();
    ASSERT_TRUE(again);
    EXPECT_EQ(again->id, sent->id);
    EXPECT_EQ(again->upload.holds["all"].through, 6);
    // The first send is the one that went through: the server heard of "all" through 4 only,
    // so the next upload says through 6.
    replica.mark_sent(sent->id, sent->body);
    std::optional<PreparedUpload> next = replica.prepare_upload();
    ASSERT_TRUE(next);
    EXPECT_NE(next->id, sent->id);
    ASSERT_EQ(next->upload.holds.count("all"), 1u);
    EXPECT_EQ(next->upload.holds["all"].through, 6);
}

// A scope the server drops and gives back (the replica left a group and joined it again) is
// reported again, even when it comes back as it was: the server forgot the report with the
// membership, and may never have taken it (it takes reports of its members' scopes only).
TEST_F(ReplicaTest, AScopeDroppedAndGivenBackIsReportedAgain) {
    replica.apply(rows_message(
        1, 1, {chunk("crew=2", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})}, {"*"}));
    std::optional<PreparedUpload> first = replica.prepare_upload();
    ASSERT_TRUE(first);
    ASSERT_EQ(first->upload.holds.count("crew=2"), 1u);
    replica.mark_sent(first->id, first->body);
    replica.apply(filed_message(1, 2, first->id));
    replica.apply(rows_message(1, 3, {}, {}, {"crew=2"}));
    replica.apply(
        rows_message(1, 4, {chunk("crew=2", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})}));
    std::optional<PreparedUpload> next = replica.prepare_upload();
    ASSERT_TRUE(next);
    ASSERT_EQ(next->upload.holds.count("crew=2"), 1u);
    EXPECT_EQ(next->upload.holds["crew=2"].through, 4);
    EXPECT_EQ(next->upload.holds["crew=2"].fingerprint, first->upload.holds["crew=2"].fingerprint);
    replica.mark_sent(next->id, next->body);
    replica.apply(filed_message(1, 5, next->id));
    // Dropped and given back in one message (the server planned both before it wrote it).
    replica.apply(
        rows_message(1, 6, {chunk("crew=2", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})},
                     {}, {"crew=2"}));
    std::optional<PreparedUpload> again = replica.prepare_upload();
    ASSERT_TRUE(again);
    ASSERT_EQ(again->upload.holds.count("crew=2"), 1u);
    EXPECT_EQ(again->upload.holds["crew=2"].through, 4);
}

// The drop comes while the upload that reports the scope is on its way: the server dropped the
// scope before that upload reached it, so did not take the report; taking the upload as sent must
// not bring back what the drop made the replica forget (simulation seed 7: a replica that moved
// crew 2 -> 1 -> 2 never reported crew 2 again, and sync.status stayed 'unknown').
TEST_F(ReplicaTest, AReportOnItsWayWhenItsScopeIsDroppedIsMadeAgain) {
    replica.apply(rows_message(
        1, 1, {chunk("crew=2", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})}, {"*"}));
    std::optional<PreparedUpload> first = replica.prepare_upload();
    ASSERT_TRUE(first);
    ASSERT_EQ(first->upload.holds.count("crew=2"), 1u);
    replica.apply(rows_message(1, 2, {}, {}, {"crew=2"}));
    replica.mark_sent(first->id, first->body);
    replica.apply(
        rows_message(1, 3, {chunk("crew=2", 0, 4, {row(kProducts, id_key(1), product(1, "a"))})}));
    std::optional<PreparedUpload> next = replica.prepare_upload();
    ASSERT_TRUE(next);
    ASSERT_EQ(next->upload.holds.count("crew=2"), 1u);
    EXPECT_EQ(next->upload.holds["crew=2"].through, 4);
}

TEST_F(ReplicaTest, AnAnswerToAnUploadAnsweredBeforeIsAcknowledged) {
    replica.apply(rows_message(1, 1, {}, {"*"}));
    replica.write(kSales, R"({"id":1,"total":5})");
    std::optional<PreparedUpload> with_rows = replica.prepare_upload();
    replica.mark_sent(with_rows->id);
    replica.apply(filed_message(1, 2, with_rows->id));
    std::optional<PreparedUpload> first = replica.prepare_upload();
    ASSERT_TRUE(first);
    replica.mark_sent(first->id);
    // The upload was sent again (its confirmation was lost) and answered again: the server
    // holds that answer unconfirmed until the replica says it applied it.
    replica.apply(filed_message(1, 3, with_rows->id));
    std::optional<PreparedUpload> again = replica.prepare_upload();
    ASSERT_TRUE(again);
    EXPECT_TRUE(again->upload.rows.empty());
    EXPECT_EQ(again->upload.applied, 3);
}

TEST_F(ReplicaTest, UntakenRowsAreReportedUntilAnUploadCarriesThem) {
    TempDir other;
    Options options;
    options.refuse_tables = {kDrawers};
    Replica refusing(other.file("r.db"), kReplicaId, options);
    ApplyResult result = refusing.apply(rows_message(
        1, 1,
        {chunk("all", 0, 2,
               {row(kProducts, id_key(1), product(1, "a")), row(kDrawers, id_key(1), "{}")})},
        {"*"}));
    EXPECT_EQ(result.outcome, Outcome::kApplied);
    EXPECT_EQ(result.untaken, 1u);
    EXPECT_EQ(refusing.held_rows().size(), 1u);

    std::optional<PreparedUpload> upload = refusing.prepare_upload();
    ASSERT_TRUE(upload);
    ASSERT_EQ(upload->upload.untaken.size(), 1u);
    EXPECT_EQ(upload->upload.untaken[0].seq, 1);
    EXPECT_EQ(upload->upload.untaken[0].table, kDrawers);
    EXPECT_EQ(upload->upload.untaken[0].key, id_key(1));
    refusing.mark_sent(upload->id);
    EXPECT_FALSE(refusing.prepare_upload());
}

TEST_F(ReplicaTest, RangesAreAnsweredInTheNextUpload) {
    std::vector<protocol::DownRow> rows;
    for (int id = 0; id < 50; ++id) rows.push_back(row(kProducts, id_key(id), product(id, "x")));
    replica.apply(rows_message(1, 1, {chunk("all", 0, 8, rows)}, {"*"}));
    replica.mark_sent(replica.prepare_upload()->id);

    std::vector<protocol::KeyRange> asked = split_key_space(16);
    replica.apply(ranges_message(1, 2, "all", asked));
    replica.apply(ranges_message(1, 3, "elsewhere", {protocol::KeyRange{}}));
    std::optional<PreparedUpload> answer = replica.prepare_upload();
    ASSERT_TRUE(answer);
    const protocol::Holding& all = answer->upload.holds.at("all");
    EXPECT_EQ(all.through, 8);
    EXPECT_EQ(all.fingerprint, replica.recompute("all"));
    ASSERT_EQ(all.ranges.size(), 16u);
    for (size_t i = 0; i < asked.size(); ++i) {
        EXPECT_EQ(all.ranges[i].range, asked[i]);
        EXPECT_EQ(all.ranges[i].fingerprint, replica.range_fingerprint("all", asked[i]));
    }
    // A scope it does not hold is answered as empty.
    const protocol::Holding& elsewhere = answer->upload.holds.at("elsewhere");
    EXPECT_EQ(elsewhere.through, 0);
    ASSERT_EQ(elsewhere.ranges.size(), 1u);
    EXPECT_EQ(elsewhere.ranges[0].fingerprint, Fingerprint{});
    EXPECT_EQ(protocol::decode_upload(answer->body), answer->upload);

    // Answered once: nothing more to say until something changes.
    EXPECT_EQ(answer->upload.applied, 3);
    replica.mark_sent(answer->id);
    EXPECT_FALSE(replica.prepare_upload());
}

TEST_F(ReplicaTest, ANewGenerationResendsUnansweredUploads) {
    replica.apply(rows_message(1, 1, {}, {"*"}));
    replica.write(kSales, R"({"id":1,"total":5})");
    std::optional<PreparedUpload> upload = replica.prepare_upload();
    replica.mark_sent(upload->id);
    EXPECT_FALSE(replica.prepare_upload());

    // Reprovisioned before the answer came: the old outbox with the answer is gone.
    replica.apply(rows_message(2, 1, {}, {"*"}));
    std::optional<PreparedUpload> resend = replica.prepare_upload();
    ASSERT_TRUE(resend);
    EXPECT_EQ(resend->id, upload->id);
    EXPECT_EQ(resend->upload.rows, upload->upload.rows);
    // The local write survived the reset.
    EXPECT_EQ(replica.rows(kSales).size(), 1u);
}

TEST_F(ReplicaTest, TheFileBelongsToOneReplica) {
    replica.apply(rows_message(1, 1, {}, {"*"}));
    EXPECT_THROW(Replica(path, "99999999-2222-4333-8444-555555555555"), std::invalid_argument);
    Replica again(path, kReplicaId);
    EXPECT_EQ(again.generation(), 1);
}

}  // namespace
}  // namespace magic_sync::replica::test
