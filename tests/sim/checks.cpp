#include "sim/checks.hpp"

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "protocol/canonical.hpp"
#include "protocol/fingerprint.hpp"
#include "protocol/hash.hpp"

namespace magic_sync::sim {

namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// What is not done yet: notes not planned, messages not sent or not confirmed, answers and
// confirmations not taken, cursors behind, repairs, live replicas the relay does not know as
// live, local writes not answered, uploads not filed (or not kept) yet.
const char* const kPending = R"sql(
    SELECT line FROM (
        SELECT 'notes not planned: ' || count(*) AS line FROM sync.note HAVING count(*) > 0
        UNION ALL
        SELECT 'replica ' || o.replica || ': ' || count(*) || ' messages not confirmed ('
               || string_agg(DISTINCT o.kind, ', ') || '), '
               || count(*) FILTER (WHERE o.sent_at IS NULL) || ' of them not sent'
        FROM sync.outbox o JOIN sync.replica r ON r.id = o.replica WHERE r.live GROUP BY o.replica
        UNION ALL
        SELECT 'answers not moved to the outbox: ' || count(*) FROM sync.answer HAVING count(*) > 0
        UNION ALL
        SELECT 'confirmations not applied: ' || count(*) FROM sync.confirmation HAVING count(*) > 0
        UNION ALL
        SELECT 'replica ' || m.replica || ' behind in ' || sync_internal.scope_name(s.match, s.value, s.partition)
               || ': sent through ' || m.sent || ' of ' || s.head
        FROM sync.member m JOIN sync.scope s ON s.id = m.scope JOIN sync.replica r ON r.id = m.replica
        WHERE r.live AND m.sent < s.head
        UNION ALL
        SELECT 'repairs under way: ' || count(*) FROM sync.repair HAVING count(*) > 0) p
)sql";

// Why sync.status cannot prove a replica in sync: each scope as declared, as the relay counts it,
// and as the replica last reported it.
const char* const kScopesOfReplica = R"sql(
    WITH declared AS (
        SELECT sync_internal.scope_name(d.match, d.value, d.part) AS scope
        FROM sync_internal.declared_members() d WHERE d.replica = $1::uuid),
    counted AS (
        SELECT sync_internal.scope_name(s.match, s.value, s.partition) AS scope, m.sent, s.head, s.n, s.fp
        FROM sync.member m JOIN sync.scope s ON s.id = m.scope WHERE m.replica = $1::uuid),
    members AS (
        SELECT c.*, h.through, h.n AS held_n, h.fp AS held_fp, h.applied
        FROM counted c LEFT JOIN sync.holding h ON h.replica = $1::uuid AND h.scope = c.scope)
    SELECT coalesce(d.scope, m.scope) || ': ' ||
           CASE WHEN d.scope IS NULL THEN 'a member, not declared'
                WHEN m.scope IS NULL THEN 'declared, not a member'
                ELSE 'sent ' || m.sent || ' of head ' || m.head || ', n ' || m.n || '; reported '
                     || coalesce('through ' || m.through || ', n ' || m.held_n
                                 || ' at message ' || m.applied
                                 || CASE WHEN m.held_fp = m.fp THEN ', same fp' ELSE ', other fp' END,
                                 'nothing') END
    FROM declared d FULL JOIN members m ON m.scope = d.scope ORDER BY 1
)sql";

struct Held {
    json row;
    std::string h;
    std::string scope;
};

std::string canonical(const std::string& text) { return protocol::canonical_json(text); }

std::string short_text(std::string text, size_t limit = 300) {
    if (text.size() > limit)
        text = text.substr(0, limit) + "... (" + std::to_string(text.size()) + " bytes)";
    return text;
}

struct Fp {
    std::string fp;
    int64_t n = 0;
    bool operator!=(const Fp& o) const { return fp != o.fp || n != o.n; }
};
std::string zero() { return protocol::Fingerprint{}.hex(); }
std::string describe(const Fp& f) { return f.fp.substr(0, 12) + "… n=" + std::to_string(f.n); }

class Checkpoint {
  public:
    Checkpoint(World& world, const Scenario& scenario, const Step& step)
        : world_(world), scenario_(scenario), step_(step) {}

    std::string run() {
        auto start = std::chrono::steady_clock::now();
        auto deadline = start + std::chrono::seconds(world_.options().timeout_seconds);
        std::chrono::steady_clock::time_point quiet_since{};
        std::vector<std::string> pending, differences;
        for (;;) {
            try {
                shows_.clear();
                pending = this->pending();
                if (pending.empty()) {
                    if (quiet_since == std::chrono::steady_clock::time_point{})
                        quiet_since = std::chrono::steady_clock::now();
                    differences = compare();
                    if (differences.empty()) {
                        drifted_ = drifted();
                        if (drifted_.empty()) return "";
                        differences = drifted_;
                        break;
                    }
                    // Quiet but different: a repair may still be on its way; give it a while.
                    if (std::chrono::steady_clock::now() - quiet_since > 8s) break;
                } else {
                    quiet_since = {};
                }
            } catch (const std::exception& e) {
                pending = {std::string("checking failed: ") + e.what()};
                world_.db();  // the server may be restarting
            }
            if (std::chrono::steady_clock::now() > deadline) break;
            std::this_thread::sleep_for(250ms);
        }
        std::string report;
        if (!pending.empty()) {
            try {
                shows_.clear();
                std::vector<std::string> all = this->pending(true);
                if (!all.empty()) pending = all;
            } catch (const std::exception&) {
            }
            report += "not quiet after " + std::to_string(world_.options().timeout_seconds) +
                      " s; still pending:\n";
            for (const std::string& line : pending) report += "  " + line + "\n";
            try {
                differences = compare();
            } catch (const std::exception& e) {
                differences = {std::string("comparing failed: ") + e.what()};
            }
        }
        if (!differences.empty()) report += "what differed:\n";
        for (const std::string& line : differences) report += "  " + line + "\n";
        std::set<int> uploaders;
        for (const Verify& v : step_.verify) uploaders.insert(scenario_.uploads[v.upload].replica);
        if (!uploaders.empty()) report += "uploads kept:\n";
        for (int n : uploaders) {
            try {
                for (const std::string& line : kept_by(n)) report += line + "\n";
            } catch (const std::exception& e) {
                report += std::string("  cannot read them: ") + e.what() + "\n";
            }
        }
        return report;
    }

  private:
    json& shown(int n) {
        if (!shows_.count(n)) shows_[n] = json::parse(world_.show(n));
        return shows_[n];
    }
    std::string name(int n) const { return std::to_string(n) + " (" + world_.replica_id(n) + ")"; }

    std::vector<std::string> pending(bool complete = false) {
        std::vector<std::string> lines;
        for (const auto& row : world_.db().query(kPending)) lines.push_back(*row[0]);
        std::set<std::string> live;
        for (const auto& row : world_.db().query("SELECT id FROM sync.replica WHERE live"))
            live.insert(*row[0]);
        std::set<std::string> wanted;
        for (int n : step_.live) wanted.insert(world_.replica_id(n));
        if (live != wanted) {
            std::string line = "the relay's live replicas are not the declared ones: relay";
            for (const auto& id : live) line += " " + id.substr(24);
            line += ", declared";
            for (const auto& id : wanted) line += " " + id.substr(24);
            lines.push_back(line);
        }
        for (const Verify& v : step_.verify) {
            const Upload& upload = scenario_.uploads[v.upload];
            if (v.filed && !filed(upload))
                lines.push_back("upload " + std::to_string(v.upload) + " of replica " +
                                std::to_string(upload.replica) + " not filed in " + upload.table +
                                ": " + upload.contains);
            if (!v.filed && !kept(upload))
                lines.push_back("upload " + std::to_string(v.upload) + " of replica " +
                                std::to_string(upload.replica) +
                                " not kept with a reason: " + upload.table + " " + upload.key);
        }
        // The replicas' own files last, each read by a process: not while the server has work
        // left (the wait goes on anyway), unless every reason is wanted (for a report).
        if (!lines.empty() && !complete) return lines;
        for (int n : step_.live) {
            size_t writes = shown(n)["local_writes"].size();
            if (writes)
                lines.push_back("replica " + name(n) + ": " + std::to_string(writes) +
                                " local writes not answered");
        }
        return lines;
    }

    // What the server and the replica keep of a replica's uploads, for a failure's report.
    std::vector<std::string> kept_by(int n) {
        std::vector<std::string> lines;
        for (const auto& row : world_.db().query(
                 "SELECT coalesce(key::text, 'NULL'), reason, left(convert_from(body, 'UTF8'), 300)"
                 " FROM sync.set_aside WHERE kind = 'upload' AND replica = $1::uuid ORDER BY id",
                 {world_.replica_id(n)}))
            lines.push_back("  server keeps of replica " + std::to_string(n) + ": key " + *row[0] +
                            ", reason " + row[1].value_or("NULL") + ", body " +
                            row[2].value_or("NULL"));
        for (const json& k : shown(n)["kept"])
            lines.push_back("  replica " + std::to_string(n) + " lists as kept: " + k.dump());
        return lines;
    }

    // `t.*`, not `t`: a column may be named t (hostile_column), and `to_jsonb(t)` is then that
    // column.
    bool filed(const Upload& upload) {
        return world_.db().value(
                   "SELECT count(*) FROM " + upload.table + " t WHERE to_jsonb(t.*) @> $1::jsonb",
                   {upload.contains}) == "1";
    }
    // A row of a table that does not sync is kept without its key (the server cannot know its
    // key columns): found by its row then.
    bool kept(const Upload& upload) {
        return world_.db().value(
                   "SELECT count(*) FROM sync.set_aside WHERE kind = 'upload' AND replica = "
                   "$1::uuid AND reason <> ''"
                   " AND (key = $2::jsonb OR (coalesce(key, '{}') = '{}' AND position($3 IN "
                   "convert_from(body, "
                   "'UTF8')) > 0))",
                   {world_.replica_id(upload.replica), upload.key, key_needle(upload)}) != "0";
    }
    static std::string key_needle(const Upload& upload) {
        json key = json::parse(upload.key);
        return key.begin()->is_string() ? key.begin()->get<std::string>() : key.begin()->dump();
    }

    // The relay's own state against the tables (sync.audit), once all is quiet: a finding is a
    // bug even though the audit plans it again (so the replicas would converge after it), as is a
    // drift the worker's own audit (magic_sync.audit_every) logged at any time.
    std::vector<std::string> drifted() {
        std::vector<std::string> lines;
        for (const auto& row :
             world_.db().query("SELECT coalesce(scope, '-'), coalesce(replica::text, '-'), problem"
                               " FROM sync.audit()"))
            lines.push_back("sync.audit(): scope " + *row[0] + ", replica " + *row[1] + ": " +
                            *row[2]);
        const std::string log = world_.cluster().log();
        const std::string mark = "the relay's state had drifted from the tables";
        for (size_t at = log.find(mark); at != std::string::npos; at = log.find(mark, at + 1))
            lines.push_back("the relay's audit logged: " + log.substr(at, log.find('\n', at) - at));
        return lines;
    }

    std::vector<std::string> compare() {
        std::vector<std::string> lines;
        for (int n : step_.live) compare_replica(n, lines);
        // This check's own session without JIT (the system under test keeps its settings): its
        // cost estimate asks for JIT, and compiling took ~220 ms a look against ~25 ms without.
        world_.db().query("BEGIN");
        world_.db().query("SET LOCAL jit = off");
        std::vector<std::vector<std::optional<std::string>>> says;
        try {
            says = world_.db().query(
                "SELECT s.replica, s.state FROM sync.status s WHERE s.live AND s.state <> CASE"
                " WHEN (SELECT bool_or(e.withheld) FROM sync.expected(s.replica) e)"
                " THEN 'lacking rows' ELSE 'in sync' END");
        } catch (const std::exception&) {
            world_.db().query("ROLLBACK");
            throw;
        }
        world_.db().query("COMMIT");
        for (const auto& row : says) {
            lines.push_back("sync.status says " + row[1].value_or("NULL") + " for live replica " +
                            *row[0]);
            for (const auto& scope : world_.db().query(kScopesOfReplica, {*row[0]}))
                lines.push_back("    " + *scope[0]);
        }
        for (const auto& [replica, bytes] : world_.router().largest())
            if (bytes > static_cast<size_t>(world_.options().bytes_per_message))
                lines.push_back("a message of " + std::to_string(bytes) +
                                " bytes went to replica " + replica + " (bytes_per_message " +
                                std::to_string(world_.options().bytes_per_message) + ")");
        for (const Verify& v : step_.verify) {
            const Upload& upload = scenario_.uploads[v.upload];
            if (v.filed || upload.crafted) continue;
            bool listed = false;
            json key = json::parse(upload.key);
            for (const json& k : shown(upload.replica)["kept"]) {
                bool by_row = k["k"] == json::object() && k["r"].is_object();
                for (auto& [column, value] : key.items())
                    by_row = by_row && k["r"].value(column, json()) == value;
                listed = listed || (k["t"] == upload.table && (k["k"] == key || by_row));
            }
            if (!listed)
                lines.push_back("upload " + std::to_string(v.upload) + " (" + upload.table + " " +
                                upload.key + ") is not in replica " +
                                std::to_string(upload.replica) + "'s kept list");
        }
        return lines;
    }

    void compare_replica(int n, std::vector<std::string>& lines) {
        std::string id = world_.replica_id(n);
        std::map<std::pair<std::string, std::string>, Held> expected, held;
        std::map<std::string, protocol::Fingerprint> oracle_fp;
        std::set<std::pair<std::string, std::string>> withheld;
        for (const auto& row : world_.db().query(
                 "SELECT table_name, key, \"row\", h, scope, withheld FROM sync.expected($1::uuid)",
                 {id})) {
            std::string table = *row[0], key = canonical(*row[1]);
            if (*row[5] == "t") {
                withheld.insert({table, key});
                continue;
            }
            expected[{table, key}] = {json::parse(*row[2]), *row[3], *row[4]};
            oracle_fp[*row[4]].add(protocol::element(protocol::key_hash(table, key),
                                                     protocol::digest_from_hex(*row[3])));
        }
        json& show = shown(n);
        for (auto& [table, rows] : show["held"].items())
            for (const json& row : rows)
                held[{table, canonical(row["k"].dump())}] = {row["r"], row["h"].get<std::string>(),
                                                             row["scope"].get<std::string>()};

        std::vector<std::string> diffs;
        for (const auto& [key, want] : expected) {
            auto got = held.find(key);
            if (got == held.end()) {
                diffs.push_back("missing    " + key.first + " " + key.second + " scope " +
                                want.scope + " row " + short_text(want.row.dump()));
                continue;
            }
            if (got->second.row != want.row)
                diffs.push_back("different  " + key.first + " " + key.second + "\n      expected " +
                                short_text(want.row.dump()) + "\n      held     " +
                                short_text(got->second.row.dump()));
            else if (got->second.h != want.h)
                diffs.push_back("different  " + key.first + " " + key.second + ": h expected " +
                                want.h + ", held " + got->second.h);
            if (got->second.scope != want.scope)
                diffs.push_back("different  " + key.first + " " + key.second + ": scope expected " +
                                want.scope + ", held in " + got->second.scope);
        }
        for (const auto& [key, got] : held) {
            if (expected.count(key)) continue;
            diffs.push_back(
                std::string(withheld.count(key) ? "withheld but held " : "unexpected ") +
                key.first + " " + key.second + " scope " + got.scope + " row " +
                short_text(got.row.dump()));
        }
        if (!diffs.empty()) {
            lines.push_back("replica " + name(n) + ": " + std::to_string(diffs.size()) +
                            " rows differ from sync.expected");
            for (size_t i = 0; i < diffs.size() && i < 25; ++i) lines.push_back("  " + diffs[i]);
            if (diffs.size() > 25)
                lines.push_back("  ... and " + std::to_string(diffs.size() - 25) + " more");
        }

        // Fingerprints, scope by scope: the oracle's, the replica's, the server's.
        std::map<std::string, Fp> oracle, replica, server;
        for (const auto& [scope, fp] : oracle_fp) oracle[scope] = {fp.hex(), fp.count};
        for (auto& [scope, holding] : show["holds"].items())
            replica[scope] = {holding["fp"].get<std::string>(), holding["n"].get<int64_t>()};
        for (const auto& row :
             world_.db().query("SELECT sync_internal.scope_name(s.match, s.value, s.partition), "
                               "encode(s.fp, 'hex'), s.n FROM sync.member m"
                               " JOIN sync.scope s ON s.id = m.scope WHERE m.replica = $1::uuid",
                               {id}))
            server[*row[0]] = {*row[1], std::stoll(*row[2])};
        std::set<std::string> scopes;
        for (auto* side : {&oracle, &replica, &server})
            for (const auto& [scope, fp] : *side) scopes.insert(scope);
        for (const std::string& scope : scopes) {
            Fp none{zero(), 0};
            Fp o = oracle.count(scope) ? oracle[scope] : none;
            Fp r = replica.count(scope) ? replica[scope] : none;
            Fp s = server.count(scope) ? server[scope] : none;
            if (o != r || o != s)
                lines.push_back("replica " + name(n) + " scope " + scope +
                                ": fingerprint of sync.expected " + describe(o) +
                                ", the replica's " + describe(r) + ", the server's " + describe(s));
        }
    }

    World& world_;
    const Scenario& scenario_;
    const Step& step_;
    std::map<int, json> shows_;
    std::vector<std::string> drifted_;
};

}  // namespace

std::string checkpoint(World& world, const Scenario& scenario, const Step& step) {
    return Checkpoint(world, scenario, step).run();
}

}  // namespace magic_sync::sim
