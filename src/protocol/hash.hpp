// SHA-256 (OpenSSL EVP) and the lowercase hex form digests take on the wire.
#pragma once

#include "protocol/pure.hpp"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace magic_sync::protocol {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::string_view bytes);

// SHA-256 of the parts written one after another, without building the concatenation.
Digest sha256_concat(std::initializer_list<std::string_view> parts);

// The digest's 32 bytes, to feed into another hash.
inline std::string_view bytes_of(const Digest& digest) {
    return {reinterpret_cast<const char*>(digest.data()), digest.size()};
}

// 64 lowercase hex digits.
std::string to_hex(const Digest& digest);

// The inverse of to_hex. Throws std::invalid_argument unless `hex` is exactly 64 lowercase hex
// digits (uppercase is refused so that every digest has one spelling on the wire).
Digest digest_from_hex(std::string_view hex);
// A digest from its 32 bytes (a bytea read from PostgreSQL); std::invalid_argument otherwise.
Digest digest_from_bytes(std::string_view bytes);

}  // namespace magic_sync::protocol
