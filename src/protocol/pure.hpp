// Included first by every header of src/protocol/. The protocol is compiled into the extension, the
// sender and the replica, so it must not depend on PostgreSQL. Its own sources are compiled with
// MAGIC_SYNC_PROTOCOL_BUILD defined and src/protocol/barrier first on the include path, so
// including a PostgreSQL header there fails whichever order the includes come in. (The extension
// itself includes both, in any order.)
#pragma once

#if defined(MAGIC_SYNC_PROTOCOL_BUILD) && \
    (defined(POSTGRES_H) || defined(POSTGRES_FE_H) || defined(FMGR_H) || defined(PG_VERSION_NUM))
#error \
    "src/protocol/ is pure C++ shared with sender/ and replica/: it must not see PostgreSQL headers"
#endif
