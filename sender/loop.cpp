#include "loop.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "log.hpp"

namespace magic_sync::sender {

namespace {

constexpr std::chrono::milliseconds kLongestReconnectWait{30000};
// Also without a NOTIFY, look for messages whose replica's backoff or lease ran out this often.
constexpr std::chrono::milliseconds kLongestRecheck{1000};

std::string megabytes(double bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f MB", bytes / 1e6);
    return text;
}

std::string per_second(double count, double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", seconds > 0 ? count / seconds : 0.0);
    return text;
}

int milliseconds_until(std::chrono::steady_clock::time_point then,
                       std::chrono::steady_clock::time_point now) {
    if (then <= now) return 0;
    return static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(then - now).count() + 1);
}

}  // namespace

Completions::Completions() : event_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (event_fd_ < 0) throw std::runtime_error("eventfd failed");
}

Completions::~Completions() { close(event_fd_); }

void Completions::push(Settlement settlement) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        settlements_.push_back(std::move(settlement));
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = write(event_fd_, &one, sizeof one);
}

std::vector<Settlement> Completions::take() {
    uint64_t count = 0;
    [[maybe_unused]] const ssize_t read_bytes = read(event_fd_, &count, sizeof count);
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(settlements_, {});
}

Sender::Sender(const Options& options, std::unique_ptr<Transport> transport)
    : options_(options), database_(options.db), transport_(std::move(transport)) {}

Sender::~Sender() { transport_.reset(); }

bool Sender::configure() {
    if (options_.send_timeout_seconds) {
        send_timeout_ = std::chrono::milliseconds(
            static_cast<long long>(*options_.send_timeout_seconds * 1000));
    } else {
        send_timeout_ = std::chrono::milliseconds(
            database_.setting("magic_sync.send_timeout").value_or(send_timeout_.count()));
    }
    const auto backoff = database_.setting("magic_sync.backoff");
    recheck_ = std::min(kLongestRecheck, std::chrono::milliseconds(backoff.value_or(1000)));
    const double timeout_seconds = send_timeout_.count() / 1000.0;
    lease_seconds_ = options_.lease_seconds.value_or(2 * timeout_seconds + 5);
    if (lease_seconds_ <= timeout_seconds) {
        log_line("--lease " + std::to_string(lease_seconds_) +
                 " s must be longer than the send timeout (" + std::to_string(timeout_seconds) +
                 " s), or another sender could take a message while this one is still sending it");
        return false;
    }
    return true;
}

void Sender::lost_database(const std::string& why, Clock::time_point now) {
    database_.disconnect();
    if (!away_logged_) {
        log_line("database unavailable (" + why +
                 "); retrying with backoff, logged again when it is back");
        away_logged_ = true;
        away_since_ = now;
        reconnect_wait_ = std::chrono::milliseconds(1000);
    }
    next_connect_ = now + reconnect_wait_;
    reconnect_wait_ = std::min(kLongestReconnectWait, reconnect_wait_ * 2);
}

void Sender::dispatch(std::vector<Delivery> leased) {
    for (Delivery& delivery : leased) {
        delivery.timeout = send_timeout_;
        in_flight_[delivery.replica] = InFlight{delivery.seq, delivery.bytes.size()};
        const std::string replica = delivery.replica;
        const int64_t seq = delivery.seq;
        Completions* completions = &completions_;
        transport_->send(std::move(delivery), [completions, replica, seq](Outcome outcome) {
            completions->push(Settlement{replica, seq, std::move(outcome)});
        });
    }
}

void Sender::collect() {
    for (Settlement& settlement : completions_.take()) {
        const auto flight = in_flight_.find(settlement.replica);
        if (flight == in_flight_.end() || flight->second.seq != settlement.seq) continue;
        switch (settlement.outcome.verdict) {
            case Verdict::taken:
                ++total_.sent;
                ++since_report_.sent;
                total_.bytes += static_cast<int64_t>(flight->second.bytes);
                since_report_.bytes += static_cast<int64_t>(flight->second.bytes);
                break;
            case Verdict::transient:
                ++total_.transient;
                ++since_report_.transient;
                break;
            case Verdict::refused:
                ++total_.refused;
                ++since_report_.refused;
                break;
        }
        in_flight_.erase(flight);
        unrecorded_.push_back(std::move(settlement));
    }
}

void Sender::exchange(bool stopping, Clock::time_point now) {
    // Every round trip also asks for work when there is room: first the next messages of the
    // replicas whose deliveries it records (a look at those replicas only), then, when a look at
    // every replica is due, the head messages of any others.
    const int room =
        stopping ? 0 : std::max(options_.concurrency - static_cast<int>(in_flight_.size()), 0);
    const int taken = static_cast<int>(std::count_if(
        unrecorded_.begin(), unrecorded_.end(),
        [](const Settlement& settlement) { return settlement.outcome.verdict == Verdict::taken; }));
    Wants wants;
    wants.among_taken = std::min(room, taken);
    wants.any = fetch_due_ ? room - wants.among_taken : 0;
    const Exchange result = database_.exchange(unrecorded_, wants, lease_seconds_);
    for (size_t i = 0; i < unrecorded_.size() && i < result.changes.size(); ++i) {
        const Settlement& settlement = unrecorded_[i];
        if (result.changes[i] == ReplicaChange::recovered) {
            log_line("replica " + settlement.replica + " recovered: message " +
                     std::to_string(settlement.seq) + " was taken");
        } else if (result.changes[i] == ReplicaChange::backing_off) {
            const bool refused = settlement.outcome.verdict == Verdict::refused;
            log_line("replica " + settlement.replica + " backing off: message " +
                     std::to_string(settlement.seq) + (refused ? " refused: " : " failed: ") +
                     settlement.outcome.error);
        }
    }
    unrecorded_.clear();
    // A replica with no next message yet leaves room that other replicas may use.
    if (static_cast<int>(result.leased_among_taken) < wants.among_taken) fetch_due_ = true;
    if (wants.any > 0) {
        drained_ = result.leased_any == 0;
        fetch_due_ = static_cast<int>(result.leased_any) == wants.any;
        next_recheck_ = now + recheck_;
    }
    dispatch(result.leased);
}

void Sender::report(Clock::time_point now) {
    const double seconds = std::chrono::duration<double>(now - last_report_).count();
    std::string line = "progress: " + std::to_string(since_report_.sent) + " sent (" +
                       per_second(since_report_.sent, seconds) + " msg/s, " +
                       megabytes(since_report_.bytes / (seconds > 0 ? seconds : 1)) + "/s), " +
                       std::to_string(since_report_.transient) + " transient, " +
                       std::to_string(since_report_.refused) + " refused, " +
                       std::to_string(in_flight_.size()) + " in flight";
    if (database_.connected()) {
        try {
            const Backlog backlog = database_.backlog();
            char oldest[32];
            std::snprintf(oldest, sizeof oldest, "%.1f s", backlog.oldest_unsent_seconds);
            line += ", " + std::to_string(backlog.in_backoff) + " replicas in backoff, " +
                    std::to_string(backlog.unsent) + " unsent, oldest unsent " + oldest;
        } catch (const DatabaseError& error) {
            lost_database(error.what(), now);
        }
    } else {
        line += ", database unavailable";
    }
    log_line(line);
    since_report_ = Counts{};
    last_report_ = now;
}

std::string Sender::summary() const {
    return std::to_string(total_.sent) + " sent (" + megabytes(total_.bytes) + "), " +
           std::to_string(total_.transient) + " transient, " + std::to_string(total_.refused) +
           " refused";
}

int Sender::run(int signal_fd) {
    bool stopping = false;
    Clock::time_point stop_deadline;
    last_report_ = Clock::now();
    next_connect_ = last_report_;
    const auto report_every = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options_.report_seconds));

    while (true) {
        Clock::time_point now = Clock::now();
        if (!database_.connected() && now >= next_connect_) {
            try {
                database_.connect();
                if (!configure()) return 2;
                if (away_logged_) {
                    log_line(
                        "database reachable again after " +
                        per_second(std::chrono::duration<double>(now - away_since_).count(), 1) +
                        " s: " + database_.describe());
                } else {
                    log_line("connected to " + database_.describe() + "; " +
                             std::to_string(options_.concurrency) + " in flight at most, lease " +
                             per_second(lease_seconds_, 1) + " s, send timeout " +
                             std::to_string(send_timeout_.count()) + " ms");
                }
                away_logged_ = false;
                fetch_due_ = true;
            } catch (const DatabaseError& error) {
                if (options_.once) {
                    log_line(error.what());
                    return 1;
                }
                lost_database(error.what(), now);
            }
        }
        const bool can_take =
            !stopping && static_cast<int>(in_flight_.size()) < options_.concurrency;
        if (database_.connected() && (!unrecorded_.empty() || (fetch_due_ && can_take))) {
            try {
                exchange(stopping, now);
            } catch (const DatabaseError& error) {
                if (options_.once) {
                    log_line(error.what());
                    return 1;
                }
                lost_database(error.what(), now);
            }
        }
        if (options_.once && drained_ && in_flight_.empty() && unrecorded_.empty()) {
            log_line("done: " + summary());
            return 0;
        }
        if (stopping && in_flight_.empty() && (unrecorded_.empty() || !database_.connected())) {
            log_line("stopped: " + summary());
            return 0;
        }
        if (stopping && now >= stop_deadline) {
            log_line("stopped: " + summary() + "; abandoned " + std::to_string(in_flight_.size()) +
                     " sends in flight (their leases expire)");
            return 0;
        }

        std::vector<Clock::time_point> wake_at;
        if (!database_.connected()) wake_at.push_back(next_connect_);
        if (database_.connected() && can_take) wake_at.push_back(fetch_due_ ? now : next_recheck_);
        if (options_.report_seconds > 0) wake_at.push_back(last_report_ + report_every);
        if (stopping) wake_at.push_back(stop_deadline);
        const int timeout =
            wake_at.empty()
                ? -1
                : milliseconds_until(*std::min_element(wake_at.begin(), wake_at.end()), now);

        pollfd fds[3] = {{completions_.fd(), POLLIN, 0},
                         {signal_fd, POLLIN, 0},
                         {database_.socket(), POLLIN, 0}};
        const int count = database_.connected() ? 3 : 2;
        if (poll(fds, count, timeout) < 0 && errno != EINTR)
            throw std::runtime_error("poll failed");
        now = Clock::now();

        if (fds[0].revents & POLLIN) collect();
        if (fds[1].revents & POLLIN) {
            signalfd_siginfo info{};
            [[maybe_unused]] const ssize_t n = read(signal_fd, &info, sizeof info);
            if (stopping) {
                log_line("stopped again: abandoning " + std::to_string(in_flight_.size()) +
                         " sends in flight (their leases expire); " + summary());
                return 0;
            }
            stopping = true;
            stop_deadline = now + send_timeout_ + std::chrono::seconds(1);
            log_line("stopping: taking no more messages, finishing " +
                     std::to_string(in_flight_.size()) + " in flight");
        }
        if (count == 3 && (fds[2].revents & (POLLIN | POLLERR | POLLHUP))) {
            try {
                if (database_.notified()) fetch_due_ = true;
            } catch (const DatabaseError& error) {
                if (options_.once) {
                    log_line(error.what());
                    return 1;
                }
                lost_database(error.what(), now);
            }
        }
        if (now >= next_recheck_) fetch_due_ = true;
        if (options_.report_seconds > 0 && now >= last_report_ + report_every) report(now);
    }
}

}  // namespace magic_sync::sender
