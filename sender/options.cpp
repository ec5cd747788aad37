#include "options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "program/nats_servers.hpp"

namespace magic_sync::sender {

const char* const kUsage =
    R"(usage: magic-sync-sender --db CONNINFO --transport http|nats|exec|pull [options]

Delivers the outbox of every replica (sync.next / sync.sent / sync.failed): concurrently across
replicas, one message at a time per replica, in order. Holds no state: kill it at any moment.

  --db CONNINFO          libpq connection string (a role granted sync_sender)
  --transport NAME       http, nats or exec (push), or pull (devices ask: see below)
  --concurrency N        messages in flight at once, each to another replica (default 64)
  --run N                messages leased per replica at once, sent one after the other
                         (default 32; 1 leases one message at a time)
  --once                 deliver what can be delivered now, then exit
  --report SECONDS       progress line interval (default 10; 0: none)
  --lease SECONDS        how long a run of messages stays leased to this sender while it
                         hangs (default 2 x send timeout + 5; must exceed the send timeout);
                         its leases end at once when its database session does (it died).
                         pull: how long a device's head stays leased to it, after it asked,
                         without an ack (default 60)
  --send-timeout SECONDS a send taking longer is a transient failure
                         (default: the server's magic_sync.send_timeout)
  --chunk-cache MIB      how much of the shared chunks of rows messages to keep, so that a
                         chunk sent to many replicas is read from the database once (default
                         64); a round of messages that names more is read again each round.
                         pull: the gateway's workers share it
  --gzip                 send every message gzip-compressed, said by Content-Encoding: gzip
                         (http: a header; nats: a message header; exec: CONTENT_ENCODING in
                         the environment); the shared chunks of rows messages are compressed
                         once. The devices must inflate it (magic-sync-replica does: a message
                         that begins as gzip is inflated). pull: to the devices whose request
                         says Accept-Encoding: gzip (browsers do)
  --metrics HOST:PORT    serve GET /metrics for Prometheus there: messages sent, failed and
                         refused, bytes, send times, sends in flight, and the backlog read
                         with each progress line (--report); pull: requests by route and
                         status, bytes read and written, devices connected, long polls waiting.
                         Also the fleet page, GET / (a page for a browser: devices by state,
                         the slowest with their lag and last error, the backlog over the last
                         hour, alarms, what is set aside and its fix; refreshed every 5 s) and
                         GET /fleet.json, its data: sync.fleet(), read on a connection of its
                         own at most every 3 s (and a fifth of the time), and the unsent
                         messages sampled every 15 s
  --help                 this text
http:
  --url TEMPLATE         POST target, {replica} replaced by the replica's id; header message-id
nats (JetStream):
  --nats-url URL[,URL...]
                         the server, or several servers of a cluster separated by commas
                         (default nats://127.0.0.1:4222); the connection moves to another
                         when its server dies, and what it published unacknowledged goes
                         again under the same Nats-Msg-Id, which the stream stores once
  --nats-prefix PREFIX   publish to PREFIX.<replica> (default magic_sync)
  --nats-stream NAME     the stream to create with --nats-create-stream (default magic_sync)
  --nats-create-stream   create the stream (file storage, subjects PREFIX.>) if it is missing
  --nats-replicas N      with --nats-create-stream: how many servers of the cluster hold the
                         stream (1 to 5, default 1); 3 survives the loss of any one server
exec:
  --exec COMMAND         run per message with /bin/sh -c: the bytes on stdin, REPLICA and
                         MESSAGE_ID in the environment; exit 0 taken, 75 transient, else refused
pull (devices behind NAT ask this sender over HTTP; put TLS in front with a reverse proxy):
  --listen HOST:PORT     where to serve plain HTTP (e.g. 127.0.0.1:8300)
  --token-query SQL      the ids of the replicas a device's bearer token ($1, text) may act
                         for, in the first column, e.g. SELECT id FROM shop.registers WHERE
                         token_hash = encode(sha256(convert_to($1, 'UTF8')), 'hex')
  --wait SECONDS         how long GET .../next waits for a message before 204 (default 25)
  --devices N            connections held at once, waiting long polls included (default
                         10000); one more is answered 503 and closed. One thread moves every
                         connection's bytes, a few more (2 per core, 2 to 8) run the statements:
                         a waiting device costs a socket, not a thread
  --header-timeout SECONDS
                         a request's head must arrive within this (default 10), its body
                         within this and a second per 64 KiB it announces; else 408
  --idle-timeout SECONDS a kept-alive connection without a request is closed (default 60)
  --cors-origin ORIGIN   let pages of ORIGIN (e.g. https://app.example.com, or * for any) call
                         the gateway from a browser: every answer says
                         Access-Control-Allow-Origin and the methods, headers (Authorization,
                         Content-Type) and exposed header (message-id) a page needs, and a
                         preflight OPTIONS of a gateway path is answered 204 without a token
                         (default: none; an OPTIONS is then answered 405)
  GET  /replicas/{id}/next               the head message (header message-id), the same until
                                         acknowledged; 204 when none came within --wait
  POST /replicas/{id}/ack/{message-id}   200 taken; 409 not the head: nothing taken
  POST /replicas/{id}/refused/{message-id}
                                         the device cannot take it (body: why): recorded as
                                         a refusal, it stays the head; 409 not the head
  POST /replicas/{id}/up                 the body to sync.receive, as it is or gzip
                                         (Content-Encoding: gzip); 200 with its answer, 507
                                         when it is refused (send it again later)
  A request is refused on its head, before its body is read: 401 without a bearer token,
  403 for a replica the token may not act for, 404 for no such path or replica, 413 for a
  body over 64 MiB (up) or 64 KiB (ack, refused), 411 for a chunked one, 415 for another
  Content-Encoding (or any but an upload's gzip); 409 for a replica
  another transport delivers; 503 when asking again may help, 500 when it would fail the
  same way. The --db role needs sync_sender,
  sync_receiver (for up) and what the token query reads. --concurrency, --run, --once,
  --send-timeout and --report are for push transports.
)";

namespace {

double parse_seconds(const std::string& option, const std::string& text, bool zero_allowed) {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0 ||
        (!zero_allowed && value == 0))
        throw UsageError(option + " needs a " + (zero_allowed ? "" : "positive ") +
                         "number of seconds, not '" + text + "'");
    return value;
}

int parse_count(const std::string& option, const std::string& text, long most = 100000) {
    char* end = nullptr;
    const long value = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value < 1 || value > most)
        throw UsageError(option + " needs a whole number from 1 to " + std::to_string(most) +
                         ", not '" + text + "'");
    return static_cast<int>(value);
}

}  // namespace

Options parse_options(const std::vector<std::string>& arguments) {
    Options options;
    using Setter = std::function<void(const std::string&)>;
    const std::map<std::string, Setter> with_value = {
        {"--db", [&](const std::string& v) { options.db = v; }},
        {"--transport", [&](const std::string& v) { options.transport = v; }},
        {"--concurrency",
         [&](const std::string& v) { options.concurrency = parse_count("--concurrency", v); }},
        {"--run", [&](const std::string& v) { options.run = parse_count("--run", v); }},
        {"--report",
         [&](const std::string& v) {
             options.report_seconds = parse_seconds("--report", v, true);
         }},
        {"--lease",
         [&](const std::string& v) { options.lease_seconds = parse_seconds("--lease", v, false); }},
        {"--send-timeout",
         [&](const std::string& v) {
             options.send_timeout_seconds = parse_seconds("--send-timeout", v, false);
         }},
        {"--chunk-cache",
         [&](const std::string& v) {
             options.chunk_cache_mib = static_cast<size_t>(parse_count("--chunk-cache", v));
         }},
        {"--metrics", [&](const std::string& v) { options.metrics = v; }},
        {"--url", [&](const std::string& v) { options.url = v; }},
        {"--nats-url", [&](const std::string& v) { options.nats_url = v; }},
        {"--nats-prefix", [&](const std::string& v) { options.nats_prefix = v; }},
        {"--nats-stream", [&](const std::string& v) { options.nats_stream = v; }},
        {"--nats-replicas",
         [&](const std::string& v) {
             // JetStream keeps a stream on at most 5 servers.
             options.nats_replicas = parse_count("--nats-replicas", v, 5);
         }},
        {"--exec", [&](const std::string& v) { options.exec = v; }},
        {"--listen", [&](const std::string& v) { options.listen = v; }},
        {"--token-query", [&](const std::string& v) { options.token_query = v; }},
        {"--wait",
         [&](const std::string& v) { options.wait_seconds = parse_seconds("--wait", v, false); }},
        {"--devices", [&](const std::string& v) { options.devices = parse_count("--devices", v); }},
        {"--header-timeout",
         [&](const std::string& v) {
             options.header_timeout_seconds = parse_seconds("--header-timeout", v, false);
         }},
        {"--idle-timeout",
         [&](const std::string& v) {
             options.idle_timeout_seconds = parse_seconds("--idle-timeout", v, false);
         }},
        {"--cors-origin",
         [&](const std::string& v) {
             // It goes into a header as it is: an origin (scheme://host[:port]) or *.
             const bool star = v == "*";
             const size_t scheme = v.find("://");
             const bool origin = scheme != std::string::npos && scheme > 0 &&
                                 v.size() > scheme + 3 &&
                                 v.find('/', scheme + 3) == std::string::npos &&
                                 std::all_of(v.begin(), v.end(),
                                             [](unsigned char c) { return c > 0x20 && c < 0x7f; });
             if (!star && !origin)
                 throw UsageError(
                     "--cors-origin wants an origin, scheme://host[:port] without a path, or *");
             options.cors_origin = v;
         }},
    };
    for (size_t i = 0; i < arguments.size(); ++i) {
        const std::string& argument = arguments[i];
        if (argument == "--help" || argument == "-h") {
            options.help = true;
            return options;
        }
        if (argument == "--once") {
            options.once = true;
            continue;
        }
        if (argument == "--nats-create-stream") {
            options.nats_create_stream = true;
            continue;
        }
        if (argument == "--gzip") {
            options.gzip = true;
            continue;
        }
        const auto setter = with_value.find(argument);
        if (setter == with_value.end()) throw UsageError("unknown option '" + argument + "'");
        if (i + 1 == arguments.size()) throw UsageError(argument + " needs a value");
        setter->second(arguments[++i]);
    }
    if (options.db.empty()) throw UsageError("--db CONNINFO is required");
    if (options.transport == "http") {
        if (options.url.empty()) throw UsageError("--transport http needs --url TEMPLATE");
    } else if (options.transport == "nats") {
        try {
            program::nats_servers(options.nats_url);
        } catch (const std::invalid_argument& error) {
            throw UsageError(std::string("--nats-url ") + error.what());
        }
        if (options.nats_prefix.empty() ||
            options.nats_prefix.find_first_of(" *>") != std::string::npos)
            throw UsageError("--nats-prefix must be a subject without spaces, '*' or '>'");
        if (options.nats_replicas != 1 && !options.nats_create_stream)
            throw UsageError(
                "--nats-replicas is for the stream --nats-create-stream creates; an existing "
                "stream keeps its own (nats stream edit changes it)");
    } else if (options.transport == "exec") {
        if (options.exec.empty()) throw UsageError("--transport exec needs --exec COMMAND");
    } else if (options.transport == "pull") {
        if (options.listen.empty()) throw UsageError("--transport pull needs --listen HOST:PORT");
        if (options.token_query.empty())
            throw UsageError("--transport pull needs --token-query SQL");
    } else {
        throw UsageError("--transport must be http, nats, exec or pull");
    }
    if (!options.cors_origin.empty() && options.transport != "pull")
        throw UsageError("--cors-origin is for --transport pull, which browsers call");
    if (options.lease_seconds && options.send_timeout_seconds &&
        *options.lease_seconds <= *options.send_timeout_seconds)
        throw UsageError(
            "--lease must be longer than --send-timeout, or another sender could "
            "take a message while this one is still sending it");
    return options;
}

}  // namespace magic_sync::sender
