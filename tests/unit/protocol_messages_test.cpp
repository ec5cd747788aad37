#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <variant>

#include "protocol/canonical.hpp"
#include "protocol/hash.hpp"
#include "protocol/messages.hpp"

namespace magic_sync::protocol {
namespace {

const std::string kReplica = "6f1c2a9e-1b2c-4d3e-8f40-5a6b7c8d9e0f";
const std::string kUpload = "0b6e8d2c-3f4a-4b5c-9d6e-7f8091a2b3c4";
const std::string kZero(64, '0');
const std::string kHalf = "8" + std::string(63, '0');
const std::string kTeaHash = "e004ba5bf791939d8650ab3b9d28af5d8bf9cfc279bf5870d448ff35b445276c";

Digest half() { return digest_from_hex(kHalf); }

DownRow live_row(const std::string& table, const std::string& key, const std::string& row) {
    return DownRow{table, key, RowBody{row, row_hash(row)}};
}

DownRow gone_row(const std::string& table, const std::string& key) {
    return DownRow{table, key, std::nullopt};
}

MessageHeader header(int64_t seq) { return MessageHeader{kReplica, 3, seq, ""}; }

RowsMessage small_rows() {
    RowsMessage message;
    message.header = header(17);
    message.reset = {"all"};
    message.chunks.push_back(
        Chunk{"all",
              120,
              180,
              {live_row("shop.products", R"({"id":7})", R"({"id":7,"name":"tea"})"),
               gone_row("shop.products", R"({"id":9})")}});
    message.withheld.push_back(KeyNote{"shop.products", R"({"id":8})", "too big"});
    return message;
}

FiledMessage small_filed() {
    return FiledMessage{header(18),
                        kUpload,
                        {KeyNote{"shop.products", R"({"id":7})", "catalog rows are not taken up"}}};
}

RangesMessage small_ranges() {
    return RangesMessage{
        header(19), "store_id=42", {KeyRange{Digest{}, half()}, KeyRange{half(), std::nullopt}}};
}

RepairMessage small_repair() {
    return RepairMessage{header(20),
                         "all",
                         KeyRange{Digest{}, half()},
                         {live_row("shop.products", R"({"id":7})", R"({"id":7,"name":"tea"})")}};
}

Upload small_upload() {
    Upload upload;
    upload.id = kUpload;
    upload.rows.push_back(UpRow{"shop.sales", R"({"id":"s1","total":12.50})"});
    upload.applied = 17;
    upload.untaken.push_back(Untaken{17, "shop.products", R"({"id":7})", "no such column"});
    Holding holding;
    holding.through = 180;
    holding.fingerprint = Fingerprint{half(), 412};
    holding.ranges.push_back(
        RangeFingerprint{KeyRange{Digest{}, half()}, Fingerprint{half(), 200}});
    upload.holds.emplace("all", holding);
    return upload;
}

// Every field set, every optional list filled, strings that need escaping.
RowsMessage full_rows() {
    RowsMessage message = small_rows();
    message.drop = {"store_id=41", "id=" + kReplica};
    message.reset.push_back("*");
    message.chunks.push_back(
        Chunk{"store_id=42", 0, 9, {live_row("shop.\"odd\" näme", R"({"a":[1,2.50]})", "{}")}});
    message.chunks.push_back(Chunk{"empty", 9, 9, {}});
    return message;
}

Upload full_upload() {
    Upload upload = small_upload();
    upload.rows.push_back(UpRow{"shop.drawers", R"({"closed_at":null,"counted":"1e3"})"});
    Holding other;
    other.through = 0;
    upload.holds.emplace("store_id=42@eu", other);
    upload.holds["all"].ranges.push_back(
        RangeFingerprint{KeyRange{half(), std::nullopt}, Fingerprint{Digest{}, 0}});
    upload.origin = "7716042567404400454/2/418478cb-151d-4280-8589-17f30d0596ac";
    return upload;
}

template <typename Message>
void expect_round_trip(const Message& message) {
    std::string encoded = encode(message);
    DownMessage decoded = decode_down(encoded);
    ASSERT_TRUE(std::holds_alternative<Message>(decoded)) << encoded;
    EXPECT_EQ(std::get<Message>(decoded), message) << encoded;
    EXPECT_EQ(encode(decoded), encoded);
    EXPECT_EQ(encode(DownMessage{message}), encoded);
}

template <typename Decode>
std::string refusal(Decode decode, const std::string& text) {
    try {
        decode(text);
    } catch (const VersionTooNew& error) {
        return std::string("VersionTooNew: ") + error.what();
    } catch (const DecodeError& error) {
        return error.what();
    }
    return "accepted";
}

std::string down_refusal(const std::string& text, const Limits& limits = Limits{}) {
    return refusal([&](const std::string& t) { return decode_down(t, limits); }, text);
}

std::string upload_refusal(const std::string& text, const Limits& limits = Limits{}) {
    return refusal([&](const std::string& t) { return decode_upload(t, limits); }, text);
}

std::string rows_with_row(const std::string& row) {
    return R"({"v":1,"kind":"rows","replica":")" + kReplica +
           R"(","gen":3,"seq":17,"chunks":[{"scope":"all","from":0,"to":1,"rows":[)" + row + "]}]}";
}

std::string upload_with(const std::string& fields) {
    return R"({"v":1,"id":")" + kUpload + R"(","rows":[])" + fields + "}";
}

// The wire, pinned.

TEST(Wire, Rows) {
    EXPECT_EQ(encode(small_rows()),
              R"({"v":1,"kind":"rows","replica":")" + kReplica +
                  R"(","gen":3,"seq":17,"reset":["all"],"chunks":[{"scope":"all","from":120,)"
                  R"("to":180,"rows":[{"t":"shop.products","k":{"id":7},"r":{"id":7,"name":"tea"},)"
                  R"("h":")" +
                  kTeaHash +
                  R"("},{"t":"shop.products","k":{"id":9},"r":null}]}],)"
                  R"("withheld":[{"t":"shop.products","k":{"id":8},"why":"too big"}]})");
}

TEST(Wire, RowsWithNothingOptional) {
    RowsMessage message;
    message.header = header(1);
    EXPECT_EQ(encode(message), R"({"v":1,"kind":"rows","replica":")" + kReplica +
                                   R"(","gen":3,"seq":1,"chunks":[]})");
}

// A message that drops tables says version 2: a build of version 1 would not know the field, and
// keep the rows.
TEST(Wire, RowsDroppingTablesAreVersion2) {
    RowsMessage message;
    message.header = header(4);
    message.drop = {"store_id=42"};
    message.drop_tables = {"fleet.routes", "fleet.tasks"};
    const std::string encoded = encode(message);
    EXPECT_EQ(encoded, R"({"v":2,"kind":"rows","replica":")" + kReplica +
                           R"(","gen":3,"seq":4,"drop":["store_id=42"],)"
                           R"("drop_tables":["fleet.routes","fleet.tasks"],"chunks":[]})");
    EXPECT_EQ(std::get<RowsMessage>(decode_down(encoded)), message);
}

TEST(Wire, Filed) {
    EXPECT_EQ(encode(small_filed()), R"({"v":1,"kind":"filed","replica":")" + kReplica +
                                         R"(","gen":3,"seq":18,"upload":")" + kUpload +
                                         R"(","kept":[{"t":"shop.products","k":{"id":7},)"
                                         R"("why":"catalog rows are not taken up"}]})");
}

// A part of an answer too big for one message says "more"; the last part does not.
TEST(Wire, FiledInParts) {
    FiledMessage part = small_filed();
    part.more = true;
    EXPECT_EQ(encode(part), R"({"v":1,"kind":"filed","replica":")" + kReplica +
                                R"(","gen":3,"seq":18,"upload":")" + kUpload +
                                R"(","kept":[{"t":"shop.products","k":{"id":7},)"
                                R"("why":"catalog rows are not taken up"}],"more":true})");
    expect_round_trip(part);
    EXPECT_EQ(
        down_refusal(R"({"v":1,"kind":"filed","replica":")" + kReplica +
                     R"(","gen":3,"seq":18,"upload":")" + kUpload + R"(","kept":[],"more":"yes"})"),
        R"(filed: field "more" must be true or false)");
}

// The payload SQL keeps an answer as (sync.answer.payload) is the message's fields after its
// header; read back under a header, it is the message, checked as a filed message is.
TEST(Wire, FiledPayload) {
    FiledMessage part = small_filed();
    part.more = true;
    const std::string payload = encode_filed_payload(part);
    EXPECT_EQ(payload, R"({"upload":")" + kUpload +
                           R"(","kept":[{"t":"shop.products","k":{"id":7},)"
                           R"("why":"catalog rows are not taken up"}],"more":true})");
    EXPECT_EQ(decode_filed_payload(header(18), payload), part);
    EXPECT_EQ(encode_filed_payload(FiledMessage{header(2), kUpload, {}}),
              R"({"upload":")" + kUpload + R"(","kept":[]})");
    EXPECT_EQ(decode_filed_payload(header(2), R"({"upload":")" + kUpload + R"(","kept":[]})"),
              (FiledMessage{header(2), kUpload, {}}));
    auto refusal = [](const std::string& payload) {
        try {
            decode_filed_payload(header(2), payload);
        } catch (const DecodeError& e) {
            return std::string(e.what());
        }
        return std::string("decoded");
    };
    EXPECT_EQ(refusal(R"({"upload":"x","kept":[]})"),
              R"(filed: field "upload" must be a lowercase UUID (8-4-4-4-12 hex digits))");
    EXPECT_EQ(refusal("[]"), "filed payload: must be a JSON object");
    // A payload cannot say what its header says.
    EXPECT_EQ(refusal(R"({"kind":"ranges","upload":")" + kUpload + R"(","kept":[]})"),
              R"(down message: duplicate key "kind")");
}

// Every part of a split answer encodes within the limit under the widest header, the parts
// carry the kept rows in order, and only the last says nothing more comes.
TEST(SplitFiled, PartsFitAndKeepTheRowsInOrder) {
    FiledMessage answer{header(18), kUpload, {}};
    for (int i = 0; i < 40; ++i)
        answer.kept.push_back(KeyNote{"shop.sales", R"({"id":)" + std::to_string(i) + "}",
                                      "new row violates check constraint \"positive\""});
    const size_t limit = 1000;
    std::vector<FiledMessage> parts = split_filed(answer, limit);
    ASSERT_GT(parts.size(), 3u);
    std::vector<KeyNote> joined;
    for (size_t i = 0; i < parts.size(); ++i) {
        FiledMessage widest = parts[i];
        widest.header.gen = widest.header.seq = std::numeric_limits<int64_t>::max();
        EXPECT_LE(encode(widest).size(), limit) << "part " << i;
        EXPECT_EQ(parts[i].more, i + 1 < parts.size()) << "part " << i;
        EXPECT_EQ(parts[i].upload, kUpload);
        joined.insert(joined.end(), parts[i].kept.begin(), parts[i].kept.end());
    }
    EXPECT_EQ(joined, answer.kept);
}

TEST(SplitFiled, AnAnswerThatFitsIsOnePart) {
    EXPECT_EQ(split_filed(small_filed(), 256 * 1024), std::vector<FiledMessage>{small_filed()});
    const FiledMessage empty{header(2), kUpload, {}};
    EXPECT_EQ(split_filed(empty, 256 * 1024), std::vector<FiledMessage>{empty});
}

// A reason too long for any part is cut where a character starts, and says so.
TEST(SplitFiled, CutsAReasonTooLongForAnyPart) {
    std::string why;
    for (int i = 0; i < 3000; ++i) why += "\xc3\xa9";  // é
    FiledMessage answer{header(18), kUpload, {KeyNote{"shop.sales", R"({"id":1})", why}}};
    std::vector<FiledMessage> parts = split_filed(answer, 1000);
    ASSERT_EQ(parts.size(), 1u);
    const std::string& cut = parts[0].kept.at(0).why;
    EXPECT_EQ(cut.substr(cut.size() - 6), " [cut]");
    EXPECT_EQ(cut.substr(0, 4), "\xc3\xa9\xc3\xa9");
    EXPECT_EQ((cut.size() - 6) % 2, 0u) << "cut inside a character";
    FiledMessage widest = parts[0];
    widest.header.gen = widest.header.seq = std::numeric_limits<int64_t>::max();
    EXPECT_LE(encode(widest).size(), 1000u);
    EXPECT_GT(encode(widest).size(), 900u) << "cut more than it had to";
}

// A key too long to name within the limit, even with its reason cut, is named by its hash: the
// part fits, says version 2 (a build of version 1 would not know "kh"), and reads back.
TEST(SplitFiled, NamesAKeyTooLongForAnyPartByItsHash) {
    const std::string key = R"({"id":")" + std::string(3000, 'x') + R"("})";
    FiledMessage answer{header(18),
                        kUpload,
                        {KeyNote{"shop.sales", R"({"id":1})", "no such sale"},
                         KeyNote{"shop.sales", key, "index row size exceeds the maximum"}}};
    std::vector<FiledMessage> parts = split_filed(answer, 1000);
    std::vector<KeyNote> joined;
    for (const FiledMessage& part : parts) {
        FiledMessage widest = part;
        widest.header.gen = widest.header.seq = std::numeric_limits<int64_t>::max();
        EXPECT_LE(encode(widest).size(), 1000u);
        joined.insert(joined.end(), part.kept.begin(), part.kept.end());
    }
    ASSERT_EQ(joined.size(), 2u);
    EXPECT_EQ(joined[0], answer.kept[0]);
    EXPECT_EQ(joined[1].key, "");
    EXPECT_EQ(joined[1].key_hash, key_hash("shop.sales", key));
    EXPECT_EQ(joined[1].why, "index row size exceeds the maximum");

    const FiledMessage& last = parts.back();
    const std::string text = encode(last);
    EXPECT_EQ(text.substr(0, 6), R"({"v":2)");
    EXPECT_NE(text.find(R"("kh":")" + to_hex(key_hash("shop.sales", key)) + R"(")"),
              std::string::npos);
    EXPECT_EQ(std::get<FiledMessage>(decode_down(text)), last);
    EXPECT_EQ(encode(parts.front()).substr(0, 6), parts.size() > 1 ? R"({"v":1)" : R"({"v":2)");
}

// A withheld row's note names its key while that note fits a message beside the widest envelope
// and the scope's chunk frame, and its key's hash past that; a rows message with such a note is
// version 2 and reads back.
TEST(Sizes, AWithheldNoteNamesAKeyTooLongByItsHash) {
    const std::string short_key = R"({"id":1})";
    const std::string long_key = R"({"code":")" + std::string(700, 'k') + R"("})";
    const KeyNote keyed = withheld_note("all", "shop.notices", short_key, "too big", 600);
    EXPECT_EQ(keyed, (KeyNote{"shop.notices", short_key, "too big"}));
    const KeyNote hashed = withheld_note("all", "shop.notices", long_key, "too big", 600);
    EXPECT_EQ(hashed.key, "");
    EXPECT_EQ(hashed.key_hash, key_hash("shop.notices", long_key));
    EXPECT_EQ(withheld_note("all", "shop.notices", long_key, "too big", 2000).key, long_key);
    RowsMessage rows;
    rows.header = header(4);
    rows.withheld = {keyed, hashed};
    const std::string text = encode(rows);
    EXPECT_EQ(text.substr(0, 6), R"({"v":2)");
    EXPECT_EQ(std::get<RowsMessage>(decode_down(text)), rows);
    EXPECT_EQ(
        withheld_note_size(hashed), encode(rows).size() - [&] {
            RowsMessage one = rows;
            one.withheld.pop_back();
            return encode(one).size();
        }());
}

// A note names its key once: by "k" or by "kh".
TEST(Wire, AKeptNoteWithBothKeysIsRefused) {
    EXPECT_EQ(down_refusal(R"({"v":2,"kind":"filed","replica":")" + kReplica +
                           R"(","gen":3,"seq":18,"upload":")" + kUpload +
                           R"(","kept":[{"t":"shop.sales","k":{"id":1},"kh":")" +
                           std::string(64, '0') + R"(","why":"x"}]})"),
              R"(filed: field "kept"[0] names its key twice ("k" and "kh"))");
}

TEST(Wire, Ranges) {
    EXPECT_EQ(encode(small_ranges()),
              R"({"v":1,"kind":"ranges","replica":")" + kReplica +
                  R"(","gen":3,"seq":19,"scope":"store_id=42","ranges":[[")" + kZero + R"(",")" +
                  kHalf + R"("],[")" + kHalf + R"(",""]]})");
}

TEST(Wire, Repair) {
    EXPECT_EQ(encode(small_repair()),
              R"({"v":1,"kind":"repair","replica":")" + kReplica +
                  R"(","gen":3,"seq":20,"scope":"all","lo":")" + kZero + R"(","hi":")" + kHalf +
                  R"(","rows":[{"t":"shop.products","k":{"id":7},"r":{"id":7,"name":"tea"},"h":")" +
                  kTeaHash + R"("}]})");
}

TEST(Wire, Upload) {
    EXPECT_EQ(
        encode(small_upload()),
        R"({"v":1,"id":")" + kUpload +
            R"(","rows":[{"t":"shop.sales","r":{"id":"s1","total":12.50}}],"applied":17,)"
            R"("untaken":[{"seq":17,"t":"shop.products","k":{"id":7},"why":"no such column"}],)"
            R"("holds":{"all":{"through":180,"fp":")" +
            kHalf + R"(","n":412,"ranges":[[")" + kZero + R"(",")" + kHalf + R"(",")" + kHalf +
            R"(",200]]}}})");
}

TEST(Wire, UploadWithNothingOptional) {
    Upload upload;
    upload.id = kUpload;
    EXPECT_EQ(encode(upload), R"({"v":1,"id":")" + kUpload + R"(","rows":[]})");
}

// Round trips.

TEST(RoundTrip, EveryDownKind) {
    expect_round_trip(small_rows());
    expect_round_trip(full_rows());
    expect_round_trip(small_filed());
    expect_round_trip(FiledMessage{header(2), kUpload, {}});
    expect_round_trip(small_ranges());
    expect_round_trip(RangesMessage{header(2), "all", {}});
    expect_round_trip(small_repair());
    expect_round_trip(RepairMessage{header(2), "all", KeyRange{half(), std::nullopt}, {}});
}

TEST(RoundTrip, Upload) {
    for (const Upload& upload :
         {small_upload(), full_upload(), Upload{kUpload, {}, {}, {}, {}, {}}}) {
        std::string encoded = encode(upload);
        EXPECT_EQ(decode_upload(encoded), upload) << encoded;
        EXPECT_EQ(encode(decode_upload(encoded)), encoded);
    }
}

TEST(RoundTrip, NumbersInPayloadsKeepTheirLexemes) {
    Upload upload;
    upload.id = kUpload;
    upload.rows.push_back(
        UpRow{"shop.sales", R"({"big":123456789012345678901234567890.123,"total":12.50})"});
    EXPECT_EQ(decode_upload(encode(upload)), upload);
}

TEST(Decode, AcceptsAnyFieldOrderAndWhitespaceAndIgnoresUnknownFields) {
    std::string text = R"( { "seq" : 17, "future" : {"k": [1, {"b":2}]}, "kind" : "rows", "v" : 1,
        "gen" : 3, "replica" : ")" +
                       kReplica +
                       R"(", "reset" : ["all"],
        "withheld" : [ {"why":"too big", "k":{"id":8}, "t":"shop.products", "extra":1} ],
        "chunks" : [ { "rows" : [ { "h":")" +
                       kTeaHash +
                       R"(", "r" : { "name" : "tea", "id" : 7 },
                                   "k" : { "id" : 7 }, "t" : "shop.products", "new" : [] },
                                 { "r" : null, "k" : {"id":9}, "t" : "shop.products" } ],
                       "to" : 180, "from" : 120, "scope" : "all" } ] } )";
    DownMessage decoded = decode_down(text);
    ASSERT_TRUE(std::holds_alternative<RowsMessage>(decoded));
    EXPECT_EQ(std::get<RowsMessage>(decoded), small_rows());
}

TEST(Decode, AnUploadsOriginIsNoLongerThanAnyServerWrites) {
    const std::string too_long(kOriginMaxBytes + 1, '7');
    try {
        decode_upload(R"({"v":1,"id":")" + kUpload + R"(","rows":[],"origin":")" + too_long +
                      R"("})");
        FAIL() << "an origin of " << too_long.size() << " bytes was taken";
    } catch (const DecodeError& e) {
        EXPECT_STREQ(e.what(), "upload: origin is longer than 68 bytes");
    }
}

TEST(Decode, CanonicalizesPayloads) {
    Upload upload = decode_upload(R"({"v":1,"id":")" + kUpload +
                                  R"(","rows":[{"t":"x","r":{ "b" : "\u00e9", "a" : 1.0 }}]})");
    ASSERT_EQ(upload.rows.size(), 1u);
    EXPECT_EQ(upload.rows[0].row, "{\"a\":1.0,\"b\":\"\xc3\xa9\"}");
}

TEST(Decode, KeepsHashesAsSent) {
    // The replica stores v as given; the decoder does not recompute it.
    std::string other = std::string(63, 'a') + "b";
    RowsMessage message = std::get<RowsMessage>(decode_down(
        rows_with_row(R"({"t":"x","k":{"id":1},"r":{"id":1},"h":")" + other + R"("})")));
    EXPECT_EQ(to_hex(message.chunks[0].rows[0].body->hash), other);
}

// Refusals, with their exact messages.

TEST(Refuse, VersionTooNewBeforeAnythingElse) {
    try {
        decode_down(R"({"v":3,"kind":"gossip","whatever":[]})");
        FAIL() << "accepted";
    } catch (const VersionTooNew& error) {
        EXPECT_EQ(error.version(), 3);
        EXPECT_STREQ(error.what(),
                     "down message: message speaks protocol version 3; this build speaks up to "
                     "version 2");
    }
    EXPECT_EQ(upload_refusal(R"({"v":7})"),
              "VersionTooNew: upload: message speaks protocol version 7; this build speaks up to "
              "version 2");
}

TEST(Refuse, BadVersionIsAPlainDecodeError) {
    EXPECT_EQ(down_refusal(R"({"kind":"rows"})"), R"(down message: missing field "v")");
    EXPECT_EQ(upload_refusal(R"({"v":"1"})"), R"(upload: field "v" must be an integer)");
    EXPECT_EQ(upload_refusal(R"({"v":1.0})"), R"(upload: field "v" must be an integer)");
    EXPECT_EQ(upload_refusal(R"({"v":99999999999999999999})"),
              R"(upload: field "v" must be an integer)");
    EXPECT_EQ(upload_refusal(R"({"v":0})"), R"(upload: field "v" must be at least 1)");
    EXPECT_EQ(upload_refusal(R"({"v":-1})"), R"(upload: field "v" must be at least 1)");
}

TEST(Refuse, MissingFields) {
    EXPECT_EQ(upload_refusal(R"({"v":1,"rows":[]})"), R"(upload: missing field "id")");
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload + R"("})"),
              R"(upload: missing field "rows")");
    EXPECT_EQ(down_refusal(R"({"v":1})"), R"(down message: missing field "kind")");
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":"filed","replica":")" + kReplica +
                           R"(","gen":3,"seq":1,"upload":")" + kUpload + R"("})"),
              R"(filed: missing field "kept")");
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":"rows","replica":")" + kReplica +
                           R"(","gen":3,"seq":1,"chunks":[{"from":1,"to":2,"rows":[]}]})"),
              R"(rows: missing field "chunks"[0]."scope")");
    EXPECT_EQ(down_refusal(rows_with_row(R"({"t":"x","k":{"id":1},"r":{"id":1}})")),
              R"(rows: missing field "chunks"[0]."rows"[0]."h")");
    EXPECT_EQ(down_refusal(rows_with_row(R"({"t":"x","k":{"id":1}})")),
              R"(rows: missing field "chunks"[0]."rows"[0]."r")");
    EXPECT_EQ(upload_refusal(upload_with(R"(,"holds":{"all":{"through":1,"n":0}})")),
              R"(upload: missing field "holds"."all"."fp")");
}

TEST(Refuse, WrongTypes) {
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload +
                             R"(","rows":[{"t":"a","r":{}},{"t":"b","r":{}},{"t":"c","r":{}},)"
                             R"({"t":5,"r":{}}]})"),
              R"(upload: field "rows"[3]."t" must be a string)");
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload + R"(","rows":{}})"),
              R"(upload: field "rows" must be an array)");
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload + R"(","rows":[{"t":"x","r":null}]})"),
              R"(upload: field "rows"[0]."r" must be an object)");
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload + R"(","rows":[7]})"),
              R"(upload: field "rows"[0] must be an object)");
    EXPECT_EQ(upload_refusal(upload_with(R"(,"applied":-1)")),
              R"(upload: field "applied" must be a non-negative integer)");
    EXPECT_EQ(upload_refusal(upload_with(R"(,"applied":1.5)")),
              R"(upload: field "applied" must be a non-negative integer)");
    EXPECT_EQ(upload_refusal(upload_with(R"(,"holds":{"all":[]})")),
              R"(upload: field "holds"."all" must be an object)");
    EXPECT_EQ(upload_refusal(upload_with(R"(,"holds":{"all":{"through":1,"fp":"AB","n":0}})")),
              R"(upload: field "holds"."all"."fp" must be 64 lowercase hex digits)");
    EXPECT_EQ(upload_refusal(upload_with(R"(,"holds":{"all":{"through":1,"fp":")" + kZero +
                                         R"(","n":0,"ranges":[["a","b"]]}})")),
              R"(upload: field "holds"."all"."ranges"[0] must be an array [lo, hi, fp, n])");
    EXPECT_EQ(
        upload_refusal(R"({"v":1,"id":")" + std::string("6F1C2A9E-1B2C-4D3E-8F40-5A6B7C8D9E0F") +
                       R"(","rows":[]})"),
        R"(upload: field "id" must be a lowercase UUID (8-4-4-4-12 hex digits))");
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":7})"),
              R"(down message: field "kind" must be a string)");
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":"rows","replica":")" + kReplica +
                           R"(","gen":-3,"seq":1,"chunks":[]})"),
              R"(rows: field "gen" must be a non-negative integer)");
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":"rows","replica":7,"gen":3,"seq":1,"chunks":[]})"),
              R"(rows: field "replica" must be a string)");
    EXPECT_EQ(down_refusal(rows_with_row(R"({"t":"x","k":7,"r":null})")),
              R"(rows: field "chunks"[0]."rows"[0]."k" must be an object)");
    EXPECT_EQ(down_refusal(rows_with_row(R"({"t":"x","k":{},"r":[1]})")),
              R"(rows: field "chunks"[0]."rows"[0]."r" must be an object or null)");
}

TEST(Refuse, BadRangesAndChunks) {
    std::string ranges_prefix =
        R"({"v":1,"kind":"ranges","replica":")" + kReplica + R"(","gen":3,"seq":1,"scope":"all",)";
    EXPECT_EQ(down_refusal(ranges_prefix + R"("ranges":[[")" + kHalf + R"("]]})"),
              R"(ranges: field "ranges"[0] must be an array [lo, hi])");
    EXPECT_EQ(
        down_refusal(ranges_prefix + R"("ranges":[[")" + kHalf + R"(",")" + kZero + R"("]]})"),
        R"(ranges: field "ranges"[0] is an empty range (lo is not below hi))");
    EXPECT_EQ(down_refusal(ranges_prefix + R"("ranges":[["",""]]})"),
              R"(ranges: field "ranges"[0][0] must be 64 lowercase hex digits)");
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":"repair","replica":")" + kReplica +
                           R"(","gen":3,"seq":1,"scope":"all","lo":")" + kHalf + R"(","hi":")" +
                           kHalf + R"(","rows":[]})"),
              R"(repair: field "hi" is an empty range (lo is not below hi))");
    EXPECT_EQ(
        down_refusal(R"({"v":1,"kind":"rows","replica":")" + kReplica +
                     R"(","gen":3,"seq":1,"chunks":[{"scope":"all","from":5,"to":4,"rows":[]}]})"),
        R"(rows: field "chunks"[0] has "from" after "to")");
}

TEST(Refuse, UnknownKindAndNonObjects) {
    EXPECT_EQ(down_refusal(R"({"v":1,"kind":"gossip"})"), R"(down message: unknown kind "gossip")");
    EXPECT_EQ(down_refusal("[1]"), "down message: message must be a JSON object");
    EXPECT_EQ(upload_refusal("\"hello\""), "upload: message must be a JSON object");
    EXPECT_EQ(upload_refusal(R"({"v":1,"v":1})"), R"(upload: duplicate key "v")");
    EXPECT_EQ(upload_refusal("{\"v\":1,"),
              "upload: invalid JSON: parse error at line 1, column 8: syntax error while parsing "
              "object key - unexpected end of input; expected string literal");
}

TEST(Refuse, DeepNestingWithoutRecursing) {
    EXPECT_EQ(upload_refusal(std::string(100000, '[')), "upload: nesting deeper than 64 levels");
    EXPECT_EQ(down_refusal(std::string(100000, '[')),
              "down message: nesting deeper than 64 levels");
    std::string deep_row = std::string(100000, '[') + std::string(100000, ']');
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload + R"(","rows":[{"t":"x","r":{"a":)" +
                             deep_row + "}}]}"),
              "upload: nesting deeper than 64 levels");
}

TEST(Refuse, RowsNestedUpToTheAdvertisedDepthTravel) {
    Limits limits;
    int row_depth = limits.max_depth - kRowDepthInMessage;
    auto row_nesting = [](int depth) {  // an object holding arrays, `depth` levels in all
        return "{\"a\":" + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
    };
    RowsMessage message;
    message.header = header(1);
    message.chunks.push_back(Chunk{"all", 0, 1, {live_row("x", "{}", row_nesting(row_depth))}});
    EXPECT_EQ(std::get<RowsMessage>(decode_down(encode(message), limits)), message);
    message.chunks[0].rows[0] = live_row("x", "{}", row_nesting(row_depth + 1));
    EXPECT_EQ(down_refusal(encode(message), limits), "down message: nesting deeper than 64 levels");
}

TEST(Refuse, OversizeBeforeParsing) {
    std::string huge(17'000'000, '[');
    EXPECT_EQ(upload_refusal(huge),
              "upload: message is 17000000 bytes, over the limit of 16777216");
    EXPECT_EQ(down_refusal(huge),
              "down message: message is 17000000 bytes, over the limit of 16777216");
}

TEST(Refuse, NothingForANumberPastDoublesRangeInAnUploadedRow) {
    Upload upload;
    upload.id = kUpload;
    upload.rows = {UpRow{"x", R"({"n":1e400,"m":-12345678901234567890.5e-400})"}};
    Upload decoded = decode_upload(encode(upload));
    ASSERT_EQ(decoded.rows.size(), 1u);
    EXPECT_EQ(decoded.rows[0].row, R"({"m":-12345678901234567890.5e-400,"n":1e400})");
}

TEST(Refuse, TooManyRows) {
    Limits limits;
    limits.max_rows = 2;
    Upload upload;
    upload.id = kUpload;
    upload.rows = {UpRow{"x", "{}"}, UpRow{"x", "{}"}};
    EXPECT_EQ(decode_upload(encode(upload), limits), upload);
    upload.untaken.push_back(Untaken{1, "x", "{}", "why"});
    EXPECT_EQ(upload_refusal(encode(upload), limits), "upload: message has more than 2 rows");

    RowsMessage rows;
    rows.header = header(1);
    rows.chunks = {Chunk{"a", 0, 1, {gone_row("x", "{}")}},
                   Chunk{"b", 0, 1, {gone_row("x", "{}")}}};
    EXPECT_EQ(std::get<RowsMessage>(decode_down(encode(rows), limits)), rows);
    rows.withheld.push_back(KeyNote{"x", "{}", "too big"});
    EXPECT_EQ(down_refusal(encode(rows), limits), "rows: message has more than 2 rows");
}

TEST(Refuse, LongStrings) {
    Limits limits;
    limits.max_string = 8;
    EXPECT_EQ(upload_refusal(R"({"v":1,"id":")" + kUpload + R"("})", limits),
              "upload: string of 36 bytes, over the limit of 8");
}

// Byte accounting.

TEST(Sizes, EncodedRowSizeIsWhatARowAddsToAChunk) {
    std::vector<DownRow> rows = {
        live_row("shop.products", R"({"id":7})", R"({"id":7,"name":"tea"})"),
        gone_row("shop.products", R"({"id":9})"),
        live_row("shop.\"odd\"\n näme", R"({"id":"\u0001"})", R"({"id":"\u0001","x":[1.50]})"),
    };
    Chunk chunk{"store_id=42", 120, 180, {}};
    size_t expected = chunk_overhead(chunk.scope, chunk.from, chunk.to);
    EXPECT_EQ(expected, encode(chunk).size());
    for (const DownRow& row : rows) {
        std::optional<std::string_view> json;
        if (row.body) json = row.body->json;
        size_t row_size = encoded_row_size(row.table, row.key, json);
        expected += row_size + (chunk.rows.empty() ? 0 : 1);
        chunk.rows.push_back(row);
        EXPECT_EQ(encode(chunk).size(), expected);

        RepairMessage repair{header(1), "all", KeyRange{}, {}};
        size_t empty_repair = encode(repair).size();
        repair.rows.push_back(row);
        EXPECT_EQ(encode(repair).size(), empty_repair + row_size);
    }
}

TEST(Sizes, ChunksAddTheirSizeAndACommaToAMessage) {
    RowsMessage message = full_rows();
    RowsMessage envelope = message;
    envelope.chunks.clear();
    size_t expected = encode(envelope).size();
    for (size_t i = 0; i < message.chunks.size(); ++i) {
        expected += encode(message.chunks[i]).size() + (i > 0 ? 1 : 0);
    }
    EXPECT_EQ(encode(message).size(), expected);
}

TEST(Sizes, RowsEnvelopeOverheadBoundsEveryBareEnvelope) {
    // 134 bytes, and the longest origin with its member name (80).
    EXPECT_EQ(rows_envelope_overhead(), 214u);
    RowsMessage widest;
    widest.header = widest_header(kReplica);
    EXPECT_EQ(encode(widest).size(), rows_envelope_overhead());
    RowsMessage typical;
    typical.header = header(17);
    EXPECT_LT(encode(typical).size(), rows_envelope_overhead());
}

// The bound of an envelope with its lists makes room for the withheld frame: with withheld rows
// the message is that bound and each note with its comma, but for the first note's comma.
TEST(Sizes, RowsEnvelopeSizeBoundsEnvelopesWithTheirListsAndWithheldRows) {
    const std::vector<std::string> reset = {"*"};
    const std::vector<std::string> drop = {"store_id=42", "all@north"};
    const std::vector<std::string> tables = {"fleet.routes"};
    RowsMessage widest;
    widest.header = widest_header(kReplica);
    widest.reset = reset;
    widest.drop = drop;
    widest.drop_tables = tables;
    const size_t bound = rows_envelope_size(reset, drop, tables);
    EXPECT_LT(encode(widest).size(), bound);
    RowsMessage one = widest;
    one.withheld.push_back(KeyNote{"shop.products", R"({"id":8})", "too big"});
    RowsMessage two = one;
    two.withheld.push_back(one.withheld.front());
    const size_t note_with_comma = encode(two).size() - encode(one).size();
    EXPECT_EQ(encode(one).size(), bound + note_with_comma - 1);
    EXPECT_EQ(encode(two).size(), bound + 2 * note_with_comma - 1);
}

// Drops that do not fit one message go in order, as many as fit, scope drops before table drops;
// a name longer than the limit still goes, alone.
TEST(Sizes, DropsFittingTakesTheLongestPrefixWithinTheLimit) {
    const std::vector<std::string> reset = {"*"};
    const std::vector<std::string> drop = {"store_id=1", "store_id=2", "store_id=3"};
    const std::vector<std::string> tables = {"fleet.routes", "fleet.tasks"};
    EXPECT_EQ(drops_fitting(reset, drop, tables, rows_envelope_size(reset, drop, tables)), 5u);
    EXPECT_EQ(drops_fitting(reset, drop, tables, rows_envelope_size(reset, drop, tables) - 1), 4u);
    EXPECT_EQ(drops_fitting(reset, drop, tables, rows_envelope_size(reset, drop, {})), 3u);
    EXPECT_EQ(drops_fitting(reset, drop, tables, rows_envelope_size(reset, {"store_id=1"}, {})),
              1u);
    EXPECT_EQ(drops_fitting(reset, {}, tables, rows_envelope_size(reset, {}, {"fleet.routes"})),
              1u);
    EXPECT_EQ(drops_fitting(reset, drop, tables, 1), 1u);
    EXPECT_EQ(drops_fitting(reset, {}, {}, 1), 0u);
}

// A row travels when it fits, with its comma, the largest chunk of its scope in a message that
// resets everything and the largest repair of its scope: the rule depends on the row and the
// scope alone.
TEST(Sizes, RowTravelsByTheRowAndItsScopeAlone) {
    const std::string scope = "store_id=42";
    const std::string table = "shop.products";
    const std::string key = R"({"id":7})";
    constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
    const size_t around =
        std::max(rows_envelope_size({"*"}, {}, {}) + chunk_overhead(scope, kLargest, kLargest),
                 encode(RepairMessage{widest_header(),
                                      scope,
                                      KeyRange{digest_from_hex(std::string(64, 'f')),
                                               digest_from_hex(std::string(64, 'f'))},
                                      {}})
                     .size()) +
        1;
    const size_t limit = 4096;
    std::string fits = R"({"id":7,"x":")";
    while (encoded_row_size(table, key, fits + R"("})") + 1 < limit - around) fits += 'a';
    fits += R"("})";
    EXPECT_EQ(encoded_row_size(table, key, fits) + 1, limit - around);
    EXPECT_TRUE(row_travels(scope, table, key, fits, limit));
    EXPECT_EQ(row_room(scope, limit), encoded_row_size(table, key, fits));  // what a reason names
    EXPECT_EQ(row_room(scope, around), 0u);
    const std::string one_more = fits.substr(0, fits.size() - 2) + R"(a"})";
    EXPECT_FALSE(row_travels(scope, table, key, one_more, limit));
    // A longer scope name leaves less room.
    EXPECT_FALSE(row_travels(scope + "0", table, key, fits, limit));
    // A limit below the frame around a row lets nothing travel.
    EXPECT_FALSE(row_travels(scope, table, key, "{}", around));
    EXPECT_EQ(why_withheld(key, one_more), "too big");
    EXPECT_EQ(withheld_reason(scope, table, key, one_more, limit),
              "too big: " + std::to_string(encoded_row_size(table, key, one_more)) +
                  " bytes encoded, over the " + std::to_string(row_room(scope, limit)) +
                  " bytes a message may hold (magic_sync.bytes_per_message)");
}

// A number no double holds, in the key or the row, keeps a row of any size from travelling: a
// replica may read numbers as doubles. Its note names the key by its hash when the key holds it.
TEST(Sizes, NoRowTravelsWithANumberPastADouble) {
    const std::string table = "shop.weights";
    EXPECT_TRUE(row_travels("all", table, R"({"id":1})", R"({"g":1e308,"id":1})", 4096));
    EXPECT_FALSE(row_travels("all", table, R"({"id":1})", R"({"g":1e400,"id":1})", 4096));
    EXPECT_FALSE(row_travels("all", table, R"({"id":1e400})", R"({"g":1,"id":1e400})", 4096));
    EXPECT_EQ(why_withheld(R"({"id":1})", R"({"g":1e400,"id":1})"), "number past double");
    EXPECT_EQ(why_withheld(R"({"id":1e400})", R"({"g":1,"id":1e400})"), "number past double");
    EXPECT_EQ(withheld_reason("all", table, R"({"id":1})", R"({"g":-1e400,"id":1})", 4096),
              "the row holds -1e400, a number no double holds: replicas may read numbers as "
              "doubles, so the row is withheld from them; store it within a double's range, or "
              "leave its column out of the declaration");
    const KeyNote by_key = withheld_note("all", table, R"({"id":1})", "number past double", 4096);
    EXPECT_EQ(by_key.key, R"({"id":1})");
    const KeyNote by_hash =
        withheld_note("all", table, R"({"id":1e400})", "number past double", 4096);
    EXPECT_EQ(by_hash.key, "");
    EXPECT_EQ(by_hash.key_hash, key_hash(table, R"({"id":1e400})"));
}

// A value the server cannot send exactly is marked in its row (a string that begins with NUL,
// which no PostgreSQL text holds): the row does not travel, whatever its size, and its reason is
// the marker's text. A NUL anywhere else, or an escaped backslash before u0000, is no marker.
TEST(Sizes, NoRowTravelsWithAValueMarkedNotExact) {
    const std::string table = "shop.notes";
    const std::string marked =
        R"({"id":1,"meta":)" + not_exact_marker("meta holds the \"JSON\" value null") + "}";
    EXPECT_EQ(marked, R"({"id":1,"meta":"\u0000meta holds the \"JSON\" value null"})");
    EXPECT_EQ(not_exact_reason(marked), "meta holds the \"JSON\" value null");
    EXPECT_FALSE(row_travels("all", table, R"({"id":1})", marked, 4096));
    EXPECT_EQ(why_withheld(R"({"id":1})", marked), "not exact");
    EXPECT_EQ(withheld_reason("all", table, R"({"id":1})", marked, 4096),
              "meta holds the \"JSON\" value null");
    for (const char* plain : {R"({"id":1,"meta":null})", R"({"a":"x\\u0000","id":1})",
                              R"({"a":"\\u0000","id":1})", R"({"a":"x\u0000","id":1})"}) {
        EXPECT_EQ(not_exact_reason(plain), std::nullopt) << plain;
        EXPECT_TRUE(row_travels("all", table, R"({"id":1})", plain, 4096)) << plain;
    }
    EXPECT_EQ(not_exact_reason(R"({"a":[1,{"b":"\u0000deep"}],"id":1})"), "deep");
}

// A message encoded before it was numbered takes its gen and seq as it enters the outbox, and is
// then exactly the message encoded with them.
TEST(Restamp, GivesAnEncodedMessageItsHeader) {
    for (DownMessage message : std::vector<DownMessage>{small_filed(), small_repair(), full_rows(),
                                                        RangesMessage{header(3), "all", {}}}) {
        std::visit([](auto& down) { down.header.gen = down.header.seq = 0; }, message);
        const std::string unnumbered = encode(message);
        std::visit([](auto& down) { down.header = header(123456789); }, message);
        EXPECT_EQ(restamp(unnumbered, header(123456789)), encode(message));
    }
    EXPECT_THROW(restamp("{}", header(1)), DecodeError);
}

// The sender gives every message the origin it is sent from: right after seq, read back as it
// was; a message without one reads as before, and the widest header bounds one with the longest.
TEST(Origin, TravelsInTheHeaderOfEveryKind) {
    const std::string origin = "7391841912345678901/2/0b0e3f7e-5bb4-4d3f-9d6e-2f3c4b5a6978";
    for (DownMessage message :
         std::vector<DownMessage>{small_rows(), small_filed(), small_ranges(), small_repair()}) {
        const std::string sent = with_origin(encode(message), origin);
        DownMessage stamped = message;
        std::visit([&](auto& down) { down.header.origin = origin; }, stamped);
        EXPECT_EQ(sent, encode(stamped)) << "stamped in place, as the encoder writes it";
        EXPECT_EQ(with_origin(sent, "other"), with_origin(encode(message), "other"));
        EXPECT_NE(sent.find(R"("seq":)"), std::string::npos);
        EXPECT_NE(sent.find(R"(,"origin":")" + origin + R"(",)"), std::string::npos) << sent;
        std::visit([&](auto& down) { down.header.origin = origin; }, message);
        EXPECT_EQ(decode_down(sent), message);
        EXPECT_EQ(with_origin(sent, ""), with_origin(encode(message), ""));
    }
    EXPECT_EQ(std::get<RowsMessage>(decode_down(encode(small_rows()))).header.origin, "");
    RowsMessage longest = small_rows();
    longest.header = widest_header(kReplica);
    EXPECT_EQ(longest.header.origin.size(), kOriginMaxBytes);
    EXPECT_EQ(decode_down(encode(longest)), DownMessage{longest});
}

TEST(Origin, RefusesAnEmptyOrTooLongOne) {
    const std::string message = encode(small_ranges());
    const std::string empty = with_origin(message, "x");
    EXPECT_THROW(decode_down(std::string(empty).replace(empty.find(R"("x")"), 3, R"("")")),
                 DecodeError);
    EXPECT_THROW(decode_down(with_origin(message, std::string(kOriginMaxBytes + 1, 'o'))),
                 DecodeError);
}

TEST(EncodeRows, SplicesPreEncodedChunks) {
    RowsMessage message = full_rows();
    std::vector<std::string> bodies;
    for (const Chunk& chunk : message.chunks) bodies.push_back(encode(chunk));
    RowsMessage envelope = message;
    envelope.chunks.clear();
    EXPECT_EQ(encode_rows(envelope, {bodies.begin(), bodies.end()}), encode(message));
    EXPECT_THROW(encode_rows(message, {}), std::invalid_argument);
}

// A message as an outbox keeps it: its chunks' withheld notes follow the chunks, in their order.
TEST(AssembleRows, IsTheMessageWithItsChunksAndTheirNotesInOrder) {
    RowsMessage message = full_rows();
    message.withheld.push_back(KeyNote{"shop.sales", "", "too big", half()});
    ASSERT_GE(message.chunks.size(), 2u);
    ASSERT_EQ(message.withheld.size(), 2u);
    std::vector<StoredChunk> stored;
    for (const Chunk& chunk : message.chunks) stored.push_back(StoredChunk{encode(chunk), {}, {}});
    // One note of each chunk.
    stored.front().withheld.assign(message.withheld.begin(), message.withheld.end() - 1);
    stored.back().withheld.push_back(message.withheld.back());
    RowsMessage envelope = message;
    envelope.chunks.clear();
    envelope.withheld.clear();
    std::vector<const StoredChunk*> in_order;
    for (const StoredChunk& chunk : stored) in_order.push_back(&chunk);
    EXPECT_EQ(assemble_rows(envelope, in_order), encode(message));
    EXPECT_THROW(assemble_rows(message, {}), std::invalid_argument);
    const KeyNote by_hash = stored_note("t", std::nullopt, "too big", std::string(64, 'a'));
    EXPECT_EQ(by_hash.key, "");
    EXPECT_EQ(by_hash.key_hash, digest_from_hex(std::string(64, 'a')));
    EXPECT_EQ(stored_note("t", R"({"id":1})", "too big", std::nullopt),
              (KeyNote{"t", R"({"id":1})", "too big"}));
}

TEST(Encode, RefusesInvalidUtf8) {
    RowsMessage message;
    message.header = header(1);
    message.reset = {"\xff"};
    EXPECT_THROW(encode(message), std::invalid_argument);
}

TEST(KeyRange, ContainsIsHalfOpen) {
    KeyRange lower{Digest{}, half()};
    KeyRange upper{half(), std::nullopt};
    Digest top;
    top.fill(0xff);
    EXPECT_TRUE(contains(lower, Digest{}));
    EXPECT_FALSE(contains(lower, half()));
    EXPECT_TRUE(contains(upper, half()));
    EXPECT_TRUE(contains(upper, top));
    EXPECT_FALSE(contains(upper, Digest{}));
}

}  // namespace
}  // namespace magic_sync::protocol
