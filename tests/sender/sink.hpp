// A local HTTP sink of the tests' own (a small HTTP/1.1 server, a thread per connection): POST
// /replicas/<id> answered as told per replica (200, an error status, or hang until released),
// recording every request in arrival order and how many were in flight at once, per replica and in
// all.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sender/harness.hpp"

namespace magic_sync::test::sender {

constexpr int kHang = -1;

struct Received {
    std::string replica;
    std::string message_id;
    std::string body;
    std::string content_encoding;  // its header, when there was one
    int status = 0;                // as answered; 0 while hanging
    Clock::time_point at;          // answered (until then: arrived)
    Clock::time_point arrived;     // the request came in
};

class HttpSink {
  public:
    HttpSink() {
        listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        if (bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
            listen(listener_, 256) != 0 ||
            getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
            throw std::runtime_error("sink: cannot listen");
        port_ = ntohs(address.sin_port);
        acceptor_ = std::thread([this] { accept_connections(); });
    }
    ~HttpSink() {
        release_hangs();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
            for (int fd : connections_) shutdown(fd, SHUT_RDWR);
        }
        shutdown(listener_, SHUT_RDWR);
        acceptor_.join();
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [this] { return connections_.empty(); });
        lock.unlock();
        close(listener_);
    }
    HttpSink(const HttpSink&) = delete;
    HttpSink& operator=(const HttpSink&) = delete;

    std::string url() const {
        return "http://127.0.0.1:" + std::to_string(port_) + "/replicas/{replica}";
    }
    // How to answer a replica: an HTTP status or kHang; `times` first requests only (0: always).
    void answer(const std::string& replica, int status, int times = 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        answers_[replica] = Rule{status, times};
    }
    void delay(std::chrono::milliseconds each) {
        std::lock_guard<std::mutex> lock(mutex_);
        delay_ = each;
    }
    void release_hangs() {
        std::lock_guard<std::mutex> lock(mutex_);
        released_ = true;
        changed_.notify_all();
    }

    std::vector<Received> received() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return received_;
    }
    // The message ids a replica was sent, in arrival order, and those it answered 2xx to.
    std::vector<std::string> ids(const std::string& replica, bool taken_only) const {
        std::vector<std::string> ids;
        for (const Received& r : received())
            if (r.replica == replica && (!taken_only || (r.status >= 200 && r.status < 300)))
                ids.push_back(r.message_id);
        return ids;
    }
    size_t taken() const {
        size_t count = 0;
        for (const Received& r : received()) count += r.status >= 200 && r.status < 300;
        return count;
    }
    int most_at_once_per_replica() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return most_per_replica_;
    }
    int most_at_once() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return most_;
    }
    int in_flight() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return in_flight_;
    }

  private:
    struct Rule {
        int status = 200;
        int times = 0;
    };

    void accept_connections() {
        while (true) {
            const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
            std::lock_guard<std::mutex> lock(mutex_);
            if (fd < 0 || stopping_) {
                if (fd >= 0) close(fd);
                return;
            }
            connections_.insert(fd);
            // Detached, so a thread's memory goes when its connection ends; the destructor waits
            // for connections_ to empty.
            std::thread([this, fd] { serve(fd); }).detach();
        }
    }

    // Reads until `buffer` holds `size` bytes; false when the peer went away.
    static bool fill(int fd, std::string& buffer, size_t size) {
        char chunk[65536];
        while (buffer.size() < size) {
            const ssize_t n = read(fd, chunk, sizeof chunk);
            if (n <= 0) return false;
            buffer.append(chunk, static_cast<size_t>(n));
        }
        return true;
    }

    // HTTP/1.1 with keep-alive and Content-Length bodies: what libcurl sends.
    void serve(int fd) {
        std::string buffer;
        while (true) {
            size_t head_end = buffer.find("\r\n\r\n");
            bool open = true;
            while (open && head_end == std::string::npos) {
                open = fill(fd, buffer, buffer.size() + 1);
                head_end = buffer.find("\r\n\r\n");
            }
            if (!open) break;
            std::istringstream head(buffer.substr(0, head_end));
            std::string method, path, line;
            head >> method >> path;
            std::getline(head, line);
            std::map<std::string, std::string> headers;
            while (std::getline(head, line)) {
                const auto colon = line.find(':');
                if (colon == std::string::npos) continue;
                std::string name = line.substr(0, colon);
                for (char& c : name)
                    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                std::string value = line.substr(colon + 1);
                value.erase(0, value.find_first_not_of(' '));
                while (!value.empty() && (value.back() == '\r' || value.back() == ' '))
                    value.pop_back();
                headers[name] = value;
            }
            const size_t length =
                headers.count("content-length") ? std::stoul(headers["content-length"]) : 0;
            if (!fill(fd, buffer, head_end + 4 + length)) break;
            const std::string body = buffer.substr(head_end + 4, length);
            buffer.erase(0, head_end + 4 + length);
            const int status = handle(path.substr(path.rfind('/') + 1), headers["message-id"], body,
                                      headers["content-encoding"]);
            const std::string text =
                status == 200 ? "ok" : "answer " + std::to_string(status) + " from the sink";
            const std::string response = "HTTP/1.1 " + std::to_string(status) +
                                         " Sink\r\nContent-Type: text/plain\r\nContent-Length: " +
                                         std::to_string(text.size()) + "\r\n\r\n" + text;
            if (send(fd, response.data(), response.size(), MSG_NOSIGNAL) !=
                static_cast<ssize_t>(response.size()))
                break;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        connections_.erase(fd);
        close(fd);
        changed_.notify_all();
    }

    int handle(const std::string& replica, const std::string& message_id, const std::string& body,
               const std::string& content_encoding) {
        std::unique_lock<std::mutex> lock(mutex_);
        const size_t index = received_.size();
        const auto now = Clock::now();
        received_.push_back(Received{replica, message_id, body, content_encoding, 0, now, now});
        most_per_replica_ = std::max(most_per_replica_, ++in_flight_per_replica_[replica]);
        most_ = std::max(most_, ++in_flight_);
        int status = 200;
        auto rule = answers_.find(replica);
        if (rule != answers_.end()) {
            status = rule->second.status;
            if (rule->second.times > 0 && --rule->second.times == 0) answers_.erase(rule);
        }
        const auto delay = delay_;
        if (status == kHang) {
            changed_.wait_for(lock, 60s, [this] { return released_; });
            status = 503;
        } else if (delay > 0ms) {
            lock.unlock();
            std::this_thread::sleep_for(delay);
            lock.lock();
        }
        --in_flight_per_replica_[replica];
        --in_flight_;
        received_[index].status = status;
        received_[index].at = Clock::now();
        return status;
    }

    int listener_ = -1;
    int port_ = 0;
    std::thread acceptor_;
    bool stopping_ = false;
    std::set<int> connections_;
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    bool released_ = false;
    std::map<std::string, Rule> answers_;
    std::chrono::milliseconds delay_{0};
    std::vector<Received> received_;
    std::map<std::string, int> in_flight_per_replica_;
    int in_flight_ = 0;
    int most_per_replica_ = 0;
    int most_ = 0;
};

}  // namespace magic_sync::test::sender
