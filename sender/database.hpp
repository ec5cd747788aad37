// The sender's connection to PostgreSQL: sync.next / sync.sent / sync.failed, LISTEN magic_sync.
#pragma once

#include <libpq-fe.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "transport.hpp"

namespace magic_sync::sender {

// The connection is gone or a statement failed; nothing of the exchange was applied.
class DatabaseError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// The outcome of one delivery, to be recorded.
struct Settlement {
    std::string replica;
    int64_t seq = 0;
    Outcome outcome;
};

// What recording a settlement changed for its replica.
enum class ReplicaChange { none, backing_off, recovered };

// How many messages an exchange leases: the next ones of the replicas whose deliveries it
// records as taken (looking at those replicas only), and the head messages of any replicas.
struct Wants {
    int among_taken = 0;
    int any = 0;
};

struct Exchange {
    std::vector<ReplicaChange> changes;  // one per settlement, in order
    std::vector<Delivery> leased;        // timeouts not set
    size_t leased_among_taken = 0;
    size_t leased_any = 0;
};

struct Backlog {
    int64_t unsent = 0;
    int64_t in_backoff = 0;
    double oldest_unsent_seconds = 0;
};

class Database {
  public:
    explicit Database(std::string conninfo);
    ~Database();
    Database(const Database&) = delete;
    Database& operator=(const Database&) = delete;

    // Connects and listens on magic_sync; throws DatabaseError.
    void connect();
    void disconnect();
    bool connected() const { return connection_ != nullptr; }
    int socket() const;
    // "user@host:port/dbname": what the log may show (never the password).
    std::string describe() const;

    // Records the settlements and leases what `wants` asks for `lease_seconds`, in one
    // transaction and one round trip.
    Exchange exchange(const std::vector<Settlement>& settlements, const Wants& wants,
                      double lease_seconds);
    // Reads what arrived on the socket; true when a NOTIFY magic_sync came.
    bool notified();
    // A server setting in its base unit (ms for times), or nothing when it is not defined.
    std::optional<long long> setting(const std::string& name);
    Backlog backlog();

  private:
    [[noreturn]] void fail(const std::string& what);

    std::string conninfo_;
    PGconn* connection_ = nullptr;
};

}  // namespace magic_sync::sender
