// Drift behind a reference replica's back, for the repair tests and bench/repair: its SQLite file
// edited with the sqlite3 CLI (while its process, if any, is stopped), then its running
// fingerprints set to what its rows now hash to, as a replica that drifted honestly reports, so
// that it advertises the drift.
#pragma once

#include <fstream>
#include <regex>
#include <string>

#include "support/cluster.hpp"

namespace magic_sync::test {

// Differences of each kind in one table of scope `all`.
struct Drift {
    int deleted = 0;  // rows the replica no longer holds
    int altered = 0;  // rows whose body and version changed
    int added = 0;    // foreign rows the server never sent
};

// `total` differences split as evenly as can be over the three kinds, deletions first.
inline Drift drift_of(int total) {
    Drift drift;
    drift.deleted = (total + 2) / 3;
    drift.altered = (total + 1) / 3;
    drift.added = total / 3;
    return drift;
}

// SQLite statements that make `drift` in `table`: the rows deleted and altered are picked by
// bytes of k far from its prefix, so they spread evenly over the key ranges the server asks for
// (and the altered ones are never deleted ones); the foreign rows have keys from `first_id` on
// and random k, and carry `columns` (a JSON object text) besides their id.
inline std::string drift_statements(const std::string& table, const Drift& drift, int first_id,
                                    const std::string& columns) {
    auto pick = [&](const char* order, int count) {
        return "SELECT rowid FROM rows WHERE tbl = '" + table + "' ORDER BY " + order + " LIMIT " +
               std::to_string(count);
    };
    std::string statements;
    if (drift.deleted > 0)
        statements +=
            "DELETE FROM rows WHERE rowid IN (" + pick("substr(k, 9)", drift.deleted) + ");\n";
    if (drift.altered > 0)
        statements +=
            "UPDATE rows SET body = json_set(body, '$.name', 'tampered'), v = randomblob(32)"
            " WHERE rowid IN (" +
            pick("substr(k, 17)", drift.altered) + ");\n";
    if (drift.added > 0)
        statements += "WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < " +
                      std::to_string(drift.added - 1) +
                      ") INSERT INTO rows (tbl, key, scope, k, v, body) SELECT '" + table +
                      "', json_object('id', " + std::to_string(first_id) +
                      " + n), 'all', randomblob(32), randomblob(32), json_patch(json('" + columns +
                      "'), json_object('id', " + std::to_string(first_id) + " + n)) FROM i;\n";
    return statements;
}

// Runs `statements` on the replica's file `db` (`cli`: the replica program with its --id and
// --db) and sets its running fingerprints to what its rows hash to now. `scratch` is a file it
// may write. Returns what went wrong, or "" when the drift is in place.
inline std::string inject_drift(const std::string& cli, const std::string& db,
                                const std::string& statements, const std::string& scratch) {
    std::string output;
    std::ofstream(scratch) << statements;
    if (run("sqlite3 " + db + " < " + scratch, &output) != 0) return "sqlite3: " + output;
    run(cli + " holds --verify", &output);
    static const std::regex differs(
        R"re((\S+) through=\d+ n=\d+ fp=[0-9a-f]{64} DIFFERS from the stored rows: n=(\d+) fp=([0-9a-f]{64}))re");
    std::string fix;
    for (std::sregex_iterator it(output.begin(), output.end(), differs), end; it != end; ++it)
        fix += "UPDATE scopes SET n = " + (*it)[2].str() + ", fp = X'" + (*it)[3].str() +
               "' WHERE scope = '" + (*it)[1].str() + "';\n";
    if (fix.empty()) return "the drift changed no fingerprint: " + output;
    std::ofstream(scratch) << fix;
    if (run("sqlite3 " + db + " < " + scratch, &output) != 0) return "sqlite3: " + output;
    return "";
}

}  // namespace magic_sync::test
