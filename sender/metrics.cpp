#include "metrics.hpp"

#include <httplib.h>
#include <sys/socket.h>

#include <cstdio>
#include <stdexcept>
#include <thread>

#include "fleet.hpp"

namespace magic_sync::sender {

namespace {

void add(std::atomic<double>& total, double value) {
    double seen = total.load();
    while (!total.compare_exchange_weak(seen, seen + value)) {
    }
}

std::string number(double value) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", value);
    return text;
}

}  // namespace

Metrics::Metrics(std::string transport) : transport_(std::move(transport)) {}

void Metrics::observe(std::chrono::duration<double> took) {
    const double seconds = took.count();
    for (size_t i = 0; i < kBuckets.size(); ++i) {
        if (seconds <= kBuckets[i]) {
            ++buckets_[i];
            break;
        }
    }
    ++sends_;
    add(seconds_, seconds);
}

void Metrics::sent(std::chrono::duration<double> took, int64_t bytes) {
    ++sent_;
    bytes_ += bytes;
    observe(took);
}

void Metrics::failed(std::chrono::duration<double> took) {
    ++failed_;
    observe(took);
}

void Metrics::refused(std::chrono::duration<double> took) {
    ++refused_;
    observe(took);
}

void Metrics::in_flight(int64_t sends) { in_flight_ = sends; }

void Metrics::backlog(int64_t unsent, int64_t backing_off, double oldest_unsent_seconds) {
    unsent_ = unsent;
    backing_off_ = backing_off;
    oldest_unsent_seconds_ = oldest_unsent_seconds;
}

std::string Metrics::text() const {
    const std::string label = "transport=\"" + transport_ + "\"";
    std::string out;
    out +=
        "# HELP magic_sync_sender_messages_total Messages the sender finished sending, by "
        "outcome: sent (taken), failed (sending again may help), refused (by the other side).\n"
        "# TYPE magic_sync_sender_messages_total counter\n";
    out += "magic_sync_sender_messages_total{" + label + ",outcome=\"sent\"} " +
           std::to_string(sent_.load()) + "\n";
    out += "magic_sync_sender_messages_total{" + label + ",outcome=\"failed\"} " +
           std::to_string(failed_.load()) + "\n";
    out += "magic_sync_sender_messages_total{" + label + ",outcome=\"refused\"} " +
           std::to_string(refused_.load()) + "\n";
    out +=
        "# HELP magic_sync_sender_sent_bytes_total Bytes of the messages sent.\n"
        "# TYPE magic_sync_sender_sent_bytes_total counter\n"
        "magic_sync_sender_sent_bytes_total{" +
        label + "} " + std::to_string(bytes_.load()) + "\n";
    out +=
        "# HELP magic_sync_sender_in_flight Sends out now, each to another replica.\n"
        "# TYPE magic_sync_sender_in_flight gauge\n"
        "magic_sync_sender_in_flight{" +
        label + "} " + std::to_string(in_flight_.load()) + "\n";
    out +=
        "# HELP magic_sync_sender_send_seconds How long a send took, until the other side "
        "answered or it failed.\n"
        "# TYPE magic_sync_sender_send_seconds histogram\n";
    int64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets.size(); ++i) {
        cumulative += buckets_[i].load();
        out += "magic_sync_sender_send_seconds_bucket{" + label + ",le=\"" + number(kBuckets[i]) +
               "\"} " + std::to_string(cumulative) + "\n";
    }
    const int64_t sends = sends_.load();
    out += "magic_sync_sender_send_seconds_bucket{" + label + ",le=\"+Inf\"} " +
           std::to_string(sends) + "\n";
    out += "magic_sync_sender_send_seconds_sum{" + label + "} " + number(seconds_.load()) + "\n";
    out += "magic_sync_sender_send_seconds_count{" + label + "} " + std::to_string(sends) + "\n";
    if (unsent_.load() >= 0) {
        out +=
            "# HELP magic_sync_sender_unsent_messages Messages in the outbox not sent yet, as "
            "the database last said (with each progress line).\n"
            "# TYPE magic_sync_sender_unsent_messages gauge\n"
            "magic_sync_sender_unsent_messages " +
            std::to_string(unsent_.load()) + "\n";
        out +=
            "# HELP magic_sync_sender_replicas_backing_off Live replicas waiting out a backoff "
            "after a failed or refused message.\n"
            "# TYPE magic_sync_sender_replicas_backing_off gauge\n"
            "magic_sync_sender_replicas_backing_off " +
            std::to_string(backing_off_.load()) + "\n";
        out +=
            "# HELP magic_sync_sender_oldest_unsent_seconds Age of the oldest unsent message.\n"
            "# TYPE magic_sync_sender_oldest_unsent_seconds gauge\n"
            "magic_sync_sender_oldest_unsent_seconds " +
            number(oldest_unsent_seconds_.load()) + "\n";
    }
    return out;
}

void PullMetrics::answered(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++answered_[{route, status}];
}

void PullMetrics::moved(int64_t read, int64_t written) {
    read_ += read;
    written_ += written;
}

void PullMetrics::connections(int64_t connected, int64_t waiting) {
    connected_ = connected;
    waiting_ = waiting;
}

void PullMetrics::asked_on_wake(int64_t replicas) {
    ++wake_statements_;
    wake_replicas_ += replicas;
}

std::string PullMetrics::text() const {
    std::string out =
        "# HELP magic_sync_pull_requests_total Requests the pull gateway answered, by route and "
        "status.\n"
        "# TYPE magic_sync_pull_requests_total counter\n";
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [answer, count] : answered_)
            out += "magic_sync_pull_requests_total{route=\"" + answer.first + "\",status=\"" +
                   std::to_string(answer.second) + "\"} " + std::to_string(count) + "\n";
    }
    out +=
        "# HELP magic_sync_pull_read_bytes_total Bytes the gateway read from devices.\n"
        "# TYPE magic_sync_pull_read_bytes_total counter\n"
        "magic_sync_pull_read_bytes_total " +
        std::to_string(read_.load()) + "\n";
    out +=
        "# HELP magic_sync_pull_written_bytes_total Bytes the gateway wrote to devices.\n"
        "# TYPE magic_sync_pull_written_bytes_total counter\n"
        "magic_sync_pull_written_bytes_total " +
        std::to_string(written_.load()) + "\n";
    out +=
        "# HELP magic_sync_pull_wake_statements_total Statements a NOTIFY made the gateway run "
        "to find which waiting devices have a message.\n"
        "# TYPE magic_sync_pull_wake_statements_total counter\n"
        "magic_sync_pull_wake_statements_total " +
        std::to_string(wake_statements_.load()) + "\n";
    out +=
        "# HELP magic_sync_pull_wake_replicas_total Replicas those statements asked about: only "
        "those the NOTIFY named that a device waits for.\n"
        "# TYPE magic_sync_pull_wake_replicas_total counter\n"
        "magic_sync_pull_wake_replicas_total " +
        std::to_string(wake_replicas_.load()) + "\n";
    out +=
        "# HELP magic_sync_pull_connections Connections open now (devices connected).\n"
        "# TYPE magic_sync_pull_connections gauge\n"
        "magic_sync_pull_connections " +
        std::to_string(connected_.load()) + "\n";
    out +=
        "# HELP magic_sync_pull_waiting Long polls waiting for a message now.\n"
        "# TYPE magic_sync_pull_waiting gauge\n"
        "magic_sync_pull_waiting " +
        std::to_string(waiting_.load()) + "\n";
    return out;
}

struct MetricsServer::Serving {
    std::unique_ptr<FleetSource> fleet;
    httplib::Server server;
    std::thread thread;
};

// The fleet page's backlog: a sample every 15 s (240 over the hour it shows); sync.fleet() read at
// most every 3 s, as often as the page asks.
constexpr std::chrono::seconds kFleetSampleEvery{15};
constexpr std::chrono::seconds kFleetFreshFor{3};

MetricsServer::MetricsServer(std::function<std::string()> exposition, const std::string& listen,
                             const std::string& fleet_db)
    : serving_(std::make_unique<Serving>()) {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size())
        throw std::runtime_error("--metrics " + listen + ": expected HOST:PORT");
    const std::string host = listen.substr(0, colon);
    int port = 0;
    try {
        port = std::stoi(listen.substr(colon + 1));
    } catch (const std::exception&) {
        throw std::runtime_error("--metrics " + listen + ": the port is not a number");
    }
    // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which a second sender
    // would share the port and a scrape would reach either.
    serving_->server.set_socket_options([](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    serving_->server.Get("/metrics", [exposition = std::move(exposition)](const httplib::Request&,
                                                                          httplib::Response& res) {
        res.set_content(exposition(), "text/plain; version=0.0.4; charset=utf-8");
    });
    if (!serving_->server.bind_to_port(host, port))
        throw std::runtime_error("--metrics " + listen +
                                 ": cannot listen there (in use, or not "
                                 "an address of this host)");
    if (!fleet_db.empty()) {
        serving_->fleet =
            std::make_unique<FleetSource>(fleet_db, kFleetSampleEvery, kFleetFreshFor);
        serving_->server.Get("/", [](const httplib::Request&, httplib::Response& res) {
            // Nothing but the page itself: its script and style are inline, it reads
            // /fleet.json and nothing else.
            res.set_header("Content-Security-Policy",
                           "default-src 'none'; script-src 'unsafe-inline'; "
                           "style-src 'unsafe-inline'; connect-src 'self'; img-src data:");
            res.set_content(kFleetPage, "text/html; charset=utf-8");
        });
        serving_->server.Get("/fleet.json", [fleet = serving_->fleet.get()](
                                                const httplib::Request&, httplib::Response& res) {
            res.set_header("Cache-Control", "no-store");
            res.set_content(fleet->json(), "application/json");
        });
    }
    serving_->thread = std::thread([this] { serving_->server.listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
    serving_->server.stop();
    if (serving_->thread.joinable()) serving_->thread.join();
}

}  // namespace magic_sync::sender
