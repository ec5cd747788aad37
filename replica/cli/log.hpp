// magic-sync-replica's log: a line to stderr, stamped with the time.
#pragma once

#include <string>

#include "program/log_line.hpp"

namespace magic_sync::replica {

inline void log(const std::string& line) { program::log_line("magic-sync-replica", line); }

}  // namespace magic_sync::replica
