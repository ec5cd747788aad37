// The up path of the CLI: a stand-in for the app's own route, which authenticates the replica and
// then calls sync.receive(replica, message) in the database (docs/DESIGN.md §6). Here the replica
// calls it itself over libpq, with bound parameters.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace magic_sync::replica {

class Replica;

// The upload did not reach the server, or the server could not file it now: send it again.
class UpRouteError : public std::runtime_error {
  public:
    explicit UpRouteError(const std::string& message) : std::runtime_error(message) {}
};

// Where uploads go: sync.receive(replica, body) behind it, and its answer back.
class UpRoute {
  public:
    virtual ~UpRoute() = default;
    // The answer of sync.receive ('filed', 'answered again', 'kept', 'dropped' or 'refused');
    // throws UpRouteError when the upload must go again.
    virtual std::string send(const std::string& replica_id, const std::string& body) = 0;
};

class PostgresUpRoute : public UpRoute {
  public:
    explicit PostgresUpRoute(std::string conninfo);
    ~PostgresUpRoute() override;
    PostgresUpRoute(const PostgresUpRoute&) = delete;
    PostgresUpRoute& operator=(const PostgresUpRoute&) = delete;

    // SELECT sync.receive($1::uuid, $2::bytea): its answer ('filed', 'answered again', 'kept',
    // 'refused' or 'dropped'). Connects (again) when needed.
    std::string send(const std::string& replica_id, const std::string& body) override;

  private:
    void connect();

    std::string conninfo_;
    PGconn* connection_ = nullptr;
};

// Another route's uploads sent gzip (docs/PROTOCOL.md §7): JSON text shrinks about fivefold, which
// a device on a slow link feels. sync.receive tells them by their first bytes; through the pull
// gateway they say Content-Encoding: gzip.
class GzipUpRoute : public UpRoute {
  public:
    explicit GzipUpRoute(std::unique_ptr<UpRoute> route);
    std::string send(const std::string& replica_id, const std::string& body) override;

  private:
    std::unique_ptr<UpRoute> route_;
};

// Sends every upload the replica has to send, marking each sent once sync.receive took it.
// Returns the ids sent; throws UpRouteError (after marking those that went) when one fails or is
// dropped (the server does not know the replica: nothing of it was taken).
std::vector<std::string> send_uploads(Replica& replica, UpRoute& route);

}  // namespace magic_sync::replica
