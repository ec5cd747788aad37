// libFuzzer target: the upload path of sync.receive without PostgreSQL. The filer's SQL runs in a
// backend and is covered by the regress tests; this drives everything the server computes from
// the bytes before and around it (src/protocol/upload_fields.cpp, which src/filing/receive.cpp
// calls):
//   - the id recovered from a message that does not decode never differs from the decoded one,
//     and is always recovered from an encoded upload;
//   - every decoded row is canonical, its top-level members scan to exactly the object's members
//     with canonical values, the key built from any set of key columns is canonical, and its key
//     and row hashes add to and remove from a fingerprint exactly;
//   - the kept list, the untaken list and the holds handed to SQL are JSON, holds exactly as on
//     the wire, and a filed answer naming every row as kept encodes and decodes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "protocol/canonical.hpp"
#include "protocol/fingerprint.hpp"
#include "protocol/messages.hpp"
#include "protocol/upload_fields.hpp"

namespace {

namespace protocol = magic_sync::protocol;
using magic_sync::fuzz::check;
using magic_sync::fuzz::fail;
// Floats as the protocol reads them: long double, so a number past double's range is a number.
using Json = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                  std::uint64_t, long double>;

// The canonical form of `text` as an upload's row carries it (protocol::canonical_json refuses a
// number no double holds, as a row the server sends must; an uploaded row takes it): `text` read
// as the one member of a row of an upload.
std::string canonical_or_fail(const std::string& text, const char* property) {
    static const std::string before =
        R"({"v":1,"id":"00000000-0000-0000-0000-000000000000","rows":[{"t":"t","r":{"x":)";
    protocol::Limits deeper;  // the upload, its rows list, the row and its member: four levels
    deeper.max_depth += 4;
    try {
        const std::string row =
            protocol::decode_upload(before + text + "}}]}", deeper).rows.at(0).row;
        return row.substr(5, row.size() - 6);  // {"x":…}
    } catch (const protocol::DecodeError& error) {
        fail(property, std::string(error.what()) + " in " + text);
    }
}

// The row's members by the server's scan, against nlohmann's reading of the same object.
void check_members(const protocol::UpRow& row, const std::vector<protocol::Member>& members) {
    Json parsed = Json::parse(row.row, nullptr, false);
    check(parsed.is_object(), "an uploaded row is a JSON object", row.row);
    check(members.size() == parsed.size(), "the member scan finds every member", row.row);
    size_t i = 0;
    for (auto it = parsed.begin(); it != parsed.end(); ++it, ++i) {
        check(members[i].key == protocol::json_string(it.key()), "the member scan reads each key",
              row.row);
        const std::string value(members[i].value);
        check(canonical_or_fail(value, "a scanned member value is JSON") == value,
              "a scanned member value is canonical", row.row);
        check(Json::parse(value) == it.value(), "the member scan reads each value", row.row);
    }
}

// Key columns as a codec might have them: "id" (possibly absent from the row: null) and every
// other member of the row, as load_codecs hands them to key_of: sorted bytewise, as JSON strings.
std::vector<std::string> key_names_for(const protocol::UpRow& row) {
    std::vector<std::string> columns{"id"};
    Json parsed = Json::parse(row.row);
    size_t i = 0;
    for (auto it = parsed.begin(); it != parsed.end(); ++it, ++i) {
        if (i % 2 == 0 && it.key() != "id") columns.push_back(it.key());
    }
    std::sort(columns.begin(), columns.end());
    std::vector<std::string> names;
    for (const std::string& column : columns) names.push_back(protocol::json_string(column));
    return names;
}

void check_rows(const protocol::Upload& upload) {
    protocol::Fingerprint fingerprint;
    std::vector<protocol::Digest> elements;
    protocol::FiledMessage answer;
    answer.header = protocol::MessageHeader{upload.id, 1, 1, ""};
    answer.upload = upload.id;
    std::string kept = "[";
    for (const protocol::UpRow& row : upload.rows) {
        check(canonical_or_fail(row.row, "an uploaded row is JSON") == row.row,
              "an uploaded row is canonical", row.row);
        const std::vector<protocol::Member> members = protocol::members_of(row.row);
        check_members(row, members);
        const std::string key = protocol::key_of(key_names_for(row), members);
        check(canonical_or_fail(key, "the key of a row is JSON") == key,
              "the key of a row is canonical", key);
        const protocol::Digest element =
            protocol::element(protocol::key_hash(row.table, key), protocol::row_hash(row.row));
        fingerprint.add(element);
        elements.push_back(element);
        // Filing refuses every row: the answer names each, and the set-aside keeps it whole.
        const std::string why = "table " + row.table + " does not sync";
        answer.kept.push_back(protocol::KeyNote{row.table, key, why});
        kept += (kept.size() > 1 ? ",{\"t\":" : "{\"t\":") + protocol::json_string(row.table) +
                ",\"k\":" + key + ",\"why\":" + protocol::json_string(why) +
                ",\"reason\":" + protocol::json_string(why) +
                ",\"body\":" + protocol::json_string(protocol::kept_body(row)) + "}";
    }
    kept += "]";
    canonical_or_fail(kept, "the kept list is JSON");
    for (const protocol::Digest& element : elements) fingerprint.remove(element);
    check(fingerprint == protocol::Fingerprint{}, "adding and removing every row leaves nothing");

    const std::string encoded_answer = protocol::encode(answer);
    try {
        check(std::get<protocol::FiledMessage>(protocol::decode_down(encoded_answer)) == answer,
              "the filed answer decodes to itself", encoded_answer);
    } catch (const protocol::DecodeError& error) {
        fail("a filed answer naming every row decodes", error.what());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const std::optional<std::string> recovered = protocol::recover_id(text);
    protocol::Upload upload;
    try {
        upload = protocol::decode_upload(text);
    } catch (const protocol::DecodeError&) {
        return 0;  // kept whole, answered under `recovered` when there is one
    }
    check(!recovered || *recovered == upload.id, "the recovered id is the upload's id", text);
    const std::string encoded = protocol::encode(upload);
    check(protocol::recover_id(encoded) == upload.id, "an encoded upload's id is recovered",
          encoded);

    check_rows(upload);

    const std::string untaken = protocol::untaken_json(upload);
    canonical_or_fail(untaken, "the untaken list is JSON");
    for (const protocol::Untaken& u : upload.untaken) {
        check(canonical_or_fail(u.key, "an untaken key is JSON") == u.key,
              "an untaken key is canonical", u.key);
        protocol::key_hash(u.table, u.key);
    }

    const std::string holds = protocol::holds_json(upload);
    canonical_or_fail(holds, "the holds are JSON");
    if (upload.holds.empty()) {
        check(holds == "{}", "no holds are an empty object", holds);
    } else {
        const std::string tail = ",\"holds\":" + holds + "}";
        check(encoded.size() > tail.size() &&
                  encoded.compare(encoded.size() - tail.size(), tail.size(), tail) == 0,
              "the holds handed to SQL are the holds on the wire", holds);
    }
    return 0;
}
