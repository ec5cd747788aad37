// The http transport's far end for tests and benchmarks: receives the sender's POSTs on one
// port and forwards each to its replica's own port; a cut replica is answered 503 (the line is
// down). An observer sees every delivery the replica took; the largest message sent to each
// replica is kept.
#pragma once

#include <httplib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/cluster.hpp"

namespace magic_sync::test {

class Router {
  public:
    // Forwards at once: more than a sender sends at once (--concurrency, 64 by default). With
    // cpp-httplib's default pool (8 threads on two cores) the router itself was what deliveries
    // waited for: 64 sends in flight, 8 forwarded.
    static constexpr size_t kThreads = 128;

    Router() : port_(free_port()) {
        server_.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
        server_.Post(R"(/replicas/([0-9a-f-]+))", [this](const httplib::Request& request,
                                                         httplib::Response& response) {
            std::string replica = request.matches[1];
            int port = 0;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                size_t& largest = largest_[replica];
                largest = std::max(largest, request.body.size());
                if (cut_.count(replica) || !ports_.count(replica)) {
                    response.status = 503;
                    return;
                }
                port = ports_[replica];
            }
            httplib::Client client("127.0.0.1", port);
            client.set_read_timeout(10, 0);
            httplib::Headers headers{{"message-id", request.get_header_value("message-id")}};
            auto result = client.Post(request.path.c_str(), headers, request.body,
                                      "application/octet-stream");
            response.status = result ? result->status : 503;
            if (result) response.body = result->body;
            if (result && result->status / 100 == 2) {
                std::lock_guard<std::mutex> lock(mutex_);
                if (observer_) observer_(replica, request.body);
            }
        });
        if (!server_.bind_to_port("127.0.0.1", port_))
            throw std::runtime_error("the router cannot listen on its port");
        thread_ = std::thread([this] { server_.listen_after_bind(); });
    }
    ~Router() {
        server_.stop();
        thread_.join();
    }
    int port() const { return port_; }
    void route(const std::string& replica, int port) {
        std::lock_guard<std::mutex> lock(mutex_);
        ports_[replica] = port;
    }
    // Called with (replica, message) for every message a replica took.
    void observe(std::function<void(const std::string&, const std::string&)> observer) {
        std::lock_guard<std::mutex> lock(mutex_);
        observer_ = std::move(observer);
    }
    void cut(const std::string& replica, bool down) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (down)
            cut_.insert(replica);
        else
            cut_.erase(replica);
    }

    // The size of the largest message body the sender sent each replica.
    std::map<std::string, size_t> largest() {
        std::lock_guard<std::mutex> lock(mutex_);
        return largest_;
    }

  private:
    int port_;
    httplib::Server server_;
    std::thread thread_;
    std::mutex mutex_;
    std::map<std::string, int> ports_;
    std::set<std::string> cut_;
    std::map<std::string, size_t> largest_;
    std::function<void(const std::string&, const std::string&)> observer_;
};

}  // namespace magic_sync::test
