// libmagic_sync_replica: the reference replica (docs/DESIGN.md §1, §7, §8). It keeps what a replica
// holds in one SQLite file, applies the server's messages, keeps each scope's running fingerprint,
// queues the app's own writes and builds the uploads that carry them up.
//
// Every message is applied in one SQLite transaction together with the seq it advances to, so a
// crash between applying and acknowledging loses nothing and the message, delivered again, is
// recognised as applied. A Replica may be used from several threads; its calls are serialised.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "lib/sqlite.hpp"
#include "protocol/messages.hpp"

namespace magic_sync::replica {

struct Options {
    // Test fault: rows of these tables cannot be applied, so they are reported as untaken.
    std::set<std::string> refuse_tables;
    size_t rows_per_upload = 1000;
};

enum class Outcome {
    kApplied,          // applied and committed
    kAlreadyApplied,   // this generation's seq was applied before: nothing changed
    kOlderGeneration,  // from before the server last provisioned this replica: ignored
    kUnknownVersion,   // a protocol version this build does not speak: ignored and recorded
    kMalformed,        // can never be applied: not a message, or addressed to another replica
};

const char* outcome_name(Outcome outcome);

struct ApplyResult {
    Outcome outcome = Outcome::kMalformed;
    std::string kind;  // rows, filed, ranges or repair, once decoded
    int64_t gen = 0;
    int64_t seq = 0;
    std::string detail;  // why it was not applied
    size_t untaken = 0;  // rows of it that could not be applied

    // The transport may drop the message: it is applied now or was before, or never will be.
    bool taken() const {
        return outcome == Outcome::kApplied || outcome == Outcome::kAlreadyApplied ||
               outcome == Outcome::kOlderGeneration;
    }
};

// A row as the server sent it.
struct HeldRow {
    std::string table;
    std::string key;  // canonical JSON of the primary key
    std::string scope;
    std::string json;  // canonical JSON of the row
    protocol::Digest hash{};
};

// A row as the app sees it: the server's, with the app's pending write to it on top.
struct VisibleRow {
    std::string table;
    std::string key;
    std::string json;
    bool local = false;  // a local write not yet filed is shown
};

struct LocalWrite {
    int64_t id = 0;
    std::string table;
    std::string key;
    std::string json;
    std::optional<std::string> upload;  // the upload that carries it, once it is in one
};

// A local write the server answered but did not file, with its reason.
struct KeptWrite {
    std::string table;
    std::string key;
    std::optional<std::string> json;  // none when the kept row matched no local write
    std::string why;
    std::string upload;
};

struct ScopeHolding {
    std::string scope;
    int64_t through = 0;
    protocol::Fingerprint fingerprint;
};

struct PreparedUpload {
    std::string id;
    std::string body;  // the encoded upload, what sync.receive takes
    protocol::Upload upload;
};

class Replica {
  public:
    // Opens (creating if new) the replica's file. A file made for another replica id is refused.
    Replica(const std::string& path, const std::string& replica_id, Options options = {});

    const std::string& id() const { return id_; }

    // Applies one down message. Throws StorageError when the local database failed (nothing was
    // applied; delivering it again can help); every other problem is in the result.
    ApplyResult apply(std::string_view message);

    // Queues a row the app wrote to a `record` or `both` table. The key is taken from
    // `key_columns`, else from the columns the table's keys had in rows that came down or in an
    // earlier write, else from "id". Returns the write; throws std::invalid_argument for a row
    // that is not a JSON object or lacks a key column.
    LocalWrite write(const std::string& table, std::string_view row_json,
                     const std::vector<std::string>& key_columns = {});

    // The next upload to send, or none when there is nothing new to say. Until mark_sent() is
    // called for it, it is offered again under the same id with the same rows (a resend), with
    // applied, untaken and holds brought up to date.
    std::optional<PreparedUpload> prepare_upload();
    // The server took the upload (sync.receive returned): what it advertised is not said again.
    // `sent_body`: the body that went, when it is known; what it said (holds, untaken, applied)
    // is what the server heard, though the upload may have been taken again since (brought up
    // to date under the same id). Without it, the upload as last taken.
    void mark_sent(const std::string& upload_id,
                   const std::optional<std::string>& sent_body = std::nullopt);

    int64_t generation();
    int64_t applied_seq();  // of the last message applied in this generation

    std::vector<std::string> tables();                       // tables with held or local rows
    std::vector<VisibleRow> rows(const std::string& table);  // what the app sees, by key
    std::vector<HeldRow> held_rows();                        // the server's rows, by table and key
    std::vector<LocalWrite> local_writes();                  // not yet filed, oldest first
    std::vector<KeptWrite> kept();
    std::vector<std::string> notices();  // messages ignored, rows withheld, oldest first

    std::vector<ScopeHolding> holdings();  // the running fingerprints, by scope
    protocol::Fingerprint recompute(const std::string& scope);  // from the stored rows
    protocol::Fingerprint range_fingerprint(const std::string& scope,
                                            const protocol::KeyRange& range);

  private:
    void create_schema();
    std::vector<std::string> key_columns_of(const std::string& table);
    void add_notice(const std::string& text);

    std::mutex mutex_;
    Database database_;
    std::string id_;
    Options options_;
    std::set<std::string> tables_with_known_keys_;  // key columns recorded by this process
};

}  // namespace magic_sync::replica
