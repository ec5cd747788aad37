// Gzip (RFC 1952) as messages travel compressed (docs/PROTOCOL.md §10): a message can be sent
// deflated, and a device tells it apart by its first bytes (a message's JSON begins with `{`, gzip
// with 0x1f 0x8b).
//
// A rows message is mostly its chunks, the same bytes for every replica it goes to. A chunk is
// deflated once into a piece that ends byte-aligned (a sync flush) and refers to nothing before
// it, so the pieces of a message (its envelope's text deflated per message, its chunks' deflated
// once) join into one deflate stream; gzip_join wraps them in one gzip member whose checksum is
// combined from the pieces' own. What comes out is ordinary gzip that any decoder reads.
#pragma once

#include "protocol/pure.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace magic_sync::protocol {

// Text deflated on its own (raw deflate, no header), ending byte-aligned and never final, with
// the CRC-32 and length of the text.
struct DeflatedPiece {
    std::string bytes;
    uint32_t crc = 0;
    size_t size = 0;
};

DeflatedPiece deflate_piece(std::string_view text);

// One gzip member holding the pieces' texts one after the other, in order.
std::string gzip_join(const std::vector<const DeflatedPiece*>& pieces);

// `text` as one gzip member.
std::string gzip(std::string_view text);

// Whether `bytes` begin as gzip does.
bool is_gzip(std::string_view bytes);

// The text of one gzip member that is the whole of `bytes`. Throws DecodeError for bytes that are
// not that, OverTheLimit for those whose text would pass `max_size` bytes (it stops inflating
// there).
std::string gunzip(std::string_view bytes, size_t max_size);

// The first `size` bytes (or fewer) of what `bytes` inflate to, as far as they inflate, unchecked:
// what a message cut short, too big or broken further on still says at its start. Nothing for
// bytes that are not gzip.
std::string gunzip_start(std::string_view bytes, size_t size);

}  // namespace magic_sync::protocol
