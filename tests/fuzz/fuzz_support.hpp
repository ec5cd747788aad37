// Shared by the libFuzzer targets of tests/fuzz/: a property that fails prints what it expected
// and aborts, which libFuzzer reports as a crash and saves the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace magic_sync::fuzz {

// The first bytes of `text`, printable, for a failure message.
inline std::string excerpt(std::string_view text) {
    constexpr size_t kMaxBytes = 200;
    std::string out;
    for (unsigned char c : text.substr(0, kMaxBytes)) {
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
            out += escaped;
        }
    }
    if (text.size() > kMaxBytes) out += "...";
    return out;
}

[[noreturn]] inline void fail(const char* property, std::string_view detail) {
    std::fprintf(stderr, "\nfuzz property broken: %s\n  %s\n", property, excerpt(detail).c_str());
    std::abort();
}

inline void check(bool holds, const char* property, std::string_view detail = {}) {
    if (!holds) fail(property, detail);
}

}  // namespace magic_sync::fuzz
