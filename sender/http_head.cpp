#include "http_head.hpp"

#include <algorithm>
#include <cctype>

#include "program/text.hpp"

namespace magic_sync::sender {

namespace {

using program::lowercase;

std::string_view trimmed(std::string_view text) {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
    return text;
}

// RFC 9110's token characters: what a method and a header name are made of.
bool is_token(std::string_view text) {
    static const std::string_view extra = "!#$%&'*+-.^_`|~";
    return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) {
        return std::isalnum(c) || extra.find(static_cast<char>(c)) != std::string_view::npos;
    });
}

bool printable(std::string_view text) {
    return std::all_of(text.begin(), text.end(),
                       [](unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); });
}

}  // namespace

std::optional<std::string> HttpHead::header(const std::string& name) const {
    for (const auto& [key, value] : headers)
        if (key == name) return value;
    return std::nullopt;
}

bool HttpHead::keep_alive() const {
    const std::string connection = lowercase(header("connection").value_or(""));
    if (minor_version == 0) return connection == "keep-alive";
    return connection != "close";
}

bool HttpHead::accepts_gzip() const {
    for (const auto& [key, value] : headers) {
        if (key != "accept-encoding") continue;
        std::string_view list = value;
        while (!list.empty()) {
            const size_t comma = std::min(list.find(','), list.size());
            std::string_view coding = list.substr(0, comma);
            list.remove_prefix(std::min(comma + 1, list.size()));
            const size_t semicolon = std::min(coding.find(';'), coding.size());
            const std::string name = lowercase(trimmed(coding.substr(0, semicolon)));
            if (name != "gzip" && name != "x-gzip" && name != "*") continue;
            // A weight of zero ("q=0", "q=0.000") says not acceptable.
            const std::string parameter = lowercase(trimmed(coding.substr(semicolon)));
            const size_t q = parameter.find("q=");
            if (q == std::string::npos) return true;
            const std::string_view weight = std::string_view(parameter).substr(q + 2);
            if (weight.find_first_not_of("0.") != std::string_view::npos && !weight.empty())
                return true;
        }
    }
    return false;
}

std::optional<size_t> head_end(std::string_view received) {
    const size_t end = received.find("\r\n\r\n");
    if (end == std::string_view::npos) return std::nullopt;
    return end + 4;
}

HttpHead parse_head(std::string_view head) {
    HttpHead parsed;
    size_t line_end = head.find("\r\n");
    const std::string_view request_line = head.substr(0, line_end);
    const size_t first_space = request_line.find(' ');
    const size_t last_space = request_line.rfind(' ');
    if (first_space == std::string_view::npos || last_space == first_space)
        throw HeadRefusal{400, "a request line is METHOD TARGET HTTP/1.1"};
    parsed.method = std::string(request_line.substr(0, first_space));
    const std::string_view target =
        request_line.substr(first_space + 1, last_space - first_space - 1);
    const std::string_view version = request_line.substr(last_space + 1);
    if (!is_token(parsed.method) || target.empty() || target.front() != '/' ||
        target.find(' ') != std::string_view::npos || !printable(target))
        throw HeadRefusal{400, "a request line is METHOD TARGET HTTP/1.1"};
    if (version == "HTTP/1.1")
        parsed.minor_version = 1;
    else if (version == "HTTP/1.0")
        parsed.minor_version = 0;
    else
        throw HeadRefusal{505, "only HTTP/1.0 and HTTP/1.1 are served"};
    parsed.path = std::string(target.substr(0, target.find('?')));

    while (line_end != std::string_view::npos) {
        const size_t start = line_end + 2;
        line_end = head.find("\r\n", start);
        const std::string_view line = head.substr(start, line_end - start);
        if (line.empty()) continue;
        if (line.front() == ' ' || line.front() == '\t')
            throw HeadRefusal{400, "a header folded over lines is not taken"};
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos || !is_token(line.substr(0, colon)) ||
            !printable(line.substr(colon + 1)))
            throw HeadRefusal{400, "a header line is NAME: VALUE"};
        if (parsed.headers.size() == kMaxHeaderLines)
            throw HeadRefusal{431, "a request may carry " + std::to_string(kMaxHeaderLines) +
                                       " header lines at most"};
        parsed.headers.emplace_back(lowercase(line.substr(0, colon)),
                                    std::string(trimmed(line.substr(colon + 1))));
    }
    return parsed;
}

}  // namespace magic_sync::sender
