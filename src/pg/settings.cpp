#include "pg/settings.hpp"

extern "C" {
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"
}

#include <climits>

#include "protocol/messages.hpp"

namespace magic_sync::settings {

char* database = nullptr;
char* role = nullptr;
int idle_ms = 200;
int notes_per_pass = 10000;
// A message is bounded by its bytes (what a transport and a device take); the rows bound keeps a
// device's transaction short. At 200 a message of small rows was an eighth of the bytes bound,
// and a change reached a fleet in five times the messages, each with its outbox row, lease,
// request and confirmation: 2,000 rows to 10,000 replicas took 19 s where 1,000 take 9
// (bench/README.md, "Fan-out at the server").
int rows_per_message = 1000;
int bytes_per_message = 256 * 1024;
int window = 8;
int retry_every_s = 3600;
int audit_every_s = 3600;
int prune_every_s = 300;
int report_every_s = 300;
int send_timeout_ms = 30000;
int backoff_ms = 1000;
int backoff_max_ms = 600000;
int probe_every_ms = 10000;
int unconfirmed_after_s = 86400;
int max_refusals = 10;
int max_upload_bytes = 16 * 1024 * 1024;
int max_upload_rows = 10000;
int max_kept_items = 10000;
int max_kept_kb = 64 * 1024;
int replica_scan_s = 10;
int leaf_rows = 64;
int storm_window_ms = 10000;
int upload_memory_s = 30 * 86400;

namespace {

constexpr int kHour = 3600;
constexpr int kDay = 24 * kHour;

// A message limit must leave room for at least the envelope and one chunk's frame.
bool check_bytes_per_message(int* value, void**, GucSource) {
    constexpr int64_t kWidest = INT64_MAX;
    const int minimum = static_cast<int>(protocol::rows_envelope_overhead() +
                                         protocol::chunk_overhead("", kWidest, kWidest));
    if (*value > minimum) return true;
    GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
    GUC_check_errmsg("magic_sync.bytes_per_message must be more than %d bytes", minimum);
    GUC_check_errdetail(
        "A message's envelope and the frame of one chunk take up to %d bytes, so a limit of %d "
        "leaves no room for a row.",
        minimum, *value);
    return false;
}

// The setting's default is the value its variable starts with (above), written once.
void define_int(const char* name, const char* description, int* variable, int min_value,
                int max_value, int flags, GucIntCheckHook check_hook = nullptr) {
    DefineCustomIntVariable(name, description, nullptr, variable, *variable, min_value, max_value,
                            PGC_SUSET, flags, check_hook, nullptr, nullptr);
}

}  // namespace

void define() {
    // Only the postmaster starts relay workers, and a setting only it reads cannot be created in
    // a session (a FATAL): without shared_preload_libraries there is no magic_sync.database, and
    // the relay runs as CALL sync.relay().
    if (process_shared_preload_libraries_in_progress)
        DefineCustomStringVariable("magic_sync.database",
                                   "Database the relay worker connects to (a comma-separated "
                                   "list starts one worker per database).",
                                   nullptr, &database, "postgres", PGC_POSTMASTER, 0, nullptr,
                                   nullptr, nullptr);
    DefineCustomStringVariable("magic_sync.role",
                               "Role every transaction of the engine's own assumes (empty: none).",
                               nullptr, &role, "", PGC_SUSET, 0, nullptr, nullptr, nullptr);
    define_int("magic_sync.idle", "Time between passes when there is no work.", &idle_ms, 1,
               kHour * 1000, GUC_UNIT_MS);
    define_int("magic_sync.notes_per_pass",
               "Most noted keys one pass takes (a bigger note is taken in parts).", &notes_per_pass,
               1, 10000000, 0);
    define_int("magic_sync.rows_per_message", "Most rows in one message.", &rows_per_message, 1,
               100000, 0);
    define_int("magic_sync.bytes_per_message", "Largest message, envelope included.",
               &bytes_per_message, 1, 64 * 1024 * 1024, GUC_UNIT_BYTE, check_bytes_per_message);
    define_int("magic_sync.window", "Most unsent messages in one replica's outbox.", &window, 1,
               10000, 0);
    define_int("magic_sync.retry_every", "How often what was set aside is tried again.",
               &retry_every_s, 1, 30 * kDay, GUC_UNIT_S);
    define_int("magic_sync.audit_every",
               "How often the relay holds its state against the tables (sync.audit); 0: never.",
               &audit_every_s, 0, 30 * kDay, GUC_UNIT_S);
    define_int("magic_sync.prune_every", "How often confirmed state is pruned.", &prune_every_s, 1,
               kDay, GUC_UNIT_S);
    define_int("magic_sync.report_every", "How often the relay logs what needs someone.",
               &report_every_s, 1, kDay, GUC_UNIT_S);
    define_int("magic_sync.send_timeout", "A send taking longer than this is a transient failure.",
               &send_timeout_ms, 1, kHour * 1000, GUC_UNIT_MS);
    define_int("magic_sync.backoff", "First wait after a failed send (doubles per failure).",
               &backoff_ms, 1, kHour * 1000, GUC_UNIT_MS);
    define_int("magic_sync.backoff_max", "Longest wait after failed sends.", &backoff_max_ms, 1,
               kDay * 1000, GUC_UNIT_MS);
    define_int("magic_sync.probe_every",
               "A replica backing off after its line failed is probed this often; 0: never.",
               &probe_every_ms, 0, kHour * 1000, GUC_UNIT_MS);
    define_int("magic_sync.unconfirmed_after",
               "A replica leaving what it was sent unconfirmed this long is provisioned again.",
               &unconfirmed_after_s, 1, 365 * kDay, GUC_UNIT_S);
    define_int("magic_sync.max_refusals",
               "Refusals of a replica's head message before it is provisioned again.",
               &max_refusals, 1, 1000000, 0);
    define_int("magic_sync.max_upload_bytes", "Largest upload sync.receive() files.",
               &max_upload_bytes, 1024, INT_MAX, GUC_UNIT_BYTE);
    define_int("magic_sync.max_upload_rows", "Most rows (and untaken rows) one upload carries.",
               &max_upload_rows, 1, 1000000, 0);
    define_int("magic_sync.max_kept_items",
               "Most rows and messages one replica's uploads may have kept (sync.set_aside).",
               &max_kept_items, 0, INT_MAX, 0);
    define_int("magic_sync.max_kept_bytes",
               "Most bytes one replica's uploads may have kept (sync.set_aside).", &max_kept_kb, 0,
               INT_MAX, GUC_UNIT_KB);
    define_int("magic_sync.replica_scan", "How often a replicas view is re-read.", &replica_scan_s,
               1, kDay, GUC_UNIT_S);
    define_int("magic_sync.leaf_rows", "A mismatched range this small is resent whole.", &leaf_rows,
               1, 100000, 0);
    define_int("magic_sync.storm_window",
               "Window in which more than 8 repair rounds without converging is a storm.",
               &storm_window_ms, 1, kDay * 1000, GUC_UNIT_MS);
    define_int("magic_sync.upload_memory", "How long filed upload ids are remembered.",
               &upload_memory_s, 60, 3650 * kDay, GUC_UNIT_S);
    MarkGUCPrefixReserved("magic_sync");
}

}  // namespace magic_sync::settings
