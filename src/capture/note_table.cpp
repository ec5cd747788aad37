#include "capture/note_table.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
}

namespace magic_sync::capture {

namespace {

// sync.note's columns, in the order the install script declares them.
enum NoteColumn { kSeq, kCodec, kKey, kKeys, kKeyCount, kNotedAt, kNoteColumns };
// Release 0.1.0's sync.note: seq (its primary key), codec, key, noted_at.
constexpr int kReleaseNoteColumns = 4;

// sync.note and its sequence, looked up once per backend (a lookup by name cost as much as the
// rest of opening the table), forgotten when either relation changes (dropped with the extension,
// made again).
Oid note_table = InvalidOid;
Oid note_sequence = InvalidOid;

void forget_note_table(Datum, Oid relation) {
    if (relation == InvalidOid || relation == note_table || relation == note_sequence) {
        note_table = InvalidOid;
        note_sequence = InvalidOid;
    }
}

bool find_note_table() {
    if (OidIsValid(note_table)) return true;
    const Oid schema = get_namespace_oid("sync", true);
    const Oid table = OidIsValid(schema) ? get_relname_relid("note", schema) : InvalidOid;
    const Oid sequence =
        OidIsValid(schema) ? get_relname_relid("note_seq_seq", schema) : InvalidOid;
    if (!OidIsValid(table) || !OidIsValid(sequence)) return false;
    note_table = table;
    note_sequence = sequence;
    return true;
}

// Release 0.1.0's sync.note, met after this library was installed and the server restarted,
// before ALTER EXTENSION magic_sync UPDATE ran (its triggers are statement triggers): the note
// says "every row of the table" (key NULL), which 0.1.0's pass and the update (it plans every
// table again) both read so, and nothing written meanwhile is lost. Written through SPI, for that
// table's index, as the function's owner (the writer needs no privilege on sync.note, as 0.1.0's
// capture did it).
void write_release_note(Oid function, int32 codec) {
    HeapTuple procedure = SearchSysCache1(PROCOID, ObjectIdGetDatum(function));
    if (!HeapTupleIsValid(procedure)) elog(ERROR, "magic_sync capture: its function is gone");
    const Oid owner = reinterpret_cast<Form_pg_proc>(GETSTRUCT(procedure))->proowner;
    ReleaseSysCache(procedure);
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

}  // namespace

void define_note_table() { CacheRegisterRelcacheCallback(forget_note_table, Datum(0)); }

bool note_table_exists() { return find_note_table(); }

void write_note(Oid function, int32 codec, bytea* keys, int32 count) {
    if (!find_note_table())
        elog(ERROR, "magic_sync capture: sync.note is missing; reinstall the extension");
    // Kept apart: taking the table's lock reads the invalidations other sessions sent, and one
    // that names sync.note (an ANALYZE of it) makes forget_note_table clear the globals while the
    // table is being opened.
    const Oid table = note_table;
    const Oid sequence = note_sequence;
    Relation note = table_open(table, RowExclusiveLock);
    if (RelationGetDescr(note)->natts == kReleaseNoteColumns) {
        table_close(note, NoLock);
        write_release_note(function, codec);
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

}  // namespace magic_sync::capture
