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

// The canonical JSON of to_jsonb(row) without the `hidden` columns, for the composite argument
// `n`, written from the row's columns; nullopt when a column is of a type to_jsonb treats in a way
// not written out here, or the walk is undecided as above: the caller then goes through to_jsonb.
std::optional<std::string> row_canonical_arg(FunctionCallInfo fcinfo, int n,
                                             const std::vector<std::string>& hidden,
                                             const protocol::Limits& limits);

}  // namespace magic_sync::pg
