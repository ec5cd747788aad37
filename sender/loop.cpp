#include "loop.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <set>
#include <stdexcept>
#include <utility>

#include "log.hpp"

namespace magic_sync::sender {

namespace {

constexpr std::chrono::milliseconds kLongestReconnectWait{30000};
// Also without a NOTIFY, look for messages whose replica's backoff or lease ran out this often.
constexpr std::chrono::milliseconds kLongestRecheck{1000};
// While an exchange with the database is out, the sender reads what has come this often too, not
// only when the socket says so, and says once when one has waited past the send timeout: a
// sender once sat silent for 30 s with its messages leased and unsent (a test's CI run, cause
// not found), and neither its log nor a missed wakeup may hide that again.
constexpr std::chrono::milliseconds kPendingLook{1000};
// A run's next message is sent only while its lease has this much left after the send timeout:
// the database's clock and this one may differ a little.
constexpr std::chrono::milliseconds kLeaseMargin{1000};

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
    bool first;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        first = settlements_.empty();
        settlements_.push_back(std::move(settlement));
    }
    // One wake-up for what piles up until the loop takes it: `take` reads the eventfd before it
    // takes the settlements, so one pushed in between is taken with them.
    if (!first) return;
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
    : options_(options),
      database_(options.db, options.transport, options.chunk_cache_mib << 20, options.gzip),
      metrics_(options.transport),
      metrics_server_(options.metrics.empty()
                          ? nullptr
                          : std::make_unique<MetricsServer>([this] { return metrics_.text(); },
                                                            options.metrics, options.db)),
      transport_(std::move(transport)) {}

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
    // What the lost exchange was recording is recorded again after the reconnect.
    unrecorded_.insert(unrecorded_.begin(), std::make_move_iterator(recording_.begin()),
                       std::make_move_iterator(recording_.end()));
    recording_.clear();
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

void Sender::dispatch(std::vector<Delivery> leased, Clock::time_point lease_ends) {
    std::vector<std::string> started;
    for (Delivery& delivery : leased) {
        const auto [entry, fresh] = runs_.try_emplace(delivery.replica);
        if (fresh) {
            entry->second.lease_ends = lease_ends;
            started.push_back(delivery.replica);
        } else if (entry->second.lease_ends != lease_ends) {
            // A new run for a replica with a send still out: the run's lease ran out before
            // the send returned (the relay keeps a confirmed head only while its lease lives).
            // The new run replaces what was waiting and goes on once the send out has returned.
            entry->second.waiting.clear();
            entry->second.lease_ends = lease_ends;
        }
        entry->second.waiting.push_back(std::move(delivery));
    }
    for (const std::string& replica : started) send_next(runs_.at(replica));
    metrics_.in_flight(static_cast<int64_t>(runs_.size()));
}

void Sender::send_next(Run& run) {
    Delivery delivery = std::move(run.waiting.front());
    run.waiting.pop_front();
    delivery.timeout = send_timeout_;
    run.seq_out = delivery.seq;
    run.bytes_out = delivery.bytes.size();
    run.sent_at = Clock::now();
    const std::string replica = delivery.replica;
    const int64_t seq = delivery.seq;
    const std::string origin = delivery.origin;
    Completions* completions = &completions_;
    transport_->send(std::move(delivery), [completions, replica, seq, origin](Outcome outcome) {
        completions->push(Settlement{replica, seq, std::move(outcome), origin});
    });
}

void Sender::collect(Clock::time_point now) {
    for (Settlement& settlement : completions_.take()) {
        const auto entry = runs_.find(settlement.replica);
        if (entry == runs_.end() || entry->second.seq_out != settlement.seq) continue;
        Run& run = entry->second;
        const bool taken = settlement.outcome.verdict == Verdict::taken;
        const auto took = now - run.sent_at;
        switch (settlement.outcome.verdict) {
            case Verdict::taken:
                ++total_.sent;
                ++since_report_.sent;
                total_.bytes += static_cast<int64_t>(run.bytes_out);
                since_report_.bytes += static_cast<int64_t>(run.bytes_out);
                metrics_.sent(took, static_cast<int64_t>(run.bytes_out));
                break;
            case Verdict::transient:
                ++total_.transient;
                ++since_report_.transient;
                metrics_.failed(took);
                break;
            case Verdict::refused:
                ++total_.refused;
                ++since_report_.refused;
                metrics_.refused(took);
                break;
        }
        run.ended.push_back(std::move(settlement));
        if (taken && !stopping_ && !run.waiting.empty() &&
            now + send_timeout_ + kLeaseMargin < run.lease_ends) {
            send_next(run);
            continue;
        }
        // The run has ended: all of it taken, one failed, a stop, or too little lease left for
        // another send. What was not sent is leased again later, from the first of it.
        unrecorded_.insert(unrecorded_.end(), std::make_move_iterator(run.ended.begin()),
                           std::make_move_iterator(run.ended.end()));
        runs_.erase(entry);
    }
    metrics_.in_flight(static_cast<int64_t>(runs_.size()));
}

void Sender::start_exchange(Clock::time_point now) {
    // Every round trip also asks for work when there is room: first the next runs of the
    // replicas whose deliveries it records (a look at those replicas only), then, when a look at
    // every replica is due, runs of any others.
    const int room =
        stopping_ ? 0 : std::max(options_.concurrency - static_cast<int>(runs_.size()), 0);
    // A replica's run is in unrecorded_ in one piece, in the order the runs ended. An exchange
    // records the runs of as many replicas as may be in flight (--concurrency), the first to end
    // first: every run that ended while the last exchange was out. Eight at most, as it was, made
    // a round of 2,000 rows to 2,000 replicas 1.3 times as slow and each delivery cost 1.5 times
    // the server's CPU, and provisioning twice as slow (bench/README.md, "Fan-out at the server").
    const size_t most = static_cast<size_t>(std::max(options_.concurrency, 1));
    std::set<std::string> replicas;
    std::set<std::string> taken;
    size_t recorded = 0;
    for (; recorded < unrecorded_.size(); ++recorded) {
        const Settlement& settlement = unrecorded_[recorded];
        if (replicas.insert(settlement.replica).second && replicas.size() > most) break;
        if (settlement.outcome.verdict == Verdict::taken) taken.insert(settlement.replica);
    }
    asked_ = Wants{};
    asked_.run = options_.run;
    asked_.among_taken = std::min(room, static_cast<int>(taken.size()));
    asked_.any = fetch_due_ ? room - asked_.among_taken : 0;
    if (asked_.any > 0) {
        fetch_due_ = false;
        next_recheck_ = now + recheck_;
    }
    recording_.assign(std::make_move_iterator(unrecorded_.begin()),
                      std::make_move_iterator(unrecorded_.begin() + recorded));
    unrecorded_.erase(unrecorded_.begin(), unrecorded_.begin() + recorded);
    exchange_started_ = now;
    slow_exchange_logged_ = false;
    database_.start_exchange(recording_, asked_, lease_seconds_);
}

void Sender::finish_exchange(Exchange result) {
    for (const std::string& line : result.left_out) log_line(line);
    std::set<std::string> logged;
    for (size_t i = 0; i < recording_.size() && i < result.changes.size(); ++i) {
        const Settlement& settlement = recording_[i];
        if (result.changes[i] == ReplicaChange::none || !logged.insert(settlement.replica).second)
            continue;
        if (result.changes[i] == ReplicaChange::recovered) {
            log_line("replica " + settlement.replica + " recovered: message " +
                     std::to_string(settlement.seq) + " was taken");
        } else {
            const bool refused = settlement.outcome.verdict == Verdict::refused;
            log_line("replica " + settlement.replica + " backing off: message " +
                     std::to_string(settlement.seq) + (refused ? " refused: " : " failed: ") +
                     settlement.outcome.error);
        }
    }
    recording_.clear();
    // A replica with no next message yet leaves room that other replicas may use; a look at every
    // replica that filled all the room it had may find more.
    if (static_cast<int>(result.replicas_among_taken) < asked_.among_taken) fetch_due_ = true;
    if (asked_.any > 0) {
        drained_ = result.replicas_any == 0;
        if (static_cast<int>(result.replicas_any) == asked_.any) fetch_due_ = true;
    }
    const auto lease =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lease_seconds_));
    dispatch(std::move(result.leased), exchange_started_ + lease);
}

void Sender::arrived(Arrived arrived) {
    if (arrived.notified) fetch_due_ = true;
    if (arrived.exchange) finish_exchange(std::move(*arrived.exchange));
}

void Sender::report(Clock::time_point now) {
    const double seconds = std::chrono::duration<double>(now - last_report_).count();
    std::string line = "progress: " + std::to_string(since_report_.sent) + " sent (" +
                       per_second(since_report_.sent, seconds) + " msg/s, " +
                       megabytes(since_report_.bytes / (seconds > 0 ? seconds : 1)) + "/s), " +
                       std::to_string(since_report_.transient) + " transient, " +
                       std::to_string(since_report_.refused) + " refused, " +
                       std::to_string(runs_.size()) + " in flight";
    if (database_.connected()) {
        try {
            const Backlog backlog = database_.backlog();
            metrics_.backlog(backlog.unsent, backlog.in_backoff, backlog.oldest_unsent_seconds);
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
    Clock::time_point stop_deadline;
    last_report_ = Clock::now();
    next_connect_ = last_report_;
    const auto report_every = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options_.report_seconds));
    // --once ends on a database error; otherwise the sender reconnects with backoff.
    const auto database_error = [&](const DatabaseError& error, Clock::time_point now) {
        if (options_.once) {
            log_line(error.what());
            return false;
        }
        lost_database(error.what(), now);
        return true;
    };

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
                             std::to_string(options_.concurrency) +
                             " replicas in flight at most, runs of " +
                             std::to_string(options_.run) + ", lease " +
                             per_second(lease_seconds_, 1) + " s, send timeout " +
                             std::to_string(send_timeout_.count()) + " ms");
                }
                away_logged_ = false;
                fetch_due_ = true;
            } catch (const DatabaseError& error) {
                if (!database_error(error, now)) return 1;
            }
        }
        const bool can_take = !stopping_ && static_cast<int>(runs_.size()) < options_.concurrency;
        if (database_.connected() && !database_.exchange_pending() &&
            (!unrecorded_.empty() || (fetch_due_ && can_take))) {
            try {
                start_exchange(now);
                // Sending may have read what was arriving; the socket would not say so again.
                arrived(database_.read());
            } catch (const DatabaseError& error) {
                if (!database_error(error, now)) return 1;
            }
        }
        const bool idle = runs_.empty() && unrecorded_.empty() && !database_.exchange_pending();
        if (options_.once && drained_ && !fetch_due_ && idle) {
            log_line("done: " + summary());
            return 0;
        }
        if (stopping_ && runs_.empty() && !database_.exchange_pending() &&
            (unrecorded_.empty() || !database_.connected())) {
            log_line("stopped: " + summary());
            return 0;
        }
        if (stopping_ && now >= stop_deadline) {
            log_line("stopped: " + summary() + "; abandoned " + std::to_string(runs_.size()) +
                     " sends in flight (their leases end with this session)");
            return 0;
        }

        std::vector<Clock::time_point> wake_at;
        if (!database_.connected()) wake_at.push_back(next_connect_);
        if (database_.connected() && can_take && !database_.exchange_pending())
            wake_at.push_back(fetch_due_ ? now : next_recheck_);
        // The progress line asks the database for the backlog: not while an exchange is out.
        if (options_.report_seconds > 0 && !database_.exchange_pending())
            wake_at.push_back(last_report_ + report_every);
        if (stopping_) wake_at.push_back(stop_deadline);
        if (database_.exchange_pending()) wake_at.push_back(now + kPendingLook);
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

        if (fds[0].revents & POLLIN) collect(now);
        if (fds[1].revents & POLLIN) {
            signalfd_siginfo info{};
            [[maybe_unused]] const ssize_t n = read(signal_fd, &info, sizeof info);
            if (stopping_) {
                log_line("stopped again: abandoning " + std::to_string(runs_.size()) +
                         " sends in flight (their leases end with this session); " + summary());
                return 0;
            }
            stopping_ = true;
            stop_deadline = now + send_timeout_ + std::chrono::seconds(1);
            log_line("stopping: taking no more messages, finishing " +
                     std::to_string(runs_.size()) + " in flight");
        }
        const bool readable = count == 3 && (fds[2].revents & (POLLIN | POLLERR | POLLHUP));
        if (readable || (database_.connected() && database_.exchange_pending() &&
                         now >= exchange_started_ + kPendingLook)) {
            try {
                arrived(database_.read());
            } catch (const DatabaseError& error) {
                if (!database_error(error, now)) return 1;
            }
        }
        if (database_.connected() && database_.exchange_pending() && !slow_exchange_logged_ &&
            now >= exchange_started_ + send_timeout_) {
            slow_exchange_logged_ = true;
            log_line("the database has not answered an exchange sent " +
                     per_second(std::chrono::duration<double>(now - exchange_started_).count(), 1) +
                     " s ago (its statements may wait on a lock: see pg_stat_activity)");
        }
        if (now >= next_recheck_) fetch_due_ = true;
        if (options_.report_seconds > 0 && now >= last_report_ + report_every &&
            !database_.exchange_pending())
            report(now);
    }
}

}  // namespace magic_sync::sender
