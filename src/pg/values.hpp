// Conversions between PostgreSQL datums and C++ values, each guarded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pg/bridge.hpp"

namespace magic_sync::pg {

bool arg_is_null(FunctionCallInfo fcinfo, int n);
// Returns SQL NULL from the function.
Datum null_result(FunctionCallInfo fcinfo);

// The text (or bytea) argument `n` of the call, copied out.
std::string text_arg(FunctionCallInfo fcinfo, int n);
// The jsonb argument `n`, as jsonb's text output.
std::string jsonb_text_arg(FunctionCallInfo fcinfo, int n);
int64_t int64_arg(FunctionCallInfo fcinfo, int n);
// The uuid argument `n`, as its lowercase text form.
std::string uuid_arg(FunctionCallInfo fcinfo, int n);
// A text[] argument; NULL elements are nullopt.
std::vector<std::optional<std::string>> text_array_arg(FunctionCallInfo fcinfo, int n);

// A bigint[] argument; a NULL element is an error.
std::vector<int64_t> int64_array_arg(FunctionCallInfo fcinfo, int n);

// A text datum holding `value`, in the current memory context.
Datum text_datum(std::string_view value);
// Parses `json` (ERROR if it is not JSON) into a jsonb.
Datum jsonb_datum(const std::string& json);
// A bytea datum holding `bytes`.
Datum bytea_datum(std::string_view bytes);
// A composite result of bigint fields, for a function with OUT parameters.
Datum int64_record(FunctionCallInfo fcinfo, const std::vector<int64_t>& fields);

}  // namespace magic_sync::pg
