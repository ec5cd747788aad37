#include "rows_reference.hpp"

#include <string_view>

namespace magic_sync::sender {

int64_t big_endian_int64(const char* bytes) {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
    return static_cast<int64_t>(value);
}

int32_t big_endian_int32(const char* bytes) {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
    return static_cast<int32_t>(value);
}

namespace {

std::string_view cell(const PGresult* rows, int row, int column) {
    return std::string_view(PQgetvalue(rows, row, column),
                            static_cast<size_t>(PQgetlength(rows, row, column)));
}

// The elements of a one-dimensional array in binary form (PostgreSQL's array_send), each its
// bytes in binary form, none for NULL; std::nullopt when the bytes are not such an array.
std::optional<std::vector<std::optional<std::string>>> array_elements(std::string_view bytes) {
    std::vector<std::optional<std::string>> elements;
    size_t at = 0;
    const auto int32 = [&](int32_t& value) {
        if (bytes.size() - at < 4) return false;
        value = big_endian_int32(bytes.data() + at);
        at += 4;
        return true;
    };
    int32_t dimensions = 0, flags = 0, type = 0, count = 0, lower_bound = 0;
    if (!int32(dimensions) || !int32(flags) || !int32(type)) return std::nullopt;
    if (dimensions == 0) return elements;
    if (dimensions != 1 || !int32(count) || !int32(lower_bound) || count < 0) return std::nullopt;
    for (int32_t i = 0; i < count; ++i) {
        int32_t length = 0;
        if (!int32(length)) return std::nullopt;
        if (length < 0) {
            elements.emplace_back();
            continue;
        }
        if (bytes.size() - at < static_cast<size_t>(length)) return std::nullopt;
        elements.emplace_back(std::string(bytes.substr(at, static_cast<size_t>(length))));
        at += static_cast<size_t>(length);
    }
    return elements;
}

// A text[] column's elements, NULL read as empty.
std::optional<std::vector<std::string>> texts(const PGresult* rows, int row, int column) {
    const auto elements = array_elements(cell(rows, row, column));
    if (!elements) return std::nullopt;
    std::vector<std::string> texts;
    for (const auto& element : *elements) texts.push_back(element.value_or(""));
    return texts;
}

}  // namespace

std::optional<RowsReference> read_reference(const PGresult* rows, int row, int gen_column,
                                            const std::string& replica, int64_t seq,
                                            const std::string& origin) {
    RowsReference reference;
    if (PQgetlength(rows, row, gen_column) != 4) return std::nullopt;
    reference.envelope.header = {replica, big_endian_int32(PQgetvalue(rows, row, gen_column)), seq,
                                 origin};
    const auto reset = texts(rows, row, gen_column + 1);
    const auto drops = texts(rows, row, gen_column + 2);
    const auto table_drops = texts(rows, row, gen_column + 3);
    const auto ids = array_elements(cell(rows, row, gen_column + 4));
    if (!reset || !drops || !table_drops || !ids) return std::nullopt;
    reference.envelope.reset = *reset;
    reference.envelope.drop = *drops;
    reference.envelope.drop_tables = *table_drops;
    for (const auto& id : *ids) {
        if (!id || id->size() != 8) return std::nullopt;
        reference.chunks.push_back(big_endian_int64(id->data()));
    }
    return reference;
}

std::optional<Chunks> read_chunks(const PGresult* rows, bool gzip) {
    Chunks chunks;
    for (int row = 0; row < PQntuples(rows); ++row) {
        if (PQgetlength(rows, row, 0) != 8) return std::nullopt;
        auto chunk = std::make_shared<protocol::StoredChunk>();
        chunk->body = cell(rows, row, 1);
        if (gzip) chunk->deflated = protocol::deflate_piece(chunk->body);
        std::optional<std::vector<std::optional<std::string>>> notes[4];
        for (int column = 0; column < 4; ++column) {
            notes[column] = array_elements(cell(rows, row, 2 + column));
            if (!notes[column] || notes[column]->size() != notes[0]->size()) return std::nullopt;
        }
        const auto& [tables, keys, whys, key_hashes] = notes;
        for (size_t note = 0; note < tables->size(); ++note)
            chunk->withheld.push_back(
                protocol::stored_note((*tables)[note].value_or(""), (*keys)[note],
                                      (*whys)[note].value_or(""), (*key_hashes)[note]));
        chunks[big_endian_int64(PQgetvalue(rows, row, 0))] = std::move(chunk);
    }
    return chunks;
}

std::string missing_chunks(const Chunks& chunks) {
    std::string ids;
    for (const auto& [id, chunk] : chunks)
        if (chunk == nullptr) ids += (ids.empty() ? "{" : ",") + std::to_string(id);
    return ids.empty() ? ids : ids + "}";
}

std::optional<std::string> assemble(const RowsReference& reference, const Chunks& chunks,
                                    bool gzip) {
    std::vector<const protocol::StoredChunk*> found;
    for (int64_t id : reference.chunks) {
        const auto chunk = chunks.find(id);
        if (chunk == chunks.end() || chunk->second == nullptr) return std::nullopt;
        found.push_back(chunk->second.get());
    }
    return gzip ? protocol::assemble_rows_gzip(reference.envelope, found)
                : protocol::assemble_rows(reference.envelope, found);
}

}  // namespace magic_sync::sender
