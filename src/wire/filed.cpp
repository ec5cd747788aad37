// The filed answer on the wire, callable from SQL: the relay encodes each answer it moves into an
// outbox (sync_internal.encode_filed) and splits one too big for a message
// (sync_internal.filed_parts) with the protocol's own encoder and decoder.
#include <string>

#include "pg/bridge.hpp"
#include "pg/values.hpp"
#include "protocol/messages.hpp"

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
    try {
        return protocol::decode_filed_payload({replica, gen, seq, ""}, payload);
    } catch (const protocol::DecodeError& e) {
        throw magic_sync::Error(usage + ": " + e.what(), ERRCODE_INVALID_PARAMETER_VALUE);
    }
}

}  // namespace

// sync_internal.encode_filed(replica uuid, gen bigint, seq bigint, payload jsonb) → bytea: the
// filed message with that header.
MAGIC_SYNC_FUNCTION(magic_sync_encode_filed) {
    const std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const int64_t gen = magic_sync::pg::int64_arg(fcinfo, 1);
    const int64_t seq = magic_sync::pg::int64_arg(fcinfo, 2);
    const std::string payload = magic_sync::pg::jsonb_text_arg(fcinfo, 3);
    return magic_sync::pg::bytea_datum(
        protocol::encode(filed_of("sync_internal.encode_filed", replica, gen, seq, payload)));
}

// sync_internal.filed_parts(replica uuid, payload jsonb, max_bytes bigint) → jsonb: the payloads of
// the parts that answer, in order, each of which encodes within max_bytes (protocol::split_filed).
MAGIC_SYNC_FUNCTION(magic_sync_filed_parts) {
    const std::string replica = magic_sync::pg::uuid_arg(fcinfo, 0);
    const std::string payload = magic_sync::pg::jsonb_text_arg(fcinfo, 1);
    const int64_t max_bytes = magic_sync::pg::int64_arg(fcinfo, 2);
    if (max_bytes < 1)
        throw magic_sync::Error("sync_internal.filed_parts: max_bytes must be positive",
                                ERRCODE_INVALID_PARAMETER_VALUE);
    const protocol::FiledMessage answer =
        filed_of("sync_internal.filed_parts", replica, 0, 0, payload);
    std::string parts = "[";
    for (const protocol::FiledMessage& part :
         protocol::split_filed(answer, static_cast<size_t>(max_bytes))) {
        if (parts.size() > 1) parts += ',';
        parts += protocol::encode_filed_payload(part);
    }
    parts += ']';
    return magic_sync::pg::jsonb_datum(parts);
}
