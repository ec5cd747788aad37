// bench/sender: messages/s through magic-sync-sender against each transport's own baseline on
// the same machine in the same run: http to a local sink vs plain curl POSTs at the same
// concurrency; nats to a local nats-server vs a raw libnats JetStream publisher with as many
// publishes in flight. Medians of several runs. `make bench-sender` runs it.
#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <vector>

#include "sender/harness.hpp"
#include "sender/sink.hpp"

using namespace magic_sync::test;
using namespace magic_sync::test::sender;

namespace {

constexpr int kReplicas = 64;
constexpr int kMessages = 400;  // per replica
constexpr int kConcurrency = 64;
constexpr int kRuns = 5;
constexpr int kTotal = kReplicas * kMessages;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

// The sender's arguments for one --once run over `transport` at the bench's concurrency.
std::vector<std::string> once_over(const std::vector<std::string>& transport) {
    std::vector<std::string> arguments = transport;
    arguments.insert(arguments.end(), {"--concurrency", std::to_string(kConcurrency), "--once"});
    return arguments;
}

// magic-sync-sender --once over the whole outbox; messages/s, its start and stop included.
double sender_run(Outbox& outbox, const TempDir& dir, const std::vector<std::string>& transport) {
    outbox.sql("UPDATE sync.outbox SET sent_at = NULL, lease_until = NULL, tries = 0");
    outbox.sql("VACUUM ANALYZE sync.outbox");
    const auto start = Clock::now();
    SenderProcess sender(outbox, dir, once_over(transport), "bench.log");
    if (sender.wait(std::chrono::minutes(5)) != 0 || outbox.unsent() != 0)
        throw std::runtime_error("the sender failed: " + sender.log());
    return kTotal / seconds_since(start);
}

// magic-sync-sender --once with nothing to send: what its start and stop cost, in seconds.
double idle_run(Outbox& outbox, const TempDir& dir, const std::vector<std::string>& transport) {
    outbox.sql("UPDATE sync.outbox SET sent_at = now(), lease_until = NULL");
    const auto start = Clock::now();
    SenderProcess sender(outbox, dir, once_over(transport), "idle.log");
    if (sender.wait(std::chrono::minutes(1)) != 0)
        throw std::runtime_error("the sender failed: " + sender.log());
    return seconds_since(start);
}

// Plain curl: one curl per replica, all at once, each POSTing that replica's messages one after
// the other on one connection: the same concurrency, bodies and headers as the sender's. `next`
// ends each request's options: without it curl joins every body with '&' and sends all of them,
// and every header, in each request.
double curl_run(const HttpSink& sink, const TempDir& dir) {
    std::string script = "#!/bin/sh\n";
    for (int r = 1; r <= kReplicas; ++r) {
        std::string url = sink.url();
        url.replace(url.find("{replica}"), 9, replica_id(r));
        const std::string config = dir.path() + "/curl." + std::to_string(r);
        std::ofstream out(config);
        for (int seq = 1; seq <= kMessages; ++seq) {
            const std::string body = config + "." + std::to_string(seq);
            std::ofstream(body) << message_body(r, seq);
            out << "url = \"" << url << "\"\noutput = \"/dev/null\"\n"
                << "data-binary = \"@" << body << "\"\n"
                << "header = \"message-id: " << message_id(seq) << "\"\n"
                << "header = \"content-type: application/json\"\n"
                << "next\n";
        }
        script += "curl -s --fail --config " + config + " &\n";
    }
    script += "wait\n";
    std::ofstream(dir.path() + "/curl.sh") << script;
    const size_t before = sink.taken();
    const auto start = Clock::now();
    std::string output;
    if (run("sh " + dir.path() + "/curl.sh", &output) != 0)
        throw std::runtime_error("curl failed: " + output);
    const double rate = kTotal / seconds_since(start);
    if (sink.taken() - before != static_cast<size_t>(kTotal))
        throw std::runtime_error("curl lost some: " + output);
    return rate;
}

std::atomic<int> acknowledged{0};
void count_ack(jsCtx*, natsMsg* message, jsPubAck* ack, jsPubAckErr*, void*) {
    if (ack != nullptr) ++acknowledged;
    natsMsg_Destroy(message);
}

void recreate_stream(jsCtx* js) {
    js_DeleteStream(js, "SHOP", nullptr, nullptr);
    const char* subjects[] = {"shop.>"};
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    config.Name = "SHOP";
    config.Subjects = subjects;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    jsStreamInfo* info = nullptr;
    if (js_AddStream(&info, js, &config, nullptr, nullptr) != NATS_OK)
        throw std::runtime_error("cannot create the stream");
    jsStreamInfo_Destroy(info);
}

// A raw libnats JetStream publisher: the same subjects, ids and bodies, kConcurrency in flight.
double nats_baseline_run(jsCtx* js) {
    recreate_stream(js);
    acknowledged = 0;
    const auto start = Clock::now();
    int published = 0;
    for (int seq = 1; seq <= kMessages; ++seq) {
        for (int r = 1; r <= kReplicas; ++r) {
            while (published - acknowledged.load() >= kConcurrency) std::this_thread::yield();
            const std::string subject = "shop." + replica_id(r);
            const std::string body = message_body(r, seq);
            const std::string id = replica_id(r) + "." + message_id(seq);
            natsMsg* message = nullptr;
            natsMsg_Create(&message, subject.c_str(), nullptr, body.data(),
                           static_cast<int>(body.size()));
            natsMsgHeader_Set(message, "message-id", message_id(seq).c_str());
            jsPubOptions options;
            jsPubOptions_Init(&options);
            options.MsgId = id.c_str();
            if (js_PublishMsgAsync(js, &message, &options) != NATS_OK)
                throw std::runtime_error("publish failed");
            natsMsg_Destroy(message);
            ++published;
        }
    }
    while (acknowledged.load() < kTotal) std::this_thread::yield();
    return kTotal / seconds_since(start);
}

void print(const char* what, const std::vector<double>& ours, const std::vector<double>& baseline,
           const char* baseline_name) {
    const double a = median(ours), b = median(baseline);
    std::printf("%-5s magic-sync-sender %8.0f msg/s   %-28s %8.0f msg/s   ratio %.2f\n", what, a,
                baseline_name, b, a / b);
}

void bench() {
    std::printf("bench/sender: %d replicas x %d messages (%d), concurrency %d, median of %d runs\n",
                kReplicas, kMessages, kTotal, kConcurrency, kRuns);
    Outbox outbox("bench_sender", kReplicas, kMessages);
    TempDir dir;

    HttpSink sink;
    std::vector<double> http, curl;
    for (int i = 0; i < kRuns; ++i) {
        http.push_back(sender_run(outbox, dir, {"--transport", "http", "--url", sink.url()}));
        curl.push_back(curl_run(sink, dir));
        std::printf("  run %d: http %.0f msg/s, curl %.0f msg/s\n", i + 1, http.back(),
                    curl.back());
        std::fflush(stdout);
    }

    TempDir store;
    const int port = free_port();
    const std::string url = "nats://127.0.0.1:" + std::to_string(port);
    Process server({"/usr/sbin/nats-server", "-js", "-a", "127.0.0.1", "-p", std::to_string(port),
                    "-sd", store.path()},
                   store.path() + "/server.log");
    natsConnection* connection = nullptr;
    if (!eventually([&] { return natsConnection_ConnectTo(&connection, url.c_str()) == NATS_OK; },
                    20s))
        throw std::runtime_error("nats-server did not start");
    jsOptions js_options;
    jsOptions_Init(&js_options);
    js_options.PublishAsync.AckHandler = count_ack;
    js_options.PublishAsync.MaxPending = kConcurrency * 2;
    jsCtx* js = nullptr;
    natsConnection_JetStream(&js, connection, &js_options);
    const std::vector<std::string> nats_transport = {"--transport", "nats",          "--nats-url",
                                                     url,           "--nats-prefix", "shop"};
    std::vector<double> nats, raw, idle;
    for (int i = 0; i < kRuns; ++i) {
        recreate_stream(js);
        nats.push_back(sender_run(outbox, dir, nats_transport));
        raw.push_back(nats_baseline_run(js));
        idle.push_back(idle_run(outbox, dir, nats_transport));
        std::printf(
            "  run %d: nats %.0f msg/s, raw libnats %.0f msg/s, sender start and stop %.0f ms\n",
            i + 1, nats.back(), raw.back(), idle.back() * 1000);
        std::fflush(stdout);
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(connection);

    print("http", http, curl, "curl, one per replica");
    print("nats", nats, raw, "raw libnats async publish");
    std::printf(
        "the sender's start and stop with nothing to send (nats, included in its runs): %.0f ms\n",
        median(idle) * 1000);
}

}  // namespace

// A failure returns from main, so that the static cluster is stopped and removed on the way out.
int main() {
    try {
        bench();
        return 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "bench/sender: %s\n", error.what());
        return 1;
    }
}
