#include "lib/replica.hpp"

#include <openssl/rand.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>

#include "lib/json_object.hpp"
#include "protocol/canonical.hpp"

namespace magic_sync::replica {

namespace {

using protocol::Digest;
using protocol::Fingerprint;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS state (
    only INTEGER PRIMARY KEY CHECK (only = 1),
    replica TEXT NOT NULL,
    gen INTEGER NOT NULL DEFAULT 0,
    seq INTEGER NOT NULL DEFAULT 0,
    applied_sent INTEGER,  -- "applied" of the last upload the server took; NULL: none this gen
    ack_through INTEGER NOT NULL DEFAULT 0,  -- the last seq whose application the server must hear of
    origin TEXT  -- the history of the messages applied last (their header's origin); NULL: not said
);
-- The histories this replica left: a message written in one of them is refused.
CREATE TABLE IF NOT EXISTS left_origins (origin TEXT PRIMARY KEY);
-- Per scope the replica holds: how far, and the running fingerprint of its rows (docs/DESIGN.md §7).
CREATE TABLE IF NOT EXISTS scopes (
    scope TEXT PRIMARY KEY,
    through INTEGER NOT NULL,
    fp BLOB NOT NULL,
    n INTEGER NOT NULL
);
-- The server's rows; a row lives in one scope. k = key_hash, v = the "h" the server sent.
CREATE TABLE IF NOT EXISTS rows (
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    scope TEXT NOT NULL,
    k BLOB NOT NULL,
    v BLOB NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tbl, key)
);
CREATE INDEX IF NOT EXISTS rows_by_scope_k ON rows (scope, k);
-- The primary key columns of a table, as a JSON array, to find the key of a local write.
CREATE TABLE IF NOT EXISTS table_keys (tbl TEXT PRIMARY KEY, columns TEXT NOT NULL);
-- The app's writes not yet filed; `upload` is the upload carrying it, NULL while pending.
CREATE TABLE IF NOT EXISTS local_writes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    upload TEXT
);
CREATE INDEX IF NOT EXISTS local_writes_by_upload ON local_writes (upload);
CREATE INDEX IF NOT EXISTS local_writes_by_key ON local_writes (tbl, key);
CREATE TABLE IF NOT EXISTS kept (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    body TEXT,
    why TEXT NOT NULL,
    upload TEXT NOT NULL
);
-- What the parts of a later answer to an upload named as still kept, until its last part.
CREATE TABLE IF NOT EXISTS kept_named (
    upload TEXT NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (upload, tbl, key)
);
-- Uploads not answered by a `filed` yet; `sent`: the server took it; `body`: the last encoding.
CREATE TABLE IF NOT EXISTS uploads (
    number INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    sent INTEGER NOT NULL DEFAULT 0,
    body TEXT
);
-- The last holding of each scope the server took, so the same one is not said twice.
CREATE TABLE IF NOT EXISTS advertised (
    scope TEXT PRIMARY KEY,
    through INTEGER NOT NULL,
    fp BLOB NOT NULL,
    n INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS untaken (
    seq INTEGER NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    why TEXT NOT NULL,
    PRIMARY KEY (seq, tbl, key)
);
-- Ranges the server asked fingerprints of, answered in the next upload.
CREATE TABLE IF NOT EXISTS range_requests (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    lo BLOB NOT NULL,
    hi BLOB
);
CREATE TABLE IF NOT EXISTS notices (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    text TEXT NOT NULL
);
)sql";

std::string blob_of(const Digest& digest) { return std::string(protocol::bytes_of(digest)); }

Digest digest_of(const std::string& blob) {
    Digest digest{};
    if (blob.size() != digest.size()) throw StorageError("stored digest is not 32 bytes");
    std::memcpy(digest.data(), blob.data(), digest.size());
    return digest;
}

std::optional<Digest> optional_digest_of(const Statement& statement, int column) {
    if (statement.is_null(column)) return std::nullopt;
    return digest_of(statement.blob(column));
}

std::string new_uuid() {
    uint8_t bytes[16];
    if (RAND_bytes(bytes, sizeof bytes) != 1)
        throw std::runtime_error("no random bytes for a uuid");
    bytes[6] = (bytes[6] & 0x0f) | 0x40;  // version 4
    bytes[8] = (bytes[8] & 0x3f) | 0x80;  // RFC 4122 variant
    static const char* hex = "0123456789abcdef";
    std::string text;
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
        text += hex[bytes[i] >> 4];
        text += hex[bytes[i] & 0x0f];
    }
    return text;
}

const std::string& header_replica(const protocol::DownMessage& message) {
    return std::visit([](const auto& m) -> const std::string& { return m.header.replica; },
                      message);
}

const protocol::MessageHeader& header_of(const protocol::DownMessage& message) {
    return std::visit([](const auto& m) -> const protocol::MessageHeader& { return m.header; },
                      message);
}

const char* kind_of(const protocol::DownMessage& message) {
    static const char* kinds[] = {"rows", "filed", "ranges", "repair"};
    return kinds[message.index()];
}

Fingerprint fingerprint_of_rows(Statement& statement) {
    Fingerprint fingerprint;
    while (statement.step()) {
        fingerprint.add(
            protocol::element(digest_of(statement.blob(0)), digest_of(statement.blob(1))));
    }
    return fingerprint;
}

Statement select_range(Database& database, const std::string& columns, const std::string& scope,
                       const protocol::KeyRange& range) {
    Statement statement =
        database.prepare("SELECT " + columns + " FROM rows WHERE scope = ?1 AND k >= ?2" +
                         (range.hi ? " AND k < ?3" : "") + " ORDER BY k");
    statement.bind(1, scope).bind_blob(2, blob_of(range.lo));
    if (range.hi) statement.bind_blob(3, blob_of(*range.hi));
    return statement;
}

// The work of applying one message, inside its transaction. Scope fingerprints are kept in memory
// while the rows change and written once at the end (flush).
class Applier {
  public:
    Applier(Database& database, const Options& options, int64_t seq,
            std::set<std::string>& tables_with_known_keys)
        : database_(database),
          options_(options),
          seq_(seq),
          tables_with_known_keys_(tables_with_known_keys),
          find_row_(database.prepare("SELECT scope, v FROM rows WHERE tbl = ?1 AND key = ?2")),
          upsert_row_(database.prepare(
              "INSERT INTO rows (tbl, key, scope, k, v, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6) "
              "ON CONFLICT (tbl, key) DO UPDATE SET scope = excluded.scope, v = excluded.v, "
              "body = excluded.body")),
          delete_row_(database.prepare("DELETE FROM rows WHERE tbl = ?1 AND key = ?2")),
          untaken_(database.prepare(
              "INSERT OR REPLACE INTO untaken (seq, tbl, key, why) VALUES (?1, ?2, ?3, ?4)")) {}

    void reset_everything() {
        database_.exec("DELETE FROM rows; DELETE FROM scopes; DELETE FROM range_requests;");
        scopes_.clear();
    }

    // Empties a scope; `stays` keeps it held (a reset), otherwise the replica leaves it (a drop).
    // The server starts the scope over (a reset), or takes it away (a drop): what was reported of
    // it is forgotten, so that it is reported again once held, even as it was (the server forgot,
    // or never took, the last report: a report of a scope it had taken away is not kept).
    void empty_scope(const std::string& scope, bool stays) {
        database_.prepare("DELETE FROM rows WHERE scope = ?1").bind(1, scope).run();
        database_.prepare("DELETE FROM range_requests WHERE scope = ?1").bind(1, scope).run();
        database_.prepare("DELETE FROM advertised WHERE scope = ?1").bind(1, scope).run();
        scopes_[scope] = ScopeState{0, Fingerprint{}, stays};
    }

    void apply_chunk(const protocol::Chunk& chunk) {
        for (const protocol::DownRow& row : chunk.rows) apply_row(chunk.scope, row);
        ScopeState& state = scope(chunk.scope);
        state.through = chunk.to;
        state.held = true;
    }

    // A table no longer synced under this name: every row of it goes, from whichever scope.
    void drop_table(const std::string& table) {
        Statement rows = database_.prepare("SELECT scope, key, v FROM rows WHERE tbl = ?1");
        rows.bind(1, table);
        while (rows.step()) {
            scope(rows.text(0))
                .fingerprint.remove(protocol::element(protocol::key_hash(table, rows.text(1)),
                                                      digest_of(rows.blob(2))));
        }
        database_.prepare("DELETE FROM rows WHERE tbl = ?1").bind(1, table).run();
    }

    // A row the server withholds (too big for any message) is outside both sides' fingerprints:
    // a version of it held from before goes.
    void withhold(const protocol::KeyNote& note) {
        std::string key = note.key;
        if (note.key_hash) {
            // Named by its hash (a key too long for the note): the held row with that k.
            Statement by_hash = database_.prepare("SELECT key FROM rows WHERE tbl = ?1 AND k = ?2");
            by_hash.bind(1, note.table).bind_blob(2, blob_of(*note.key_hash));
            if (!by_hash.step()) return;
            key = by_hash.text(0);
        }
        if (!find_row_.bind(1, note.table).bind(2, key).step()) return;
        const std::string held_scope = find_row_.text(0);
        const Digest v = digest_of(find_row_.blob(1));
        find_row_.run();
        scope(held_scope)
            .fingerprint.remove(protocol::element(protocol::key_hash(note.table, key), v));
        delete_row_.bind(1, note.table).bind(2, key).run();
    }

    void apply_repair(const protocol::RepairMessage& repair) {
        Statement in_range = select_range(database_, "k, v, tbl, key", repair.scope, repair.range);
        std::vector<std::pair<std::string, std::string>> removed;
        ScopeState& state = scope(repair.scope);
        while (in_range.step()) {
            state.fingerprint.remove(
                protocol::element(digest_of(in_range.blob(0)), digest_of(in_range.blob(1))));
            removed.emplace_back(in_range.text(2), in_range.text(3));
        }
        for (const auto& [table, key] : removed) delete_row_.bind(1, table).bind(2, key).run();
        state.held = true;
        for (const protocol::DownRow& row : repair.rows) {
            if (!row.body) continue;  // absent after a range-replace either way
            if (!protocol::contains(repair.range, protocol::key_hash(row.table, row.key))) {
                refuse(row, "outside the repaired range");
                continue;
            }
            apply_row(repair.scope, row);
        }
    }

    void request_ranges(const protocol::RangesMessage& ranges) {
        // The latest request for a scope is the one the server waits for.
        database_.prepare("DELETE FROM range_requests WHERE scope = ?1")
            .bind(1, ranges.scope)
            .run();
        Statement insert =
            database_.prepare("INSERT INTO range_requests (scope, lo, hi) VALUES (?1, ?2, ?3)");
        for (const protocol::KeyRange& range : ranges.ranges) {
            insert.bind(1, ranges.scope).bind_blob(2, blob_of(range.lo));
            if (range.hi) {
                insert.bind_blob(3, blob_of(*range.hi));
            } else {
                insert.bind_null(3);
            }
            insert.run();
        }
    }

    enum class Filing { kAnsweredBefore, kFiledWithoutRows, kFiledRows, kFiledLater };

    // The notes of an answer, each naming its key: one that names a key by its hash (too long
    // for the message) takes the key of the write it names, among the (table, key) rows
    // `candidates` selects for the upload; one that names none shows its hash.
    std::vector<protocol::KeyNote> with_keys(const protocol::FiledMessage& filed,
                                             const char* candidates) {
        std::vector<protocol::KeyNote> notes = filed.kept;
        std::map<protocol::Digest, std::string> by_hash;
        for (protocol::KeyNote& note : notes) {
            if (!note.key_hash) continue;
            if (by_hash.empty()) {
                Statement keys = database_.prepare(candidates);
                keys.bind(1, filed.upload);
                while (keys.step())
                    by_hash[protocol::key_hash(keys.text(0), keys.text(1))] = keys.text(1);
            }
            auto found = by_hash.find(*note.key_hash);
            note.key = found != by_hash.end()
                           ? found->second
                           : "{\"kh\":\"" + protocol::to_hex(*note.key_hash) + "\"}";
        }
        return notes;
    }

    Filing file(const protocol::FiledMessage& filed) {
        Statement known = database_.prepare(
            "SELECT (SELECT count(*) FROM local_writes WHERE upload = ?1) FROM uploads WHERE id = "
            "?1");
        if (!known.bind(1, filed.upload).step()) return file_again(filed);
        bool had_rows = known.integer(0) > 0;
        known.run();
        std::map<std::pair<std::string, std::string>, std::string> kept;
        // A note of no table: the server kept the upload whole (it could not read it), every
        // write of it with that reason.
        std::optional<std::string> kept_whole;
        for (const protocol::KeyNote& note :
             with_keys(filed, "SELECT tbl, key FROM local_writes WHERE upload = ?1")) {
            if (note.table.empty()) {
                kept_whole = note.why;
            } else {
                kept[{note.table, note.key}] = note.why;
            }
        }
        Statement insert_kept = database_.prepare(
            "INSERT INTO kept (tbl, key, body, why, upload) VALUES (?1, ?2, ?3, ?4, ?5)");
        Statement writes =
            database_.prepare("SELECT tbl, key, body FROM local_writes WHERE upload = ?1");
        writes.bind(1, filed.upload);
        std::set<std::pair<std::string, std::string>> matched;
        while (writes.step()) {
            auto found = kept.find({writes.text(0), writes.text(1)});
            if (found == kept.end() && kept_whole)
                found =
                    kept.emplace(std::make_pair(writes.text(0), writes.text(1)), *kept_whole).first;
            if (found == kept.end()) continue;
            insert_kept.bind(1, writes.text(0))
                .bind(2, writes.text(1))
                .bind(3, writes.text(2))
                .bind(4, found->second)
                .bind(5, filed.upload)
                .run();
            matched.insert(found->first);
        }
        for (const auto& [table_key, why] : kept) {
            if (matched.count(table_key)) continue;
            insert_kept.bind(1, table_key.first)
                .bind(2, table_key.second)
                .bind_null(3)
                .bind(4, why)
                .bind(5, filed.upload)
                .run();
        }
        if (filed.more) {
            // A part of the answer: the writes it names as kept are settled; the upload and the
            // rest of its writes wait for the last part.
            Statement settled = database_.prepare(
                "DELETE FROM local_writes WHERE upload = ?1 AND tbl = ?2 AND key = ?3");
            for (const auto& [table, key] : matched)
                settled.bind(1, filed.upload).bind(2, table).bind(3, key).run();
            return Filing::kFiledRows;
        }
        adopt_filed_writes(filed.upload, kept);
        database_.prepare("DELETE FROM local_writes WHERE upload = ?1").bind(1, filed.upload).run();
        database_.prepare("DELETE FROM uploads WHERE id = ?1").bind(1, filed.upload).run();
        return had_rows ? Filing::kFiledRows : Filing::kFiledWithoutRows;
    }

    // A later answer to an upload answered before names what is still kept of it: the server
    // filed the rest on a retry. Its parts are gathered; with the last, what no part named is no
    // longer kept. The same answer again (to a resend) changes nothing. A row it names that this
    // replica does not list is kept again: after a point-in-time recovery the server answers
    // again as its history last did, before the retry that filed the row was lost (the write's
    // body went when it was filed).
    Filing file_again(const protocol::FiledMessage& filed) {
        Statement named = database_.prepare(
            "INSERT OR IGNORE INTO kept_named (upload, tbl, key) VALUES (?1, ?2, ?3)");
        Statement why = database_.prepare(
            "UPDATE kept SET why = ?4 WHERE upload = ?1 AND tbl = ?2 AND key = ?3");
        Statement kept_again = database_.prepare(
            "INSERT INTO kept (tbl, key, why, upload) SELECT ?2, ?3, ?4, ?1 WHERE NOT EXISTS "
            "(SELECT 1 FROM kept WHERE upload = ?1 AND tbl = ?2 AND key = ?3)");
        for (const protocol::KeyNote& note :
             with_keys(filed, "SELECT tbl, key FROM kept WHERE upload = ?1")) {
            if (note.table.empty()) {
                // Still kept whole: every kept write of it.
                database_
                    .prepare(
                        "INSERT OR IGNORE INTO kept_named (upload, tbl, key)"
                        " SELECT upload, tbl, key FROM kept WHERE upload = ?1")
                    .bind(1, filed.upload)
                    .run();
                database_.prepare("UPDATE kept SET why = ?2 WHERE upload = ?1")
                    .bind(1, filed.upload)
                    .bind(2, note.why)
                    .run();
                continue;
            }
            named.bind(1, filed.upload).bind(2, note.table).bind(3, note.key).run();
            why.bind(1, filed.upload).bind(2, note.table).bind(3, note.key).bind(4, note.why).run();
            kept_again.bind(1, filed.upload)
                .bind(2, note.table)
                .bind(3, note.key)
                .bind(4, note.why)
                .run();
            if (sqlite3_changes(database_.handle()) > 0)
                kept_again_.push_back(note.table + " " + note.key + ": " + note.why);
        }
        if (filed.more) return Filing::kAnsweredBefore;
        const char* const unnamed =
            " FROM kept WHERE kept.upload = ?1 AND NOT EXISTS (SELECT 1 FROM kept_named n"
            " WHERE n.upload = kept.upload AND n.tbl = kept.tbl AND n.key = kept.key)";
        Statement filed_later = database_.prepare(std::string("SELECT tbl, key") + unnamed);
        filed_later.bind(1, filed.upload);
        while (filed_later.step())
            filed_later_.push_back(filed_later.text(0) + " " + filed_later.text(1));
        database_.prepare(std::string("DELETE") + unnamed).bind(1, filed.upload).run();
        database_.prepare("DELETE FROM kept_named WHERE upload = ?1").bind(1, filed.upload).run();
        return filed_later_.empty() ? Filing::kAnsweredBefore : Filing::kFiledLater;
    }

    // The kept rows a later answer said were filed ("table key").
    const std::vector<std::string>& filed_later() const { return filed_later_; }
    // The rows a later answer kept again ("table key: why").
    const std::vector<std::string>& kept_again() const { return kept_again_; }

    // The upload's writes the server filed become the rows this replica holds: each over the
    // row it was written on, under the version the server gives that body, so the replica does not
    // show the older row again while the server's version of it is on its way (that version
    // replaces this one when it comes). A write to a row the replica does not hold waits for the
    // server's row: its scope is not known here.
    void adopt_filed_writes(
        const std::string& upload,
        const std::map<std::pair<std::string, std::string>, std::string>& kept) {
        Statement writes = database_.prepare(
            "SELECT tbl, key, body FROM local_writes WHERE upload = ?1 ORDER BY id");
        writes.bind(1, upload);
        std::map<std::pair<std::string, std::string>, std::vector<std::string>> written;
        while (writes.step()) written[{writes.text(0), writes.text(1)}].push_back(writes.text(2));
        Statement held =
            database_.prepare("SELECT scope, body, v FROM rows WHERE tbl = ?1 AND key = ?2");
        for (const auto& [table_key, bodies] : written) {
            if (kept.count(table_key) || options_.refuse_tables.count(table_key.first)) continue;
            if (!held.bind(1, table_key.first).bind(2, table_key.second).step()) continue;
            const std::string scope_name = held.text(0);
            std::map<std::string, std::string> members = object_members(held.text(1));
            const Digest k = protocol::key_hash(table_key.first, table_key.second);
            scope(scope_name).fingerprint.remove(protocol::element(k, digest_of(held.blob(2))));
            held.run();
            for (const std::string& body : bodies) {
                for (auto& member : object_members(body))
                    members[member.first] = std::move(member.second);
            }
            const std::string json = object_from_members(members);
            store_row(scope_name, k,
                      protocol::DownRow{table_key.first, table_key.second,
                                        protocol::RowBody{json, protocol::row_hash(json)}});
        }
    }

    void flush() {
        Statement save = database_.prepare(
            "INSERT OR REPLACE INTO scopes (scope, through, fp, n) VALUES (?1, ?2, ?3, ?4)");
        Statement remove = database_.prepare("DELETE FROM scopes WHERE scope = ?1");
        for (const auto& [name, state] : scopes_) {
            if (state.held) {
                save.bind(1, name)
                    .bind(2, state.through)
                    .bind_blob(3, blob_of(state.fingerprint.sum))
                    .bind(4, state.fingerprint.count)
                    .run();
            } else {
                remove.bind(1, name).run();
            }
        }
    }

    size_t untaken() const { return untaken_count_; }

  private:
    struct ScopeState {
        int64_t through = 0;
        Fingerprint fingerprint;
        bool held = false;
    };

    ScopeState& scope(const std::string& name) {
        auto found = scopes_.find(name);
        if (found != scopes_.end()) return found->second;
        ScopeState state;
        Statement load = database_.prepare("SELECT through, fp, n FROM scopes WHERE scope = ?1");
        if (load.bind(1, name).step()) {
            state = ScopeState{load.integer(0),
                               Fingerprint{digest_of(load.blob(1)), load.integer(2)}, true};
        }
        return scopes_.emplace(name, state).first->second;
    }

    void refuse(const protocol::DownRow& row, const std::string& why) {
        untaken_.bind(1, seq_).bind(2, row.table).bind(3, row.key).bind(4, why).run();
        ++untaken_count_;
    }

    void apply_row(const std::string& scope_name, const protocol::DownRow& row) {
        if (options_.refuse_tables.count(row.table)) {
            refuse(row, "the replica refuses rows of " + row.table + " (test fault)");
            return;
        }
        learn_key_columns(row);
        Digest k = protocol::key_hash(row.table, row.key);
        std::optional<std::pair<std::string, Digest>> held;
        if (find_row_.bind(1, row.table).bind(2, row.key).step()) {
            held.emplace(find_row_.text(0), digest_of(find_row_.blob(1)));
            find_row_.run();
        }
        if (!row.body) {
            // A tombstone for the scope the row left: if it lives in another scope now, it stays.
            if (!held || held->first != scope_name) return;
            scope(scope_name).fingerprint.remove(protocol::element(k, held->second));
            delete_row_.bind(1, row.table).bind(2, row.key).run();
            return;
        }
        if (held) scope(held->first).fingerprint.remove(protocol::element(k, held->second));
        store_row(scope_name, k, row);
    }

    void store_row(const std::string& scope_name, const Digest& k, const protocol::DownRow& row) {
        scope(scope_name).fingerprint.add(protocol::element(k, row.body->hash));
        upsert_row_.bind(1, row.table)
            .bind(2, row.key)
            .bind(3, scope_name)
            .bind_blob(4, blob_of(k))
            .bind_blob(5, blob_of(row.body->hash))
            .bind(6, row.body->json)
            .run();
    }

    void learn_key_columns(const protocol::DownRow& row) {
        if (!tables_with_known_keys_.insert(row.table).second) return;
        nlohmann::json columns = nlohmann::json::array();
        for (const auto& member : object_members(row.key)) columns.push_back(member.first);
        database_.prepare("INSERT OR REPLACE INTO table_keys (tbl, columns) VALUES (?1, ?2)")
            .bind(1, row.table)
            .bind(2, columns.dump())
            .run();
    }

    Database& database_;
    const Options& options_;
    int64_t seq_;
    std::set<std::string>& tables_with_known_keys_;
    std::map<std::string, ScopeState> scopes_;
    Statement find_row_;
    Statement upsert_row_;
    Statement delete_row_;
    Statement untaken_;
    size_t untaken_count_ = 0;
    std::vector<std::string> filed_later_;
    std::vector<std::string> kept_again_;
};

}  // namespace

const char* outcome_name(Outcome outcome) {
    switch (outcome) {
        case Outcome::kApplied:
            return "applied";
        case Outcome::kAlreadyApplied:
            return "already applied";
        case Outcome::kOlderGeneration:
            return "older generation";
        case Outcome::kUnknownVersion:
            return "unknown version";
        case Outcome::kMalformed:
            return "malformed";
    }
    return "unknown outcome";
}

Replica::Replica(const std::string& path, const std::string& replica_id, Options options)
    : database_(path), id_(replica_id), options_(std::move(options)) {
    create_schema();
}

void Replica::create_schema() {
    Transaction transaction(database_);
    database_.exec(kSchema);
    // A file made before messages named their origin.
    Statement has_origin =
        database_.prepare("SELECT count(*) FROM pragma_table_info('state') WHERE name = 'origin'");
    has_origin.step();
    const bool made_before_origins = has_origin.integer(0) == 0;
    has_origin.run();
    if (made_before_origins) database_.exec("ALTER TABLE state ADD COLUMN origin TEXT");
    Statement owner = database_.prepare("SELECT replica FROM state");
    if (owner.step()) {
        if (owner.text(0) != id_) {
            throw std::invalid_argument("this database belongs to replica " + owner.text(0) +
                                        ", not " + id_);
        }
        owner.run();
    } else {
        database_.prepare("INSERT INTO state (only, replica) VALUES (1, ?1)").bind(1, id_).run();
    }
    transaction.commit();
}

void Replica::add_notice(const std::string& text) {
    database_.prepare("INSERT INTO notices (text) VALUES (?1)").bind(1, text).run();
}

ApplyResult Replica::apply(std::string_view message) {
    std::lock_guard<std::mutex> lock(mutex_);
    ApplyResult result;
    protocol::DownMessage decoded;
    try {
        decoded = protocol::decode_down(message);
    } catch (const protocol::VersionTooNew& error) {
        result.outcome = Outcome::kUnknownVersion;
        result.detail = error.what();
        Transaction transaction(database_);
        add_notice("ignored a message: " + result.detail);
        transaction.commit();
        return result;
    } catch (const protocol::DecodeError& error) {
        result.outcome = Outcome::kMalformed;
        result.detail = error.what();
        return result;
    }
    const protocol::MessageHeader& header = header_of(decoded);
    result.kind = kind_of(decoded);
    result.gen = header.gen;
    result.seq = header.seq;
    if (header_replica(decoded) != id_) {
        result.outcome = Outcome::kMalformed;
        result.detail = "addressed to replica " + header.replica + ", this is " + id_;
        return result;
    }

    Transaction transaction(database_);
    Statement state = database_.prepare("SELECT gen, seq, origin FROM state");
    state.step();
    int64_t gen = state.integer(0);
    int64_t seq = state.integer(1);
    const std::string held_origin = state.is_null(2) ? "" : state.text(2);
    state.run();
    // Another history than the one applied last (a restore, a re-created extension, a failover):
    // its gen and seq say nothing against this replica's, so the message is taken as it comes,
    // and what the replica holds is proven again against the server's fingerprints. A message of
    // a history it left is refused.
    const bool new_history =
        !header.origin.empty() && !held_origin.empty() && header.origin != held_origin;
    if (new_history && database_.prepare("SELECT 1 FROM left_origins WHERE origin = ?1")
                           .bind(1, header.origin)
                           .step()) {
        result.outcome = Outcome::kOlderGeneration;
        result.detail = "written in a history this replica left (origin " + header.origin + ")";
        return result;
    }
    if (!new_history && header.gen < gen) {
        result.outcome = Outcome::kOlderGeneration;
        result.detail = "generation " + std::to_string(header.gen) + ", this replica is at " +
                        std::to_string(gen);
        return result;
    }
    if (!new_history && header.gen == gen && header.seq <= seq) {
        result.outcome = Outcome::kAlreadyApplied;
        result.detail =
            "seq " + std::to_string(header.seq) + ", applied through " + std::to_string(seq);
        return result;
    }

    Applier applier(database_, options_, header.seq, tables_with_known_keys_);
    if (new_history) {
        database_.prepare("INSERT OR IGNORE INTO left_origins (origin) VALUES (?1)")
            .bind(1, held_origin)
            .run();
        add_notice("the server's history changed (origin " + held_origin + " to " + header.origin +
                   "): a restore, a re-created extension or a failover; what this replica holds "
                   "is proven again");
    }
    if (header.gen > gen || new_history) {
        // The server provisioned this replica again, or its history changed: what it held
        // belongs to the old generation (the server says which scopes to reset). Unanswered
        // uploads are offered again (same id) since the old outbox with their answers is gone;
        // the server answers a filed one again instead of filing it twice.
        if (header.gen > gen) applier.reset_everything();
        database_.exec(
            "DELETE FROM advertised; DELETE FROM untaken; UPDATE uploads SET sent = 0; "
            "UPDATE state SET applied_sent = NULL, ack_through = 0;");
    }
    // Whether the server must hear that this message was applied: every message, the server
    // holds it unconfirmed until then; except the answer to an upload that carried no rows
    // (itself only an acknowledgement), which a server answers no more, lest it go on forever.
    bool wants_acknowledgement = true;
    if (const auto* rows = std::get_if<protocol::RowsMessage>(&decoded)) {
        for (const std::string& scope : rows->reset) {
            if (scope == "*") {
                applier.reset_everything();
            } else {
                applier.empty_scope(scope, true);
            }
        }
        for (const std::string& scope : rows->drop) applier.empty_scope(scope, false);
        for (const std::string& table : rows->drop_tables) applier.drop_table(table);
        for (const protocol::Chunk& chunk : rows->chunks) applier.apply_chunk(chunk);
        for (const protocol::KeyNote& note : rows->withheld) {
            applier.withhold(note);
            add_notice(
                "withheld by the server: " + note.table + " " +
                (note.key_hash ? "(key hash " + protocol::to_hex(*note.key_hash) + ")" : note.key) +
                ": " + note.why);
        }
    } else if (const auto* filed = std::get_if<protocol::FiledMessage>(&decoded)) {
        Applier::Filing filing = applier.file(*filed);
        wants_acknowledgement = filing != Applier::Filing::kFiledWithoutRows;
        if (filing == Applier::Filing::kAnsweredBefore) {
            add_notice("filed answer for upload " + filed->upload + " that was answered before");
        }
        for (const std::string& row : applier.filed_later())
            add_notice("filed by the server after it was kept: " + row);
        for (const std::string& row : applier.kept_again())
            add_notice("kept again by the server: " + row);
    } else if (const auto* ranges = std::get_if<protocol::RangesMessage>(&decoded)) {
        applier.request_ranges(*ranges);
    } else {
        applier.apply_repair(std::get<protocol::RepairMessage>(decoded));
    }
    applier.flush();
    database_
        .prepare(
            "UPDATE state SET gen = ?1, seq = ?2, ack_through = CASE WHEN ?3 THEN ?2 ELSE "
            "ack_through END, origin = coalesce(nullif(?4, ''), origin)")
        .bind(1, header.gen)
        .bind(2, header.seq)
        .bind(3, static_cast<int64_t>(wants_acknowledgement))
        .bind(4, header.origin)
        .run();
    transaction.commit();
    result.outcome = Outcome::kApplied;
    result.untaken = applier.untaken();
    return result;
}

std::vector<std::string> Replica::key_columns_of(const std::string& table) {
    Statement lookup = database_.prepare("SELECT columns FROM table_keys WHERE tbl = ?1");
    if (!lookup.bind(1, table).step()) return {};
    std::vector<std::string> columns = nlohmann::json::parse(lookup.text(0));
    lookup.run();
    return columns;
}

LocalWrite Replica::write(const std::string& table, std::string_view row_json,
                          const std::vector<std::string>& key_columns) {
    std::lock_guard<std::mutex> lock(mutex_);
    LocalWrite written;
    written.table = table;
    try {
        written.json = protocol::canonical_json(row_json);
    } catch (const protocol::DecodeError& error) {
        throw std::invalid_argument(std::string("the row is not JSON: ") + error.what());
    }
    if (written.json.front() != '{') throw std::invalid_argument("the row must be a JSON object");
    std::map<std::string, std::string> members = object_members(written.json);

    Transaction transaction(database_);
    std::vector<std::string> columns = key_columns;
    if (columns.empty()) columns = key_columns_of(table);
    if (columns.empty() && members.count("id")) columns = {"id"};
    if (columns.empty()) {
        throw std::invalid_argument("the key columns of " + table +
                                    " are not known yet: name them (--key)");
    }
    std::map<std::string, std::string> key;
    for (const std::string& column : columns) {
        auto found = members.find(column);
        if (found == members.end()) {
            throw std::invalid_argument("the row lacks the key column " + column + " of " + table);
        }
        key.insert(*found);
    }
    written.key = object_from_members(key);
    if (!key_columns.empty()) {
        database_.prepare("INSERT OR REPLACE INTO table_keys (tbl, columns) VALUES (?1, ?2)")
            .bind(1, table)
            .bind(2, nlohmann::json(key_columns).dump())
            .run();
        tables_with_known_keys_.insert(table);
    }
    // A write not yet in an upload is replaced by a newer one to the same row: only the latest
    // version travels. One already in an upload stays as it is; the new one goes in the next.
    Statement pending = database_.prepare(
        "SELECT id FROM local_writes WHERE tbl = ?1 AND key = ?2 AND upload IS NULL");
    if (pending.bind(1, table).bind(2, written.key).step()) {
        written.id = pending.integer(0);
        pending.run();
        database_.prepare("UPDATE local_writes SET body = ?1 WHERE id = ?2")
            .bind(1, written.json)
            .bind(2, written.id)
            .run();
    } else {
        database_.prepare("INSERT INTO local_writes (tbl, key, body) VALUES (?1, ?2, ?3)")
            .bind(1, table)
            .bind(2, written.key)
            .bind(3, written.json)
            .run();
        written.id = sqlite3_last_insert_rowid(database_.handle());
    }
    transaction.commit();
    return written;
}

std::optional<PreparedUpload> Replica::prepare_upload() {
    std::lock_guard<std::mutex> lock(mutex_);
    Transaction transaction(database_);
    PreparedUpload prepared;

    Statement state = database_.prepare(
        "SELECT gen, seq, ack_through > coalesce(applied_sent, 0), coalesce(origin, '') FROM "
        "state");
    state.step();
    bool provisioned = state.integer(0) > 0;
    int64_t seq = state.integer(1);
    bool acknowledgement_due = state.integer(2) != 0;
    prepared.upload.origin = state.text(3);
    state.run();
    if (provisioned) prepared.upload.applied = seq;

    Statement untaken = database_.prepare("SELECT seq, tbl, key, why FROM untaken ORDER BY seq");
    while (untaken.step()) {
        prepared.upload.untaken.push_back(
            {untaken.integer(0), untaken.text(1), untaken.text(2), untaken.text(3)});
    }

    Statement changed = database_.prepare(
        "SELECT s.scope, s.through, s.fp, s.n FROM scopes s LEFT JOIN advertised a USING (scope) "
        "WHERE a.scope IS NULL OR a.through != s.through OR a.fp != s.fp OR a.n != s.n");
    while (changed.step()) {
        prepared.upload.holds[changed.text(0)] = protocol::Holding{
            changed.integer(1), Fingerprint{digest_of(changed.blob(2)), changed.integer(3)}, {}};
    }

    Statement requests =
        database_.prepare("SELECT scope, lo, hi FROM range_requests ORDER BY position");
    Statement holding = database_.prepare("SELECT through, fp, n FROM scopes WHERE scope = ?1");
    while (requests.step()) {
        std::string scope = requests.text(0);
        protocol::KeyRange range{digest_of(requests.blob(1)), optional_digest_of(requests, 2)};
        auto [entry, added] = prepared.upload.holds.try_emplace(scope);
        if (added && holding.bind(1, scope).step()) {
            entry->second.through = holding.integer(0);
            entry->second.fingerprint = Fingerprint{digest_of(holding.blob(1)), holding.integer(2)};
            holding.run();
        }
        Statement rows = select_range(database_, "k, v", scope, range);
        entry->second.ranges.push_back({range, fingerprint_of_rows(rows)});
    }

    Statement unsent = database_.prepare("SELECT id FROM uploads WHERE sent = 0 ORDER BY number");
    if (unsent.step()) {
        prepared.id = unsent.text(0);
        unsent.run();
    } else {
        Statement pending =
            database_.prepare("SELECT count(*) FROM local_writes WHERE upload IS NULL");
        pending.step();
        bool has_rows = pending.integer(0) > 0;
        pending.run();
        bool news = has_rows || !prepared.upload.untaken.empty() ||
                    !prepared.upload.holds.empty() || acknowledgement_due;
        if (!news) return std::nullopt;
        prepared.id = new_uuid();
        database_.prepare("INSERT INTO uploads (id) VALUES (?1)").bind(1, prepared.id).run();
        database_
            .prepare(
                "UPDATE local_writes SET upload = ?1 WHERE id IN (SELECT id FROM local_writes "
                "WHERE upload IS NULL ORDER BY id LIMIT ?2)")
            .bind(1, prepared.id)
            .bind(2, static_cast<int64_t>(options_.rows_per_upload))
            .run();
    }
    prepared.upload.id = prepared.id;
    Statement rows =
        database_.prepare("SELECT tbl, body FROM local_writes WHERE upload = ?1 ORDER BY id");
    rows.bind(1, prepared.id);
    while (rows.step()) prepared.upload.rows.push_back({rows.text(0), rows.text(1)});

    prepared.body = protocol::encode(prepared.upload);
    database_.prepare("UPDATE uploads SET body = ?1 WHERE id = ?2")
        .bind(1, prepared.body)
        .bind(2, prepared.id)
        .run();
    transaction.commit();
    return prepared;
}

void Replica::mark_sent(const std::string& upload_id, const std::optional<std::string>& sent_body) {
    std::lock_guard<std::mutex> lock(mutex_);
    Transaction transaction(database_);
    Statement stored = database_.prepare("SELECT body FROM uploads WHERE id = ?1 AND sent = 0");
    if (!stored.bind(1, upload_id).step()) return;  // marked before, or answered already
    protocol::Upload upload = protocol::decode_upload(sent_body ? *sent_body : stored.text(0));
    stored.run();

    // A message applied since the upload was taken may have dropped or reset a scope it reports,
    // and the server may have taken that scope away before the report reached it (it keeps
    // reports of its members' scopes only). What was said is then not taken as heard: the next
    // upload says it again. Otherwise a scope given back as it was would never be reported.
    Statement state = database_.prepare("SELECT seq FROM state");
    state.step();
    bool applied_since = upload.applied.value_or(0) != state.integer(0);
    state.run();
    Statement advertise = database_.prepare(
        "INSERT OR REPLACE INTO advertised (scope, through, fp, n) VALUES (?1, ?2, ?3, ?4)");
    Statement answered =
        database_.prepare("DELETE FROM range_requests WHERE scope = ?1 AND lo = ?2 AND hi IS ?3");
    for (const auto& [scope, holding] : upload.holds) {
        if (!applied_since) {
            advertise.bind(1, scope)
                .bind(2, holding.through)
                .bind_blob(3, blob_of(holding.fingerprint.sum))
                .bind(4, holding.fingerprint.count)
                .run();
        }
        for (const protocol::RangeFingerprint& range : holding.ranges) {
            answered.bind(1, scope).bind_blob(2, blob_of(range.range.lo));
            if (range.range.hi) {
                answered.bind_blob(3, blob_of(*range.range.hi));
            } else {
                answered.bind_null(3);
            }
            answered.run();
        }
    }
    Statement reported =
        database_.prepare("DELETE FROM untaken WHERE seq = ?1 AND tbl = ?2 AND key = ?3");
    for (const protocol::Untaken& row : upload.untaken) {
        reported.bind(1, row.seq).bind(2, row.table).bind(3, row.key).run();
    }
    if (upload.applied) {
        database_.prepare("UPDATE state SET applied_sent = ?1").bind(1, *upload.applied).run();
    }
    database_.prepare("UPDATE uploads SET sent = 1 WHERE id = ?1").bind(1, upload_id).run();
    transaction.commit();
}

int64_t Replica::generation() {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement state = database_.prepare("SELECT gen FROM state");
    state.step();
    int64_t gen = state.integer(0);
    state.run();
    return gen;
}

int64_t Replica::applied_seq() {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement state = database_.prepare("SELECT seq FROM state");
    state.step();
    int64_t seq = state.integer(0);
    state.run();
    return seq;
}

std::vector<std::string> Replica::tables() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> tables;
    Statement select =
        database_.prepare("SELECT tbl FROM rows UNION SELECT tbl FROM local_writes ORDER BY 1");
    while (select.step()) tables.push_back(select.text(0));
    return tables;
}

std::vector<VisibleRow> Replica::rows(const std::string& table) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string, VisibleRow> by_key;
    Statement held = database_.prepare("SELECT key, body FROM rows WHERE tbl = ?1");
    held.bind(1, table);
    while (held.step()) by_key[held.text(0)] = VisibleRow{table, held.text(0), held.text(1), false};
    // Oldest first, so the latest write to a row is the one on top.
    Statement local =
        database_.prepare("SELECT key, body FROM local_writes WHERE tbl = ?1 ORDER BY id");
    local.bind(1, table);
    while (local.step()) {
        VisibleRow& row = by_key[local.text(0)];
        std::map<std::string, std::string> members;
        if (!row.json.empty()) members = object_members(row.json);
        for (auto& member : object_members(local.text(1))) {
            members[member.first] = std::move(member.second);
        }
        row = VisibleRow{table, local.text(0), object_from_members(members), true};
    }
    std::vector<VisibleRow> rows;
    for (auto& entry : by_key) rows.push_back(std::move(entry.second));
    return rows;
}

std::vector<HeldRow> Replica::held_rows() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<HeldRow> rows;
    Statement select =
        database_.prepare("SELECT tbl, key, scope, body, v FROM rows ORDER BY tbl, key");
    while (select.step()) {
        rows.push_back(HeldRow{select.text(0), select.text(1), select.text(2), select.text(3),
                               digest_of(select.blob(4))});
    }
    return rows;
}

std::vector<LocalWrite> Replica::local_writes() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<LocalWrite> writes;
    Statement select =
        database_.prepare("SELECT id, tbl, key, body, upload FROM local_writes ORDER BY id");
    while (select.step()) {
        writes.push_back(LocalWrite{select.integer(0), select.text(1), select.text(2),
                                    select.text(3), select.optional_text(4)});
    }
    return writes;
}

std::vector<KeptWrite> Replica::kept() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<KeptWrite> kept;
    Statement select =
        database_.prepare("SELECT tbl, key, body, why, upload FROM kept ORDER BY id");
    while (select.step()) {
        kept.push_back(KeptWrite{select.text(0), select.text(1), select.optional_text(2),
                                 select.text(3), select.text(4)});
    }
    return kept;
}

std::vector<std::string> Replica::notices() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> notices;
    Statement select = database_.prepare("SELECT at || ' ' || text FROM notices ORDER BY id");
    while (select.step()) notices.push_back(select.text(0));
    return notices;
}

std::vector<ScopeHolding> Replica::holdings() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ScopeHolding> holdings;
    Statement select = database_.prepare("SELECT scope, through, fp, n FROM scopes ORDER BY scope");
    while (select.step()) {
        holdings.push_back(ScopeHolding{select.text(0), select.integer(1),
                                        Fingerprint{digest_of(select.blob(2)), select.integer(3)}});
    }
    return holdings;
}

Fingerprint Replica::recompute(const std::string& scope) {
    return range_fingerprint(scope, protocol::KeyRange{});
}

Fingerprint Replica::range_fingerprint(const std::string& scope, const protocol::KeyRange& range) {
    std::lock_guard<std::mutex> lock(mutex_);
    Statement rows = select_range(database_, "k, v", scope, range);
    return fingerprint_of_rows(rows);
}

}  // namespace magic_sync::replica
