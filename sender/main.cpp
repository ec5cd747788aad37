// magic-sync-sender: delivers the outbox (docs/DESIGN.md §5). See `magic-sync-sender --help`.
#include <signal.h>
#include <sys/signalfd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "exec_transport.hpp"
#include "http_transport.hpp"
#include "log.hpp"
#include "loop.hpp"
#include "nats_transport.hpp"
#include "options.hpp"
#include "pull_server.hpp"

using namespace magic_sync::sender;

namespace {

std::unique_ptr<Transport> make_transport(const Options& options) {
    if (options.transport == "http")
        return std::make_unique<HttpTransport>(options.url, options.concurrency);
    if (options.transport == "nats") {
        NatsSettings settings;
        settings.url = options.nats_url;
        settings.prefix = options.nats_prefix;
        settings.stream = options.nats_stream;
        settings.create_stream = options.nats_create_stream;
        settings.stream_replicas = options.nats_replicas;
        settings.max_in_flight = options.concurrency;
        return std::make_unique<NatsTransport>(settings);
    }
    return std::make_unique<ExecTransport>(options.exec);
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    try {
        options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const UsageError& error) {
        std::fprintf(stderr, "magic-sync-sender: %s (see magic-sync-sender --help)\n",
                     error.what());
        return 2;
    }
    if (options.help) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    // SIGTERM and SIGINT are read from a signalfd by the loop; blocked before any thread starts
    // so that every thread inherits the mask. A write to a gone peer is an error, not a signal.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    signal(SIGPIPE, SIG_IGN);
    const int signal_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC);
    if (signal_fd < 0) {
        log_line("signalfd failed");
        return 1;
    }
    try {
        if (options.transport == "pull") return PullServer(options).run(signal_fd);
        Sender sender(options, make_transport(options));
        return sender.run(signal_fd);
    } catch (const std::exception& error) {
        log_line(error.what());
        return 1;
    }
}
