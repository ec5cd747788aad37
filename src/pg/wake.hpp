// Waking the relay: the session that holds the relay lock registers its latch in shared memory,
// and a transaction that wrote notes (or settled a message) sets that latch when it commits, so
// the relay runs at once instead of waiting out magic_sync.idle.
#pragma once

namespace magic_sync::pg {

// Called from _PG_init: shared memory (when preloaded) and the commit callback.
void define_wake(bool preloaded);

// The current transaction asks for the relay to run when it commits.
void wake_relay_at_commit();

// This session runs passes for its database: commits elsewhere set its latch.
void register_relay_latch();

// Whether commits can wake the relay: not without shared_preload_libraries (no shared memory for
// the latch), where the relay looks every magic_sync.idle instead.
bool relay_can_be_woken();

}  // namespace magic_sync::pg
