// sync.message(replica, seq): a message of the outbox assembled exactly as it is sent. A rows
// message is its envelope around the shared chunks it names; other kinds are stored whole.
#include <string>
#include <vector>

#include "pg/bridge.hpp"
#include "pg/spi.hpp"
#include "pg/values.hpp"
#include "protocol/messages.hpp"

namespace {

namespace protocol = magic_sync::protocol;

std::string assemble(magic_sync::pg::Spi& spi, const std::string& replica, int64_t seq) {
    auto rows = spi.query(
        R"sql(
        SELECT gen, body, reset, drops, table_drops, chunks FROM sync.outbox
        WHERE replica = $1 AND seq = $2)sql",
        {magic_sync::pg::Param::uuid(replica), seq});
    if (rows.empty())
        throw magic_sync::Error(
            "replica " + replica + " has no message " + std::to_string(seq) + " in its outbox",
            ERRCODE_NO_DATA_FOUND);
    const magic_sync::pg::Row& outbox = rows.front();
    if (outbox["body"]) return outbox["body"].bytes();

    protocol::RowsMessage message;
    message.header = {replica, outbox["gen"].integer(), seq, ""};
    message.reset = outbox["reset"].texts();
    message.drop = outbox["drops"].texts();
    message.drop_tables = outbox["table_drops"].texts();
    // The chunks as a sender reads them (sync.chunks), in the message's order.
    const std::vector<int64_t>& ids = outbox["chunks"].integers();
    std::vector<protocol::StoredChunk> chunks;
    for (const auto& chunk : spi.query(
             R"sql(
             SELECT c.body, c.withheld_tables, c.withheld_keys, c.withheld_whys,
                    c.withheld_key_hashes
             FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, position)
             JOIN sync.chunks($1, sync_internal.origin()) c ON c.id = u.id
             ORDER BY u.position)sql",
             {magic_sync::pg::Param::bigint_array(ids)})) {
        protocol::StoredChunk stored{chunk["body"].value_or(""), {}, {}};
        const auto& tables = chunk["withheld_tables"].elements();
        const auto& keys = chunk["withheld_keys"].elements();
        const auto& whys = chunk["withheld_whys"].elements();
        const auto& key_hashes = chunk["withheld_key_hashes"].elements();
        for (size_t note = 0; note < tables.size(); ++note)
            stored.withheld.push_back(protocol::stored_note(
                tables[note].value_or(""), keys[note], whys[note].value_or(""), key_hashes[note]));
        chunks.push_back(std::move(stored));
    }
    // A chunk is pruned only once no message names it; one that is gone anyway leaves a message
    // that cannot be made, not one made without it.
    if (chunks.size() != ids.size())
        throw magic_sync::Error("message " + std::to_string(seq) + " of replica " + replica +
                                    " names a chunk that is gone: it cannot be assembled",
                                ERRCODE_DATA_CORRUPTED);
    std::vector<const protocol::StoredChunk*> in_order;
    for (const protocol::StoredChunk& chunk : chunks) in_order.push_back(&chunk);
    return protocol::assemble_rows(message, in_order);
}

}  // namespace

MAGIC_SYNC_FUNCTION(magic_sync_message) {
    std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const int64_t seq = magic_sync::pg::int64_arg(fcinfo, 1);
    magic_sync::pg::Spi spi;
    std::string bytes = assemble(spi, replica, seq);
    spi.finish();
    return magic_sync::pg::bytea_datum(bytes);
}
