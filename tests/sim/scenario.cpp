#include "sim/scenario.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "sim/rng.hpp"

namespace magic_sync::sim {

const std::vector<StepKind>& step_kinds() {
    static const std::vector<StepKind> kinds = {
        {"insert", "data", "a row inserted"},
        {"update", "data", "a row's column, audience or partition changed"},
        {"delete", "data", "a row deleted"},
        {"pk_change", "data", "a row's primary key changed"},
        {"truncate", "data", "TRUNCATE of a synced table"},
        {"bulk_insert", "data", "INSERT ... SELECT of many rows"},
        {"bulk_update", "data", "UPDATE of many rows"},
        {"bulk_delete", "data", "DELETE of many rows"},
        {"rollback", "data", "a transaction that changes rows and rolls back"},
        {"big_row", "data", "a row bigger than bytes_per_message"},
        {"replica_not_live", "replicas", "a replica stops being live"},
        {"replica_live", "replicas", "a replica becomes live again"},
        {"replica_move_group", "replicas", "a replica moves to another region, shift or crew"},
        {"replica_move_partition", "replicas", "a replica moves to the other partition"},
        {"replica_delete", "replicas", "a replica's row deleted"},
        {"replica_reinsert", "replicas", "a deleted replica's row inserted again"},
        {"replica_new", "replicas", "a new replica"},
        {"replicas_view", "replicas", "sync.replicas declared again on a view over the table"},
        {"add_column", "schema", "ALTER TABLE ADD COLUMN with a default on a synced table"},
        {"drop_column", "schema", "ALTER TABLE DROP COLUMN on a synced table"},
        {"rename_column", "schema", "ALTER TABLE RENAME COLUMN on a synced table"},
        {"change_type", "schema", "ALTER TABLE ALTER COLUMN TYPE on a synced table"},
        {"rename_table", "schema", "a synced table renamed and declared again"},
        {"drop_table", "schema", "a synced table dropped (sync.drop, or DROP TABLE and the fix)"},
        {"new_table", "schema", "a new table declared"},
        {"new_group_table", "schema", "a table grouped on a replicas column no declaration used"},
        {"hostile_column", "schema",
         "a column named as our SQL's aliases and words are, or with quotes, spaces, capitals, "
         "unicode, 63 bytes"},
        {"alter_type", "schema",
         "ALTER TYPE of an enum synced columns hold: a value renamed or added"},
        {"new_group_column", "schema",
         "a column added to the replicas table and a table grouped on it"},
        {"upload_record", "uploads", "a replica writes a record row"},
        {"upload_both", "uploads", "a replica writes the replica columns of a both row it holds"},
        {"upload_resend", "uploads", "an upload sent again through sync.receive"},
        {"upload_failing", "uploads", "a record row that fails a CHECK or a foreign key"},
        {"upload_fix", "uploads", "the CHECK dropped, the parent inserted or the column added"},
        {"upload_new_column", "uploads", "a record row with a column its table does not have yet"},
        {"upload_late_table", "uploads", "a row of a table not declared yet"},
        {"declare_late", "uploads", "that table declared"},
        {"upload_catalog", "uploads", "a replica writes a catalog row (refused, kept)"},
        {"upload_foreign_both", "uploads",
         "a replica writes a both row it is not sent (another's: refused, kept)"},
        {"upload_crafted", "uploads",
         "a device's own upload: a number past double's range, holds of scopes it is not in"},
        {"upload_too_many_rows", "uploads",
         "a device's upload of more rows than max_upload_rows (kept whole, the limit named)"},
        {"kill_sender", "faults", "kill -9 of the sender, then a new one"},
        {"kill_replica", "faults", "kill -9 of a replica process, then it starts again"},
        {"kill_relay", "faults", "kill -9 of the relay's backend"},
        {"restart_postgres", "faults", "pg_ctl stop -m immediate, then start"},
        {"cut_line", "faults", "the router cuts a replica's line"},
        {"heal_line", "faults", "the router heals it"},
        {"cancel_pass", "faults",
         "pg_cancel_backend of the relay while its pass waits on a synced table's lock"},
        {"timeout_pass", "faults",
         "lock_timeout ends the relay's passes while they wait on a synced table's lock"},
        {"cancel_filing", "faults",
         "pg_cancel_backend of the route while its sync.receive waits on a table's lock"},
        {"timeout_filing", "faults",
         "statement_timeout ends the route's sync.receive while it waits on a table's lock"},
        {"dump_restore", "history", "pg_dump -Fc, DROP DATABASE and pg_restore"},
        {"recreate_extension", "history",
         "DROP EXTENSION magic_sync CASCADE, CREATE EXTENSION and every declaration again"},
        {"base_backup", "history", "pg_basebackup of the cluster (after a checkpoint)"},
        {"roll_back", "history",
         "the cluster stopped and the last base backup recovered in its place: the relay's state "
         "and the tables go back while the devices hold later messages"},
        {"setting_change", "history",
         "ALTER DATABASE SET of DateStyle, TimeZone, IntervalStyle, extra_float_digits or "
         "bytea_output, the relay connecting again"},
    };
    return kinds;
}

std::string Step::text() const {
    std::string out = kind;
    if (replica) out += " replica " + std::to_string(replica);
    switch (action) {
        case Action::Sql:
        case Action::StartReplica:
            out += ": " + sql;
            break;
        case Action::Write:
            out += ": write " + table + " " + json +
                   (key_columns.empty() ? "" : " --key " + key_columns);
            break;
        case Action::PassFault:
            out += ": " + how + " while " + table + " is locked, after " + sql;
            break;
        case Action::FilingFault:
            out += ": " + how + " while " + table + " is locked, of sync.receive " + json + " → " +
                   answer;
            break;
        case Action::Receive:
            out += ": sync.receive " +
                   (json.size() <= 600
                        ? json
                        : json.substr(0, 600) + "... (" + std::to_string(json.size()) + " bytes)") +
                   " → " + answer;
            break;
        case Action::Checkpoint: {
            out += ": live replicas";
            for (int n : live) out += " " + std::to_string(n);
            if (!verify.empty()) {
                out += "; uploads";
                for (const Verify& v : verify)
                    out += " " + std::to_string(v.upload) + (v.filed ? " filed" : " kept");
            }
            break;
        }
        default:
            break;
    }
    return out;
}

namespace {

enum class KeyKind { Int, BigInt, Uuid, Text, Composite };
enum class Kind { CatalogAll, CatalogOwn, CatalogGroup, Record, Both };

const int kRegions = 3;
const int kMaxUploadRows = 10000;  // magic_sync.max_upload_rows, as the simulation leaves it

// The generator's picture of a row: only what decides who holds it.
struct Row {
    int owner = 0;  // replica number, 0 for NULL
    int group = 0;  // region or crew (0 for NULL), or shift 1 day / 2 night
    int part = 1;
};

struct Column {
    std::string name;
    std::string type;
};

struct Table {
    std::string name;  // without the schema
    Kind kind = Kind::CatalogAll;
    std::string group;  // the column matched: owner, region, shift or crew; "" for all or none
    bool record_to_owner = false;
    KeyKind key = KeyKind::Int;
    std::vector<Column> columns;  // data columns: the ones schema steps change
    std::map<int, Row> rows;
    int next_id = 1;
    bool declared = true;
    int late_blocker = 0;  // an undeclared table whose uploads wait for its declaration
    std::string qualified() const { return "sim." + name; }
};

struct Replica {
    bool exists = false;
    bool active = true;
    int region = 1;
    int part = 1;
    int shift = 1;  // 1 day, 2 night
    int crew = 0;
    bool live() const { return exists && active; }
};

std::string sql_text(const std::string& value) {
    bool escape = value.find_first_of("\n\t\\") != std::string::npos;
    std::string out = escape ? "E'" : "'";
    for (char c : value) {
        if (c == '\'')
            out += "''";
        else if (escape && c == '\\')
            out += "\\\\";
        else if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else
            out += c;
    }
    return out + "'";
}

// A column's name as SQL writes it: always quoted, since some are named to be hostile.
std::string ident(const std::string& name) {
    std::string out = "\"";
    for (char c : name) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

// Names a user may give a column that our generated SQL must not confuse with its own: the
// aliases and words it uses, reserved words, quotes, spaces, capitals, unicode, 63 bytes.
const std::vector<std::string>& hostile_names() {
    static const std::vector<std::string> names = {
        "t",    "r",          "c",          "k",        "m",    "o",       "p",
        "s",    "w",          "x",          "row",      "key",  "keys",    "body",
        "hash", "seq",        "scope",      "codec",    "gone", "select",  "order",
        "user", "Mixed Case", "with space", "quote\"d", "it's", "ünïcødé", std::string(63, 'z')};
    return names;
}

std::string replica_uuid(int n) {
    char id[40];
    snprintf(id, sizeof id, "00000000-0000-0000-0000-%012d", n);
    return id;
}

std::string part_name(int part) { return "p" + std::to_string(part); }
std::string shift_name(int shift) { return shift == 2 ? "night" : "day"; }

class Generator {
  public:
    Generator(uint64_t seed, const std::set<std::string>& without) : rng_(seed), without_(without) {
        scenario_.seed = seed;
    }

    Scenario run(int steps) {
        setup();
        checkpoint();
        for (int i = 0; i < steps; ++i) {
            random_step();
            if (rng_.chance(8) || since_checkpoint_ >= 15) checkpoint();
        }
        checkpoint();
        return scenario_;
    }

  private:
    bool enabled(const std::string& kind) const {
        if (without_.count(kind)) return false;
        for (const StepKind& k : step_kinds())
            if (k.name == kind) return !without_.count(k.group);
        throw std::logic_error("unknown step kind " + kind);
    }

    Step& add(const std::string& kind, Action action, const std::string& sql = "",
              int replica = 0) {
        Step step;
        step.kind = kind;
        step.action = action;
        step.sql = sql;
        step.replica = replica;
        scenario_.steps.push_back(step);
        ++since_checkpoint_;
        return scenario_.steps.back();
    }

    // --- values -------------------------------------------------------------------------------

    std::string value_of(const std::string& type) {
        if (rng_.chance(12)) return "NULL";
        if (type == "numeric") {
            switch (rng_.range(0, 4)) {
                case 0:
                    return "0";
                case 1:
                    return "-0.001";
                case 2:
                    return "123456789012345678.123456789";
                default:
                    return std::to_string(rng_.range(-500, 99999)) + "." +
                           std::to_string(rng_.range(10, 99));
            }
        }
        if (type == "int[]" || type == "bigint[]") {
            switch (rng_.range(0, 3)) {
                case 0:
                    return "'{}'";
                case 1:
                    return "'{NULL," + std::to_string(rng_.range(-9, 9)) + "}'";
                default:
                    return "'{" + std::to_string(rng_.range(0, 99)) + "," +
                           std::to_string(rng_.range(0, 99)) + "}'";
            }
        }
        if (type == "jsonb") {
            switch (rng_.range(0, 4)) {
                case 0:
                    return R"('{"a": 1, "b": "it''s \"q\""}')";
                case 1:
                    return R"('[1, 2.50, null, "é", {"z": []}]')";
                case 2:
                    return R"('"just a string"')";
                case 3:
                    return "'{\"n\": " + std::to_string(rng_.range(0, 1000)) +
                           ", \"deep\": {\"x\": [true, false]}}'";
                default:
                    return "'12.0'";
            }
        }
        if (type == "bytea") {
            switch (rng_.range(0, 2)) {
                case 0:
                    return "'\\x'::bytea";
                case 1:
                    return "'\\x00ff10'::bytea";
                default:
                    return "decode('" + std::to_string(rng_.range(1000, 9999)) + "', 'hex')";
            }
        }
        if (type == "float8") {
            static const std::vector<std::string> floats = {"0.1", "-2.5e-5", "1e300",
                                                            "3.141592653589793", "100"};
            return "'" + rng_.pick(floats) + "'";
        }
        if (type == "interval") {
            static const std::vector<std::string> intervals = {"1 day 02:03:04", "-3 months",
                                                               "00:00:00.5", "P1Y2M3DT4H5M6S", "0"};
            return "'" + rng_.pick(intervals) + "'";
        }
        if (type == "date")
            return "'2024-0" + std::to_string(rng_.range(1, 9)) + "-1" +
                   std::to_string(rng_.range(0, 9)) + "'";
        if (type == "sim.mood") return sql_text(rng_.pick(moods_));
        if (type == "timestamptz") {
            switch (rng_.range(0, 3)) {
                case 0:
                    return "'infinity'";
                case 1:
                    return "'1999-12-31 23:59:59+05:30'";
                default:
                    return "'2024-02-" + std::to_string(rng_.range(10, 28)) + " 12:34:56." +
                           std::to_string(rng_.range(100, 999)) + "+00'";
            }
        }
        // text
        switch (rng_.range(0, 6)) {
            case 0:
                return sql_text("it's \"quoted\" " + std::to_string(rng_.range(0, 999)));
            case 1:
                return sql_text("line one\nline two\ttab " + std::to_string(rng_.range(0, 999)));
            case 2:
                return sql_text("ünïcødé ✓ 日本語 🚐 " + std::to_string(rng_.range(0, 999)));
            case 3:
                return "''";
            case 4:
                return sql_text("back\\slash");
            case 5:
                return "'null'";
            default:
                return sql_text("plain " + std::to_string(rng_.range(0, 99999)));
        }
    }

    // --- keys ---------------------------------------------------------------------------------

    static std::vector<std::string> key_columns(KeyKind key) {
        if (key == KeyKind::Composite) return {"a", "b"};
        return {"id"};
    }
    static std::string key_definition(KeyKind key) {
        switch (key) {
            case KeyKind::Int:
                return "id int PRIMARY KEY";
            case KeyKind::BigInt:
                return "id bigint PRIMARY KEY";
            case KeyKind::Uuid:
                return "id uuid PRIMARY KEY";
            case KeyKind::Text:
                return "id text PRIMARY KEY";
            case KeyKind::Composite:
                return "a int, b text";
        }
        return "";
    }
    static std::string key_name(KeyKind key) {
        switch (key) {
            case KeyKind::Int:
                return "int";
            case KeyKind::BigInt:
                return "bigint";
            case KeyKind::Uuid:
                return "uuid";
            case KeyKind::Text:
                return "text";
            case KeyKind::Composite:
                return "(int, text)";
        }
        return "";
    }
    static std::string text_key(int i) { return "it's \"k\" #" + std::to_string(i); }
    static std::string uuid_key(int i) {
        char id[40];
        snprintf(id, sizeof id, "aaaaaaaa-0000-4000-8000-%012d", i);
        return id;
    }
    // The key's values for row i, as SQL literals in the order of key_columns.
    static std::vector<std::string> key_values(KeyKind key, int i) {
        switch (key) {
            case KeyKind::Int:
                return {std::to_string(i)};
            case KeyKind::BigInt:
                return {std::to_string(9000000000LL + i)};
            case KeyKind::Uuid:
                return {"'" + uuid_key(i) + "'"};
            case KeyKind::Text:
                return {sql_text(text_key(i))};
            case KeyKind::Composite:
                return {std::to_string(i % 5), "'c-" + std::to_string(i) + "'"};
        }
        return {};
    }
    // The same as SQL expressions of the integer `i` (for INSERT ... SELECT).
    static std::vector<std::string> key_expressions(KeyKind key) {
        switch (key) {
            case KeyKind::Int:
                return {"i"};
            case KeyKind::BigInt:
                return {"9000000000 + i"};
            case KeyKind::Uuid:
                return {"('aaaaaaaa-0000-4000-8000-' || lpad(i::text, 12, '0'))::uuid"};
            case KeyKind::Text:
                return {"'it''s \"k\" #' || i"};
            case KeyKind::Composite:
                return {"i % 5", "'c-' || i"};
        }
        return {};
    }
    static nlohmann::json key_json(KeyKind key, int i) {
        switch (key) {
            case KeyKind::Int:
                return {{"id", i}};
            case KeyKind::BigInt:
                return {{"id", 9000000000LL + i}};
            case KeyKind::Uuid:
                return {{"id", uuid_key(i)}};
            case KeyKind::Text:
                return {{"id", text_key(i)}};
            case KeyKind::Composite:
                return {{"a", i % 5}, {"b", "c-" + std::to_string(i)}};
        }
        return {};
    }
    static std::string join(const std::vector<std::string>& items,
                            const std::string& separator = ", ") {
        std::string out;
        for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
        return out;
    }

    // --- the model ----------------------------------------------------------------------------

    std::vector<int> replicas_where(const std::function<bool(const Replica&)>& test) const {
        std::vector<int> out;
        for (const auto& [n, r] : replicas_)
            if (test(r)) out.push_back(n);
        return out;
    }
    std::vector<int> existing() const {
        return replicas_where([](const Replica& r) { return r.exists; });
    }
    std::vector<int> live() const {
        return replicas_where([](const Replica& r) { return r.live(); });
    }
    std::vector<Table*> tables_where(const std::function<bool(const Table&)>& test) {
        std::vector<Table*> out;
        for (Table& t : tables_)
            if (test(t)) out.push_back(&t);
        return out;
    }
    // Synced tables the server writes: catalog and both.
    std::vector<Table*> server_tables() {
        return tables_where([](const Table& t) { return t.declared && t.kind != Kind::Record; });
    }
    std::vector<Table*> with_rows(std::vector<Table*> tables) {
        tables.erase(
            std::remove_if(tables.begin(), tables.end(), [](Table* t) { return t->rows.empty(); }),
            tables.end());
        return tables;
    }
    int pick_row(const Table& t) {
        std::vector<int> ids;
        for (const auto& [id, row] : t.rows) ids.push_back(id);
        return rng_.pick(ids);
    }

    int group_of(const Replica& r, const std::string& group) const {
        if (group == "region") return r.region;
        if (group == "shift") return r.shift;
        if (group == "crew") return r.crew;
        return 0;
    }
    // Whether replica n holds the row, by the declared rules.
    bool holds(int n, const Table& t, const Row& row) const {
        const Replica& r = replicas_.at(n);
        if (!r.live()) return false;
        if (scenario_.partitioned && row.part != r.part) return false;
        if (t.group == "owner") return row.owner == n;
        if (t.group.empty()) return t.kind == Kind::CatalogAll;
        return row.group != 0 && row.group == group_of(r, t.group);
    }

    // A fresh routing for a row.
    Row new_row() {
        Row row;
        std::vector<int> ids = existing();
        // Before the replicas exist, rows name the ones that will.
        if (ids.empty())
            for (int n = 1; n <= planned_replicas_; ++n) ids.push_back(n);
        if (!ids.empty() && rng_.chance(85)) row.owner = rng_.pick(ids);
        row.group = rng_.chance(10) ? 0 : static_cast<int>(rng_.range(1, kRegions));
        row.part = static_cast<int>(rng_.range(1, 2));
        return row;
    }
    std::string group_literal(const Table& t, int group) const {
        if (group == 0) return "NULL";
        if (t.group == "shift") return "'" + shift_name(group) + "'";
        return std::to_string(group);
    }
    void normalize(const Table& t, Row& row) const {
        if (t.group == "shift" && row.group > 2) row.group = 1;
        if (t.group == "crew" && row.group > 2) row.group = 2;
    }

    // The routing columns of a table and their values for a row.
    void routing(const Table& t, const Row& row, std::vector<std::string>& columns,
                 std::vector<std::string>& values) const {
        if (t.group == "owner" || (t.kind == Kind::Record)) {
            columns.push_back("owner");
            values.push_back(row.owner ? "'" + replica_uuid(row.owner) + "'" : "NULL");
        } else if (!t.group.empty()) {
            columns.push_back(t.group);
            values.push_back(group_literal(t, row.group));
        }
        if (scenario_.partitioned) {
            columns.push_back("part");
            values.push_back("'" + part_name(row.part) + "'");
        }
    }

    // The columns of an insert and the values of one row, "(...)".
    std::pair<std::string, std::string> insert_row(Table& t, int id, const Row& row,
                                                   const std::string& label) {
        std::vector<std::string> columns = key_columns(t.key);
        std::vector<std::string> values = key_values(t.key, id);
        columns.push_back("n");
        values.push_back(std::to_string(id));
        routing(t, row, columns, values);
        columns.push_back("label");
        values.push_back(label);
        for (const Column& c : t.columns) {
            columns.push_back(ident(c.name));
            values.push_back(value_of(c.type));
        }
        return {"(" + join(columns) + ")", "(" + join(values) + ")"};
    }
    std::string insert_sql(Table& t, int id, const Row& row, const std::string& label) {
        auto [columns, values] = insert_row(t, id, row, label);
        return "INSERT INTO " + t.qualified() + " " + columns + " VALUES " + values;
    }

    std::string declaration(const Table& t) const {
        std::string to;
        if (t.group == "owner")
            to = "owner";
        else if (!t.group.empty())
            to = t.group + " = " + t.group;
        switch (t.kind) {
            case Kind::CatalogAll:
                return "SELECT sync.catalog('" + t.qualified() + "')";
            case Kind::CatalogOwn:
            case Kind::CatalogGroup:
                return "SELECT sync.catalog('" + t.qualified() + "', \"to\" => '" + to + "')";
            case Kind::Record:
                return "SELECT sync.record('" + t.qualified() + "'" +
                       (t.record_to_owner ? ", \"to\" => 'owner'" : "") + ")";
            case Kind::Both:
                return "SELECT sync.both('" + t.qualified() + "', \"to\" => '" + to +
                       "', replica_columns => ARRAY['counted', 'memo'])";
        }
        return "";
    }

    std::string create_sql(const Table& t) const {
        std::vector<std::string> parts;
        parts.push_back(key_definition(t.key));
        if (t.kind == Kind::Record) {
            parts.push_back("owner uuid");
            parts.push_back("qty int");
            parts.push_back("note text");
            if (t.late_blocker == 0) {
                parts.push_back("amount numeric");
                parts.push_back("tags jsonb");
                parts.push_back("code text REFERENCES sim.codes");
            }
        } else {
            parts.push_back("n int NOT NULL");
            if (t.group == "owner") parts.push_back("owner uuid");
            if (t.group == "region" || t.group == "crew") parts.push_back(t.group + " int");
            if (t.group == "shift") parts.push_back("shift text");
            parts.push_back("label text");
            for (const Column& c : t.columns) parts.push_back(ident(c.name) + " " + c.type);
            if (t.kind == Kind::Both) {
                parts.push_back("counted numeric");
                parts.push_back("memo text");
            }
        }
        if (scenario_.partitioned) parts.push_back("part text NOT NULL DEFAULT 'p1'");
        if (t.key == KeyKind::Composite) parts.push_back("PRIMARY KEY (a, b)");
        return "CREATE TABLE " + t.qualified() + " (" + join(parts) + ")";
    }

    Table make_table(Kind kind, const std::string& group) {
        Table t;
        t.name = "t" + std::to_string(next_table_++);
        t.kind = kind;
        t.group = group;
        if (kind == Kind::Record) {
            t.name = "r" + t.name.substr(1);
            t.key = KeyKind::Uuid;
            t.record_to_owner = rng_.chance(50);
            return t;
        }
        t.key = static_cast<KeyKind>(rng_.range(0, 4));
        static const std::vector<std::string> types = {
            "numeric", "int[]",  "jsonb",    "bytea", "timestamptz",
            "text",    "float8", "interval", "date",  "sim.mood"};
        int count = static_cast<int>(rng_.range(2, 4));
        std::vector<std::string> chosen = types;
        rng_.shuffle(chosen);
        for (int i = 0; i < count; ++i)
            t.columns.push_back({"c" + std::to_string(next_column_++) + "_" +
                                     (chosen[i] == "int[]"      ? std::string("arr")
                                      : chosen[i] == "sim.mood" ? std::string("mood")
                                                                : chosen[i]),
                                 chosen[i]});
        return t;
    }

    // Creates, declares and fills a table (the declaration before or after the rows).
    void introduce(Table t, const std::string& kind, int rows) {
        tables_.push_back(t);
        Table& table = tables_.back();
        std::string sql = create_sql(table) + ";";
        std::string inserts;
        for (int i = 0; i < rows; ++i) {
            int id = table.next_id++;
            Row row = new_row();
            normalize(table, row);
            table.rows[id] = row;
            auto [columns, values] =
                insert_row(table, id, row, sql_text("row " + std::to_string(id)));
            inserts +=
                (i == 0 ? " INSERT INTO " + table.qualified() + " " + columns + " VALUES " : ", ") +
                values;
        }
        if (!inserts.empty()) inserts += ";";
        if (table.kind == Kind::Record || rng_.chance(50))
            sql += " " + declaration(table) + ";" + inserts;
        else
            sql += inserts + " " + declaration(table) + ";";
        add(kind, Action::Sql, sql).table = table.qualified();
    }

    std::string replica_insert(int n) const {
        const Replica& r = replicas_.at(n);
        std::string columns = "id, active, region, shift";
        std::string values = "'" + replica_uuid(n) + "', " + (r.active ? "true" : "false") + ", " +
                             std::to_string(r.region) + ", '" + shift_name(r.shift) + "'";
        if (scenario_.partitioned) {
            columns += ", part";
            values += ", '" + part_name(r.part) + "'";
        }
        if (crew_) {
            columns += ", crew";
            values += ", " + std::to_string(r.crew);
        }
        return "INSERT INTO sim.devices (" + columns + ") VALUES (" + values + ")";
    }

    Replica new_replica(int n) {
        Replica r;
        r.exists = true;
        r.region = static_cast<int>(rng_.range(1, kRegions));
        r.part = static_cast<int>(rng_.range(1, 2));
        r.shift = static_cast<int>(rng_.range(1, 2));
        r.crew = crew_ ? 1 + (n % 10) % 2 : 0;
        return r;
    }

    std::string replicas_declaration() const {
        return "SELECT sync.replicas('" + std::string(view_ ? "sim.devices_v" : "sim.devices") +
               "', 'devices', live => 'active'" +
               (scenario_.partitioned ? ", partitioned_by => 'part'" : "") + ")";
    }

    // --- set-up -------------------------------------------------------------------------------

    void setup() {
        scenario_.partitioned = rng_.chance(35);
        add("setup", Action::Sql,
            "CREATE SCHEMA sim; CREATE TYPE sim.mood AS ENUM ('calm', 'busy', 'it''s odd'); "
            "CREATE TABLE sim.devices (id uuid PRIMARY KEY, active boolean NOT "
            "NULL "
            "DEFAULT true, region int, shift text" +
                std::string(scenario_.partitioned ? ", part text NOT NULL DEFAULT 'p1'" : "") +
                "); CREATE TABLE sim.codes (code text PRIMARY KEY); INSERT INTO sim.codes VALUES "
                "('c1'), ('c2'), ('c3'); " +
                replicas_declaration() + ";");
        // The replicas come before the tables in some seeds, after them in others.
        bool replicas_first = rng_.chance(50);
        planned_replicas_ = static_cast<int>(rng_.range(3, 8));
        if (replicas_first) add_replicas();

        std::vector<std::pair<Kind, std::string>> kinds = {
            {Kind::CatalogAll, ""},
            {Kind::CatalogOwn, "owner"},
            {Kind::CatalogGroup, "region"},
            {Kind::Record, ""},
            {Kind::Both, rng_.chance(50) ? "owner" : "region"}};
        rng_.shuffle(kinds);
        int count = static_cast<int>(rng_.range(3, 6));
        for (int i = 0; i < count; ++i) {
            auto [kind, group] = i < 5 ? kinds[i] : kinds[static_cast<size_t>(rng_.range(0, 4))];
            if (kind == Kind::Both && i >= 5) group = rng_.chance(50) ? "owner" : "region";
            introduce(make_table(kind, group), "setup",
                      kind == Kind::Record ? 0 : static_cast<int>(rng_.range(3, 25)));
        }
        if (!replicas_first) add_replicas();
    }

    void add_replicas() {
        int replicas = planned_replicas_;
        for (int n = 1; n <= replicas; ++n) {
            replicas_[n] = new_replica(n);
            add("setup", Action::StartReplica, replica_insert(n) + ";", n);
        }
        scenario_.replicas = replicas;
    }

    // --- checkpoints --------------------------------------------------------------------------

    void checkpoint() {
        for (int n : std::set<int>(cut_)) heal(n);
        Step& step = add("checkpoint", Action::Checkpoint);
        step.live = live();
        std::vector<int> keep;
        for (int u : watched_) {
            const Upload& upload = scenario_.uploads[u];
            bool filed = !upload.never && (upload.blocker == 0 || fixed_.count(upload.blocker));
            step.verify.push_back({u, filed});
            if (filed && records_.count(u)) verified_.insert(u);
            // Record rows stay as filed: checked at every checkpoint; a both row or a kept
            // catalog row only at the first.
            if (records_.count(u)) keep.push_back(u);
        }
        watched_ = keep;
        since_checkpoint_ = 0;
    }

    void heal(int n) {
        cut_.erase(n);
        add("heal_line", Action::Heal, "", n);
    }

    // A replica's state changes: its uploads not found filed yet are no longer checked (a
    // replica that is not live is not heard; one that moves may lose the right to its rows).
    void unwatch_replica(int n) {
        watched_.erase(
            std::remove_if(
                watched_.begin(), watched_.end(),
                [&](int u) { return scenario_.uploads[u].replica == n && !verified_.count(u); }),
            watched_.end());
    }
    // The server changed a table: both rows uploaded into it are no longer checked.
    void unwatch_table(const std::string& table) {
        watched_.erase(
            std::remove_if(
                watched_.begin(), watched_.end(),
                [&](int u) { return !records_.count(u) && scenario_.uploads[u].table == table; }),
            watched_.end());
    }

    // --- random steps -------------------------------------------------------------------------

    void random_step() {
        static const std::vector<std::pair<std::string, int>> weights = {
            {"insert", 10},
            {"update", 10},
            {"delete", 5},
            {"pk_change", 3},
            {"truncate", 1},
            {"bulk_insert", 3},
            {"bulk_update", 3},
            {"bulk_delete", 2},
            {"rollback", 2},
            {"big_row", 2},
            {"replica_not_live", 2},
            {"replica_live", 3},
            {"replica_move_group", 3},
            {"replica_move_partition", 2},
            {"replica_delete", 1},
            {"replica_reinsert", 2},
            {"replica_new", 1},
            {"replicas_view", 1},
            {"add_column", 2},
            {"drop_column", 2},
            {"rename_column", 2},
            {"change_type", 2},
            {"rename_table", 1},
            {"drop_table", 1},
            {"new_table", 1},
            {"new_group_table", 1},
            {"new_group_column", 1},
            {"hostile_column", 2},
            {"alter_type", 2},
            {"upload_record", 6},
            {"upload_both", 5},
            {"upload_resend", 2},
            {"upload_failing", 2},
            {"upload_fix", 3},
            {"upload_new_column", 1},
            {"upload_late_table", 1},
            {"declare_late", 2},
            {"upload_catalog", 1},
            {"upload_foreign_both", 1},
            {"upload_crafted", 1},
            {"upload_too_many_rows", 1},
            {"kill_sender", 1},
            {"kill_replica", 1},
            {"kill_relay", 1},
            {"restart_postgres", 1},
            {"cut_line", 1},
            {"heal_line", 2},
            {"cancel_pass", 1},
            {"timeout_pass", 1},
            {"cancel_filing", 1},
            {"timeout_filing", 1},
            {"dump_restore", 1},
            {"recreate_extension", 1},
            {"base_backup", 1},
            {"roll_back", 2},
            {"setting_change", 2}};
        std::vector<std::string> names;
        std::vector<int> w;
        for (const auto& [name, weight] : weights) {
            if (!enabled(name)) continue;
            names.push_back(name);
            w.push_back(weight);
        }
        if (names.empty()) return;  // every kind left out: the set-up and checkpoints alone
        for (int attempt = 0; attempt < 200; ++attempt)
            if (try_step(names[rng_.weighted(w)])) return;
        throw std::runtime_error("the generator found no step it could take");
    }

    bool try_step(const std::string& kind) {
        if (kind == "insert" || kind == "big_row") return insert_or_big(kind);
        if (kind == "update") return update();
        if (kind == "delete") return remove();
        if (kind == "pk_change") return pk_change();
        if (kind == "truncate") return truncate();
        if (kind == "bulk_insert") return bulk_insert();
        if (kind == "bulk_update") return bulk_update();
        if (kind == "bulk_delete") return bulk_delete();
        if (kind == "rollback") return rollback();
        if (kind.rfind("replica", 0) == 0) return replica_step(kind);
        if (kind == "add_column" || kind == "drop_column" || kind == "rename_column" ||
            kind == "change_type")
            return column_step(kind);
        if (kind == "rename_table") return rename_table();
        if (kind == "drop_table") return drop_table();
        if (kind == "new_table") return new_table();
        if (kind == "new_group_table") return new_group_table();
        if (kind == "new_group_column") return new_group_column();
        if (kind.rfind("upload", 0) == 0 || kind == "declare_late") return upload_step(kind);
        if (kind == "hostile_column") return hostile_column();
        if (kind == "alter_type") return alter_type();
        if (kind == "dump_restore" || kind == "recreate_extension" || kind == "base_backup" ||
            kind == "roll_back" || kind == "setting_change")
            return history_step(kind);
        return fault(kind);
    }

    bool insert_or_big(const std::string& kind) {
        std::vector<Table*> tables = server_tables();
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        std::string big = "repeat('big row ', " + std::to_string(rng_.range(1700, 3000)) + ")";
        if (kind == "big_row" && !t.rows.empty() && rng_.chance(50)) {
            int id = pick_row(t);
            add(kind, Action::Sql,
                "UPDATE " + t.qualified() + " SET label = " + big +
                    " WHERE n = " + std::to_string(id));
            unwatch_table(t.qualified());
            return true;
        }
        int id = t.next_id++;
        Row row = new_row();
        normalize(t, row);
        t.rows[id] = row;
        add(kind, Action::Sql, insert_sql(t, id, row, kind == "big_row" ? big : value_of("text")));
        return true;
    }

    bool update() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int id = pick_row(t);
        Row& row = t.rows[id];
        std::string set;
        int choice = static_cast<int>(rng_.range(0, 9));
        if (choice < 2 && !t.group.empty()) {
            Row moved = new_row();
            normalize(t, moved);
            if (t.group == "owner") {
                row.owner = moved.owner;
                set = "owner = " +
                      (row.owner ? "'" + replica_uuid(row.owner) + "'" : std::string("NULL"));
            } else {
                row.group = moved.group;
                set = t.group + " = " + group_literal(t, row.group);
            }
        } else if (choice == 2 && scenario_.partitioned) {
            row.part = 3 - row.part;
            set = "part = '" + part_name(row.part) + "'";
        } else if (choice < 6 || t.columns.empty()) {
            set = "label = " + value_of("text");
        } else {
            const Column& c = rng_.pick(t.columns);
            set = ident(c.name) + " = " + value_of(c.type);
        }
        add("update", Action::Sql,
            "UPDATE " + t.qualified() + " SET " + set + " WHERE n = " + std::to_string(id));
        unwatch_table(t.qualified());
        return true;
    }

    bool remove() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int id = pick_row(t);
        t.rows.erase(id);
        add("delete", Action::Sql,
            "DELETE FROM " + t.qualified() + " WHERE n = " + std::to_string(id));
        unwatch_table(t.qualified());
        return true;
    }

    bool pk_change() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int id = pick_row(t);
        int moved = t.next_id++;
        t.rows[moved] = t.rows[id];
        t.rows.erase(id);
        std::vector<std::string> columns = key_columns(t.key);
        std::vector<std::string> values = key_values(t.key, moved);
        std::string set = columns.size() == 1 ? columns[0] + " = " + values[0]
                                              : "(" + join(columns) + ") = (" + join(values) + ")";
        add("pk_change", Action::Sql,
            "UPDATE " + t.qualified() + " SET " + set + ", n = " + std::to_string(moved) +
                " WHERE n = " + std::to_string(id));
        unwatch_table(t.qualified());
        return true;
    }

    bool truncate() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        t.rows.clear();
        add("truncate", Action::Sql, "TRUNCATE " + t.qualified());
        unwatch_table(t.qualified());
        return true;
    }

    bool bulk_insert() {
        std::vector<Table*> tables = server_tables();
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int from = t.next_id;
        int to = from + static_cast<int>(rng_.range(10, 60));
        t.next_id = to + 1;
        std::vector<int> owners = existing();
        std::vector<std::string> columns = key_columns(t.key);
        std::vector<std::string> values = key_expressions(t.key);
        columns.push_back("n");
        values.push_back("i");
        for (int i = from; i <= to; ++i) {
            Row row;
            row.owner = owners.empty() ? 0 : owners[static_cast<size_t>(i) % owners.size()];
            row.group = 1 + i % (t.group == "region" ? kRegions : 2);
            row.part = 1 + i % 2;
            t.rows[i] = row;
        }
        if (t.group == "owner") {
            columns.push_back("owner");
            std::vector<std::string> ids;
            for (int n : owners) ids.push_back("'" + replica_uuid(n) + "'");
            values.push_back(owners.empty() ? "NULL::uuid"
                                            : "(ARRAY[" + join(ids) + "]::uuid[])[1 + i % " +
                                                  std::to_string(owners.size()) + "]");
        } else if (t.group == "shift") {
            columns.push_back("shift");
            values.push_back("(ARRAY['day', 'night'])[1 + i % 2]");
        } else if (!t.group.empty()) {
            columns.push_back(t.group);
            values.push_back("1 + i % " + std::to_string(t.group == "region" ? kRegions : 2));
        }
        if (scenario_.partitioned) {
            columns.push_back("part");
            values.push_back("'p' || (1 + i % 2)");
        }
        columns.push_back("label");
        values.push_back("'bulk ' || i");
        add("bulk_insert", Action::Sql,
            "INSERT INTO " + t.qualified() + " (" + join(columns) + ") SELECT " + join(values) +
                " FROM generate_series(" + std::to_string(from) + ", " + std::to_string(to) +
                ") i");
        return true;
    }

    bool bulk_update() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int modulus = static_cast<int>(rng_.range(2, 4));
        std::string set = "label = coalesce(label, '') || ' +'";
        if (!t.columns.empty() && rng_.chance(50)) {
            const Column& c = rng_.pick(t.columns);
            set = ident(c.name) + " = NULL";
        }
        add("bulk_update", Action::Sql,
            "UPDATE " + t.qualified() + " SET " + set + " WHERE n % " + std::to_string(modulus) +
                " = " + std::to_string(rng_.range(0, modulus - 1)));
        unwatch_table(t.qualified());
        return true;
    }

    bool bulk_delete() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int modulus = static_cast<int>(rng_.range(3, 5));
        int rest = static_cast<int>(rng_.range(0, modulus - 1));
        for (auto i = t.rows.begin(); i != t.rows.end();)
            i = i->first % modulus == rest ? t.rows.erase(i) : std::next(i);
        add("bulk_delete", Action::Sql,
            "DELETE FROM " + t.qualified() + " WHERE n % " + std::to_string(modulus) + " = " +
                std::to_string(rest));
        unwatch_table(t.qualified());
        return true;
    }

    bool rollback() {
        std::vector<Table*> tables = with_rows(server_tables());
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        int id = t.next_id++;
        Row row = new_row();
        normalize(t, row);
        int other = pick_row(t);
        add("rollback", Action::Sql,
            "BEGIN; " + insert_sql(t, id, row, sql_text("never")) + "; UPDATE " + t.qualified() +
                " SET label = 'never' WHERE n = " + std::to_string(other) + "; DELETE FROM " +
                t.qualified() + " WHERE n <> " + std::to_string(other) + "; ROLLBACK");
        return true;
    }

    std::string replica_update(int n, const std::string& set) const {
        return "UPDATE sim.devices SET " + set + " WHERE id = '" + replica_uuid(n) + "'";
    }

    bool replica_step(const std::string& kind) {
        if (kind == "replica_not_live" || kind == "replica_live") {
            bool to = kind == "replica_live";
            std::vector<int> ids =
                replicas_where([&](const Replica& r) { return r.exists && r.active != to; });
            if (ids.empty()) return false;
            int n = rng_.pick(ids);
            replicas_[n].active = to;
            add(kind, Action::Sql,
                replica_update(n, std::string("active = ") + (to ? "true" : "false")), n);
            unwatch_replica(n);
            return true;
        }
        if (kind == "replica_move_group") {
            std::vector<int> ids = existing();
            if (ids.empty()) return false;
            int n = rng_.pick(ids);
            Replica& r = replicas_[n];
            std::string set;
            int choice = static_cast<int>(rng_.range(0, crew_ ? 2 : 1));
            if (choice == 0) {
                r.region = 1 + r.region % kRegions;
                set = "region = " + std::to_string(r.region);
            } else if (choice == 1) {
                r.shift = 3 - r.shift;
                set = "shift = '" + shift_name(r.shift) + "'";
            } else {
                r.crew = 3 - r.crew;
                set = "crew = " + std::to_string(r.crew);
            }
            add(kind, Action::Sql, replica_update(n, set), n);
            unwatch_replica(n);
            return true;
        }
        if (kind == "replica_move_partition") {
            std::vector<int> ids = existing();
            if (!scenario_.partitioned || ids.empty()) return false;
            int n = rng_.pick(ids);
            replicas_[n].part = 3 - replicas_[n].part;
            add(kind, Action::Sql,
                replica_update(n, "part = '" + part_name(replicas_[n].part) + "'"), n);
            unwatch_replica(n);
            return true;
        }
        if (kind == "replica_delete") {
            std::vector<int> ids = existing();
            if (ids.size() < 2) return false;
            int n = rng_.pick(ids);
            replicas_[n].exists = false;
            add(kind, Action::Sql, "DELETE FROM sim.devices WHERE id = '" + replica_uuid(n) + "'",
                n);
            unwatch_replica(n);
            return true;
        }
        if (kind == "replica_reinsert") {
            std::vector<int> ids = replicas_where([](const Replica& r) { return !r.exists; });
            if (ids.empty()) return false;
            int n = rng_.pick(ids);
            replicas_[n] = new_replica(n);
            add(kind, Action::Sql, replica_insert(n), n);
            return true;
        }
        if (kind == "replica_new") {
            if (scenario_.replicas >= 9) return false;
            int n = ++scenario_.replicas;
            replicas_[n] = new_replica(n);
            add(kind, Action::StartReplica, replica_insert(n), n);
            return true;
        }
        if (kind == "replicas_view") {
            if (view_) return false;
            view_ = true;
            add(kind, Action::Sql,
                "CREATE VIEW sim.devices_v AS SELECT * FROM sim.devices; " +
                    replicas_declaration());
            return true;
        }
        return false;
    }

    bool column_step(const std::string& kind) {
        std::vector<Table*> tables = server_tables();
        if (kind != "add_column") {
            tables.erase(std::remove_if(tables.begin(), tables.end(),
                                        [](Table* t) { return t->columns.empty(); }),
                         tables.end());
        }
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        std::string sql = "ALTER TABLE " + t.qualified() + " ";
        if (kind == "add_column") {
            Column c{"c" + std::to_string(next_column_++) + "_added",
                     rng_.chance(50) ? "numeric" : "text"};
            sql += "ADD COLUMN " + ident(c.name) + " " + c.type + " DEFAULT " +
                   (c.type == "numeric" ? "2.5" : "'added'");
            t.columns.push_back(c);
        } else {
            size_t index =
                static_cast<size_t>(rng_.range(0, static_cast<int64_t>(t.columns.size()) - 1));
            Column& c = t.columns[index];
            if (kind == "drop_column") {
                sql += "DROP COLUMN " + ident(c.name);
                t.columns.erase(t.columns.begin() + static_cast<long>(index));
            } else if (kind == "rename_column") {
                std::string name = "c" + std::to_string(next_column_++) + "_renamed";
                sql += "RENAME COLUMN " + ident(c.name) + " TO " + ident(name);
                c.name = name;
            } else {
                if (c.type == "text") return false;
                std::string using_ = c.type == "bytea" ? "encode(" + ident(c.name) + ", 'hex')"
                                                       : ident(c.name) + "::text";
                if (c.type == "int[]") {
                    sql += "ALTER COLUMN " + ident(c.name) + " TYPE bigint[]";
                    c.type = "bigint[]";
                } else {
                    sql += "ALTER COLUMN " + ident(c.name) + " TYPE text USING " + using_;
                    c.type = "text";
                }
            }
        }
        add(kind, Action::Sql, sql).table = t.qualified();
        unwatch_table(t.qualified());
        return true;
    }

    bool rename_table() {
        std::vector<Table*> tables = server_tables();
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        std::string old = t.qualified();
        t.name += "_r" + std::to_string(next_table_++);
        add("rename_table", Action::Sql,
            "ALTER TABLE " + old + " RENAME TO " + t.name + "; " + declaration(t));
        unwatch_table(old);
        return true;
    }

    bool drop_table() {
        std::vector<Table*> tables = server_tables();
        if (tables.size() < 2) return false;
        Table* t = rng_.pick(tables);
        std::string sql =
            rng_.chance(50)
                ? "SELECT sync.drop('" + t->qualified() + "'); DROP TABLE " + t->qualified()
                : "DROP TABLE " + t->qualified() + "; DELETE FROM sync.codec WHERE table_name = '" +
                      t->qualified() + "'";
        add("drop_table", Action::Sql, sql);
        unwatch_table(t->qualified());
        tables_.erase(
            std::find_if(tables_.begin(), tables_.end(), [&](const Table& x) { return &x == t; }));
        return true;
    }

    bool new_table() {
        if (tables_.size() >= 9) return false;
        static const std::vector<Kind> kinds = {Kind::CatalogAll, Kind::CatalogOwn,
                                                Kind::CatalogGroup, Kind::Both};
        Kind kind = rng_.pick(kinds);
        std::string group = kind == Kind::CatalogOwn     ? "owner"
                            : kind == Kind::CatalogGroup ? "region"
                                                         : "";
        if (kind == Kind::Both) group = rng_.chance(50) ? "owner" : "region";
        introduce(make_table(kind, group), "new_table", static_cast<int>(rng_.range(2, 12)));
        return true;
    }

    bool new_group_table() {
        if (shift_used_) return false;
        shift_used_ = true;
        introduce(make_table(Kind::CatalogGroup, "shift"), "new_group_table",
                  static_cast<int>(rng_.range(3, 12)));
        return true;
    }

    bool new_group_column() {
        if (crew_) return false;
        crew_ = true;
        std::string sql =
            "ALTER TABLE sim.devices ADD COLUMN crew int; UPDATE sim.devices SET crew = 1 + "
            "(right(id::text, 1)::int % 2);";
        for (auto& [n, r] : replicas_) r.crew = 1 + (n % 10) % 2;
        add("new_group_column", Action::Sql, sql);
        // The view that shows it, in a transaction of its own: one that altered the table and then
        // the view took their locks in the order opposite to a reader of the view (the relay),
        // and deadlocked with it, as any view reader would.
        if (view_)
            add("new_group_column", Action::Sql,
                "CREATE OR REPLACE VIEW sim.devices_v AS SELECT * FROM sim.devices");
        introduce(make_table(Kind::CatalogGroup, "crew"), "new_group_column",
                  static_cast<int>(rng_.range(3, 12)));
        return true;
    }

    // A column of a server table named after a word our SQL uses, or so that only quoting holds.
    bool hostile_column() {
        std::vector<Table*> tables = server_tables();
        if (tables.empty()) return false;
        Table& t = *rng_.pick(tables);
        std::set<std::string> taken = {"id",     "a",     "b",    "n",    "label",   "owner",
                                       "region", "shift", "crew", "part", "counted", "memo"};
        for (const Column& c : t.columns) taken.insert(c.name);
        std::vector<std::string> free;
        for (const std::string& name : hostile_names())
            if (!taken.count(name)) free.push_back(name);
        if (free.empty()) return false;
        Column c{rng_.pick(free), rng_.chance(50) ? "text" : "numeric"};
        add("hostile_column", Action::Sql,
            "ALTER TABLE " + t.qualified() + " ADD COLUMN " + ident(c.name) + " " + c.type +
                " DEFAULT " + value_of(c.type))
            .table = t.qualified();
        t.columns.push_back(c);
        unwatch_table(t.qualified());
        return true;
    }

    // A value of the enum the tables' mood columns hold renamed (every row holding it changes
    // text without an UPDATE), or one added.
    bool alter_type() {
        bool used = false;
        for (const Table& t : tables_)
            for (const Column& c : t.columns) used = used || c.type == "sim.mood";
        if (!used) return false;
        if (rng_.chance(60)) {
            std::string& label =
                moods_[static_cast<size_t>(rng_.range(0, static_cast<int64_t>(moods_.size()) - 1))];
            std::string renamed = "mood " + std::to_string(next_mood_++);
            add("alter_type", Action::Sql,
                "ALTER TYPE sim.mood RENAME VALUE " + sql_text(label) + " TO " + sql_text(renamed));
            label = renamed;
        } else {
            moods_.push_back("added " + std::to_string(next_mood_++));
            add("alter_type", Action::Sql,
                "ALTER TYPE sim.mood ADD VALUE " + sql_text(moods_.back()));
        }
        for (const Table& t : tables_) unwatch_table(t.qualified());
        return true;
    }

    // --- PostgreSQL's own operations ----------------------------------------------------------

    // What a base backup holds of the generator's picture, and what a roll back restores.
    struct Snapshot {
        std::list<Table> tables;
        std::map<int, Replica> replicas;
        bool view = false, crew = false, shift_used = false;
        std::map<int, std::string> blockers;
        std::set<int> fixed;
        std::vector<int> watched;
        std::set<int> uploaded;
        std::vector<std::string> moods;
    };

    bool history_step(const std::string& kind) {
        if (kind == "dump_restore") {
            add(kind, Action::DumpRestore);
            return true;
        }
        if (kind == "recreate_extension") {
            std::string sql = "DROP EXTENSION magic_sync CASCADE; CREATE EXTENSION magic_sync; " +
                              replicas_declaration() + ";";
            for (const Table& t : tables_)
                if (t.declared) sql += " " + declaration(t) + ";";
            add(kind, Action::RecreateExtension, sql);
            // What the extension kept went with it: the uploads kept (their rows are never
            // filed) and the ids of those filed. Record rows found filed stay in their tables.
            watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                          [&](int u) { return !verified_.count(u); }),
                           watched_.end());
            return true;
        }
        if (kind == "base_backup") {
            checkpoint();  // every upload so far found filed or kept: the backup holds it so
            add(kind, Action::BaseBackup);
            backup_ = Snapshot{tables_,   replicas_, view_,    crew_,     shift_used_,
                               blockers_, fixed_,    watched_, uploaded_, moods_};
            return true;
        }
        if (kind == "roll_back") {
            if (!backup_) return false;
            add(kind, Action::RollBack);
            tables_ = backup_->tables;
            replicas_ = backup_->replicas;
            view_ = backup_->view;
            crew_ = backup_->crew;
            shift_used_ = backup_->shift_used;
            blockers_ = backup_->blockers;
            fixed_ = backup_->fixed;
            watched_ = backup_->watched;
            moods_ = backup_->moods;
            // Replicas made after the backup are gone from the devices table (their processes
            // go on, unheard); their numbers are not given again.
            uploaded_.clear();
            for (int n : backup_->uploaded)
                if (replicas_.count(n)) uploaded_.insert(n);
            return true;
        }
        static const std::vector<std::pair<std::string, std::vector<std::string>>> settings = {
            {"datestyle", {"'SQL, DMY'", "'German'", "'Postgres, MDY'", "'ISO, YMD'"}},
            {"timezone", {"'Asia/Kolkata'", "'America/St_Johns'", "'UTC'"}},
            {"intervalstyle", {"'sql_standard'", "'postgres_verbose'", "'iso_8601'"}},
            {"extra_float_digits", {"-3", "0", "3"}},
            {"bytea_output", {"'escape'", "'hex'"}}};
        const auto& [name, values] = rng_.pick(settings);
        add(kind, Action::SettingChange,
            "ALTER DATABASE sim SET " + name + " = " + rng_.pick(values));
        return true;
    }

    // --- uploads ------------------------------------------------------------------------------

    int next_record() { return ++records_made_; }
    static std::string record_uuid(int i) {
        char id[40];
        snprintf(id, sizeof id, "bbbbbbbb-0000-4000-8000-%012d", i);
        return id;
    }

    // Queues a write of replica n and the upload it must come to.
    void write(const std::string& kind, int n, const std::string& table, const nlohmann::json& row,
               const nlohmann::json& key, const std::string& key_columns, int blocker, bool never,
               bool record) {
        Step& step = upload(kind, n, table, row.dump(), key, blocker, Action::Write, never);
        step.json = row.dump();
        step.key_columns = key_columns;
        if (record) records_.insert(step.upload);
    }

    // An upload of `row` (JSON text) into `table` by replica n, watched until a checkpoint finds
    // it filed (or kept, when `never` or blocked); the step that makes it is returned.
    Step& upload(const std::string& kind, int n, const std::string& table, const std::string& row,
                 const nlohmann::json& key, int blocker, Action action, bool never = false) {
        Upload upload;
        upload.replica = n;
        upload.table = table;
        upload.key = key.dump();
        upload.contains = row;
        upload.blocker = blocker;
        upload.never = never;
        // A replica that writes a row again before the first write is sent sends only the last,
        // so an earlier write of the same row, not yet found filed, is no longer checked. Two
        // replicas that write one row (a both row of a group) are filed in whichever order their
        // uploads come: neither is checked.
        bool contested = false;
        watched_.erase(
            std::remove_if(watched_.begin(), watched_.end(),
                           [&](int u) {
                               const Upload& earlier = scenario_.uploads[u];
                               const bool same = earlier.table == table &&
                                                 earlier.key == upload.key && !verified_.count(u);
                               if (same && earlier.replica != n && !earlier.never && !never)
                                   contested = true;
                               return same && (earlier.replica == n || contested);
                           }),
            watched_.end());
        scenario_.uploads.push_back(upload);
        int u = static_cast<int>(scenario_.uploads.size()) - 1;
        Step& step = add(kind, action, "", n);
        step.table = table;
        step.upload = u;
        if (!contested) watched_.push_back(u);
        if (action == Action::Write) uploaded_.insert(n);  // the reference replica's: sent again
        return step;
    }

    nlohmann::json record_row(const Table& t, int n, int id) {
        nlohmann::json row = {{"id", record_uuid(id)},
                              {"owner", replica_uuid(n)},
                              {"qty", rng_.range(1, 99)},
                              {"note", rng_.chance(50) ? "it's \"noted\"\nünï ✓" : "plain note"}};
        if (t.late_blocker == 0) {
            row["amount"] = static_cast<double>(rng_.range(0, 9999)) / 4.0;
            row["tags"] = {{"k", {1, "é", nullptr}}};
            row["code"] = "c" + std::to_string(rng_.range(1, 3));
        }
        if (scenario_.partitioned) row["part"] = part_name(replicas_.at(n).part);
        return row;
    }

    bool upload_step(const std::string& kind) {
        std::vector<int> ids = live();
        if (kind == "upload_resend") {
            std::vector<int> senders;
            for (int n : uploaded_)
                if (replicas_.at(n).live()) senders.push_back(n);
            if (senders.empty()) return false;
            add(kind, Action::Resend, "", rng_.pick(senders));
            return true;
        }
        if (kind == "upload_fix") {
            std::vector<int> open;
            for (const auto& [b, fix] : blockers_)
                if (!fixed_.count(b) && !fix.empty()) open.push_back(b);
            if (open.empty()) return false;
            int b = rng_.pick(open);
            fixed_.insert(b);
            add(kind, Action::Sql, blockers_[b]).unblocks = b;
            return true;
        }
        if (kind == "declare_late") {
            std::vector<Table*> late = tables_where([](const Table& t) { return !t.declared; });
            if (late.empty()) return false;
            Table& t = *rng_.pick(late);
            t.declared = true;
            fixed_.insert(t.late_blocker);
            add(kind, Action::Sql, declaration(t)).unblocks = t.late_blocker;
            return true;
        }
        if (ids.empty()) return false;
        int n = rng_.pick(ids);
        if (kind == "upload_record" || kind == "upload_failing" || kind == "upload_new_column") {
            std::vector<Table*> tables = tables_where([](const Table& t) {
                return t.kind == Kind::Record && t.declared && t.late_blocker == 0;
            });
            if (tables.empty()) return false;
            Table& t = *rng_.pick(tables);
            int id = next_record();
            nlohmann::json row = record_row(t, n, id);
            int blocker = 0;
            if (kind == "upload_new_column") {
                // A device one version ahead: kept, naming the column, until the column is added.
                blocker = next_blocker_++;
                std::string column = "ahead_" + std::to_string(blocker);
                row[column] = "from version " + std::to_string(blocker);
                blockers_[blocker] =
                    "ALTER TABLE " + t.qualified() + " ADD COLUMN " + column + " text";
            } else if (kind == "upload_failing") {
                blocker = next_blocker_++;
                if (rng_.chance(50)) {
                    std::string constraint = "qty_limit_" + std::to_string(blocker);
                    // Refuses this row alone: a check that refused every blocked row would keep
                    // an earlier one after its own fix.
                    add(kind, Action::Sql,
                        "ALTER TABLE " + t.qualified() + " ADD CONSTRAINT " + constraint +
                            " CHECK (qty <> " + std::to_string(5000 + blocker) + ") NOT VALID");
                    blockers_[blocker] =
                        "ALTER TABLE " + t.qualified() + " DROP CONSTRAINT " + constraint;
                    row["qty"] = 5000 + blocker;
                } else {
                    std::string code = "late-" + std::to_string(blocker);
                    blockers_[blocker] = "INSERT INTO sim.codes VALUES ('" + code + "')";
                    row["code"] = code;
                }
            }
            write(kind, n, t.qualified(), row, {{"id", record_uuid(id)}}, "id", blocker, false,
                  true);
            return true;
        }
        if (kind == "upload_crafted") {
            // Not the reference replica: a device of another make, whose JSON numbers are not
            // doubles and whose holds name any scope (only the replica's own are kept). Its
            // record row is filed, 1e400 exactly in a numeric column, unless the table's rows go
            // back down to their owner: then it is kept (a replica may read numbers as doubles).
            std::vector<Table*> tables = tables_where([](const Table& t) {
                return t.kind == Kind::Record && t.declared && t.late_blocker == 0;
            });
            if (tables.empty()) return false;
            Table& t = *rng_.pick(tables);
            int id = next_record();
            nlohmann::json row = record_row(t, n, id);
            row.erase("amount");
            const std::string text = "{\"amount\":1e400," + row.dump().substr(1);
            char upload_id[40];
            snprintf(upload_id, sizeof upload_id, "cccccccc-0000-4000-8000-%012d", id);
            const std::string zero_fp(64, '0');
            const std::string holds = "{\"region=999\":{\"through\":1,\"fp\":\"" + zero_fp +
                                      "\",\"n\":0},\"owner=" + replica_uuid(n + 100) +
                                      "\":{\"through\":1,\"fp\":\"" + zero_fp + "\",\"n\":0}}";
            Step& step = upload(kind, n, t.qualified(), text, {{"id", record_uuid(id)}}, 0,
                                Action::Receive, t.record_to_owner);
            step.json = std::string("{\"v\":1,\"id\":\"") + upload_id + "\",\"rows\":[{\"t\":\"" +
                        t.qualified() + "\",\"r\":" + text + "}],\"holds\":" + holds + "}";
            step.answer = "filed";
            scenario_.uploads[step.upload].crafted = true;
            records_.insert(step.upload);
            return true;
        }
        if (kind == "upload_too_many_rows") {
            // Refused while it is read, kept whole and answered with the limit named: never filed.
            const int id = next_record();
            const std::string marker = "too-many-" + std::to_string(id);
            const std::string row = "{\"t\":\"sim.r2\",\"r\":{\"note\":\"" + marker + "\"}}";
            char upload_id[40];
            snprintf(upload_id, sizeof upload_id, "dddddddd-0000-4000-8000-%012d", id);
            std::string rows;
            for (int i = 0; i <= kMaxUploadRows; ++i) rows += (i ? "," : "") + row;
            Step& step =
                upload(kind, n, "sim.r2", "{}", {{"note", marker}}, 0, Action::Receive, true);
            step.json =
                std::string("{\"v\":1,\"id\":\"") + upload_id + "\",\"rows\":[" + rows + "]}";
            step.answer = "kept";
            scenario_.uploads[step.upload].crafted = true;
            return true;
        }
        if (kind == "upload_late_table") {
            std::vector<Table*> late = tables_where([](const Table& t) { return !t.declared; });
            Table* t = late.empty() ? nullptr : late.front();
            if (!t) {
                if (tables_.size() >= 9) return false;
                Table made = make_table(Kind::Record, "");
                made.name = "late" + made.name.substr(1);
                made.declared = false;
                made.record_to_owner = false;
                made.late_blocker = next_blocker_++;
                blockers_[made.late_blocker] = "";
                add(kind, Action::Sql, create_sql(made));
                tables_.push_back(made);
                t = &tables_.back();
            }
            int id = next_record();
            write(kind, n, t->qualified(), record_row(*t, n, id), {{"id", record_uuid(id)}}, "id",
                  t->late_blocker, false, true);
            return true;
        }
        if (kind == "upload_both" || kind == "upload_catalog" || kind == "upload_foreign_both") {
            Kind wanted = kind == "upload_catalog" ? Kind::CatalogAll : Kind::Both;
            // Its own rows; for upload_foreign_both, rows it is not sent.
            bool own = kind != "upload_foreign_both";
            std::vector<std::pair<Table*, int>> rows;
            for (Table& t : tables_) {
                if (t.kind != wanted || !t.declared) continue;
                for (const auto& [id, row] : t.rows)
                    if (holds(n, t, row) == own) rows.push_back({&t, id});
            }
            if (rows.empty()) return false;
            auto [t, id] =
                rows[static_cast<size_t>(rng_.range(0, static_cast<int64_t>(rows.size()) - 1))];
            nlohmann::json key = key_json(t->key, id);
            nlohmann::json row = key;
            if (wanted == Kind::Both) {
                row["counted"] = rng_.range(0, 100000) / 100.0;
                row["memo"] =
                    rng_.chance(50) ? "counted by \"" + std::to_string(n) + "\"\nok" : "memo ✓";
            } else {
                row["label"] = "written by a replica";
            }
            write(kind, n, t->qualified(), row, key, join(key_columns(t->key), ","), 0,
                  kind != "upload_both", false);
            return true;
        }
        return false;
    }

    // --- faults -------------------------------------------------------------------------------

    bool fault(const std::string& kind) {
        std::vector<int> ids;
        for (int n = 1; n <= scenario_.replicas; ++n) ids.push_back(n);
        if (kind == "kill_sender") {
            add(kind, Action::KillSender);
        } else if (kind == "kill_replica") {
            add(kind, Action::KillReplica, "", rng_.pick(ids));
        } else if (kind == "kill_relay") {
            add(kind, Action::KillRelay);
        } else if (kind == "restart_postgres") {
            add(kind, Action::RestartPostgres);
        } else if (kind == "cut_line") {
            std::vector<int> whole;
            for (int n : ids)
                if (!cut_.count(n)) whole.push_back(n);
            if (whole.empty()) return false;
            int n = rng_.pick(whole);
            cut_.insert(n);
            add(kind, Action::Cut, "", n);
        } else if (kind == "heal_line") {
            if (cut_.empty()) return false;
            heal(rng_.pick(std::vector<int>(cut_.begin(), cut_.end())));
        } else if (kind == "cancel_pass" || kind == "timeout_pass") {
            // A change the pass must plan, of a row whose table is locked when it reads it.
            std::vector<Table*> tables = with_rows(server_tables());
            if (tables.empty()) return false;
            Table& t = *rng_.pick(tables);
            Step& step =
                add(kind, Action::PassFault,
                    "UPDATE " + t.qualified() + " SET label = coalesce(label, '') || ' !'" +
                        " WHERE n = " + std::to_string(pick_row(t)));
            step.table = t.qualified();
            step.how = kind == "cancel_pass" ? "cancel" : "timeout";
            unwatch_table(t.qualified());
        } else if (kind == "cancel_filing" || kind == "timeout_filing") {
            // A device's upload of a record row into a locked table: not filed, nothing kept, then
            // filed once when it is sent again.
            std::vector<int> live_ids = live();
            std::vector<Table*> tables = tables_where([](const Table& t) {
                return t.kind == Kind::Record && t.declared && t.late_blocker == 0;
            });
            if (live_ids.empty() || tables.empty()) return false;
            int n = rng_.pick(live_ids);
            Table& t = *rng_.pick(tables);
            int id = next_record();
            const std::string row = record_row(t, n, id).dump();
            char upload_id[40];
            snprintf(upload_id, sizeof upload_id, "eeeeeeee-0000-4000-8000-%012d", id);
            Step& step = upload(kind, n, t.qualified(), row, {{"id", record_uuid(id)}}, 0,
                                Action::FilingFault);
            step.json = std::string("{\"v\":1,\"id\":\"") + upload_id + "\",\"rows\":[{\"t\":\"" +
                        t.qualified() + "\",\"r\":" + row + "}]}";
            step.answer = "filed";
            step.how = kind == "cancel_filing" ? "cancel" : "timeout";
            scenario_.uploads[step.upload].crafted = true;
            records_.insert(step.upload);
        } else {
            return false;
        }
        return true;
    }

    Rng rng_;
    std::set<std::string> without_;
    Scenario scenario_;
    std::list<Table> tables_;  // a list: steps hold pointers to tables while others are added
    std::map<int, Replica> replicas_;
    bool view_ = false;
    bool crew_ = false;
    bool shift_used_ = false;
    int next_table_ = 1;
    int next_column_ = 1;
    int next_blocker_ = 1;
    int records_made_ = 0;
    int since_checkpoint_ = 0;
    int planned_replicas_ = 0;
    std::set<int> cut_;
    std::map<int, std::string> blockers_;  // blocker → the SQL that fixes it ("" for a late table)
    std::set<int> fixed_;
    std::vector<int> watched_;  // uploads checked at the next checkpoint
    std::set<int> records_;     // uploads of record rows
    std::set<int> verified_;    // record uploads a checkpoint found filed: they stay so
    std::set<int> uploaded_;    // replicas that made an upload
    std::vector<std::string> moods_ = {"calm", "busy", "it's odd"};  // sim.mood's labels
    int next_mood_ = 1;
    std::optional<Snapshot> backup_;  // the picture at the last base backup
};

}  // namespace

Scenario generate(uint64_t seed, int steps, const std::set<std::string>& without) {
    for (const std::string& name : without) {
        bool known = false;
        for (const StepKind& k : step_kinds()) known = known || k.name == name || k.group == name;
        if (!known) throw std::invalid_argument("--without: no step kind or group named " + name);
    }
    return Generator(seed, without).run(steps);
}

}  // namespace magic_sync::sim
