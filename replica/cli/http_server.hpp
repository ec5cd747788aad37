// A small HTTP/1.1 server for `serve`: enough for the sender's http transport (libcurl POSTs with
// Content-Length or chunked bodies, Expect: 100-continue, keep-alive). One thread per connection;
// the handler is called for every request and must be safe to call from several threads.
// (The cpp-httplib Debian ships is a compiled library the build does not link.)
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>

#include "program/text.hpp"

namespace magic_sync::replica {

struct HttpRequest {
    std::string method;
    std::string path;
    std::map<std::string, std::string> headers;  // names in lowercase
    std::string body;
};

struct HttpResponse {
    int status = 200;
    std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// Header names and values compared without case.
using program::lowercase;

class HttpServer {
  public:
    // Binds and listens at once; throws std::runtime_error when it cannot.
    HttpServer(const std::string& host, int port, size_t max_body, HttpHandler handler);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Serves until `stop` becomes true, then waits for the connections' threads to finish.
    void run(const std::atomic<bool>& stop);

  private:
    void serve_connection(int fd, const std::atomic<bool>& stop);

    int listener_ = -1;
    size_t max_body_;
    HttpHandler handler_;
};

// Splits "HOST:PORT"; throws std::invalid_argument when it is not that.
std::pair<std::string, int> parse_listen_address(const std::string& address);

}  // namespace magic_sync::replica
