// The capture triggers: AFTER INSERT / UPDATE / DELETE FOR EACH ROW, and AFTER TRUNCATE FOR EACH
// STATEMENT. A row firing reads the key of the row it changed (an UPDATE's key only when the row's
// content changed; its old key too when the key changed) and keeps it in the backend with the
// transaction's other keys (pending.hpp): one note per synced table is written when the
// transaction commits. A TRUNCATE notes the whole table at once.
//
// No transition tables (PostgreSQL would copy every changed row into them) and no note per
// statement: a transaction pays for one note per table however many statements it runs. What a
// row trigger and a note row cost is in bench/README.md ("Capture").
//
// A statement trigger on INSERT / UPDATE / DELETE is one made by an earlier release (release
// 0.1.0's, met between an update of the library and ALTER EXTENSION magic_sync UPDATE, which
// makes the triggers again): it notes the whole table, as a TRUNCATE does, which is always right.
//
// Trigger arguments: the codec id (0 for the replicas relation), then the key columns.
extern "C" {
#include "postgres.h"

#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/rel.h"
}

#include "capture/note_table.hpp"
#include "capture/pending.hpp"
#include "pg/bridge.hpp"
#include "pg/wake.hpp"

namespace {

// The key columns of the trigger's relation, by the names the trigger was given.
struct KeyColumns {
    Oid relation;
    Oid trigger;
    int count;
    AttrNumber* attributes;
    char** names;
};

void refuse_trigger(const TriggerData* data) {
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("trigger \"%s\" on \"%s\" was not created by magic_sync",
                           data->tg_trigger->tgname, RelationGetRelationName(data->tg_relation)),
                    errhint("Declare the table with sync.catalog(), sync.record() or "
                            "sync.both(); they install the capture triggers.")));
}

// The key columns, found once per query and trigger rather than once per row: kept in the
// function's fn_extra, which lives as long as the query's trigger state (a partition has its own).
const KeyColumns* key_columns(FunctionCallInfo fcinfo, const TriggerData* data) {
    const Trigger* trigger = data->tg_trigger;
    const Oid relation = RelationGetRelid(data->tg_relation);
    auto* key = static_cast<KeyColumns*>(fcinfo->flinfo->fn_extra);
    if (key != nullptr && key->relation == relation && key->trigger == trigger->tgoid) return key;
    MemoryContext memory = fcinfo->flinfo->fn_mcxt;
    key = static_cast<KeyColumns*>(MemoryContextAllocZero(memory, sizeof(KeyColumns)));
    TupleDesc descriptor = RelationGetDescr(data->tg_relation);
    key->relation = relation;
    key->trigger = trigger->tgoid;
    key->count = trigger->tgnargs - 1;
    key->names = trigger->tgargs + 1;
    key->attributes =
        static_cast<AttrNumber*>(MemoryContextAlloc(memory, sizeof(AttrNumber) * key->count));
    for (int i = 0; i < key->count; ++i) {
        key->attributes[i] = InvalidAttrNumber;
        for (int a = 0; a < descriptor->natts; ++a) {
            Form_pg_attribute form = TupleDescAttr(descriptor, a);
            if (!form->attisdropped && strcmp(NameStr(form->attname), key->names[i]) == 0)
                key->attributes[i] = form->attnum;
        }
        if (key->attributes[i] == InvalidAttrNumber) refuse_trigger(data);
    }
    fcinfo->flinfo->fn_extra = key;
    return key;
}

// Whether two versions of a row hold the same value in column `a` (0-based), as stored. Both
// slots are deformed.
bool same_column(TupleTableSlot* old_row, TupleTableSlot* new_row, TupleDesc descriptor, int a) {
    Form_pg_attribute form = TupleDescAttr(descriptor, a);
    if (old_row->tts_isnull[a] || new_row->tts_isnull[a])
        return old_row->tts_isnull[a] == new_row->tts_isnull[a];
    return datum_image_eq(old_row->tts_values[a], new_row->tts_values[a], form->attbyval,
                          form->attlen);
}

// Whether two versions of a row are the same, column by column.
bool same_row(TupleTableSlot* old_row, TupleTableSlot* new_row, TupleDesc descriptor) {
    slot_getallattrs(old_row);
    slot_getallattrs(new_row);
    for (int a = 0; a < descriptor->natts; ++a) {
        if (!TupleDescAttr(descriptor, a)->attisdropped &&
            !same_column(old_row, new_row, descriptor, a))
            return false;
    }
    return true;
}

// Whether two versions of a row (deformed by same_row) have the same key.
bool same_key(const KeyColumns* key, TupleTableSlot* old_row, TupleTableSlot* new_row,
              TupleDesc descriptor) {
    for (int i = 0; i < key->count; ++i) {
        if (!same_column(old_row, new_row, descriptor, key->attributes[i] - 1)) return false;
    }
    return true;
}

// Notes the key(s) of the row a row firing changed.
void note_row(FunctionCallInfo fcinfo, const TriggerData* data, int32 codec) {
    const KeyColumns* key = key_columns(fcinfo, data);
    TupleDesc descriptor = RelationGetDescr(data->tg_relation);
    const Oid function = fcinfo->flinfo->fn_oid;
    TupleTableSlot* row = data->tg_trigslot;
    if (TRIGGER_FIRED_BY_UPDATE(data->tg_event)) {
        TupleTableSlot* new_row = data->tg_newslot;
        if (same_row(row, new_row, descriptor)) return;
        magic_sync::capture::note_key(function, codec, new_row, descriptor, key->attributes,
                                      key->names, key->count);
        if (same_key(key, row, new_row, descriptor)) return;
    }
    magic_sync::capture::note_key(function, codec, row, descriptor, key->attributes, key->names,
                                  key->count);
}

// C-style on purpose: it runs inside pg::guard(), where no C++ object may live.
void capture(FunctionCallInfo fcinfo) {
    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("sync.capture() is a trigger function: it can only be called by "
                               "a trigger")));
    auto* data = reinterpret_cast<TriggerData*>(fcinfo->context);
    if (!TRIGGER_FIRED_AFTER(data->tg_event))
        ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                        errmsg("sync.capture() must fire AFTER INSERT OR UPDATE OR DELETE FOR "
                               "EACH ROW, or AFTER TRUNCATE")));
    const Trigger* trigger = data->tg_trigger;
    if (trigger->tgnargs < 1 || (TRIGGER_FIRED_FOR_ROW(data->tg_event) && trigger->tgnargs < 2))
        refuse_trigger(data);
    const int32 codec = pg_strtoint32(trigger->tgargs[0]);
    if (TRIGGER_FIRED_FOR_ROW(data->tg_event)) {
        note_row(fcinfo, data, codec);
        return;
    }
    magic_sync::capture::write_note(fcinfo->flinfo->fn_oid, codec, nullptr, 0);
    magic_sync::pg::wake_relay_at_commit();
}

}  // namespace

MAGIC_SYNC_FUNCTION(magic_sync_capture) {
    magic_sync::pg::guard([&]() noexcept { capture(fcinfo); });
    return PointerGetDatum(nullptr);
}
