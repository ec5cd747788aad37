// The pure computations sync.receive makes on a decoded upload, copied from src/receive.cpp
// (which includes PostgreSQL's headers and so cannot be linked here): the top-level member scan
// of a canonical row, the key it builds from the codec's key columns, the set-aside body of a
// kept row, the untaken and holds JSON handed to SQL, and the id recovered from a message that
// does not decode. Keep these in step with src/receive.cpp; if they move into src/protocol/, link
// them instead and delete this file.
#pragma once

#include <algorithm>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/canonical.hpp"
#include "protocol/messages.hpp"

namespace magic_sync::fuzz::server {

namespace protocol = magic_sync::protocol;

inline std::string json_string(std::string_view text) {
    std::string out;
    protocol::append_json_string(out, text);
    return out;
}

struct Member {
    std::string_view key;    // the key token, quotes included
    std::string_view value;  // the value's text
};

inline size_t past_string(std::string_view text, size_t at) {
    for (++at; at < text.size(); ++at) {
        if (text[at] == '\\')
            ++at;
        else if (text[at] == '"')
            return at + 1;
    }
    return text.size();
}

inline size_t value_end(std::string_view text, size_t at) {
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

inline std::vector<Member> members_of(std::string_view object) {
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

inline std::optional<std::string_view> member(const std::vector<Member>& members,
                                              std::string_view json_name) {
    for (const Member& m : members)
        if (m.key == json_name) return m.value;
    return std::nullopt;
}

// key_of: the codec's key columns (raw names) sorted bytewise, each with the row's value or null.
inline std::string key_of(std::vector<std::string> key_columns,
                          const std::vector<Member>& members) {
    std::sort(key_columns.begin(), key_columns.end());
    std::string key = "{";
    for (const std::string& column : key_columns) {
        const std::string json_name = json_string(column);
        key += (key.size() > 1 ? "," : "") + json_name + ":" +
               std::string(member(members, json_name).value_or("null"));
    }
    return key + "}";
}

// kept_row's body: the row as uploaded.
inline std::string kept_body(const protocol::UpRow& row) {
    return "{\"t\":" + json_string(row.table) + ",\"r\":" + row.row + "}";
}

inline std::string untaken_json(const protocol::Upload& upload) {
    std::string out = "[";
    for (const protocol::Untaken& u : upload.untaken) {
        out += (out.size() > 1 ? ",{\"seq\":" : "{\"seq\":") + std::to_string(u.seq) +
               ",\"t\":" + json_string(u.table) + ",\"k\":" + u.key +
               ",\"why\":" + json_string(u.why) + "}";
    }
    return out + "]";
}

inline std::string holds_json(const protocol::Upload& upload) {
    std::string out = "{";
    for (const auto& [scope, holding] : upload.holds) {
        out += (out.size() > 1 ? "," : "") + json_string(scope) +
               ":{\"through\":" + std::to_string(holding.through) + ",\"fp\":\"" +
               protocol::to_hex(holding.fingerprint.sum) +
               "\",\"n\":" + std::to_string(holding.fingerprint.count);
        if (!holding.ranges.empty()) {
            std::string ranges;
            for (const protocol::RangeFingerprint& r : holding.ranges) {
                ranges += (ranges.empty() ? "[\"" : ",[\"") + protocol::to_hex(r.range.lo) +
                          "\",\"" + (r.range.hi ? protocol::to_hex(*r.range.hi) : "") + "\",\"" +
                          protocol::to_hex(r.fingerprint.sum) + "\"," +
                          std::to_string(r.fingerprint.count) + "]";
            }
            out += ",\"ranges\":[" + ranges + "]";
        }
        out += "}";
    }
    return out + "}";
}

inline std::optional<std::string> recover_id(std::string_view message) {
    static const std::regex start(
        R"re(^\s*\{\s*(?:"v"\s*:\s*[0-9]+\s*,\s*)?"id"\s*:\s*")re"
        R"re(([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")re");
    const std::string head(message.substr(0, 256));
    std::smatch match;
    if (std::regex_search(head, match, start)) return match[1].str();
    return std::nullopt;
}

}  // namespace magic_sync::fuzz::server
