#include "pg/session.hpp"

#include "pg/bridge.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/syscache.h"
}

namespace magic_sync::pg {

int open_settings_level() {
    return guard([]() noexcept { return NewGUCNestLevel(); });
}

// As index builds do for the functions they call: an abort-style pop restores prior values.
void undo_settings(int level) {
    guard([&]() noexcept { AtEOXact_GUC(false, level); });
}

void as_extension_owner(const std::function<void()>& work) {
    const Oid owner = guard([]() noexcept {
        HeapTuple tuple = SearchSysCache1(NAMESPACEOID, get_namespace_oid("sync", false));
        if (!HeapTupleIsValid(tuple)) elog(ERROR, "schema sync has no catalog row");
        Oid nspowner = ((Form_pg_namespace)GETSTRUCT(tuple))->nspowner;
        ReleaseSysCache(tuple);
        return nspowner;
    });
    Oid saved_user;
    int saved_context;
    GetUserIdAndSecContext(&saved_user, &saved_context);
    SetUserIdAndSecContext(owner, saved_context | SECURITY_LOCAL_USERID_CHANGE);
    try {
        work();
    } catch (...) {
        SetUserIdAndSecContext(saved_user, saved_context);
        throw;
    }
    SetUserIdAndSecContext(saved_user, saved_context);
}

void log_line(const std::string& line) {
    guard([&]() noexcept { ereport(LOG, (errmsg_internal("%s", line.c_str()))); });
}

void warning(const std::string& message, const std::string& hint) {
    guard([&]() noexcept {
        ereport(WARNING, (errmsg_internal("%s", message.c_str()), errhint("%s", hint.c_str())));
    });
}

}  // namespace magic_sync::pg
