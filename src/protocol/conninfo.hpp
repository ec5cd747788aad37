// What may be logged of a libpq connection string that does not parse.
#pragma once

#include <string>

namespace magic_sync::protocol {

// "the connection string does not parse: <why>" from PQconninfoParse's error (null: out of
// memory). libpq's reason quotes the string's own text: a password cut short by a bad %-escape
// ("invalid percent-encoded token: "hunter2%zz""), the whole URI when an IPv6 bracket is not
// closed. What it quotes is left out, and only its first line is kept.
std::string unparsable_conninfo(const char* libpq_reason);

}  // namespace magic_sync::protocol
