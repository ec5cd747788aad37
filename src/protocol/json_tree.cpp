#include "protocol/json_tree.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "protocol/canonical.hpp"

namespace magic_sync::protocol {

namespace {

// Floats as long double: a number past double's range (1e400) is no error while parsing an
// upload. Its value is never used (a number travels as its lexeme), and numeric columns take it
// exactly; a whole document (a row the server encodes) still refuses it.
using Json = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                  std::uint64_t, long double>;

// nlohmann's messages quote the input they stopped at ("last read: '...'"), which may be invalid
// UTF-8 or megabytes long; errors end up in logs and text columns, so keep them short ASCII.
std::string printable(std::string_view text) {
    constexpr size_t kMaxLength = 300;
    constexpr char kHexDigits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : text) {
        if (out.size() >= kMaxLength) {
            out += "...";
            break;
        }
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            out += "\\x";
            out += kHexDigits[c >> 4];
            out += kHexDigits[c & 0x0f];
        }
    }
    return out;
}

// Builds the tree as nlohmann's parser reports values. Envelope containers are JsonNodes on
// `envelope_`; inside a payload, containers are canonical text under construction on `payload_`.
// The parser itself is iterative, so with the depth check here nothing recurses deeper than
// max_depth.
class TreeBuilder : public nlohmann::json_sax<Json> {
  public:
    TreeBuilder(const Limits& limits, PayloadPlacement placement)
        : limits_(limits), placement_(placement) {}

    JsonNode take_result() { return std::move(result_); }

    bool null() override { return scalar(JsonNode::Type::kNull, "null"); }

    bool boolean(bool value) override {
        return scalar(JsonNode::Type::kBoolean, value ? "true" : "false");
    }

    bool number_integer(number_integer_t value) override {
        return scalar(JsonNode::Type::kNumber, std::to_string(value));
    }

    bool number_unsigned(number_unsigned_t value) override {
        return scalar(JsonNode::Type::kNumber, std::to_string(value));
    }

    // A number keeps its text: numeric columns take it exactly. One that no double holds is
    // canonical too; such a row does not travel down (row_travels), a replica may read it as one.
    bool number_float(number_float_t, const string_t& lexeme) override {
        return scalar(JsonNode::Type::kNumber, lexeme);
    }

    bool string(string_t& value) override {
        check_string_length(value, "string");
        return scalar(JsonNode::Type::kString, std::move(value));
    }

    bool binary(binary_t&) override { return false; }  // only binary formats produce these

    bool start_object(std::size_t) override { return start_container(true); }

    bool key(string_t& key) override {
        check_string_length(key, "key");
        if (payload_.empty()) {
            envelope_.back().pending_key = std::move(key);
        } else {
            payload_.back().pending_key = std::move(key);
        }
        return true;
    }

    bool end_object() override {
        if (payload_.empty()) {
            EnvelopeFrame frame = std::move(envelope_.back());
            envelope_.pop_back();
            sort_and_check_keys(
                frame.node.members,
                [](const JsonMember& member) -> const std::string& { return member.key; });
            deliver_node(std::move(frame.node));
            return true;
        }
        PayloadFrame frame = std::move(payload_.back());
        payload_.pop_back();
        sort_and_check_keys(
            frame.members,
            [](const std::pair<std::string, std::string>& member) -> const std::string& {
                return member.first;
            });
        std::string text;
        append_json_object(text, frame.members);
        deliver_payload(std::move(text));
        return true;
    }

    bool start_array(std::size_t) override { return start_container(false); }

    bool end_array() override {
        if (payload_.empty()) {
            JsonNode node = std::move(envelope_.back().node);
            envelope_.pop_back();
            deliver_node(std::move(node));
            return true;
        }
        std::string text = std::move(payload_.back().text);
        payload_.pop_back();
        text += ']';
        deliver_payload(std::move(text));
        return true;
    }

    bool parse_error(std::size_t, const std::string&,
                     const nlohmann::detail::exception& error) override {
        // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep line, column and cause.
        std::string_view what = error.what();
        size_t prefix_end = what.find("] ");
        if (prefix_end != std::string_view::npos) what.remove_prefix(prefix_end + 2);
        throw DecodeError("invalid JSON: " + printable(what));
    }

  private:
    struct EnvelopeFrame {
        JsonNode node;
        std::string pending_key;
        bool is_array_element = false;
    };

    struct PayloadFrame {
        bool is_object = false;
        std::string text;  // arrays: "[" and the items so far
        std::vector<std::pair<std::string, std::string>> members;  // objects: key, canonical value
        std::string pending_key;
    };

    bool inside_payload() const { return !payload_.empty() || value_starts_payload(); }

    bool value_starts_payload() const {
        if (placement_ == PayloadPlacement::kWholeDocument) return envelope_.empty();
        if (envelope_.empty()) return false;
        if (placement_ == PayloadPlacement::kMemberValues)
            return envelope_.size() == 1 && envelope_.back().node.type == JsonNode::Type::kObject;
        const EnvelopeFrame& parent = envelope_.back();
        return parent.node.type == JsonNode::Type::kObject && parent.is_array_element &&
               (parent.pending_key == "k" || parent.pending_key == "r");
    }

    bool scalar(JsonNode::Type type, std::string text) {
        if (!inside_payload()) {
            JsonNode node;
            node.type = type;
            node.text = std::move(text);
            deliver_node(std::move(node));
        } else if (type == JsonNode::Type::kString) {
            std::string quoted;
            append_json_string(quoted, text);
            deliver_payload(std::move(quoted));
        } else {
            deliver_payload(std::move(text));
        }
        return true;
    }

    bool start_container(bool is_object) {
        if (envelope_.size() + payload_.size() >= static_cast<size_t>(limits_.max_depth)) {
            throw DecodeError("nesting deeper than " + std::to_string(limits_.max_depth) +
                              " levels");
        }
        if (inside_payload()) {
            PayloadFrame frame;
            frame.is_object = is_object;
            if (!is_object) frame.text = "[";
            payload_.push_back(std::move(frame));
            return true;
        }
        EnvelopeFrame frame;
        frame.node.type = is_object ? JsonNode::Type::kObject : JsonNode::Type::kArray;
        frame.is_array_element =
            !envelope_.empty() && envelope_.back().node.type == JsonNode::Type::kArray;
        envelope_.push_back(std::move(frame));
        return true;
    }

    void deliver_node(JsonNode node) {
        if (envelope_.empty()) {
            result_ = std::move(node);
            return;
        }
        EnvelopeFrame& parent = envelope_.back();
        if (parent.node.type == JsonNode::Type::kArray) {
            // Rows are objects in lists: a bound on them while parsing keeps memory bounded
            // (the exact count of rows against max_rows is the caller's, on the whole message).
            if (node.type == JsonNode::Type::kObject && ++objects_in_lists_ > max_objects()) {
                throw DecodeError("lists of more than " + std::to_string(max_objects()) +
                                  " entries (rows: at most " + std::to_string(limits_.max_rows) +
                                  ")");
            }
            parent.node.items.push_back(std::move(node));
        } else {
            parent.node.members.push_back({std::move(parent.pending_key), std::move(node)});
        }
    }

    void deliver_payload(std::string text) {
        if (payload_.empty()) {
            JsonNode node;
            node.type = JsonNode::Type::kPayload;
            node.text = std::move(text);
            deliver_node(std::move(node));
            return;
        }
        PayloadFrame& parent = payload_.back();
        if (parent.is_object) {
            parent.members.emplace_back(std::move(parent.pending_key), std::move(text));
        } else {
            if (parent.text.size() > 1) parent.text += ',';
            parent.text += text;
        }
    }

    void check_string_length(const std::string& value, const char* what) const {
        if (value.size() > limits_.max_string) {
            throw DecodeError(std::string(what) + " of " + std::to_string(value.size()) +
                              " bytes, over the limit of " + std::to_string(limits_.max_string));
        }
    }

    template <typename Member, typename KeyOf>
    static void sort_and_check_keys(std::vector<Member>& members, KeyOf key_of) {
        std::sort(members.begin(), members.end(),
                  [&](const Member& a, const Member& b) { return key_of(a) < key_of(b); });
        auto duplicate = std::adjacent_find(
            members.begin(), members.end(),
            [&](const Member& a, const Member& b) { return key_of(a) == key_of(b); });
        if (duplicate != members.end()) {
            throw DecodeError("duplicate key " + quoted_excerpt(key_of(*duplicate)));
        }
    }

    // Rows, and the lists around them (chunks), with room to spare.
    size_t max_objects() const { return 2 * limits_.max_rows + 1024; }

    const Limits& limits_;
    size_t objects_in_lists_ = 0;
    PayloadPlacement placement_;
    std::vector<EnvelopeFrame> envelope_;
    std::vector<PayloadFrame> payload_;
    JsonNode result_;
};

}  // namespace

JsonNode parse_json_tree(std::string_view text, const Limits& limits, PayloadPlacement placement) {
    // nlohmann's lexer takes a NUL byte for the end of the input (as in a C string), so a message
    // followed by a NUL and anything at all would parse as the message alone. JSON has no NUL
    // outside strings, and none unescaped in them.
    if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
        throw DecodeError("invalid JSON: a NUL byte at offset " + std::to_string(nul));
    }
    TreeBuilder builder(limits, placement);
    Json::sax_parse(text.data(), text.data() + text.size(), &builder);
    return builder.take_result();
}

const JsonNode* find_member(const JsonNode& object, std::string_view key) {
    auto found = std::lower_bound(
        object.members.begin(), object.members.end(), key,
        [](const JsonMember& member, std::string_view wanted) { return member.key < wanted; });
    if (found == object.members.end() || found->key != key) return nullptr;
    return &found->value;
}

std::string quoted_excerpt(std::string_view text) {
    constexpr size_t kMaxBytes = 64;
    size_t cut = std::min(text.size(), kMaxBytes);
    while (cut < text.size() && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) {
        --cut;  // back to the start of the character that crosses the cut
    }
    std::string quoted;
    append_json_string(quoted, text.substr(0, cut));
    return cut < text.size() ? quoted + "..." : quoted;
}

}  // namespace magic_sync::protocol
