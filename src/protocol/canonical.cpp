#include "protocol/canonical.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "protocol/json_tree.hpp"

namespace magic_sync::protocol {

std::string canonical_json(std::string_view text, const Limits& limits) {
    if (text.size() > limits.max_bytes) {
        throw DecodeError("JSON text is " + std::to_string(text.size()) +
                          " bytes, over the limit of " + std::to_string(limits.max_bytes));
    }
    return parse_json_tree(text, limits, PayloadPlacement::kWholeDocument).text;
}

std::string canonical_object_without(std::string_view object,
                                     const std::vector<std::string>& hidden, const Limits& limits) {
    if (object.size() > limits.max_bytes) {
        throw DecodeError("JSON text is " + std::to_string(object.size()) +
                          " bytes, over the limit of " + std::to_string(limits.max_bytes));
    }
    JsonNode tree = parse_json_tree(object, limits, PayloadPlacement::kMemberValues);
    if (tree.type != JsonNode::Type::kObject) throw DecodeError("not a JSON object");
    std::vector<std::pair<std::string, std::string>> members;
    for (JsonMember& member : tree.members) {
        if (std::find(hidden.begin(), hidden.end(), member.key) != hidden.end()) continue;
        members.emplace_back(std::move(member.key), std::move(member.value.text));
    }
    std::string text;
    append_json_object(text, members);
    return text;
}

namespace {

// The length of the UTF-8 sequence that starts at `at`, or 0 when it is not well formed (an
// overlong form, a surrogate, past U+10FFFF, or cut short): the rules of RFC 3629.
size_t utf8_sequence_length(std::string_view value, size_t at) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(value[i]); };
    const unsigned char lead = byte(at);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;  // the range of the second byte
    if (lead >= 0xc2 && lead <= 0xdf) {
        length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
        length = 3;
        if (lead == 0xe0) low = 0xa0;
        if (lead == 0xed) high = 0x9f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
        length = 4;
        if (lead == 0xf0) low = 0x90;
        if (lead == 0xf4) high = 0x8f;
    } else {
        return 0;
    }
    if (at + length > value.size()) return 0;
    if (byte(at + 1) < low || byte(at + 1) > high) return 0;
    for (size_t i = 2; i < length; ++i) {
        if (byte(at + i) < 0x80 || byte(at + i) > 0xbf) return 0;
    }
    return length;
}

}  // namespace

// Escapes as nlohmann's dump does without ensure_ascii (the canonical form the tests pin): the
// quote, the backslash and control characters; \b \t \n \f \r by name, the others as \u00xx.
// Written out here because building a json value per string to dump it cost more than the rest
// of encoding an upload's row.
void append_json_string(std::string& out, std::string_view value) {
    static const char hex[] = "0123456789abcdef";
    out += '"';
    size_t at = 0;
    while (at < value.size()) {
        const unsigned char c = static_cast<unsigned char>(value[at]);
        if (c >= 0x80) {
            const size_t length = utf8_sequence_length(value, at);
            if (length == 0) {
                throw std::invalid_argument(
                    "cannot write a JSON string that is not valid UTF-8: ill-formed byte at "
                    "index " +
                    std::to_string(at) + ": 0x" + hex[c >> 4] + hex[c & 0x0f]);
            }
            out.append(value.data() + at, length);
            at += length;
            continue;
        }
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\f':
                out += "\\f";
                break;
            case '\r':
                out += "\\r";
                break;
            default:
                if (c < 0x20) {
                    out += "\\u00";
                    out += hex[c >> 4];
                    out += hex[c & 0x0f];
                } else {
                    out += static_cast<char>(c);
                }
        }
        ++at;
    }
    out += '"';
}

void append_json_object(std::string& out,
                        const std::vector<std::pair<std::string, std::string>>& members) {
    out += '{';
    for (size_t i = 0; i < members.size(); ++i) {
        if (i) out += ',';
        append_json_string(out, members[i].first);
        out += ':';
        out += members[i].second;
    }
    out += '}';
}

namespace {

// The index of the quote that closes the string of valid JSON `json` opened at `at`.
size_t string_end(std::string_view json, size_t at) {
    for (++at; at < json.size() && json[at] != '"'; ++at)
        if (json[at] == '\\') ++at;  // the escaped character
    return at;
}

}  // namespace

std::optional<std::string> number_past_double(std::string_view json) {
    for (size_t at = 0; at < json.size(); ++at) {
        const char c = json[at];
        if (c == '"') {
            at = string_end(json, at);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t end = at + 1;
            while (end < json.size() &&
                   (std::isdigit(static_cast<unsigned char>(json[end])) || json[end] == '.' ||
                    json[end] == 'e' || json[end] == 'E' || json[end] == '+' || json[end] == '-'))
                ++end;
            const std::string lexeme(json.substr(at, end - at));
            if (!std::isfinite(std::strtod(lexeme.c_str(), nullptr))) return lexeme;
            at = end - 1;
        }
    }
    return std::nullopt;
}

std::optional<std::string> number_past_double_problem(std::string_view json) {
    constexpr size_t kShown = 40;
    std::optional<std::string> number = number_past_double(json);
    if (!number) return std::nullopt;
    return "the row holds " + number->substr(0, kShown) + (number->size() > kShown ? "..." : "") +
           ", a number no double holds";
}

std::string not_exact_marker(std::string_view reason) {
    std::string text;
    append_json_string(text, std::string(1, '\0') + std::string(reason));
    return text;
}

std::optional<std::string> not_exact_reason(std::string_view json) {
    static constexpr std::string_view kMarker = "\"\\u0000";
    for (size_t at = 0; at < json.size(); ++at) {
        if (json[at] != '"') continue;
        const size_t end = string_end(json, at);
        if (json.substr(at, kMarker.size()) == kMarker) {
            const JsonNode marker = parse_json_tree(json.substr(at, end + 1 - at), Limits{},
                                                    PayloadPlacement::kRowFields);
            return marker.text.substr(1);
        }
        at = end;
    }
    return std::nullopt;
}

}  // namespace magic_sync::protocol
