// The fleet page: with --metrics HOST:PORT the sender serves, besides /metrics, GET / (one HTML
// page, no external assets, see fleet_page.cpp) and GET /fleet.json, which the page reads every
// few seconds: what sync.fleet() says of the fleet (the replicas by state, the slowest with their
// lag and last error, the alarms, what is set aside with its fix), and the backlog (messages
// unsent) over the last hour, which the sender samples itself while it runs.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace magic_sync::sender {

// The page GET / answers.
extern const char* const kFleetPage;

// `text` as a JSON string, quotes included.
std::string json_string(const std::string& text);

// The backlog over the last `span`: one sample every `every` or so, the oldest dropped once they
// are older than `span` before the newest. Not thread-safe.
class BacklogHistory {
  public:
    using Time = std::chrono::system_clock::time_point;
    BacklogHistory(std::chrono::seconds span, std::chrono::seconds every);

    void add(Time at, int64_t unsent);
    size_t size() const { return samples_.size(); }
    // {"every":SECONDS,"span":SECONDS,"samples":[[UNIX_SECONDS,UNSENT],...]}, oldest first.
    std::string json() const;

  private:
    std::chrono::seconds span_;
    std::chrono::seconds every_;
    std::deque<std::pair<Time, int64_t>> samples_;
};

// /fleet.json: {"read_at":UNIX_SECONDS,"fleet":DOC,"error":TEXT,"backlog":HISTORY}, where DOC is
// what sync.fleet() returned (null when it could not be read, and then `error` says why; else
// error is null).
std::string fleet_json(double read_at, const std::string& fleet, const std::string& error,
                       const BacklogHistory& backlog);

// The data behind the page, read on a database connection of its own: the backlog sampled every
// `sample_every` from construction on, on a thread of its own, and sync.fleet() read when the page
// asks, at most once every `fresh_for`, or every five times as long as it took to read when that
// is longer (many open pages cost one reading; a big fleet is read less often).
class FleetSource {
  public:
    FleetSource(std::string conninfo, std::chrono::seconds sample_every,
                std::chrono::seconds fresh_for);
    ~FleetSource();
    FleetSource(const FleetSource&) = delete;
    FleetSource& operator=(const FleetSource&) = delete;

    // The body of /fleet.json.
    std::string json();

  private:
    using Clock = std::chrono::steady_clock;
    // Runs `sql` (one row, one column) on the connection, connecting first when it has none;
    // false with `error` set when it failed. Called with mutex_ held.
    bool query(const char* sql, std::string& value, std::string& error);
    void sample();

    const std::string conninfo_;
    const std::chrono::seconds sample_every_;
    const std::chrono::seconds fresh_for_;
    std::mutex mutex_;  // the connection, the history and the cached answer
    PGconn* connection_ = nullptr;
    BacklogHistory backlog_;
    std::string answer_;
    Clock::time_point fresh_until_;
    bool stopping_ = false;
    std::condition_variable wake_;
    std::thread sampler_;
};

}  // namespace magic_sync::sender
