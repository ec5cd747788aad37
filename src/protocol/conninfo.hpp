// What may be logged of a libpq connection string that does not parse.
#pragma once

#include <string>

namespace magic_sync::protocol {

// libpq's reason for a connection string it cannot parse quotes the string's own text: a password
// cut short by a bad %-escape ("invalid percent-encoded token: "hunter2%zz""), the whole URI when
// an IPv6 bracket is not closed. This is the reason with whatever it quotes left out.
std::string without_quoted_text(const std::string& reason);

}  // namespace magic_sync::protocol
