// The head of an HTTP/1.x request (its line and its headers), parsed by the pull gateway's event
// loop before it reads a byte of the body: what it may refuse on its headers alone.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace magic_sync::sender {

// The most a request's head may hold, and the most header lines: past either it is refused (431).
constexpr size_t kMaxHeadBytes = 16 * 1024;
constexpr size_t kMaxHeaderLines = 100;

struct HttpHead {
    std::string method;
    std::string path;  // the target without its query
    int minor_version = 1;
    std::vector<std::pair<std::string, std::string>> headers;  // names in lower case

    // The value of the first header of that name (lower case), when there is one.
    std::optional<std::string> header(const std::string& name) const;
    // Whether the connection stays open after the answer (HTTP/1.1 unless "close", HTTP/1.0
    // only with "keep-alive").
    bool keep_alive() const;
    // Whether Accept-Encoding (every header of that name) takes gzip: "gzip", "x-gzip" or "*",
    // and not with q=0.
    bool accepts_gzip() const;
};

// A head that cannot be served: the status to answer and why.
struct HeadRefusal {
    int status;
    std::string why;
};

// Where the head ends in `received` (the offset past its blank line), when it has ended.
std::optional<size_t> head_end(std::string_view received);

// Parses a head (its bytes up to and without the blank line). Throws HeadRefusal.
HttpHead parse_head(std::string_view head);

}  // namespace magic_sync::sender
