#include "pg/values.hpp"

extern "C" {
#include "utils/builtins.h"
}

namespace magic_sync::pg {

std::string text_arg(FunctionCallInfo fcinfo, int n) {
    struct varlena* value = guard([&] { return PG_DETOAST_DATUM_PACKED(PG_GETARG_DATUM(n)); });
    return std::string(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
}

Datum text_datum(std::string_view value) {
    return guard([&] {
        return PointerGetDatum(
            cstring_to_text_with_len(value.data(), static_cast<int>(value.size())));
    });
}

}  // namespace magic_sync::pg
