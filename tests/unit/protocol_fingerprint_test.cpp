#include <gtest/gtest.h>

#include <string>

#include "protocol/fingerprint.hpp"

namespace magic_sync::protocol {
namespace {

Digest all_ones() {
    Digest digest;
    digest.fill(0xff);
    return digest;
}

Digest small(uint8_t low_byte) {
    Digest digest{};
    digest[31] = low_byte;
    return digest;
}

TEST(ModularArithmetic, AddWrapsAround) {
    Digest sum = all_ones();
    add_mod(sum, small(1));
    EXPECT_EQ(sum, Digest{});
}

TEST(ModularArithmetic, SubtractWrapsAround) {
    Digest difference{};
    sub_mod(difference, small(1));
    EXPECT_EQ(difference, all_ones());
}

TEST(ModularArithmetic, CarryAndBorrowCrossBytes) {
    Digest value = small(0xff);
    add_mod(value, small(1));
    Digest expected{};
    expected[30] = 0x01;
    EXPECT_EQ(value, expected);
    sub_mod(value, small(1));
    EXPECT_EQ(value, small(0xff));
}

TEST(ModularArithmetic, IsBigEndian) {
    Digest value{};
    value[0] = 0x80;
    add_mod(value, value);  // 2^255 + 2^255 = 2^256 = 0
    EXPECT_EQ(value, Digest{});
}

// The same values, computed independently (Python hashlib), so other implementations can check
// themselves against these.
TEST(RowHashes, KnownVectors) {
    Digest k = key_hash("shop.products", R"({"id":7})");
    Digest v = row_hash(R"({"id":7,"name":"tea"})");
    EXPECT_EQ(to_hex(k), "4a6535ac79f86625cbbcb53568e1c95baf45bc994bd9fe9f0baf442494c634db");
    EXPECT_EQ(to_hex(v), "e004ba5bf791939d8650ab3b9d28af5d8bf9cfc279bf5870d448ff35b445276c");
    EXPECT_EQ(to_hex(element(k, v)),
              "51c35b3f054b537c8fdc13264a346535f6404d9a6b5d7f8d5203d99e4a618dd7");

    Fingerprint fingerprint;
    fingerprint.add(element(k, v));
    fingerprint.add(
        element(key_hash("shop.products", R"({"id":8})"), row_hash(R"({"id":8,"name":"jam"})")));
    EXPECT_EQ(fingerprint.hex(),
              "3ed701e068b9384fd4c6e38afe17c74dd59139a2ba1ae9bdcb45daf9e99cc3ab");
    EXPECT_EQ(fingerprint.count, 2);
}

TEST(RowHashes, KeyHashSeparatesTableFromKey) {
    EXPECT_EQ(key_hash("shop.products", "{}"), sha256(std::string("shop.products") + '\0' + "{}"));
    EXPECT_NE(key_hash("ab", "c"), key_hash("a", "bc"));
}

TEST(Fingerprint, IsIndependentOfOrder) {
    Digest a = sha256("a"), b = sha256("b"), c = sha256("c");
    Fingerprint forward, backward;
    forward.add(a);
    forward.add(b);
    forward.add(c);
    backward.add(c);
    backward.add(a);
    backward.add(b);
    EXPECT_EQ(forward, backward);
    EXPECT_EQ(forward.count, 3);
}

TEST(Fingerprint, RemoveUndoesAdd) {
    Fingerprint fingerprint;
    fingerprint.add(sha256("a"));
    Fingerprint before = fingerprint;
    fingerprint.add(sha256("b"));
    EXPECT_NE(fingerprint, before);
    fingerprint.remove(sha256("b"));
    EXPECT_EQ(fingerprint, before);
    fingerprint.remove(sha256("a"));
    EXPECT_EQ(fingerprint, Fingerprint{});
    EXPECT_EQ(fingerprint.hex(), std::string(64, '0'));
}

TEST(Fingerprint, CountTakesPartInEquality) {
    Fingerprint one, other;
    one.add(Digest{});
    EXPECT_EQ(one.sum, other.sum);
    EXPECT_NE(one, other);
}

}  // namespace
}  // namespace magic_sync::protocol
