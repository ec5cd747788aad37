// Rows messages by reference (sync.next and sync.pull_head with by_reference => true): their
// envelope and the ids of their shared chunks, read from a binary result; the chunks, read from
// sync.chunks' binary result; the message assembled from them (protocol::assemble_rows). What the
// push sender (database.cpp) and the pull gateway (pull_server.cpp) both do with them.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.hpp"

namespace magic_sync::sender {

// Binary results: the bytes arrive as they are, a bigint as 8 bytes, an int as 4, arrays as
// array_send writes them.
int64_t big_endian_int64(const char* bytes);
int32_t big_endian_int32(const char* bytes);

// The chunks named by $1 (bigint[]) while the database's history is $2 (the origin they were
// leased in), in binary form: read_chunks reads them.
constexpr const char* kChunksQuery =
    "SELECT id, body, withheld_tables, withheld_keys, withheld_whys, withheld_key_hashes "
    "FROM sync.chunks($1::bigint[], $2::text)";

// A rows message by reference: its envelope (header, reset, drops, table drops) and its chunks'
// ids, in order.
struct RowsReference {
    protocol::RowsMessage envelope;
    std::vector<int64_t> chunks;
};

// The chunks a message or an exchange's messages name: from the cache or fetched (null: not yet).
using Chunks = std::map<int64_t, std::shared_ptr<const protocol::StoredChunk>>;

// The reference in row `row` of a binary result whose columns gen, reset, drops, table_drops and
// chunks are `gen_column` and the four after it, for the message `seq` of `replica` leased in
// `origin`; std::nullopt when they do not read.
std::optional<RowsReference> read_reference(const PGresult* rows, int row, int gen_column,
                                            const std::string& replica, int64_t seq,
                                            const std::string& origin);

// The chunks of a binary result of kChunksQuery, each deflated once too when `gzip` (for
// assemble's gzip form); std::nullopt when they do not read.
std::optional<Chunks> read_chunks(const PGresult* rows, bool gzip);

// The ids of those of `chunks` not found yet, as an array literal for kChunksQuery's $1; empty
// when every one is found.
std::string missing_chunks(const Chunks& chunks);

// The message assembled from its chunks, gzip-compressed when `gzip` (from chunks read_chunks
// deflated); std::nullopt when one of them is not in `chunks` (gone: the message was pruned after
// its lease).
std::optional<std::string> assemble(const RowsReference& reference, const Chunks& chunks,
                                    bool gzip);

}  // namespace magic_sync::sender
