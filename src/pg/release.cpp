#include "pg/release.hpp"

#include "pg/bridge.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
}

namespace magic_sync::pg {

char* installed_release_or_null() {
    Relation extensions = table_open(ExtensionRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
                CStringGetDatum("magic_sync"));
    SysScanDesc scan = systable_beginscan(extensions, ExtensionNameIndexId, true, nullptr, 1, &key);
    HeapTuple tuple = systable_getnext(scan);
    char* release = nullptr;
    if (HeapTupleIsValid(tuple)) {
        bool is_null = true;
        Datum version = heap_getattr(tuple, Anum_pg_extension_extversion,
                                     RelationGetDescr(extensions), &is_null);
        if (!is_null) release = text_to_cstring(DatumGetTextPP(version));
    }
    systable_endscan(scan);
    table_close(extensions, AccessShareLock);
    return release;
}

std::optional<std::string> installed_release() {
    const char* release = guard([]() noexcept { return installed_release_or_null(); });
    if (release == nullptr) return std::nullopt;
    return std::string(release);
}

}  // namespace magic_sync::pg
