// The keys of a note (sync.note.keys, one per table and transaction): what the capture trigger
// writes and the pass reads back (sync.note_keys). One owner of the format, both ways.
//
// The keys are kept as the key columns' own values, in this server's datum format (a note never
// leaves the cluster that wrote it), so the trigger copies bytes and builds nothing; the pass
// builds each key's jsonb, as jsonb_build_object('a', a, ...) does, with the types the columns
// had when the note was written (the image says them, so a later ALTER ... TYPE or RENAME does
// not misread it).
//
// Layout: int32 column count; per column its type Oid and its NUL-terminated name; then per key,
// per column, the value as datumSerialize writes it.
//
// C-style on purpose: the writer runs inside pg::guard(), where no C++ object may live.
#pragma once

extern "C" {
#include "postgres.h"

#include "executor/tuptable.h"
#include "lib/stringinfo.h"
}

namespace magic_sync::capture {

// Starts an image of keys made of `columns` attributes of `descriptor`, named `names`.
void begin_keys(StringInfo image, TupleDesc descriptor, const AttrNumber* attributes,
                char* const* names, int columns);

// Adds the key of the row in `slot`.
void add_key(StringInfo image, TupleTableSlot* slot, TupleDesc descriptor,
             const AttrNumber* attributes, int columns);

}  // namespace magic_sync::capture
