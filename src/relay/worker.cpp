// The relay loop (docs/DESIGN.md §1, §4): the background worker started for each database named in
// magic_sync.database, the same loop as CALL sync.relay(), and sync.start_relay(). C-style on
// purpose: it is PostgreSQL code through and through (transactions, latches, signals), and it
// holds no C++ object a longjmp could skip.
//
// Each iteration: check that this database can relay (extension installed, magic_sync.role
// usable), take the relay lock or stand by, run a pass, and on their timers retry what was set
// aside, prune, report and raise alarms. A retry of kept uploads runs one slice an iteration, in a
// transaction of its own after the pass's, so passes go on while it lasts. An error ends the
// iteration (or the retry), never the loop.
//
// The postmaster starts one launcher, connected to no database, which starts a relay worker for
// each database of magic_sync.database that exists and starts it again when it stops. A relay
// worker connecting to a database that does not exist would end FATAL, and a worker the postmaster
// restarts by itself would say so every few seconds for as long as the database is missing; the
// launcher says it once and looks again every second.
#include "relay/worker.hpp"

extern "C" {
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

PGDLLEXPORT void magic_sync_relay_main(Datum main_arg);
PGDLLEXPORT void magic_sync_launcher_main(Datum main_arg);
}

#include "pg/bridge.hpp"
#include "pg/release.hpp"
#include "pg/settings.hpp"
#include "pg/wake.hpp"

namespace magic_sync::relay {

namespace {

constexpr int kRestartSeconds = 5;
// How long to wait before looking again when this database cannot relay.
constexpr long kBlockedWaitMs = 5000;
// The longest wait before trying again a pass that keeps failing.
constexpr long kLongestBackoffMs = 10000;
// The longest an idle relay goes without a pass.
constexpr int kLongestIdleS = 300;

struct RelayState {
    bool holding;
    bool retrying;     // a retry of kept uploads is under way, slice by slice
    int64 refiled;     // what its slices filed so far
    int64 kept_again;  // and kept again
    TimestampTz last_retry;
    int64 change_retried;  // sync.filing_change when the last retry began
    TimestampTz last_audit;
    TimestampTz last_prune;
    TimestampTz last_report;
    char waiting_for[512];  // what the loop last said it waits for; said again only when it changes
    int failures;           // passes failed in a row
    int retry_failures;     // slices of a retry failed in a row
    TimestampTz retry_not_before;  // after a failed slice: no retry begins before
    char last_error[256];          // the last failure's message
    int last_sqlstate;             // and its SQLSTATE
    bool woken;                    // the latch was set since the last iteration: a commit has work
    bool more;                     // the last pass left work to do at once
    TimestampTz pass_at;           // when a pass is due though nothing wakes the relay
    TimestampTz look_at;           // when kept uploads are due (0: none)
};

// Says once why the loop waits; silent while the reason stays the same.
void wait_for(RelayState* state, const char* reason) {
    if (strcmp(state->waiting_for, reason) == 0) return;
    strlcpy(state->waiting_for, reason, sizeof state->waiting_for);
    if (reason[0] != '\0') ereport(LOG, (errmsg("magic_sync relay: %s", reason)));
}

bool due(TimestampTz last, int every_seconds) {
    return last == 0 ||
           TimestampDifferenceExceeds(last, GetCurrentTimestamp(), every_seconds * 1000);
}

// One value of a query run through SPI, or NULL.
char* single_value(const char* sql, int nargs, Oid* types, Datum* values) {
    int result = SPI_execute_with_args(sql, nargs, types, values, nullptr, false, 1);
    if (result < 0) elog(ERROR, "magic_sync relay: \"%s\" failed", sql);
    if (SPI_processed == 0) return nullptr;
    return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}

// Logs each line a reporting function returns: (level text, line text). An alarm's line comes
// from sync_internal.alarm, which also sends it as a NOTIFY magic_sync_alarm.
void log_lines(const char* sql) {
    if (SPI_execute(sql, false, 0) < 0) elog(ERROR, "magic_sync relay: \"%s\" failed", sql);
    for (uint64 i = 0; i < SPI_processed; ++i) {
        char* level = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
        char* line = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
        ereport(strcmp(level, "WARNING") == 0 ? WARNING : LOG,
                (errmsg("magic_sync relay: %s", line)));
    }
}

// Can this database relay now? Fills `reason` when it cannot.
bool can_relay(char* reason, size_t size) {
    const char* installed = pg::installed_release_or_null();
    if (installed == nullptr) {
        snprintf(reason, size,
                 "the magic_sync extension is not installed in database \"%s\"; waiting for "
                 "CREATE EXTENSION magic_sync",
                 get_database_name(MyDatabaseId));
        return false;
    }
    // The library was updated and the server restarted, the extension not yet: this library's
    // statements would meet the schema of another release.
    if (strcmp(installed, MAGIC_SYNC_VERSION) != 0) {
        snprintf(reason, size,
                 "the magic_sync extension in database \"%s\" is version %s and this library is "
                 "%s; waiting for ALTER EXTENSION magic_sync UPDATE",
                 get_database_name(MyDatabaseId), installed, MAGIC_SYNC_VERSION);
        return false;
    }
    const char* role = settings::role;
    if (role != nullptr && role[0] != '\0') {
        Oid types[1] = {TEXTOID};
        Datum values[1] = {CStringGetTextDatum(role)};
        char* temporary = single_value(
            "SELECT pg_catalog.has_database_privilege(r.oid, pg_catalog.current_database(),"
            " 'TEMPORARY')::text FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
            1, types, values);
        if (temporary == nullptr) {
            snprintf(reason, size,
                     "magic_sync.role names role \"%s\", which does not exist; waiting for it "
                     "(CREATE ROLE, or change magic_sync.role and reload)",
                     role);
            return false;
        }
        if (strcmp(temporary, "true") != 0) {
            snprintf(reason, size,
                     "role \"%s\" (magic_sync.role) lacks the TEMPORARY privilege on database "
                     "\"%s\", which the relay plans in; waiting for GRANT TEMPORARY ON DATABASE "
                     "%s TO %s",
                     role, get_database_name(MyDatabaseId),
                     quote_identifier(get_database_name(MyDatabaseId)), quote_identifier(role));
            return false;
        }
    } else if (strcmp(single_value("SELECT pg_catalog.has_database_privilege("
                                   "pg_catalog.current_database(), 'TEMPORARY')::text",
                                   0, nullptr, nullptr),
                      "true") != 0) {
        snprintf(reason, size,
                 "the relay's role lacks the TEMPORARY privilege on database \"%s\", which the "
                 "relay plans in; waiting for GRANT TEMPORARY",
                 get_database_name(MyDatabaseId));
        return false;
    }
    return true;
}

// The relay's work runs as magic_sync.role, when it names one.
void become_relay_role() {
    if (settings::role == nullptr || settings::role[0] == '\0') return;
    char sql[NAMEDATALEN * 2 + 32];
    snprintf(sql, sizeof sql, "SET LOCAL ROLE %s", quote_identifier(settings::role));
    if (SPI_execute(sql, false, 0) < 0) elog(ERROR, "magic_sync relay: %s failed", sql);
}

// A retry ends when nothing is due, or at an error; the next starts retry_every after.
void end_retry(RelayState* state) {
    if (state->refiled + state->kept_again > 0)
        ereport(LOG, (errmsg("magic_sync relay: retrying kept uploads: " INT64_FORMAT
                             " filed now, " INT64_FORMAT " kept again",
                             state->refiled, state->kept_again)));
    state->retrying = false;
    state->last_retry = GetCurrentTimestamp();
}

// One slice of the retry of kept uploads, inside a transaction with SPI connected; the retry
// ends, and says what it did, when none is due any more. Returns whether it goes on.
bool retry_slice(RelayState* state) {
    pgstat_report_activity(STATE_RUNNING, "magic_sync relay: retry");
    single_value("SELECT sync_internal.relay_guard()", 0, nullptr, nullptr);
    become_relay_role();
    if (SPI_execute("SELECT filed, kept, more FROM sync.retry_uploads()", false, 0) !=
            SPI_OK_SELECT ||
        SPI_processed != 1)
        elog(ERROR, "magic_sync relay: sync.retry_uploads() failed");
    HeapTuple slice = SPI_tuptable->vals[0];
    bool null = false;
    state->retry_failures = 0;
    state->refiled += DatumGetInt64(SPI_getbinval(slice, SPI_tuptable->tupdesc, 1, &null));
    state->kept_again += DatumGetInt64(SPI_getbinval(slice, SPI_tuptable->tupdesc, 2, &null));
    Datum more = SPI_getbinval(slice, SPI_tuptable->tupdesc, 3, &null);
    if (!null && DatumGetBool(more)) return true;
    end_retry(state);
    return false;
}

// A timestamp column of the first row of the last SPI result, or 0 when it is NULL.
TimestampTz timestamp_value(int column) {
    bool null = false;
    Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, column, &null);
    return null ? 0 : DatumGetTimestampTz(value);
}

// When the relay must look again though nothing wakes it: a pass (at the latest in
// kLongestIdleS), and kept uploads due.
void note_next_due(RelayState* state) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT pass_at, look_at FROM sync_internal.next_due('%d s', '%d s', %d, '%d s')",
             settings::replica_scan_s, settings::unconfirmed_after_s, settings::max_refusals,
             kLongestIdleS);
    if (SPI_execute(sql, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "magic_sync relay: sync_internal.next_due() failed");
    state->pass_at = timestamp_value(1);
    state->look_at = timestamp_value(2);
}

// One iteration, inside a transaction with SPI connected. Returns true when there is more work
// to do at once.
bool relay_step(RelayState* state) {
    char reason[512];
    if (!can_relay(reason, sizeof reason)) {
        wait_for(state, reason);
        return false;
    }
    single_value("SELECT sync_internal.relay_guard()", 0, nullptr, nullptr);
    char* holder =
        single_value("SELECT sync_internal.relay_lock_holder()::text", 0, nullptr, nullptr);
    if (holder != nullptr && atoi(holder) != MyProcPid) {
        snprintf(reason, sizeof reason,
                 "standing by: the relay lock of database \"%s\" is held by pid %s",
                 get_database_name(MyDatabaseId), holder);
        wait_for(state, reason);
        state->holding = false;
        return false;
    }
    if (!state->holding) {
        single_value("SELECT sync_internal.relay_lock()", 0, nullptr, nullptr);
        state->holding = true;
        pg::register_relay_latch();
        // Taking the lock is when a deploy shows: try again what was set aside, kept uploads
        // that wait for a change included.
        single_value("SELECT sync_internal.filing_changed()", 0, nullptr, nullptr);
        log_lines(
            "SELECT 'LOG', format('dropped %s working tables a relay left when its session "
            "ended (killed)', n) FROM sync_internal.drop_dead_relays_tables() n WHERE n > 0");
        state->last_retry = 0;
        state->retrying = false;
        state->pass_at = 0;  // a pass at once
        snprintf(reason, sizeof reason, "took the relay lock of database \"%s\"; relaying",
                 get_database_name(MyDatabaseId));
        wait_for(state, reason);
    }
    become_relay_role();
    // Idle, the relay runs no pass: only a commit that woke it, work left by the last pass, what
    // comes with time (sync_internal.next_due), or notes and rows set aside tried again bring one.
    bool pass_due = state->woken || state->more || !pg::relay_can_be_woken() ||
                    GetCurrentTimestamp() >= state->pass_at;
    // What was set aside is tried again on the retry_every timer, and within seconds of what may
    // cure it: a change of what filing depends on (DDL, a GRANT, a declaration, a retry asked
    // for by hand), or a write to a table a kept upload's table references.
    if (!state->retrying && GetCurrentTimestamp() >= state->retry_not_before) {
        const int64 change = atoll(
            single_value("SELECT sync_internal.filing_change_committed()", 0, nullptr, nullptr));
        const bool changed = change != state->change_retried;
        if (changed || due(state->last_retry, settings::retry_every_s)) {
            log_lines("SELECT level, line FROM sync_internal.retry_notes_and_rows()");
            pass_due = true;  // rows sent again moved their scopes' heads
            state->change_retried = change;
            state->retrying = true;
        } else {
            state->retrying = strcmp(single_value("SELECT sync_internal.kept_uploads_due()::text",
                                                  0, nullptr, nullptr),
                                     "true") == 0;
        }
        state->refiled = 0;
        state->kept_again = 0;
    }
    char* work = nullptr;
    if (pass_due) {
        pgstat_report_activity(STATE_RUNNING, "magic_sync relay: pass");
        work = single_value("SELECT (notes > 0 OR messages > 0)::text FROM sync.pass()", 0, nullptr,
                            nullptr);
        log_lines("SELECT 'WARNING', line FROM sync_internal.alarms()");
        note_next_due(state);
    }
    // The first audit waits a whole period: a relay starting over does not read every table.
    if (state->last_audit == 0) state->last_audit = GetCurrentTimestamp();
    if (settings::audit_every_s > 0 && due(state->last_audit, settings::audit_every_s)) {
        pgstat_report_activity(STATE_RUNNING, "magic_sync relay: audit");
        log_lines(
            "SELECT a.level, a.line FROM sync.audit() x CROSS JOIN LATERAL "
            "sync_internal.alarm('state_drifted', 'WARNING', format('the relay''s state had "
            "drifted from the tables (scope %s%s): %s; planned again from the tables. Deploy a "
            "fix: this is a bug', x.scope, coalesce(', replica ' || x.replica, ''), x.problem), "
            "x.replica) a");
        state->last_audit = GetCurrentTimestamp();
    }
    if (due(state->last_prune, settings::prune_every_s)) {
        pgstat_report_activity(STATE_RUNNING, "magic_sync relay: prune");
        single_value("SELECT 1 FROM sync.prune()", 0, nullptr, nullptr);
        state->last_prune = GetCurrentTimestamp();
    }
    if (due(state->last_report, settings::report_every_s)) {
        if (state->last_report != 0) log_lines("SELECT level, line FROM sync_internal.report()");
        state->last_report = GetCurrentTimestamp();
    }
    return work != nullptr && strcmp(work, "true") == 0;
}

// Waits up to `timeout_ms`; true when the latch was set (a commit woke the relay).
bool wait_latch(long timeout_ms) {
    pgstat_report_activity(STATE_IDLE, nullptr);
    const int events = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                                 timeout_ms, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    return (events & WL_LATCH_SET) != 0;
}

// How long the holder of the relay lock may sleep: until the first of what comes with time (a
// pass due, kept uploads due, the timers of retry, audit, prune and report), never less than
// `idle` (work that waits but did not move, as a pass may leave, is looked at every `idle`).
long holder_sleep_ms(const RelayState* state) {
    if (!pg::relay_can_be_woken()) return settings::idle_ms;
    TimestampTz until = state->pass_at;
    const auto at_most = [&until](TimestampTz at) {
        if (at != 0 && at < until) until = at;
    };
    at_most(state->look_at);
    at_most(TimestampTzPlusMilliseconds(state->last_retry, settings::retry_every_s * 1000L));
    if (settings::audit_every_s > 0)
        at_most(TimestampTzPlusMilliseconds(state->last_audit, settings::audit_every_s * 1000L));
    at_most(TimestampTzPlusMilliseconds(state->last_prune, settings::prune_every_s * 1000L));
    at_most(TimestampTzPlusMilliseconds(state->last_report, settings::report_every_s * 1000L));
    at_most(state->retry_not_before);
    return Max(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until),
               static_cast<long>(settings::idle_ms));
}

long idle_timeout(const RelayState* state) {
    return state->waiting_for[0] != '\0' && !state->holding ? Max(kBlockedWaitMs, settings::idle_ms)
                                                            : settings::idle_ms;
}

using Step = bool (*)(RelayState*);

// Runs `step` in a transaction of its own with SPI connected. An error is rolled back, and the
// step found no more work to do; it is reported, unless `failures` counts the failures in a row
// of a step that failed before (the first of them was reported): then it is counted, and its
// message kept in `state`.
bool in_transaction(Step step, RelayState* state, MemoryContext loop_context,
                    int* failures = nullptr) {
    volatile bool more = false;
    MemoryContextSwitchTo(loop_context);
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PushActiveSnapshot(GetTransactionSnapshot());
    PG_TRY();
    {
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "magic_sync relay: SPI_connect failed");
        more = step(state);
        SPI_finish();
        PopActiveSnapshot();
        CommitTransactionCommand();
    }
    PG_CATCH();
    {
        // Report, roll back, and go on: the next iteration starts over.
        MemoryContextSwitchTo(loop_context);
        if (failures != nullptr) {
            ErrorData* error = CopyErrorData();
            strlcpy(state->last_error, error->message, sizeof state->last_error);
            state->last_sqlstate = error->sqlerrcode;
            FreeErrorData(error);
        }
        // An error of the moment (a cancel, a timeout, a deadlock) is no fault to report as
        // one: the back-off says it, and the work is tried again.
        if (failures == nullptr || (*failures == 0 && !pg::is_transient(state->last_sqlstate)))
            EmitErrorReport();
        FlushErrorState();
        AbortCurrentTransaction();
        if (failures != nullptr) ++*failures;
        more = false;
    }
    PG_END_TRY();
    return more;
}

// How long to wait after `failures` failures in a row: from `idle`, doubling up to
// kLongestBackoffMs.
long backoff_ms(int failures) {
    return Min(settings::idle_ms * (1L << Min(failures - 1, 16)), kLongestBackoffMs);
}

// After a pass failed: one line with the count, and a wait that doubles from `idle` up to
// kLongestBackoffMs, not cut short by wake-ups (an error that persists would otherwise be tried
// at every commit); interrupts and the postmaster's death are still seen.
void back_off(const RelayState* state) {
    const long wait_ms = backoff_ms(state->failures);
    ereport(LOG,
            (errmsg("magic_sync relay: the pass %s %d time%s in a row (the last: %s); "
                    "next try in %ld ms",
                    pg::is_transient(state->last_sqlstate) ? "was interrupted" : "failed",
                    state->failures, state->failures == 1 ? "" : "s", state->last_error, wait_ms)));
    const TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
    for (long left = wait_ms; left > 0;
         left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until)) {
        wait_latch(left);
        CHECK_FOR_INTERRUPTS();
    }
}

// The background worker's loop: a transaction per iteration, and one per slice of a retry.
[[noreturn]] void worker_loop() {
    RelayState state = {};
    MemoryContext loop_context =
        AllocSetContextCreate(TopMemoryContext, "magic_sync relay", ALLOCSET_DEFAULT_SIZES);
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        const int failed_before = state.failures;
        bool more = in_transaction(relay_step, &state, loop_context, &state.failures);
        if (state.failures > failed_before) {
            pgstat_report_stat(false);
            MemoryContextReset(loop_context);
            back_off(&state);
            state.more = true;  // the failed pass is tried again
            continue;
        }
        if (failed_before > 0) {
            ereport(LOG, (errmsg("magic_sync relay: relaying again after %d failed passes",
                                 failed_before)));
            state.failures = 0;
        }
        if (state.retrying && state.holding &&
            !in_transaction(retry_slice, &state, loop_context, &state.retry_failures) &&
            state.retrying) {
            // The slice failed (rolled back: its items keep their reasons): the next retry
            // starts over, backed off as a failed pass is, since its items are still due.
            end_retry(&state);
            const long wait_ms = backoff_ms(state.retry_failures);
            state.retry_not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
            ereport(LOG,
                    (errmsg("magic_sync relay: the retry of kept uploads %s %d time%s in a "
                            "row (the last: %s); next try in %ld ms",
                            pg::is_transient(state.last_sqlstate) ? "was interrupted" : "failed",
                            state.retry_failures, state.retry_failures == 1 ? "" : "s",
                            state.last_error, wait_ms)));
        }
        pgstat_report_stat(false);
        MemoryContextReset(loop_context);
        state.more = more;
        state.woken = false;
        if (!more && !state.retrying)
            state.woken =
                wait_latch(state.holding ? holder_sleep_ms(&state) : idle_timeout(&state));
    }
}

// One step of CALL sync.relay() in a subtransaction, committed after. A cancel or a termination
// ends the loop; any other error only the step.
bool in_subtransaction(Step step, RelayState* state, MemoryContext caller_context,
                       ResourceOwner caller_owner) {
    volatile bool more = false;
    if (SPI_connect_ext(SPI_OPT_NONATOMIC) != SPI_OK_CONNECT)
        elog(ERROR, "magic_sync relay: SPI_connect failed");
    BeginInternalSubTransaction(nullptr);
    PG_TRY();
    {
        more = step(state);
        ReleaseCurrentSubTransaction();
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(caller_context);
        ErrorData* error = CopyErrorData();
        FlushErrorState();
        RollbackAndReleaseCurrentSubTransaction();
        if (error->sqlerrcode == ERRCODE_QUERY_CANCELED ||
            error->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN)
            ReThrowError(error);
        ereport(WARNING, (errmsg("magic_sync relay: %s", error->message)));
        FreeErrorData(error);
        more = false;
    }
    PG_END_TRY();
    MemoryContextSwitchTo(caller_context);
    CurrentResourceOwner = caller_owner;
    SPI_commit();
    SPI_finish();
    return more;
}

// CALL sync.relay(): the same loop in an ordinary session, committing between steps.
void procedure_loop(FunctionCallInfo fcinfo) {
    auto* call = reinterpret_cast<CallContext*>(fcinfo->context);
    if (call == nullptr || !IsA(call, CallContext) || call->atomic)
        ereport(ERROR, (errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
                        errmsg("sync.relay() must be called with CALL, outside a transaction "
                               "block"),
                        errhint("Run: CALL sync.relay(); it relays until cancelled.")));
    RelayState state = {};
    MemoryContext caller_context = CurrentMemoryContext;
    ResourceOwner caller_owner = CurrentResourceOwner;
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        bool more = in_subtransaction(relay_step, &state, caller_context, caller_owner);
        if (state.retrying && state.holding &&
            !in_subtransaction(retry_slice, &state, caller_context, caller_owner) && state.retrying)
            end_retry(&state);
        state.more = more;
        state.woken = false;
        if (!more && !state.retrying)
            state.woken =
                wait_latch(state.holding ? holder_sleep_ms(&state) : idle_timeout(&state));
    }
}

// The background worker type of relay workers, as pg_stat_activity shows it.
constexpr const char* kRelayType = "magic_sync relay";

// A magic_sync background worker of `type` running `function`, restarted by the postmaster.
void fill_background_worker(BackgroundWorker* worker, const char* function, const char* type) {
    memset(worker, 0, sizeof *worker);
    worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker->bgw_restart_time = kRestartSeconds;
    strlcpy(worker->bgw_library_name, "magic_sync", BGW_MAXLEN);
    strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
    strlcpy(worker->bgw_name, type, BGW_MAXLEN);
    strlcpy(worker->bgw_type, type, BGW_MAXLEN);
}

// A relay worker for database `id` (named `name` in its process title).
void fill_worker(BackgroundWorker* worker, const char* name, Oid id) {
    fill_background_worker(worker, "magic_sync_relay_main", kRelayType);
    snprintf(worker->bgw_name, BGW_MAXLEN, "%s for %s", kRelayType, name);
    worker->bgw_main_arg = ObjectIdGetDatum(id);
}

// The names of magic_sync.database; ERROR when it is not a list of names.
List* database_names() {
    List* names = nullptr;
    if (!SplitIdentifierString(pstrdup(settings::database), ',', &names))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("magic_sync.database is not a list of database names: \"%s\"",
                               settings::database)));
    return names;
}

// A database of magic_sync.database, as the launcher watches it.
struct Relayed {
    const char* name;
    BackgroundWorkerHandle* worker;  // null: none started, or the last one stopped
    TimestampTz stopped_at;          // when the last one was seen stopped
    bool said_missing;
    bool said_no_slot;
};

// Is a relay worker running in database `id`, one this launcher did not start: started by
// sync.start_relay(), or by a launcher before this one (which ended and left it running)?
bool relay_running_in(Oid id) {
    pgstat_clear_backend_activity_snapshot();
    for (int i = 1; i <= pgstat_fetch_stat_numbackends(); ++i) {
        const PgBackendStatus& backend = pgstat_fetch_stat_local_beentry(i)->backendStatus;
        if (backend.st_backendType != B_BG_WORKER || backend.st_databaseid != id) continue;
        const char* type = GetBackgroundWorkerTypeByPid(backend.st_procpid);
        if (type != nullptr && strcmp(type, kRelayType) == 0) return true;
    }
    return false;
}

// What the launcher finds of a database it is to relay, when it has no worker there.
enum class Found { kMissing, kRefusesConnections, kRelayed, kUnrelayed };

// A heap scan of pg_database: with no database selected, only the shared catalogs themselves
// can be read, not their indexes through the relation cache.
Found find_database(const char* name, Oid* id) {
    Found found = Found::kMissing;
    StartTransactionCommand();
    Relation databases = table_open(DatabaseRelationId, AccessShareLock);
    TableScanDesc scan = table_beginscan_catalog(databases, 0, nullptr);
    HeapTuple tuple = nullptr;
    while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
        auto* form = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
        if (strcmp(NameStr(form->datname), name) != 0) continue;
        *id = form->oid;
        found = !form->datallowconn     ? Found::kRefusesConnections
                : relay_running_in(*id) ? Found::kRelayed
                                        : Found::kUnrelayed;
        break;
    }
    table_endscan(scan);
    table_close(databases, AccessShareLock);
    CommitTransactionCommand();
    return found;
}

// Starts a relay worker for `db` if its database exists and none runs there; says once why it
// cannot.
void start_relay_for(Relayed* db) {
    Oid id = InvalidOid;
    Found found = find_database(db->name, &id);
    if (found == Found::kMissing || found == Found::kRefusesConnections) {
        bool refuses = found == Found::kRefusesConnections;
        if (!db->said_missing)
            ereport(LOG,
                    (errmsg("magic_sync: magic_sync.database names database \"%s\", which "
                            "%s; its relay starts once it %s (looking every second)",
                            db->name, refuses ? "does not allow connections" : "does not exist",
                            refuses ? "does" : "is created"),
                     errhint(refuses ? "ALTER DATABASE ... WITH ALLOW_CONNECTIONS true, or "
                                       "remove it from magic_sync.database and restart the "
                                       "server."
                                     : "Create the database, or remove it from "
                                       "magic_sync.database and restart the server.")));
        db->said_missing = true;
        return;
    }
    db->said_missing = false;
    // Looked at again every second: once that worker ends, this launcher starts its own.
    if (found == Found::kRelayed) return;
    BackgroundWorker worker;
    fill_worker(&worker, db->name, id);
    // Not restarted by the postmaster: the launcher starts it again once the database is there.
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    worker.bgw_notify_pid = MyProcPid;
    if (!RegisterDynamicBackgroundWorker(&worker, &db->worker)) {
        if (!db->said_no_slot)
            ereport(LOG, (errmsg("magic_sync: no background worker slot is free for the relay of "
                                 "database \"%s\"; trying again every second",
                                 db->name),
                          errhint("Raise max_worker_processes.")));
        db->said_no_slot = true;
        db->worker = nullptr;
        return;
    }
    db->said_no_slot = false;
}

[[noreturn]] void launcher_loop() {
    List* names = database_names();
    Relayed* databases = static_cast<Relayed*>(palloc0(sizeof(Relayed) * list_length(names)));
    int count = 0;
    ListCell* cell = nullptr;
    foreach (cell, names) databases[count++].name = static_cast<const char*>(lfirst(cell));
    for (;;) {
        CHECK_FOR_INTERRUPTS();
        if (ConfigReloadPending) {
            ConfigReloadPending = false;
            ProcessConfigFile(PGC_SIGHUP);
        }
        TimestampTz now = GetCurrentTimestamp();
        for (int i = 0; i < count; ++i) {
            Relayed* db = &databases[i];
            pid_t pid = 0;
            if (db->worker != nullptr && GetBackgroundWorkerPid(db->worker, &pid) == BGWH_STOPPED) {
                pfree(db->worker);
                db->worker = nullptr;
                db->stopped_at = now;
            }
            if (db->worker == nullptr &&
                TimestampDifferenceExceeds(db->stopped_at, now, kRestartSeconds * 1000)) {
                // An error is reported and tried again in a second: the launcher goes on
                // watching the workers it started.
                PG_TRY();
                { start_relay_for(db); }
                PG_CATCH();
                {
                    MemoryContextSwitchTo(TopMemoryContext);
                    EmitErrorReport();
                    FlushErrorState();
                    AbortCurrentTransaction();
                }
                PG_END_TRY();
            }
        }
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1000,
                        PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
    }
}

}  // namespace

void register_relay_workers() {
    if (settings::database == nullptr || settings::database[0] == '\0') return;
    database_names();  // an ERROR here stops the server with the reason
    BackgroundWorker launcher;
    fill_background_worker(&launcher, "magic_sync_launcher_main", "magic_sync launcher");
    RegisterBackgroundWorker(&launcher);
}

}  // namespace magic_sync::relay

// Connected to no database: it reads pg_database, which is shared, and starts relay workers.
void magic_sync_launcher_main(Datum) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    pgstat_report_appname("magic_sync launcher");
    magic_sync::relay::launcher_loop();
}

// Started by the launcher or by sync.start_relay(), with the oid of its database.
void magic_sync_relay_main(Datum main_arg) {
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    pqsignal(SIGTERM, die);
    BackgroundWorkerUnblockSignals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg), InvalidOid, 0);
    pgstat_report_appname("magic_sync relay");
    magic_sync::relay::worker_loop();
}

MAGIC_SYNC_FUNCTION(magic_sync_relay) {
    magic_sync::pg::guard([&]() noexcept { magic_sync::relay::procedure_loop(fcinfo); });
    return Datum(0);
}

// sync.start_relay() → int: starts a relay worker for this database; returns its pid.
MAGIC_SYNC_FUNCTION(magic_sync_start_relay) {
    return magic_sync::pg::guard([&]() noexcept {
        BackgroundWorker worker;
        magic_sync::relay::fill_worker(&worker, get_database_name(MyDatabaseId), MyDatabaseId);
        worker.bgw_notify_pid = MyProcPid;
        BackgroundWorkerHandle* handle = nullptr;
        if (!RegisterDynamicBackgroundWorker(&worker, &handle))
            ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_RESOURCES),
                            errmsg("could not start a magic_sync relay worker"),
                            errhint("Raise max_worker_processes.")));
        pid_t pid = 0;
        if (WaitForBackgroundWorkerStartup(handle, &pid) != BGWH_STARTED)
            ereport(ERROR, (errmsg("the magic_sync relay worker did not start")));
        return Int32GetDatum(pid);
    });
}
