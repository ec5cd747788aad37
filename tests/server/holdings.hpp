// Comparing a replica with the server, row by row, for the server tests: what the tables and
// declarations say a replica must hold and what the reference replica's SQLite file holds, both as
// sorted lines "table canonical-key version-hash".
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lib/replica.hpp"
#include "protocol/hash.hpp"
#include "server/process.hpp"

namespace magic_sync::test {

// What replica $1 must hold, by the oracle: worked out from the declarations and the tables
// alone (sync.expected), never from the relay's own state. A withheld row is not held.
inline const char* const kExpectedHoldings = R"sql(
    SELECT coalesce(string_agg(line, E'\n' ORDER BY line), '') FROM (
        SELECT e.table_name || ' ' || e.key || ' ' || e.h AS line
        FROM sync.expected($1::uuid) e WHERE NOT e.withheld) held
)sql";
// kExpectedHoldings and what sync.status must say of the replica once it holds that ('lacking rows'
// when the oracle withholds some of its rows as too big): one reading of the oracle for both.
inline const char* const kExpectedHoldingsAndState = R"sql(
    SELECT coalesce(string_agg(e.table_name || ' ' || e.key || ' ' || e.h, E'\n'
                               ORDER BY e.table_name || ' ' || e.key || ' ' || e.h)
                        FILTER (WHERE NOT e.withheld), ''),
           CASE WHEN bool_or(e.withheld) THEN 'lacking rows' ELSE 'in sync' END
    FROM sync.expected($1::uuid) e
)sql";

// The replica with number n: 00000000-0000-0000-0000-00000000000n (decimal digits).
inline std::string replica_id(int n) {
    char id[40];
    snprintf(id, sizeof id, "00000000-0000-0000-0000-%012d", n);
    return id;
}

// A reference replica: its id, its SQLite file, its process when running.
struct ReplicaProcess {
    std::string id;
    std::string db;
    std::unique_ptr<Process> process;
};

// The lines `read` takes from the replica's file, opened in this process through the replica
// library as the replica program opens it, sorted and joined; or why the file cannot be read.
template <typename Read>
std::string replica_lines(const std::string& id, const std::string& db, Read read) {
    std::vector<std::string> lines;
    try {
        replica::Replica replica(db, id);
        read(replica, lines);
    } catch (const std::exception& e) {
        return std::string("(unreadable: ") + e.what() + ")";
    }
    std::sort(lines.begin(), lines.end());
    std::string joined;
    for (size_t i = 0; i < lines.size(); ++i) joined += (i ? "\n" : "") + lines[i];
    return joined;
}

// What the replica's file holds, in the form of kExpectedHoldings, without writing and parsing
// the program's JSON (at 100,000 rows that cost about a second of CPU per look, and a converge
// looks often).
inline std::string held_by(const std::string& id, const std::string& db) {
    return replica_lines(id, db, [](replica::Replica& replica, std::vector<std::string>& lines) {
        for (const replica::HeldRow& row : replica.held_rows())
            lines.push_back(row.table + " " + row.key + " " + protocol::to_hex(row.hash));
    });
}

// The replica's running fingerprints of its non-empty scopes, "scope n fp" lines, read without
// a row.
inline std::string fingerprints_held_by(const std::string& id, const std::string& db) {
    return replica_lines(id, db, [](replica::Replica& replica, std::vector<std::string>& lines) {
        for (const replica::ScopeHolding& h : replica.holdings())
            if (h.fingerprint.count > 0)
                lines.push_back(h.scope + " " + std::to_string(h.fingerprint.count) + " " +
                                h.fingerprint.hex());
    });
}

}  // namespace magic_sync::test
