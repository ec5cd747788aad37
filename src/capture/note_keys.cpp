#include "capture/note_keys.hpp"

extern "C" {
#include "access/detoast.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"
}

#include "pg/bridge.hpp"

namespace magic_sync::capture {

void begin_keys(StringInfo image, TupleDesc descriptor, const AttrNumber* attributes,
                char* const* names, int columns) {
    const int32 count = columns;
    appendBinaryStringInfo(image, reinterpret_cast<const char*>(&count), sizeof(count));
    for (int i = 0; i < columns; ++i) {
        const Oid type = TupleDescAttr(descriptor, attributes[i] - 1)->atttypid;
        appendBinaryStringInfo(image, reinterpret_cast<const char*>(&type), sizeof(type));
        appendBinaryStringInfo(image, names[i], static_cast<int>(strlen(names[i])) + 1);
    }
}

void add_key(StringInfo image, TupleTableSlot* slot, TupleDesc descriptor,
             const AttrNumber* attributes, int columns) {
    for (int i = 0; i < columns; ++i) {
        Form_pg_attribute form = TupleDescAttr(descriptor, attributes[i] - 1);
        bool is_null = false;
        Datum value = slot_getattr(slot, attributes[i], &is_null);
        // A value kept out of line or compressed is copied whole: the image must not point
        // into TOAST that may be gone when the pass reads it.
        if (!is_null && form->attlen == -1 && VARATT_IS_EXTENDED(DatumGetPointer(value)))
            value = PointerGetDatum(
                detoast_attr(reinterpret_cast<struct varlena*>(DatumGetPointer(value))));
        const Size size = datumEstimateSpace(value, is_null, form->attbyval, form->attlen);
        enlargeStringInfo(image, static_cast<int>(size));
        char* end = image->data + image->len;
        datumSerialize(value, is_null, form->attbyval, form->attlen, &end);
        image->len += static_cast<int>(size);
        image->data[image->len] = '\0';
    }
}

namespace {

void refuse_image() {
    ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
                    errmsg("sync.note_keys was given bytes that are not a note's keys")));
}

// Reads `size` bytes at `*at` of an image that ends at `end`.
void take(char** at, const char* end, void* into, size_t size) {
    if (static_cast<size_t>(end - *at) < size) refuse_image();
    memcpy(into, *at, size);
    *at += size;
}

// Moves `*at` past the header of an image; returns its column count.
int32 skip_header(char** at, const char* end) {
    int32 columns = 0;
    take(at, end, &columns, sizeof(columns));
    if (columns < 1 || columns > FUNC_MAX_ARGS / 2) refuse_image();
    for (int i = 0; i < columns; ++i) {
        Oid type = InvalidOid;
        take(at, end, &type, sizeof(type));
        const char* name_end = static_cast<const char*>(memchr(*at, '\0', end - *at));
        if (name_end == nullptr) refuse_image();
        *at = const_cast<char*>(name_end) + 1;
    }
    return columns;
}

// Moves `*at` past one value as datumSerialize wrote it.
void skip_value(char** at, const char* end) {
    int header = 0;
    take(at, end, &header, sizeof(header));
    const ptrdiff_t size = header == -2 ? 0 : header == -1 ? sizeof(Datum) : header;
    if (header < -2 || end - *at < size) refuse_image();
    *at += size;
}

// sync_internal.note_keys_from(keys bytea, first int) RETURNS bytea: the image of the keys from the
// first-th on (1-based): what is left of a note the pass took part of.
Datum note_keys_from(FunctionCallInfo fcinfo) {
    bytea* image = PG_GETARG_BYTEA_PP(0);
    const int32 first = PG_GETARG_INT32(1);
    char* begin = VARDATA_ANY(image);
    char* at = begin;
    const char* end = at + VARSIZE_ANY_EXHDR(image);
    const int32 columns = skip_header(&at, end);
    const size_t header = at - begin;
    for (int32 key = 1; key < first && at < end; ++key)
        for (int i = 0; i < columns; ++i) skip_value(&at, end);
    const size_t rest = end - at;
    auto* left = static_cast<bytea*>(palloc(VARHDRSZ + header + rest));
    SET_VARSIZE(left, VARHDRSZ + header + rest);
    memcpy(VARDATA(left), begin, header);
    memcpy(VARDATA(left) + header, at, rest);
    return PointerGetDatum(left);
}

// sync.note_keys(keys bytea [, most int]) RETURNS SETOF jsonb: the keys of a note, in the order
// noted, the first `most` of them when given. When a key column's type no longer exists, one NULL:
// every row of the codec is looked at again. Each key is built in a context of its own, emptied
// once the tuplestore has copied it: a transaction's note may hold millions of keys.
void note_keys(FunctionCallInfo fcinfo) {
    bytea* image = PG_GETARG_BYTEA_PP(0);
    const int64 most = PG_NARGS() > 1 ? PG_GETARG_INT32(1) : PG_INT64_MAX;
    char* at = VARDATA_ANY(image);
    const char* end = at + VARSIZE_ANY_EXHDR(image);
    InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
    auto* result = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);

    int32 columns = 0;
    take(&at, end, &columns, sizeof(columns));
    if (columns < 1 || columns > FUNC_MAX_ARGS / 2) refuse_image();
    const int nargs = 2 * columns;
    auto* call = static_cast<FunctionCallInfo>(palloc0(SizeForFunctionCallInfo(nargs)));
    List* arguments = NIL;
    bool types_exist = true;
    for (int i = 0; i < columns; ++i) {
        Oid type = InvalidOid;
        take(&at, end, &type, sizeof(type));
        const char* name = at;
        const char* name_end = static_cast<const char*>(memchr(at, '\0', end - at));
        if (name_end == nullptr) refuse_image();
        at = const_cast<char*>(name_end) + 1;
        if (!SearchSysCacheExists1(TYPEOID, ObjectIdGetDatum(type))) {
            types_exist = false;
            continue;
        }
        call->args[2 * i].value = CStringGetTextDatum(name);
        call->args[2 * i].isnull = false;
        arguments = lappend(arguments, makeNullConst(TEXTOID, -1, InvalidOid));
        arguments = lappend(arguments, makeNullConst(type, -1, InvalidOid));
    }
    Datum null_key = 0;
    bool is_null = true;
    if (!types_exist) {
        tuplestore_putvalues(result->setResult, result->setDesc, &null_key, &is_null);
        return;
    }
    FmgrInfo function;
    fmgr_info(F_JSONB_BUILD_OBJECT_ANY, &function);
    fmgr_info_set_expr(
        reinterpret_cast<Node*>(makeFuncExpr(F_JSONB_BUILD_OBJECT_ANY, JSONBOID, arguments,
                                             InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL)),
        &function);
    InitFunctionCallInfoData(*call, &function, nargs, InvalidOid, nullptr, nullptr);
    MemoryContext per_key =
        AllocSetContextCreate(CurrentMemoryContext, "magic_sync note key", ALLOCSET_SMALL_SIZES);
    for (int64 taken = 0; at < end && taken < most; ++taken) {
        MemoryContext caller = MemoryContextSwitchTo(per_key);
        for (int i = 0; i < columns; ++i) {
            int header = 0;
            if (static_cast<size_t>(end - at) < sizeof(header)) refuse_image();
            memcpy(&header, at, sizeof(header));
            const ptrdiff_t left = end - at - static_cast<ptrdiff_t>(sizeof(header));
            if ((header >= 0 && left < header) ||
                (header == -1 && left < static_cast<ptrdiff_t>(sizeof(Datum))) || header < -2)
                refuse_image();
            call->args[2 * i + 1].value = datumRestore(&at, &call->args[2 * i + 1].isnull);
        }
        call->isnull = false;
        Datum key = FunctionCallInvoke(call);
        MemoryContextSwitchTo(caller);
        is_null = false;
        tuplestore_putvalues(result->setResult, result->setDesc, &key, &is_null);
        MemoryContextReset(per_key);
    }
    MemoryContextDelete(per_key);
}

}  // namespace

}  // namespace magic_sync::capture

MAGIC_SYNC_FUNCTION(magic_sync_note_keys_from) {
    return magic_sync::pg::guard(
        [&]() noexcept { return magic_sync::capture::note_keys_from(fcinfo); });
}

MAGIC_SYNC_FUNCTION(magic_sync_note_keys) {
    magic_sync::pg::guard([&]() noexcept { magic_sync::capture::note_keys(fcinfo); });
    return static_cast<Datum>(0);
}
