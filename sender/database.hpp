// The sender's connection to PostgreSQL: sync.next / sync.sent / sync.failed, LISTEN magic_sync.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chunk_cache.hpp"
#include "transport.hpp"

namespace magic_sync::sender {

// The connection is gone or a statement failed; nothing of the exchange was applied.
class DatabaseError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// A message as it is sent: its header names the history it is sent from (`origin`, from
// sync.next or sync.pull_head), so that a replica does not trust its counters across a restore or
// a failover. A message that does not decode goes as it is: the replica says it is malformed.
// (A rows message sync.next returns by reference is assembled with its origin in its header.)
// Gzip-compressed when `gzip` (--gzip).
std::string whole_message_as_sent(const std::string& message, const std::string& origin, bool gzip);

// The outcome of one delivery, to be recorded.
struct Settlement {
    std::string replica;
    int64_t seq = 0;
    Outcome outcome;
    // The history the message was leased in: a settlement recorded after the database's history
    // changed (a restore, a failover: the sender reconnected to another) is not taken for the
    // message of that seq there.
    std::string origin;
};

// What recording a settlement changed for its replica.
enum class ReplicaChange { none, backing_off, recovered };

// What an exchange leases: runs of up to `run` messages (a replica's head and the ones after it),
// for `among_taken` of the replicas whose deliveries it records as taken (looking at those
// replicas only) and for `any` replicas at all.
struct Wants {
    int among_taken = 0;
    int any = 0;
    int run = 1;
};

struct Exchange {
    std::vector<ReplicaChange> changes;  // one per settlement recorded, in order
    std::vector<Delivery> leased;        // each replica's run in seq order; timeouts not set
    size_t replicas_among_taken = 0;     // how many replicas each lease found a run for
    size_t replicas_any = 0;
    // Leased rows messages left out, with their runs, because a chunk they name was not found:
    // what the log says of each.
    std::vector<std::string> left_out;
};

struct Arrived {
    std::optional<Exchange> exchange;
    bool notified = false;
};

struct Backlog {
    int64_t unsent = 0;
    int64_t in_backoff = 0;
    double oldest_unsent_seconds = 0;
};

class Database {
  public:
    // `transport`: the sender's (--transport); it leases only the replicas that transport delivers.
    // `chunk_cache_bytes`: how much of the chunks of rows messages it keeps (ChunkCache).
    // `gzip`: the messages it leases come gzip-compressed (--gzip).
    Database(std::string conninfo, std::string transport, size_t chunk_cache_bytes, bool gzip);
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

    // Sends an exchange: records the settlements and leases what `wants` asks for `lease_seconds`,
    // in one transaction and one round trip. It runs while the caller goes on; `read` returns it
    // once its results are in. One at a time. The rows messages it leases come by reference: the
    // chunks they name that the cache does not hold are fetched by one more statement (a second
    // round trip) before `read` returns them assembled. A message whose chunks are gone (it was
    // pruned meanwhile: its replica confirmed it or was provisioned again) is left out, with the
    // rest of its run.
    void start_exchange(const std::vector<Settlement>& settlements, const Wants& wants,
                        double lease_seconds);
    bool exchange_pending() const { return pending_ != nullptr; }
    // Reads what arrived on the socket: the pending exchange once all of it has, and whether a
    // NOTIFY magic_sync came. Call it whenever the socket is readable and after starting an
    // exchange. Throws DatabaseError when the exchange failed: nothing of it was applied, or the
    // connection broke and it is not known whether it was (recording a delivery sent twice
    // changes nothing).
    Arrived read();
    // A server setting in its base unit (ms for times), or nothing when it is not defined.
    std::optional<long long> setting(const std::string& name);
    Backlog backlog();

  private:
    struct Pending;
    [[noreturn]] void fail(const std::string& what);
    // Reads one result of the pending exchange; false when it would have to wait for it.
    bool read_one_result();
    // Once the lease is in: sends the statement that fetches the chunks its messages name and the
    // cache does not hold; false when there are none.
    bool fetch_missing_chunks();
    // The leased rows messages assembled from their chunks, those whose chunks are gone left out.
    void assemble(Pending& pending);

    std::string conninfo_;
    std::string transport_;
    ChunkCache chunks_;
    bool gzip_;
    PGconn* connection_ = nullptr;
    std::unique_ptr<Pending> pending_;
};

}  // namespace magic_sync::sender
