// The capture trigger: statement-level, AFTER INSERT / UPDATE / DELETE with transition tables,
// and AFTER TRUNCATE. Each firing writes one note per changed key in a single INSERT ... SELECT
// over the transition tables; nothing else is read.
//
// Trigger arguments: the codec id (0 for the replicas relation), then the key columns.
// The INSERT is planned once per trigger and kept for the backend's life.
extern "C" {
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
}

#include "pg/bridge.hpp"
#include "pg/wake.hpp"

namespace {

struct CachedPlan {
    Oid trigger;  // hash key
    SPIPlanPtr plan;
};

HTAB* plans = nullptr;

// pg_catalog.jsonb_build_object('a', <alias>."a", ...) for the key columns. Every name in these
// statements is qualified: they run as the extension's owner under the writer's search_path.
void append_key(StringInfo sql, const Trigger* trigger, const char* alias) {
    appendStringInfoString(sql, "pg_catalog.jsonb_build_object(");
    for (int i = 1; i < trigger->tgnargs; ++i) {
        const char* column = trigger->tgargs[i];
        appendStringInfo(sql, "%s%s, %s.%s", i > 1 ? ", " : "", quote_literal_cstr(column), alias,
                         quote_identifier(column));
    }
    appendStringInfoChar(sql, ')');
}

// An UPDATE notes the old key of a row whose key changed, the new key of every row whose
// content changed, and nothing for a row it left as it was. Each side's keys are built once; they
// are matched as jsonb, whose equality needs no operator of the key's type.
void append_update_select(StringInfo sql, const Trigger* trigger) {
    appendStringInfoString(sql, "CASE WHEN n.k IS NULL THEN o.k ELSE n.k END FROM (SELECT ");
    append_key(sql, trigger, "o");
    appendStringInfoString(
        sql, " AS k, o::pg_catalog.text AS t FROM magic_sync_old o) o FULL JOIN (SELECT ");
    append_key(sql, trigger, "n");
    appendStringInfoString(sql,
                           " AS k, n::pg_catalog.text AS t FROM magic_sync_new n) n"
                           " ON o.k OPERATOR(pg_catalog.=) n.k"
                           " WHERE o.k IS NULL OR n.k IS NULL OR o.t OPERATOR(pg_catalog.<>) n.t");
}

SPIPlanPtr plan_for(const TriggerData* data) {
    const Trigger* trigger = data->tg_trigger;
    if (plans == nullptr) {
        HASHCTL control = {};
        control.keysize = sizeof(Oid);
        control.entrysize = sizeof(CachedPlan);
        control.hcxt = TopMemoryContext;
        plans = hash_create("magic_sync capture plans", 64, &control,
                            HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    bool found = false;
    auto* cached = static_cast<CachedPlan*>(hash_search(plans, &trigger->tgoid, HASH_FIND, &found));
    if (found) return cached->plan;

    if (trigger->tgnargs < 1 ||
        (!TRIGGER_FIRED_BY_TRUNCATE(data->tg_event) && trigger->tgnargs < 2))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("trigger \"%s\" on \"%s\" was not created by magic_sync",
                               trigger->tgname, RelationGetRelationName(data->tg_relation)),
                        errhint("Declare the table with sync.catalog(), sync.record() or "
                                "sync.both(); they install the capture triggers.")));
    const int codec = pg_strtoint32(trigger->tgargs[0]);

    StringInfoData sql;
    initStringInfo(&sql);
    if (TRIGGER_FIRED_BY_TRUNCATE(data->tg_event)) {
        appendStringInfo(&sql, "INSERT INTO sync.note (codec, key) VALUES (%d, NULL)", codec);
    } else {
        appendStringInfo(&sql, "INSERT INTO sync.note (codec, key) SELECT %d, ", codec);
        if (TRIGGER_FIRED_BY_UPDATE(data->tg_event)) {
            append_update_select(&sql, trigger);
        } else if (TRIGGER_FIRED_BY_INSERT(data->tg_event)) {
            append_key(&sql, trigger, "n");
            appendStringInfoString(&sql, " FROM magic_sync_new n");
        } else {
            append_key(&sql, trigger, "o");
            appendStringInfoString(&sql, " FROM magic_sync_old o");
        }
    }
    SPIPlanPtr plan = SPI_prepare(sql.data, 0, nullptr);
    if (plan == nullptr)
        elog(ERROR, "magic_sync capture: could not plan \"%s\": %s", sql.data,
             SPI_result_code_string(SPI_result));
    SPI_keepplan(plan);
    cached = static_cast<CachedPlan*>(hash_search(plans, &trigger->tgoid, HASH_ENTER, &found));
    cached->plan = plan;
    pfree(sql.data);
    return plan;
}

// The owner of sync.capture(), looked up once per call site.
Oid owner_of(FunctionCallInfo fcinfo) {
    if (fcinfo->flinfo->fn_extra == nullptr) {
        HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
        if (!HeapTupleIsValid(proc))
            elog(ERROR, "magic_sync capture: function %u not found", fcinfo->flinfo->fn_oid);
        auto* owner = static_cast<Oid*>(MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, sizeof(Oid)));
        *owner = reinterpret_cast<Form_pg_proc>(GETSTRUCT(proc))->proowner;
        ReleaseSysCache(proc);
        fcinfo->flinfo->fn_extra = owner;
    }
    return *static_cast<Oid*>(fcinfo->flinfo->fn_extra);
}

// C-style on purpose: it runs inside pg::guard(), where no C++ object may live.
void capture(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("sync.capture() is a trigger function: it can only be called by "
                               "a trigger")));
    auto* data = reinterpret_cast<TriggerData*>(fcinfo->context);
    if (!TRIGGER_FIRED_FOR_STATEMENT(data->tg_event) || !TRIGGER_FIRED_AFTER(data->tg_event))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("sync.capture() must fire AFTER ... FOR EACH STATEMENT")));
    // A statement that changed no row notes nothing (a TRUNCATE always notes).
    if (!TRIGGER_FIRED_BY_TRUNCATE(data->tg_event)) {
        Tuplestorestate* rows =
            data->tg_newtable != nullptr ? data->tg_newtable : data->tg_oldtable;
        if (rows == nullptr)
            ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                            errmsg("sync.capture() needs the trigger's transition tables")));
        if (tuplestore_tuple_count(rows) == 0) return;
    }
    // Whoever writes a synced table notes its changes without any privilege on sync.note: the
    // notes are written as the function's owner (cheaper than SECURITY DEFINER, which would save
    // and restore settings on every call). An error's abort restores the writer.
    Oid writer = InvalidOid;
    int security_context = 0;
    GetUserIdAndSecContext(&writer, &security_context);
    SetUserIdAndSecContext(owner_of(fcinfo), security_context | SECURITY_LOCAL_USERID_CHANGE |
                                                 SECURITY_RESTRICTED_OPERATION);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "magic_sync capture: SPI_connect failed");
    if (SPI_register_trigger_data(data) != SPI_OK_TD_REGISTER)
        elog(ERROR, "magic_sync capture: could not register the transition tables");
    int result = SPI_execute_plan(plan_for(data), nullptr, nullptr, false, 0);
    if (result != SPI_OK_INSERT)
        elog(ERROR, "magic_sync capture: writing notes failed: %s", SPI_result_code_string(result));
    SPI_finish();
    SetUserIdAndSecContext(writer, security_context);
    magic_sync::pg::wake_relay_at_commit();
}

}  // namespace

MAGIC_SYNC_FUNCTION(magic_sync_capture) {
    magic_sync::pg::guard([&] { capture(fcinfo); });
    return PointerGetDatum(nullptr);
}
