// A connection of a test's own to an HTTP server (the pull gateway), written and read byte by
// byte as a hostile or careless client would.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace magic_sync::test {

class Raw {
  public:
    explicit Raw(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<uint16_t>(port));
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
            throw std::runtime_error("cannot connect to the gateway");
    }
    ~Raw() { close(fd_); }
    Raw(const Raw&) = delete;
    Raw& operator=(const Raw&) = delete;

    bool write(const std::string& bytes) {
        return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(bytes.size());
    }
    // What the gateway sends within `wait`, until it closes the connection.
    std::string read_until_closed(std::chrono::milliseconds wait) {
        std::string got;
        const auto deadline = std::chrono::steady_clock::now() + wait;
        pollfd readable{fd_, POLLIN, 0};
        char buffer[4096];
        while (std::chrono::steady_clock::now() < deadline) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            if (poll(&readable, 1, static_cast<int>(left.count())) <= 0) break;
            const ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
            if (n <= 0) {
                closed_ = true;
                break;
            }
            got.append(buffer, static_cast<size_t>(n));
        }
        return got;
    }
    bool closed() const { return closed_; }

  private:
    int fd_;
    bool closed_ = false;
};

// The status line of an answer.
inline std::string status_line(const std::string& answer) {
    return answer.substr(0, answer.find("\r\n"));
}

}  // namespace magic_sync::test
