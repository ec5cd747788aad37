// The capture trigger: statement-level, AFTER INSERT / UPDATE / DELETE with transition tables,
// and AFTER TRUNCATE. Each firing that changed rows writes ONE note for the statement, holding the
// keys of the rows it changed (sync.note.keys, in the order they changed): the cost of a note is
// paid once per statement, not once per row, and nothing but the note row is written.
//
// The keys are read in C from the transition tables and kept as the key columns' values
// (note_keys.hpp): the pass builds their jsonb, not the writer. The note is inserted directly into
// sync.note's heap: no SPI, no plan, no executor, no privilege check (the writer needs none on
// sync), and sync.note has no index to maintain.
//
// Between an update of the library and ALTER EXTENSION magic_sync UPDATE, release 0.1.0's
// sync.note is still there: a statement then notes its whole table (write_release_note).
//
// Trigger arguments: the codec id (0 for the replicas relation), then the key columns.
extern "C" {
#include "postgres.h"

#include "access/heapam.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

#include "capture/note_keys.hpp"
#include "pg/bridge.hpp"
#include "pg/wake.hpp"

namespace {

// sync.note's columns, in the order the install script declares them.
enum NoteColumn { kSeq, kCodec, kKey, kKeys, kKeyCount, kNotedAt, kNoteColumns };
// Release 0.1.0's sync.note: seq (its primary key), codec, key, noted_at.
constexpr int kReleaseNoteColumns = 4;

// The key columns of the trigger's relation, by the names the trigger was given.
struct KeyColumns {
    int count = 0;
    AttrNumber* attributes = nullptr;
    char** names = nullptr;
};

void refuse_trigger(const TriggerData* data) {
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("trigger \"%s\" on \"%s\" was not created by magic_sync",
                           data->tg_trigger->tgname, RelationGetRelationName(data->tg_relation)),
                    errhint("Declare the table with sync.catalog(), sync.record() or "
                            "sync.both(); they install the capture triggers.")));
}

void find_key_columns(KeyColumns* key, const TriggerData* data) {
    const Trigger* trigger = data->tg_trigger;
    TupleDesc descriptor = RelationGetDescr(data->tg_relation);
    key->count = trigger->tgnargs - 1;
    key->names = trigger->tgargs + 1;
    key->attributes = static_cast<AttrNumber*>(palloc(sizeof(AttrNumber) * key->count));
    for (int i = 0; i < key->count; ++i) {
        key->attributes[i] = InvalidAttrNumber;
        for (int a = 0; a < descriptor->natts; ++a) {
            Form_pg_attribute form = TupleDescAttr(descriptor, a);
            if (!form->attisdropped && strcmp(NameStr(form->attname), key->names[i]) == 0)
                key->attributes[i] = form->attnum;
        }
        if (key->attributes[i] == InvalidAttrNumber) refuse_trigger(data);
    }
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

// A reader of its own over a transition table (other triggers may read it too).
void rewind(Tuplestorestate* rows) {
    tuplestore_select_read_pointer(rows, tuplestore_alloc_read_pointer(rows, 0));
    tuplestore_rescan(rows);
}

// The keys of the rows the statement changed (an image of note_keys.hpp), or NULL when it changed
// none: an INSERT's new rows, a DELETE's old rows; an UPDATE's rows whose content changed (by
// their new key) and, when the key changed, the old key too. An UPDATE's old and new transition
// tables hold each row's two versions at the same place.
bytea* changed_keys(const TriggerData* data, int32* count) {
    KeyColumns key;
    find_key_columns(&key, data);
    TupleDesc descriptor = RelationGetDescr(data->tg_relation);
    TupleTableSlot* old_row = MakeSingleTupleTableSlot(descriptor, &TTSOpsMinimalTuple);
    TupleTableSlot* new_row = MakeSingleTupleTableSlot(descriptor, &TTSOpsMinimalTuple);
    Tuplestorestate* olds = data->tg_oldtable;
    Tuplestorestate* news = data->tg_newtable;
    StringInfoData image;
    initStringInfo(&image);
    appendStringInfoSpaces(&image, VARHDRSZ);
    magic_sync::capture::begin_keys(&image, descriptor, key.attributes, key.names, key.count);
    *count = 0;
    if (olds != nullptr) rewind(olds);
    if (news != nullptr) rewind(news);
    if (TRIGGER_FIRED_BY_UPDATE(data->tg_event)) {
        while (tuplestore_gettupleslot(olds, true, false, old_row) &&
               tuplestore_gettupleslot(news, true, false, new_row)) {
            if (same_row(old_row, new_row, descriptor)) continue;
            magic_sync::capture::add_key(&image, new_row, descriptor, key.attributes, key.count);
            ++*count;
            if (same_key(&key, old_row, new_row, descriptor)) continue;
            magic_sync::capture::add_key(&image, old_row, descriptor, key.attributes, key.count);
            ++*count;
        }
    } else {
        Tuplestorestate* rows = news != nullptr ? news : olds;
        TupleTableSlot* row = news != nullptr ? new_row : old_row;
        while (tuplestore_gettupleslot(rows, true, false, row)) {
            magic_sync::capture::add_key(&image, row, descriptor, key.attributes, key.count);
            ++*count;
        }
    }
    ExecDropSingleTupleTableSlot(old_row);
    ExecDropSingleTupleTableSlot(new_row);
    if (*count == 0) return nullptr;
    auto* keys = reinterpret_cast<bytea*>(image.data);
    SET_VARSIZE(keys, image.len);
    return keys;
}

// Release 0.1.0's sync.note, met after this library was installed and the server restarted,
// before ALTER EXTENSION magic_sync UPDATE ran: the note says "every row of the table" (key NULL),
// which 0.1.0's pass and the update (it plans every table again) both read so, and nothing written
// meanwhile is lost. Written through SPI, for that table's index, as the function's owner (the
// writer needs no privilege on sync.note, as 0.1.0's capture did it).
void write_release_note(FunctionCallInfo fcinfo, int32 codec) {
    HeapTuple function = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
    if (!HeapTupleIsValid(function)) elog(ERROR, "magic_sync capture: its function is gone");
    const Oid owner = reinterpret_cast<Form_pg_proc>(GETSTRUCT(function))->proowner;
    ReleaseSysCache(function);
    Oid writer = InvalidOid;
    int security_context = 0;
    GetUserIdAndSecContext(&writer, &security_context);
    SetUserIdAndSecContext(
        owner, security_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "magic_sync capture: SPI_connect failed");
    Oid types[1] = {INT4OID};
    Datum values[1] = {Int32GetDatum(codec)};
    if (SPI_execute_with_args("INSERT INTO sync.note (codec, key) VALUES ($1, NULL)", 1, types,
                              values, nullptr, false, 0) != SPI_OK_INSERT)
        elog(ERROR, "magic_sync capture: writing a note into release 0.1.0's sync.note failed");
    SPI_finish();
    SetUserIdAndSecContext(writer, security_context);
}

// Inserts the note: `keys` NULL means every row of the codec (a TRUNCATE).
void write_note(FunctionCallInfo fcinfo, int32 codec, bytea* keys, int32 count) {
    const Oid schema = get_namespace_oid("sync", false);
    const Oid note_id = get_relname_relid("note", schema);
    const Oid sequence = get_relname_relid("note_seq_seq", schema);
    if (!OidIsValid(note_id) || !OidIsValid(sequence))
        elog(ERROR, "magic_sync capture: sync.note is missing; reinstall the extension");
    Relation note = table_open(note_id, RowExclusiveLock);
    if (RelationGetDescr(note)->natts == kReleaseNoteColumns) {
        table_close(note, NoLock);
        write_release_note(fcinfo, codec);
        return;
    }
    if (note->rd_rel->relhasindex)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("sync.note has an index, which the capture cannot maintain"),
                        errdetail("The capture writes the notes into sync.note's heap directly."),
                        errhint("Drop the index on sync.note.")));
    if (RelationGetDescr(note)->natts != kNoteColumns)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("sync.note does not have the %d columns magic_sync made",
                               static_cast<int>(kNoteColumns)),
                        errhint("Reinstall the extension.")));
    Datum values[kNoteColumns] = {};
    bool nulls[kNoteColumns] = {};
    values[kSeq] = Int64GetDatum(nextval_internal(sequence, false));
    values[kCodec] = Int32GetDatum(codec);
    nulls[kKey] = true;
    nulls[kKeys] = keys == nullptr;
    values[kKeys] = PointerGetDatum(keys);
    values[kKeyCount] = Int32GetDatum(keys == nullptr ? 1 : count);
    values[kNotedAt] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
    HeapTuple tuple = heap_form_tuple(RelationGetDescr(note), values, nulls);
    simple_heap_insert(note, tuple);
    heap_freetuple(tuple);
    table_close(note, NoLock);
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
    const Trigger* trigger = data->tg_trigger;
    if (trigger->tgnargs < 1 ||
        (!TRIGGER_FIRED_BY_TRUNCATE(data->tg_event) && trigger->tgnargs < 2))
        refuse_trigger(data);
    const int32 codec = pg_strtoint32(trigger->tgargs[0]);
    bytea* keys = nullptr;
    int32 count = 0;
    if (!TRIGGER_FIRED_BY_TRUNCATE(data->tg_event)) {
        Tuplestorestate* rows =
            data->tg_newtable != nullptr ? data->tg_newtable : data->tg_oldtable;
        if (rows == nullptr || (TRIGGER_FIRED_BY_UPDATE(data->tg_event) &&
                                (data->tg_newtable == nullptr || data->tg_oldtable == nullptr)))
            ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                            errmsg("sync.capture() needs the trigger's transition tables")));
        // A statement that changed no row notes nothing (a TRUNCATE always notes).
        if (tuplestore_tuple_count(rows) == 0) return;
        keys = changed_keys(data, &count);
        if (keys == nullptr) return;
    }
    write_note(fcinfo, codec, keys, count);
    magic_sync::pg::wake_relay_at_commit();
}

}  // namespace

MAGIC_SYNC_FUNCTION(magic_sync_capture) {
    magic_sync::pg::guard([&] { capture(fcinfo); });
    return PointerGetDatum(nullptr);
}
