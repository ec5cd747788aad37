// sync.message(replica, seq): a message of the outbox assembled exactly as it is sent. A rows
// message is its envelope around the shared chunks it names; other kinds are stored whole.
#include <string>
#include <vector>

#include "pg/bridge.hpp"
#include "pg/spi.hpp"
#include "pg/values.hpp"
#include "protocol/canonical.hpp"
#include "protocol/messages.hpp"

namespace {

namespace protocol = magic_sync::protocol;

std::string assemble(magic_sync::pg::Spi& spi, const std::string& replica, int64_t seq) {
    const std::vector<magic_sync::pg::Param> key = {magic_sync::pg::Param::uuid(replica), seq};
    auto rows = spi.query(
        R"sql(
        SELECT gen, body, reset, drops, table_drops FROM sync.outbox
        WHERE replica = $1 AND seq = $2)sql",
        key);
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
    for (const auto& note : spi.query(R"sql(
                   SELECT w->>'t' AS table_name, sync_internal.canonical(w->'k') AS key, w->>'why' AS why,
                   w->>'kh' AS key_hash FROM sync.outbox o,
                   unnest(o.chunks) WITH ORDINALITY AS u(id, position)
                   JOIN sync.chunk c ON c.id = u.id, jsonb_array_elements(c.withheld) w
                   WHERE o.replica = $1 AND o.seq = $2 ORDER BY u.position)sql",
                                      key)) {
        protocol::KeyNote withheld{note["table_name"].value(), note["key"].value_or(""),
                                   note["why"].value()};
        if (note["key_hash"]) withheld.key_hash = protocol::digest_from_hex(*note["key_hash"]);
        message.withheld.push_back(std::move(withheld));
    }
    std::vector<std::string> chunks;
    for (const auto& chunk : spi.query(
             R"sql(
             SELECT c.body FROM sync.outbox o, unnest(o.chunks) WITH ORDINALITY AS u(id, position)
             JOIN sync.chunk c ON c.id = u.id
             WHERE o.replica = $1 AND o.seq = $2 ORDER BY u.position)sql",
             key))
        chunks.push_back(chunk["body"].value_or(""));
    return protocol::encode_rows(message, {chunks.begin(), chunks.end()});
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
