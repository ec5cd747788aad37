#include "protocol/upload_fields.hpp"

#include <regex>

#include "protocol/canonical.hpp"
#include "protocol/gzip.hpp"
#include "protocol/hash.hpp"
#include "protocol/json_tree.hpp"

namespace magic_sync::protocol {

namespace {

size_t past_string(std::string_view text, size_t at) {  // text[at] is the opening quote
    for (++at; at < text.size(); ++at) {
        if (text[at] == '\\')
            ++at;
        else if (text[at] == '"')
            return at + 1;
    }
    return text.size();
}

size_t value_end(std::string_view text, size_t at) {
    int depth = 0;
    while (at < text.size()) {
        char c = text[at];
        if (c == '"') {
            at = past_string(text, at);
            continue;
        }
        if (c == '{' || c == '[') {
            ++depth;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return at;
            --depth;
        } else if (c == ',' && depth == 0) {
            return at;
        }
        ++at;
    }
    return at;
}

}  // namespace

std::string json_string(std::string_view text) {
    std::string out;
    append_json_string(out, text);
    return out;
}

std::vector<Member> members_of(std::string_view object) {
    std::vector<Member> members;
    if (object.empty() || object.front() != '{') return members;
    size_t at = 1;
    while (at < object.size() && object[at] == '"') {
        size_t key_end = past_string(object, at);
        size_t end = value_end(object, key_end + 1);
        members.push_back(
            {object.substr(at, key_end - at), object.substr(key_end + 1, end - key_end - 1)});
        at = end + 1;
    }
    return members;
}

std::optional<std::string_view> member(const std::vector<Member>& members,
                                       std::string_view json_name) {
    for (const Member& m : members)
        if (m.key == json_name) return m.value;
    return std::nullopt;
}

std::string key_of(const std::vector<std::string>& key_json_names,
                   const std::vector<Member>& members) {
    std::string key = "{";
    for (const std::string& name : key_json_names) {
        key += (key.size() > 1 ? "," : "") + name + ":" +
               std::string(member(members, name).value_or("null"));
    }
    return key + "}";
}

std::string kept_body(const UpRow& row) {
    return "{\"t\":" + json_string(row.table) + ",\"r\":" + row.row + "}";
}

UpRow kept_row(std::string_view body) {
    // As an element of a list, its "r" is read as a row payload: canonical text.
    const JsonNode list =
        parse_json_tree("[" + std::string(body) + "]", Limits{}, PayloadPlacement::kRowFields);
    const JsonNode* row = list.items.size() == 1 ? &list.items.front() : nullptr;
    if (row == nullptr || row->type != JsonNode::Type::kObject)
        throw DecodeError("a kept row is {\"t\": table, \"r\": row}, not " + quoted_excerpt(body));
    const JsonNode* table = find_member(*row, "t");
    const JsonNode* value = find_member(*row, "r");
    if (table == nullptr || table->type != JsonNode::Type::kString || value == nullptr ||
        value->type != JsonNode::Type::kPayload || value->text.front() != '{')
        throw DecodeError("a kept row is {\"t\": table, \"r\": row}, not " + quoted_excerpt(body));
    return UpRow{table->text, value->text};
}

std::string untaken_json(const Upload& upload) {
    std::string out = "[";
    for (const Untaken& u : upload.untaken) {
        out += (out.size() > 1 ? ",{\"seq\":" : "{\"seq\":") + std::to_string(u.seq) +
               ",\"t\":" + json_string(u.table) + ",\"k\":" + u.key +
               ",\"why\":" + json_string(u.why) + "}";
    }
    return out + "]";
}

std::string holds_json(const Upload& upload) {
    std::string out = "{";
    for (const auto& [scope, holding] : upload.holds) {
        out += (out.size() > 1 ? "," : "") + json_string(scope) +
               ":{\"through\":" + std::to_string(holding.through) + ",\"fp\":\"" +
               to_hex(holding.fingerprint.sum) +
               "\",\"n\":" + std::to_string(holding.fingerprint.count);
        if (!holding.ranges.empty()) {
            std::string ranges;
            for (const RangeFingerprint& r : holding.ranges) {
                ranges += (ranges.empty() ? "[\"" : ",[\"") + to_hex(r.range.lo) + "\",\"" +
                          (r.range.hi ? to_hex(*r.range.hi) : "") + "\",\"" +
                          to_hex(r.fingerprint.sum) + "\"," + std::to_string(r.fingerprint.count) +
                          "]";
            }
            out += ",\"ranges\":[" + ranges + "]";
        }
        out += "}";
    }
    return out + "}";
}

std::optional<std::string> recover_id(std::string_view message) {
    static const std::regex start(
        R"re(^\s*\{\s*(?:"v"\s*:\s*[0-9]+\s*,\s*)?"id"\s*:\s*")re"
        R"re(([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")re");
    const std::string head =
        is_gzip(message) ? gunzip_start(message, 256) : std::string(message.substr(0, 256));
    std::smatch match;
    if (std::regex_search(head, match, start)) return match[1].str();
    return std::nullopt;
}

}  // namespace magic_sync::protocol
