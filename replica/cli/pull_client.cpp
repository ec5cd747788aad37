#include "cli/pull_client.hpp"

#include <curl/curl.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "cli/log.hpp"
#include "protocol/gzip.hpp"

namespace magic_sync::replica {

namespace {

constexpr std::chrono::milliseconds kFirstBackoff{500};
constexpr std::chrono::milliseconds kLongestBackoff{30000};
// Longer than any --wait a sender would use: the sender answers a long poll first.
constexpr long kRequestTimeoutSeconds = 120;

struct Answer {
    long status = 0;
    std::string message_id;
    std::string body;
};

// The network failed (or we are stopping): nothing was answered.
struct Unanswered : std::runtime_error {
    using std::runtime_error::runtime_error;
};

size_t collect_body(char* data, size_t size, size_t count, void* body) {
    static_cast<std::string*>(body)->append(data, size * count);
    return size * count;
}

size_t collect_header(char* data, size_t size, size_t count, void* message_id) {
    const std::string line(data, size * count);
    const std::string name = "message-id:";
    if (line.size() > name.size()) {
        std::string lowered = line.substr(0, name.size());
        std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (lowered == name) {
            const size_t begin = line.find_first_not_of(" \t", name.size());
            const size_t end = line.find_last_not_of(" \t\r\n");
            if (begin != std::string::npos && end >= begin)
                *static_cast<std::string*>(message_id) = line.substr(begin, end - begin + 1);
        }
    }
    return size * count;
}

// Aborts a transfer (a long poll included) once we are stopping.
int abort_when_stopping(void* stop, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return *static_cast<const std::atomic<bool>*>(stop) ? 1 : 0;
}

const std::atomic<bool> kNeverStop{false};

// One request to the sender, with the device's token; `body` null for a GET.
Answer request(const PullSettings& settings, const std::string& path, const std::string* body,
               const std::atomic<bool>& stop) {
    std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> easy(curl_easy_init(), curl_easy_cleanup);
    if (!easy) throw Unanswered("curl_easy_init failed");
    const std::string url = settings.url + path;
    const std::string authorization = "Authorization: Bearer " + settings.token;
    std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(
        curl_slist_append(nullptr, authorization.c_str()), curl_slist_free_all);
    // A gateway run with --gzip then sends heads gzip; Replica::apply inflates them (within the
    // bound on a message), so curl is not asked to.
    if (body == nullptr) curl_slist_append(headers.get(), "Accept-Encoding: gzip");
    // An upload GzipUpRoute compressed says so (the gateway refuses any other encoding).
    if (body != nullptr && protocol::is_gzip(*body))
        curl_slist_append(headers.get(), "Content-Encoding: gzip");
    Answer answer;
    CURL* handle = easy.get();
    curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(handle, CURLOPT_WRITEDATA, &answer.body);
    curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, collect_header);
    curl_easy_setopt(handle, CURLOPT_HEADERDATA, &answer.message_id);
    curl_easy_setopt(handle, CURLOPT_TIMEOUT, kRequestTimeoutSeconds);
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, abort_when_stopping);
    curl_easy_setopt(handle, CURLOPT_XFERINFODATA, &stop);
    if (body != nullptr) {
        curl_easy_setopt(handle, CURLOPT_POST, 1L);
        curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body->data());
        curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE,
                         static_cast<curl_off_t>(body->size()));
    }
    const CURLcode code = curl_easy_perform(handle);
    if (code != CURLE_OK) throw Unanswered(curl_easy_strerror(code));
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &answer.status);
    return answer;
}

std::string trimmed(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
}

// Sleeps `wait`, or less when we are stopping.
void pause(std::chrono::milliseconds wait, const std::atomic<bool>& stop) {
    const auto until = std::chrono::steady_clock::now() + wait;
    while (!stop && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

PullUpRoute::PullUpRoute(PullSettings settings) : settings_(std::move(settings)) {}

std::string PullUpRoute::send(const std::string& replica_id, const std::string& body) {
    Answer answer;
    try {
        answer = request(settings_, "/replicas/" + replica_id + "/up", &body, kNeverStop);
    } catch (const Unanswered& error) {
        throw UpRouteError(std::string("the up route did not answer: ") + error.what());
    }
    if (answer.status != 200)
        throw UpRouteError("the up route answered " + std::to_string(answer.status) + ": " +
                           trimmed(answer.body));
    return trimmed(answer.body);
}

void consume_pull(Replica& replica, const PullSettings& settings, const std::atomic<bool>& stop,
                  const std::function<void()>& applied) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const std::string base = "/replicas/" + replica.id();
    std::chrono::milliseconds backoff = kFirstBackoff;
    bool failing = false;
    long taken = 0;
    // One line when asking starts failing, not one per try; the wait doubles while it fails.
    const auto failed = [&](const std::string& why) {
        if (!failing) log("cannot take messages, will retry: " + why);
        failing = true;
        pause(backoff, stop);
        backoff = std::min(backoff * 2, kLongestBackoff);
    };
    while (!stop) {
        Answer next;
        try {
            next = request(settings, base + "/next", nullptr, stop);
        } catch (const Unanswered& error) {
            if (!stop) failed(error.what());
            continue;
        }
        if (next.status == 204) continue;  // nothing came within the sender's wait: ask again
        if (next.status != 200) {
            failed("GET next answered " + std::to_string(next.status) + ": " + trimmed(next.body));
            continue;
        }
        if (failing) log("taking messages again");
        failing = false;
        backoff = kFirstBackoff;
        ApplyResult result;
        try {
            result = replica.apply(next.body);
        } catch (const std::exception& error) {
            // Not acknowledged: it is the head again at the next ask.
            failed("message " + next.message_id + " not applied: " + error.what());
            continue;
        }
        log("message " + next.message_id + ": " + outcome_name(result.outcome));
        if (result.outcome == Outcome::kApplied) applied();
        if (!result.taken()) {
            // Never acknowledged, so never lost: it stays the head (an unknown protocol version
            // applies after an upgrade). The refusal is recorded on the server (the operator sees
            // it as a push transport's), and the head asked for again after a wait.
            failed("message " + next.message_id + " refused: " + result.detail);
            try {
                const std::string why =
                    std::string(outcome_name(result.outcome)) + ": " + result.detail;
                request(settings, base + "/refused/" + next.message_id, &why, kNeverStop);
            } catch (const Unanswered& error) {
                log("refusal of " + next.message_id + " not recorded: " + error.what());
            }
            continue;
        }
        if (settings.die_before_ack && ++taken == *settings.die_before_ack) {
            log("test fault: dying before acknowledging message " + next.message_id);
            raise(SIGKILL);
        }
        try {
            const std::string ack_body;
            Answer ack = request(settings, base + "/ack/" + next.message_id, &ack_body, kNeverStop);
            // 409: not the head any more (acknowledged before, or the replica was provisioned
            // again): nothing to do but ask for the head.
            if (ack.status != 200 && ack.status != 409)
                failed("ack of " + next.message_id + " answered " + std::to_string(ack.status));
        } catch (const Unanswered& error) {
            failed("ack of " + next.message_id + " not answered: " + error.what());
        }
    }
}

}  // namespace magic_sync::replica
