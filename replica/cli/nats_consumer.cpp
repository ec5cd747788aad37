#include "cli/nats_consumer.hpp"

#include <nats/nats.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "cli/log.hpp"
#include "program/nats_servers.hpp"

namespace magic_sync::replica {

namespace {

constexpr int64_t kNanosPerMilli = 1000000;
constexpr int64_t kFetchWaitMillis = 1000;
// How long a delivered message stays unacknowledged before JetStream delivers it again: after a
// crash, the message that was in flight comes back after this. A redelivery while it is still
// being applied is harmless (it is recognised as applied), so it can be short.
constexpr int64_t kAckWaitMillis = 5000;
// A message this build cannot read yet comes back later: after an upgrade it is applied.
constexpr int64_t kUnknownVersionDelayMillis = 30000;
constexpr int64_t kStorageRetryMillis = 1000;

std::string status_text(natsStatus status) {
    const char* detail = nats_GetLastError(nullptr);
    std::string text = natsStatus_GetText(status);
    if (detail != nullptr && *detail != '\0') text += std::string(" (") + detail + ")";
    return text;
}

void pause_unless_stopped(const std::atomic<bool>& stop, std::chrono::milliseconds how_long) {
    auto until = std::chrono::steady_clock::now() + how_long;
    while (!stop && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

struct NatsHandles {
    natsOptions* options = nullptr;
    natsConnection* connection = nullptr;
    jsCtx* jetstream = nullptr;
    natsSubscription* subscription = nullptr;

    ~NatsHandles() {
        natsSubscription_Destroy(subscription);
        jsCtx_Destroy(jetstream);
        natsConnection_Destroy(connection);
        natsOptions_Destroy(options);
    }
};

// Applies one delivered message and answers JetStream: ack once committed or never applicable
// again, term what can never be applied, nak (later) what may be applied later.
void handle(Replica& replica, natsMsg* message, const std::function<void()>& applied) {
    const char* id = nullptr;
    if (natsMsgHeader_Get(message, "Nats-Msg-Id", &id) != NATS_OK) id = "?";
    std::string_view body(natsMsg_GetData(message),
                          static_cast<size_t>(natsMsg_GetDataLength(message)));
    ApplyResult result;
    try {
        result = replica.apply(body);
    } catch (const std::exception& error) {
        log(std::string("message ") + id + " not applied, will retry: " + error.what());
        natsMsg_NakWithDelay(message, kStorageRetryMillis * kNanosPerMilli, nullptr);
        return;
    }
    log(std::string("message ") + id + ": " + outcome_name(result.outcome) +
        (result.detail.empty() ? "" : " (" + result.detail + ")") +
        (result.untaken ? ", " + std::to_string(result.untaken) + " rows untaken" : ""));
    if (result.taken()) {
        jsErrCode error_code{};
        natsStatus status = natsMsg_AckSync(message, nullptr, &error_code);
        // Not fatal: the message comes again and is then recognised as applied.
        if (status != NATS_OK) log("ack of " + std::string(id) + " failed: " + status_text(status));
        if (result.outcome == Outcome::kApplied) applied();
    } else if (result.outcome == Outcome::kUnknownVersion) {
        natsMsg_NakWithDelay(message, kUnknownVersionDelayMillis * kNanosPerMilli, nullptr);
    } else {
        natsMsg_Term(message, nullptr);
    }
}

}  // namespace

std::string durable_name(const std::string& prefix, const std::string& replica_id) {
    std::string name = prefix + "_" + replica_id;
    for (char& c : name) {
        if (c == '.' || c == '*' || c == '>' || c == ' ') c = '_';
    }
    return name;
}

void consume_nats(Replica& replica, const NatsSettings& settings, const std::atomic<bool>& stop,
                  const std::function<void()>& applied) {
    NatsHandles nats;
    try {
        // Once connected, the connection comes back by itself, to any server of the cluster.
        nats.options =
            program::nats_options<log>(settings.url, "magic-sync-replica " + replica.id());
    } catch (const std::invalid_argument& error) {
        throw std::runtime_error(std::string("bad NATS URL: ") + error.what());
    }

    bool said = false;
    while (!stop) {
        natsStatus status = natsConnection_Connect(&nats.connection, nats.options);
        if (status == NATS_OK) break;
        if (!said)
            log("cannot connect to " + settings.url + ", will retry: " + status_text(status));
        said = true;
        pause_unless_stopped(stop, std::chrono::milliseconds(1000));
    }
    if (stop) return;
    if (natsConnection_JetStream(&nats.jetstream, nats.connection, nullptr) != NATS_OK) {
        throw std::runtime_error("no JetStream context on " + settings.url);
    }

    const std::string subject = settings.prefix + "." + replica.id();
    const std::string durable = durable_name(settings.prefix, replica.id());
    jsSubOptions options;
    jsSubOptions_Init(&options);
    if (!settings.stream.empty()) options.Stream = settings.stream.c_str();
    options.Config.AckPolicy = js_AckExplicit;
    options.Config.DeliverPolicy = js_DeliverAll;
    options.Config.MaxAckPending = 1;
    options.Config.AckWait = kAckWaitMillis * kNanosPerMilli;
    said = false;
    while (!stop) {
        jsErrCode error_code{};
        natsStatus status = js_PullSubscribe(&nats.subscription, nats.jetstream, subject.c_str(),
                                             durable.c_str(), nullptr, &options, &error_code);
        if (status == NATS_OK) break;
        // Usually the stream is not there yet: the sender makes it when it first publishes.
        if (!said) {
            log("cannot consume " + subject + " yet, will retry: " + status_text(status));
        }
        said = true;
        pause_unless_stopped(stop, std::chrono::milliseconds(1000));
    }
    if (stop) return;
    log("consuming " + subject + " as durable " + durable);

    said = false;
    while (!stop) {
        natsMsgList list{};
        jsErrCode error_code{};
        natsStatus status =
            natsSubscription_Fetch(&list, nats.subscription, 1, kFetchWaitMillis, &error_code);
        if (status == NATS_TIMEOUT) continue;
        if (status != NATS_OK) {
            if (!said) log("fetch failed, will retry: " + status_text(status));
            said = true;
            pause_unless_stopped(stop, std::chrono::milliseconds(500));
            continue;
        }
        said = false;
        for (int i = 0; i < list.Count; ++i) handle(replica, list.Msgs[i], applied);
        natsMsgList_Destroy(&list);
    }
}

}  // namespace magic_sync::replica
