// Messages sent gzip (docs/PROTOCOL.md §10): pieces deflated apart and joined are one ordinary
// gzip member, read by gzip(1) as by gunzip; a rows message assembled gzip is assemble_rows' bytes
// once inflated, and decode_down reads it as it reads the JSON.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <variant>

#include "protocol/gzip.hpp"
#include "protocol/hash.hpp"
#include "protocol/messages.hpp"
#include "protocol/upload_fields.hpp"

namespace magic_sync::protocol {
namespace {

// What gzip(1), another decoder than ours, makes of `bytes`.
std::string system_gunzip(const std::string& bytes) {
    char path[] = "/tmp/magic_sync_gzip_XXXXXX";
    const int descriptor = mkstemp(path);
    EXPECT_GE(descriptor, 0);
    close(descriptor);
    std::ofstream(path, std::ios::binary) << bytes;
    FILE* pipe = popen((std::string("gzip -dc < ") + path + " 2>&1").c_str(), "r");
    std::string out;
    char buffer[65536];
    for (size_t got; (got = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, got);
    EXPECT_EQ(pclose(pipe), 0) << out;
    std::remove(path);
    return out;
}

std::string random_text(size_t size, unsigned seed) {
    std::mt19937 random(seed);
    std::string text;
    while (text.size() < size) text += "{\"id\":" + std::to_string(random() % 100000) + "},";
    text.resize(size);
    return text;
}

TEST(Gzip, PiecesDeflatedApartJoinIntoOneMemberAnyDecoderReads) {
    const std::vector<std::string> texts = {R"({"v":2,"kind":"rows","chunks":[)",
                                            random_text(300000, 1),
                                            ",",
                                            "",
                                            random_text(70000, 2),
                                            "]}"};
    std::vector<DeflatedPiece> deflated;
    for (const std::string& text : texts) deflated.push_back(deflate_piece(text));
    std::vector<const DeflatedPiece*> pieces;
    std::string whole;
    for (size_t i = 0; i < texts.size(); ++i) {
        pieces.push_back(&deflated[i]);
        whole += texts[i];
    }
    const std::string joined = gzip_join(pieces);
    EXPECT_TRUE(is_gzip(joined));
    EXPECT_LT(joined.size(), whole.size() / 2);
    EXPECT_EQ(system_gunzip(joined), whole);
    EXPECT_EQ(gunzip(joined, whole.size()), whole);
    EXPECT_EQ(system_gunzip(gzip("")), "");
    EXPECT_EQ(gunzip(gzip("tea"), 3), "tea");
}

TEST(Gzip, GunzipRefusesWhatIsNotOneWholeMemberWithinItsBound) {
    const std::string tea = gzip(std::string(1000, 't'));
    const auto refusal = [](const std::string& bytes, size_t bound) {
        try {
            gunzip(bytes, bound);
        } catch (const DecodeError& error) {
            return std::string(error.what());
        }
        return std::string("taken");
    };
    EXPECT_EQ(refusal(tea, 999), "gzip: inflates past 999 bytes");
    EXPECT_EQ(refusal(tea.substr(0, tea.size() - 3), 1000), "gzip: cut short");
    EXPECT_EQ(refusal(tea + "x", 1000), "gzip: bytes after the end of the member");
    EXPECT_EQ(refusal(tea + tea, 2000), "gzip: bytes after the end of the member");
    std::string bad_check = tea;
    bad_check[bad_check.size() - 6] ^= 1;  // the CRC-32
    EXPECT_EQ(refusal(bad_check, 1000), "gzip: incorrect data check");
    EXPECT_EQ(refusal("{}", 1000), "gzip: not gzip (it must begin with 0x1f 0x8b)");
    EXPECT_FALSE(is_gzip("{\"v\":1}"));
}

TEST(Gzip, ARowsMessageAssembledGzipIsTheSameMessageAndDecodesAsIt) {
    RowsMessage message;
    message.header = MessageHeader{"6f1c2a9e-1b2c-4d3e-8f40-5a6b7c8d9e0f", 3, 17, "o1"};
    message.reset = {"all"};
    std::vector<StoredChunk> stored(2);
    for (int c = 0; c < 2; ++c) {
        Chunk chunk{"all", c * 100 + 1, c * 100 + 100, {}};
        for (int r = 1; r <= 100; ++r) {
            const std::string row = R"({"id":)" + std::to_string(c * 100 + r) + R"(,"name":"tea"})";
            chunk.rows.push_back(DownRow{"shop.products",
                                         R"({"id":)" + std::to_string(c * 100 + r) + "}",
                                         RowBody{row, row_hash(row)}});
        }
        stored[c].body = encode(chunk);
        stored[c].deflated = deflate_piece(stored[c].body);
    }
    stored[1].withheld.push_back(KeyNote{"shop.sales", R"({"id":9})", "too big"});
    const std::vector<const StoredChunk*> chunks = {&stored[0], &stored[1]};

    const std::string plain = assemble_rows(message, chunks);
    const std::string sent = assemble_rows_gzip(message, chunks);
    EXPECT_EQ(system_gunzip(sent), plain);
    EXPECT_LT(sent.size(), plain.size() / 2);
    EXPECT_TRUE(decode_down(sent) == decode_down(plain));
    EXPECT_EQ(std::get<RowsMessage>(decode_down(sent)).chunks.size(), 2u);

    // A chunk's deflated piece is the same for every message: another replica's header only.
    RowsMessage other = message;
    other.header.replica = "0b6e8d2c-3f4a-4b5c-9d6e-7f8091a2b3c4";
    EXPECT_EQ(system_gunzip(assemble_rows_gzip(other, chunks)), assemble_rows(other, chunks));

    StoredChunk undeflated{stored[0].body, {}, {}};
    EXPECT_THROW(assemble_rows_gzip(message, {&undeflated}), std::invalid_argument);
}

TEST(Gzip, DecodeDownInflatesOnceOnly) {
    const std::string message =
        R"({"v":1,"kind":"ranges","replica":"6f1c2a9e-1b2c-4d3e-8f40-5a6b7c8d9e0f","gen":1,"seq":1,"scope":"all","ranges":[]})";
    EXPECT_TRUE(decode_down(gzip(message)) == decode_down(message));
    try {
        decode_down(gzip(gzip(message)));
        FAIL() << "decoded";
    } catch (const DecodeError& error) {
        EXPECT_STREQ(error.what(), "gzip: a message compressed twice");
    }
}

TEST(Gzip, DecodeDownBoundsWhatAMessageInflatesTo) {
    const std::string message =
        R"({"v":1,"kind":"ranges","replica":"6f1c2a9e-1b2c-4d3e-8f40-5a6b7c8d9e0f","gen":1,"seq":1,"ranges":[]})";
    Limits limits;
    limits.max_bytes = 20;
    try {
        decode_down(gzip(message), limits);
        FAIL() << "decoded";
    } catch (const DecodeError& error) {
        EXPECT_STREQ(error.what(), "gzip: inflates past 20 bytes");
    }
}

// An upload may come gzip too (docs/PROTOCOL.md §10): read as its JSON is, inflated once, within
// the bound on an upload; only an upload too big, as sent or once inflated, is OverTheLimit (it
// may file once the bound is raised).
TEST(Gzip, DecodeUploadReadsAnUploadSentGzipAsItReadsItsJson) {
    const std::string id = "0b6e8d2c-3f4a-4b5c-9d6e-7f8091a2b3c4";
    const std::string upload =
        R"({"v":1,"id":")" + id + R"(","rows":[{"t":"shop.sales","r":{"id":7,"note":"tea"}}]})";
    const Upload plain = decode_upload(upload);
    const Upload inflated = decode_upload(gzip(upload));
    EXPECT_EQ(encode(inflated), encode(plain));
    EXPECT_EQ(inflated.id, id);
    ASSERT_EQ(inflated.rows.size(), 1u);
    EXPECT_EQ(inflated.rows[0].table, "shop.sales");

    const auto refusal = [](const std::string& bytes, const Limits& limits) {
        try {
            decode_upload(bytes, limits);
        } catch (const OverTheLimit& error) {
            return "over the limit: " + std::string(error.what());
        } catch (const DecodeError& error) {
            return std::string(error.what());
        }
        return std::string("taken");
    };
    Limits small;
    small.max_bytes = 40;
    EXPECT_EQ(refusal(gzip(upload), small), "over the limit: gzip: inflates past 40 bytes");
    EXPECT_EQ(refusal(upload, small), "over the limit: upload: message is " +
                                          std::to_string(upload.size()) +
                                          " bytes, over the limit of 40");
    EXPECT_EQ(refusal(gzip(gzip(upload)), Limits{}), "gzip: a message compressed twice");
    const std::string sent = gzip(upload);
    EXPECT_EQ(refusal(sent.substr(0, sent.size() - 4), Limits{}), "gzip: cut short");
    EXPECT_EQ(refusal(gzip(R"({"v":1,"id":")" + id + R"(","rows":[)"), Limits{}),
              "upload: invalid JSON: parse error at line 1, column 60: syntax error while parsing "
              "value - unexpected end of input; expected '[', '{', or a literal");
}

// The id of an upload sent gzip that cannot be decoded is read from its start, inflated: the
// server answers it (kept) as it answers one sent as it is.
TEST(Gzip, AnUploadsIdIsRecoveredFromItsStartInflated) {
    const std::string id = "0b6e8d2c-3f4a-4b5c-9d6e-7f8091a2b3c4";
    const std::string cut = R"({"v":1,"id":")" + id + R"(","rows":[{"t":"shop.sales","r":{"id":)";
    EXPECT_EQ(recover_id(gzip(cut)), id);
    const std::string big = gzip(cut + std::string(100000, '7') + "}}]}");
    EXPECT_EQ(recover_id(big), id);
    EXPECT_EQ(recover_id(big.substr(0, big.size() / 2)), id) << big.size();  // cut short
    EXPECT_EQ(recover_id(gzip("[1,2]")), std::nullopt);
    EXPECT_EQ(gunzip_start(gzip("tea for two"), 3), "tea");
    EXPECT_EQ(gunzip_start("{\"v\":1}", 3), "");
}

}  // namespace
}  // namespace magic_sync::protocol
