// Row identities and scope fingerprints (docs/DESIGN.md §7).
//
// k = SHA-256(table ‖ 0x00 ‖ canonical key), v = SHA-256(canonical row), and a scope's fingerprint
// is (Σ SHA-256(k ‖ v) mod 2^256, count). The sum is order independent and can be kept
// incrementally: add an element when a row version appears, remove it when it goes.
#pragma once

#include "protocol/pure.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "protocol/hash.hpp"

namespace magic_sync::protocol {

// `table` is the qualified name exactly as it travels in "t" (e.g. "shop.products");
// `canonical_key` is canonical_json of the primary key object.
Digest key_hash(std::string_view table, std::string_view canonical_key);

// `canonical_row` is canonical_json of the row as it travels in "r".
Digest row_hash(std::string_view canonical_row);

// The fingerprint element of one row version: SHA-256(k ‖ v).
Digest element(const Digest& key_hash, const Digest& row_hash);

// Digests read as 256-bit unsigned big-endian integers; arithmetic wraps modulo 2^256.
void add_mod(Digest& sum, const Digest& addend);
void sub_mod(Digest& sum, const Digest& subtrahend);

struct Fingerprint {
    Digest sum{};
    int64_t count = 0;

    void add(const Digest& element);
    void remove(const Digest& element);
    bool operator==(const Fingerprint& other) const;
    bool operator!=(const Fingerprint& other) const { return !(*this == other); }
    std::string hex() const;  // of sum
};

}  // namespace magic_sync::protocol
