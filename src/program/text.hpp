// Text helpers the programs (magic-sync-sender, magic-sync-replica) share.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace magic_sync::program {

// ASCII lower case: HTTP header names, codings and keywords compared without case.
inline std::string lowercase(std::string_view text) {
    std::string lower(text);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower;
}

}  // namespace magic_sync::program
