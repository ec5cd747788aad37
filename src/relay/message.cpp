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

std::vector<std::string> column_of(const std::vector<magic_sync::pg::Row>& rows) {
    std::vector<std::string> values;
    for (const auto& row : rows) values.push_back(row[0].value_or(""));
    return values;
}

std::string assemble(magic_sync::pg::Spi& spi, const std::string& replica, int64_t seq) {
    const std::vector<magic_sync::pg::Param> key = {magic_sync::pg::Param::uuid(replica), seq};
    auto rows = spi.query(
        R"sql(
        SELECT gen, convert_from(body, 'UTF8') FROM sync.outbox
        WHERE replica = $1 AND seq = $2)sql",
        key);
    if (rows.empty())
        throw magic_sync::Error(
            "replica " + replica + " has no message " + std::to_string(seq) + " in its outbox",
            ERRCODE_NO_DATA_FOUND);
    if (rows.front()[1]) return *rows.front()[1];

    protocol::RowsMessage message;
    message.header = {replica, rows.front()[0].integer(), seq};
    message.reset = column_of(
        spi.query("SELECT unnest(reset) FROM sync.outbox WHERE replica = $1 AND seq = $2", key));
    message.drop = column_of(
        spi.query("SELECT unnest(drops) FROM sync.outbox WHERE replica = $1 AND seq = $2", key));
    message.drop_tables = column_of(spi.query(
        "SELECT unnest(table_drops) FROM sync.outbox WHERE replica = $1 AND seq = $2", key));
    for (const auto& note : spi.query(R"sql(
                   SELECT w->>'t', sync.canonical(w->'k'), w->>'why', w->>'kh' FROM sync.outbox o,
                   unnest(o.chunks) WITH ORDINALITY AS u(id, position)
                   JOIN sync.chunk c ON c.id = u.id, jsonb_array_elements(c.withheld) w
                   WHERE o.replica = $1 AND o.seq = $2 ORDER BY u.position)sql",
                                      key)) {
        protocol::KeyNote withheld{note[0].value(), note[1].value_or(""), note[2].value()};
        if (note[3]) withheld.key_hash = protocol::digest_from_hex(*note[3]);
        message.withheld.push_back(std::move(withheld));
    }
    std::vector<std::string> chunks = column_of(spi.query(
        R"sql(
        SELECT c.body FROM sync.outbox o, unnest(o.chunks) WITH ORDINALITY AS u(id, position)
        JOIN sync.chunk c ON c.id = u.id
        WHERE o.replica = $1 AND o.seq = $2 ORDER BY u.position)sql",
        key));
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
