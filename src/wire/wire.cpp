// SQL-callable pieces of the wire, so the relay's set-wise SQL encodes and hashes exactly as the
// protocol library does on the replica: canonical JSON, key hashes, row sizes, chunk bodies and
// fingerprint arithmetic.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "pg/bridge.hpp"
#include "pg/jsonb_canonical.hpp"
#include "pg/settings.hpp"
#include "pg/values.hpp"
#include "protocol/canonical.hpp"
#include "protocol/fingerprint.hpp"
#include "protocol/hash.hpp"
#include "protocol/messages.hpp"

namespace {

namespace protocol = magic_sync::protocol;
using magic_sync::Error;

// Rows nest kRowDepthInMessage levels inside a message: canonicalize with what is left, so every
// row that can be hashed can also travel.
protocol::Limits row_limits() {
    protocol::Limits limits;
    limits.max_depth -= protocol::kRowDepthInMessage;
    return limits;
}

std::string canonical(const std::string& json) {
    try {
        return protocol::canonical_json(json, row_limits());
    } catch (const protocol::DecodeError& e) {
        throw Error(std::string("cannot encode a row: ") + e.what(),
                    ERRCODE_INVALID_TEXT_REPRESENTATION);
    }
}

// The canonical JSON of jsonb argument `n`: walked in its binary form, or through its text when
// the walk leaves it undecided (an error to report).
std::string canonical_arg(FunctionCallInfo fcinfo, int n) {
    if (auto text = magic_sync::pg::jsonb_canonical_arg(fcinfo, n, row_limits())) return *text;
    return canonical(magic_sync::pg::jsonb_text_arg(fcinfo, n));
}

protocol::Digest digest_arg(FunctionCallInfo fcinfo, int n) {
    std::string bytes = magic_sync::pg::text_arg(fcinfo, n);
    if (bytes.size() != 32)
        throw Error("a fingerprint or hash is 32 bytes", ERRCODE_DATA_EXCEPTION);
    protocol::Digest digest{};
    std::copy(bytes.begin(), bytes.end(), digest.begin());
    return digest;
}

}  // namespace

// sync_internal.canonical(jsonb) → text: the canonical JSON text of a value.
MAGIC_SYNC_FUNCTION(magic_sync_canonical) {
    return magic_sync::pg::text_datum(canonical_arg(fcinfo, 0));
}

namespace {

// The canonical JSON of a row to_json wrote (`json`), without the hidden columns; a row deeper or
// longer than a message may carry is refused with the exact error.
std::string canonical_row(const std::string& json, const std::vector<std::string>& hidden) {
    try {
        return protocol::canonical_object_without(json, hidden, row_limits());
    } catch (const protocol::DecodeError& e) {
        throw Error(std::string("cannot encode a row: ") + e.what(),
                    ERRCODE_INVALID_TEXT_REPRESENTATION);
    }
}

std::vector<std::string> hidden_arg(FunctionCallInfo fcinfo, int n) {
    std::vector<std::string> hidden;
    for (auto& name : magic_sync::pg::text_array_arg(fcinfo, n))
        if (name) hidden.push_back(*name);
    return hidden;
}

}  // namespace

// sync_internal.canonical_row(row json, hidden text[]) → text: the canonical JSON of a row that
// to_json wrote, without the hidden columns: how the truth audit writes a row, apart from
// encode_row.
MAGIC_SYNC_FUNCTION(magic_sync_canonical_row) {
    return magic_sync::pg::text_datum(
        canonical_row(magic_sync::pg::text_arg(fcinfo, 0), hidden_arg(fcinfo, 1)));
}

// sync_internal.encode_row(row record, hidden text[]) → text: the body a row travels as, its
// canonical JSON without the hidden columns, written from its columns (pg::row_canonical_arg);
// where that walk cannot decide, through to_json's text, which refuses it with the exact error (or
// gives one the pass withholds as too big).
MAGIC_SYNC_FUNCTION(magic_sync_encode_row) {
    const std::vector<std::string> hidden = hidden_arg(fcinfo, 1);
    if (auto text = magic_sync::pg::row_canonical_arg(fcinfo, 0, hidden, row_limits()))
        return magic_sync::pg::text_datum(*text);
    return magic_sync::pg::text_datum(
        canonical_row(magic_sync::pg::row_json_arg(fcinfo, 0), hidden));
}

// sync_internal.key_hash(table text, key jsonb) → bytea: k = SHA-256(table ‖ 0 ‖ canonical key).
MAGIC_SYNC_FUNCTION(magic_sync_key_hash) {
    auto k = protocol::key_hash(magic_sync::pg::text_arg(fcinfo, 0), canonical_arg(fcinfo, 1));
    return magic_sync::pg::bytea_datum(protocol::bytes_of(k));
}

// sync_internal.row_hash(body text) → bytea: v = SHA-256 of the row's canonical JSON, whose bytes
// are UTF-8 (the encoder refuses anything else).
MAGIC_SYNC_FUNCTION(magic_sync_row_hash) {
    auto v = protocol::row_hash(magic_sync::pg::text_arg(fcinfo, 0));
    return magic_sync::pg::bytea_datum(protocol::bytes_of(v));
}

// sync_internal.fp_element(k bytea, v bytea) → bytea: a row version's fingerprint element SHA-256(k
// ‖ v).
MAGIC_SYNC_FUNCTION(magic_sync_fp_element) {
    auto element = protocol::element(digest_arg(fcinfo, 0), digest_arg(fcinfo, 1));
    return magic_sync::pg::bytea_datum(protocol::bytes_of(element));
}

// sync_internal.row_size(table text, key text, body text) → int: the bytes the row adds to a chunk
// (key and body canonical; body NULL: the row is gone; no table or key: NULL).
MAGIC_SYNC_FUNCTION(magic_sync_row_size) {
    if (magic_sync::pg::arg_is_null(fcinfo, 0) || magic_sync::pg::arg_is_null(fcinfo, 1))
        return magic_sync::pg::null_result(fcinfo);
    std::string body;
    bool gone = magic_sync::pg::arg_is_null(fcinfo, 2);
    if (!gone) body = magic_sync::pg::text_arg(fcinfo, 2);
    size_t size = protocol::encoded_row_size(
        magic_sync::pg::text_arg(fcinfo, 0), magic_sync::pg::text_arg(fcinfo, 1),
        gone ? std::nullopt : std::optional<std::string_view>(body));
    return Int32GetDatum(static_cast<int32>(size));
}

// sync_internal.chunk_size(scope text, from bigint, to bigint) → int: a chunk's bytes without its
// rows.
MAGIC_SYNC_FUNCTION(magic_sync_chunk_size) {
    size_t size = protocol::chunk_overhead(magic_sync::pg::text_arg(fcinfo, 0),
                                           magic_sync::pg::int64_arg(fcinfo, 1),
                                           magic_sync::pg::int64_arg(fcinfo, 2));
    return Int32GetDatum(static_cast<int32>(size));
}

// sync_internal.envelope_size(reset text[], drops text[], table_drops text[]) → int: the most bytes
// a rows message with these lists takes besides its chunks and withheld rows (any replica, gen and
// seq).
MAGIC_SYNC_FUNCTION(magic_sync_envelope_size) {
    std::vector<std::string> lists[3];
    for (int list = 0; list < 3; ++list)
        for (auto& name : magic_sync::pg::text_array_arg(fcinfo, list))
            if (name) lists[list].push_back(*name);
    return Int32GetDatum(
        static_cast<int32>(protocol::rows_envelope_size(lists[0], lists[1], lists[2])));
}

// sync_internal.drops_fitting(reset text[], drops text[], table_drops text[]) → int: how many of
// the drops, then of the table drops, one rows message carries within magic_sync.bytes_per_message
// (protocol::drops_fitting); the rest wait for the next message.
MAGIC_SYNC_FUNCTION(magic_sync_drops_fitting) {
    std::vector<std::string> lists[3];
    for (int list = 0; list < 3; ++list)
        for (auto& name : magic_sync::pg::text_array_arg(fcinfo, list))
            if (name) lists[list].push_back(*name);
    return Int32GetDatum(static_cast<int32>(
        protocol::drops_fitting(lists[0], lists[1], lists[2],
                                static_cast<size_t>(magic_sync::settings::bytes_per_message))));
}

// sync_internal.row_travels(scope text, table text, key text, body text) → boolean: whether the row
// can travel at all: it fits a message of magic_sync.bytes_per_message and a double holds its
// numbers (protocol::row_travels); one that does not is withheld.
MAGIC_SYNC_FUNCTION(magic_sync_row_travels) {
    return BoolGetDatum(protocol::row_travels(
        magic_sync::pg::text_arg(fcinfo, 0), magic_sync::pg::text_arg(fcinfo, 1),
        magic_sync::pg::text_arg(fcinfo, 2), magic_sync::pg::text_arg(fcinfo, 3),
        static_cast<size_t>(magic_sync::settings::bytes_per_message)));
}

namespace {

// The withheld note of the row in arguments 0-3 (scope, table, key, body), with its reason.
protocol::KeyNote withheld_note_arg(FunctionCallInfo fcinfo) {
    const std::string key = magic_sync::pg::text_arg(fcinfo, 2);
    return protocol::withheld_note(magic_sync::pg::text_arg(fcinfo, 0),
                                   magic_sync::pg::text_arg(fcinfo, 1), key,
                                   protocol::why_withheld(key, magic_sync::pg::text_arg(fcinfo, 3)),
                                   static_cast<size_t>(magic_sync::settings::bytes_per_message));
}

}  // namespace

// sync_internal.withheld_note(scope text, table text, key text, body text) → jsonb: the note that
// announces a withheld row of the scope with why, naming its key or its hash
// (protocol::withheld_note).
MAGIC_SYNC_FUNCTION(magic_sync_withheld_note) {
    const std::string list = protocol::encode_key_notes({withheld_note_arg(fcinfo)});
    return magic_sync::pg::jsonb_datum(list.substr(1, list.size() - 2));
}

// sync_internal.withheld_size(scope text, table text, key text, body text) → int: the bytes that
// note adds to a rows message (its comma included).
MAGIC_SYNC_FUNCTION(magic_sync_withheld_size) {
    return Int32GetDatum(
        static_cast<int32>(protocol::withheld_note_size(withheld_note_arg(fcinfo))));
}

// sync_internal.withheld_reason(scope text, table text, key text, body text) → text: why the row is
// withheld and what to do, as it is set aside (protocol::withheld_reason).
MAGIC_SYNC_FUNCTION(magic_sync_withheld_reason) {
    return magic_sync::pg::text_datum(protocol::withheld_reason(
        magic_sync::pg::text_arg(fcinfo, 0), magic_sync::pg::text_arg(fcinfo, 1),
        magic_sync::pg::text_arg(fcinfo, 2), magic_sync::pg::text_arg(fcinfo, 3),
        static_cast<size_t>(magic_sync::settings::bytes_per_message)));
}

// sync_internal.encode_chunk(scope, from, to, seqs bigint[], tables text[], keys text[], bodies
// text[], hashes text[]) → text: one element of a message's "chunks", its rows in seq order (the
// arrays are aligned, in any order, so the caller aggregates them without sorting each one); keys
// and bodies canonical, hashes hex, a NULL body a gone row.
MAGIC_SYNC_FUNCTION(magic_sync_encode_chunk) {
    protocol::Chunk chunk;
    chunk.scope = magic_sync::pg::text_arg(fcinfo, 0);
    chunk.from = magic_sync::pg::int64_arg(fcinfo, 1);
    chunk.to = magic_sync::pg::int64_arg(fcinfo, 2);
    if (!magic_sync::pg::arg_is_null(fcinfo, 3)) {
        auto seqs = magic_sync::pg::int64_array_arg(fcinfo, 3);
        auto tables = magic_sync::pg::text_array_arg(fcinfo, 4);
        auto keys = magic_sync::pg::text_array_arg(fcinfo, 5);
        auto bodies = magic_sync::pg::text_array_arg(fcinfo, 6);
        auto hashes = magic_sync::pg::text_array_arg(fcinfo, 7);
        if (tables.size() != seqs.size() || keys.size() != seqs.size() ||
            bodies.size() != seqs.size() || hashes.size() != seqs.size())
            throw Error("sync_internal.encode_chunk: the arrays differ in length");
        std::vector<size_t> order(seqs.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return seqs[a] < seqs[b]; });
        for (size_t i : order) {
            protocol::DownRow row{tables[i].value_or(""), keys[i].value_or("{}"), std::nullopt};
            if (bodies[i])
                row.body = protocol::RowBody{*bodies[i],
                                             protocol::digest_from_hex(hashes[i].value_or(""))};
            chunk.rows.push_back(std::move(row));
        }
    }
    return magic_sync::pg::text_datum(protocol::encode(chunk));
}

// sync_internal.fp_add(a bytea, b bytea) → bytea and sync_internal.fp_sub: sums mod 2^256
// (fingerprints).
MAGIC_SYNC_FUNCTION(magic_sync_fp_add) {
    auto sum = digest_arg(fcinfo, 0);
    protocol::add_mod(sum, digest_arg(fcinfo, 1));
    return magic_sync::pg::bytea_datum(protocol::bytes_of(sum));
}

MAGIC_SYNC_FUNCTION(magic_sync_fp_sub) {
    auto difference = digest_arg(fcinfo, 0);
    protocol::sub_mod(difference, digest_arg(fcinfo, 1));
    return magic_sync::pg::bytea_datum(protocol::bytes_of(difference));
}

// sync_internal.stamp_message(message bytea, replica uuid, gen bigint, seq bigint) → bytea: the
// encoded down message with that header (protocol::restamp), as it enters the outbox.
MAGIC_SYNC_FUNCTION(magic_sync_stamp_message) {
    const std::string message = magic_sync::pg::text_arg(fcinfo, 0);
    const protocol::MessageHeader header{magic_sync::pg::uuid_arg(fcinfo, 1),
                                         magic_sync::pg::int64_arg(fcinfo, 2),
                                         magic_sync::pg::int64_arg(fcinfo, 3), ""};
    try {
        return magic_sync::pg::bytea_datum(protocol::restamp(message, header));
    } catch (const protocol::DecodeError& e) {
        throw Error(std::string("sync_internal.stamp_message: not a down message: ") + e.what(),
                    ERRCODE_INVALID_PARAMETER_VALUE);
    }
}
