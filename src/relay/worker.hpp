// The relay's background workers, registered when magic_sync is preloaded.
#pragma once

namespace magic_sync::relay {

// The launcher, which starts a relay worker for each database named in magic_sync.database.
// Called from _PG_init while shared_preload_libraries is processed.
void register_relay_workers();

}  // namespace magic_sync::relay
