#include "pg/values.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/uuid.h"
}

namespace magic_sync::pg {

bool arg_is_null(FunctionCallInfo fcinfo, int n) { return PG_ARGISNULL(n); }

Datum null_result(FunctionCallInfo fcinfo) { PG_RETURN_NULL(); }

std::string text_arg(FunctionCallInfo fcinfo, int n) {
    struct varlena* value =
        guard([&]() noexcept { return PG_DETOAST_DATUM_PACKED(PG_GETARG_DATUM(n)); });
    return std::string(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
}

std::string jsonb_text_arg(FunctionCallInfo fcinfo, int n) {
    char* text = guard([&]() noexcept {
        Jsonb* jsonb = PG_GETARG_JSONB_P(n);
        return JsonbToCString(nullptr, &jsonb->root, VARSIZE(jsonb));
    });
    std::string result(text);
    guard([&]() noexcept { pfree(text); });
    return result;
}

int64_t int64_arg(FunctionCallInfo fcinfo, int n) { return PG_GETARG_INT64(n); }

std::string uuid_arg(FunctionCallInfo fcinfo, int n) {
    char* text = guard([&]() noexcept {
        return DatumGetCString(DirectFunctionCall1(uuid_out, PG_GETARG_DATUM(n)));
    });
    return std::string(text);
}

std::vector<std::optional<std::string>> text_array_arg(FunctionCallInfo fcinfo, int n) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    guard([&]() noexcept {
        ArrayType* array = PG_GETARG_ARRAYTYPE_P(n);
        deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &count);
    });
    std::vector<std::optional<std::string>> result;
    result.reserve(count);
    for (int i = 0; i < count; ++i) {
        if (nulls[i]) {
            result.emplace_back(std::nullopt);
        } else {
            auto* value = reinterpret_cast<struct varlena*>(DatumGetPointer(elements[i]));
            result.emplace_back(std::string(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value)));
        }
    }
    return result;
}

std::vector<int64_t> int64_array_arg(FunctionCallInfo fcinfo, int n) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    guard([&]() noexcept {
        ArrayType* array = PG_GETARG_ARRAYTYPE_P(n);
        deconstruct_array(array, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
                          &elements, &nulls, &count);
    });
    std::vector<int64_t> result;
    result.reserve(count);
    for (int i = 0; i < count; ++i) {
        if (nulls[i])
            throw Error("a bigint[] argument holds a NULL", ERRCODE_NULL_VALUE_NOT_ALLOWED);
        result.push_back(DatumGetInt64(elements[i]));
    }
    return result;
}

Datum text_datum(std::string_view value) {
    return guard([&]() noexcept {
        return PointerGetDatum(
            cstring_to_text_with_len(value.data(), static_cast<int>(value.size())));
    });
}

Datum jsonb_datum(const std::string& json) {
    return guard(
        [&]() noexcept { return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.c_str())); });
}

Datum bytea_datum(std::string_view bytes) {
    return guard([&]() noexcept {
        auto* result = static_cast<bytea*>(palloc(VARHDRSZ + bytes.size()));
        SET_VARSIZE(result, VARHDRSZ + bytes.size());
        memcpy(VARDATA(result), bytes.data(), bytes.size());
        return PointerGetDatum(result);
    });
}

Datum int64_record(FunctionCallInfo fcinfo, const std::vector<int64_t>& fields) {
    return guard([&]() noexcept {
        TupleDesc descriptor;
        if (get_call_result_type(fcinfo, nullptr, &descriptor) != TYPEFUNC_COMPOSITE)
            elog(ERROR, "magic_sync: function returning a record called in a wrong context");
        descriptor = BlessTupleDesc(descriptor);
        if (descriptor->natts != static_cast<int>(fields.size()))
            elog(ERROR, "magic_sync: result has %d fields, expected %d", descriptor->natts,
                 static_cast<int>(fields.size()));
        Datum values[16];
        bool nulls[16] = {};
        for (size_t i = 0; i < fields.size() && i < 16; ++i) values[i] = Int64GetDatum(fields[i]);
        return HeapTupleGetDatum(heap_form_tuple(descriptor, values, nulls));
    });
}

}  // namespace magic_sync::pg
