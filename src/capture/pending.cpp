#include "capture/pending.hpp"

extern "C" {
#include "access/xact.h"
#include "lib/stringinfo.h"
#include "utils/memutils.h"
}

#include "capture/note_keys.hpp"
#include "capture/note_table.hpp"
#include "pg/wake.hpp"

namespace magic_sync::capture {

namespace {

// Past this many bytes of keys, a subtransaction's keys of a codec are written as a note at once
// (about a million keys of one bigint column).
constexpr int kFlushBytes = 16 * 1024 * 1024;

// The keys of one codec changed in one subtransaction (and in those it committed), as an image
// of note_keys.hpp whose first `header` bytes name the key columns.
struct Pending {
    int32 codec;
    SubTransactionId subtransaction;
    Oid function;  // the trigger's, for write_note
    int header;
    int32 count;
    StringInfoData image;
    Pending* next;
};

// The transaction's keys, newest first; in TopTransactionContext, gone with the transaction.
Pending* pending = nullptr;

// Whether the keys of `p` are of these key columns, with these types (a column of the codec may
// have changed type or name since earlier keys were noted in the transaction).
bool of_columns(const Pending* p, TupleDesc descriptor, const AttrNumber* attributes,
                char* const* names, int columns) {
    const char* at = p->image.data + VARHDRSZ;
    int32 count = 0;
    memcpy(&count, at, sizeof(count));
    at += sizeof(count);
    if (count != columns) return false;
    for (int i = 0; i < columns; ++i) {
        Oid type = InvalidOid;
        memcpy(&type, at, sizeof(type));
        at += sizeof(type);
        if (type != TupleDescAttr(descriptor, attributes[i] - 1)->atttypid ||
            strcmp(at, names[i]) != 0)
            return false;
        at += strlen(at) + 1;
    }
    return true;
}

bool same_columns(const Pending* a, const Pending* b) {
    return a->header == b->header &&
           memcmp(a->image.data + VARHDRSZ, b->image.data + VARHDRSZ, a->header - VARHDRSZ) == 0;
}

// The newest keys of `codec` in `subtransaction` (NULL when there are none).
Pending* find(int32 codec, SubTransactionId subtransaction) {
    for (Pending* p = pending; p != nullptr; p = p->next)
        if (p->codec == codec && p->subtransaction == subtransaction) return p;
    return nullptr;
}

// Writes the keys of `p` as a note and empties it.
void write(Pending* p) {
    if (p->count == 0) return;
    auto* keys = reinterpret_cast<bytea*>(p->image.data);
    SET_VARSIZE(keys, p->image.len);
    write_note(p->function, p->codec, keys, p->count);
    p->image.len = p->header;
    p->count = 0;
    pg::wake_relay_at_commit();
}

void at_transaction_event(XactEvent event, void*) {
    switch (event) {
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PRE_PREPARE:
            // The transaction dropped the extension after writing: its notes went with it.
            if (pending != nullptr && !note_table_exists()) pending = nullptr;
            // Oldest first, so the notes' order is the order the tables were first written.
            for (;;) {
                Pending* oldest = nullptr;
                Pending** link = &pending;
                for (Pending** l = &pending; *l != nullptr; l = &(*l)->next) {
                    oldest = *l;
                    link = l;
                }
                if (oldest == nullptr) break;
                *link = nullptr;
                write(oldest);
            }
            break;
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PREPARE:
        case XACT_EVENT_PARALLEL_COMMIT:
        case XACT_EVENT_PARALLEL_ABORT:
            pending = nullptr;
            break;
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
            break;
    }
}

// A subtransaction that commits hands its keys to its parent; one that aborts drops them (those
// of its own subtransactions were handed to it or dropped already).
void at_subtransaction_event(SubXactEvent event, SubTransactionId subtransaction,
                             SubTransactionId parent, void*) {
    if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB) return;
    for (Pending** link = &pending; *link != nullptr;) {
        Pending* p = *link;
        if (p->subtransaction != subtransaction) {
            link = &p->next;
            continue;
        }
        if (event == SUBXACT_EVENT_COMMIT_SUB) {
            Pending* into = find(p->codec, parent);
            if (into == nullptr || !same_columns(into, p)) {
                p->subtransaction = parent;
                link = &p->next;
                continue;
            }
            appendBinaryStringInfo(&into->image, p->image.data + p->header,
                                   p->image.len - p->header);
            into->count += p->count;
        }
        *link = p->next;
        pfree(p->image.data);
        pfree(p);
    }
}

}  // namespace

void define_pending() {
    RegisterXactCallback(at_transaction_event, nullptr);
    RegisterSubXactCallback(at_subtransaction_event, nullptr);
}

void note_key(Oid function, int32 codec, TupleTableSlot* slot, TupleDesc descriptor,
              const AttrNumber* attributes, char* const* names, int columns) {
    const SubTransactionId subtransaction = GetCurrentSubTransactionId();
    Pending* p = find(codec, subtransaction);
    if (p == nullptr || !of_columns(p, descriptor, attributes, names, columns)) {
        MemoryContext caller = MemoryContextSwitchTo(TopTransactionContext);
        p = static_cast<Pending*>(palloc0(sizeof(Pending)));
        p->codec = codec;
        p->subtransaction = subtransaction;
        p->function = function;
        initStringInfo(&p->image);
        appendStringInfoSpaces(&p->image, VARHDRSZ);
        begin_keys(&p->image, descriptor, attributes, names, columns);
        p->header = p->image.len;
        p->next = pending;
        pending = p;
        MemoryContextSwitchTo(caller);
    }
    add_key(&p->image, slot, descriptor, attributes, columns);
    ++p->count;
    if (p->image.len > kFlushBytes) write(p);
}

}  // namespace magic_sync::capture
