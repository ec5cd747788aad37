// The magic_sync.* settings (docs/DESIGN.md §9), as the engine reads them. Defined in settings.cpp
// and registered from _PG_init.
#pragma once

namespace magic_sync::settings {

extern char* database;
extern char* role;
extern int idle_ms;
extern int notes_per_pass;
extern int rows_per_message;
extern int bytes_per_message;
extern int window;
extern int retry_every_s;
extern int audit_every_s;
extern int prune_every_s;
extern int report_every_s;
extern int send_timeout_ms;
extern int backoff_ms;
extern int backoff_max_ms;
extern int probe_every_ms;
extern int unconfirmed_after_s;
extern int max_refusals;
extern int max_upload_bytes;
extern int max_upload_rows;
extern int max_kept_items;
extern int max_kept_kb;
extern int replica_scan_s;
extern int leaf_rows;
extern int storm_window_ms;
extern int upload_memory_s;

// Registers every setting and reserves the magic_sync. prefix.
void define();

}  // namespace magic_sync::settings
