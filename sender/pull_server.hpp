// The pull transport (--transport pull): for devices the sender cannot reach (behind NAT), an
// HTTP server they ask instead, one queue per replica, its outbox:
//   GET  /replicas/{id}/next              its head message (header message-id), left at the head
//                                         until acknowledged; when there is none, answered as soon
//                                         as one arrives (NOTIFY magic_sync) or 204 after --wait
//   POST /replicas/{id}/ack/{message-id}  200 when that message was the head and is now taken,
//                                         409 when it names no current head (taken nothing)
//   POST /replicas/{id}/up                the body to sync.receive under that replica; 200 with
//                                         its answer
// Each device sends its own bearer token; --token-query maps it to the replica ids it may act for
// (401 without a token, 403 for another replica's). A statement that failed is answered 503 when
// asking again may help, 500 when it would fail the same way.
// One thread moves every connection's bytes (an epoll loop with deadlines for each step); a few
// worker threads, each with a database connection, run the statements and share the chunks of
// rows messages they fetched (sync.pull_head by reference); one more connection LISTENs and
// wakes the long polls. A waiting device costs a socket, not a thread.
#pragma once

#include <memory>
#include <string>

#include "options.hpp"

namespace magic_sync::sender {

class PullServer {
  public:
    // Checks the statements against the database (when it is there) and binds --listen; throws
    // std::runtime_error saying what to change when either cannot work.
    explicit PullServer(const Options& options);
    ~PullServer();
    PullServer(const PullServer&) = delete;
    PullServer& operator=(const PullServer&) = delete;

    // Serves until SIGTERM or SIGINT arrives on `signal_fd` (a signalfd). Returns the exit status.
    int run(int signal_fd);

  private:
    struct Serving;
    std::unique_ptr<Serving> serving_;
};

// The HTTP status for a statement that failed with `sqlstate` (empty when there is none): 503 when
// asking again may help (classes 08 connection, 40 rollback, 53 resources, 55 object state, 57
// operator intervention, or the connection lost), 409 for a replica another transport delivers
// (42809, from sync.pull_head), 500 when it would fail the same way.
int pull_failure_status(const std::string& sqlstate, bool connection_lost);

}  // namespace magic_sync::sender
