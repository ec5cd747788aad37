// Receives the sender's nats transport: a durable JetStream pull consumer on <prefix>.<replica>
// with max_ack_pending = 1, so messages come one at a time in order; each is acknowledged only
// after its apply committed (a crash in between redelivers it, and it is recognised as applied).
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "lib/replica.hpp"

namespace magic_sync::replica {

struct NatsSettings {
    std::string url;  // one server's, or several separated by commas (the members of a cluster)
    std::string prefix = "magic_sync";
    std::string stream;  // empty: the stream whose subjects cover the replica's subject
};

// The consumer's durable name for a replica: <prefix>_<replica>, dots made underscores.
std::string durable_name(const std::string& prefix, const std::string& replica_id);

// Runs until `stop`; `applied` is called after each message that committed a change.
// Throws std::runtime_error when the settings cannot work (a bad URL or list of URLs).
void consume_nats(Replica& replica, const NatsSettings& settings, const std::atomic<bool>& stop,
                  const std::function<void()>& applied);

}  // namespace magic_sync::replica
