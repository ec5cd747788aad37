// The keys a transaction changed, kept in the backend until it commits: the row trigger adds a
// key per changed row, and one note per synced table is written just before the commit
// (XACT_EVENT_PRE_COMMIT), holding all of them. A transaction that writes one row pays for one
// note row; one that writes many rows in many statements pays for one note all the same.
//
// Promises kept: a rolled-back transaction writes nothing; a rolled-back subtransaction takes
// its keys with it (they are kept apart per subtransaction until it commits into its parent);
// the keys of one subtransaction go to the table early, as a note of their own, when they pass
// kFlushBytes, so memory stays bounded (that note is rolled back with the subtransaction, as
// its rows are).
//
// C-style on purpose: it runs inside pg::guard() and in transaction callbacks, where no C++
// object may live.
#pragma once

extern "C" {
#include "postgres.h"

#include "executor/tuptable.h"
}

namespace magic_sync::capture {

// Called from _PG_init: the transaction and subtransaction callbacks.
void define_pending();

// Adds the key of the row in `slot` to the current subtransaction's keys of `codec`.
// `attributes` (of `descriptor`) and `names` are the codec's key columns; `function` is the
// capture trigger's.
void note_key(Oid function, int32 codec, TupleTableSlot* slot, TupleDesc descriptor,
              const AttrNumber* attributes, char* const* names, int columns);

}  // namespace magic_sync::capture
