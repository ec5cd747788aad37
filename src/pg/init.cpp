// The library's entry point: settings now; the relay worker joins here when preloaded.
extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

#include "pg/settings.hpp"

extern "C" {
PG_MODULE_MAGIC;

PGDLLEXPORT void _PG_init(void);
}

void _PG_init(void) { magic_sync::settings::define(); }
