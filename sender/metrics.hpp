// What the sender shows Prometheus: with --metrics HOST:PORT it serves GET /metrics in the text
// exposition format. Counters of the messages it delivered, failed to deliver (sending again may
// help) and had refused, per transport; the bytes delivered; a histogram of how long each send
// took; the sends in flight; and the backlog the database last reported (read with each progress
// line, --report): messages unsent, replicas backing off, the age of the oldest unsent message.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace magic_sync::sender {

class Metrics {
  public:
    explicit Metrics(std::string transport);

    void sent(std::chrono::duration<double> took, int64_t bytes);
    void failed(std::chrono::duration<double> took);
    void refused(std::chrono::duration<double> took);
    void in_flight(int64_t sends);
    void backlog(int64_t unsent, int64_t backing_off, double oldest_unsent_seconds);

    // The exposition, as GET /metrics answers it.
    std::string text() const;

    // Upper bounds of the send time histogram's buckets, in seconds (+Inf besides).
    static constexpr std::array<double, 13> kBuckets = {
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

  private:
    void observe(std::chrono::duration<double> took);

    const std::string transport_;
    std::atomic<int64_t> sent_{0}, failed_{0}, refused_{0}, bytes_{0}, in_flight_{0};
    std::atomic<int64_t> unsent_{-1}, backing_off_{-1};  // -1: not read yet
    std::atomic<double> oldest_unsent_seconds_{0};
    std::array<std::atomic<int64_t>, kBuckets.size()> buckets_{};  // not cumulative
    std::atomic<int64_t> sends_{0};
    std::atomic<double> seconds_{0};
};

// The pull gateway's (--transport pull): its requests answered, by route (next, ack, refused,
// up; other for a path it does not serve) and status; the bytes it read and wrote; the devices
// connected and the long polls waiting.
class PullMetrics {
  public:
    void answered(const std::string& route, int status);
    void moved(int64_t read, int64_t written);
    void connections(int64_t connected, int64_t waiting);
    // A wake-up asked the database about `replicas` waiting devices' replicas (counted once the
    // statement ran).
    void asked_on_wake(int64_t replicas);

    std::string text() const;

  private:
    mutable std::mutex mutex_;
    std::map<std::pair<std::string, int>, int64_t> answered_;
    std::atomic<int64_t> read_{0}, written_{0}, connected_{0}, waiting_{0};
    std::atomic<int64_t> wake_statements_{0}, wake_replicas_{0};
};

// Serves the text `exposition` makes at GET /metrics, on a thread of its own, until destroyed;
// with `fleet_db` (a libpq connection string) also the fleet page, GET / and GET /fleet.json
// (fleet.hpp), read on a connection of its own to that database.
class MetricsServer {
  public:
    // `listen` is HOST:PORT; throws std::runtime_error saying why when it cannot listen there.
    MetricsServer(std::function<std::string()> exposition, const std::string& listen,
                  const std::string& fleet_db = "");
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;

  private:
    struct Serving;
    std::unique_ptr<Serving> serving_;
};

}  // namespace magic_sync::sender
