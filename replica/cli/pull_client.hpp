// Takes the sender's pull transport (magic-sync-sender --transport pull), for a device the sender
// cannot reach: asks GET <url>/replicas/<id>/next (a long poll), applies the message, then
// acknowledges it with POST <url>/replicas/<id>/ack/<message-id>, with its bearer token. A
// message not acknowledged (the device died, the ack was lost) is its head again at the next ask,
// and is recognised as applied.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "lib/replica.hpp"
#include "lib/up_route.hpp"

namespace magic_sync::replica {

struct PullSettings {
    std::string url;  // the sender's base URL, e.g. http://127.0.0.1:8300
    std::string token;
    // Test fault: after applying this many messages, die (SIGKILL) before acknowledging the last.
    std::optional<long> die_before_ack;
};

// Runs until `stop`; `applied` is called after each message that committed a change. Backs off
// while the sender cannot be reached or answers an error.
void consume_pull(Replica& replica, const PullSettings& settings, const std::atomic<bool>& stop,
                  const std::function<void()>& applied);

// Uploads through the same sender: POST <url>/replicas/<id>/up, answered 200 with sync.receive's
// answer; any other answer, or none, means send it again.
class PullUpRoute : public UpRoute {
  public:
    explicit PullUpRoute(PullSettings settings);
    std::string send(const std::string& replica_id, const std::string& body) override;

  private:
    PullSettings settings_;
};

}  // namespace magic_sync::replica
