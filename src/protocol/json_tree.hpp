// The parsed form of a message: a tree for the envelope, canonical text for row payloads. Built by
// one SAX pass over nlohmann's lexer, so depth and string length are bounded before anything deep
// or large is built, and number lexemes are kept as written. Used by canonical_json and by the
// message decoder; not meant for other callers.
//
// Memory: each envelope value costs about 90 bytes, so the worst input (a long list of one-digit
// numbers) briefly takes ~45 times its size; a message of real rows, a few times. Limits::max_bytes
// is what bounds it.
#pragma once

#include "protocol/pure.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "protocol/limits.hpp"

namespace magic_sync::protocol {

struct JsonMember;

struct JsonNode {
    enum class Type { kNull, kBoolean, kNumber, kString, kArray, kObject, kPayload };
    Type type = Type::kNull;
    // kBoolean: "true" or "false"; kNumber: the lexeme; kString: the decoded string;
    // kPayload: the canonical JSON of the value.
    std::string text;
    std::vector<JsonNode> items;      // kArray
    std::vector<JsonMember> members;  // kObject: sorted bytewise by key, keys unique
};

struct JsonMember {
    std::string key;
    JsonNode value;
};

// Where payloads are: the whole document (the result is one kPayload node), the values of the
// members "k" and "r" of every object that is an array element (a row in any list of a message),
// or the values of the members of the document, an object (a row's columns).
enum class PayloadPlacement { kWholeDocument, kRowFields, kMemberValues };

// Throws DecodeError on malformed JSON, duplicate keys and broken limits (all but max_bytes and
// max_rows, which are the caller's to check; objects in lists are bounded by twice max_rows while
// parsing, so that memory stays bounded).
JsonNode parse_json_tree(std::string_view text, const Limits& limits, PayloadPlacement placement);

// The member's value, or nullptr. `object` must be a kObject node.
const JsonNode* find_member(const JsonNode& object, std::string_view key);

// `text` (valid UTF-8) as a JSON string for an error message, cut to its first 64 bytes (on a
// character boundary) and marked with "..." when longer.
std::string quoted_excerpt(std::string_view text);

}  // namespace magic_sync::protocol
