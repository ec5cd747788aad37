#include "protocol/canonical.hpp"

#include <nlohmann/json.hpp>
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

void append_json_string(std::string& out, std::string_view value) {
    try {
        out += nlohmann::json(std::string(value))
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    } catch (const nlohmann::json::type_error& error) {
        // what() is "[json.exception.type_error.316] invalid UTF-8 byte at index ...".
        std::string_view cause = error.what();
        size_t prefix_end = cause.find("] ");
        if (prefix_end != std::string_view::npos) cause.remove_prefix(prefix_end + 2);
        throw std::invalid_argument("cannot write a JSON string that is not valid UTF-8: " +
                                    std::string(cause));
    }
}

}  // namespace magic_sync::protocol
