// The relay pass (docs/DESIGN.md §4): notes → row state → replicas → outbox, in one transaction on
// the session that holds the relay lock. Every step is set-wise SQL over temporary tables, a
// function of src/relay/pass.sql each; C++ sequences the steps and builds the statements that
// depend on a codec or on the replicas relation: re-reading and encoding the noted rows, reading
// the replicas.
#include "relay/pass.hpp"

#include "relay/answers.hpp"
#include "state/codec.hpp"
#include "verify/repair.hpp"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "pg/bridge.hpp"
#include "pg/settings.hpp"
#include "pg/spi.hpp"
#include "pg/values.hpp"

namespace magic_sync::relay {

namespace {

using pg::Param;
using pg::Spi;
using pg::Value;
using state::Codec;

// A temporary table is never analyzed by autovacuum: after filling one with many rows, analyze
// it (sync_internal.pass_analyze_if_large). `rows`: its rows, counted by the caller; none: counted
// there.
void analyze_if_large(Spi& spi, const char* table, Value rows = std::nullopt) {
    spi.execute("SELECT sync_internal.pass_analyze_if_large($1, $2::bigint)", {table, rows});
}

struct ReplicaSet {
    bool declared = false;
    std::string relation;  // quoted, schema-qualified
    std::string live;
    std::string partition_column;  // empty: not partitioned
    std::string transport_column;  // empty: any sender delivers every replica
    bool is_view = false;
    bool scan_due = false;
};

ReplicaSet replica_set(Spi& spi) {
    ReplicaSet set;
    auto rows = spi.query("SELECT * FROM sync_internal.pass_replica_set($1::int)",
                          {settings::replica_scan_s});
    if (rows.empty()) return set;
    const auto& row = rows.front();
    set.declared = true;
    set.relation = row["relation"].value_or("");
    set.live = row["live"].value_or("true");
    set.partition_column = row["partitioned_by"].value_or("");
    set.transport_column = row["transport"].value_or("");
    set.is_view = row["is_view"].flag_or(false);
    set.scan_due = row["scan_due"].flag_or(true);
    return set;
}

// The text of `column` over `alias` ('' for NULL), or `undeclared` when no column is declared: the
// partition of a row or a replica ('': not partitioned), a replica's transport (NULL: any
// sender's).
std::string replica_column_text(const std::string& column, const std::string& alias,
                                const char* undeclared) {
    if (column.empty()) return undeclared;
    return "coalesce(" + alias + "." + pg::quote_identifier(column) + "::text, '')";
}

struct ReplicaCounts {
    int64_t provisioned = 0;
    int64_t forgotten = 0;
};

// Each noted replica as its relation has it now (pg_temp.magic_sync_replica): whether it is live,
// its partition, the value of each replicas column that `to => 'col = replica_col'` codecs
// match on (sync_internal.group_columns), and the transport that delivers it.
void read_noted_replicas(Spi& spi, const ReplicaSet& replicas) {
    std::string groups = "jsonb_build_object(";
    const std::vector<std::string> group_columns =
        spi.scalar("SELECT sync_internal.group_columns()::text[]").texts();
    for (size_t i = 0; i < group_columns.size(); ++i) {
        const std::string& name = group_columns[i];
        groups += (i ? ", " : "") + pg::quote_literal(name) + ", t." + pg::quote_identifier(name) +
                  "::text";
    }
    groups += ")";
    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_replica (id, live, part, groups, transport)
        SELECT n.id, coalesce(r.live, false), coalesce(r.part, ''), coalesce(r.groups, '{}'),
               r.transport
        FROM (SELECT DISTINCT (key->>'id')::uuid AS id FROM pg_temp.magic_sync_note
        WHERE codec = 0) n LEFT JOIN (SELECT t.id, coalesce(()sql" +
        replicas.live + "), false) AS live, " +
        replica_column_text(replicas.partition_column, "t", "''") + " AS part, " + groups +
        " AS groups, " + replica_column_text(replicas.transport_column, "t", "NULL::text") +
        " AS transport FROM " + replicas.relation + " t) r ON r.id = n.id");
}

// 3. Replicas: newly live ones provisioned, ones no longer live forgotten, ones whose matching
// column changed moved between scopes.
ReplicaCounts plan_replicas(Spi& spi, const ReplicaSet& replicas) {
    ReplicaCounts counts;
    if (!replicas.declared) return counts;
    if (replicas.is_view && replicas.scan_due)
        spi.execute("SELECT sync_internal.pass_scan_replica_view()");
    if (!spi.flag("SELECT sync_internal.pass_replicas_noted()")) return counts;
    read_noted_replicas(spi, replicas);
    counts.forgotten = spi.scalar("SELECT sync_internal.pass_forget_replicas()").integer();
    spi.execute("SELECT sync_internal.pass_want_scopes()");
    counts.provisioned = spi.scalar("SELECT sync_internal.pass_provision_replicas()").integer();
    spi.execute("SELECT sync_internal.pass_move_members()");
    return counts;
}

// The audience of a codec's rows: the scope's match and the SQL for its value over `t`.
struct Audience {
    std::string match;
    std::string value;
    std::string names_replica;  // the `to` column when it names a replica id
};

Audience audience_of(const Codec& codec) {
    if (codec.audience == "all") return {"*", "''", ""};
    const std::string column = "t." + pg::quote_identifier(codec.to_column) + "::text";
    if (codec.audience == "own") return {"id", column, codec.to_column};
    if (codec.audience == "group") return {codec.replica_column, column, ""};
    return {"*", "NULL::text", ""};
}

// The noted keys of a codec joined to its table's rows: by each key field cast to its column's
// type where every key column allows it, else through jsonb_populate_record (four times dearer).
// Each key is written again from its typed values under the pass's settings (sync.pass pins
// TimeZone and the rest), so the same row noted by sessions that wrote its key differently (a
// timestamptz in two time zones) is one key, found by one key hash. Cast, the keys are told apart
// by their typed values, which the join and the order then take as they are, and each key's jsonb
// is built once, from the distinct ones (OFFSET 0: pulled up, it was built again for its hash):
// the distinct jsonb keys, each read back field by field for the join and again for the order,
// were a sixth of the statement (59 against 49 ms over 10,000 keys, measured alone).
std::string noted_rows(const Codec& codec, const std::string& only_key, std::string& order) {
    std::vector<const state::CodecColumn*> keys;
    bool casts = true;
    for (const state::CodecColumn& column : codec.columns)
        if (column.key) {
            keys.push_back(&column);
            casts = casts && !column.key_cast.empty();
        }
    const std::string noted = " FROM pg_temp.magic_sync_note x WHERE x.codec = $1::int" + only_key;
    if (!casts) {
        const std::string populate =
            " CROSS JOIN LATERAL jsonb_populate_record(NULL::" + codec.relation + ", ";
        std::string key = "jsonb_build_object(";
        std::string join;
        for (size_t i = 0; i < keys.size(); ++i) {
            key += (i ? ", " : "") + pg::quote_literal(keys[i]->name) + ", kp." + keys[i]->quoted;
            join += (i ? " AND t." : "t.") + keys[i]->quoted + " = kp." + keys[i]->quoted;
        }
        return "(SELECT DISTINCT " + key + ") AS key FROM pg_temp.magic_sync_note x" + populate +
               "x.key) kp WHERE x.codec = $1::int" + only_key + ") n" + populate + "n.key) kp" +
               " LEFT JOIN " + codec.relation + " t ON " + join;
    }
    auto typed = [&](size_t i) {
        return "(x.key->>" + pg::quote_literal(keys[i]->name) + ")::" + keys[i]->key_cast;
    };
    std::string values;
    std::string key = "jsonb_build_object(";
    std::string join;
    for (size_t i = 0; i < keys.size(); ++i) {
        const std::string value = "k" + std::to_string(i);
        values += (i ? ", " : "") + typed(i) + " AS " + value;
        key += (i ? ", " : "") + pg::quote_literal(keys[i]->name) + ", d." + value;
        join += (i ? " AND t." : "t.") + keys[i]->quoted + " = n." + value;
    }
    // The table is read only between the least and the greatest key noted, by its first key
    // column, where that column's order is one every session agrees on (no collation) and has
    // min and max (uuid has none in PostgreSQL 15): a merge join read the primary key from its
    // start to the last key noted, so a backlog of new rows taken 10,000 a pass read every row
    // before the pass's own again (5.5 times the rows over the 10 passes of 100,000).
    static const char* const kRanged[] = {"smallint",
                                          "integer",
                                          "bigint",
                                          "numeric",
                                          "date",
                                          "timestamp without time zone",
                                          "timestamp with time zone"};
    if (std::find(std::begin(kRanged), std::end(kRanged), keys[0]->key_cast) != std::end(kRanged)) {
        join += " AND t." + keys[0]->quoted + " BETWEEN (SELECT min(" + typed(0) + ")" + noted +
                ") AND (SELECT max(" + typed(0) + ")" + noted + ")";
        // In key order, as the merge join gave them: the order the pass numbers its changes in
        // where the comparison (pass_find_changes) keeps it, as a nested loop does. A hash join
        // of many rows numbers them in its own order; only their order within a chunk differs.
        for (size_t i = 0; i < keys.size(); ++i)
            order += (i ? ", n.k" : " ORDER BY n.k") + std::to_string(i);
    }
    return "(SELECT " + key + ") AS key, d.* FROM (SELECT DISTINCT " + values + noted +
           ") d OFFSET 0) n LEFT JOIN " + codec.relation + " t ON " + join;
}

// The body is worked out in a subquery kept apart (OFFSET 0): pulled up into the select list, it
// was encoded twice, once for the body and once for its hash.
std::string encode_statement(const Codec& codec, const ReplicaSet& replicas,
                             const std::string& only_key) {
    Audience audience = audience_of(codec);
    std::string present = "t." + codec.columns.front().quoted + " IS NOT NULL";
    // The row is `t.*`, never a bare `t`, which a column named t would capture.
    std::string order;
    const std::string from = noted_rows(codec, only_key, order);
    return R"sql(
           INSERT INTO pg_temp.magic_sync_row (codec, key, k, match, value, part, body, hash)
           SELECT $1::int, n.key, sync_internal.key_hash($2, n.key), )sql" +
           pg::quote_literal(audience.match) +
           ", e.value, e.part, e.body, sync_internal.row_hash(e.body) FROM " + from +
           " CROSS JOIN LATERAL (SELECT a.value, a.part, CASE WHEN " + present +
           " AND a.value IS NOT NULL THEN sync_internal.encode_row(t.*, $3::text[]) END AS body"
           " FROM (SELECT " +
           audience.value + " AS value, " +
           replica_column_text(replicas.partition_column, "t", "''") + " AS part) a OFFSET 0) e" +
           order;
}

// 4. Re-read the noted rows of one codec, encode them and find their scope. A codec whose rows
// fail to encode as a set is planned note by note; a note that fails alone is set aside. An error
// of the moment (pg::is_transient: a cancel, a timeout, a deadlock, out of memory) ends the pass
// instead, which is rolled back and tried again: it says nothing about the rows.
int64_t encode_codec(Spi& spi, const Codec& codec, const ReplicaSet& replicas) {
    int64_t set_aside = 0;
    try {
        pg::subtransaction([&] {
            spi.execute(encode_statement(codec, replicas, ""),
                        {codec.id, codec.table_name, Param::text_array(codec.hidden())});
        });
    } catch (const pg::PgError& e) {
        if (pg::is_transient(e.sqlstate())) throw;
        auto keys = spi.query("SELECT sync_internal.pass_noted_keys($1::int)", {codec.id});
        const std::string statement = encode_statement(codec, replicas, " AND x.key = $4::jsonb");
        for (const auto& key : keys) {
            try {
                pg::subtransaction([&] {
                    spi.execute(statement, {codec.id, codec.table_name,
                                            Param::text_array(codec.hidden()), key[0]});
                });
            } catch (const pg::PgError& e) {
                if (pg::is_transient(e.sqlstate())) throw;
                spi.execute(
                    "SELECT sync_internal.keep('note', ARRAY[$1::int], ARRAY[$2::jsonb], "
                    "ARRAY[$3])",
                    {codec.id, key[0], std::string("could not plan the row: ") + e.what()});
                ++set_aside;
            }
        }
    }
    Audience audience = audience_of(codec);
    if (!audience.names_replica.empty() && replicas.declared) {
        set_aside += spi.scalar("SELECT sync_internal.pass_set_aside_unknown_replicas($1::int, $2)",
                                {codec.id, audience.names_replica})
                         .integer();
    }
    return set_aside;
}

// 5. Compare with what the relay planned before; record the differences with new seqs, leave
// tombstones where rows went or moved, and keep every scope's fingerprint.
int64_t record_changes(Spi& spi) {
    const int64_t changed = spi.scalar("SELECT sync_internal.pass_find_changes()").integer();
    if (changed == 0) return 0;
    analyze_if_large(spi, "magic_sync_change", Value::integer(changed));
    spi.execute("SELECT sync_internal.pass_record_changes()");
    return changed;
}

// 6. One round of messages: at most one new message for every replica with a cursor behind and
// room in its window (after the first round, of the replicas this pass wrote to). Chunks that
// replicas need and that are not built yet are built, up to `rounds_left` ahead (this round
// counts). Returns the number of messages written.
int64_t write_messages(Spi& spi, int rounds_left, bool first_round) {
    spi.execute("SELECT sync_internal.pass_find_needs($1::int, $2::boolean)",
                {settings::window, !first_round});
    if (spi.flag("SELECT sync_internal.pass_attach_chunks()")) {
        spi.execute("SELECT sync_internal.pass_build_chunks($1::int, $2::int, $3::int)",
                    {settings::rows_per_message, settings::bytes_per_message, rounds_left});
        spi.execute("SELECT sync_internal.pass_attach_chunks()");
    }
    spi.execute("SELECT sync_internal.pass_pick_chunks($1::int, $2::int)",
                {settings::rows_per_message, settings::bytes_per_message});
    return spi.scalar("SELECT sync_internal.pass_queue_messages($1::int)", {settings::window})
        .integer();
}

// Rows this backend's passes changed since it last analyzed sync.row, and messages written and
// replicas provisioned or forgotten since it last analyzed the replica tables; the rows sync.row
// had then.
int64_t rows_changed_since_analyze = 0;
int64_t replica_rows_since_analyze = 0;
int64_t rows_at_analyze = 0;

}  // namespace

PassCounts run_pass(Spi& spi) {
    spi.execute("SELECT sync_internal.pass_begin()");
    PassCounts counts;
    spi.execute("SELECT sync_internal.pass_note_declarations_once()");
    spi.execute("SELECT sync_internal.pass_note_rows_the_limit_changed($1::int)",
                {settings::bytes_per_message});
    spi.execute("SELECT sync_internal.pass_forget_dropped_codecs()");
    counts.notes = spi.scalar("SELECT sync_internal.pass_take_notes($1::bigint)",
                              {static_cast<int64_t>(settings::notes_per_pass)})
                       .integer();
    // Read after the notes are taken: each statement sees what committed before it began, so a
    // declaration of the replicas committed with the notes it made (sync.replicas and the first
    // replica, in one transaction or two) is seen by the statements that plan those notes. Read
    // before, it was not, and the notes were planned as if no replicas were declared: dropped.
    ReplicaSet replicas = replica_set(spi);
    spi.execute("SELECT sync_internal.pass_expand_whole_notes($1)", {replicas.declared});
    analyze_if_large(spi, "magic_sync_note");
    ReplicaCounts replica_counts = plan_replicas(spi, replicas);
    counts.provisioned = replica_counts.provisioned;
    counts.forgotten = replica_counts.forgotten;
    const auto codecs = spi.scalar("SELECT sync_internal.pass_noted_codecs()").integers();
    for (const Codec& codec : state::load_codecs(spi, codecs, {}))
        counts.set_aside += encode_codec(spi, codec, replicas);
    analyze_if_large(spi, "magic_sync_row");
    counts.rows_changed = record_changes(spi);
    spi.execute("SELECT sync_internal.pass_recount_drifted_scopes()");
    spi.execute("SELECT sync_internal.pass_apply_confirmations()");
    spi.execute("SELECT sync_internal.pass_drop_foreign_holdings()");
    counts.messages += spi.scalar("SELECT sync_internal.pass_prove_holdings()").integer();
    counts.messages += move_answers(spi);
    counts.messages += plan_repairs(spi);
    for (int round = 0; round < settings::window; ++round) {
        int64_t written = write_messages(spi, settings::window - round, round == 0);
        counts.messages += written;
        if (written == 0) break;
    }
    // The next passes read sync.row, the replicas, their cursors and their outboxes: their
    // statistics are kept up with what this backend's passes changed since they were analyzed.
    // sync.row, once it holds more than twice as many, after changes of half the rows it had
    // (the planner scales a row count by the pages a table has now; what it must not meet is a
    // table it last saw empty): a backlog planned 10,000 a pass analyzed it at every pass,
    // 100 analyzes for 1,000,000 rows where this takes 11.
    constexpr int64_t kAnalyzeAfterRows = 10000;
    rows_changed_since_analyze += counts.rows_changed;
    replica_rows_since_analyze += counts.messages + counts.provisioned + counts.forgotten;
    const bool analyze_rows =
        rows_changed_since_analyze >= std::max(kAnalyzeAfterRows, rows_at_analyze / 2);
    const bool analyze_replicas = replica_rows_since_analyze >= kAnalyzeAfterRows;
    if (analyze_rows) rows_changed_since_analyze = 0;
    if (analyze_replicas) replica_rows_since_analyze = 0;
    spi.execute("SELECT sync_internal.pass_end($1, $2, $3, $4, $5, $6, $7, $8)",
                {counts.notes, counts.rows_changed, counts.provisioned, counts.forgotten,
                 counts.messages, counts.set_aside, analyze_rows, analyze_replicas});
    if (analyze_rows)
        rows_at_analyze =
            spi.scalar("SELECT reltuples::bigint FROM pg_class WHERE oid = 'sync.row'::regclass")
                .integer();
    return counts;
}

}  // namespace magic_sync::relay

MAGIC_SYNC_FUNCTION(magic_sync_pass) {
    magic_sync::pg::Spi spi;
    magic_sync::relay::PassCounts counts = magic_sync::relay::run_pass(spi);
    spi.finish();
    return magic_sync::pg::int64_record(
        fcinfo, {counts.notes, counts.rows_changed, counts.provisioned, counts.forgotten,
                 counts.messages, counts.set_aside});
}
