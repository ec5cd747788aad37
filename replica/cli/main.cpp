// magic-sync-replica: the reference replica as a program (README "The reference replica").
#include <nats/nats.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/http_server.hpp"
#include "cli/log.hpp"
#include "cli/nats_consumer.hpp"
#include "cli/pull_client.hpp"
#include "cli/uploader.hpp"
#include "lib/replica.hpp"
#include "lib/up_route.hpp"
#include "protocol/canonical.hpp"

namespace magic_sync::replica {

namespace {

// Exit statuses. `apply` follows the sender's exec transport: 0 taken, 75 try again, other refused.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitRefused = 65;    // EX_DATAERR
constexpr int kExitTransient = 75;  // EX_TEMPFAIL

// Room for the largest message the protocol accepts and the HTTP framing around it.
constexpr size_t kMaxMessageBytes = protocol::Limits{}.max_bytes;

std::atomic<bool> stop_requested{false};

void request_stop(int) { stop_requested = true; }

void install_stop_handlers() {
    struct sigaction action {};
    action.sa_handler = request_stop;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
}

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const char* kProgramHelp =
    R"(usage: magic-sync-replica --id UUID --db FILE [--refuse-table TABLE]... COMMAND [ARGS]

The reference replica of magic_sync: applies the server's messages to a SQLite file, keeps the
fingerprints of what it holds, queues local writes and uploads them.

  --id UUID             the replica's id (its row in the replicas relation)
  --db FILE             its SQLite file, created when missing
  --refuse-table TABLE  test fault: rows of TABLE cannot be applied and are reported untaken

commands:
  serve --listen HOST:PORT [--up CONNINFO [--gzip-up]]
                                             receive the sender's http transport
  nats --url URL[,URL...] [--prefix P] [--stream S] [--up CONNINFO [--gzip-up]]
                                             receive the sender's nats transport
  pull --url BASE --token TOKEN [--up-via-pull | --up CONNINFO] [--gzip-up]
                                             ask the sender's pull transport (behind NAT)
  apply FILE|-                               apply one message (also an exec transport command)
  show [--json]                              what it holds, and its local writes
  write TABLE JSON [--key COL,...]           queue a local row of a record or both table
  upload [--up CONNINFO [--gzip-up] | --sent ID]
                                             print, send, or confirm the next upload
  holds [--verify]                           the fingerprint of each scope held

`magic-sync-replica COMMAND --help` describes a command.
)";

const std::map<std::string, std::string> kCommandHelp = {
    {"serve",
     R"(usage: magic-sync-replica --id UUID --db FILE serve --listen HOST:PORT [--up CONNINFO] [--upload-every SECONDS] [--gzip-up]

Receives the sender's http transport: every POST (any path) carries one down message in its body.
The answer is 200 only after the message is applied and committed (or was before, or is of an
older generation), 400 for a message that can never be applied (not a message, another
replica's), 422 for a protocol version this build does not speak (it is not applied; the sender
tries again later), 503 when the local database failed (try again). A GET answers the replica's
state, for health checks.

  --listen HOST:PORT      an IPv4 address and port
  --up CONNINFO           also send uploads: SELECT sync.receive($1::uuid, $2::bytea) over libpq,
                          after each applied message and every --upload-every seconds (default 1),
                          retrying with backoff while it fails
  --gzip-up               send each upload gzip (sync.receive reads it by its first bytes; a
                          server too old to read it keeps it whole until it is updated)
)"},
    {"nats",
     R"(usage: magic-sync-replica --id UUID --db FILE nats --url URL[,URL...] [--prefix PREFIX] [--stream NAME] [--up CONNINFO] [--upload-every SECONDS] [--gzip-up]

Receives the sender's nats transport: a durable JetStream pull consumer (<PREFIX>_<replica>)
filtered on <PREFIX>.<replica>, max_ack_pending 1, each message acknowledged after its apply
committed. Messages that can never be applied are terminated; a message of an unknown protocol
version is redelivered later. Waits for the server and the stream when they are not there yet.

  --url URL[,URL...] e.g. nats://127.0.0.1:4222; the servers of a cluster separated by commas
                     (the connection moves to another when its server dies)
  --prefix PREFIX    subject prefix (default magic_sync)
  --stream NAME      bind to this stream (default: the stream that has the subject)
  --up CONNINFO      also send uploads, as for serve
  --gzip-up          send each upload gzip, as for serve
)"},
    {"pull",
     R"(usage: magic-sync-replica --id UUID --db FILE pull --url BASE --token TOKEN [--up-via-pull | --up CONNINFO] [--upload-every SECONDS] [--gzip-up] [--die-before-ack N]

Asks the sender's pull transport (magic-sync-sender --transport pull), for a device the sender
cannot reach: GET BASE/replicas/<id>/next (the sender answers when a message comes, or 204 after
its wait: asked again at once), applies the message, then POST BASE/replicas/<id>/ack/<message-id>.
A message not acknowledged (the program died, the ack was lost) comes again and is recognised as
applied. One it cannot apply is not acknowledged: POST BASE/replicas/<id>/refused/<message-id>
records why on the server, and it is asked for again after a wait. Backs off
(0.5 s doubling to 30 s) while the sender cannot be reached or answers an error. Stops on SIGTERM.

  --url BASE          the sender's URL, e.g. https://sync.shop.example (TLS through its proxy)
  --token TOKEN       this device's bearer token (the sender's --token-query maps it to its id)
  --up-via-pull       also send uploads: POST BASE/replicas/<id>/up, after each applied message
                      and every --upload-every seconds (default 1)
  --up CONNINFO       or send them over libpq, as for serve
  --gzip-up           send each upload gzip (Content-Encoding: gzip over the gateway), as for
                      serve
  --die-before-ack N  test fault: after the Nth message applied, die (SIGKILL) before its ack
)"},
    {"apply", R"(usage: magic-sync-replica --id UUID --db FILE apply FILE|-

Applies one down message read from FILE (or stdin for -), as it is or gzip-compressed (a
sender's --gzip), and prints the outcome. Exit status 0
when it is applied (or was before, or is of an older generation), 65 when it can never be
applied, 75 when the local database failed or it speaks an unknown protocol version (taken after
an upgrade): the codes of the sender's exec transport, so `apply -` can be its command.
)"},
    {"show", R"(usage: magic-sync-replica --id UUID --db FILE show [--json]

Prints what the replica holds per table as the app sees it (the server's rows, with local writes
not yet filed on top), its pending local writes, the writes the server kept (did not file) and
why, the scopes it holds and recent notices. --json prints one JSON object: "tables" (as the app
sees them), "held" (the server's rows exactly as stored, with scope and h), "local_writes",
"kept", "holds" and "notices".
)"},
    {"write", R"(usage: magic-sync-replica --id UUID --db FILE write TABLE JSON [--key COL[,COL...]]

Queues a row the app wrote to a record or both table (TABLE as it travels, e.g. shop.sales; JSON
the row object). It is shown on top of what comes down until the server files it, and goes up
with the next upload. The key columns are those of the table's rows that came down, or --key
(remembered for the table), or "id".
)"},
    {"upload",
     R"(usage: magic-sync-replica --id UUID --db FILE upload [--up CONNINFO [--gzip-up] | --sent ID]

Without options: prints the next upload (the body for sync.receive) or nothing when there is
nothing new. Until it is confirmed sent, the same upload (same id, same rows) is printed again.
  --sent ID       confirm that the server took upload ID (your route's sync.receive returned)
  --up CONNINFO   send every upload there is now with SELECT sync.receive($1::uuid, $2::bytea)
                  and print their ids; exit status 1 when the route fails (send again later)
  --gzip-up       send them gzip
)"},
    {"holds", R"(usage: magic-sync-replica --id UUID --db FILE holds [--verify]

Prints each scope held: through (the seq it is applied through), n and the fingerprint.
  --verify   also recompute each fingerprint from the stored rows; exit status 1 on a difference
)"},
};

// The arguments of a command: flags with one value each, switches without, and positionals.
class Arguments {
  public:
    Arguments(const std::string& command, std::vector<std::string> args,
              const std::vector<std::string>& flags, const std::vector<std::string>& switches)
        : command_(command) {
        for (size_t i = 0; i < args.size(); ++i) {
            const std::string& arg = args[i];
            if (arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
                std::string name = arg.substr(2);
                if (std::find(switches.begin(), switches.end(), name) != switches.end()) {
                    switches_.insert(name);
                } else if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
                    if (i + 1 >= args.size())
                        throw UsageError(command + ": " + arg + " needs a value");
                    flags_[name] = args[++i];
                } else {
                    throw UsageError(command + ": unknown option " + arg);
                }
            } else {
                positionals_.push_back(arg);
            }
        }
    }

    std::optional<std::string> flag(const std::string& name) const {
        auto found = flags_.find(name);
        if (found == flags_.end()) return std::nullopt;
        return found->second;
    }
    std::string required(const std::string& name) const {
        if (auto value = flag(name)) return *value;
        throw UsageError(command_ + " needs --" + name);
    }
    bool has(const std::string& name) const { return switches_.count(name) > 0; }
    const std::vector<std::string>& positionals(size_t count) const {
        if (positionals_.size() != count) {
            throw UsageError(command_ + " takes " + std::to_string(count) + " argument" +
                             (count == 1 ? "" : "s") + ", got " +
                             std::to_string(positionals_.size()));
        }
        return positionals_;
    }

  private:
    std::string command_;
    std::map<std::string, std::string> flags_;
    std::set<std::string> switches_;
    std::vector<std::string> positionals_;
};

std::chrono::milliseconds upload_every(const Arguments& arguments) {
    std::string text = arguments.flag("upload-every").value_or("1");
    try {
        double seconds = std::stod(text);
        if (seconds > 0) return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    } catch (const std::exception&) {
    }
    throw UsageError("--upload-every wants a positive number of seconds, got " + text);
}

// Where uploads go: --up CONNINFO (sync.receive over libpq), or `pull` (pull's --up-via-pull:
// the gateway's up route); compressed with --gzip-up. Null when uploads go nowhere.
std::unique_ptr<UpRoute> up_route(const Arguments& arguments,
                                  std::unique_ptr<UpRoute> pull = nullptr) {
    std::unique_ptr<UpRoute> route = std::move(pull);
    if (auto up = arguments.flag("up")) {
        if (route) throw UsageError("pull takes --up-via-pull or --up, not both");
        route = std::make_unique<PostgresUpRoute>(*up);
    }
    if (!arguments.has("gzip-up")) return route;
    if (!route)
        throw UsageError("--gzip-up compresses uploads: it goes with --up or --up-via-pull");
    return std::make_unique<GzipUpRoute>(std::move(route));
}

std::string describe(const ApplyResult& result) {
    std::string text = outcome_name(result.outcome);
    if (!result.kind.empty()) {
        text +=
            " " + result.kind + " " + std::to_string(result.gen) + "." + std::to_string(result.seq);
    }
    if (result.untaken) text += ", " + std::to_string(result.untaken) + " rows untaken";
    if (!result.detail.empty()) text += ": " + result.detail;
    return text;
}

int serve(Replica& replica, const Arguments& arguments) {
    arguments.positionals(0);
    auto [host, port] = parse_listen_address(arguments.required("listen"));
    std::unique_ptr<Uploader> uploader;
    if (std::unique_ptr<UpRoute> route = up_route(arguments))
        uploader = std::make_unique<Uploader>(replica, std::move(route), upload_every(arguments));
    HttpServer server(host, port, kMaxMessageBytes, [&](const HttpRequest& request) {
        if (request.method == "GET") {
            return HttpResponse{200, "replica " + replica.id() + " generation " +
                                         std::to_string(replica.generation()) + " applied " +
                                         std::to_string(replica.applied_seq()) + "\n"};
        }
        if (request.method != "POST") return HttpResponse{405, "POST a message\n"};
        auto id = request.headers.find("message-id");
        std::string message_id = id == request.headers.end() ? "?" : id->second;
        // A message comes as it is or gzip (the sender's --gzip); Replica::apply tells them apart.
        auto encoding = request.headers.find("content-encoding");
        if (encoding != request.headers.end() && lowercase(encoding->second) != "gzip" &&
            lowercase(encoding->second) != "identity")
            return HttpResponse{415, "Content-Encoding " + encoding->second +
                                         " is not taken: send the message as it is, or gzip\n"};
        ApplyResult result;
        try {
            result = replica.apply(request.body);
        } catch (const std::exception& error) {
            log("message " + message_id + " not applied: " + error.what());
            return HttpResponse{503, std::string(error.what()) + "\n"};
        }
        log("message " + message_id + ": " + describe(result));
        if (result.outcome == Outcome::kApplied && uploader) uploader->poke();
        if (result.taken()) return HttpResponse{200, describe(result) + "\n"};
        int status = result.outcome == Outcome::kUnknownVersion ? 422 : 400;
        return HttpResponse{status, describe(result) + "\n"};
    });
    log("replica " + replica.id() + " listening on " + host + ":" + std::to_string(port));
    server.run(stop_requested);
    return kExitOk;
}

int nats(Replica& replica, const Arguments& arguments) {
    arguments.positionals(0);
    NatsSettings settings;
    settings.url = arguments.required("url");
    settings.prefix = arguments.flag("prefix").value_or(settings.prefix);
    settings.stream = arguments.flag("stream").value_or("");
    std::unique_ptr<Uploader> uploader;
    if (std::unique_ptr<UpRoute> route = up_route(arguments))
        uploader = std::make_unique<Uploader>(replica, std::move(route), upload_every(arguments));
    consume_nats(replica, settings, stop_requested, [&] {
        if (uploader) uploader->poke();
    });
    uploader.reset();
    nats_Close();
    return kExitOk;
}

int pull(Replica& replica, const Arguments& arguments) {
    arguments.positionals(0);
    PullSettings settings;
    settings.url = arguments.required("url");
    while (!settings.url.empty() && settings.url.back() == '/') settings.url.pop_back();
    settings.token = arguments.required("token");
    if (auto count = arguments.flag("die-before-ack")) {
        try {
            settings.die_before_ack = std::stol(*count);
        } catch (const std::exception&) {
            throw UsageError("--die-before-ack wants a number, got " + *count);
        }
    }
    std::unique_ptr<UpRoute> route =
        up_route(arguments,
                 arguments.has("up-via-pull") ? std::make_unique<PullUpRoute>(settings) : nullptr);
    std::unique_ptr<Uploader> uploader;
    if (route)
        uploader = std::make_unique<Uploader>(replica, std::move(route), upload_every(arguments));
    log("replica " + replica.id() + " pulling from " + settings.url);
    consume_pull(replica, settings, stop_requested, [&] {
        if (uploader) uploader->poke();
    });
    return kExitOk;
}

int apply(Replica& replica, const Arguments& arguments) {
    std::string file = arguments.positionals(1)[0];
    std::stringstream content;
    if (file == "-") {
        content << std::cin.rdbuf();
    } else {
        std::ifstream input(file, std::ios::binary);
        if (!input) throw std::runtime_error("cannot read " + file);
        content << input.rdbuf();
    }
    ApplyResult result;
    try {
        result = replica.apply(content.str());
    } catch (const StorageError& error) {
        std::cerr << "not applied: " << error.what() << std::endl;
        return kExitTransient;
    }
    std::cout << describe(result) << std::endl;
    if (result.outcome == Outcome::kUnknownVersion) return kExitTransient;
    return result.taken() ? kExitOk : kExitRefused;
}

std::string quoted(const std::string& text) {
    std::string out;
    protocol::append_json_string(out, text);
    return out;
}

void show_json(Replica& replica) {
    std::string out = "{\"replica\":" + quoted(replica.id()) +
                      ",\"gen\":" + std::to_string(replica.generation()) +
                      ",\"applied\":" + std::to_string(replica.applied_seq()) + ",\"tables\":{";
    bool first_table = true;
    for (const std::string& table : replica.tables()) {
        out += (first_table ? "" : ",") + quoted(table) + ":[";
        first_table = false;
        bool first = true;
        for (const VisibleRow& row : replica.rows(table)) {
            out += std::string(first ? "" : ",") + "{\"k\":" + row.key + ",\"r\":" + row.json +
                   ",\"local\":" + (row.local ? "true" : "false") + "}";
            first = false;
        }
        out += "]";
    }
    out += "},\"held\":{";
    std::string table;
    for (const HeldRow& row : replica.held_rows()) {
        if (row.table != table) {
            out += (table.empty() ? "" : "],") + quoted(row.table) + ":[";
        } else {
            out += ",";
        }
        table = row.table;
        out += "{\"k\":" + row.key + ",\"r\":" + row.json + ",\"scope\":" + quoted(row.scope) +
               ",\"h\":\"" + protocol::to_hex(row.hash) + "\"}";
    }
    out += (table.empty() ? "" : "]");
    out += "},\"local_writes\":[";
    bool first = true;
    for (const LocalWrite& write : replica.local_writes()) {
        out += std::string(first ? "" : ",") + "{\"id\":" + std::to_string(write.id) +
               ",\"t\":" + quoted(write.table) + ",\"k\":" + write.key + ",\"r\":" + write.json +
               ",\"upload\":" + (write.upload ? quoted(*write.upload) : "null") + "}";
        first = false;
    }
    out += "],\"kept\":[";
    first = true;
    for (const KeptWrite& kept : replica.kept()) {
        out += std::string(first ? "" : ",") + "{\"t\":" + quoted(kept.table) +
               ",\"k\":" + kept.key + ",\"r\":" + kept.json.value_or("null") +
               ",\"why\":" + quoted(kept.why) + ",\"upload\":" + quoted(kept.upload) + "}";
        first = false;
    }
    out += "],\"holds\":{";
    first = true;
    for (const ScopeHolding& holding : replica.holdings()) {
        out += std::string(first ? "" : ",") + quoted(holding.scope) +
               ":{\"through\":" + std::to_string(holding.through) + ",\"fp\":\"" +
               holding.fingerprint.hex() + "\",\"n\":" + std::to_string(holding.fingerprint.count) +
               "}";
        first = false;
    }
    out += "},\"notices\":[";
    first = true;
    for (const std::string& notice : replica.notices()) {
        out += std::string(first ? "" : ",") + quoted(notice);
        first = false;
    }
    out += "]}";
    std::cout << out << std::endl;
}

void show_text(Replica& replica) {
    std::cout << "replica " << replica.id() << "  generation " << replica.generation()
              << "  applied through seq " << replica.applied_seq() << "\n";
    for (const std::string& table : replica.tables()) {
        std::vector<VisibleRow> rows = replica.rows(table);
        std::cout << "\n" << table << " (" << rows.size() << " rows)\n";
        for (const VisibleRow& row : rows) {
            std::cout << "  " << row.json << (row.local ? "   [local write, not filed yet]" : "")
                      << "\n";
        }
    }
    std::vector<LocalWrite> writes = replica.local_writes();
    if (!writes.empty()) std::cout << "\nlocal writes not filed yet\n";
    for (const LocalWrite& write : writes) {
        std::cout << "  #" << write.id << " " << write.table << " " << write.key << " "
                  << (write.upload ? "in upload " + *write.upload : "pending") << "\n";
    }
    std::vector<KeptWrite> kept = replica.kept();
    if (!kept.empty()) std::cout << "\nkept by the server (not filed)\n";
    for (const KeptWrite& write : kept) {
        std::cout << "  " << write.table << " " << write.key << ": " << write.why << "\n";
    }
    std::vector<ScopeHolding> holdings = replica.holdings();
    if (!holdings.empty()) std::cout << "\nscopes\n";
    for (const ScopeHolding& holding : holdings) {
        std::cout << "  " << holding.scope << "  through " << holding.through << "  n "
                  << holding.fingerprint.count << "\n";
    }
    std::vector<std::string> notices = replica.notices();
    if (!notices.empty()) std::cout << "\nnotices\n";
    for (size_t i = notices.size() > 10 ? notices.size() - 10 : 0; i < notices.size(); ++i) {
        std::cout << "  " << notices[i] << "\n";
    }
}

int show(Replica& replica, const Arguments& arguments) {
    arguments.positionals(0);
    if (arguments.has("json")) {
        show_json(replica);
    } else {
        show_text(replica);
    }
    return kExitOk;
}

std::vector<std::string> split_columns(const std::string& text) {
    std::vector<std::string> columns;
    std::stringstream stream(text);
    std::string column;
    while (std::getline(stream, column, ',')) {
        if (column.empty()) throw UsageError("--key has an empty column name");
        columns.push_back(column);
    }
    return columns;
}

int write(Replica& replica, const Arguments& arguments) {
    const std::vector<std::string>& args = arguments.positionals(2);
    std::vector<std::string> key;
    if (auto columns = arguments.flag("key")) key = split_columns(*columns);
    LocalWrite written = replica.write(args[0], args[1], key);
    std::cout << "queued " << written.table << " " << written.key << " (local write #" << written.id
              << ")" << std::endl;
    return kExitOk;
}

int upload(Replica& replica, const Arguments& arguments) {
    arguments.positionals(0);
    if (auto id = arguments.flag("sent")) {
        replica.mark_sent(*id);
        return kExitOk;
    }
    if (std::unique_ptr<UpRoute> route = up_route(arguments)) {
        try {
            for (const std::string& id : send_uploads(replica, *route))
                std::cout << id << std::endl;
        } catch (const UpRouteError& error) {
            std::cerr << "magic-sync-replica: " << error.what()
                      << "\n(the upload is kept and goes again under the same id)" << std::endl;
            return kExitFailed;
        }
        return kExitOk;
    }
    if (std::optional<PreparedUpload> prepared = replica.prepare_upload()) {
        std::cout << prepared->body << std::endl;
    } else {
        std::cerr << "nothing to upload" << std::endl;
    }
    return kExitOk;
}

int holds(Replica& replica, const Arguments& arguments) {
    arguments.positionals(0);
    bool verify = arguments.has("verify");
    int status = kExitOk;
    for (const ScopeHolding& holding : replica.holdings()) {
        std::cout << holding.scope << " through=" << holding.through
                  << " n=" << holding.fingerprint.count << " fp=" << holding.fingerprint.hex();
        if (verify) {
            protocol::Fingerprint recomputed = replica.recompute(holding.scope);
            bool same = recomputed == holding.fingerprint;
            std::cout << (same ? " verified"
                               : " DIFFERS from the stored rows: n=" +
                                     std::to_string(recomputed.count) + " fp=" + recomputed.hex());
            if (!same) status = kExitFailed;
        }
        std::cout << "\n";
    }
    return status;
}

bool is_uuid(const std::string& text) {
    if (text.size() != 36) return false;
    for (size_t i = 0; i < text.size(); ++i) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? text[i] != '-' : !std::isxdigit(static_cast<unsigned char>(text[i]))) {
            return false;
        }
    }
    return true;
}

int run(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    std::optional<std::string> id, db;
    Options options;
    size_t i = 0;
    for (; i < args.size() && args[i].compare(0, 2, "--") == 0; ++i) {
        const std::string& arg = args[i];
        if (arg == "--help") {
            std::cout << kProgramHelp;
            return kExitOk;
        }
        if (arg != "--id" && arg != "--db" && arg != "--refuse-table") {
            throw UsageError("unknown option " + arg);
        }
        if (i + 1 >= args.size()) throw UsageError(arg + " needs a value");
        const std::string& value = args[++i];
        if (arg == "--id") id = value;
        if (arg == "--db") db = value;
        if (arg == "--refuse-table") options.refuse_tables.insert(value);
    }
    if (i >= args.size()) throw UsageError("no command given");
    std::string command = args[i];
    std::vector<std::string> rest(args.begin() + static_cast<long>(i) + 1, args.end());
    auto help = kCommandHelp.find(command);
    if (help == kCommandHelp.end()) throw UsageError("unknown command " + command);
    if (std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
        std::cout << help->second;
        return kExitOk;
    }
    if (!id) throw UsageError("--id UUID is required");
    if (!db) throw UsageError("--db FILE is required");
    std::string replica_id = *id;
    for (char& c : replica_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!is_uuid(replica_id)) throw UsageError("--id must be a UUID, got " + *id);

    static const std::map<std::string,
                          std::pair<std::vector<std::string>, std::vector<std::string>>>
        kOptions = {
            {"serve", {{"listen", "up", "upload-every"}, {"gzip-up"}}},
            {"nats", {{"url", "prefix", "stream", "up", "upload-every"}, {"gzip-up"}}},
            {"pull",
             {{"url", "token", "up", "upload-every", "die-before-ack"},
              {"up-via-pull", "gzip-up"}}},
            {"apply", {{}, {}}},
            {"show", {{}, {"json"}}},
            {"write", {{"key"}, {}}},
            {"upload", {{"up", "sent"}, {"gzip-up"}}},
            {"holds", {{}, {"verify"}}},
        };
    const auto& [flags, switches] = kOptions.at(command);
    Arguments arguments(command, rest, flags, switches);

    Replica replica(*db, replica_id, options);
    if (command == "serve" || command == "nats" || command == "pull") install_stop_handlers();
    if (command == "serve") return serve(replica, arguments);
    if (command == "nats") return nats(replica, arguments);
    if (command == "pull") return pull(replica, arguments);
    if (command == "apply") return apply(replica, arguments);
    if (command == "show") return show(replica, arguments);
    if (command == "write") return write(replica, arguments);
    if (command == "upload") return upload(replica, arguments);
    return holds(replica, arguments);
}

}  // namespace

}  // namespace magic_sync::replica

int main(int argc, char** argv) {
    try {
        return magic_sync::replica::run(argc, argv);
    } catch (const magic_sync::replica::UsageError& error) {
        std::cerr << "magic-sync-replica: " << error.what()
                  << "\n(magic-sync-replica --help lists the commands)" << std::endl;
        return magic_sync::replica::kExitUsage;
    } catch (const std::exception& error) {
        std::cerr << "magic-sync-replica: " << error.what() << std::endl;
        return magic_sync::replica::kExitFailed;
    }
}
