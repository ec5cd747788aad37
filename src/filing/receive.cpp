// sync.receive(replica, message) (docs/DESIGN.md §6): files an upload in the caller's transaction,
// as the caller (or as magic_sync.role), after the senders' known and filing hooks. Besides the
// app's own tables it writes only what the relay reads later (sync.upload, sync.answer,
// sync.confirmation, sync.holding, sync.set_aside), through the SECURITY DEFINER helpers of
// receive.sql, and never a row that the relay pass locks.
//
// sync_internal.refile(ids) files again what receive kept (the retry of set_aside.sql): each kept
// item as the role and under the settings the route had, after the same hooks, by the same code.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "pg/bridge.hpp"
#include "pg/release.hpp"
#include "pg/session.hpp"
#include "pg/settings.hpp"
#include "pg/spi.hpp"
#include "pg/values.hpp"
#include "pg/wake.hpp"
#include "protocol/canonical.hpp"
#include "protocol/messages.hpp"
#include "protocol/upload_fields.hpp"
#include "state/codec.hpp"

namespace magic_sync::filing {

namespace {

using pg::Param;
using pg::Spi;
using pg::Value;

// The upload speaks a later protocol than this build: 55000 (object not in prerequisite state),
// because this server is not ready for it yet. The app keeps the upload and sends it again after
// the upgrade; not 40001, which drivers retry at once, in vain.
constexpr int kNotYet = ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;

// Errors that say nothing about the row being filed (pg::is_transient) fail the whole receive,
// and the app sends again; they end a retry of kept uploads too, whose items keep their reasons.
using pg::is_transient;

using protocol::json_string;
using protocol::Member;
using protocol::member;
using protocol::members_of;

using Column = state::CodecColumn;

// A codec as filing writes it: the engine's (an undeclared table's: kind "undeclared", its key
// columns alone), with what the upload's replica adds.
struct FilingCodec : state::Codec {
    std::string stamps;                  // {"column": value from known, ...}
    std::vector<std::string> key_order;  // key columns' JSON names: the canonical member order
    std::string replicas;                // the replicas relation, of the row `r` of both_audience
};

// What the senders' hooks say of the replica that files: what known() returned (none, with which
// hook said so, when it is not known), and its row of the replicas relation (jsonb).
struct Known {
    Value known;
    std::string unknown_because;
    Value replica_row;
    Value replicas;  // the replicas relation, quoted
    // The last change of what filing depends on committed before the declarations were read: a
    // row kept now is tried again after any later one (sync_internal.keep_upload).
    Value change;
    Value origin;  // the history the relay writes in
};

// The codecs of the tables an upload names, by table, with the stamps of what known() returned.
std::map<std::string, FilingCodec> load_codecs(Spi& spi, const std::vector<protocol::UpRow>& rows,
                                               const Known& known) {
    std::set<std::string> names;
    for (const auto& row : rows) names.insert(row.table);
    const std::vector<std::string> tables(names.begin(), names.end());
    std::vector<state::Codec> declared;
    std::vector<pg::Row> undeclared;
    pg::as_extension_owner([&] {
        declared = state::load_codecs(spi, {}, tables);
        undeclared = spi.query("SELECT * FROM sync_internal.receive_undeclared($1::text[])",
                               {Param::text_array(tables)});
    });
    std::map<std::string, FilingCodec> codecs;
    for (state::Codec& codec : declared) {
        const std::string table = codec.table_name;
        static_cast<state::Codec&>(codecs[table]) = std::move(codec);
    }
    for (const auto& row : undeclared) {
        FilingCodec& codec = codecs[row["table_name"].value()];
        codec.table_name = codec.relation = row["table_name"].value();
        codec.kind = "undeclared";
        codec.audience = "nobody";
        Column column;
        column.name = row["column_name"].value();
        column.quoted = pg::quote_identifier(column.name);
        column.json_name = json_string(column.name);
        column.key = true;
        codec.columns.push_back(std::move(column));
    }
    if (codecs.empty()) return codecs;
    std::string canonical_known;  // what known_members point into
    try {
        canonical_known = protocol::canonical_json(known.known.value_or("{}"));
    } catch (const protocol::DecodeError& e) {
        throw Error(std::string("what known() returned cannot be read for stamps: ") + e.what(),
                    ERRCODE_INVALID_PARAMETER_VALUE);
    }
    const std::vector<Member> known_members = members_of(canonical_known);
    for (auto& [table, codec] : codecs) {
        codec.replicas = known.replicas.value_or("");
        std::vector<const Column*> keys;
        for (const Column& column : codec.columns) {
            if (column.key) keys.push_back(&column);
            if (!column.stamp) continue;
            std::string value(member(known_members, column.json_name).value_or("null"));
            codec.stamps += (codec.stamps.empty() ? "{" : ",") + column.json_name + ":" + value;
        }
        codec.stamps = codec.stamps.empty() ? "{}" : codec.stamps + "}";
        // Canonical JSON orders members by their bytes, as std::string compares.
        std::sort(keys.begin(), keys.end(),
                  [](const Column* a, const Column* b) { return a->name < b->name; });
        for (const Column* column : keys) codec.key_order.push_back(column->json_name);
    }
    return codecs;
}

// What a row's statement writes: on insert the key, the stamps and the columns the codec takes
// that the row has; on conflict (both) those columns alone. A both row that changes columns also
// carries, into the insert it starts as, the stored value of every column it cannot be without
// and may not write (`stored`): PostgreSQL checks NOT NULL before it finds the conflict, so
// without it no such row could be changed; a new row still fails there, as it must.
struct Shape {
    std::vector<const Column*> insert;
    std::vector<const Column*> stored;
    std::vector<const Column*> update;
    bool operator==(const Shape& other) const {
        return insert == other.insert && stored == other.stored && update == other.update;
    }
};

Shape shape_of(const FilingCodec& codec, const std::vector<Member>& members) {
    Shape shape;
    for (const Column& column : codec.columns) {
        bool present = column.may_file && member(members, column.json_name).has_value();
        if (column.key || column.stamp || present) shape.insert.push_back(&column);
        if (codec.kind == "both" && present && !column.key && !column.stamp)
            shape.update.push_back(&column);
    }
    if (!shape.update.empty())
        for (const Column& column : codec.columns)
            if (column.required && !column.key && !column.stamp && !column.may_file)
                shape.stored.push_back(&column);
    return shape;
}

// Rows come as a JSON array ($1), in order; stamps ($2) override what the replica sent. Every
// value is a bound parameter, every identifier comes from the catalog, quoted. A both row changes
// only when the stored row is the replica's ($3, its row of the replicas relation), and each row
// the statement wrote says whether it is the replica's after it (returned).
std::string insert_statement(const FilingCodec& codec, const Shape& shape) {
    std::string columns, values, keys, sets;
    bool stamped = false;
    for (const Column* column : shape.insert) {
        columns += (columns.empty() ? "" : ", ") + column->quoted;
        values += (values.empty() ? "" : ", ") + std::string(column->stamp ? "s." : "p.") +
                  column->quoted;
        stamped = stamped || column->stamp;
    }
    for (const Column* column : shape.stored) {
        columns += ", " + column->quoted;
        values += ", o." + column->quoted;
    }
    std::string stored_join;
    for (const Column& column : codec.columns) {
        if (!column.key) continue;
        keys += (keys.empty() ? "" : ", ") + column.quoted;
        if (!shape.stored.empty())
            stored_join +=
                (stored_join.empty() ? " LEFT JOIN " + codec.relation + " o ON o." : " AND o.") +
                column.quoted + " = p." + column.quoted;
    }
    for (const Column* column : shape.update)
        sets += (sets.empty() ? "" : ", ") + column->quoted + " = excluded." + column->quoted;
    std::string mine, returning;
    if (codec.both_audience) {
        mine = "EXISTS (SELECT FROM jsonb_populate_record(NULL::" + codec.replicas +
               ", $3::jsonb) r WHERE " + *codec.both_audience + ")";
        returning = " RETURNING " + mine + " AS replicas_own";
    }
    return "INSERT INTO " + codec.relation + " AS t (" + columns + ") SELECT " + values +
           " FROM jsonb_populate_recordset(NULL::" + codec.relation +
           ", $1::jsonb) WITH ORDINALITY AS p" +
           (stamped
                ? " CROSS JOIN jsonb_populate_record(NULL::" + codec.relation + ", $2::jsonb) AS s"
                : "") +
           stored_join + " ORDER BY p.ordinality ON CONFLICT (" + keys + ") " +
           (sets.empty() ? "DO NOTHING"
                         : "DO UPDATE SET " + sets + (mine.empty() ? "" : " WHERE " + mine)) +
           returning;
}

// A both row of another replica's, or one the upload would move out of its own: kept.
class NotItsRow : public std::runtime_error {
  public:
    NotItsRow()
        : std::runtime_error(
              "the row is not one this replica is sent: a replica changes only its own rows of a"
              " both table, and cannot move one out of them") {}
};

// Failures that the data may cure (a parent row that comes later, a duplicate that goes, a check
// a trigger makes): the retry tries them again, backed off. Any other failure (a type, a check
// constraint, a privilege, a policy, a table that does not sync) waits for a change of what
// filing depends on: a deploy, a declaration, a grant.
bool data_may_cure(int sqlstate) {
    switch (sqlstate) {
        case ERRCODE_FOREIGN_KEY_VIOLATION:
        case ERRCODE_UNIQUE_VIOLATION:
        case ERRCODE_EXCLUSION_VIOLATION:
        case ERRCODE_RAISE_EXCEPTION:
            return true;
        default:
            return false;
    }
}

std::string reason_of(const Error& error) {
    std::string reason = error.what();
    if (!error.detail().empty()) reason += " (" + error.detail() + ")";
    return reason;
}

// A row not filed: named in the answer (t, k, why) and set aside whole with the reason.
struct Kept {
    size_t row;  // its place among the rows filed
    std::string table;
    std::string key;
    std::string why;
    std::string reason;
    std::string body;  // {"t":..,"r":..} as uploaded
    bool waits;        // for a change of what filing depends on (see data_may_cure)
};

Kept kept_row(size_t i, const protocol::UpRow& row, std::string key, const std::string& why) {
    return {i, row.table, std::move(key), why, why, protocol::kept_body(row), true};
}

Kept failed_row(size_t i, const protocol::UpRow& row, std::string key, const pg::PgError& error) {
    return {i,
            row.table,
            std::move(key),
            error.what(),
            reason_of(error),
            protocol::kept_body(row),
            !data_may_cure(error.sqlstate())};
}

std::string kept_json(const std::vector<Kept>& kept) {
    std::string out = "[";
    for (const Kept& k : kept) {
        out += (out.size() > 1 ? ",{\"t\":" : "{\"t\":") + json_string(k.table) +
               ",\"k\":" + k.key + ",\"why\":" + json_string(k.why) +
               ",\"reason\":" + json_string(k.reason) + ",\"body\":" + json_string(k.body) +
               ",\"waits\":" + (k.waits ? "true" : "false") + "}";
    }
    return out + "]";
}

// Consecutive rows of one codec and shape, filed by one statement in a subtransaction; when it
// fails, each row in its own, so a row that fails is kept and the others are filed.
struct Run {
    const FilingCodec* codec = nullptr;
    Shape shape;
    std::vector<size_t> rows;
    std::vector<std::string> keys;
};

// What a filed `both` row leaves for the relay, so that the row is not sent back to the replica
// that uploaded it when that replica holds it as filed: {"t", "k", "r"}, the row as uploaded.
void note_echo(std::string& echoes, const protocol::UpRow& row, const std::string& key) {
    echoes += (echoes.empty() ? "[" : ",") + std::string("{\"t\":") + json_string(row.table) +
              ",\"k\":" + key + ",\"r\":" + row.row + "}";
}

void file_run(Spi& spi, const Run& run, const std::vector<protocol::UpRow>& rows,
              const Known& known, std::vector<Kept>& kept, std::string& echoes) {
    if (run.rows.empty()) return;
    const std::string statement = insert_statement(*run.codec, run.shape);
    const bool echoed = run.codec->kind == "both";
    auto file = [&](const std::string& json_rows, size_t count) {
        pg::subtransaction([&] {
            if (!run.codec->both_audience) {
                spi.execute(statement, {Param::jsonb(json_rows), Param::jsonb(run.codec->stamps)});
                return;
            }
            // Each row changed or inserted is the replica's; a row of another replica's (not
            // changed: none returned for it) or one moved out of its rows keeps the lot.
            const std::vector<pg::Row> written =
                spi.query(statement, {Param::jsonb(json_rows), Param::jsonb(run.codec->stamps),
                                      Param::jsonb(known.replica_row)});
            const bool all_changed = run.shape.update.empty() || written.size() == count;
            if (!all_changed || std::any_of(written.begin(), written.end(), [](const pg::Row& r) {
                    return !r["replicas_own"].flag_or(false);
                }))
                throw NotItsRow();
        });
    };
    std::string all = "[";
    for (size_t i : run.rows) all += (all.size() > 1 ? "," : "") + rows[i].row;
    try {
        file(all + "]", run.rows.size());
        if (echoed) {
            for (size_t n = 0; n < run.rows.size(); ++n)
                note_echo(echoes, rows[run.rows[n]], run.keys[n]);
        }
        return;
    } catch (const pg::PgError& e) {
        if (is_transient(e.sqlstate())) throw;
        if (run.rows.size() == 1) {
            kept.push_back(failed_row(run.rows[0], rows[run.rows[0]], run.keys[0], e));
            return;
        }
    } catch (const NotItsRow& e) {
        if (run.rows.size() == 1) {
            kept.push_back(kept_row(run.rows[0], rows[run.rows[0]], run.keys[0], e.what()));
            return;
        }
    }
    for (size_t n = 0; n < run.rows.size(); ++n) {
        try {
            file("[" + rows[run.rows[n]].row + "]", 1);
            if (echoed) note_echo(echoes, rows[run.rows[n]], run.keys[n]);
        } catch (const pg::PgError& e) {
            if (is_transient(e.sqlstate())) throw;
            kept.push_back(failed_row(run.rows[n], rows[run.rows[n]], run.keys[n], e));
        } catch (const NotItsRow& e) {
            kept.push_back(kept_row(run.rows[n], rows[run.rows[n]], run.keys[n], e.what()));
        }
    }
}

// The members of a row that name no column of its table (a device one version ahead of the
// server, a name that differs in case), as their JSON names, comma separated; empty when none.
std::string columns_lacking(const FilingCodec& codec, const std::vector<Member>& members) {
    std::string lacking;
    for (const Member& m : members) {
        bool known = std::any_of(codec.columns.begin(), codec.columns.end(),
                                 [&](const Column& column) { return column.json_name == m.key; });
        if (!known) lacking += (lacking.empty() ? "" : ", ") + std::string(m.key);
    }
    return lacking;
}

std::vector<Kept> file_rows(Spi& spi, const std::vector<protocol::UpRow>& rows, const Known& known,
                            std::string& echoes) {
    std::vector<Kept> kept;
    if (rows.empty()) return kept;
    const std::map<std::string, FilingCodec> codecs = load_codecs(spi, rows, known);
    Run run;
    auto flush = [&] {
        file_run(spi, run, rows, known, kept, echoes);
        run = Run{};
    };
    for (size_t i = 0; i < rows.size(); ++i) {
        const protocol::UpRow& row = rows[i];
        auto found = codecs.find(row.table);
        if (found == codecs.end() || found->second.kind == "undeclared") {
            flush();
            std::string why = "table " + row.table +
                              " does not sync: uploads are filed only into tables declared with"
                              " sync.record() or sync.both()";
            std::string key = found == codecs.end()
                                  ? "{}"
                                  : protocol::key_of(found->second.key_order, members_of(row.row));
            kept.push_back(kept_row(i, row, std::move(key), why));
            continue;
        }
        const FilingCodec& codec = found->second;
        const std::vector<Member> members = members_of(row.row);
        std::string key = protocol::key_of(codec.key_order, members);
        if (codec.kind == "catalog") {
            flush();
            std::string why = "table " + row.table +
                              " is a catalog table: its rows come from the server, an upload of"
                              " one is not filed";
            kept.push_back(kept_row(i, row, std::move(key), why));
            continue;
        }
        if (std::string lacking = columns_lacking(codec, members); !lacking.empty()) {
            flush();
            kept.push_back(kept_row(i, row, std::move(key),
                                    "table " + row.table + " has no column " + lacking +
                                        ": the row is kept until it has, never filed without it"));
            continue;
        }
        if (codec.goes_down()) {
            if (std::optional<std::string> problem =
                    protocol::number_past_double_problem(row.row)) {
                flush();
                kept.push_back(kept_row(i, row, std::move(key),
                                        *problem + ": the rows of " + row.table +
                                            " go to replicas, which may read numbers as doubles"));
                continue;
            }
        }
        Shape shape = shape_of(codec, members);
        if (run.codec != &codec || !(run.shape == shape)) {
            flush();
            run.codec = &codec;
            run.shape = std::move(shape);
        }
        run.rows.push_back(i);
        run.keys.push_back(std::move(key));
    }
    flush();
    return kept;
}

// Records the upload id first, so two receives of one upload file it once (the second waits on
// the first's row of sync.upload). Returns the answer's kept list when the id was filed before.
Value seen_before(Spi& spi, const std::string& replica, const std::string& id) {
    Value kept;
    pg::as_extension_owner([&] {
        kept = spi.scalar("SELECT sync_internal.upload_begin($1::uuid, $2::uuid)::text",
                          {Param::uuid(replica), Param::uuid(id)});
    });
    return kept;
}

// The role filing runs as (the route's, or magic_sync.role), which the retry files as again.
Value filing_role(Spi& spi) { return spi.scalar("SELECT current_user::text"); }

void finish_upload(Spi& spi, const std::string& replica, const std::string& id,
                   const std::string& kept, const pg::Param& applied, const std::string& untaken,
                   const std::string& holds, bool answered, const Value& change = std::nullopt) {
    const Value role = filing_role(spi);
    pg::as_extension_owner([&] {
        spi.execute(
            R"sql(
            SELECT sync_internal.upload_end($1::uuid, $2::uuid, $3::jsonb, $4::bigint, $5::jsonb,
            $6::jsonb, $7::boolean, $8::name, $9::bigint))sql",
            {Param::uuid(replica), Param::uuid(id), Param::jsonb(kept), applied,
             Param::jsonb(untaken), Param::jsonb(holds), answered, role, change});
    });
    // The relay moves the answer and applies the confirmation as soon as this commits.
    pg::wake_relay_at_commit();
}

// An upload that would keep more than its replica may (sync_internal.kept_room) is refused whole:
// thrown out of its subtransaction (receive), so nothing of it stays.
struct OverTheBound {
    std::string why;
};

void require_room_to_keep(Spi& spi, const std::string& replica, size_t items, size_t bytes) {
    if (items == 0) return;
    Value why;
    pg::as_extension_owner([&] {
        why = spi.scalar(
            "SELECT sync_internal.kept_room($1::uuid, $2::bigint, $3::bigint, $4::bigint, "
            "$5::bigint)",
            {Param::uuid(replica), static_cast<int64_t>(items), static_cast<int64_t>(bytes),
             static_cast<int64_t>(settings::max_kept_items),
             static_cast<int64_t>(settings::max_kept_kb) * 1024});
    });
    if (why) throw OverTheBound{*why};
}

// A message that cannot be decoded is kept as it came and, when its id can be read, answered.
// `waits`: for a change of what filing depends on (see data_may_cure).
std::string keep_whole(Spi& spi, const std::string& replica, const std::string& message,
                       const std::string& reason, bool waits = true) {
    std::optional<std::string> id = protocol::recover_id(message);
    if (id) {
        if (Value kept = seen_before(spi, replica, *id)) {
            finish_upload(spi, replica, *id, *kept, std::nullopt, "[]", "{}", true);
            return "answered again";
        }
    }
    require_room_to_keep(spi, replica, 1, message.size());
    const Value role = filing_role(spi);
    pg::as_extension_owner([&] {
        spi.execute(
            "SELECT sync_internal.keep_message($1::uuid, $2, $3, $4::name, $5::uuid, $6)",
            {Param::uuid(replica), Param::bytea(message), reason, role, Param::uuid(id), waits});
    });
    if (!id) return "kept";
    std::string note = "[{\"t\":\"\",\"k\":{},\"why\":" + json_string(reason) +
                       ",\"reason\":" + json_string(reason) + "}]";
    finish_upload(spi, replica, *id, note, std::nullopt, "[]", "{}", true);
    return "kept";
}

// PostgreSQL's text and jsonb cannot hold U+0000. An upload that carries one anywhere could not be
// filed, and not even answered when it is in a key, a table name, an untaken row or a scope name
// (the answer would not convert to jsonb): it is kept whole instead. `canonical` text writes U+0000
// as the escape \u0000; a raw string holds the byte itself.
bool holds_nul(std::string_view text, bool canonical) {
    for (size_t at = 0; at < text.size(); ++at) {
        if (text[at] == '\0') return true;
        if (canonical && text[at] == '\\') {
            if (text.compare(at + 1, 5, "u0000") == 0) return true;
            ++at;  // the escaped character
        }
    }
    return false;
}

bool holds_nul(const protocol::Upload& upload) {
    for (const protocol::UpRow& row : upload.rows)
        if (holds_nul(row.table, false) || holds_nul(row.row, true)) return true;
    for (const protocol::Untaken& u : upload.untaken)
        if (holds_nul(u.table, false) || holds_nul(u.key, true) || holds_nul(u.why, false))
            return true;
    for (const auto& holding : upload.holds)
        if (holds_nul(holding.first, false)) return true;
    return false;
}

void become(Spi& spi, const std::string& role) {
    try {
        spi.execute("SELECT set_config('role', $1, true)", {role});
    } catch (const pg::PgError& e) {
        throw Error("sync.receive cannot run as magic_sync.role \"" + role + "\": " + e.what(),
                    e.sqlstate(), "",
                    "The login role that calls sync.receive must be a member of that role (GRANT " +
                        pg::quote_identifier(role) +
                        " TO the login role), and sync.receive must not be called from a SECURITY"
                        " DEFINER function.");
    }
}

const char* const kNulReason =
    "upload: a string holds U+0000 (\\u0000), which PostgreSQL cannot store";

// What the senders' hooks say of `replica`: what known() returned, after filing() ran with it;
// none, with which hook said so, when the replica is not known.
Known known_replica(Spi& spi, const std::string& replica) {
    pg::Row setup;
    pg::as_extension_owner([&] {
        setup = spi.query(
                       R"sql(
                       SELECT known, filing, live, replica_row, replicas, change, origin
                       FROM sync_internal.receive_setup($1::uuid))sql",
                       {Param::uuid(replica)})
                    .at(0);
    });
    const Value& known_function = setup["known"];
    const Value& filing_function = setup["filing"];
    Value known;
    if (known_function)
        known =
            spi.scalar("SELECT " + *known_function + "($1::uuid)::text", {Param::uuid(replica)});
    else if (setup["live"].flag_or(false))
        known = "{}";
    if (!known)
        return {std::nullopt,
                known_function ? *known_function + "() does not know"
                               : std::string("is not a live replica"),
                std::nullopt,
                std::nullopt,
                std::nullopt,
                std::nullopt};
    if (filing_function)
        spi.execute("SELECT " + *filing_function + "($1::jsonb)", {Param::jsonb(known)});
    return {known, "", setup["replica_row"], setup["replicas"], setup["change"], setup["origin"]};
}

protocol::Limits upload_limits() {
    protocol::Limits limits;
    limits.max_bytes = static_cast<size_t>(settings::max_upload_bytes);
    limits.max_rows = static_cast<size_t>(settings::max_upload_rows);
    return limits;
}

// A message that did not decode because it is over magic_sync.max_upload_bytes (as sent, or once
// inflated) may decode once the limit is raised: it is tried again, backed off. Any other message
// that does not decode waits for a change (a new build).
bool waits_for_a_change(const protocol::DecodeError& error) {
    return dynamic_cast<const protocol::OverTheLimit*>(&error) == nullptr;
}

// Between an update of the library (and the server's restart) and ALTER EXTENSION magic_sync
// UPDATE, filing would meet another release's schema: it refuses, saying what to run. Looked at
// once per session when it matches (the library changes only with a restart).
void require_installed_version() {
    static bool matches = false;
    if (matches) return;
    const std::optional<std::string> installed = pg::installed_release();
    if (installed && *installed == MAGIC_SYNC_VERSION) {
        matches = true;
        return;
    }
    throw Error("magic_sync's library is version " MAGIC_SYNC_VERSION
                " but the extension in this database is version " +
                    installed.value_or("(none)") + "; nothing was filed",
                kNotYet, "", "Run ALTER EXTENSION magic_sync UPDATE, then send the upload again.");
}

// Files the message of a known replica: decoded, its rows filed or kept, answered.
std::string file_message(Spi& spi, const std::string& replica, const Known& known,
                         const std::string& message) {
    protocol::Upload upload;
    try {
        upload = protocol::decode_upload(message, upload_limits());
    } catch (const protocol::VersionTooNew& e) {
        throw Error(std::string(e.what()) + "; nothing was filed", kNotYet, "",
                    "Keep the upload and send it again once this server runs a magic_sync that"
                    " speaks that version.");
    } catch (const protocol::DecodeError& e) {
        return keep_whole(spi, replica, message, e.what(), waits_for_a_change(e));
    }
    if (holds_nul(upload)) return keep_whole(spi, replica, message, kNulReason);

    std::string kept;
    std::string status;
    if (Value before = seen_before(spi, replica, upload.id)) {
        kept = *before;
        status = "answered again";
    } else {
        std::string echoes;
        const std::vector<Kept> kept_rows = file_rows(spi, upload.rows, known, echoes);
        size_t kept_bytes = 0;
        for (const Kept& k : kept_rows) kept_bytes += k.body.size();
        require_room_to_keep(spi, replica, kept_rows.size(), kept_bytes);
        kept = kept_json(kept_rows);
        if (!echoes.empty())
            pg::as_extension_owner([&] {
                spi.execute(
                    "SELECT sync_internal.upload_echoes($1::uuid, $2::uuid, $3::jsonb)",
                    {Param::uuid(replica), Param::uuid(upload.id), Param::jsonb(echoes + "]")});
            });
        status = "filed";
    }
    // What it says of the replica (applied, untaken, holds) counts in the history it was said in:
    // counters of a history before a restore or a failover would confirm messages it never got.
    const bool this_history = upload.origin.empty() || upload.origin == known.origin.value_or("");
    const pg::Param applied =
        upload.applied && this_history ? pg::Param(*upload.applied) : pg::Param(std::nullopt);
    // Sent again while its answer still waits for the replica: that answer is the answer.
    bool answer = !upload.rows.empty() || kept != "[]";
    if (answer && status == "answered again")
        pg::as_extension_owner([&] {
            answer = !spi.scalar("SELECT sync_internal.answer_waits($1::uuid, $2::uuid)",
                                 {Param::uuid(replica), Param::uuid(upload.id)})
                          .flag_or(false);
        });
    finish_upload(spi, replica, upload.id, kept, applied,
                  this_history ? protocol::untaken_json(upload) : "[]",
                  this_history ? protocol::holds_json(upload) : "{}", answer, known.change);
    return status;
}

std::string receive(Spi& spi, const std::string& replica, const std::string& message) {
    require_installed_version();
    if (settings::role != nullptr && settings::role[0] != '\0') become(spi, settings::role);
    const Known known = known_replica(spi, replica);
    if (!known.known) {
        pg::log_line("magic_sync: dropped an upload from replica " + replica + ", which " +
                     known.unknown_because + "; nothing was filed");
        return "dropped";
    }
    // In a subtransaction, so that an upload over the bound of what its replica may keep leaves
    // nothing: not its filed rows, not its id (the device sends it again once there is room).
    try {
        std::string status;
        pg::subtransaction([&] { status = file_message(spi, replica, known, message); });
        return status;
    } catch (const OverTheBound& over) {
        pg::as_extension_owner([&] {
            spi.execute("SELECT sync_internal.upload_refused($1::uuid, $2)",
                        {Param::uuid(replica), over.why});
        });
        pg::warning("magic_sync: refused an upload: " + over.why + "; nothing of it was filed",
                    "File or discard what the replica keeps (sync.set_aside, "
                    "sync.retry_set_aside()), or raise the setting; the device keeps the upload "
                    "and sends it again.");
        return "refused";
    }
}

// Filing again ------------------------------------------------------------------------------------

// A kept upload the retry files again: one row of an upload, or a message kept whole.
struct KeptItem {
    std::string id;
    std::string replica;
    bool whole = false;
    std::string body;
    Value filed_as;
    std::string settings;  // {name: value}, as the route had them
};

// What filing it again came to: filed, or kept again with the reason, the key (its table may be
// declared now) and whether it waits for a change.
struct Refiled {
    std::string id;
    bool filed = false;
    bool answered = false;  // a message kept whole, filed now: its answer is written
    std::string key = "null";
    std::string reason;
    bool waits = false;
};

Refiled filed_now(const std::string& id, bool answered) {
    Refiled refiled;
    refiled.id = id;
    refiled.filed = true;
    refiled.answered = answered;
    return refiled;
}

Refiled kept_again(const std::string& id, const std::string& reason, bool waits,
                   const std::string& key = "null") {
    Refiled refiled;
    refiled.id = id;
    refiled.key = key;
    refiled.reason = reason;
    refiled.waits = waits;
    return refiled;
}

// A message kept whole is decoded again under today's limits and, when it decodes, filed under its
// own id and answered: the answer replaces "kept whole". What it said of the replica then (applied,
// untaken, holds) is out of date and not taken.
Refiled refile_message(Spi& spi, const KeptItem& item, const Known& known) {
    protocol::Upload upload;
    try {
        upload = protocol::decode_upload(item.body, upload_limits());
    } catch (const protocol::DecodeError& e) {
        return kept_again(item.id, e.what(), waits_for_a_change(e));
    }
    if (holds_nul(upload)) return kept_again(item.id, kNulReason, true);
    try {
        pg::subtransaction([&] {
            seen_before(spi, item.replica, upload.id);
            std::string echoes;
            std::string kept = kept_json(file_rows(spi, upload.rows, known, echoes));
            finish_upload(spi, item.replica, upload.id, kept, std::nullopt, "[]", "{}", true,
                          known.change);
        });
    } catch (const Error& e) {
        if (is_transient(e.sqlstate())) throw;
        return kept_again(item.id, reason_of(e), !data_may_cure(e.sqlstate()));
    }
    return filed_now(item.id, true);
}

// Kept rows, filed again as one upload would file them: consecutive rows of a table in one
// statement and, when it fails, each in its own subtransaction. Their `filed` answer is the
// retry's to write, under their own upload ids. Not echoed: the replica does not hold what it
// was told was kept, so the rows go back to it like any change.
void refile_rows(Spi& spi, const std::vector<const KeptItem*>& items, const Known& known,
                 std::vector<Refiled>& out) {
    std::vector<protocol::UpRow> rows;
    std::vector<const KeptItem*> filed_items;
    for (const KeptItem* item : items) {
        try {
            rows.push_back(protocol::kept_row(item->body));
            filed_items.push_back(item);
        } catch (const protocol::DecodeError& e) {
            out.push_back(kept_again(item->id, e.what(), true));
        }
    }
    if (rows.empty()) return;
    std::vector<Kept> kept;
    try {
        pg::subtransaction([&] {
            std::string echoes;
            kept = file_rows(spi, rows, known, echoes);
        });
    } catch (const Error& e) {
        if (is_transient(e.sqlstate())) throw;
        for (const KeptItem* item : filed_items)
            out.push_back(kept_again(item->id, reason_of(e), !data_may_cure(e.sqlstate())));
        return;
    }
    std::vector<const Kept*> kept_by_row(rows.size(), nullptr);
    for (const Kept& k : kept) kept_by_row[k.row] = &k;
    for (size_t n = 0; n < rows.size(); ++n) {
        const Kept* k = kept_by_row[n];
        if (k == nullptr)
            out.push_back(filed_now(filed_items[n]->id, false));
        else
            out.push_back(kept_again(filed_items[n]->id, k->reason, k->waits, k->key));
    }
}

// The items of one replica kept as one role under the same settings, filed again as that role
// under those settings, after the senders' hooks, as sync.receive filed them.
void refile_group(Spi& spi, const std::vector<KeptItem>& items, size_t begin, size_t end,
                  std::vector<Refiled>& out) {
    const KeptItem& first = items[begin];
    auto keep_all = [&](const std::string& reason, bool waits) {
        for (size_t i = begin; i < end; ++i) out.push_back(kept_again(items[i].id, reason, waits));
    };
    if (first.filed_as && !spi.flag(R"sql(
                  SELECT CASE WHEN to_regrole($1) IS NULL THEN false ELSE
                  has_function_privilege($1, 'sync.receive(uuid, bytea)', 'EXECUTE') END)sql",
                                    {first.filed_as})) {
        keep_all("role " + *first.filed_as +
                     ", which sync.receive kept it as, cannot file uploads any more (it does not"
                     " exist, or may not execute sync.receive): nothing was filed",
                 false);
        return;
    }
    const int level = pg::open_settings_level();
    Known known;
    try {
        pg::subtransaction([&] {
            if (first.filed_as)
                spi.execute("SELECT set_config('role', $1, true)", {first.filed_as});
            spi.execute("SELECT set_config(key, value, true) FROM jsonb_each_text($1::jsonb)",
                        {Param::jsonb(first.settings)});
            known = known_replica(spi, first.replica);
        });
    } catch (const Error& e) {
        pg::undo_settings(level);
        if (is_transient(e.sqlstate())) throw;
        keep_all(reason_of(e), !data_may_cure(e.sqlstate()));
        return;
    }
    if (!known.known) {
        pg::undo_settings(level);
        keep_all(
            "replica " + first.replica + ", which " + known.unknown_because + ": nothing was filed",
            false);
        return;
    }
    try {
        std::vector<const KeptItem*> rows;
        for (size_t i = begin; i < end; ++i) {
            if (items[i].whole)
                out.push_back(refile_message(spi, items[i], known));
            else
                rows.push_back(&items[i]);
        }
        refile_rows(spi, rows, known, out);
    } catch (...) {
        pg::undo_settings(level);
        throw;
    }
    pg::undo_settings(level);
}

std::string refiled_json(const std::vector<Refiled>& refiled) {
    std::string out = "[";
    for (const Refiled& r : refiled) {
        out += std::string(out.size() > 1 ? "," : "") + "{\"id\":" + r.id +
               ",\"filed\":" + (r.filed ? "true" : "false") +
               ",\"answered\":" + (r.answered ? "true" : "false") + ",\"key\":" + r.key +
               ",\"reason\":" + json_string(r.reason) +
               ",\"waits\":" + (r.waits ? "true" : "false") + "}";
    }
    return out + "]";
}

// The kept uploads `ids`, filed again; returns what became of each.
std::string refile(Spi& spi, const std::vector<int64_t>& ids) {
    std::vector<KeptItem> items;
    for (const pg::Row& row : spi.query(R"sql(
                   SELECT s.id, s.replica, s.table_name IS NULL AS whole,
                   coalesce(s.body, '') AS body, s.filed_as,
                   coalesce(s.settings, '{}')::text AS settings
                   FROM unnest($1::bigint[]) AS i(id) JOIN sync.set_aside s ON s.id = i.id
                   WHERE s.kind = 'upload' AND s.replica IS NOT NULL
                   ORDER BY s.replica, s.filed_as, s.settings::text, s.id)sql",
                                        {Param::bigint_array(ids)})) {
        items.push_back({row["id"].value(), row["replica"].value(), row["whole"].flag_or(false),
                         row["body"].bytes(), row["filed_as"], row["settings"].value()});
    }
    std::vector<Refiled> out;
    for (size_t begin = 0; begin < items.size();) {
        size_t end = begin + 1;
        while (end < items.size() && items[end].replica == items[begin].replica &&
               items[end].filed_as == items[begin].filed_as &&
               items[end].settings == items[begin].settings)
            ++end;
        refile_group(spi, items, begin, end, out);
        begin = end;
    }
    return refiled_json(out);
}

}  // namespace

}  // namespace magic_sync::filing

// sync.receive(replica uuid, message bytea) → text: 'filed', 'answered again' (an upload id filed
// before), 'kept' (a message that could not be decoded, set aside whole) or 'dropped' (a replica
// that known() does not know).
MAGIC_SYNC_FUNCTION(magic_sync_receive) {
    if (magic_sync::pg::arg_is_null(fcinfo, 0) || magic_sync::pg::arg_is_null(fcinfo, 1))
        throw magic_sync::Error(
            "sync.receive needs the replica that the route authenticated and the message it sent,"
            " not NULL",
            ERRCODE_NULL_VALUE_NOT_ALLOWED);
    const std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const std::string message = magic_sync::pg::text_arg(fcinfo, 1);
    magic_sync::pg::Spi spi;
    // The role and what the filing hook sets last for this call only, not for the caller's
    // transaction.
    const int level = magic_sync::pg::open_settings_level();
    std::string status = magic_sync::filing::receive(spi, replica, message);
    magic_sync::pg::undo_settings(level);
    spi.finish();
    return magic_sync::pg::text_datum(status);
}

// sync_internal.refile(ids bigint[]) → jsonb: the kept uploads `ids`, filed again (set_aside.sql),
// as
// [{"id", "filed", "answered", "key", "reason", "waits"}, ...].
MAGIC_SYNC_FUNCTION(magic_sync_refile) {
    const std::vector<int64_t> ids = magic_sync::pg::int64_array_arg(fcinfo, 0);
    magic_sync::pg::Spi spi;
    std::string refiled = magic_sync::filing::refile(spi, ids);
    spi.finish();
    return magic_sync::pg::jsonb_datum(refiled);
}
