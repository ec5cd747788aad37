#include "log.hpp"

#include "program/log_line.hpp"

namespace magic_sync::sender {

void log_line(const std::string& text) { program::log_line("magic-sync-sender", text); }

}  // namespace magic_sync::sender
