#include "answers.hpp"

#include <string>
#include <variant>

#include "pg/bridge.hpp"
#include "pg/settings.hpp"
#include "pg/values.hpp"
#include "protocol/messages.hpp"

namespace magic_sync::relay {

int64_t move_answers(pg::Spi& spi) {
    pg::Value written = spi.scalar(
        "WITH moved AS (DELETE FROM sync.answer RETURNING id, replica, kind, payload),"
        " parts AS (SELECT m.id, m.replica, m.kind, p.payload, p.n FROM moved m"
        "  CROSS JOIN LATERAL jsonb_array_elements(sync.filed_parts(m.replica, m.payload,"
        "   $1::bigint)) WITH ORDINALITY AS p(payload, n)),"
        " numbered AS (SELECT p.replica, p.kind, p.payload, r.gen,"
        "  r.next_seq - 1 + row_number() OVER (PARTITION BY p.replica ORDER BY p.id, p.n) AS seq"
        "  FROM parts p JOIN sync.replica r ON r.id = p.replica AND r.live),"
        " written AS (INSERT INTO sync.outbox (replica, seq, gen, kind, body)"
        "  SELECT replica, seq, gen, kind, sync.encode_filed(replica, gen, seq, payload)"
        "  FROM numbered RETURNING replica),"
        " advanced AS (UPDATE sync.replica r SET next_seq = r.next_seq + w.n"
        "  FROM (SELECT replica, count(*) AS n FROM written GROUP BY replica) w"
        "  WHERE r.id = w.replica)"
        " SELECT count(*) FROM written",
        {std::to_string(settings::bytes_per_message)});
    return written ? std::stoll(*written) : 0;
}

}  // namespace magic_sync::relay

namespace protocol = magic_sync::protocol;

namespace {

const char* const kFiledUsage =
    "payload must be {\"upload\": uuid, \"kept\": [{\"t\": table, \"k\": key, \"why\": "
    "reason}, ...], \"more\": true?}";

// The filed message with that header and payload, read by the protocol's own decoder, so that what
// goes out is exactly what a replica accepts.
protocol::FiledMessage filed_of(const std::string& function, const std::string& replica,
                                int64_t gen, int64_t seq, const std::string& payload) {
    const std::string usage = function + ": " + kFiledUsage;
    if (payload.size() < 2 || payload.front() != '{')
        throw magic_sync::Error(usage + ", not " + payload, ERRCODE_INVALID_PARAMETER_VALUE);
    std::string text = "{\"v\":" + std::to_string(protocol::kFirstVersion) +
                       ",\"kind\":\"filed\",\"replica\":\"" + replica +
                       "\",\"gen\":" + std::to_string(gen) + ",\"seq\":" + std::to_string(seq);
    text += payload == "{}" ? "}" : "," + payload.substr(1);
    try {
        return std::get<protocol::FiledMessage>(protocol::decode_down(text));
    } catch (const protocol::DecodeError& e) {
        throw magic_sync::Error(usage + ": " + e.what(), ERRCODE_INVALID_PARAMETER_VALUE);
    }
}

}  // namespace

// sync.encode_filed(replica uuid, gen bigint, seq bigint, payload jsonb) → bytea: the filed
// message with that header.
MAGIC_SYNC_FUNCTION(magic_sync_encode_filed) {
    const std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const int64_t gen = magic_sync::pg::int64_arg(fcinfo, 1);
    const int64_t seq = magic_sync::pg::int64_arg(fcinfo, 2);
    const std::string payload = magic_sync::pg::jsonb_text_arg(fcinfo, 3);
    return magic_sync::pg::bytea_datum(
        protocol::encode(filed_of("sync.encode_filed", replica, gen, seq, payload)));
}

// sync.filed_parts(replica uuid, payload jsonb, max_bytes bigint) → jsonb: the payloads of the
// parts that answer, in order, each of which encodes within max_bytes (protocol::split_filed).
MAGIC_SYNC_FUNCTION(magic_sync_filed_parts) {
    const std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const std::string payload = magic_sync::pg::jsonb_text_arg(fcinfo, 1);
    const int64_t max_bytes = magic_sync::pg::int64_arg(fcinfo, 2);
    if (max_bytes < 1)
        throw magic_sync::Error("sync.filed_parts: max_bytes must be positive",
                                ERRCODE_INVALID_PARAMETER_VALUE);
    const protocol::FiledMessage answer = filed_of("sync.filed_parts", replica, 0, 0, payload);
    std::string parts = "[";
    for (const protocol::FiledMessage& part :
         protocol::split_filed(answer, static_cast<size_t>(max_bytes))) {
        if (parts.size() > 1) parts += ',';
        parts +=
            "{\"upload\":\"" + part.upload + "\",\"kept\":" + protocol::encode_key_notes(part.kept);
        parts += part.more ? ",\"more\":true}" : "}";
    }
    parts += ']';
    return magic_sync::pg::jsonb_datum(parts);
}
