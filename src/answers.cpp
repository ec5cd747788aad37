#include "answers.hpp"

#include <string>

#include "pg/bridge.hpp"
#include "pg/values.hpp"
#include "protocol/messages.hpp"

namespace magic_sync::relay {

int64_t move_answers(pg::Spi& spi) {
    pg::Value written = spi.scalar(
        "WITH moved AS (DELETE FROM sync.answer RETURNING id, replica, kind, payload),"
        " numbered AS (SELECT m.replica, m.kind, m.payload, r.gen,"
        "  r.next_seq - 1 + row_number() OVER (PARTITION BY m.replica ORDER BY m.id) AS seq"
        "  FROM moved m JOIN sync.replica r ON r.id = m.replica AND r.live),"
        " written AS (INSERT INTO sync.outbox (replica, seq, gen, kind, body)"
        "  SELECT replica, seq, gen, kind, sync.encode_filed(replica, gen, seq, payload)"
        "  FROM numbered RETURNING replica),"
        " advanced AS (UPDATE sync.replica r SET next_seq = r.next_seq + w.n"
        "  FROM (SELECT replica, count(*) AS n FROM written GROUP BY replica) w"
        "  WHERE r.id = w.replica)"
        " SELECT count(*) FROM written");
    return written ? std::stoll(*written) : 0;
}

}  // namespace magic_sync::relay

namespace protocol = magic_sync::protocol;

// sync.encode_filed(replica uuid, gen bigint, seq bigint, payload jsonb) → bytea: the filed
// message with that header, payload {"upload": uuid, "kept": [{"t", "k", "why"}, ...]}. The payload
// is read by the protocol's own decoder, so what goes out is exactly what a replica accepts.
MAGIC_SYNC_FUNCTION(magic_sync_encode_filed) {
    const std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const int64_t gen = magic_sync::pg::int64_arg(fcinfo, 1);
    const int64_t seq = magic_sync::pg::int64_arg(fcinfo, 2);
    const std::string payload = magic_sync::pg::jsonb_text_arg(fcinfo, 3);
    const std::string usage =
        "sync.encode_filed: payload must be {\"upload\": uuid, \"kept\": [{\"t\": table, \"k\": "
        "key, \"why\": reason}, ...]}";
    if (payload.size() < 2 || payload.front() != '{')
        throw magic_sync::Error(usage + ", not " + payload, ERRCODE_INVALID_PARAMETER_VALUE);
    std::string text = "{\"v\":" + std::to_string(protocol::kVersion) +
                       ",\"kind\":\"filed\",\"replica\":\"" + replica +
                       "\",\"gen\":" + std::to_string(gen) + ",\"seq\":" + std::to_string(seq);
    text += payload == "{}" ? "}" : "," + payload.substr(1);
    try {
        protocol::DownMessage message = protocol::decode_down(text);
        return magic_sync::pg::bytea_datum(protocol::encode(message));
    } catch (const protocol::DecodeError& e) {
        throw magic_sync::Error(usage + ": " + e.what(), ERRCODE_INVALID_PARAMETER_VALUE);
    }
}
