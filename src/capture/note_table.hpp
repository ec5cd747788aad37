// Writing a note into sync.note: one heap row, inserted directly (no SPI, no plan, no executor,
// no privilege check: the writer needs none on sync), and sync.note has no index to maintain.
//
// C-style on purpose: it runs inside pg::guard() and in transaction callbacks.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace magic_sync::capture {

// Inserts a note of `codec`: `keys` (an image of note_keys.hpp holding `count` keys), or NULL
// for every row of the codec (a TRUNCATE). `function` is the capture trigger's, whose owner
// writes into release 0.1.0's sync.note (below).
void write_note(Oid function, int32 codec, bytea* keys, int32 count);

// Whether sync.note is there (a transaction may have dropped the extension after writing).
bool note_table_exists();

// Called from _PG_init: sync.note's oids are kept per backend and forgotten when it changes.
void define_note_table();

}  // namespace magic_sync::capture
