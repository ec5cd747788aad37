#include "nats_transport.hpp"

#include <algorithm>
#include <stdexcept>

#include "log.hpp"
#include "program/nats_servers.hpp"

namespace magic_sync::sender {

// JetStream dedupes by Nats-Msg-Id across the whole stream within its duplicate window. Message
// ids repeat across replicas, and across histories: after a point-in-time recovery or a
// re-created extension a replica's messages are numbered again, so "<gen>.<seq>" names another
// message, which the window would drop as a resend. The stream's id names the replica and the
// history (the origin) too.
std::string stream_message_id(const Delivery& delivery) {
    return delivery.replica + "." + delivery.message_id + "@" + delivery.origin;
}

namespace {

void check(natsStatus status, const std::string& what) {
    if (status != NATS_OK)
        throw std::runtime_error(what + ": " + natsStatus_GetText(status) + " " +
                                 nats_GetLastError(nullptr));
}

}  // namespace

Outcome nats_outcome(natsStatus status, jsErrCode code, const std::string& text) {
    std::string why = std::string("nats: ") + natsStatus_GetText(status);
    if (code != 0) why += " (JetStream " + std::to_string(code) + ")";
    if (!text.empty()) why += ": " + text;
    // Only a message the stream can never take is refused; the rest (timeouts, no stream for the
    // subject yet, a full stream, a lost connection) can pass later.
    if (status == NATS_MAX_PAYLOAD || code == JSStreamMessageExceedsMaximumErr)
        return Outcome::refused(std::move(why));
    return Outcome::transient(std::move(why));
}

NatsTransport::NatsTransport(const NatsSettings& settings) : prefix_(settings.prefix) {
    // Publishes while the connection is away are buffered, or time out as transient failures:
    // sent again under the same Nats-Msg-Id, they are stored once.
    natsOptions* options = program::nats_options<log_line>(settings.url, "magic-sync-sender");
    natsOptions_SetSendAsap(options, true);
    const natsStatus connected = natsConnection_Connect(&connection_, options);
    natsOptions_Destroy(options);
    check(connected, "cannot connect to NATS at " + settings.url);

    jsOptions js_options;
    jsOptions_Init(&js_options);
    js_options.PublishAsync.MaxPending = settings.max_in_flight * 2;
    js_options.PublishAsync.AckHandler = &NatsTransport::acknowledged;
    js_options.PublishAsync.AckHandlerClosure = this;
    check(natsConnection_JetStream(&js_, connection_, &js_options), "JetStream context");
    if (settings.create_stream) create_stream(settings);
}

void NatsTransport::create_stream(const NatsSettings& settings) {
    jsStreamInfo* info = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    if (js_GetStreamInfo(&info, js_, settings.stream.c_str(), nullptr, &code) == NATS_OK) {
        const int replicas = std::max<int64_t>(info->Config->Replicas, 1);
        jsStreamInfo_Destroy(info);
        log_line("NATS stream " + settings.stream + " exists; left as it is" +
                 (replicas == settings.stream_replicas
                      ? std::string()
                      : " (on " + std::to_string(replicas) + " servers; --nats-replicas says " +
                            std::to_string(settings.stream_replicas) + ")"));
        return;
    }
    const std::string subjects = settings.prefix + ".>";
    const char* subject_list[] = {subjects.c_str()};
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    config.Name = settings.stream.c_str();
    config.Subjects = subject_list;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    config.Replicas = settings.stream_replicas;
    check(js_AddStream(&info, js_, &config, nullptr, &code),
          "cannot create NATS stream " + settings.stream);
    jsStreamInfo_Destroy(info);
    log_line("created NATS stream " + settings.stream + " (file storage, subjects " + subjects +
             ", " + std::to_string(settings.stream_replicas) + " replicas)");
}

NatsTransport::~NatsTransport() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        waiting_.clear();
    }
    // Messages published but not acknowledged yet are still the library's; it hands them back
    // here and nowhere else (their deliveries were given up above: a lease that ends sends them
    // again, and the stream drops a resend by its id).
    natsMsgList unacknowledged{};
    if (js_PublishAsyncGetPendingList(&unacknowledged, js_) == NATS_OK)
        natsMsgList_Destroy(&unacknowledged);
    jsCtx_Destroy(js_);
    natsConnection_Close(connection_);
    natsConnection_Destroy(connection_);
    // Waits for libnats' own threads, so no acknowledgement reaches this object once it is gone.
    nats_CloseAndWait(5000);
}

void NatsTransport::send(Delivery delivery, Done done) {
    const std::string subject = prefix_ + "." + delivery.replica;
    natsMsg* message = nullptr;
    natsStatus status = natsMsg_Create(&message, subject.c_str(), nullptr, delivery.bytes.data(),
                                       static_cast<int>(delivery.bytes.size()));
    if (status != NATS_OK) {
        done(nats_outcome(status, static_cast<jsErrCode>(0), "cannot create the message"));
        return;
    }
    natsMsgHeader_Set(message, "message-id", delivery.message_id.c_str());
    if (!delivery.content_encoding.empty())
        natsMsgHeader_Set(message, "Content-Encoding", delivery.content_encoding.c_str());
    const std::string key = stream_message_id(delivery);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        waiting_[key] = std::move(done);
    }
    jsPubOptions options;
    jsPubOptions_Init(&options);
    options.MsgId = key.c_str();
    options.MaxWait = static_cast<int64_t>(delivery.timeout.count());
    status = js_PublishMsgAsync(js_, &message, &options);
    natsMsg_Destroy(message);  // a no-op when the library took it
    if (status != NATS_OK) {
        Done failed;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const auto found = waiting_.find(key);
            if (found == waiting_.end()) return;
            failed = std::move(found->second);
            waiting_.erase(found);
        }
        failed(nats_outcome(status, static_cast<jsErrCode>(0), nats_GetLastError(nullptr)));
    }
}

void NatsTransport::acknowledged(jsCtx*, natsMsg* message, jsPubAck* ack, jsPubAckErr* error,
                                 void* closure) {
    auto* transport = static_cast<NatsTransport*>(closure);
    const char* id = nullptr;
    natsMsgHeader_Get(message, "Nats-Msg-Id", &id);
    const std::string key = id == nullptr ? "" : id;
    Done done;
    {
        std::lock_guard<std::mutex> lock(transport->mutex_);
        const auto found = transport->waiting_.find(key);
        if (found != transport->waiting_.end()) {
            done = std::move(found->second);
            transport->waiting_.erase(found);
        }
    }
    natsMsg_Destroy(message);
    if (!done) return;
    if (ack != nullptr) {
        done(Outcome::taken());
    } else if (error != nullptr) {
        done(nats_outcome(error->Err, error->ErrCode,
                          error->ErrText == nullptr ? "" : error->ErrText));
    } else {
        done(Outcome::transient("nats: no acknowledgement"));
    }
}

}  // namespace magic_sync::sender
