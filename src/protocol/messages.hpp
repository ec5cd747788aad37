// The messages between server and replica (docs/DESIGN.md §8) and their JSON codec. The wire below
// is pinned by tests/unit/protocol_messages_test.cpp; it changes only with a kVersion bump.
//
// Down (server → replica); every one starts {"v":V,"kind":K,"replica":UUID,"gen":G,"seq":S,
// "origin":O?, then:
//   rows:   "reset":[scope,...]?, "drop":[scope,...]?, "drop_tables":[table,...]?,
//           "chunks":[{"scope":..,"from":F,"to":T,"rows":[ROW,...]},...],
//           "withheld":[{"t":..,"k":{..},"why":".."},...]? (a key too long for a note within
//           the limit is named by its hash: "kh":"<64 hex k>" in place of "k")
//   filed:  "upload":UUID, "kept":[{"t":..,"k":{..},"why":".."},...], "more":true?
//           (an answer too big for one message comes in parts; every part but the last says
//           "more", and the upload is filed once the last has come; a later answer to the same
//           upload, after the server filed kept rows of it, names what is still kept of it; a
//           key too long to fit a message is named by its hash: {"t":..,"kh":"<64 hex k>",..})
//   ranges: "scope":.., "ranges":[[LO,HI],...]
//   repair: "scope":.., "lo":LO, "hi":HI, "rows":[ROW,...]
//   ROW = {"t":table,"k":{key},"r":{row},"h":"<64 hex v>"}, or {"t":..,"k":{..},"r":null} for a row
//   that is gone.
// Up (replica → server), an upload:
//   {"v":1,"id":UUID,"rows":[{"t":..,"r":{..}},...],"applied":N?,
//    "untaken":[{"seq":N,"t":..,"k":{..},"why":".."},...]?,
//    "holds":{scope:{"through":N,"fp":"<64 hex>","n":N,"ranges":[[LO,HI,"<64 hex fp>",N],...]?}}?}
// V is the lowest version that reads the message right: 2 for a rows message that drops tables
// (a build of version 1 would not know the field and keep the rows) and for a message that names
// a key by its hash, 1 for every other message. O names the history the message was written in
// (the server's database: its system identifier, timeline and the id of its relay state, at most
// kOriginMaxBytes): a replica that finds another O than the one it applied last does not trust
// its gen and seq against the message's (after a restore, a re-created extension, a failover) and
// refuses messages of an O it left. A build that does not know the field reads the rest right.
// Fields marked ? are left out when empty. Encoding writes fields in exactly this order with no
// whitespace, so equal messages encode to equal bytes. Decoding accepts any order, ignores fields
// it does not know and refuses duplicate keys.
//
// Conventions: UUIDs are lowercase 8-4-4-4-12 hex; gen, seq, from, to, through, applied and n are
// integers in [0, 2^63); a chunk holds the rows of its scope with from < seq <= to, so after it
// the replica holds the scope through `to`; range bounds LO (inclusive) and HI (exclusive) are
// 64-hex key hashes k, HI "" meaning the top of the key space.
#pragma once

#include "protocol/pure.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protocol/fingerprint.hpp"
#include "protocol/gzip.hpp"
#include "protocol/hash.hpp"
#include "protocol/limits.hpp"

namespace magic_sync::protocol {

// The newest protocol version this build speaks, and the first one.
inline constexpr int64_t kVersion = 2;
inline constexpr int64_t kFirstVersion = 1;

// How deep a row payload sits in the deepest message (rows → "chunks" → chunk → "rows" → row): a
// row whose JSON nests d levels makes a message that nests d + kRowDepthInMessage levels.
inline constexpr int kRowDepthInMessage = 5;

// The message speaks a later protocol than this build. Sending it again to a newer build can help.
class VersionTooNew : public DecodeError {
  public:
    VersionTooNew(const std::string& context, int64_t version);
    int64_t version() const { return version_; }

  private:
    int64_t version_;
};

// Payload fields (key, json, row) hold canonical_json text. Encoding splices them verbatim, so
// they must be canonical_json output; decoding always returns them canonical.

struct MessageHeader {
    std::string replica;
    int64_t gen = 0;
    int64_t seq = 0;     // the message's place in the replica's outbox
    std::string origin;  // the history it was written in; empty: not said
};

inline constexpr size_t kOriginMaxBytes = 68;

// The widest header a message to `replica` (any replica: empty) can have: the largest gen and
// seq, the longest origin. A message is measured with it, so that it fits whatever it is given.
MessageHeader widest_header(const std::string& replica = "");

struct RowBody {
    std::string json;  // the row object
    Digest hash{};     // v = row_hash(json), as computed by the server
};

struct DownRow {
    std::string table;
    std::string key;              // the primary key object
    std::optional<RowBody> body;  // none: the row is gone from the scope
};

// A row named by key with a reason: withheld (rows), kept (filed).
struct KeyNote {
    std::string table;
    std::string key;  // "" when the note names the key by its hash
    std::string why;
    // A filed answer names a key too long for a message of its limit by its hash k (key_hash of
    // the table and key), "kh":"<64 hex>" in place of "k": the replica matches it against the
    // keys of its own writes.
    std::optional<Digest> key_hash = std::nullopt;
};

struct Chunk {
    std::string scope;
    int64_t from = 0;
    int64_t to = 0;
    std::vector<DownRow> rows;
};

struct RowsMessage {
    MessageHeader header;
    std::vector<std::string> reset;  // scopes to empty before the chunks; "*" = everything
    std::vector<std::string> drop;   // scopes the replica leaves
    // Tables the replica drops every row of, in every scope (a table no longer synced, or synced
    // under another name or key), after the scopes and before the chunks.
    std::vector<std::string> drop_tables;
    std::vector<Chunk> chunks;
    std::vector<KeyNote> withheld;
};

struct FiledMessage {
    MessageHeader header;
    std::string upload;
    std::vector<KeyNote> kept;  // rows of the upload that were not filed
    bool more = false;          // a part of the answer, and not its last
};

struct KeyRange {
    Digest lo{};               // inclusive
    std::optional<Digest> hi;  // exclusive; none: up to the top
};

bool contains(const KeyRange& range, const Digest& key_hash);

// "Send me the fingerprints of these ranges of that scope."
struct RangesMessage {
    MessageHeader header;
    std::string scope;
    std::vector<KeyRange> ranges;
};

// After applying it the replica holds exactly these rows of the scope within the range.
struct RepairMessage {
    MessageHeader header;
    std::string scope;
    KeyRange range;
    std::vector<DownRow> rows;
};

using DownMessage = std::variant<RowsMessage, FiledMessage, RangesMessage, RepairMessage>;

struct UpRow {
    std::string table;
    std::string row;  // the row object
};

// A row the replica could not apply, from the down message with this seq.
struct Untaken {
    int64_t seq = 0;
    std::string table;
    std::string key;
    std::string why;
};

struct RangeFingerprint {
    KeyRange range;
    Fingerprint fingerprint;
};

// What a replica holds of one scope.
struct Holding {
    int64_t through = 0;  // the scope's seq it has applied through
    Fingerprint fingerprint;
    std::vector<RangeFingerprint> ranges;  // answers to a ranges message
};

struct Upload {
    std::string id;
    std::vector<UpRow> rows;
    std::optional<int64_t> applied;  // seq of the last down message applied and committed
    std::vector<Untaken> untaken;
    std::map<std::string, Holding> holds;  // by scope
    // The history `applied`, `untaken` and `holds` were said in (the origin of the last message
    // applied): a server of another origin does not take them. Empty: not said.
    std::string origin;
};

bool operator==(const MessageHeader& a, const MessageHeader& b);
bool operator==(const RowBody& a, const RowBody& b);
bool operator==(const DownRow& a, const DownRow& b);
bool operator==(const KeyNote& a, const KeyNote& b);
bool operator==(const Chunk& a, const Chunk& b);
bool operator==(const RowsMessage& a, const RowsMessage& b);
bool operator==(const FiledMessage& a, const FiledMessage& b);
bool operator==(const KeyRange& a, const KeyRange& b);
bool operator==(const RangesMessage& a, const RangesMessage& b);
bool operator==(const RepairMessage& a, const RepairMessage& b);
bool operator==(const UpRow& a, const UpRow& b);
bool operator==(const Untaken& a, const Untaken& b);
bool operator==(const RangeFingerprint& a, const RangeFingerprint& b);
bool operator==(const Holding& a, const Holding& b);
bool operator==(const Upload& a, const Upload& b);

// Encoding throws std::invalid_argument only for a string that is not valid UTF-8; it does not
// check the conventions above, which the decoder enforces.
std::string encode(const Chunk& chunk);  // one element of "chunks"
std::string encode(const RowsMessage& message);
std::string encode(const FiledMessage& message);
std::string encode(const RangesMessage& message);
std::string encode(const RepairMessage& message);
std::string encode(const DownMessage& message);
std::string encode(const Upload& upload);

// A rows message whose chunks were encoded already (encode(const Chunk&), e.g. shared chunk bodies
// built once for many replicas). Same bytes as encode() of the message with those chunks;
// `message.chunks` must be empty (std::invalid_argument otherwise).
std::string encode_rows(const RowsMessage& message, const std::vector<std::string_view>& chunks);

// A chunk as the server keeps it (sync.chunk), shared by the rows messages that name it: its
// encoded body (encode(const Chunk&)) and the notes of the rows of its run that were withheld.
struct StoredChunk {
    std::string body;
    std::vector<KeyNote> withheld;
    // The body deflated on its own (deflate_piece), made once by a sender that sends gzip, for
    // assemble_rows_gzip; empty otherwise.
    DeflatedPiece deflated;
};
// A withheld note as the server keeps it: its key (canonical JSON), or none and the key's hash in
// 64 hex.
KeyNote stored_note(std::string table, std::optional<std::string> key, std::string why,
                    const std::optional<std::string>& key_hash);
// A rows message as an outbox keeps it: its envelope (`message`, with no chunks and no withheld
// notes) around the stored chunks it names, in order, their withheld notes after them in the same
// order. How sync.message and the sender assemble it, to the same bytes.
std::string assemble_rows(const RowsMessage& message,
                          const std::vector<const StoredChunk*>& chunks);
// The same message as one gzip member (docs/PROTOCOL.md §10), from each chunk's `deflated` and
// the rest deflated here; gunzip gives assemble_rows' bytes. Throws std::invalid_argument for a
// chunk not deflated.
std::string assemble_rows_gzip(const RowsMessage& message,
                               const std::vector<const StoredChunk*>& chunks);

// A list of kept rows as the "kept" field of a filed message writes it.
std::string encode_key_notes(const std::vector<KeyNote>& notes);

// A filed answer's fields after its header, as one object: {"upload":..,"kept":[..],"more":true?}.
// SQL keeps an answer in this form (sync.answer.payload, sync_internal.filed_payload) until the
// relay numbers its message.
std::string encode_filed_payload(const FiledMessage& message);
// The filed message with `header` and the fields of `payload` (an object of
// encode_filed_payload's form), checked as decode_down checks a filed message (DecodeError).
FiledMessage decode_filed_payload(const MessageHeader& header, std::string_view payload,
                                  const Limits& limits = Limits{});

// The parts of a filed answer, each encoding within `max_bytes` whatever its gen and seq: the kept
// rows in order, as many to a part as fit, every part but the last saying "more". A reason too
// long for a part of its own is cut at a UTF-8 boundary and marked " [cut]"; a kept row whose
// table and key alone do not fit goes in a part of its own, over the limit. Always one part at
// least.
std::vector<FiledMessage> split_filed(const FiledMessage& answer, size_t max_bytes);

// Throw DecodeError (VersionTooNew when "v" > kVersion, OverTheLimit when it is only too large)
// naming what is wrong and where. A message sent gzip (is_gzip) is inflated first, to at most
// `limits.max_bytes`.
DownMessage decode_down(std::string_view text, const Limits& limits = Limits{});
// An encoded down message with another header: the relay encodes a message before it is numbered
// and stamps it with its gen and seq as it enters the outbox.
std::string restamp(std::string_view message, const MessageHeader& header);
// An encoded down message with its header's origin set: the sender says which history a message
// is sent from as it sends it (the relay plans every message with room for it).
std::string with_origin(std::string_view message, const std::string& origin);
// Throws as decode_down does; an upload sent gzip is inflated first, the same way.
Upload decode_upload(std::string_view text, const Limits& limits = Limits{});

// Byte accounting for the planner. An encoded rows message is exactly
//   encode(the message with no chunks).size()          (at most rows_envelope_overhead() when it
//                                                        has no reset, drop or withheld)
//   + Σ chunk sizes + (number of chunks - 1)            (commas between chunks)
// and a chunk is exactly
//   chunk_overhead(scope, from, to) + Σ encoded_row_size(row) + (number of rows - 1).
// A repair's rows are counted the same way.
size_t rows_envelope_overhead();  // no chunks, 36-byte replica, gen and seq of 19 digits
// The most bytes a rows message with these reset and drop lists takes besides its chunks and
// withheld rows, room for the "withheld" frame included (any replica, gen and seq).
size_t rows_envelope_size(const std::vector<std::string>& reset,
                          const std::vector<std::string>& drop,
                          const std::vector<std::string>& drop_tables);
// The note that announces a withheld row of `scope`: it names the key or, when that note would not
// fit a rows message of max_bytes beside the widest envelope and the scope's chunk frame or the
// key holds a number past a double, the key's hash, so that a note always fits and can be read
// where its row could not.
KeyNote withheld_note(std::string_view scope, std::string_view table, std::string_view key,
                      std::string_view why, size_t max_bytes);
// The bytes a withheld note adds to a rows message, its comma included.
size_t withheld_note_size(const KeyNote& note);
// How many names of `drop`, then of `drop_tables`, one rows message with `reset` can carry within
// max_bytes (as rows_envelope_size counts them); at least one when there is any, so that a name
// longer than the limit still goes, alone.
size_t drops_fitting(const std::vector<std::string>& reset, const std::vector<std::string>& drop,
                     const std::vector<std::string>& drop_tables, size_t max_bytes);
size_t chunk_overhead(std::string_view scope, int64_t from, int64_t to);  // a chunk with no rows
// `row` none: the row is gone.
size_t encoded_row_size(std::string_view table, std::string_view key,
                        std::optional<std::string_view> row);
// Whether a row can travel at all: no number of its key or row is past a double (a replica may
// read numbers as doubles), no value of its row is marked not exact (not_exact_reason), and it
// fits, with the comma before it, a chunk of its scope at the largest seqs in a rows message that
// resets everything, and a repair message of its scope, within `max_bytes`. A row that does not is
// withheld (docs/DESIGN.md §4, §7): the rule depends on the row and its scope alone, never on where
// a replica's cursor stands, so the server, the replica and an oracle agree on it.
bool row_travels(std::string_view scope, std::string_view table, std::string_view key,
                 std::string_view row, size_t max_bytes);
// The most bytes an encoded row of `scope` may take and still travel (row_travels).
size_t row_room(std::string_view scope, size_t max_bytes);
// Why a row that does not travel is withheld, as its note says: "number past double" when its key
// or row holds a number no double holds, "not exact" when its row holds a value marked so, "too
// big" otherwise.
std::string why_withheld(std::string_view key, std::string_view row);
// The same, as the server sets the row aside: what is wrong, and what to do (for a value not
// exact, the marker's text).
std::string withheld_reason(std::string_view scope, std::string_view table, std::string_view key,
                            std::string_view row, size_t max_bytes);

}  // namespace magic_sync::protocol
