#include "pg/session.hpp"

#include "pg/bridge.hpp"

extern "C" {
#include "utils/guc.h"
}

namespace magic_sync::pg {

int open_settings_level() {
    return guard([] { return NewGUCNestLevel(); });
}

// As index builds do for the functions they call: an abort-style pop restores prior values.
void undo_settings(int level) {
    guard([&] { AtEOXact_GUC(false, level); });
}

void log_line(const std::string& line) {
    guard([&] { ereport(LOG, (errmsg_internal("%s", line.c_str()))); });
}

}  // namespace magic_sync::pg
