#include "lib/json_object.hpp"

#include <nlohmann/json.hpp>

#include <stdexcept>

#include "protocol/canonical.hpp"

namespace magic_sync::replica {

namespace {

// The end of the string that starts at `at` (a '"'), just past its closing quote.
size_t skip_string(std::string_view text, size_t at) {
    for (size_t i = at + 1; i < text.size(); ++i) {
        if (text[i] == '\\') {
            ++i;
        } else if (text[i] == '"') {
            return i + 1;
        }
    }
    throw std::invalid_argument("unterminated string in JSON object");
}

// The end of the value that starts at `at`: canonical text has no whitespace, so a value ends at
// the first ',' or '}' outside strings and nested brackets.
size_t skip_value(std::string_view text, size_t at) {
    int depth = 0;
    size_t i = at;
    while (i < text.size()) {
        char c = text[i];
        if (c == '"') {
            i = skip_string(text, i);
            continue;
        }
        if (c == '{' || c == '[') ++depth;
        if (c == '}' || c == ']') {
            if (depth == 0) return i;
            --depth;
        }
        if (c == ',' && depth == 0) return i;
        ++i;
    }
    throw std::invalid_argument("unterminated value in JSON object");
}

}  // namespace

std::map<std::string, std::string> object_members(std::string_view canonical_object) {
    std::string_view text = canonical_object;
    if (text.size() < 2 || text.front() != '{' || text.back() != '}') {
        throw std::invalid_argument("not a JSON object");
    }
    std::map<std::string, std::string> members;
    size_t i = 1;
    while (i < text.size() - 1) {
        if (text[i] != '"') throw std::invalid_argument("malformed JSON object");
        size_t name_end = skip_string(text, i);
        std::string name = nlohmann::json::parse(text.substr(i, name_end - i)).get<std::string>();
        if (name_end >= text.size() || text[name_end] != ':') {
            throw std::invalid_argument("malformed JSON object");
        }
        size_t value_start = name_end + 1;
        size_t value_end = skip_value(text, value_start);
        members.emplace(std::move(name),
                        std::string(text.substr(value_start, value_end - value_start)));
        i = text[value_end] == ',' ? value_end + 1 : value_end;
    }
    return members;
}

std::string object_from_members(const std::map<std::string, std::string>& members) {
    std::string text = "{";
    for (const auto& [name, value] : members) {
        if (text.size() > 1) text += ',';
        protocol::append_json_string(text, name);
        text += ':';
        text += value;
    }
    text += '}';
    // The map already orders names as canonical form does; canonical_json also brings values
    // that did not come from canonical text into their one spelling.
    return protocol::canonical_json(text);
}

}  // namespace magic_sync::replica
