#include "fleet.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "libpq/connection.hpp"
#include "protocol/canonical.hpp"

namespace magic_sync::sender {

std::string json_string(const std::string& text) {
    std::string out;
    try {
        protocol::append_json_string(out, text);
    } catch (const std::invalid_argument&) {
        // Not UTF-8 (an error text from outside): its bytes past ASCII shown as '?'.
        std::string ascii = text;
        for (char& c : ascii)
            if (static_cast<unsigned char>(c) >= 0x80) c = '?';
        out.clear();
        protocol::append_json_string(out, ascii);
    }
    return out;
}

BacklogHistory::BacklogHistory(std::chrono::seconds span, std::chrono::seconds every)
    : span_(span), every_(every) {}

void BacklogHistory::add(Time at, int64_t unsent) {
    samples_.emplace_back(at, unsent);
    while (samples_.front().first < at - span_) samples_.pop_front();
}

std::string BacklogHistory::json() const {
    std::string out = "{\"every\":" + std::to_string(every_.count()) +
                      ",\"span\":" + std::to_string(span_.count()) + ",\"samples\":[";
    bool first = true;
    for (const auto& [at, unsent] : samples_) {
        const auto seconds =
            std::chrono::duration_cast<std::chrono::seconds>(at.time_since_epoch()).count();
        out += (first ? "[" : ",[") + std::to_string(seconds) + "," + std::to_string(unsent) + "]";
        first = false;
    }
    return out + "]}";
}

std::string fleet_json(double read_at, const std::string& fleet, const std::string& error,
                       const BacklogHistory& backlog) {
    char at[32];
    std::snprintf(at, sizeof at, "%.3f", read_at);
    return std::string("{\"read_at\":") + at + ",\"fleet\":" + (fleet.empty() ? "null" : fleet) +
           ",\"error\":" + (error.empty() ? "null" : json_string(error)) +
           ",\"backlog\":" + backlog.json() + "}";
}

FleetSource::FleetSource(std::string conninfo, std::chrono::seconds sample_every,
                         std::chrono::seconds fresh_for)
    : conninfo_(std::move(conninfo)),
      sample_every_(sample_every),
      fresh_for_(fresh_for),
      backlog_(std::chrono::hours(1), sample_every) {
    sampler_ = std::thread([this] { sample(); });
}

FleetSource::~FleetSource() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    sampler_.join();
    if (connection_ != nullptr) PQfinish(connection_);
}

bool FleetSource::query(const char* sql, std::string& value, std::string& error) {
    if (connection_ == nullptr) {
        try {
            libpq::check_conninfo(conninfo_);
        } catch (const libpq::Failure& e) {
            error = "cannot connect: " + libpq::first_line(e.what());
            return false;
        }
        // A database that does not answer holds the page up 5 s at most, unless the connection
        // string says otherwise (its settings come after, and win).
        const char* const keywords[] = {"connect_timeout", "dbname", nullptr};
        const char* const values[] = {"5", conninfo_.c_str(), nullptr};
        connection_ = PQconnectdbParams(keywords, values, 1);
        if (PQstatus(connection_) != CONNECTION_OK) {
            error = "cannot connect: " + libpq::first_line(PQerrorMessage(connection_));
            PQfinish(connection_);
            connection_ = nullptr;
            return false;
        }
        // The page waits for what it reads: never long.
        PQclear(PQexec(connection_, "SET statement_timeout = '20s'"));
    }
    std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(connection_, sql), PQclear);
    if (PQresultStatus(result.get()) != PGRES_TUPLES_OK || PQntuples(result.get()) != 1) {
        error = libpq::first_line(PQresultErrorMessage(result.get()));
        if (error.empty()) error = "no answer";
        if (PQstatus(connection_) != CONNECTION_OK) {
            PQfinish(connection_);
            connection_ = nullptr;
        }
        return false;
    }
    value.assign(PQgetvalue(result.get(), 0, 0), PQgetlength(result.get(), 0, 0));
    return true;
}

void FleetSource::sample() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        std::string unsent;
        std::string error;
        // A database away leaves a gap in the history, no guess.
        if (query("SELECT unsent FROM sync.backlog()", unsent, error))
            backlog_.add(std::chrono::system_clock::now(), std::atoll(unsent.c_str()));
        wake_.wait_for(lock, sample_every_, [this] { return stopping_; });
    }
}

std::string FleetSource::json() {
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point asked = Clock::now();
    if (!answer_.empty() && asked < fresh_until_) return answer_;
    std::string fleet;
    std::string error;
    if (!query("SELECT sync.fleet(10)::text", fleet, error)) fleet.clear();
    const double read_at =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    answer_ = fleet_json(read_at, fleet, error, backlog_);
    // A fleet whose reading takes long is read less often: the database spends at most a fifth
    // of one session's time on it, however many pages are open.
    const Clock::time_point answered = Clock::now();
    fresh_until_ = answered + std::max<Clock::duration>(fresh_for_, 4 * (answered - asked));
    return answer_;
}

}  // namespace magic_sync::sender
