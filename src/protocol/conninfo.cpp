#include "protocol/conninfo.hpp"

namespace magic_sync::protocol {

std::string without_quoted_text(const std::string& reason) {
    std::string out;
    bool quoted = false;
    for (char c : reason) {
        if (c == '"') {
            if (!quoted) out += "\"...\"";
            quoted = !quoted;
        } else if (!quoted) {
            out += c;
        }
    }
    return out;
}

}  // namespace magic_sync::protocol
