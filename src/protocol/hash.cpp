#include "protocol/hash.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace magic_sync::protocol {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// The digest, fetched from its provider once: EVP_sha256() looks it up again at every use, which
// cost three times the hashing of a 100-byte row. One context per thread, reused.
const EVP_MD* sha256_method() {
    static const EVP_MD* method = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (method == nullptr) throw std::runtime_error("SHA-256: OpenSSL has no SHA256 digest");
    return method;
}

EVP_MD_CTX* reused_context() {
    thread_local std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                                 &EVP_MD_CTX_free);
    if (!context) throw std::runtime_error("SHA-256: OpenSSL could not allocate a digest");
    return context.get();
}

}  // namespace

Digest sha256(std::string_view bytes) { return sha256_concat({bytes}); }

Digest sha256_concat(std::initializer_list<std::string_view> parts) {
    EVP_MD_CTX* context = reused_context();
    if (EVP_DigestInit_ex2(context, sha256_method(), nullptr) != 1) {
        throw std::runtime_error("SHA-256: OpenSSL could not start a digest");
    }
    for (std::string_view part : parts) {
        if (EVP_DigestUpdate(context, part.data(), part.size()) != 1) {
            throw std::runtime_error("SHA-256: OpenSSL EVP_DigestUpdate failed");
        }
    }
    Digest digest;
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(context, digest.data(), &length) != 1 || length != digest.size()) {
        throw std::runtime_error("SHA-256: OpenSSL EVP_DigestFinal_ex failed");
    }
    return digest;
}

std::string to_hex(const Digest& digest) {
    std::string hex;
    hex.reserve(digest.size() * 2);
    for (uint8_t byte : digest) {
        hex += kHexDigits[byte >> 4];
        hex += kHexDigits[byte & 0x0f];
    }
    return hex;
}

Digest digest_from_bytes(std::string_view bytes) {
    Digest digest;
    if (bytes.size() != digest.size()) {
        throw std::invalid_argument("a digest is 32 bytes, not " + std::to_string(bytes.size()));
    }
    std::copy(bytes.begin(), bytes.end(), digest.begin());
    return digest;
}

Digest digest_from_hex(std::string_view hex) {
    Digest digest;
    if (hex.size() != digest.size() * 2) {
        throw std::invalid_argument("a digest is 64 lowercase hex digits, not " +
                                    std::to_string(hex.size()) + " characters");
    }
    for (size_t i = 0; i < digest.size(); ++i) {
        int high = hex_value(hex[2 * i]);
        int low = hex_value(hex[2 * i + 1]);
        if (high < 0 || low < 0) {
            size_t position = high < 0 ? 2 * i : 2 * i + 1;
            throw std::invalid_argument("a digest is 64 lowercase hex digits; character " +
                                        std::to_string(position) + " is not one");
        }
        digest[i] = static_cast<uint8_t>(high << 4 | low);
    }
    return digest;
}

}  // namespace magic_sync::protocol
