// The relay pass (DESIGN §4): notes → row state → replicas → outbox, in one transaction on the
// session that holds the relay lock. Every step is set-wise SQL over temporary tables; C++ only
// sequences the steps and builds the per-codec statements from the catalog.
#include "relay/pass.hpp"

#include "relay/answers.hpp"
#include "verify/repair.hpp"

#include <initializer_list>
#include <string>
#include <vector>

#include "pg/bridge.hpp"
#include "pg/settings.hpp"
#include "pg/spi.hpp"
#include "pg/values.hpp"

namespace magic_sync::relay {

namespace {

using pg::Spi;
using pg::Value;

// The pass's working tables: created once per session, emptied at the start of every pass. Not
// ON COMMIT DELETE ROWS: truncating ten tables at every commit would cost more than a small pass.
const char* const kTempTables[] = {
    "CREATE TEMP TABLE magic_sync_note (codec int NOT NULL, key jsonb)",
    R"sql(
    CREATE TEMP TABLE magic_sync_row (codec int NOT NULL, key jsonb NOT NULL, k bytea NOT NULL,
    match text NOT NULL, value text, part text NOT NULL, body text, hash bytea))sql",
    R"sql(
    CREATE TEMP TABLE magic_sync_change (codec int NOT NULL, key jsonb NOT NULL, k bytea NOT NULL,
    old_scope bigint, old_hash bytea, old_withheld boolean, new_scope bigint, new_hash bytea,
    new_withheld boolean, body text,
    tomb_seq bigint, new_seq bigint, echo_of uuid, echo_prev bigint))sql",
    R"sql(
    CREATE TEMP TABLE magic_sync_replica (id uuid NOT NULL, live boolean NOT NULL,
    part text NOT NULL, groups jsonb NOT NULL))sql",
    R"sql(
    CREATE TEMP TABLE magic_sync_want (replica uuid NOT NULL, match text NOT NULL,
    value text NOT NULL, part text NOT NULL, scope bigint))sql",
    "CREATE TEMP TABLE magic_sync_fresh (id uuid NOT NULL)",
    R"sql(
    CREATE TEMP TABLE magic_sync_need (replica uuid NOT NULL, scope bigint NOT NULL,
    sent bigint NOT NULL, head bigint NOT NULL, scope_name text NOT NULL, room int NOT NULL,
    in_flight boolean NOT NULL, chunk bigint,
    chunk_to bigint, chunk_rows int, chunk_bytes int))sql",
    R"sql(
    CREATE TEMP TABLE magic_sync_pick (origin bigint NOT NULL, scope bigint NOT NULL, grp int,
    head bigint NOT NULL, scope_name text NOT NULL, budget int NOT NULL, seq bigint,
    codec int, key jsonb, table_name text, ktext text, body text, hash text, size int,
    fits boolean, dropped boolean, last_fetched boolean, echo boolean))sql",
    // The answers visible when the pass took its notes: the ones it moves.
    "CREATE TEMP TABLE magic_sync_answer_seen (id bigint NOT NULL)",
    // The messages of one step, for sync.enqueue(), which numbers them and empties it.
    "CREATE TEMP TABLE magic_sync_enqueue (replica uuid NOT NULL, position bigint NOT NULL,"
    " kind text NOT NULL, chunks bigint[] NOT NULL DEFAULT '{}', reset text[] NOT NULL DEFAULT "
    "'{}',"
    " drops text[] NOT NULL DEFAULT '{}', table_drops text[] NOT NULL DEFAULT '{}', advances jsonb,"
    " payload jsonb, body bytea)",
    R"sql(
    CREATE TEMP TABLE magic_sync_picked (replica uuid NOT NULL, scope bigint NOT NULL,
    chunk bigint NOT NULL, chunk_to bigint NOT NULL))sql",
};

void ensure_temp_tables(Spi& spi) {
    // The last table of the list exists only when all were made.
    if (!spi.flag("SELECT to_regclass('pg_temp.magic_sync_picked') IS NULL")) return;
    for (const char* statement : kTempTables) spi.execute(statement);
}

// Nothing vacuums a temporary table and an insert reuses no page that pruning freed, so a table
// emptied by DELETE grows by what every pass put in it: after some hundred small passes the
// chunk pick was 60 MB, read from disk in every round. A table past kTruncateBytes is truncated
// (a new file: a catalog update and an invalidation, too dear for every small pass); the others
// are emptied by DELETE.
constexpr int64_t kTruncateBytes = 1 << 20;

void clear_temp_tables(Spi& spi, std::initializer_list<const char*> tables) {
    std::string sizes;
    for (const char* table : tables)
        sizes += std::string(sizes.empty() ? "SELECT " : ", ") + "pg_relation_size('pg_temp." +
                 table + "') > " + std::to_string(kTruncateBytes);
    auto large = spi.query(sizes).front();
    size_t column = 0;
    for (const char* table : tables)
        spi.execute(std::string(large[column++].flag_or(false) ? "TRUNCATE pg_temp."
                                                               : "DELETE FROM pg_temp.") +
                    table);
}

void clear_all_temp_tables(Spi& spi) {
    clear_temp_tables(
        spi, {"magic_sync_note", "magic_sync_row", "magic_sync_change", "magic_sync_replica",
              "magic_sync_want", "magic_sync_fresh", "magic_sync_need", "magic_sync_pick",
              "magic_sync_answer_seen", "magic_sync_picked"});
}

// A temporary table is never analyzed by autovacuum: after filling one with many rows, analyze
// it, so the next statements join it by plan rather than by guess.
void analyze_if_large(Spi& spi, const char* table, int64_t rows) {
    constexpr int64_t kLarge = 1000;
    if (rows > kLarge) spi.execute(std::string("ANALYZE pg_temp.") + table);
}

// 1. Take the oldest visible notes until they hold notes_per_pass keys, their keys de-duplicated:
// the note that goes past the bound is taken in part, and what is left of it waits for the next
// pass. The answers visible then are the ones this pass moves: an upload's notes and answer commit
// together, so a pass moves an answer only with the changes it filed (an answer moved before
// them, by a pass that began before they committed, left its row to be sent back to the replica
// that filed it: the end-to-end test saw it now and then). Returns the number of keys taken.
int64_t take_notes(Spi& spi) {
    // The first note past the bound, and how many of its keys are inside it.
    const auto cut = spi.query(R"sql(
        SELECT seq, $1::bigint - (upto - key_count) AS inside
        FROM (SELECT seq, key_count, sum(key_count) OVER (ORDER BY seq) AS upto
              FROM sync.note) s
        WHERE upto > $1::bigint ORDER BY seq LIMIT 1)sql",
                               {static_cast<int64_t>(settings::notes_per_pass)});
    int64_t inside = 0;
    Value before = std::nullopt;
    if (!cut.empty()) {
        before = cut.front()[0];
        inside = cut.front()[1].integer();
    }
    // The notes before the cut, whole, and the first keys of the cut note, in one statement whose
    // UNION de-duplicates them (it spills to disk past work_mem, where an EXCEPT against what an
    // earlier statement inserted would hold every key in memory).
    const int64_t whole = spi.scalar(R"sql(
                   WITH taken AS (DELETE FROM sync.note
                    WHERE seq < coalesce($1::bigint, 9223372036854775807)
                    RETURNING codec, key, keys, key_count),
                   kept AS (INSERT INTO pg_temp.magic_sync_note (codec, key)
                    SELECT t.codec, t.key FROM taken t WHERE t.keys IS NULL
                    UNION SELECT t.codec, k.key FROM taken t
                    CROSS JOIN LATERAL sync.note_keys(t.keys) AS k(key)
                    UNION SELECT n.codec, k.key FROM sync.note n
                    CROSS JOIN LATERAL sync.note_keys(n.keys, $2::int) AS k(key)
                    WHERE n.seq = $1::bigint AND $2::int > 0),
                   seen AS (INSERT INTO pg_temp.magic_sync_answer_seen SELECT id FROM sync.answer)
                   SELECT coalesce(sum(key_count), 0)::bigint FROM taken)sql",
                                     {before, inside})
                              .integer_or(0);
    // A note of one key (or of a whole table) is never cut: its `inside` is 0.
    if (inside > 0) {
        spi.execute(R"sql(
            UPDATE sync.note SET keys = sync.note_keys_from(keys, $2::int + 1),
            key_count = key_count - $2::int WHERE seq = $1::bigint)sql",
                    {before, inside});
    }
    return whole + inside;
}

// Whether a row is withheld depends on magic_sync.bytes_per_message: when it changed, the rows
// whose flag it changed are noted, so the pass plans them again (sent, or withheld, and their
// scopes' fingerprints with them).
void note_rows_the_limit_changed(Spi& spi) {
    spi.execute(
        R"sql(
        WITH changed AS (UPDATE sync.relay_state SET bytes_per_message = $1::int
         WHERE bytes_per_message IS DISTINCT FROM $1::int RETURNING 1)
        INSERT INTO sync.note (codec, key)
        SELECT r.codec, r.key FROM sync.row r
        JOIN sync.codec c ON c.id = r.codec JOIN sync.scope s ON s.id = r.scope
        WHERE EXISTS (SELECT FROM changed) AND NOT r.gone
        AND r.withheld = sync.row_travels(sync.scope_name(s.match, s.value, s.partition),
         c.table_name, sync.canonical(r.key), r.body))sql",
        {settings::bytes_per_message});
}

// Codecs that ended (sync.dropped_codec): their rows leave the relay's state and their scopes'
// fingerprints, and every live replica that is a member of a scope that held some is told to drop
// the table (the name its rows travelled under). Each such scope gets a new head: a chunk built
// over those rows is not reused, and a holding reported before is not compared again. What was
// set aside of them goes too; their notes, if any are left, are taken and find no codec.
void forget_dropped_codecs(Spi& spi) {
    spi.execute(
        R"sql(
        WITH dropped AS (DELETE FROM sync.dropped_codec RETURNING codec, table_name),
        echoes AS (DELETE FROM sync.echo e USING dropped d WHERE e.codec = d.codec),
        gone AS (DELETE FROM sync.row r USING dropped d WHERE r.codec = d.codec
         RETURNING r.scope, r.k, r.hash, r.gone OR r.withheld AS uncounted, d.table_name),
        per_scope AS (SELECT scope,
         sync.fp_sum(sync.fp_element(k, hash)) FILTER (WHERE NOT uncounted) AS minus,
         count(*) FILTER (WHERE NOT uncounted) AS dn, array_agg(DISTINCT table_name) AS tables
         FROM gone GROUP BY scope),
        scopes AS (UPDATE sync.scope s
        SET fp = sync.fp_sub(s.fp, coalesce(p.minus, sync.fp_zero())),
         n = s.n - p.dn, head = nextval('sync.row_seq') FROM per_scope p WHERE s.id = p.scope),
        told AS (SELECT m.replica, array_agg(DISTINCT t) AS tables
         FROM sync.member m JOIN per_scope p ON p.scope = m.scope, unnest(p.tables) t
         GROUP BY m.replica),
        dropping AS (UPDATE sync.replica r SET pending_table_drops = ARRAY(SELECT DISTINCT x
         FROM unnest(r.pending_table_drops || t.tables) x ORDER BY x)
         FROM told t WHERE r.id = t.replica AND r.live)
        SELECT sync.release_codecs(array_agg(codec)) FROM dropped HAVING count(*) > 0)sql");
}

struct ReplicaSet {
    bool declared = false;
    std::string relation;  // quoted, schema-qualified
    std::string relation_name;
    std::string live;
    std::string partition_column;  // empty: not partitioned
    bool is_view = false;
    bool scan_due = false;
};

ReplicaSet replica_set(Spi& spi) {
    ReplicaSet set;
    auto rows = spi.query(
        R"sql(
        SELECT s.relation::regclass::text, s.relation_name, s.live, s.partitioned_by,
        c.relkind NOT IN ('r', 'p'),
        coalesce(st.replicas_scanned_at < now() - make_interval(secs => $1::int), true)
        FROM sync.replica_set s JOIN pg_class c ON c.oid = s.relation
        CROSS JOIN sync.relay_state st)sql",
        {settings::replica_scan_s});
    if (rows.empty()) return set;
    const auto& row = rows.front();
    set.declared = true;
    set.relation = row[0].value_or("");
    set.relation_name = row[1].value_or("");
    set.live = row[2].value_or("true");
    set.partition_column = row[3].value_or("");
    set.is_view = row[4].flag_or(false);
    set.scan_due = row[5].flag_or(true);
    return set;
}

std::string partition_expression(const std::string& column, const std::string& alias) {
    if (column.empty()) return "''";
    return "coalesce(" + alias + "." + pg::quote_identifier(column) + "::text, '')";
}

// Notes every replica the relation lists and every one the relay knows, to be looked at again.
void note_every_replica(Spi& spi, const ReplicaSet& replicas) {
    spi.execute(R"sql(
        INSERT INTO pg_temp.magic_sync_note (codec, key)
        SELECT 0, jsonb_build_object('id', t.id) FROM )sql" +
                replicas.relation +
                " t UNION SELECT 0, jsonb_build_object('id', r.id) FROM sync.replica r");
}

// 2. A note with no key means every row of its codec: what the table has now and what the relay
// last planned for it.
void expand_whole_codecs(Spi& spi, const ReplicaSet& replicas) {
    auto codecs = spi.query(
        R"sql(
        SELECT DISTINCT n.codec, c.relation::regclass::text, c.key_columns::text[]
        FROM pg_temp.magic_sync_note n LEFT JOIN sync.codec c ON c.id = n.codec
        WHERE n.key IS NULL)sql");
    for (const auto& codec : codecs) {
        const std::string id = codec[0].value_or("0");
        if (id == "0") {
            if (!replicas.declared) continue;
            note_every_replica(spi, replicas);
            continue;
        }
        if (!codec[1]) continue;
        std::string key = "jsonb_build_object(";
        std::string columns = codec[2].value_or("{}");
        // key_columns::text[] arrives as {a,b}: names were validated when declared.
        auto names = spi.query("SELECT unnest($1::text[])", {columns});
        for (size_t i = 0; i < names.size(); ++i) {
            const std::string& name = names[i][0].value();
            key += (i ? ", " : "") + pg::quote_literal(name) + ", t." + pg::quote_identifier(name);
        }
        key += ")";
        spi.execute("INSERT INTO pg_temp.magic_sync_note (codec, key) SELECT $1::int, " + key +
                        " FROM " + *codec[1] +
                        " t UNION SELECT $1::int, r.key FROM sync.row r"
                        " WHERE r.codec = $1::int AND NOT r.gone",
                    {id});
    }
    spi.execute("DELETE FROM pg_temp.magic_sync_note WHERE key IS NULL");
}

struct ReplicaCounts {
    int64_t provisioned = 0;
    int64_t forgotten = 0;
};

// 3. Replicas: newly live ones provisioned, ones no longer live forgotten, ones whose matching
// column changed moved between scopes.
ReplicaCounts plan_replicas(Spi& spi, const ReplicaSet& replicas) {
    ReplicaCounts counts;
    if (!replicas.declared) return counts;
    if (replicas.is_view && replicas.scan_due) {
        note_every_replica(spi, replicas);
        spi.execute("UPDATE sync.relay_state SET replicas_scanned_at = now()");
    }
    if (!spi.flag("SELECT EXISTS (SELECT FROM pg_temp.magic_sync_note WHERE codec = 0)"))
        return counts;

    // The replica columns that `to => 'col = replica_col'` codecs match on.
    std::string groups = "jsonb_build_object(";
    auto group_columns = spi.query(
        "SELECT DISTINCT replica_column FROM sync.codec WHERE audience = 'group' ORDER BY 1");
    for (size_t i = 0; i < group_columns.size(); ++i) {
        const std::string& name = group_columns[i][0].value();
        groups += (i ? ", " : "") + pg::quote_literal(name) + ", t." + pg::quote_identifier(name) +
                  "::text";
    }
    groups += ")";
    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_replica (id, live, part, groups)
        SELECT n.id, coalesce(r.live, false), coalesce(r.part, ''), coalesce(r.groups, '{}')
        FROM (SELECT DISTINCT (key->>'id')::uuid AS id FROM pg_temp.magic_sync_note
        WHERE codec = 0) n LEFT JOIN (SELECT t.id, coalesce(()sql" +
        replicas.live + "), false) AS live, " +
        partition_expression(replicas.partition_column, "t") + " AS part, " + groups +
        " AS groups FROM " + replicas.relation + " t) r ON r.id = n.id");

    counts.forgotten = spi.scalar(
                              R"sql(
        WITH gone AS (UPDATE sync.replica r SET live = false FROM pg_temp.magic_sync_replica p
        WHERE p.id = r.id AND NOT p.live AND r.live RETURNING r.id),
        members AS (DELETE FROM sync.member WHERE replica IN (SELECT id FROM gone)),
        messages AS (DELETE FROM sync.outbox WHERE replica IN (SELECT id FROM gone))
        SELECT count(*) FROM gone)sql")
                           .integer_or(0);

    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_want (replica, match, value, part)
        SELECT id, '*', '', part FROM pg_temp.magic_sync_replica WHERE live
        UNION ALL SELECT id, 'id', id::text, part FROM pg_temp.magic_sync_replica WHERE live
        UNION ALL SELECT p.id, g.key, g.value, p.part FROM pg_temp.magic_sync_replica p,
        jsonb_each_text(p.groups) g WHERE p.live AND g.value IS NOT NULL)sql");
    spi.execute(
        R"sql(
        INSERT INTO sync.scope (match, value, partition)
        SELECT DISTINCT match, value, part FROM pg_temp.magic_sync_want
        ON CONFLICT (match, value, partition) DO NOTHING)sql");
    spi.execute(
        R"sql(
        UPDATE pg_temp.magic_sync_want w SET scope = s.id FROM sync.scope s
        WHERE s.match = w.match AND s.value = w.value AND s.partition = w.part)sql");

    // A replica that becomes live, or moves to another partition, starts over: a new generation,
    // nothing sent, a reset first.
    counts.provisioned = spi.scalar(R"sql(
                   WITH fresh AS (INSERT INTO sync.replica AS r (id, gen, live, partition)
                   SELECT p.id, 1, true, p.part FROM pg_temp.magic_sync_replica p
                   LEFT JOIN sync.replica x ON x.id = p.id
                   WHERE p.live AND (x.id IS NULL OR NOT x.live OR x.partition <> p.part)
                   ON CONFLICT (id) DO UPDATE SET gen = r.gen + 1, live = true,
                   partition = excluded.partition, provisioned_at = now(), reset_pending = true,
                   pending_drops = '{}', pending_table_drops = '{}', backoff_until = NULL,
                   backoff = NULL, last_error = NULL,
                   refusals = 0 RETURNING r.id),
                   kept AS (INSERT INTO pg_temp.magic_sync_fresh SELECT id FROM fresh)
                   SELECT count(*) FROM fresh)sql")
                             .integer_or(0);
    if (counts.provisioned > 0) {
        spi.execute(
            R"sql(
            DELETE FROM sync.member WHERE replica IN
            (SELECT id FROM pg_temp.magic_sync_fresh))sql");
        spi.execute(
            R"sql(
            DELETE FROM sync.outbox WHERE replica IN
            (SELECT id FROM pg_temp.magic_sync_fresh))sql");
    }

    // Scopes a live replica no longer belongs to: left, and named in its next message's drop.
    spi.execute(
        R"sql(
        WITH left_scopes AS (DELETE FROM sync.member m USING pg_temp.magic_sync_replica p
        WHERE m.replica = p.id AND p.live AND NOT EXISTS (SELECT FROM pg_temp.magic_sync_want w
        WHERE w.replica = m.replica AND w.scope = m.scope) RETURNING m.replica, m.scope),
        names AS (SELECT l.replica, array_agg(sync.scope_name(s.match, s.value, s.partition)
        ORDER BY s.id) AS scopes FROM left_scopes l JOIN sync.scope s ON s.id = l.scope
        GROUP BY l.replica)
        UPDATE sync.replica r SET pending_drops = r.pending_drops || names.scopes
        FROM names WHERE r.id = names.replica)sql");
    // A chunk that left out a row its only member had uploaded must not reach a member that
    // joins: its scope's chunks over such rows are reused no more.
    spi.execute(
        R"sql(
        WITH joined AS (INSERT INTO sync.member (replica, scope) SELECT replica, scope
         FROM pg_temp.magic_sync_want ON CONFLICT (replica, scope) DO NOTHING RETURNING scope)
        UPDATE sync.chunk c SET built_head = -1
        WHERE c.scope IN (SELECT scope FROM joined) AND c.built_head >= 0
        AND EXISTS (SELECT FROM sync.row r WHERE r.scope = c.scope AND r.echo_of IS NOT NULL
         AND r.seq > c.from_seq AND r.seq <= c.to_seq))sql");
    return counts;
}

struct Codec {
    std::string id;
    std::string relation;  // quoted, schema-qualified
    std::string table_name;
    std::string audience;  // nobody, all, own or group (sync.codec)
    std::string to_column;
    std::string replica_column;
    std::vector<std::string> keys;
    // The type of each key column, when a key's jsonb field casts straight to it (a scalar whose
    // text form to_jsonb writes); empty when not.
    std::vector<std::string> key_casts;
    std::vector<std::string> hidden;  // columns that do not travel
};

std::vector<std::string> text_array(Spi& spi, const Value& array) {
    std::vector<std::string> result;
    if (!array) return result;
    for (const auto& row : spi.query("SELECT unnest($1::text[])", {*array}))
        result.push_back(row[0].value());
    return result;
}

std::vector<Codec> noted_codecs(Spi& spi) {
    std::vector<Codec> codecs;
    auto rows = spi.query(
        R"sql(
        SELECT c.id, c.relation::regclass::text, c.table_name, c.audience, c.to_column,
        c.replica_column, c.key_columns::text[],
        (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
         WHERE a.attrelid = c.relation AND a.attnum > 0 AND NOT a.attisdropped
         AND c.columns IS NOT NULL AND a.attname <> ALL (c.columns))
        , (SELECT array_agg(CASE WHEN y.typtype IN ('b', 'e') AND (y.typcategory IN
          ('B', 'D', 'E', 'I', 'N', 'S', 'T', 'V') OR y.oid = 'uuid'::regtype)
          THEN format_type(a.atttypid, NULL) ELSE '' END ORDER BY k.position)
         FROM unnest(c.key_columns) WITH ORDINALITY k(name, position)
         JOIN pg_attribute a ON a.attrelid = c.relation AND a.attname = k.name
         JOIN pg_type y ON y.oid = a.atttypid)
        FROM sync.codec c WHERE c.id IN (SELECT codec FROM pg_temp.magic_sync_note)
        AND EXISTS (SELECT FROM pg_class WHERE oid = c.relation) ORDER BY c.id)sql");
    for (const auto& row : rows) {
        Codec codec;
        codec.id = row[0].value();
        codec.relation = row[1].value();
        codec.table_name = row[2].value();
        codec.audience = row[3].value();
        codec.to_column = row[4].value_or("");
        codec.replica_column = row[5].value_or("");
        codec.keys = text_array(spi, row[6]);
        codec.hidden = text_array(spi, row[7]);
        codec.key_casts = text_array(spi, row[8]);
        codecs.push_back(std::move(codec));
    }
    return codecs;
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
// timestamptz in two time zones) is one key, found by one key hash.
std::string noted_rows(const Codec& codec, const std::string& only_key) {
    bool casts = codec.key_casts.size() == codec.keys.size();
    for (const std::string& type : codec.key_casts) casts = casts && !type.empty();
    auto typed = [&](const std::string& from, size_t i) {
        return casts ? "(" + from + ".key->>" + pg::quote_literal(codec.keys[i]) +
                           ")::" + codec.key_casts[i]
                     : "kp." + pg::quote_identifier(codec.keys[i]);
    };
    const std::string populate =
        " CROSS JOIN LATERAL jsonb_populate_record(NULL::" + codec.relation + ", ";
    std::string key = "jsonb_build_object(";
    std::string join;
    for (size_t i = 0; i < codec.keys.size(); ++i) {
        key += (i ? ", " : "") + pg::quote_literal(codec.keys[i]) + ", " + typed("x", i);
        join +=
            (i ? " AND t." : "t.") + pg::quote_identifier(codec.keys[i]) + " = " + typed("n", i);
    }
    key += ")";
    return "(SELECT DISTINCT " + key + " AS key FROM pg_temp.magic_sync_note x" +
           (casts ? "" : populate + "x.key) kp") + " WHERE x.codec = $1::int" + only_key + ") n" +
           (casts ? "" : populate + "n.key) kp") + " LEFT JOIN " + codec.relation + " t ON " + join;
}

// The body is worked out in a subquery kept apart (OFFSET 0): pulled up into the select list, it
// was encoded twice, once for the body and once for its hash.
std::string encode_statement(const Codec& codec, const ReplicaSet& replicas,
                             const std::string& only_key) {
    Audience audience = audience_of(codec);
    std::string present = "t." + pg::quote_identifier(codec.keys.front()) + " IS NOT NULL";
    return R"sql(
           INSERT INTO pg_temp.magic_sync_row (codec, key, k, match, value, part, body, hash)
           SELECT $1::int, n.key, sync.key_hash($2, n.key), )sql" +
           pg::quote_literal(audience.match) +
           ", e.value, e.part, e.body, sync.row_hash(e.body) FROM " + noted_rows(codec, only_key) +
           " CROSS JOIN LATERAL (SELECT a.value, a.part, CASE WHEN " + present +
           " AND a.value IS NOT NULL THEN coalesce(sync.encode_row(t, $3::text[]),"
           " sync.canonical(to_jsonb(t) - $3::text[])) END AS body"
           " FROM (SELECT " +
           audience.value + " AS value, " + partition_expression(replicas.partition_column, "t") +
           " AS part) a OFFSET 0) e";
}

std::string text_array_literal(Spi& spi, const std::vector<std::string>& items) {
    std::string array = "{";
    for (size_t i = 0; i < items.size(); ++i) {
        // Array element quoting through SQL, so any name is safe.
        array += (i ? "," : "") +
                 spi.scalar(
                        "SELECT '\"' || replace(replace($1, '\\', '\\\\'), '\"', '\\\"')"
                        " || '\"'",
                        {items[i]})
                     .value();
    }
    return array + "}";
}

// 4. Re-read the noted rows of one codec, encode them and find their scope. A codec whose rows
// fail to encode as a set is planned note by note; a note that fails alone is set aside.
int64_t encode_codec(Spi& spi, const Codec& codec, const ReplicaSet& replicas) {
    const std::string hidden = text_array_literal(spi, codec.hidden);
    int64_t set_aside = 0;
    try {
        pg::subtransaction([&] {
            spi.execute(encode_statement(codec, replicas, ""),
                        {codec.id, codec.table_name, hidden});
        });
    } catch (const pg::PgError&) {
        auto keys = spi.query(
            "SELECT DISTINCT key::text FROM pg_temp.magic_sync_note WHERE codec = $1::int",
            {codec.id});
        const std::string statement = encode_statement(codec, replicas, " AND x.key = $4::jsonb");
        for (const auto& key : keys) {
            try {
                pg::subtransaction([&] {
                    spi.execute(statement, {codec.id, codec.table_name, hidden, key[0]});
                });
            } catch (const pg::PgError& e) {
                spi.execute("SELECT sync.keep('note', ARRAY[$1::int], ARRAY[$2::jsonb], ARRAY[$3])",
                            {codec.id, key[0], std::string("could not plan the row: ") + e.what()});
                ++set_aside;
            }
        }
    }
    Audience audience = audience_of(codec);
    if (!audience.names_replica.empty() && replicas.declared) {
        set_aside += spi.scalar(
                            R"sql(
            WITH unknown AS (DELETE FROM pg_temp.magic_sync_row p WHERE p.codec = $1::int
            AND p.body IS NOT NULL AND NOT EXISTS (SELECT FROM )sql" +
                                replicas.relation +
                                " r WHERE r.id::text = p.value) RETURNING p.codec, p.key, p.value)"
                                " SELECT sync.keep('note', array_agg(codec), array_agg(key),"
                                " array_agg(format('%s names replica %s, which %s does not list', "
                                "$2, value, $3)))"
                                " FROM unknown HAVING count(*) > 0",
                            {codec.id, audience.names_replica, replicas.relation_name})
                         .integer_or(0);
    }
    return set_aside;
}

// Changes that are a replica's own upload, as that replica holds the row once it takes the
// answer: the version it had (this row's previous version, in the same scope) with the upload
// over it, equal to the version planned now. Only while the answer is still to be moved (by this
// pass, after the changes): the messages that carried the previous version then come before the
// answer, so the replica holds it when it takes the answer. A row uploaded twice (two writes, or
// two replicas) before the pass is sent back. Whether the row goes back to the replica is decided
// per message (build_chunks).
void mark_echoes(Spi& spi) {
    spi.execute(
        R"sql(
        UPDATE pg_temp.magic_sync_change c SET echo_of = e.replica, echo_prev = r.seq
        FROM sync.echo e, sync.row r
        WHERE e.codec = c.codec AND e.key = c.key AND c.old_scope = c.new_scope
        AND r.k = c.k AND r.scope = c.old_scope AND NOT r.gone
        AND c.body = sync.canonical(r.body::jsonb || e.body)
        AND NOT EXISTS (SELECT FROM sync.echo other WHERE other.codec = e.codec
         AND other.key = e.key AND other.id <> e.id)
        AND EXISTS (SELECT FROM sync.answer a WHERE a.replica = e.replica
         AND a.payload->>'upload' = e.upload::text))sql");
}

// 5. Compare with what the relay planned before; record the differences with new seqs, leave
// tombstones where rows went or moved, and keep every scope's fingerprint.
int64_t record_changes(Spi& spi) {
    spi.execute(
        R"sql(
        SELECT sync.release_planned(array_agg(p.codec), array_agg(p.key))
        FROM pg_temp.magic_sync_row p JOIN sync.set_aside s
        ON s.kind IN ('note', 'row') AND s.codec = p.codec AND s.key = p.key
        HAVING count(*) > 0)sql");
    spi.execute(
        R"sql(
        INSERT INTO sync.scope (match, value, partition)
        SELECT DISTINCT match, value, part FROM pg_temp.magic_sync_row WHERE body IS NOT NULL
        ON CONFLICT (match, value, partition) DO NOTHING)sql");
    int64_t changed = static_cast<int64_t>(spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_change (codec, key, k, old_scope, old_hash, old_withheld,
        new_scope, new_hash, new_withheld, body, tomb_seq, new_seq)
        SELECT p.codec, p.key, p.k, r.scope, r.hash, r.withheld, s.id, p.hash, w.withheld,
        p.body,
        CASE WHEN r.scope IS NOT NULL AND r.scope IS DISTINCT FROM s.id
         THEN nextval('sync.row_seq') END,
        CASE WHEN s.id IS NOT NULL THEN nextval('sync.row_seq') END
        FROM pg_temp.magic_sync_row p
        LEFT JOIN sync.scope s ON p.body IS NOT NULL AND s.match = p.match
         AND s.value = p.value AND s.partition = p.part
        LEFT JOIN sync.row r ON r.k = p.k AND NOT r.gone
        CROSS JOIN LATERAL (SELECT s.id IS NOT NULL AND NOT sync.row_travels(
         sync.scope_name(s.match, s.value, s.partition), c.table_name, sync.canonical(p.key),
         p.body) AS withheld FROM sync.codec c WHERE c.id = p.codec) w
        WHERE r.scope IS DISTINCT FROM s.id OR r.hash IS DISTINCT FROM p.hash
        OR coalesce(r.withheld, false) <> w.withheld)sql"));
    if (spi.flag("SELECT EXISTS (SELECT FROM sync.echo)")) {
        if (changed > 0) mark_echoes(spi);
        spi.execute(
            R"sql(
            DELETE FROM sync.echo e USING pg_temp.magic_sync_row p
            WHERE e.codec = p.codec AND e.key = p.key)sql");
    }
    if (changed == 0) return 0;
    analyze_if_large(spi, "magic_sync_change", changed);
    spi.execute(
        R"sql(
        UPDATE sync.row r SET gone = true, seq = c.tomb_seq, hash = NULL, body = NULL,
        withheld = false, echo_of = NULL, echo_prev = NULL
        FROM pg_temp.magic_sync_change c WHERE c.tomb_seq IS NOT NULL
        AND r.k = c.k AND r.scope = c.old_scope)sql");
    spi.execute(
        R"sql(
        INSERT INTO sync.row (codec, key, k, scope, seq, hash, body, gone, withheld, echo_of,
        echo_prev)
        SELECT codec, key, k, new_scope, new_seq, new_hash, body, false, new_withheld, echo_of,
        echo_prev FROM pg_temp.magic_sync_change WHERE new_scope IS NOT NULL
        ON CONFLICT (k, scope) DO UPDATE SET seq = excluded.seq,
        hash = excluded.hash, body = excluded.body, gone = false,
        withheld = excluded.withheld, echo_of = excluded.echo_of,
        echo_prev = excluded.echo_prev)sql");
    spi.execute(
        R"sql(
        WITH d AS (
        SELECT old_scope AS scope, CASE WHEN NOT old_withheld THEN sync.fp_element(k, old_hash)
        END AS e, CASE WHEN old_withheld THEN 0 ELSE -1 END AS sign, tomb_seq AS seq
        FROM pg_temp.magic_sync_change WHERE old_scope IS NOT NULL
        UNION ALL SELECT new_scope, CASE WHEN NOT new_withheld THEN
        sync.fp_element(k, new_hash) END, CASE WHEN new_withheld THEN 0 ELSE 1 END, new_seq
        FROM pg_temp.magic_sync_change WHERE new_scope IS NOT NULL),
        per_scope AS (SELECT scope,
        coalesce(sync.fp_sum(e) FILTER (WHERE sign = 1), sync.fp_zero()) AS plus,
        coalesce(sync.fp_sum(e) FILTER (WHERE sign = -1), sync.fp_zero()) AS minus,
        sum(sign) AS dn, max(seq) AS head FROM d GROUP BY scope)
        UPDATE sync.scope s SET fp = sync.fp_sub(sync.fp_add(s.fp, p.plus), p.minus),
        n = s.n + p.dn, head = greatest(s.head, coalesce(p.head, 0))
        FROM per_scope p WHERE s.id = p.scope)sql");
    return changed;
}

// Scopes the truth audit found drifted from their tables (sync.drifted_scope): their running
// fingerprints counted again from sync.row, which the codecs the audit noted whole plan again.
void recount_drifted_scopes(Spi& spi) {
    spi.execute(
        R"sql(
        WITH drifted AS (DELETE FROM sync.drifted_scope RETURNING scope),
        counted AS (SELECT d.scope,
         coalesce(sync.fp_sum(sync.fp_element(r.k, r.hash)), sync.fp_zero()) AS fp,
         count(r.k) AS n FROM drifted d LEFT JOIN sync.row r ON r.scope = d.scope
         AND NOT r.gone AND NOT r.withheld GROUP BY d.scope)
        UPDATE sync.scope s SET fp = c.fp, n = c.n FROM counted c WHERE s.id = c.scope)sql");
}

// Confirmations left by sync.receive(): messages a replica applied leave its outbox and confirm
// the cursors they carried, whether or not the sender has recorded them as sent yet (a replica
// may apply and confirm a message before its sender's sync.sent() commits). All but one: a head
// whose lease holds (sync.lease_holds: its time has not run out and its sender's session lives)
// stays until its sender records it or the lease ends, because its lease covers the run the
// sender is still sending; pruned, it would leave the rest of the run unleased for another sender
// to take while this one sends it. The confirmation stays for the next pass.
// The lease is tested on the row the delete finds, so a lease taken since the statement began
// keeps its row too; what was kept is what the statement saw in range less what it deleted.
void apply_confirmations(Spi& spi) {
    spi.execute(
        R"sql(
        WITH c AS (DELETE FROM sync.confirmation RETURNING replica, applied),
        latest AS (SELECT replica, max(applied) AS applied FROM c GROUP BY replica),
        done AS (DELETE FROM sync.outbox o USING latest l WHERE o.replica = l.replica
         AND o.seq <= l.applied
         AND NOT sync.lease_holds(o)
         RETURNING o.replica, o.advances),
        pruned AS (SELECT replica, count(*) AS n FROM done GROUP BY replica),
        kept AS (INSERT INTO sync.confirmation (replica, applied)
         SELECT l.replica, l.applied FROM latest l LEFT JOIN pruned p ON p.replica = l.replica
         WHERE (SELECT count(*) FROM sync.outbox o WHERE o.replica = l.replica
          AND o.seq <= l.applied) > coalesce(p.n, 0)),
        advanced AS (SELECT d.replica, a.key::bigint AS scope, max(a.value::bigint) AS through
         FROM done d, jsonb_each_text(coalesce(d.advances, '{}')) a GROUP BY 1, 2)
        UPDATE sync.member m SET confirmed = greatest(m.confirmed, a.through)
        FROM advanced a WHERE m.replica = a.replica AND m.scope = a.scope)sql");
}

// Chunks for every distinct (scope, cursor) that replicas need and that is not built yet: the
// rows after the cursor in seq order, cut at the row and byte limits. A row too big for any
// message is withheld and set aside. The rows are picked into magic_sync_pick, which the round
// emptied.
//
// Where the replicas at a cursor have room for more messages, and the pass rounds left for them,
// the chunks after the first are built too, up to `ahead` in all, each starting where the one
// before ended, so the next rounds find them built. A chunk of that run must hold exactly the
// rows that building it from its own start would: it is built only after a cursor past 0 (from 0,
// tombstones are left out, after it they travel), while no chunk before it was cut short by the
// byte limit (the next one starts at a row-limit boundary), and where it holds no replica's echo
// (whether an echo is sent back depends on the cursor) and fits the byte limit whole.
void build_chunks(Spi& spi, int ahead) {
    const int rows_limit = settings::rows_per_message;
    const int bytes_limit = settings::bytes_per_message;
    // Picked in runs of rows_per_message rows (grp); the first run is cut as its rows are picked:
    // rows that fit, in order, until the running size passes the budget; the rows from there on
    // are dropped, but never the first, so that a chunk always moves on (a withheld row's note,
    // its key named by its hash when need be, fits any but the smallest limits). A row too big
    // for any message takes no room: it is withheld. The row's size is worked out where its key
    // is encoded (OFFSET 0: pulled up, the key was encoded once for the row and again for its
    // size).
    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_pick (origin, scope, grp, head, scope_name, budget, seq,
        codec, key, table_name, ktext, body, hash, size, fits, dropped, last_fetched, echo)
        SELECT p.origin, p.scope, p.grp, p.head, p.scope_name, p.budget, p.seq, p.codec, p.key,
        p.table_name, p.ktext, p.body, p.hash, p.size, p.fits, CASE WHEN p.grp = 0 THEN
         p.position > 1 AND sum(CASE WHEN p.fits THEN p.size + 1
          ELSE sync.withheld_size(p.scope_name, p.table_name, p.ktext, p.body) END)
         OVER (PARTITION BY p.scope, p.origin ORDER BY p.seq) > p.budget
         WHEN p.grp > 0 THEN false END,
        p.position % $1::int = 0, p.echo
        FROM (SELECT w.origin, w.scope, (r.position - 1) / $1::int AS grp, w.head, w.scope_name,
         w.budget, r.seq, r.codec, r.key, r.table_name, r.ktext, r.body, r.hash, r.size,
         NOT r.withheld AND r.size + 1 <= w.budget AS fits, r.position, r.echo
         FROM (SELECT n.scope, n.sent AS origin, n.head, n.scope_name,
          $2::int - sync.envelope_size('{*}', '{}')
          - sync.chunk_size(n.scope_name, n.sent, n.head) - 1 AS budget,
          CASE WHEN n.sent > 0 THEN least(max(n.room), $3::int) ELSE 1 END AS chunks
          FROM pg_temp.magic_sync_need n WHERE n.chunk IS NULL
          GROUP BY n.scope, n.sent, n.head, n.scope_name) w
         LEFT JOIN LATERAL (SELECT k.*, sync.row_size(k.table_name, k.ktext, k.body) AS size
          FROM (SELECT x.seq, x.codec, x.key, c.table_name, sync.canonical(x.key) AS ktext,
           x.body, encode(x.hash, 'hex') AS hash, x.withheld, x.position, x.echo
           FROM (SELECT y.*, row_number() OVER (ORDER BY y.seq) AS position
            FROM (SELECT seq, codec, key, body, hash, withheld, echo_of IS NOT NULL AS echo
             FROM sync.row
             WHERE scope = w.scope AND seq > w.origin AND seq <= w.head
             AND (w.origin > 0 OR NOT gone)
             AND (echo_of IS NULL OR w.origin < echo_prev OR EXISTS (SELECT FROM sync.member m
              WHERE m.scope = w.scope AND m.replica <> sync.row.echo_of))
             ORDER BY seq LIMIT $1::int * w.chunks) y) x
           JOIN sync.codec c ON c.id = x.codec OFFSET 0) k) r ON true) p)sql",
        {rows_limit, bytes_limit, ahead});
    // A chunk covers the scope up to its head, or up to its last row when it was cut short. Its
    // rows are aggregated in one order, unsorted, and put in seq order by sync.encode_chunk: five
    // aggregates each sorting its own input cost more than the encoding. The rows withheld from
    // the chunks built are set aside.
    spi.execute(
        R"sql(
        WITH runs AS (SELECT origin, scope, coalesce(grp, 0) AS grp, max(head) AS head,
         max(scope_name) AS scope_name, coalesce(bool_or(dropped), false) AS cut_by_bytes,
         bool_or(dropped) OR bool_or(last_fetched) AS cut_short,
         max(seq) FILTER (WHERE NOT dropped) AS last_seq,
         count(*) FILTER (WHERE fits AND NOT dropped) AS rows,
         coalesce(sum(size + 1) FILTER (WHERE fits AND NOT dropped), 0)
         + coalesce(sum(sync.withheld_size(scope_name, table_name, ktext, body))
          FILTER (WHERE NOT fits AND NOT dropped), 0) AS row_bytes,
         coalesce(bool_or(echo), false) AS echoes,
         array_agg(seq) FILTER (WHERE fits AND NOT dropped) AS seqs,
         array_agg(table_name) FILTER (WHERE fits AND NOT dropped) AS tables,
         array_agg(ktext) FILTER (WHERE fits AND NOT dropped) AS keys,
         array_agg(body) FILTER (WHERE fits AND NOT dropped) AS bodies,
         array_agg(hash) FILTER (WHERE fits AND NOT dropped) AS hashes,
         jsonb_agg(sync.withheld_note(scope_name, table_name, ktext, body)
          ORDER BY seq) FILTER (WHERE NOT fits AND NOT dropped) AS withheld,
         sum(sync.withheld_size(scope_name, table_name, ktext, body))
          FILTER (WHERE NOT fits AND NOT dropped) AS withheld_bytes
         FROM pg_temp.magic_sync_pick GROUP BY origin, scope, coalesce(grp, 0)),
        started AS (SELECT r.*, CASE WHEN r.grp = 0 THEN r.origin ELSE
         lag(r.last_seq) OVER (PARTITION BY r.origin, r.scope ORDER BY r.grp) END AS from_seq
         FROM runs r),
        linked AS (SELECT s.*, bool_and(CASE WHEN s.grp = 0 THEN NOT s.cut_by_bytes
          ELSE NOT s.echoes AND s.row_bytes <= $1::int - sync.envelope_size('{*}', '{}')
           - sync.chunk_size(s.scope_name, s.from_seq, s.head) - 1 END)
         OVER (PARTITION BY s.origin, s.scope ORDER BY s.grp) AS chained FROM started s),
        built AS (INSERT INTO sync.chunk (scope, from_seq, to_seq, built_head, rows, bytes, body,
         withheld)
         SELECT l.scope, l.from_seq, t.to_seq, l.head, l.rows,
         octet_length(b.body) + coalesce(l.withheld_bytes, 0), b.body, coalesce(l.withheld, '[]')
         FROM linked l
         CROSS JOIN LATERAL (SELECT CASE WHEN l.cut_short THEN l.last_seq ELSE l.head END
          AS to_seq) t
         CROSS JOIN LATERAL (SELECT sync.encode_chunk(l.scope_name, l.from_seq, t.to_seq,
          l.seqs, l.tables, l.keys, l.bodies, l.hashes) AS body OFFSET 0) b
         WHERE l.grp = 0 OR l.chained RETURNING scope, from_seq, to_seq)
        SELECT sync.keep('row', array_agg(w.codec), array_agg(w.key), array_agg(w.reason))
        FROM (SELECT DISTINCT ON (p.codec, p.key) p.codec, p.key,
        sync.withheld_reason(p.scope_name, p.table_name, p.ktext, p.body) AS reason
        FROM pg_temp.magic_sync_pick p JOIN built b ON b.scope = p.scope AND p.seq > b.from_seq
         AND p.seq <= b.to_seq
        WHERE NOT p.fits AND NOT p.dropped ORDER BY p.codec, p.key, p.budget) w
        HAVING count(*) > 0)sql",
        {bytes_limit});
}

// 6. One round of messages: at most one new message for every replica with a cursor behind and
// room in its window. `rounds_left` counts this one. Returns the number of messages written.
int64_t write_messages(Spi& spi, int rounds_left) {
    // Emptied by DELETE in one statement: the pass truncated whichever had grown large when it
    // began, and a round adds at most the rows of the chunks the pass's rounds send.
    spi.execute(
        R"sql(
        WITH need AS (DELETE FROM pg_temp.magic_sync_need),
        picked AS (DELETE FROM pg_temp.magic_sync_picked),
        pick AS (DELETE FROM pg_temp.magic_sync_pick) SELECT)sql");
    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_need (replica, scope, sent, head, scope_name, room,
        in_flight)
        SELECT m.replica, m.scope, m.sent, s.head,
        sync.scope_name(s.match, s.value, s.partition), $1::int - u.unsent, u.in_flight
        FROM sync.member m JOIN sync.scope s ON s.id = m.scope
        JOIN sync.replica r ON r.id = m.replica AND r.live
        CROSS JOIN LATERAL (SELECT count(*) AS unsent,
         coalesce(bool_or(sync.lease_holds(o)), false) AS in_flight FROM sync.outbox o
         WHERE o.replica = m.replica AND o.sent_at IS NULL) u
        WHERE m.sent < s.head AND u.unsent < $1::int)sql",
        {settings::window});
    auto attach_chunks = [&] {
        spi.execute(
            R"sql(
            UPDATE pg_temp.magic_sync_need n SET chunk = c.id, chunk_to = c.to_seq,
            chunk_rows = c.rows, chunk_bytes = c.bytes
            FROM (SELECT DISTINCT ON (c.scope, c.from_seq) c.id, c.scope, c.from_seq,
             c.to_seq, c.rows, c.bytes FROM sync.chunk c
             JOIN sync.scope s ON s.id = c.scope AND s.head = c.built_head
             WHERE (c.scope, c.from_seq) IN (SELECT scope, sent FROM pg_temp.magic_sync_need)
             ORDER BY c.scope, c.from_seq, c.to_seq DESC) c
            WHERE n.chunk IS NULL AND c.scope = n.scope AND c.from_seq = n.sent)sql");
    };
    attach_chunks();
    if (spi.flag("SELECT EXISTS (SELECT FROM pg_temp.magic_sync_need WHERE chunk IS NULL)")) {
        build_chunks(spi, rounds_left);
        attach_chunks();
    }
    // Pack each replica's next chunks into one message, within the row and byte limits. While
    // a sender is delivering to the replica (a lease holds), it gets a new message only when a
    // chunk of it is full (cut at a limit, more rows after it): a chunk that takes the rest of
    // its scope waits for that delivery to end (sync.sent wakes the relay), and takes what
    // changed until then with it. Otherwise, under a steady trickle of writes, every pass queued
    // a small message behind the one being delivered, and a change waited for a window of them
    // to go, one at a time.
    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_picked (replica, scope, chunk, chunk_to)
        SELECT replica, scope, chunk, chunk_to FROM (SELECT n.*,
         bool_or(n.chunk_to < n.head OR n.chunk_rows >= $1::int)
          OVER (PARTITION BY n.replica) AS takes_full,
         row_number() OVER w AS position, sum(n.chunk_rows) OVER w AS rows_so_far,
         sum(n.chunk_bytes + 1) OVER w AS bytes_so_far,
         $2::int - sync.envelope_size(CASE WHEN r.reset_pending THEN '{*}'::text[]
          ELSE '{}' END, r.pending_drops, r.pending_table_drops) AS budget,
         cardinality(r.pending_drops) + cardinality(r.pending_table_drops) > 0 AS drops
         FROM pg_temp.magic_sync_need n JOIN sync.replica r ON r.id = n.replica
         WINDOW w AS (PARTITION BY n.replica ORDER BY n.scope)) x
        WHERE (NOT in_flight OR takes_full) AND ((position = 1 AND NOT drops)
        OR (bytes_so_far <= budget AND (position = 1 OR rows_so_far <= $1::int))))sql",
        {settings::rows_per_message, settings::bytes_per_message});
    spi.execute(
        R"sql(
        WITH message AS (
         SELECT replica, array_agg(chunk ORDER BY scope) AS chunks,
         jsonb_object_agg(scope::text, chunk_to) AS advances
         FROM pg_temp.magic_sync_picked GROUP BY replica
         UNION ALL SELECT r.id, '{}', '{}' FROM sync.replica r
         WHERE r.live AND (r.reset_pending OR cardinality(r.pending_drops) > 0
          OR cardinality(r.pending_table_drops) > 0)
         AND NOT EXISTS (SELECT FROM pg_temp.magic_sync_picked p WHERE p.replica = r.id)
         AND (SELECT count(*) FROM sync.outbox o WHERE o.replica = r.id AND o.sent_at IS NULL)
          < $1::int),)sql"
        // Drops go in the order they came, as many as fit; the rest wait for the next message
        // (which a message with chunks never precedes: those wait until every drop fits).
        " cut AS (SELECT m.*, r.reset_pending, r.pending_drops,"
        "  r.pending_table_drops, sync.drops_fitting(CASE WHEN r.reset_pending THEN '{*}'::text[]"
        "   ELSE '{}' END, r.pending_drops, r.pending_table_drops) AS n,"
        "  cardinality(r.pending_drops) AS scope_drops"
        "  FROM message m JOIN sync.replica r ON r.id = m.replica),"
        " queued AS (INSERT INTO pg_temp.magic_sync_enqueue (replica, position, kind, chunks,"
        "  reset, drops, table_drops, advances) SELECT c.replica, 1, 'rows', c.chunks,"
        "  CASE WHEN c.reset_pending THEN '{*}'::text[] ELSE '{}' END, c.pending_drops[1:c.n],"
        "  c.pending_table_drops[1:c.n - c.scope_drops], c.advances FROM cut c),"
        " counted AS (UPDATE sync.replica r SET reset_pending = false,"
        "  pending_drops = c.pending_drops[c.n + 1:],"
        "  pending_table_drops = c.pending_table_drops[greatest(c.n - c.scope_drops, 0) + 1:]"
        "  FROM cut c WHERE r.id = c.replica),"
        " advanced AS (UPDATE sync.member m SET sent = p.chunk_to"
        "  FROM pg_temp.magic_sync_picked p WHERE m.replica = p.replica AND m.scope = p.scope)"
        " SELECT",
        {settings::window});
    return spi.scalar("SELECT sync.enqueue()").integer_or(0);
}

// Rows this backend's passes changed since it last analyzed sync.row, and messages written and
// replicas provisioned or forgotten since it last analyzed the replica tables.
int64_t rows_changed_since_analyze = 0;
int64_t replica_rows_since_analyze = 0;

}  // namespace

PassCounts run_pass(Spi& spi) {
    spi.scalar("SELECT sync.relay_lock()");
    ensure_temp_tables(spi);
    clear_all_temp_tables(spi);
    PassCounts counts;
    note_rows_the_limit_changed(spi);
    forget_dropped_codecs(spi);
    counts.notes = take_notes(spi);
    // Read after the notes are taken: each statement sees what committed before it began, so a
    // declaration of the replicas committed with the notes it made (sync.replicas and the first
    // replica, in one transaction or two) is seen by the statements that plan those notes. Read
    // before, it was not, and the notes were planned as if no replicas were declared: dropped.
    ReplicaSet replicas = replica_set(spi);
    expand_whole_codecs(spi, replicas);
    analyze_if_large(spi, "magic_sync_note",
                     spi.scalar("SELECT count(*) FROM pg_temp.magic_sync_note").integer_or(0));
    ReplicaCounts replica_counts = plan_replicas(spi, replicas);
    counts.provisioned = replica_counts.provisioned;
    counts.forgotten = replica_counts.forgotten;
    if (counts.provisioned > 0) {
        // A row set aside because it named a replica nobody listed may name this one.
        spi.execute(
            R"sql(
            INSERT INTO pg_temp.magic_sync_note (codec, key) SELECT codec, key
            FROM sync.set_aside WHERE kind = 'note')sql");
    }
    for (const Codec& codec : noted_codecs(spi))
        counts.set_aside += encode_codec(spi, codec, replicas);
    analyze_if_large(spi, "magic_sync_row",
                     spi.scalar("SELECT count(*) FROM pg_temp.magic_sync_row").integer_or(0));
    counts.rows_changed = record_changes(spi);
    recount_drifted_scopes(spi);
    apply_confirmations(spi);
    counts.messages += move_answers(spi);
    counts.messages += plan_repairs(spi);
    for (int round = 0; round < settings::window; ++round) {
        int64_t written = write_messages(spi, settings::window - round);
        counts.messages += written;
        if (written == 0) break;
    }
    if (counts.messages > 0) spi.execute("SELECT pg_notify('magic_sync', '')");
    // The next passes read sync.row by scope and seq: keep its statistics up with what the passes
    // changed since it was last analyzed. Counted over passes: 100,000 rows planned 10,000 a pass
    // left it "empty" to the planner, which then read every row after a cursor to keep 200.
    constexpr int64_t kAnalyzeAfterRows = 10000;
    rows_changed_since_analyze += counts.rows_changed;
    if (rows_changed_since_analyze >= kAnalyzeAfterRows) {
        spi.execute("ANALYZE sync.row");
        rows_changed_since_analyze = 0;
    }
    // The same for the replicas, their cursors and their outboxes, which the next passes join by
    // replica: 100,000 replicas provisioned 10,000 a pass left the outbox "empty" to the planner,
    // which then matched every confirmation against every message, 25-38 s a pass.
    replica_rows_since_analyze += counts.messages + counts.provisioned + counts.forgotten;
    if (replica_rows_since_analyze >= kAnalyzeAfterRows) {
        spi.execute("ANALYZE sync.replica, sync.member, sync.outbox");
        replica_rows_since_analyze = 0;
    }
    spi.execute(
        R"sql(
        UPDATE sync.relay_state SET last_pass_at = clock_timestamp(), last_pass =
        jsonb_build_object('notes', $1::bigint, 'rows_changed', $2::bigint,
        'provisioned', $3::bigint, 'forgotten', $4::bigint, 'messages', $5::bigint,
        'set_aside', $6::bigint))sql",
        {counts.notes, counts.rows_changed, counts.provisioned, counts.forgotten, counts.messages,
         counts.set_aside});
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
