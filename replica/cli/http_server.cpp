#include "cli/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "program/http_status.hpp"

namespace magic_sync::replica {

namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr auto kIdleLimit = std::chrono::seconds(120);
constexpr int kPollMilliseconds = 200;

// The connection is over: closed by the peer, idle too long, unreadable, or we are stopping.
struct ConnectionClosed {};

// An answer before the request was read whole; the connection closes after it.
struct BadRequest {
    int status;
    std::string why;
};

std::string trim(const std::string& text) {
    size_t begin = text.find_first_not_of(" \t");
    if (begin == std::string::npos) return {};
    size_t end = text.find_last_not_of(" \t\r");
    return text.substr(begin, end - begin + 1);
}

class Connection {
  public:
    Connection(int fd, const std::atomic<bool>& stop) : fd_(fd), stop_(stop) {}

    // Bytes up to and including `delimiter`, reading as needed; at most `limit` bytes.
    std::string read_through(const std::string& delimiter, size_t limit, int status) {
        while (true) {
            size_t found = buffer_.find(delimiter);
            if (found != std::string::npos) {
                std::string text = buffer_.substr(0, found + delimiter.size());
                buffer_.erase(0, found + delimiter.size());
                return text;
            }
            if (buffer_.size() > limit) throw BadRequest{status, "request too large"};
            read_more();
        }
    }

    std::string read_exactly(size_t count) {
        while (buffer_.size() < count) read_more();
        std::string text = buffer_.substr(0, count);
        buffer_.erase(0, count);
        return text;
    }

    void write_all(const std::string& bytes) {
        size_t written = 0;
        while (written < bytes.size()) {
            ssize_t n = ::send(fd_, bytes.data() + written, bytes.size() - written, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) throw ConnectionClosed{};
            written += static_cast<size_t>(n);
        }
    }

  private:
    void read_more() {
        auto idle_since = std::chrono::steady_clock::now();
        while (true) {
            if (stop_) throw ConnectionClosed{};
            pollfd poll_fd{fd_, POLLIN, 0};
            int ready = poll(&poll_fd, 1, kPollMilliseconds);
            if (ready < 0 && errno != EINTR) throw ConnectionClosed{};
            if (ready > 0) break;
            if (std::chrono::steady_clock::now() - idle_since > kIdleLimit)
                throw ConnectionClosed{};
        }
        char chunk[16384];
        ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
        if (n <= 0) throw ConnectionClosed{};
        buffer_.append(chunk, static_cast<size_t>(n));
    }

    int fd_;
    const std::atomic<bool>& stop_;
    std::string buffer_;
};

std::string response_text(const HttpResponse& response, bool keep_alive) {
    return "HTTP/1.1 " + std::to_string(response.status) + " " +
           program::reason_phrase(response.status) +
           "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
           std::to_string(response.body.size()) +
           "\r\nConnection: " + (keep_alive ? "keep-alive" : "close") + "\r\n\r\n" + response.body;
}

size_t parse_size(const std::string& text, int base, const std::string& what) {
    try {
        size_t used = 0;
        unsigned long long value = std::stoull(text, &used, base);
        if (used != text.size()) throw std::invalid_argument(what);
        return static_cast<size_t>(value);
    } catch (const std::exception&) {
        throw BadRequest{400, "bad " + what};
    }
}

// Reads the body the headers announce (Content-Length or chunked), at most `max_body` bytes.
std::string read_body(Connection& connection, const HttpRequest& request, size_t max_body) {
    auto encoding = request.headers.find("transfer-encoding");
    if (encoding != request.headers.end() && lowercase(encoding->second) != "identity") {
        if (lowercase(encoding->second) != "chunked") {
            throw BadRequest{400, "unsupported transfer-encoding"};
        }
        std::string body;
        while (true) {
            std::string line = connection.read_through("\r\n", 1024, 400);
            std::string size_text = trim(line.substr(0, line.find_first_of(";\r")));
            size_t size = parse_size(size_text, 16, "chunk size");
            if (size == 0) break;
            if (body.size() + size > max_body) throw BadRequest{413, "message too large"};
            body += connection.read_exactly(size);
            connection.read_exactly(2);  // the CRLF after the chunk
        }
        // Trailers, up to the empty line.
        while (connection.read_through("\r\n", kMaxHeaderBytes, 431) != "\r\n") {
        }
        return body;
    }
    auto length = request.headers.find("content-length");
    if (length == request.headers.end()) {
        if (request.method == "POST") throw BadRequest{411, "Content-Length required"};
        return {};
    }
    size_t size = parse_size(trim(length->second), 10, "Content-Length");
    if (size > max_body) throw BadRequest{413, "message too large"};
    return connection.read_exactly(size);
}

}  // namespace

std::pair<std::string, int> parse_listen_address(const std::string& address) {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
        throw std::invalid_argument("--listen wants HOST:PORT, got \"" + address + "\"");
    }
    std::string port_text = address.substr(colon + 1);
    int port = 0;
    try {
        size_t used = 0;
        port = std::stoi(port_text, &used);
        if (used != port_text.size()) port = -1;
    } catch (const std::exception&) {
        port = -1;
    }
    if (port < 0 || port > 65535) {
        throw std::invalid_argument("--listen has a bad port: \"" + port_text + "\"");
    }
    return {address.substr(0, colon), port};
}

HttpServer::HttpServer(const std::string& host, int port, size_t max_body, HttpHandler handler)
    : max_body_(max_body), handler_(std::move(handler)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
        throw std::runtime_error("cannot listen on " + host + ": not an IPv4 address");
    }
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int yes = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        listen(listener_, 64) != 0) {
        std::string why = std::strerror(errno);
        close(listener_);
        throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " +
                                 why);
    }
}

HttpServer::~HttpServer() { close(listener_); }

void HttpServer::run(const std::atomic<bool>& stop) {
    struct Worker {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    std::list<Worker> workers;
    while (!stop) {
        // Threads of connections that ended are joined as we go, so a long serve does not pile
        // them up.
        for (auto worker = workers.begin(); worker != workers.end();) {
            if (!*worker->done) {
                ++worker;
                continue;
            }
            worker->thread.join();
            worker = workers.erase(worker);
        }
        pollfd poll_fd{listener_, POLLIN, 0};
        if (poll(&poll_fd, 1, kPollMilliseconds) <= 0) continue;
        int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        auto done = std::make_shared<std::atomic<bool>>(false);
        workers.push_back(Worker{std::thread([this, fd, &stop, done] {
                                     serve_connection(fd, stop);
                                     close(fd);
                                     *done = true;
                                 }),
                                 done});
    }
    for (Worker& worker : workers) worker.thread.join();
}

void HttpServer::serve_connection(int fd, const std::atomic<bool>& stop) {
    Connection connection(fd, stop);
    try {
        while (true) {
            HttpRequest request;
            bool keep_alive = true;
            try {
                std::string head = connection.read_through("\r\n\r\n", kMaxHeaderBytes, 431);
                size_t line_end = head.find("\r\n");
                std::string line = head.substr(0, line_end);
                size_t first = line.find(' ');
                size_t second = line.find(' ', first + 1);
                if (first == std::string::npos || second == std::string::npos) {
                    throw BadRequest{400, "bad request line"};
                }
                request.method = line.substr(0, first);
                request.path = line.substr(first + 1, second - first - 1);
                std::string version = line.substr(second + 1);
                size_t at = line_end + 2;
                while (at < head.size() - 2) {
                    size_t end = head.find("\r\n", at);
                    std::string header = head.substr(at, end - at);
                    at = end + 2;
                    size_t colon = header.find(':');
                    if (colon == std::string::npos) throw BadRequest{400, "bad header line"};
                    request.headers[lowercase(header.substr(0, colon))] =
                        trim(header.substr(colon + 1));
                }
                auto connection_header = request.headers.find("connection");
                std::string wanted = connection_header == request.headers.end()
                                         ? ""
                                         : lowercase(connection_header->second);
                keep_alive = version == "HTTP/1.0" ? wanted == "keep-alive" : wanted != "close";
                auto expect = request.headers.find("expect");
                if (expect != request.headers.end() &&
                    lowercase(expect->second) == "100-continue") {
                    connection.write_all("HTTP/1.1 100 Continue\r\n\r\n");
                }
                request.body = read_body(connection, request, max_body_);
            } catch (const BadRequest& bad) {
                connection.write_all(
                    response_text(HttpResponse{bad.status, bad.why + "\n"}, false));
                return;
            }
            HttpResponse response;
            try {
                response = handler_(request);
            } catch (const std::exception& error) {
                response = HttpResponse{500, std::string(error.what()) + "\n"};
            }
            connection.write_all(response_text(response, keep_alive));
            if (!keep_alive) return;
        }
    } catch (const ConnectionClosed&) {
    }
}

}  // namespace magic_sync::replica
