// sync_internal.history(): "<system identifier>/<timeline>", the cluster's part of the origin a
// message names (src/relay/outbox.sql). Both come from shared memory: the SQL this replaces read
// the control file from disk (pg_control_system()) at every pass, upload and lease.
#include <string>

#include "pg/bridge.hpp"
#include "pg/values.hpp"

extern "C" {
#include "access/xlog.h"
}

MAGIC_SYNC_FUNCTION(magic_sync_history) {
    if (RecoveryInProgress())
        throw magic_sync::Error("recovery is in progress: a standby writes no history of its own",
                                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE);
    // Signed, as pg_control_system() shows it.
    const std::string history = std::to_string(static_cast<int64>(GetSystemIdentifier())) + "/" +
                                std::to_string(GetWALInsertionTimeLine());
    return magic_sync::pg::text_datum(history);
}
