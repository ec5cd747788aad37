#include "protocol/messages.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "protocol/canonical.hpp"
#include "protocol/fingerprint.hpp"
#include "protocol/json_tree.hpp"

namespace magic_sync::protocol {

VersionTooNew::VersionTooNew(const std::string& context, int64_t version)
    : DecodeError(context + ": message speaks protocol version " + std::to_string(version) +
                  "; this build speaks up to version " + std::to_string(kVersion)),
      version_(version) {}

bool contains(const KeyRange& range, const Digest& key_hash) {
    return range.lo <= key_hash && (!range.hi || key_hash < *range.hi);
}

bool operator==(const MessageHeader& a, const MessageHeader& b) {
    return std::tie(a.replica, a.gen, a.seq, a.origin) ==
           std::tie(b.replica, b.gen, b.seq, b.origin);
}

MessageHeader widest_header(const std::string& replica) {
    return {replica.empty() ? std::string(36, 'f') : replica, std::numeric_limits<int64_t>::max(),
            std::numeric_limits<int64_t>::max(), std::string(kOriginMaxBytes, 'f')};
}
bool operator==(const RowBody& a, const RowBody& b) {
    return std::tie(a.json, a.hash) == std::tie(b.json, b.hash);
}
bool operator==(const DownRow& a, const DownRow& b) {
    return std::tie(a.table, a.key, a.body) == std::tie(b.table, b.key, b.body);
}
bool operator==(const KeyNote& a, const KeyNote& b) {
    return std::tie(a.table, a.key, a.why, a.key_hash) ==
           std::tie(b.table, b.key, b.why, b.key_hash);
}
bool operator==(const Chunk& a, const Chunk& b) {
    return std::tie(a.scope, a.from, a.to, a.rows) == std::tie(b.scope, b.from, b.to, b.rows);
}
bool operator==(const RowsMessage& a, const RowsMessage& b) {
    return std::tie(a.header, a.reset, a.drop, a.drop_tables, a.chunks, a.withheld) ==
           std::tie(b.header, b.reset, b.drop, b.drop_tables, b.chunks, b.withheld);
}
bool operator==(const FiledMessage& a, const FiledMessage& b) {
    return std::tie(a.header, a.upload, a.kept, a.more) ==
           std::tie(b.header, b.upload, b.kept, b.more);
}
bool operator==(const KeyRange& a, const KeyRange& b) {
    return std::tie(a.lo, a.hi) == std::tie(b.lo, b.hi);
}
bool operator==(const RangesMessage& a, const RangesMessage& b) {
    return std::tie(a.header, a.scope, a.ranges) == std::tie(b.header, b.scope, b.ranges);
}
bool operator==(const RepairMessage& a, const RepairMessage& b) {
    return std::tie(a.header, a.scope, a.range, a.rows) ==
           std::tie(b.header, b.scope, b.range, b.rows);
}
bool operator==(const UpRow& a, const UpRow& b) {
    return std::tie(a.table, a.row) == std::tie(b.table, b.row);
}
bool operator==(const Untaken& a, const Untaken& b) {
    return std::tie(a.seq, a.table, a.key, a.why) == std::tie(b.seq, b.table, b.key, b.why);
}
bool operator==(const RangeFingerprint& a, const RangeFingerprint& b) {
    return std::tie(a.range, a.fingerprint) == std::tie(b.range, b.fingerprint);
}
bool operator==(const Holding& a, const Holding& b) {
    return std::tie(a.through, a.fingerprint, a.ranges) ==
           std::tie(b.through, b.fingerprint, b.ranges);
}
bool operator==(const Upload& a, const Upload& b) {
    return std::tie(a.id, a.rows, a.applied, a.untaken, a.holds, a.origin) ==
           std::tie(b.id, b.rows, b.applied, b.untaken, b.holds, b.origin);
}

// ---------------------------------------------------------------------------------------------
// Encoding

namespace {

constexpr size_t kHexDigestLength = 64;

// Writes one object's members in order: field("a") writes `{"a":` the first time, `,"a":` after.
class ObjectWriter {
  public:
    explicit ObjectWriter(std::string& out) : out_(out) {}

    std::string& field(std::string_view name) {
        out_ += first_ ? '{' : ',';
        first_ = false;
        append_json_string(out_, name);
        out_ += ':';
        return out_;
    }

    void string_field(std::string_view name, std::string_view value) {
        append_json_string(field(name), value);
    }

    void integer_field(std::string_view name, int64_t value) {
        field(name) += std::to_string(value);
    }

    void raw_field(std::string_view name, std::string_view json) { field(name) += json; }

    void close() { out_ += first_ ? "{}" : "}"; }

  private:
    std::string& out_;
    bool first_ = true;
};

template <typename Item, typename WriteItem>
void append_list(std::string& out, const std::vector<Item>& items, WriteItem write_item) {
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ',';
        write_item(out, items[i]);
    }
    out += ']';
}

void append_scopes(std::string& out, const std::vector<std::string>& scopes) {
    append_list(out, scopes,
                [](std::string& o, const std::string& s) { append_json_string(o, s); });
}

void append_down_row(std::string& out, const DownRow& row) {
    ObjectWriter object(out);
    object.string_field("t", row.table);
    object.raw_field("k", row.key);
    if (row.body) {
        object.raw_field("r", row.body->json);
        object.string_field("h", to_hex(row.body->hash));
    } else {
        object.raw_field("r", "null");
    }
    object.close();
}

void append_key_note(std::string& out, const KeyNote& note) {
    ObjectWriter object(out);
    object.string_field("t", note.table);
    if (note.key_hash) {
        object.string_field("kh", to_hex(*note.key_hash));
    } else {
        object.raw_field("k", note.key);
    }
    object.string_field("why", note.why);
    object.close();
}

void append_upper_bound(std::string& out, const std::optional<Digest>& hi) {
    append_json_string(out, hi ? to_hex(*hi) : "");
}

void append_key_range(std::string& out, const KeyRange& range) {
    out += '[';
    append_json_string(out, to_hex(range.lo));
    out += ',';
    append_upper_bound(out, range.hi);
    out += ']';
}

// `version`: the lowest that reads the message right (a build that does not know its fields
// refuses it rather than apply half of it).
ObjectWriter open_down(std::string& out, std::string_view kind, const MessageHeader& header,
                       int64_t version = kFirstVersion) {
    ObjectWriter object(out);
    object.integer_field("v", version);
    object.string_field("kind", kind);
    object.string_field("replica", header.replica);
    object.integer_field("gen", header.gen);
    object.integer_field("seq", header.seq);
    if (!header.origin.empty()) object.string_field("origin", header.origin);
    return object;
}

void append_text(std::string& out, std::string_view text) { out += text; }

template <typename Chunks, typename WriteChunk>
std::string encode_rows_with(const RowsMessage& message, const Chunks& chunks,
                             WriteChunk write_chunk) {
    std::string out;
    const bool hashed = std::any_of(message.withheld.begin(), message.withheld.end(),
                                    [](const KeyNote& note) { return note.key_hash.has_value(); });
    ObjectWriter object =
        open_down(out, "rows", message.header,
                  message.drop_tables.empty() && !hashed ? kFirstVersion : kVersion);
    if (!message.reset.empty()) append_scopes(object.field("reset"), message.reset);
    if (!message.drop.empty()) append_scopes(object.field("drop"), message.drop);
    if (!message.drop_tables.empty()) {
        append_scopes(object.field("drop_tables"), message.drop_tables);
    }
    append_list(object.field("chunks"), chunks, write_chunk);
    if (!message.withheld.empty()) {
        append_list(object.field("withheld"), message.withheld, append_key_note);
    }
    object.close();
    return out;
}

}  // namespace

std::string encode(const Chunk& chunk) {
    std::string out;
    ObjectWriter object(out);
    object.string_field("scope", chunk.scope);
    object.integer_field("from", chunk.from);
    object.integer_field("to", chunk.to);
    append_list(object.field("rows"), chunk.rows, append_down_row);
    object.close();
    return out;
}

std::string encode(const RowsMessage& message) {
    std::vector<std::string> chunks;
    chunks.reserve(message.chunks.size());
    for (const Chunk& chunk : message.chunks) chunks.push_back(encode(chunk));
    return encode_rows_with(message, chunks, append_text);
}

std::string encode_rows(const RowsMessage& message, const std::vector<std::string_view>& chunks) {
    if (!message.chunks.empty()) {
        throw std::invalid_argument(
            "encode_rows: the message's chunks must come encoded, not in it");
    }
    return encode_rows_with(message, chunks, append_text);
}

KeyNote stored_note(std::string table, std::optional<std::string> key, std::string why,
                    const std::optional<std::string>& key_hash) {
    KeyNote note{std::move(table), std::move(key).value_or(""), std::move(why)};
    if (key_hash) note.key_hash = digest_from_hex(*key_hash);
    return note;
}

namespace {

// The message with its chunks' withheld notes after its own (assemble_rows: it has none).
RowsMessage with_chunks_withheld(const RowsMessage& message,
                                 const std::vector<const StoredChunk*>& chunks) {
    if (!message.withheld.empty()) {
        throw std::invalid_argument(
            "assemble_rows: the message's withheld notes come from its chunks, not from it");
    }
    RowsMessage whole = message;
    for (const StoredChunk* chunk : chunks)
        whole.withheld.insert(whole.withheld.end(), chunk->withheld.begin(), chunk->withheld.end());
    return whole;
}

}  // namespace

std::string assemble_rows(const RowsMessage& message,
                          const std::vector<const StoredChunk*>& chunks) {
    std::vector<std::string_view> bodies;
    bodies.reserve(chunks.size());
    for (const StoredChunk* chunk : chunks) bodies.push_back(chunk->body);
    return encode_rows(with_chunks_withheld(message, chunks), bodies);
}

std::string assemble_rows_gzip(const RowsMessage& message,
                               const std::vector<const StoredChunk*>& chunks) {
    // The envelope's text with the chunks left out, and where each would have gone.
    std::vector<size_t> places;
    const std::string text = encode_rows_with(
        with_chunks_withheld(message, chunks), chunks,
        [&places](std::string& out, const StoredChunk*) { places.push_back(out.size()); });
    std::vector<DeflatedPiece> texts;  // the envelope's pieces, deflated for this message
    texts.reserve(chunks.size() + 1);
    std::vector<const DeflatedPiece*> pieces;
    size_t from = 0;
    for (size_t i = 0; i <= chunks.size(); ++i) {
        const size_t to = i < chunks.size() ? places[i] : text.size();
        if (to > from) {
            texts.push_back(deflate_piece(std::string_view(text).substr(from, to - from)));
            pieces.push_back(&texts.back());
        }
        from = to;
        if (i == chunks.size()) break;
        if (chunks[i]->deflated.size != chunks[i]->body.size())
            throw std::invalid_argument("assemble_rows_gzip: a chunk was not deflated");
        pieces.push_back(&chunks[i]->deflated);
    }
    return gzip_join(pieces);
}

std::string encode(const FiledMessage& message) {
    std::string out;
    const bool hashed = std::any_of(message.kept.begin(), message.kept.end(),
                                    [](const KeyNote& note) { return note.key_hash.has_value(); });
    ObjectWriter object =
        open_down(out, "filed", message.header, hashed ? kVersion : kFirstVersion);
    object.string_field("upload", message.upload);
    append_list(object.field("kept"), message.kept, append_key_note);
    if (message.more) object.raw_field("more", "true");
    object.close();
    return out;
}

std::string encode_key_notes(const std::vector<KeyNote>& notes) {
    std::string out;
    append_list(out, notes, append_key_note);
    return out;
}

std::string encode_filed_payload(const FiledMessage& message) {
    std::string out;
    ObjectWriter object(out);
    object.string_field("upload", message.upload);
    append_list(object.field("kept"), message.kept, append_key_note);
    if (message.more) object.raw_field("more", "true");
    object.close();
    return out;
}

FiledMessage decode_filed_payload(const MessageHeader& header, std::string_view payload,
                                  const Limits& limits) {
    if (payload.size() < 2 || payload.front() != '{')
        throw DecodeError("filed payload: must be a JSON object");
    std::string text;
    open_down(text, "filed", header);
    text += payload == "{}" ? "}" : "," + std::string(payload.substr(1));
    // The header's fields come first: a payload that names one again is refused as a duplicate.
    return std::get<FiledMessage>(decode_down(text, limits));
}

std::vector<FiledMessage> split_filed(const FiledMessage& answer, size_t max_bytes) {
    static const std::string kCutMark = " [cut]";
    const MessageHeader widest = widest_header(answer.header.replica);
    const size_t envelope = encode(FiledMessage{widest, answer.upload, {}, true}).size();
    const size_t room = max_bytes > envelope ? max_bytes - envelope : 0;
    const auto note_size = [](const KeyNote& note) {
        std::string out;
        append_key_note(out, note);
        return out.size() + 1;  // and its comma
    };

    std::vector<FiledMessage> parts;
    FiledMessage part{answer.header, answer.upload, {}, false};
    size_t used = 0;
    const auto cut_why = [&](KeyNote& note, size_t size) {
        const size_t over = size - room + kCutMark.size();
        if (over >= note.why.size()) return size;
        size_t keep = note.why.size() - over;
        while (keep > 0 && (static_cast<unsigned char>(note.why[keep]) & 0xc0) == 0x80) --keep;
        note.why = note.why.substr(0, keep) + kCutMark;
        return note_size(note);
    };
    for (KeyNote note : answer.kept) {
        size_t size = note_size(note);
        if (size > room) size = cut_why(note, size);
        if (size > room && !note.key_hash) {
            // A key too long to name within the limit is named by its hash.
            note.key_hash = key_hash(note.table, note.key);
            note.key.clear();
            size = note_size(note);
            if (size > room) size = cut_why(note, size);
        }
        if (!part.kept.empty() && used + size > room) {
            part.more = true;
            parts.push_back(part);
            part.kept.clear();
            used = 0;
        }
        part.kept.push_back(std::move(note));
        used += size;
    }
    part.more = false;
    parts.push_back(std::move(part));
    return parts;
}

std::string encode(const RangesMessage& message) {
    std::string out;
    ObjectWriter object = open_down(out, "ranges", message.header);
    object.string_field("scope", message.scope);
    append_list(object.field("ranges"), message.ranges, append_key_range);
    object.close();
    return out;
}

std::string encode(const RepairMessage& message) {
    std::string out;
    ObjectWriter object = open_down(out, "repair", message.header);
    object.string_field("scope", message.scope);
    object.string_field("lo", to_hex(message.range.lo));
    append_upper_bound(object.field("hi"), message.range.hi);
    append_list(object.field("rows"), message.rows, append_down_row);
    object.close();
    return out;
}

std::string encode(const DownMessage& message) {
    return std::visit([](const auto& alternative) { return encode(alternative); }, message);
}

std::string encode(const Upload& upload) {
    std::string out;
    ObjectWriter object(out);
    object.integer_field("v", kFirstVersion);  // nothing of a later version in an upload
    object.string_field("id", upload.id);
    append_list(object.field("rows"), upload.rows, [](std::string& o, const UpRow& row) {
        ObjectWriter row_object(o);
        row_object.string_field("t", row.table);
        row_object.raw_field("r", row.row);
        row_object.close();
    });
    if (upload.applied) object.integer_field("applied", *upload.applied);
    if (!upload.origin.empty()) object.string_field("origin", upload.origin);
    if (!upload.untaken.empty()) {
        append_list(object.field("untaken"), upload.untaken,
                    [](std::string& o, const Untaken& untaken) {
                        ObjectWriter untaken_object(o);
                        untaken_object.integer_field("seq", untaken.seq);
                        untaken_object.string_field("t", untaken.table);
                        untaken_object.raw_field("k", untaken.key);
                        untaken_object.string_field("why", untaken.why);
                        untaken_object.close();
                    });
    }
    if (!upload.holds.empty()) {
        ObjectWriter holds(object.field("holds"));
        for (const auto& [scope, holding] : upload.holds) {
            ObjectWriter holding_object(holds.field(scope));
            holding_object.integer_field("through", holding.through);
            holding_object.string_field("fp", holding.fingerprint.hex());
            holding_object.integer_field("n", holding.fingerprint.count);
            if (!holding.ranges.empty()) {
                append_list(holding_object.field("ranges"), holding.ranges,
                            [](std::string& o, const RangeFingerprint& range) {
                                o += '[';
                                append_json_string(o, to_hex(range.range.lo));
                                o += ',';
                                append_upper_bound(o, range.range.hi);
                                o += ',';
                                append_json_string(o, range.fingerprint.hex());
                                o += ',';
                                o += std::to_string(range.fingerprint.count);
                                o += ']';
                            });
            }
            holding_object.close();
        }
        holds.close();
    }
    object.close();
    return out;
}

size_t rows_envelope_overhead() {
    static const size_t overhead = [] {
        RowsMessage widest;
        widest.header = widest_header();
        return encode(widest).size();
    }();
    return overhead;
}

size_t rows_envelope_size(const std::vector<std::string>& reset,
                          const std::vector<std::string>& drop,
                          const std::vector<std::string>& drop_tables) {
    RowsMessage message;
    message.header = widest_header();
    message.reset = reset;
    message.drop = drop;
    message.drop_tables = drop_tables;
    // Room for the "withheld":[...] frame, in case a chunk brings withheld rows: with one note the
    // message grows by frame + note, with a second by note + 1 (a comma).
    const KeyNote note{"t", "{}", ""};
    RowsMessage one_note = message;
    one_note.withheld.push_back(note);
    RowsMessage two_notes = one_note;
    two_notes.withheld.push_back(note);
    const size_t none = encode(message).size();
    const size_t one = encode(one_note).size();
    const size_t two = encode(two_notes).size();
    return none + (one - none) - (two - one) + 1;
}

KeyNote withheld_note(std::string_view scope, std::string_view table, std::string_view key,
                      std::string_view why, size_t max_bytes) {
    constexpr int64_t kLargestSeq = std::numeric_limits<int64_t>::max();
    static const size_t envelope = rows_envelope_size({"*"}, {}, {});
    KeyNote note{std::string(table), std::string(key), std::string(why)};
    const size_t around = envelope + chunk_overhead(scope, kLargestSeq, kLargestSeq) + 1;
    if (around + withheld_note_size(note) > max_bytes || number_past_double(key)) {
        note.key_hash = key_hash(table, key);
        note.key.clear();
    }
    return note;
}

size_t withheld_note_size(const KeyNote& note) {
    std::string out;
    append_key_note(out, note);
    return out.size() + 1;
}

size_t drops_fitting(const std::vector<std::string>& reset, const std::vector<std::string>& drop,
                     const std::vector<std::string>& drop_tables, size_t max_bytes) {
    const size_t total = drop.size() + drop_tables.size();
    const auto size_of_first = [&](size_t n) {
        const size_t drops = std::min(n, drop.size());
        return rows_envelope_size(
            reset, std::vector<std::string>(drop.begin(), drop.begin() + drops),
            std::vector<std::string>(drop_tables.begin(), drop_tables.begin() + (n - drops)));
    };
    // The size grows with n: the largest n that fits, by bisection.
    size_t fits = total == 0 ? 0 : 1;
    size_t over = total + 1;
    while (over - fits > 1) {
        const size_t middle = fits + (over - fits) / 2;
        if (size_of_first(middle) <= max_bytes) {
            fits = middle;
        } else {
            over = middle;
        }
    }
    return fits;
}

size_t chunk_overhead(std::string_view scope, int64_t from, int64_t to) {
    Chunk empty;
    empty.scope = std::string(scope);
    empty.from = from;
    empty.to = to;
    return encode(empty).size();
}

size_t encoded_row_size(std::string_view table, std::string_view key,
                        std::optional<std::string_view> row) {
    std::string quoted_table;
    append_json_string(quoted_table, table);
    // {"t":T,"k":K,"r":R,"h":"<hex>"} or {"t":T,"k":K,"r":null}
    size_t size = std::string_view(R"({"t":,"k":,"r":})").size() + quoted_table.size() + key.size();
    if (!row) return size + std::string_view("null").size();
    return size + row->size() + std::string_view(R"(,"h":"")").size() + kHexDigestLength;
}

bool row_travels(std::string_view scope, std::string_view table, std::string_view key,
                 std::string_view row, size_t max_bytes) {
    return encoded_row_size(table, key, row) <= row_room(scope, max_bytes) &&
           !number_past_double(key) && !number_past_double(row) && !not_exact_reason(row);
}

std::string why_withheld(std::string_view key, std::string_view row) {
    if (number_past_double(key) || number_past_double(row)) return "number past double";
    return not_exact_reason(row) ? "not exact" : "too big";
}

std::string withheld_reason(std::string_view scope, std::string_view table, std::string_view key,
                            std::string_view row, size_t max_bytes) {
    if (std::optional<std::string> problem = not_exact_reason(row)) return *problem;
    for (std::string_view part : {key, row}) {
        if (std::optional<std::string> problem = number_past_double_problem(part)) {
            return *problem +
                   ": replicas may read numbers as doubles, so the row is withheld from them; "
                   "store it within a double's range, or leave its column out of the declaration";
        }
    }
    return "too big: " + std::to_string(encoded_row_size(table, key, row)) +
           " bytes encoded, over the " + std::to_string(row_room(scope, max_bytes)) +
           " bytes a message may hold (magic_sync.bytes_per_message)";
}

size_t row_room(std::string_view scope, size_t max_bytes) {
    // Asked for every row a pass plans (row_travels), nearly always of one scope and one limit:
    // the last answer is kept (per thread: the programs share this code), where encoding the two
    // frames took most of a call.
    thread_local std::string last_scope;
    thread_local size_t last_max_bytes = 0;
    thread_local size_t last_room = 0;
    thread_local bool known = false;
    if (known && max_bytes == last_max_bytes && scope == last_scope) return last_room;
    constexpr int64_t kLargestSeq = std::numeric_limits<int64_t>::max();
    static const size_t envelope = rows_envelope_size({"*"}, {}, {});
    RepairMessage repair;
    repair.header = widest_header();
    repair.scope = std::string(scope);
    repair.range.lo.fill(0xff);
    repair.range.hi = repair.range.lo;
    // A row travels in a rows message and, when a repair resends it, in a repair message.
    const size_t around = std::max(envelope + chunk_overhead(scope, kLargestSeq, kLargestSeq),
                                   encode(repair).size()) +
                          1;
    const size_t room = around < max_bytes ? max_bytes - around - 1 : 0;  // its comma
    last_scope.assign(scope);
    last_max_bytes = max_bytes;
    last_room = room;
    known = true;
    return room;
}

// ---------------------------------------------------------------------------------------------
// Decoding

namespace {

// A node of the message with where it is, so that every error can say both what and where.
// Paths read like "rows"[3]."t".
class Field {
  public:
    Field(const JsonNode& node, std::string path, const std::string& context)
        : node_(node), path_(std::move(path)), context_(context) {}

    [[noreturn]] void fail(const std::string& problem) const {
        throw DecodeError(context_ + ": field " + path_ + " " + problem);
    }

    std::optional<Field> optional_member(std::string_view name) const {
        if (node_.type != JsonNode::Type::kObject) fail("must be an object");
        const JsonNode* member = find_member(node_, name);
        if (member == nullptr) return std::nullopt;
        return Field(*member, member_path(name), context_);
    }

    Field member(std::string_view name) const {
        std::optional<Field> found = optional_member(name);
        if (!found) throw DecodeError(context_ + ": missing field " + member_path(name));
        return *found;
    }

    std::vector<std::pair<std::string, Field>> members() const {
        if (node_.type != JsonNode::Type::kObject) fail("must be an object");
        std::vector<std::pair<std::string, Field>> fields;
        for (const JsonMember& member : node_.members) {
            fields.emplace_back(member.key, Field(member.value, member_path(member.key), context_));
        }
        return fields;
    }

    std::vector<Field> items() const {
        if (node_.type != JsonNode::Type::kArray) fail("must be an array");
        std::vector<Field> fields;
        fields.reserve(node_.items.size());
        for (size_t i = 0; i < node_.items.size(); ++i) {
            fields.emplace_back(node_.items[i], path_ + "[" + std::to_string(i) + "]", context_);
        }
        return fields;
    }

    std::vector<Field> tuple(size_t size, const char* shape) const {
        if (node_.type != JsonNode::Type::kArray || node_.items.size() != size) {
            fail(std::string("must be an array ") + shape);
        }
        return items();
    }

    bool boolean() const {
        if (node_.type != JsonNode::Type::kBoolean) fail("must be true or false");
        return node_.text == "true";
    }

    const std::string& string() const {
        if (node_.type != JsonNode::Type::kString) fail("must be a string");
        return node_.text;
    }

    // Whole numbers only: 3, not 3.0 or 3e0.
    std::optional<int64_t> integer() const {
        if (node_.type != JsonNode::Type::kNumber) return std::nullopt;
        const std::string& lexeme = node_.text;
        int64_t value = 0;
        auto [end, error] = std::from_chars(lexeme.data(), lexeme.data() + lexeme.size(), value);
        if (error != std::errc() || end != lexeme.data() + lexeme.size()) return std::nullopt;
        return value;
    }

    int64_t count() const {
        std::optional<int64_t> value = integer();
        if (!value || *value < 0) fail("must be a non-negative integer");
        return *value;
    }

    Digest digest() const {
        try {
            return digest_from_hex(string());
        } catch (const std::invalid_argument&) {
            fail("must be 64 lowercase hex digits");
        }
    }

    std::optional<Digest> upper_bound() const {
        if (string().empty()) return std::nullopt;
        return digest();
    }

    const std::string& uuid() const {
        const std::string& text = string();
        bool valid = text.size() == 36;
        for (size_t i = 0; valid && i < text.size(); ++i) {
            char c = text[i];
            bool dash_here = i == 8 || i == 13 || i == 18 || i == 23;
            valid = dash_here ? c == '-' : (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        }
        if (!valid) fail("must be a lowercase UUID (8-4-4-4-12 hex digits)");
        return text;
    }

    const std::string& object_payload() const {
        if (node_.type != JsonNode::Type::kPayload || node_.text.front() != '{') {
            fail("must be an object");
        }
        return node_.text;
    }

    std::optional<std::string> object_or_null_payload() const {
        if (node_.type == JsonNode::Type::kPayload && node_.text == "null") return std::nullopt;
        if (node_.type != JsonNode::Type::kPayload || node_.text.front() != '{') {
            fail("must be an object or null");
        }
        return node_.text;
    }

  private:
    std::string member_path(std::string_view name) const {
        return (path_.empty() ? path_ : path_ + ".") + quoted_excerpt(name);
    }

    const JsonNode& node_;
    std::string path_;
    const std::string& context_;
};

// Counts row entries over all of a message's lists against limits.max_rows.
class RowBudget {
  public:
    RowBudget(const Limits& limits, const std::string& context)
        : limit_(limits.max_rows), context_(context) {}

    std::vector<Field> take(const Field& list) {
        std::vector<Field> rows = list.items();
        used_ += rows.size();
        if (used_ > limit_) {
            throw DecodeError(context_ + ": message has more than " + std::to_string(limit_) +
                              " rows");
        }
        return rows;
    }

  private:
    size_t limit_;
    size_t used_ = 0;
    const std::string& context_;
};

// A message sent gzip (docs/PROTOCOL.md §7, §10), either way: the JSON it holds, within the same
// bound on its size; nothing for a message sent as it is. Inflated once: gzip within gzip would
// nest as deep as its bytes allow.
std::optional<std::string> inflated(std::string_view text, const Limits& limits) {
    if (!is_gzip(text)) return std::nullopt;
    std::string plain = gunzip(text, limits.max_bytes);
    if (is_gzip(plain)) throw DecodeError("gzip: a message compressed twice");
    return plain;
}

JsonNode parse_message(std::string_view text, const Limits& limits, const std::string& context) {
    if (text.size() > limits.max_bytes) {
        throw OverTheLimit(context + ": message is " + std::to_string(text.size()) +
                           " bytes, over the limit of " + std::to_string(limits.max_bytes));
    }
    JsonNode root;
    try {
        root = parse_json_tree(text, limits, PayloadPlacement::kRowFields);
    } catch (const DecodeError& error) {
        throw DecodeError(context + ": " + error.what());
    }
    if (root.type != JsonNode::Type::kObject) {
        throw DecodeError(context + ": message must be a JSON object");
    }
    return root;
}

// Read before anything else: a later version may have changed every other field.
void check_version(const Field& message, const std::string& context) {
    std::optional<int64_t> version = message.member("v").integer();
    if (!version) message.member("v").fail("must be an integer");
    if (*version < 1) message.member("v").fail("must be at least 1");
    if (*version > kVersion) throw VersionTooNew(context, *version);
}

MessageHeader decode_header(const Field& message) {
    MessageHeader header;
    header.replica = message.member("replica").uuid();
    header.gen = message.member("gen").count();
    header.seq = message.member("seq").count();
    if (std::optional<Field> origin = message.optional_member("origin")) {
        header.origin = origin->string();
        if (header.origin.empty() || header.origin.size() > kOriginMaxBytes)
            origin->fail("must be 1 to " + std::to_string(kOriginMaxBytes) + " bytes");
    }
    return header;
}

std::vector<std::string> decode_scopes(const std::optional<Field>& list) {
    std::vector<std::string> scopes;
    if (!list) return scopes;
    for (const Field& scope : list->items()) scopes.push_back(scope.string());
    return scopes;
}

std::vector<DownRow> decode_down_rows(const Field& list, RowBudget& budget) {
    std::vector<DownRow> rows;
    for (const Field& item : budget.take(list)) {
        DownRow row;
        row.table = item.member("t").string();
        row.key = item.member("k").object_payload();
        if (std::optional<std::string> json = item.member("r").object_or_null_payload()) {
            row.body = RowBody{std::move(*json), item.member("h").digest()};
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

std::vector<KeyNote> decode_key_notes(const std::optional<Field>& list, RowBudget& budget) {
    std::vector<KeyNote> notes;
    if (!list) return notes;
    for (const Field& item : budget.take(*list)) {
        KeyNote note;
        note.table = item.member("t").string();
        if (std::optional<Field> hash = item.optional_member("kh")) {
            if (item.optional_member("k")) item.fail("names its key twice (\"k\" and \"kh\")");
            note.key_hash = hash->digest();
        } else {
            note.key = item.member("k").object_payload();
        }
        note.why = item.member("why").string();
        notes.push_back(std::move(note));
    }
    return notes;
}

KeyRange decode_key_range(const Field& lo, const Field& hi, const Field& where) {
    KeyRange range{lo.digest(), hi.upper_bound()};
    if (range.hi && !(range.lo < *range.hi)) where.fail("is an empty range (lo is not below hi)");
    return range;
}

RowsMessage decode_rows(const Field& message, RowBudget& budget) {
    RowsMessage rows;
    rows.header = decode_header(message);
    rows.reset = decode_scopes(message.optional_member("reset"));
    rows.drop = decode_scopes(message.optional_member("drop"));
    rows.drop_tables = decode_scopes(message.optional_member("drop_tables"));
    for (const Field& item : message.member("chunks").items()) {
        Chunk chunk;
        chunk.scope = item.member("scope").string();
        chunk.from = item.member("from").count();
        chunk.to = item.member("to").count();
        if (chunk.from > chunk.to) item.fail("has \"from\" after \"to\"");
        chunk.rows = decode_down_rows(item.member("rows"), budget);
        rows.chunks.push_back(std::move(chunk));
    }
    rows.withheld = decode_key_notes(message.optional_member("withheld"), budget);
    return rows;
}

FiledMessage decode_filed(const Field& message, RowBudget& budget) {
    FiledMessage filed;
    filed.header = decode_header(message);
    filed.upload = message.member("upload").uuid();
    filed.kept = decode_key_notes(message.member("kept"), budget);
    if (std::optional<Field> more = message.optional_member("more")) filed.more = more->boolean();
    return filed;
}

RangesMessage decode_ranges(const Field& message) {
    RangesMessage ranges;
    ranges.header = decode_header(message);
    ranges.scope = message.member("scope").string();
    for (const Field& item : message.member("ranges").items()) {
        std::vector<Field> bounds = item.tuple(2, "[lo, hi]");
        ranges.ranges.push_back(decode_key_range(bounds[0], bounds[1], item));
    }
    return ranges;
}

RepairMessage decode_repair(const Field& message, RowBudget& budget) {
    RepairMessage repair;
    repair.header = decode_header(message);
    repair.scope = message.member("scope").string();
    repair.range =
        decode_key_range(message.member("lo"), message.member("hi"), message.member("hi"));
    repair.rows = decode_down_rows(message.member("rows"), budget);
    return repair;
}

Holding decode_holding(const Field& field) {
    Holding holding;
    holding.through = field.member("through").count();
    holding.fingerprint.sum = field.member("fp").digest();
    holding.fingerprint.count = field.member("n").count();
    if (std::optional<Field> ranges = field.optional_member("ranges")) {
        for (const Field& item : ranges->items()) {
            std::vector<Field> parts = item.tuple(4, "[lo, hi, fp, n]");
            RangeFingerprint range;
            range.range = decode_key_range(parts[0], parts[1], item);
            range.fingerprint.sum = parts[2].digest();
            range.fingerprint.count = parts[3].count();
            holding.ranges.push_back(range);
        }
    }
    return holding;
}

}  // namespace

DownMessage decode_down(std::string_view text, const Limits& limits) {
    if (std::optional<std::string> plain = inflated(text, limits))
        return decode_down(*plain, limits);
    const std::string context = "down message";
    JsonNode root = parse_message(text, limits, context);
    Field envelope(root, "", context);
    check_version(envelope, context);
    const std::string kind = envelope.member("kind").string();
    Field message(root, "", kind);
    RowBudget budget(limits, kind);
    if (kind == "rows") return decode_rows(message, budget);
    if (kind == "filed") return decode_filed(message, budget);
    if (kind == "ranges") return decode_ranges(message);
    if (kind == "repair") return decode_repair(message, budget);
    throw DecodeError(context + ": unknown kind " + quoted_excerpt(kind));
}

std::string restamp(std::string_view message, const MessageHeader& header) {
    DownMessage decoded = decode_down(message);
    std::visit([&](auto& down) { down.header = header; }, decoded);
    return encode(decoded);
}

namespace {

// Where the header this encoder writes first ends, {"v":V,"kind":"K","replica":"U","gen":G,"seq":S
// up to S, when `message` starts with exactly that and names no origin after it; 0 otherwise.
size_t encoded_header_end(std::string_view message) {
    size_t at = 0;
    auto literal = [&](std::string_view text) {
        if (message.substr(at, text.size()) != text) return false;
        at += text.size();
        return true;
    };
    auto digits = [&] {
        const size_t start = at;
        while (at < message.size() && message[at] >= '0' && message[at] <= '9') ++at;
        return at > start;
    };
    auto plain_string = [&] {  // no escapes: a kind or a uuid
        if (at >= message.size() || message[at] != '"') return false;
        const size_t close = message.find('"', at + 1);
        if (close == std::string_view::npos ||
            message.substr(at + 1, close - at - 1).find('\\') != std::string_view::npos)
            return false;
        at = close + 1;
        return true;
    };
    if (!(literal(R"({"v":)") && digits() && literal(R"(,"kind":)") && plain_string() &&
          literal(R"(,"replica":)") && plain_string() && literal(R"(,"gen":)") && digits() &&
          literal(R"(,"seq":)") && digits()))
        return 0;
    if (at >= message.size() || (message[at] != ',' && message[at] != '}')) return 0;
    if (message.substr(at).rfind(R"(,"origin":)", 0) == 0) return 0;
    return at;
}

}  // namespace

// The sender stamps every message it sends: the origin goes in right after seq, where the encoder
// writes it, without reading the rest of the message (a full decode and encode doubled the
// sender's CPU); a message in another form is decoded and encoded again.
std::string with_origin(std::string_view message, const std::string& origin) {
    if (const size_t end = encoded_header_end(message); end != 0 && !origin.empty()) {
        std::string out(message.substr(0, end));
        out += R"(,"origin":)";
        append_json_string(out, origin);
        out += message.substr(end);
        return out;
    }
    DownMessage decoded = decode_down(message);
    std::visit([&](auto& down) { down.header.origin = origin; }, decoded);
    return encode(decoded);
}

Upload decode_upload(std::string_view text, const Limits& limits) {
    if (std::optional<std::string> plain = inflated(text, limits))
        return decode_upload(*plain, limits);
    const std::string context = "upload";
    JsonNode root = parse_message(text, limits, context);
    Field message(root, "", context);
    check_version(message, context);
    RowBudget budget(limits, context);
    Upload upload;
    upload.id = message.member("id").uuid();
    for (const Field& item : budget.take(message.member("rows"))) {
        upload.rows.push_back(UpRow{item.member("t").string(), item.member("r").object_payload()});
    }
    if (std::optional<Field> applied = message.optional_member("applied")) {
        upload.applied = applied->count();
    }
    if (std::optional<Field> origin = message.optional_member("origin")) {
        upload.origin = origin->string();
        if (upload.origin.size() > kOriginMaxBytes)
            throw DecodeError(context + ": origin is longer than " +
                              std::to_string(kOriginMaxBytes) + " bytes");
    }
    if (std::optional<Field> untaken = message.optional_member("untaken")) {
        for (const Field& item : budget.take(*untaken)) {
            upload.untaken.push_back(Untaken{item.member("seq").count(), item.member("t").string(),
                                             item.member("k").object_payload(),
                                             item.member("why").string()});
        }
    }
    if (std::optional<Field> holds = message.optional_member("holds")) {
        for (const auto& [scope, holding] : holds->members()) {
            upload.holds.emplace(scope, decode_holding(holding));
        }
    }
    return upload;
}

}  // namespace magic_sync::protocol
