#include "protocol/gzip.hpp"

#include <zlib.h>

#include <stdexcept>
#include <utility>

#include "protocol/limits.hpp"

namespace magic_sync::protocol {

namespace {

// One z_stream, ended whatever happens.
class Deflater {
  public:
    Deflater() {
        // Raw deflate (negative window bits): the pieces carry no header of their own.
        if (deflateInit2(&stream_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8,
                         Z_DEFAULT_STRATEGY) != Z_OK)
            throw std::runtime_error("deflateInit2 failed");
    }
    ~Deflater() { deflateEnd(&stream_); }
    Deflater(const Deflater&) = delete;
    Deflater& operator=(const Deflater&) = delete;

    // `text` deflated, ended by a sync flush: byte-aligned, not final.
    std::string flush(std::string_view text) {
        std::string out(deflateBound(&stream_, text.size()) + 16, '\0');
        stream_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
        stream_.avail_in = static_cast<uInt>(text.size());
        stream_.next_out = reinterpret_cast<Bytef*>(out.data());
        stream_.avail_out = static_cast<uInt>(out.size());
        const int status = deflate(&stream_, Z_SYNC_FLUSH);
        // Room left over means the flush is complete (deflateBound leaves room for it).
        if (status != Z_OK || stream_.avail_in != 0 || stream_.avail_out == 0)
            throw std::runtime_error("deflate failed");
        out.resize(out.size() - stream_.avail_out);
        return out;
    }

  private:
    z_stream stream_{};
};

void append_le32(std::string& out, uint32_t value) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

}  // namespace

DeflatedPiece deflate_piece(std::string_view text) {
    DeflatedPiece piece;
    piece.bytes = Deflater().flush(text);
    piece.crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
    piece.size = text.size();
    return piece;
}

std::string gzip_join(const std::vector<const DeflatedPiece*>& pieces) {
    // ID1 ID2, deflate, no flags, no time, no extra flags, operating system unknown.
    static const char kHeader[] = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, '\xff'};
    size_t bytes = sizeof kHeader + 2 + 8;
    for (const DeflatedPiece* piece : pieces) bytes += piece->bytes.size();
    std::string out;
    out.reserve(bytes);
    out.append(kHeader, sizeof kHeader);
    uLong crc = crc32(0, nullptr, 0);
    size_t size = 0;
    for (const DeflatedPiece* piece : pieces) {
        out += piece->bytes;
        crc = crc32_combine(crc, piece->crc, static_cast<z_off_t>(piece->size));
        size += piece->size;
    }
    // The final block: fixed Huffman codes, nothing but its end (every piece ended byte-aligned).
    out += '\x03';
    out += '\x00';
    append_le32(out, static_cast<uint32_t>(crc));
    append_le32(out, static_cast<uint32_t>(size));  // the length modulo 2^32, as RFC 1952 says
    return out;
}

std::string gzip(std::string_view text) {
    const DeflatedPiece piece = deflate_piece(text);
    return gzip_join({&piece});
}

bool is_gzip(std::string_view bytes) {
    return bytes.size() >= 2 && bytes[0] == '\x1f' && bytes[1] == '\x8b';
}

namespace {

// What inflating one gzip member from the start of `bytes` came to, stopped once more than
// `most` bytes would come out.
struct Inflated {
    std::string text;
    bool past_most = false;
    bool whole = false;        // the member's end reached, its CRC and length checked
    bool bytes_after = false;  // whole, and followed by more
    std::string why;           // zlib's word when it stopped on an error
};

// One z_stream reading a gzip member, ended whatever happens (a string that cannot grow throws).
class Inflater {
  public:
    Inflater() {
        // 16 + window bits: a gzip header and trailer, checked.
        if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK)
            throw std::runtime_error("inflateInit2");
    }
    ~Inflater() { inflateEnd(&stream_); }
    Inflater(const Inflater&) = delete;
    Inflater& operator=(const Inflater&) = delete;

    Inflated member(std::string_view bytes, size_t most) {
        Inflated result;
        stream_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
        stream_.avail_in = static_cast<uInt>(bytes.size());
        int status = Z_OK;
        char buffer[65536];
        while (status == Z_OK) {
            stream_.next_out = reinterpret_cast<Bytef*>(buffer);
            stream_.avail_out = sizeof buffer;
            status = inflate(&stream_, Z_NO_FLUSH);
            const size_t made = sizeof buffer - stream_.avail_out;
            if (result.text.size() + made > most) {
                result.text.append(buffer, most - result.text.size());
                result.past_most = true;
                break;
            }
            result.text.append(buffer, made);
        }
        result.whole = !result.past_most && status == Z_STREAM_END && stream_.avail_in == 0;
        result.bytes_after = status == Z_STREAM_END && stream_.avail_in != 0;
        if (stream_.msg != nullptr) result.why = stream_.msg;
        return result;
    }

  private:
    z_stream stream_{};
};

}  // namespace

std::string gunzip(std::string_view bytes, size_t max_size) {
    if (!is_gzip(bytes)) throw DecodeError("gzip: not gzip (it must begin with 0x1f 0x8b)");
    if (bytes.size() > UINT32_MAX) throw DecodeError("gzip: over 4 GiB");
    Inflated inflated = Inflater().member(bytes, max_size);
    if (inflated.past_most)
        throw OverTheLimit("gzip: inflates past " + std::to_string(max_size) + " bytes");
    if (inflated.bytes_after) throw DecodeError("gzip: bytes after the end of the member");
    if (!inflated.whole)
        throw DecodeError("gzip: " +
                          (inflated.why.empty() ? std::string("cut short") : inflated.why));
    return std::move(inflated.text);
}

std::string gunzip_start(std::string_view bytes, size_t size) {
    if (!is_gzip(bytes) || bytes.size() > UINT32_MAX) return "";
    return Inflater().member(bytes, size).text;
}

}  // namespace magic_sync::protocol
