// bench/fanout: the fan-out measured at the server (issue 38). One throwaway cluster with the relay
// worker, a catalog table and N live replicas (default 10,000), a real magic-sync-sender over http
// or nats, and one ack-only sink answering for every replica (bench/fanout/sink.hpp), so that
// what is measured is the server's part, not the replicas'.
//   1. Provisioning: the N replicas inserted in one statement until every one acknowledged its
//      first message and the server shows it confirmed at its scope's head; µs per replica.
//   2. Rounds: one transaction changes ROWS catalog rows (the first inserts them, the others
//      update them); from its commit to the last acknowledgement at the sink (every replica
//      received the ROWS rows, counted at the sink) and to every replica confirmed at head, the
//      messages and bytes delivered, and the CPU the server (every PostgreSQL process, the relay
//      worker apart) and the sender used per delivered message; the sink's CPU apart.
//
//   build/bench/fanout [--transport http|nats] [--replicas N] [--rounds R] [--rows ROWS]
//                      [--concurrency C] [--gzip] [--patience SECONDS] [--statements N]
// --rounds 0 measures provisioning only; --patience gives a step up after that long (default
// 900 s); --statements prints the N statements that took the most time in each step. `make
// bench-fanout` runs http and nats at 10,000 replicas and provisioning at 100,000 (bench/README.md,
// "Fan-out at the server").
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fanout/sink.hpp"
#include "server/cpu.hpp"
#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"

namespace {

using namespace magic_sync::test;
using namespace magic_sync::bench;

// The catalog holds a few rows when the replicas are provisioned; the rounds add and change
// the rows they measure.
constexpr int kFirstRows = 10;
const char* const kShop = R"sql(
    CREATE TABLE registers (id uuid PRIMARY KEY);
    CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
    SELECT sync.replicas('registers', 'registers');
    SELECT sync.catalog('products');
    INSERT INTO products SELECT i, 'product ' || i, i FROM generate_series(1, 10) i;
)sql";

struct Options {
    std::string transport = "http";
    int replicas = 10000;
    int rounds = 3;
    int rows = 2000;
    int concurrency = 64;
    bool gzip = false;                  // the sender sends every message gzip
    int patience = 900;                 // seconds to wait for a step before giving up
    int statements = 0;                 // print the statements that took the most time in each step
    std::vector<std::string> settings;  // postgresql.conf lines, as name = value
};

const char* const kUsage =
    "usage: build/bench/fanout [--transport http|nats] [--replicas N] [--rounds R] [--rows ROWS]\n"
    "                          [--concurrency C] [--gzip] [--patience SECONDS] [--statements N]\n"
    "                          [--setting NAME=VALUE]...\n"
    "The fan-out measured at the server: N live replicas (default 10,000) answered by one\n"
    "ack-only sink, R rounds (default 3) of ROWS changed catalog rows (default 2,000), each from\n"
    "its commit to the last acknowledgement, with the server's CPU per delivered message.\n"
    "  --rounds 0         measure provisioning only\n"
    "  --concurrency C    the sender's messages in flight (default 64)\n"
    "  --gzip             the sender sends every message gzip (magic-sync-sender --gzip)\n"
    "  --patience S       give a step up after S seconds (default 900)\n"
    "  --statements N     print the N statements that took the most time in each step\n"
    "  --setting N=V      a server setting, as in postgresql.conf "
    "(magic_sync.rows_per_message=1000)\n";

Options parse(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string name = argv[i];
        if (name == "--help" || name == "-h") {
            std::printf("%s", kUsage);
            std::exit(0);
        }
        if (name == "--gzip") {
            options.gzip = true;
            continue;
        }
        if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
        const std::string value = argv[++i];
        if (name == "--transport" && (value == "http" || value == "nats"))
            options.transport = value;
        else if (name == "--replicas")
            options.replicas = std::stoi(value);
        else if (name == "--rounds")
            options.rounds = std::stoi(value);
        else if (name == "--rows")
            options.rows = std::stoi(value);
        else if (name == "--concurrency")
            options.concurrency = std::stoi(value);
        else if (name == "--patience")
            options.patience = std::stoi(value);
        else if (name == "--statements")
            options.statements = std::stoi(value);
        else if (name == "--setting" && value.find('=') != std::string::npos)
            options.settings.push_back(value.substr(0, value.find('=')) + " = '" +
                                       value.substr(value.find('=') + 1) + "'");
        else
            throw std::invalid_argument("unknown option " + name + " " + value);
    }
    return options;
}

std::atomic<bool> interrupted{false};

// Whether something listens on the loopback port.
bool listening(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    close(fd);
    return connected;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

double thread_cpu_seconds() {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

double process_cpu_seconds() {
    rusage self{};
    getrusage(RUSAGE_SELF, &self);
    return self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 + self.ru_stime.tv_sec +
           self.ru_stime.tv_usec / 1e6;
}

// CPU seconds used so far by each part.
struct Cpu {
    double cluster = 0;          // every PostgreSQL process
    double relay = 0;            // of which the relay worker
    double sender_backend = 0;   // the sender's session (sync.next, sync.message, sync.sent)
    double reports_backend = 0;  // the sink's uploads (sync.receive)
    double sender = 0;           // the magic-sync-sender process
    double nats_server = 0;
    double sink = 0;  // this process but its main thread, which only waits and asks

    Cpu operator-(const Cpu& before) const {
        return Cpu{cluster - before.cluster,
                   relay - before.relay,
                   sender_backend - before.sender_backend,
                   reports_backend - before.reports_backend,
                   sender - before.sender,
                   nats_server - before.nats_server,
                   sink - before.sink};
    }
};

class Rig {
  public:
    explicit Rig(const Options& options)
        : options_(options),
          deployment_("fanout", settings(options), "shop", kShop),
          replicas_(ids(options)) {
        postmaster_ = postmaster_pid(deployment_.cluster().directory() + "/data");
        std::vector<std::string> sender{deployment_.bin() + "/magic-sync-sender",
                                        "--db",
                                        deployment_.conninfo() + " application_name=fanout_sender",
                                        "--report",
                                        "0",
                                        "--concurrency",
                                        std::to_string(options.concurrency),
                                        "--transport",
                                        options.transport};
        if (options.gzip) sender.push_back("--gzip");
        if (options.transport == "http") {
            http_ = std::make_unique<HttpSink>(replicas_);
            sender.insert(sender.end(), {"--url", http_->url()});
        } else {
            const int port = free_port();
            const std::string url = "nats://127.0.0.1:" + std::to_string(port);
            nats_server_ = std::make_unique<Process>(
                std::vector<std::string>{"/usr/sbin/nats-server", "-js", "-a", "127.0.0.1", "-p",
                                         std::to_string(port), "-sd",
                                         deployment_.directory() + "/nats"},
                deployment_.directory() + "/nats-server.log");
            if (!eventually([&] { return listening(port); }, std::chrono::seconds(20)))
                throw std::runtime_error("nats-server did not start");
            nats_ = std::make_unique<NatsSink>(replicas_, url, "magic_sync");
            sender.insert(sender.end(), {"--nats-url", url, "--nats-prefix", "magic_sync"});
        }
        reporter_ = std::make_unique<Reporter>(replicas_, deployment_.conninfo(),
                                               std::chrono::milliseconds(100));
        sender_ = std::make_unique<Process>(sender, deployment_.directory() + "/sender.log");
    }
    ~Rig() {
        sender_.reset();
        reporter_.reset();
        http_.reset();
        nats_.reset();
        nats_server_.reset();
    }

    // Inserts the replicas, waits until each acknowledged its first message and the server shows
    // every one confirmed at head; prints the time.
    void provision() {
        replicas_.begin_round(kFirstRows);
        reset_statements();
        const Clock::time_point start = Clock::now();
        deployment_.db().query(
            "INSERT INTO registers SELECT ('00000000-0000-0000-0000-' || lpad(g::text, 12, "
            "'0'))::uuid FROM generate_series(1, $1::int) g",
            {std::to_string(options_.replicas)});
        wait_for("the relay wrote every replica's first message", [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            return deployment_.db().value(
                       "SELECT count(DISTINCT replica) FROM sync.member WHERE sent > 0") ==
                   std::to_string(options_.replicas);
        });
        const Clock::time_point written = Clock::now();
        std::printf("  the relay wrote every replica's first message at %.1f s\n",
                    seconds_between(start, written));
        std::fflush(stdout);
        wait_for("every replica acknowledged its first message",
                 [&] { return replicas_.complete() == options_.replicas; });
        const Clock::time_point acknowledged = Clock::now();
        wait_for("every replica confirmed at head", [&] { return confirmed_at_head(); });
        const double seconds = seconds_between(start, Clock::now());
        std::printf(
            "provisioned %d replicas over %s: %.1f s, %.0f µs per replica (every first message"
            " written at %.1f s, acknowledged at %.1f s, then confirmed); %lld messages, %lld"
            " uploads\n",
            options_.replicas, options_.transport.c_str(), seconds,
            seconds * 1e6 / options_.replicas, seconds_between(start, written),
            seconds_between(start, acknowledged),
            static_cast<long long>(replicas_.round().messages),
            static_cast<long long>(reporter_->uploads()));
        std::fflush(stdout);
        print_statements();
        relay_pid_ = std::stoi(deployment_.db().value("SELECT sync_internal.relay_lock_holder()"));
        sender_backend_pid_ = std::stoi(deployment_.db().value(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'fanout_sender'"));
    }

    struct Figures {
        double to_last_ack = 0, to_confirmed = 0;
        double server_per_message = 0;  // µs, the cluster and the sender
    };

    // One transaction changes the round's rows; waits for every replica to receive them and
    // the server to show every one confirmed at head.
    Figures round(int number) {
        const std::string change =
            number == 1
                ? "INSERT INTO products SELECT i, 'product ' || i, i FROM "
                  "generate_series(" +
                      std::to_string(kFirstRows + 1) + ", " +
                      std::to_string(kFirstRows + options_.rows) + ") i"
                : "UPDATE products SET price = price + 1 WHERE id > " + std::to_string(kFirstRows);
        replicas_.begin_round(options_.rows);
        const int64_t uploads_before = reporter_->uploads();
        reset_statements();
        const Cpu before = cpu();
        deployment_.db().query(change);
        const Clock::time_point committed = Clock::now();
        wait_for("every replica received the round's rows",
                 [&] { return replicas_.complete() == options_.replicas; });
        const Replicas::Round at_last_ack = replicas_.round();
        wait_for("every replica confirmed at head", [&] { return confirmed_at_head(); });
        const Clock::time_point confirmed = Clock::now();
        const Cpu used = cpu() - before;
        const Replicas::Round taken = replicas_.round();
        if (taken.fewest_rows != options_.rows || taken.most_rows != options_.rows ||
            taken.refused != 0)
            throw std::runtime_error("a replica received " + std::to_string(taken.fewest_rows) +
                                     " to " + std::to_string(taken.most_rows) + " rows, " +
                                     std::to_string(taken.refused) + " messages refused");

        Figures figures;
        figures.to_last_ack = seconds_between(committed, at_last_ack.last_taken);
        figures.to_confirmed = seconds_between(committed, confirmed);
        const double messages = static_cast<double>(taken.messages);
        figures.server_per_message = (used.cluster + used.sender) * 1e6 / messages;
        std::printf(
            "round %d (%s of %d rows): commit -> last ack %.2f s (first ack %.2f s), every "
            "replica confirmed at head %.2f s\n"
            "  delivered %lld messages, %.1f MB (%.1f kB each), %lld duplicates; every replica"
            " received %d rows; %lld uploads\n"
            "  CPU s: cluster %.2f (relay worker %.2f, sender's session %.2f, uploads' session"
            " %.2f), sender %.2f, nats-server %.2f, sink %.2f\n"
            "  per delivered message: server %.1f µs (PostgreSQL %.1f + sender %.1f), sink %.1f"
            " µs\n",
            number, number == 1 ? "insert" : "update", options_.rows, figures.to_last_ack,
            seconds_between(committed, at_last_ack.first_taken), figures.to_confirmed,
            static_cast<long long>(taken.messages), taken.bytes / 1e6, taken.bytes / 1e3 / messages,
            static_cast<long long>(taken.duplicates), options_.rows,
            static_cast<long long>(reporter_->uploads() - uploads_before), used.cluster, used.relay,
            used.sender_backend, used.reports_backend, used.sender, used.nats_server, used.sink,
            figures.server_per_message, used.cluster * 1e6 / messages, used.sender * 1e6 / messages,
            used.sink * 1e6 / messages);
        std::fflush(stdout);
        print_statements();
        return figures;
    }

  private:
    // With --statements, pg_stat_statements counts every statement, those inside functions and
    // the relay's own included.
    static std::vector<std::string> settings(const Options& options) {
        std::vector<std::string> settings = options.settings;
        if (options.statements == 0) return settings;
        settings.push_back("shared_preload_libraries = 'magic_sync, pg_stat_statements'");
        settings.push_back("pg_stat_statements.track = all");
        return settings;
    }

    void reset_statements() {
        if (options_.statements == 0) return;
        deployment_.db().query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        deployment_.db().query("SELECT pg_stat_statements_reset()");
    }

    void print_statements() {
        if (options_.statements == 0) return;
        for (const auto& row : deployment_.db().query(
                 "SELECT round(total_exec_time::numeric), calls, round((total_exec_time / "
                 "calls)::numeric, 3),"
                 " left(regexp_replace(query, '\\s+', ' ', 'g'), 150) FROM pg_stat_statements"
                 " ORDER BY total_exec_time DESC LIMIT $1::int",
                 {std::to_string(options_.statements)}))
            std::printf("    %8s ms %8s calls %9s ms each  %s\n", row[0]->c_str(), row[1]->c_str(),
                        row[2]->c_str(), row[3]->c_str());
        std::fflush(stdout);
    }

    static std::vector<std::string> ids(const Options& options) {
        std::vector<std::string> ids;
        for (int n = 1; n <= options.replicas; ++n) ids.push_back(replica_id(n));
        return ids;
    }

    template <typename Condition>
    void wait_for(const std::string& what, Condition condition) {
        const Clock::time_point deadline = Clock::now() + std::chrono::seconds(options_.patience);
        Clock::time_point said = Clock::now();
        while (!condition()) {
            if (Clock::now() - said > std::chrono::seconds(30)) {
                said = Clock::now();
                std::printf("  waiting until %s: %lld of %d replicas received the rows so far\n",
                            what.c_str(), static_cast<long long>(replicas_.complete()),
                            options_.replicas);
                std::fflush(stdout);
            }
            if (interrupted) throw std::runtime_error("interrupted while waiting until " + what);
            if (Clock::now() > deadline || !sender_->running())
                throw std::runtime_error(
                    "not within " + std::to_string(options_.patience) + " s: " + what +
                    "; the server: " + server_state() +
                    "; uploads failed: " + std::to_string(reporter_->failures()) +
                    "; the sender's log:\n" + sender_->log());
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }

    // Every replica is a member of its scopes (the catalog's and its own) with every cursor at the
    // scope's head, and nothing is left in the outbox or the notes: every message was delivered and
    // confirmed.
    bool confirmed_at_head() {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return deployment_.db().value(
                   "SELECT count(DISTINCT m.replica) = $1::int AND bool_and(m.sent = s.head AND"
                   " m.confirmed = s.head) AND NOT EXISTS (SELECT FROM sync.outbox) AND NOT"
                   " EXISTS (SELECT FROM sync.note) FROM sync.member m JOIN sync.scope s ON s.id"
                   " = m.scope",
                   {std::to_string(options_.replicas)}) == "t";
    }

    // What the server shows of the delivery, for a failure's message.
    std::string server_state() {
        return deployment_.db().value(
            "SELECT format('%s members, %s sent at head, %s confirmed at head, %s in the outbox"
            " (%s unsent), %s notes, %s confirmations waiting', count(*),"
            " count(*) FILTER (WHERE m.sent = s.head), count(*) FILTER (WHERE m.confirmed ="
            " s.head), (SELECT count(*) FROM sync.outbox), (SELECT count(*) FROM sync.outbox"
            " WHERE sent_at IS NULL), (SELECT count(*) FROM sync.note), (SELECT count(*) FROM"
            " sync.confirmation)) FROM sync.member m JOIN sync.scope s ON s.id = m.scope");
    }

    Cpu cpu() const {
        Cpu now;
        now.cluster = cluster_cpu_seconds(postmaster_);
        now.relay = cpu_seconds(relay_pid_);
        now.sender_backend = cpu_seconds(sender_backend_pid_);
        now.reports_backend = cpu_seconds(reporter_->backend_pid());
        now.sender = cpu_seconds(sender_->pid());
        now.nats_server = nats_server_ ? cpu_seconds(nats_server_->pid()) : 0;
        now.sink = process_cpu_seconds() - thread_cpu_seconds();
        return now;
    }

    Options options_;
    Deployment deployment_;
    Replicas replicas_;
    pid_t postmaster_ = 0, relay_pid_ = 0, sender_backend_pid_ = 0;
    std::unique_ptr<Process> nats_server_;
    std::unique_ptr<HttpSink> http_;
    std::unique_ptr<NatsSink> nats_;
    std::unique_ptr<Reporter> reporter_;
    std::unique_ptr<Process> sender_;
};

void bench(const Options& options) {
    std::printf(
        "fan-out over %s: %d live replicas, an ack-only sink, %d rows a round, %d rounds,"
        " sender --concurrency %d%s; %ld cores\n",
        options.transport.c_str(), options.replicas, options.rows, options.rounds,
        options.concurrency, options.gzip ? " --gzip" : "", sysconf(_SC_NPROCESSORS_ONLN));
    for (const std::string& setting : options.settings) std::printf("  %s\n", setting.c_str());
    std::fflush(stdout);
    Rig rig(options);
    rig.provision();
    if (options.rounds == 0) return;
    std::vector<double> to_last_ack, to_confirmed, per_message;
    for (int number = 1; number <= options.rounds; ++number) {
        const Rig::Figures figures = rig.round(number);
        to_last_ack.push_back(figures.to_last_ack);
        to_confirmed.push_back(figures.to_confirmed);
        per_message.push_back(figures.server_per_message);
    }
    std::printf(
        "fan-out over %s, %d rows to %d replicas, median of %d rounds: commit -> last ack %.2f s"
        " (goal <= 10 s: %s), every replica confirmed %.2f s, server CPU per delivered message"
        " %.1f µs\n",
        options.transport.c_str(), options.rows, options.replicas, options.rounds,
        median(to_last_ack), median(to_last_ack) <= 10 ? "met" : "not met", median(to_confirmed),
        median(per_message));
}

}  // namespace

// A failure or an interruption returns from main, so that every process the rig started is
// stopped and the cluster removed on the way out.
int main(int argc, char** argv) {
    struct sigaction on_signal {};
    on_signal.sa_handler = [](int) { interrupted = true; };
    sigaction(SIGINT, &on_signal, nullptr);
    sigaction(SIGTERM, &on_signal, nullptr);
    try {
        bench(parse(argc, argv));
        return 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "bench/fanout: %s\n", error.what());
        return 1;
    }
}
