// Publishes each message to JetStream (libnats, asynchronous publish: many in flight on one
// connection) on <prefix>.<replica>, with the header message-id = the message id and
// Nats-Msg-Id = stream_message_id(), so the stream's duplicate window drops a resend. Taken when
// the stream acknowledges it (a duplicate is taken too).
#pragma once

#include <nats/nats.h>

#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

#include "transport.hpp"

namespace magic_sync::sender {

struct NatsSettings {
    // One server's URL, or several separated by commas (the members of a cluster).
    std::string url = "nats://127.0.0.1:4222";
    std::string prefix = "magic_sync";
    std::string stream = "magic_sync";  // created when `create_stream`
    bool create_stream = false;
    int stream_replicas = 1;  // how many servers of a cluster hold the stream it creates
    int max_in_flight = 64;
};

class NatsTransport : public Transport {
  public:
    // Connects (and creates the stream when asked); throws std::runtime_error when it cannot.
    explicit NatsTransport(const NatsSettings& settings);
    ~NatsTransport() override;

    void send(Delivery delivery, Done done) override;

  private:
    static void acknowledged(jsCtx* js, natsMsg* message, jsPubAck* ack, jsPubAckErr* error,
                             void* closure);
    void create_stream(const NatsSettings& settings);

    const std::string prefix_;
    natsConnection* connection_ = nullptr;
    jsCtx* js_ = nullptr;
    std::mutex mutex_;
    // By Nats-Msg-Id, which the acknowledgement hands back with the message.
    std::unordered_map<std::string, Done> waiting_;
};

// "<replica>.<message id>@<origin>": unique in a stream that holds every replica's subject, and
// across histories, which number a replica's messages again.
std::string stream_message_id(const Delivery& delivery);

// The verdict on a failed JetStream publish.
Outcome nats_outcome(natsStatus status, jsErrCode code, const std::string& text);

}  // namespace magic_sync::sender
