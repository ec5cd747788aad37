// The library's entry point: settings, the wake-up of the relay, and the relay workers when
// magic_sync is in shared_preload_libraries.
extern "C" {
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
}

#include "pg/bridge.hpp"
#include "pg/relay_worker.hpp"
#include "pg/settings.hpp"
#include "pg/wake.hpp"

extern "C" {
PG_MODULE_MAGIC;

PGDLLEXPORT void _PG_init(void);
}

void _PG_init(void) {
    magic_sync::settings::define();
    magic_sync::pg::define_wake(process_shared_preload_libraries_in_progress);
    if (process_shared_preload_libraries_in_progress) magic_sync::pg::register_relay_workers();
}

// sync.wake(): the relay runs as soon as the current transaction commits.
MAGIC_SYNC_FUNCTION(magic_sync_wake) {
    magic_sync::pg::wake_relay_at_commit();
    return Datum(0);
}
