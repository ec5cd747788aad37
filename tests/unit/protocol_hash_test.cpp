#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "protocol/hash.hpp"

namespace magic_sync::protocol {
namespace {

TEST(Sha256, KnownVectors) {
    EXPECT_EQ(to_hex(sha256("abc")),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(to_hex(sha256("")),
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, ConcatenationHashesThePartsWrittenTogether) {
    EXPECT_EQ(sha256_concat({"a", "", "bc"}), sha256("abc"));
    EXPECT_EQ(sha256_concat({}), sha256(""));
    EXPECT_EQ(sha256_concat({std::string_view("x\0y", 3)}), sha256(std::string("x\0y", 3)));
}

TEST(Sha256, BytesOfADigestAreItsRawBytes) {
    Digest digest = sha256("abc");
    std::string_view bytes = bytes_of(digest);
    ASSERT_EQ(bytes.size(), 32u);
    EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0xba);
    EXPECT_EQ(static_cast<uint8_t>(bytes[31]), 0xad);
}

TEST(Hex, RoundTrips) {
    Digest digest = sha256("abc");
    EXPECT_EQ(digest_from_hex(to_hex(digest)), digest);
    Digest zero{};
    EXPECT_EQ(to_hex(zero), std::string(64, '0'));
}

TEST(Digest, FromItsBytes) {
    Digest digest = sha256("abc");
    const std::string bytes(digest.begin(), digest.end());
    EXPECT_EQ(digest_from_bytes(bytes), digest);
    try {
        digest_from_bytes(bytes.substr(1));
        ADD_FAILURE() << "accepted 31 bytes";
    } catch (const std::invalid_argument& error) {
        EXPECT_STREQ(error.what(), "a digest is 32 bytes, not 31");
    }
}

void expect_refused(const std::string& hex, const std::string& message) {
    try {
        digest_from_hex(hex);
        ADD_FAILURE() << "accepted " << hex;
    } catch (const std::invalid_argument& error) {
        EXPECT_EQ(error.what(), message);
    }
}

TEST(Hex, RefusesBadLengthAndCharacters) {
    std::string valid = to_hex(sha256("abc"));
    expect_refused(valid.substr(1), "a digest is 64 lowercase hex digits, not 63 characters");
    expect_refused(valid + "0", "a digest is 64 lowercase hex digits, not 65 characters");
    expect_refused("", "a digest is 64 lowercase hex digits, not 0 characters");
    std::string upper = valid;
    upper[0] = 'B';
    expect_refused(upper, "a digest is 64 lowercase hex digits; character 0 is not one");
    std::string junk = valid;
    junk[63] = 'g';
    expect_refused(junk, "a digest is 64 lowercase hex digits; character 63 is not one");
}

}  // namespace
}  // namespace magic_sync::protocol
