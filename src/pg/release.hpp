// Which release of magic_sync is installed in this database: the one owner of the question the
// relay worker and filing ask before they meet the schema (between an update of the library, with
// the server's restart, and ALTER EXTENSION magic_sync UPDATE, the schema is another release's).
// The capture answers its own question from the shape of sync.note, the table it writes.
#pragma once

#include <optional>
#include <string>

extern "C" {
#include "postgres.h"
}

namespace magic_sync::pg {

// pg_extension.extversion of magic_sync, palloc'd, or NULL when it is not installed. Read from the
// catalog, no SPI; raises as PostgreSQL does (for PostgreSQL C code: the worker).
char* installed_release_or_null();

// The same for C++: nullopt when not installed; an error arrives as a PgError.
std::optional<std::string> installed_release();

}  // namespace magic_sync::pg
