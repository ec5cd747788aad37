#include "http_transport.hpp"

#include <algorithm>
#include <stdexcept>

namespace magic_sync::sender {

namespace {

constexpr size_t kKeptBody = 300;  // of an error answer, for last_error

size_t keep_body(char* data, size_t size, size_t count, void* target) {
    auto* body = static_cast<std::string*>(target);
    const size_t bytes = size * count;
    if (body->size() < kKeptBody) body->append(data, std::min(bytes, kKeptBody - body->size()));
    return bytes;
}

std::string with_replica(const std::string& url_template, const std::string& replica) {
    std::string url = url_template;
    const std::string placeholder = "{replica}";
    for (size_t at = url.find(placeholder); at != std::string::npos;
         at = url.find(placeholder, at + replica.size()))
        url.replace(at, placeholder.size(), replica);
    return url;
}

}  // namespace

struct HttpTransport::Request {
    Delivery delivery;
    Done done;
    std::string url;
    std::string body;
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    char error[CURL_ERROR_SIZE] = {};

    ~Request() {
        if (easy != nullptr) curl_easy_cleanup(easy);
        curl_slist_free_all(headers);
    }
};

Outcome http_outcome(long status, const std::string& body) {
    if (status >= 200 && status < 300) return Outcome::taken();
    std::string first_line = body.substr(0, body.find('\n'));
    std::string why =
        "HTTP " + std::to_string(status) + (first_line.empty() ? "" : ": " + first_line);
    // Only a 4xx says the message itself is wrong; 408 and 429 say "not now", and so does 422: the
    // device does not speak the message's protocol version yet (docs/PROTOCOL.md §10), and takes
    // it after its upgrade. A refusal would count toward magic_sync.max_refusals, which provisions
    // the replica again from scratch with messages it cannot read either: a fleet not yet
    // upgraded would be wiped over and over instead of waiting.
    if (status >= 400 && status < 500 && status != 408 && status != 429 && status != 422)
        return Outcome::refused(std::move(why));
    return Outcome::transient(std::move(why));
}

HttpTransport::HttpTransport(std::string url_template, int connections)
    : url_template_(std::move(url_template)) {
    static std::once_flag global;
    std::call_once(global, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    multi_ = curl_multi_init();
    if (multi_ == nullptr) throw std::runtime_error("curl_multi_init failed");
    curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, static_cast<long>(connections));
    worker_ = std::thread([this] { run(); });
}

HttpTransport::~HttpTransport() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    curl_multi_wakeup(multi_);
    worker_.join();
    for (const auto& request : running_) curl_multi_remove_handle(multi_, request->easy);
    running_.clear();
    curl_multi_cleanup(multi_);
}

void HttpTransport::send(Delivery delivery, Done done) {
    auto request = std::make_unique<Request>();
    request->url = with_replica(url_template_, delivery.replica);
    request->delivery = std::move(delivery);
    request->done = std::move(done);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        queued_.push_back(std::move(request));
    }
    curl_multi_wakeup(multi_);
}

void HttpTransport::start(std::unique_ptr<Request> request) {
    CURL* easy = curl_easy_init();
    if (easy == nullptr) {
        request->done(Outcome::transient("curl_easy_init failed"));
        return;
    }
    request->easy = easy;
    const Delivery& delivery = request->delivery;
    request->headers =
        curl_slist_append(request->headers, ("message-id: " + delivery.message_id).c_str());
    request->headers = curl_slist_append(request->headers, "content-type: application/json");
    if (!delivery.content_encoding.empty())
        request->headers = curl_slist_append(
            request->headers, ("content-encoding: " + delivery.content_encoding).c_str());
    // No "Expect: 100-continue" round trip before larger bodies.
    request->headers = curl_slist_append(request->headers, "Expect:");
    const long timeout_ms = static_cast<long>(delivery.timeout.count());
    curl_easy_setopt(easy, CURLOPT_URL, request->url.c_str());
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, request->headers);
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, delivery.bytes.data());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(delivery.bytes.size()));
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, keep_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &request->body);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, request->error);
    if (curl_multi_add_handle(multi_, easy) != CURLM_OK) {
        request->done(Outcome::transient("curl_multi_add_handle failed"));
        return;
    }
    running_.push_back(std::move(request));
}

void HttpTransport::finish(CURL* easy, CURLcode code) {
    curl_multi_remove_handle(multi_, easy);
    const auto found = std::find_if(running_.begin(), running_.end(),
                                    [easy](const auto& request) { return request->easy == easy; });
    if (found == running_.end()) return;
    std::unique_ptr<Request> request = std::move(*found);
    running_.erase(found);
    if (code == CURLE_OPERATION_TIMEDOUT) {
        request->done(Outcome::transient(
            "timeout after " + std::to_string(request->delivery.timeout.count()) + " ms"));
    } else if (code != CURLE_OK) {
        const std::string detail =
            request->error[0] != '\0' ? request->error : curl_easy_strerror(code);
        // Not the URL: it may hold credentials.
        request->done(Outcome::transient("network: " + detail));
    } else {
        long status = 0;
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        request->done(http_outcome(status, request->body));
    }
}

void HttpTransport::run() {
    while (true) {
        std::vector<std::unique_ptr<Request>> arrived;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) return;
            arrived.swap(queued_);
        }
        for (auto& request : arrived) start(std::move(request));
        int running = 0;
        curl_multi_perform(multi_, &running);
        int left = 0;
        while (CURLMsg* message = curl_multi_info_read(multi_, &left)) {
            if (message->msg == CURLMSG_DONE) finish(message->easy_handle, message->data.result);
        }
        curl_multi_poll(multi_, nullptr, 0, 1000, nullptr);
    }
}

}  // namespace magic_sync::sender
