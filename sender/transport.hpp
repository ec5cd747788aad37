// How the sender hands a message to the other side. One class per transport (http, nats, exec);
// to add your own, implement `send`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace magic_sync::sender {

// One outbox message for one replica, as sync.next leased it.
struct Delivery {
    std::string replica;     // the replica's uuid, lowercase text
    int64_t seq = 0;         // the replica's message counter
    std::string message_id;  // "<gen>.<seq>": the same on every resend, so the other side dedupes
    std::string bytes;       // exactly what is to be sent
    // "gzip" when `bytes` are the message gzip-compressed (--gzip), for the transport to say so
    // (docs/PROTOCOL.md §10); empty when they are the message as it is.
    std::string content_encoding;
    std::string origin;                        // the history it was leased in (its header's origin)
    std::chrono::milliseconds timeout{30000};  // a send that takes longer is a transient failure
};

enum class Verdict {
    taken,      // the other side has it
    transient,  // sending again later can help (network, timeout, overload)
    refused,    // the other side said no; it is counted against the replica
};

struct Outcome {
    Verdict verdict = Verdict::transient;
    std::string error;  // why, for sync.replica.last_error; empty when taken

    static Outcome taken() { return {Verdict::taken, ""}; }
    static Outcome transient(std::string why) { return {Verdict::transient, std::move(why)}; }
    static Outcome refused(std::string why) { return {Verdict::refused, std::move(why)}; }
};

using Done = std::function<void(Outcome)>;

class Transport {
  public:
    virtual ~Transport() = default;

    // Starts delivering one message and returns without waiting for it: the sender has up to
    // --concurrency deliveries out at once, at most one per replica. Call `done` exactly once, from
    // any thread (also before returning), when the delivery ended, `delivery.timeout` included.
    // After the destructor returns `done` is not called any more: what was in flight is abandoned
    // and its lease expires.
    virtual void send(Delivery delivery, Done done) = 0;
};

}  // namespace magic_sync::sender
