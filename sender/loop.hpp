// The sender's loop: lease runs of messages, hand them to the transport one at a time per replica,
// record the outcomes.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "database.hpp"
#include "metrics.hpp"
#include "options.hpp"
#include "transport.hpp"

namespace magic_sync::sender {

// Outcomes that transports report from their own threads, for the loop to pick up. `fd()` is
// readable while there are some.
class Completions {
  public:
    Completions();
    ~Completions();
    Completions(const Completions&) = delete;
    Completions& operator=(const Completions&) = delete;

    void push(Settlement settlement);
    std::vector<Settlement> take();
    int fd() const { return event_fd_; }

  private:
    std::mutex mutex_;
    std::vector<Settlement> settlements_;
    int event_fd_ = -1;
};

class Sender {
  public:
    Sender(const Options& options, std::unique_ptr<Transport> transport);
    ~Sender();

    // Runs until SIGTERM or SIGINT arrives on `signal_fd` (a signalfd) and what is in flight has
    // ended, or with --once until nothing more can be sent now. Returns the exit status.
    int run(int signal_fd);

  private:
    using Clock = std::chrono::steady_clock;

    // A replica's run of leased messages: one with the transport at a time, the rest waiting.
    // It is recorded once it has ended, because recording its head sent ends the lease.
    struct Run {
        std::deque<Delivery> waiting;
        int64_t seq_out = 0;
        size_t bytes_out = 0;
        Clock::time_point sent_at;  // when the send out started
        Clock::time_point lease_ends;
        std::vector<Settlement> ended;
    };
    struct Counts {
        int64_t sent = 0;
        int64_t bytes = 0;
        int64_t transient = 0;
        int64_t refused = 0;
    };

    // Reads the server's settings after a (re)connect; false when they make no sense together.
    bool configure();
    void start_exchange(Clock::time_point now);
    void finish_exchange(Exchange result);
    void arrived(Arrived arrived);
    void dispatch(std::vector<Delivery> leased, Clock::time_point lease_ends);
    void send_next(Run& run);
    void collect(Clock::time_point now);
    void lost_database(const std::string& why, Clock::time_point now);
    void report(Clock::time_point now);
    std::string summary() const;

    const Options options_;
    Database database_;
    Completions completions_;
    std::unordered_map<std::string, Run> runs_;
    std::vector<Settlement> unrecorded_;
    std::vector<Settlement> recording_;  // sent in the pending exchange
    Clock::time_point exchange_started_;
    bool slow_exchange_logged_ = false;  // the pending exchange's wait was said
    Wants asked_;

    std::chrono::milliseconds send_timeout_{30000};
    std::chrono::milliseconds recheck_{1000};
    double lease_seconds_ = 65;

    bool stopping_ = false;
    bool fetch_due_ = true;
    bool drained_ = false;
    bool away_logged_ = false;
    Clock::time_point away_since_;
    Clock::time_point next_connect_;
    std::chrono::milliseconds reconnect_wait_{1000};
    Clock::time_point next_recheck_;
    Clock::time_point last_report_;
    Counts total_;
    Counts since_report_;
    Metrics metrics_;
    std::unique_ptr<MetricsServer> metrics_server_;  // with --metrics

    // Last, so it is destroyed first: no `done` may reach completions_ after it is gone.
    std::unique_ptr<Transport> transport_;
};

}  // namespace magic_sync::sender
