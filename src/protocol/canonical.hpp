// Canonical JSON: the one spelling of a JSON value that key and row hashes are computed over, on
// the server and on every replica. Two texts of the same value have the same canonical form, and
// canonical_json(canonical_json(x)) == canonical_json(x).
//
// The canonical form of a value:
//   - no whitespace outside strings;
//   - object members sorted by key, comparing the keys' UTF-8 bytes as unsigned bytes;
//   - strings written as nlohmann::json::dump writes them with ensure_ascii=false: `"` and `\`
//     escaped, \b \f \n \r \t for those controls, other bytes below 0x20 as \u00XX (lowercase
//     hex), everything else (including `/`, DEL and non-ASCII) as the UTF-8 bytes themselves;
//   - numbers as written in the input: 12.50, 1E+3, -0.0 and 123456789012345678901234567890.123
//     all stay as they are. The one exception: an integer that fits in 64 bits is written in
//     shortest form, which differs from the input only for -0 (written 0, as PostgreSQL does);
//   - true, false and null as themselves.
// Refused with DecodeError: text that is not exactly one JSON value (RFC 8259; a leading UTF-8 BOM
// is skipped, comments are refused), duplicate keys in an object, invalid UTF-8 or lone
// surrogates, numbers whose value overflows a double (e.g. 1e400), input longer than
// limits.max_bytes, nesting deeper than limits.max_depth, a string or key longer than
// limits.max_string.
#pragma once

#include "protocol/pure.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/limits.hpp"

namespace magic_sync::protocol {

std::string canonical_json(std::string_view text, const Limits& limits = Limits{});
// canonical_json of `object` (a JSON object, DecodeError otherwise) without its members named in
// `hidden`.
std::string canonical_object_without(std::string_view object,
                                     const std::vector<std::string>& hidden,
                                     const Limits& limits = Limits{});

// The first number of `json` (valid JSON, e.g. an uploaded row) that no double holds, as written;
// none when every number fits one. Such a row cannot go down to a replica, which may read its
// numbers as doubles (row_travels says so).
std::optional<std::string> number_past_double(std::string_view json);
// "the row holds N, a number no double holds" when `json` has one (N cut to 40 characters); none
// when it has none.
std::optional<std::string> number_past_double_problem(std::string_view json);

// A value the server cannot send exactly (a jsonb holding JSON null, which a replica could not
// tell from SQL NULL; an array whose lower bound is not 1) is encoded in its row as a string that
// begins with the character NUL, which no PostgreSQL text or jsonb can hold, followed by what is
// wrong: `not_exact_marker(reason)`. Such a row is withheld (row_travels), the reason set aside.
std::string not_exact_marker(std::string_view reason);
// The reason of the first such string of `json` (valid JSON, e.g. an encoded row); none when it
// has none.
std::optional<std::string> not_exact_reason(std::string_view json);

// Appends `value` as a canonical JSON string (quotes included). Throws std::invalid_argument if
// `value` is not valid UTF-8.
void append_json_string(std::string& out, std::string_view value);

// Appends the canonical JSON object of `members` (key, canonical value), which must be sorted
// bytewise by key and unique. Throws std::invalid_argument if a key is not valid UTF-8.
void append_json_object(std::string& out,
                        const std::vector<std::pair<std::string, std::string>>& members);

}  // namespace magic_sync::protocol
