// The pull gateway (magic-sync-sender --transport pull) as a real process, asked over HTTP as a
// device would.
#pragma once

#include <httplib.h>

#include <string>
#include <vector>

#include "sender/harness.hpp"
#include "support/pull_gateway.hpp"
#include "support/raw_connection.hpp"

namespace magic_sync::test::sender {

// The devices' tokens: replica n's is "token-n", in a table the sender's role may read.
constexpr const char* kTokenQuery = "SELECT replica FROM public.device_token WHERE token = $1";

class PullSender {
  public:
    PullSender(const Outbox& outbox, const TempDir& dir, const std::string& wait_seconds,
               const std::string& conninfo = "", const std::vector<std::string>& options = {})
        : port_(free_port()),
          tokens_(outbox.sql(
              "CREATE TABLE IF NOT EXISTS public.device_token (token text PRIMARY KEY, "
              "replica uuid);"
              "INSERT INTO public.device_token SELECT 'token-' || right(id::text, 1), id "
              "FROM sync.replica ON CONFLICT DO NOTHING;"
              "GRANT SELECT ON public.device_token TO PUBLIC")),
          process_(argv(outbox, wait_seconds, conninfo, options), dir.path() + "/pull_sender.log") {
        const bool up = eventually(
            [&] { return client().Get("/replicas/" + replica_id(1) + "/next") != nullptr; }, 10s);
        if (!up) throw std::runtime_error("the pull sender did not answer:\n" + process_.log());
    }

    httplib::Client client() const {
        httplib::Client client("127.0.0.1", port_);
        client.set_read_timeout(60, 0);
        return client;
    }
    // A request as device `device` (0: no Authorization header).
    httplib::Result get_next(int replica, int device) const {
        return client().Get(("/replicas/" + replica_id(replica) + "/next").c_str(), auth(device));
    }
    httplib::Result ack(int replica, const std::string& message_id, int device) const {
        return client().Post(("/replicas/" + replica_id(replica) + "/ack/" + message_id).c_str(),
                             auth(device), "", "text/plain");
    }
    httplib::Result refused(int replica, const std::string& message_id, const std::string& why,
                            int device) const {
        return client().Post(
            ("/replicas/" + replica_id(replica) + "/refused/" + message_id).c_str(), auth(device),
            why, "text/plain");
    }
    httplib::Result up(int replica, const std::string& body, int device) const {
        return client().Post(("/replicas/" + replica_id(replica) + "/up").c_str(), auth(device),
                             body, "application/json");
    }
    std::string log() const { return process_.log(); }
    int port() const { return port_; }

    // Sends `head` (a request's line and headers) on a connection of its own, and nothing more:
    // what the sender answers within `wait`, without the body its headers announce.
    std::string answer_to_head(const std::string& head, std::chrono::milliseconds wait) const {
        Raw connection(port_);
        connection.write(head);
        return connection.read_until_closed(wait);
    }

  private:
    static httplib::Headers auth(int device) {
        if (device == 0) return {};
        return {{"Authorization", "Bearer token-" + std::to_string(device)}};
    }
    std::vector<std::string> argv(const Outbox& outbox, const std::string& wait_seconds,
                                  const std::string& conninfo,
                                  const std::vector<std::string>& options) const {
        return pull_gateway_command(sender_binary(),
                                    conninfo.empty() ? outbox.conninfo() : conninfo, port_,
                                    kTokenQuery, wait_seconds, options);
    }

    int port_;
    std::string tokens_;  // made before the sender starts, which prepares the token query
    Process process_;
};

}  // namespace magic_sync::test::sender
