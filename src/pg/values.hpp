// Conversions between PostgreSQL datums and C++ values, each guarded.
#pragma once

#include <string>
#include <string_view>

#include "pg/bridge.hpp"

namespace magic_sync::pg {

// The text (or bytea) argument `n` of the call, copied out.
std::string text_arg(FunctionCallInfo fcinfo, int n);

// A text datum holding `value`, in the current memory context.
Datum text_datum(std::string_view value);

}  // namespace magic_sync::pg
