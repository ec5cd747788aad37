// The command line of magic-sync-sender.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace magic_sync::sender {

struct Options {
    std::string db;  // a libpq connection string; never logged (it may hold a password)
    std::string transport;
    int concurrency = 64;
    int run = 32;
    bool once = false;
    double report_seconds = 10;
    std::optional<double> lease_seconds;         // default: from the send timeout
    std::optional<double> send_timeout_seconds;  // default: magic_sync.send_timeout
    std::string metrics;                         // HOST:PORT serving /metrics; empty: none
    size_t chunk_cache_mib = 64;                 // of the chunks of rows messages it keeps
    bool gzip = false;  // messages go gzip-compressed (pull: to devices that accept it)
    // http
    std::string url;
    // nats
    std::string nats_url = "nats://127.0.0.1:4222";  // one URL, or several separated by commas
    std::string nats_prefix = "magic_sync";
    std::string nats_stream = "magic_sync";
    bool nats_create_stream = false;
    int nats_replicas = 1;  // of the stream it creates
    // exec
    std::string exec;
    // pull
    std::string listen;       // HOST:PORT the devices' requests come to
    std::string token_query;  // SQL: $1 the token, returns the replica ids it may act for
    double wait_seconds = 25;
    int devices = 10000;                 // connections held at once (each costs a socket)
    double header_timeout_seconds = 10;  // a request's head must come within this
    double idle_timeout_seconds = 60;    // a kept-alive connection with no request is closed
    std::string cors_origin;             // the origin whose pages may call the gateway; empty: none

    bool help = false;
};

class UsageError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Throws UsageError with a message that says what to change.
Options parse_options(const std::vector<std::string>& arguments);

extern const char* const kUsage;

}  // namespace magic_sync::sender
