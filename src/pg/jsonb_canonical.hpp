// Canonical JSON (protocol/canonical.hpp) written straight from PostgreSQL values: a jsonb walked
// in its binary form, and a table row from its columns.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "pg/bridge.hpp"
#include "protocol/limits.hpp"

namespace magic_sync::pg {

// The canonical JSON of the jsonb argument `n`, the same as protocol::canonical_json of its text
// output; nullopt when the value breaks `limits` or holds a string that is not UTF-8: the caller
// then encodes the text, which refuses it with the exact error. A number is its numeric_out text,
// whatever its size (a row with one no double holds is withheld: protocol::row_travels).
std::optional<std::string> jsonb_canonical_arg(FunctionCallInfo fcinfo, int n,
                                               const protocol::Limits& limits);
// The same for a jsonb datum.
std::optional<std::string> jsonb_canonical(Datum jsonb, const protocol::Limits& limits);

// The canonical JSON of the composite argument `n` without the `hidden` columns, written from the
// row's columns as to_json writes them (floats exactly, as their output function does; to_jsonb
// would keep them as numerics); nullopt when the walk is undecided as above: the caller then
// goes through row_json_arg's text, which refuses it with the exact error.
std::optional<std::string> row_canonical_arg(FunctionCallInfo fcinfo, int n,
                                             const std::vector<std::string>& hidden,
                                             const protocol::Limits& limits);
// to_json of the composite argument `n`, as text.
std::string row_json_arg(FunctionCallInfo fcinfo, int n);

}  // namespace magic_sync::pg
