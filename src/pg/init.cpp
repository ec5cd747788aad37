// The library's entry point: settings, the wake-up of the relay, the capture's transaction
// callbacks, and the relay workers when
// magic_sync is in shared_preload_libraries.
extern "C" {
#include "postgres.h"

#include "catalog/namespace.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
}

#include <string>

#include "capture/note_table.hpp"
#include "capture/pending.hpp"
#include "pg/bridge.hpp"
#include "pg/settings.hpp"
#include "pg/values.hpp"
#include "pg/wake.hpp"
#include "relay/worker.hpp"

extern "C" {
PG_MODULE_MAGIC;

PGDLLEXPORT void _PG_init(void);
}

void _PG_init(void) {
    magic_sync::settings::define();
    magic_sync::pg::define_wake(process_shared_preload_libraries_in_progress);
    magic_sync::capture::define_pending();
    magic_sync::capture::define_note_table();
    if (process_shared_preload_libraries_in_progress) magic_sync::relay::register_relay_workers();
}

// sync_internal.wake(): the relay runs as soon as the current transaction commits.
MAGIC_SYNC_FUNCTION(magic_sync_wake) {
    magic_sync::pg::wake_relay_at_commit();
    return Datum(0);
}

// sync_internal.temp_schema_orphaned(schema oid) → boolean: a pg_temp_N schema that no session
// uses (the session that made its tables ended without dropping them: killed, or a crash).
MAGIC_SYNC_FUNCTION(magic_sync_temp_schema_orphaned) {
    const Oid schema = PG_GETARG_OID(0);
    return BoolGetDatum(magic_sync::pg::guard(
        [&]() noexcept { return checkTempNamespaceStatus(schema) == TEMP_NAMESPACE_IDLE; }));
}

// sync_internal.session_lives(pid int, backend_start timestamptz) → boolean: whether the session
// `pid` that started at `backend_start` still lives (true when no pid is named). Read from this
// transaction's snapshot of the backends' status, as pg_stat_activity reads it, whoever calls: a
// lease names its sender's session, and the pass and sync.next test it for every outbox row they
// look at (through SQL and pg_stat_get_activity it cost 6 µs a row, 14 million calls in one
// round of 2,000 rows to 10,000 replicas).
MAGIC_SYNC_FUNCTION(magic_sync_session_lives) {
    if (PG_ARGISNULL(0)) return BoolGetDatum(true);
    if (PG_ARGISNULL(1)) return BoolGetDatum(false);
    const int pid = PG_GETARG_INT32(0);
    const TimestampTz started = PG_GETARG_TIMESTAMPTZ(1);
    return BoolGetDatum(magic_sync::pg::guard([&]() noexcept {
        const int backends = pgstat_fetch_stat_numbackends();
        for (int i = 1; i <= backends; ++i) {
            const LocalPgBackendStatus* local = pgstat_fetch_stat_local_beentry(i);
            if (local != nullptr && local->backendStatus.st_procpid == pid)
                return local->backendStatus.st_proc_start_timestamp == started;
        }
        return false;
    }));
}

// sync.setting(name) → text: the setting magic_sync.<name> with its unit, as SHOW gives it. Being
// in this library, calling it loads the library, and with it the settings: without
// shared_preload_libraries a session has no magic_sync.* settings until it loads the library, so
// the extension's SQL reads them through here, never through current_setting().
MAGIC_SYNC_FUNCTION(magic_sync_setting) {
    const std::string name = "magic_sync." + magic_sync::pg::text_arg(fcinfo, 0);
    const char* value = magic_sync::pg::guard(
        [&]() noexcept { return GetConfigOptionByName(name.c_str(), nullptr, false); });
    return magic_sync::pg::text_datum(value);
}
