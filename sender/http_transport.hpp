// POSTs each message to a URL (libcurl multi: every request on one worker thread, connections
// reused). 2xx taken; 408, 429, 5xx, network errors and timeouts transient; other 4xx refused.
#pragma once

#include <curl/curl.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport.hpp"

namespace magic_sync::sender {

class HttpTransport : public Transport {
  public:
    // `url_template`: {replica} is replaced by the replica's id. `connections`: how many to keep.
    HttpTransport(std::string url_template, int connections);
    ~HttpTransport() override;

    void send(Delivery delivery, Done done) override;

  private:
    struct Request;

    void run();
    void start(std::unique_ptr<Request> request);
    void finish(CURL* easy, CURLcode code);

    const std::string url_template_;
    CURLM* multi_ = nullptr;
    std::mutex mutex_;
    std::vector<std::unique_ptr<Request>> queued_;
    bool stopping_ = false;
    std::vector<std::unique_ptr<Request>> running_;  // only the worker touches it
    std::thread worker_;
};

// The verdict on an HTTP status (for tests and for other HTTP-like transports).
Outcome http_outcome(long status, const std::string& body);

}  // namespace magic_sync::sender
