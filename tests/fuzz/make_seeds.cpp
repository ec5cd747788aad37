// Writes the seed corpora of tests/fuzz/corpus/ with the protocol's own encoder: a small valid
// message of every kind, full ones with every optional field and strings that need escaping, each
// also cut short, and rows nested as deep as a message allows and one level deeper.
//
//   build/fuzz/make_seeds tests/fuzz/corpus     (scripts/fuzz.sh --seeds)
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "protocol/canonical.hpp"
#include "protocol/messages.hpp"

namespace {

namespace protocol = magic_sync::protocol;
using protocol::Digest;

const std::string kReplica = "6f1c2a9e-1b2c-4d3e-8f40-5a6b7c8d9e0f";
const std::string kUpload = "0b6e8d2c-3f4a-4b5c-9d6e-7f8091a2b3c4";

Digest half() { return protocol::digest_from_hex("8" + std::string(63, '0')); }

protocol::DownRow live(const std::string& table, const std::string& key, const std::string& row) {
    return protocol::DownRow{table, key, protocol::RowBody{row, protocol::row_hash(row)}};
}

// An object nested `depth` levels: {"a":{"a":...{"a":1}...}}.
std::string nested(int depth) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += "{\"a\":";
    text += '1';
    for (int i = 0; i < depth; ++i) text += '}';
    return text;
}

protocol::MessageHeader header(int64_t seq) { return {kReplica, 3, seq}; }

protocol::RowsMessage small_rows() {
    protocol::RowsMessage m;
    m.header = header(17);
    m.chunks.push_back(protocol::Chunk{
        "all",
        120,
        180,
        {live("shop.products", R"({"id":7})", R"({"id":7,"name":"tea","price":12.50})"),
         protocol::DownRow{"shop.products", R"({"id":9})", std::nullopt}}});
    return m;
}

protocol::RowsMessage full_rows() {
    protocol::RowsMessage m = small_rows();
    m.reset = {"*", "store_id=42"};
    m.drop = {"old \"scope\""};
    m.chunks.push_back(protocol::Chunk{
        "store_id=42",
        0,
        5,
        {live(
            "shop.prices", R"({"store_id":42,"sku":"a\\b\n"})",
            R"({"at":"2024-01-01T00:00:00Z","n":[1,-0.0,1E+3,null,true,false],"sku":"été ☕"})")}});
    m.withheld.push_back(protocol::KeyNote{"shop.products", R"({"id":8})", "too big\t\u0001"});
    return m;
}

protocol::FiledMessage filed() {
    return {header(18), kUpload, {{"shop.products", R"({"id":7})", "catalog rows are not taken"}}};
}

protocol::RangesMessage ranges() {
    return {header(19), "store_id=42", {{Digest{}, half()}, {half(), std::nullopt}}};
}

protocol::RepairMessage repair() {
    return {header(20),
            "all",
            {Digest{}, half()},
            {live("shop.products", R"({"id":7})", R"({"id":7,"name":"tea"})")}};
}

protocol::Upload small_upload() {
    protocol::Upload u;
    u.id = kUpload;
    u.rows.push_back({"shop.sales", R"({"id":"s1","total":12.50})"});
    return u;
}

protocol::Upload full_upload() {
    protocol::Upload u = small_upload();
    u.rows.push_back(
        {"shop.drawers", R"({"closed_at":null,"counted":"1e3","register_id":"r\"1"})"});
    u.rows.push_back({"shop.sales", R"({"id":"s2","lines":[{"sku":"☕","q":2}],"total":-0.0})"});
    u.applied = 17;
    u.untaken.push_back({17, "shop.products", R"({"id":7})", "no such column"});
    protocol::Holding holding;
    holding.through = 180;
    holding.fingerprint = protocol::Fingerprint{half(), 412};
    holding.ranges.push_back({{Digest{}, half()}, protocol::Fingerprint{half(), 200}});
    holding.ranges.push_back({{half(), std::nullopt}, protocol::Fingerprint{Digest{}, 212}});
    u.holds.emplace("all", holding);
    u.holds.emplace("store_id=42", protocol::Holding{5, {}, {}});
    return u;
}

class Writer {
  public:
    explicit Writer(std::string dir) : dir_(std::move(dir)) {}

    void put(const std::string& target, const std::string& name, const std::string& bytes) {
        const std::string path = dir_ + "/" + target + "/" + name;
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out << bytes;
        if (!out) {
            std::cerr << "make_seeds: cannot write " << path << "\n";
            ok_ = false;
        }
        ++count_;
    }

    // The message, and the message cut in half.
    void message(const std::string& target, const std::string& name, const std::string& bytes) {
        put(target, name, bytes);
        put(target, name + "-cut", bytes.substr(0, bytes.size() / 2));
    }

    bool ok() const { return ok_; }
    int count() const { return count_; }

  private:
    std::string dir_;
    bool ok_ = true;
    int count_ = 0;
};

// A row of an upload nests 3 levels deep, of a rows message kRowDepthInMessage.
std::string deep_upload(int row_depth) {
    protocol::Upload u;
    u.id = kUpload;
    u.rows.push_back({"shop.sales", nested(row_depth)});
    return protocol::encode(u);
}

std::string deep_rows(int row_depth) {
    protocol::RowsMessage m;
    m.header = header(1);
    m.chunks.push_back(protocol::Chunk{"all", 0, 1, {live("t", R"({"a":1})", nested(row_depth))}});
    return protocol::encode(m);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: make_seeds CORPUS_DIR (with decode/, upload/, canonical/ in it)\n";
        return 2;
    }
    Writer w(argv[1]);
    const int max_depth = protocol::Limits{}.max_depth;
    const int row_max_in_rows = max_depth - protocol::kRowDepthInMessage;
    const int row_max_in_upload = max_depth - 3;

    // decode: every kind of message, down and up.
    w.message("decode", "rows-small", protocol::encode(small_rows()));
    w.message("decode", "rows-full", protocol::encode(full_rows()));
    protocol::RowsMessage empty_rows;
    empty_rows.header = header(0);
    w.put("decode", "rows-empty", protocol::encode(empty_rows));
    w.message("decode", "filed", protocol::encode(filed()));
    w.message("decode", "ranges", protocol::encode(ranges()));
    w.message("decode", "repair", protocol::encode(repair()));
    w.message("decode", "upload-small", protocol::encode(small_upload()));
    w.message("decode", "upload-full", protocol::encode(full_upload()));
    w.put("decode", "rows-deepest", deep_rows(row_max_in_rows));
    w.put("decode", "rows-too-deep", deep_rows(row_max_in_rows + 1));
    w.put("decode", "version-2", R"({"v":2,"kind":"rows"})");
    w.put("decode", "unknown-kind",
          R"({"v":1,"kind":"hello","replica":")" + kReplica + R"(","gen":0,"seq":0})");
    w.put("decode", "duplicate-key", R"({"v":1,"v":1,"id":")" + kUpload + R"(","rows":[]})");
    w.put("decode", "reordered-spaced",
          " {\"rows\" : [ ] ,\n\t\"id\":\"" + kUpload + "\", \"v\" : 1, \"extra\": {\"k\": [1]}} ");

    // upload: what a replica sends, and what the server must keep whole.
    w.message("upload", "small", protocol::encode(small_upload()));
    w.message("upload", "full", protocol::encode(full_upload()));
    protocol::Upload no_rows;
    no_rows.id = kUpload;
    w.put("upload", "no-rows", protocol::encode(no_rows));
    w.put("upload", "deepest-row", deep_upload(row_max_in_upload));
    w.put("upload", "row-too-deep", deep_upload(row_max_in_upload + 1));
    w.put("upload", "id-first", R"({"id":")" + kUpload + R"(","v":1,"rows":[{"t":"a","r":{}}]})");
    w.put("upload", "nul-and-escapes",
          R"({"v":1,"id":")" + kUpload +
              R"(","rows":[{"t":"shop.sales\u0000","r":{"id":"\u0000\ud83d\ude00\/","x":"\""}}]})");
    w.put("upload", "wrong-types",
          R"({"v":1,"id":")" + kUpload + R"(","rows":[{"t":1,"r":[]}],"applied":-1})");
    w.put("upload", "bad-utf8", "{\"v\":1,\"id\":\"" + kUpload + "\",\"rows\":[{\"t\":\"\xff\"}]}");

    // canonical: JSON values of every sort.
    const std::vector<std::pair<std::string, std::string>> values = {
        {"object", R"({"b":[1,2,{"z":null,"a":true}],"a":"x"})"},
        {"numbers",
         "[12.50,1E+3,-0,-0.0,0,123456789012345678901234567890.123,"
         "18446744073709551615,-9223372036854775808,1e-7]"},
        {"strings", R"(["\u00e9\u2615\ud83d\ude00","\b\f\n\r\t\u0001\u001f\u007f","\/\\\""])"},
        {"utf8", "\"\xc3\xa9\xe2\x98\x95\xf0\x9f\x98\x80\""},
        {"bom", "\xef\xbb\xbf{\"a\":1}"},
        {"spaces", " \t\n\r[ 1 , { \"a\" : [ ] } ]\n"},
        {"scalars", "[true,false,null,\"\",{},[]]"},
        {"sort-bytes", R"({"é":1,"z":2,"Z":3,"":4,"a\u0000":5,"a":6})"},
        {"deepest", std::string(max_depth, '[') + std::string(max_depth, ']')},
        {"too-deep", std::string(max_depth + 1, '[') + std::string(max_depth + 1, ']')},
        {"overflow", "[1e400]"},
        {"lone-surrogate", R"(["\ud800"])"},
        {"duplicate", R"({"a":1,"a":2})"},
        {"cut", R"({"a":[1,2,{"b":)"},
    };
    for (const auto& [name, text] : values) w.put("canonical", name, text);
    w.put("canonical", "row-full", protocol::canonical_json(full_upload().rows[2].row));

    std::cout << "make_seeds: wrote " << w.count() << " seeds under " << argv[1] << "\n";
    return w.ok() ? 0 : 1;
}
