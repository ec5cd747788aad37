// The sender's log: one line per event on stderr, with a UTC timestamp.
#pragma once

#include <string>

namespace magic_sync::sender {

void log_line(const std::string& text);

}  // namespace magic_sync::sender
