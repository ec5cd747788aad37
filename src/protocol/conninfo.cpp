#include "protocol/conninfo.hpp"

#include <algorithm>

namespace magic_sync::protocol {

std::string unparsable_conninfo(const char* libpq_reason) {
    std::string reason = libpq_reason == nullptr ? "out of memory" : libpq_reason;
    reason.resize(std::min(reason.size(), reason.find('\n')));
    std::string shown;
    bool quoted = false;
    for (char c : reason) {
        if (c == '"') {
            if (!quoted) shown += "\"...\"";
            quoted = !quoted;
        } else if (!quoted) {
            shown += c;
        }
    }
    return "the connection string does not parse: " + shown +
           " (what it quotes is not shown: it may be a password)";
}

}  // namespace magic_sync::protocol
