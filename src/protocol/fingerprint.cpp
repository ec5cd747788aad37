#include "protocol/fingerprint.hpp"

namespace magic_sync::protocol {

Digest key_hash(std::string_view table, std::string_view canonical_key) {
    return sha256_concat({table, std::string_view("\0", 1), canonical_key});
}

Digest row_hash(std::string_view canonical_row) { return sha256(canonical_row); }

Digest element(const Digest& key_hash, const Digest& row_hash) {
    return sha256_concat({bytes_of(key_hash), bytes_of(row_hash)});
}

void add_mod(Digest& sum, const Digest& addend) {
    unsigned carry = 0;
    for (size_t i = sum.size(); i-- > 0;) {
        unsigned total = unsigned{sum[i]} + unsigned{addend[i]} + carry;
        sum[i] = static_cast<uint8_t>(total);
        carry = total >> 8;
    }
}

void sub_mod(Digest& sum, const Digest& subtrahend) {
    unsigned borrow = 0;
    for (size_t i = sum.size(); i-- > 0;) {
        unsigned taken = unsigned{subtrahend[i]} + borrow;
        borrow = unsigned{sum[i]} < taken ? 1 : 0;
        sum[i] = static_cast<uint8_t>(unsigned{sum[i]} + (borrow << 8) - taken);
    }
}

void Fingerprint::add(const Digest& element) {
    add_mod(sum, element);
    ++count;
}

void Fingerprint::remove(const Digest& element) {
    sub_mod(sum, element);
    --count;
}

bool Fingerprint::operator==(const Fingerprint& other) const {
    return sum == other.sum && count == other.count;
}

std::string Fingerprint::hex() const { return to_hex(sum); }

}  // namespace magic_sync::protocol
