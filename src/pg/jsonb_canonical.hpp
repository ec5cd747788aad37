// Canonical JSON (protocol/canonical.hpp) of a jsonb argument, walked in its binary form.
#pragma once

#include <optional>
#include <string>

#include "pg/bridge.hpp"
#include "protocol/limits.hpp"

namespace magic_sync::pg {

// The canonical JSON of the jsonb argument `n`, the same as protocol::canonical_json of its text
// output; nullopt when the value breaks `limits`, holds a number a double cannot hold or a string
// that is not UTF-8: the caller then encodes the text, which refuses it with the exact error.
std::optional<std::string> jsonb_canonical_arg(FunctionCallInfo fcinfo, int n,
                                               const protocol::Limits& limits);

}  // namespace magic_sync::pg
