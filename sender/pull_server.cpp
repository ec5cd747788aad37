#include "pull_server.hpp"

#include <httplib.h>
#include <libpq-fe.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "database.hpp"
#include "libpq/connection.hpp"
#include "log.hpp"

namespace magic_sync::sender {

namespace {

using Clock = std::chrono::steady_clock;
using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// Database connections for the requests: each holds one only for its statements, never while it
// waits, so a few serve many devices.
constexpr size_t kPoolConnections = 8;
// Larger than magic_sync.max_upload_bytes' default, so that sync.receive keeps and answers an
// upload over the database's limit itself; a body over this one is answered 413.
constexpr size_t kMaxUploadBytes = 64 * 1024 * 1024;
constexpr std::chrono::milliseconds kLongestListenRetry{30000};

// The statements, prepared on every connection; every value from a request is a bound parameter.
constexpr const char* kTokenStatement = "magic_sync_pull_token";
struct Statement {
    const char* name;
    const char* text;
};
constexpr Statement kHead{
    "magic_sync_pull_head",
    "SELECT message_id, message, origin FROM sync.pull_head($1::uuid, $2::interval)"};
constexpr Statement kAck{"magic_sync_pull_ack", "SELECT sync.pull_ack($1::uuid, $2::text)"};
constexpr Statement kRefused{"magic_sync_pull_refused",
                             "SELECT sync.pull_refused($1::uuid, $2::text, $3::text)"};
constexpr Statement kReceive{"magic_sync_pull_receive", "SELECT sync.receive($1::uuid, $2::bytea)"};
constexpr Statement kStatements[] = {kHead, kAck, kRefused, kReceive};

std::string lowercase(std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text;
}

// A device's words for the log and sync.replica.last_error: printable ASCII, at most 1,000
// characters (anything else would be refused as text by the database, or garble a log line).
std::string printable(const std::string& text, const char* if_empty) {
    std::string kept;
    for (const char c : text.substr(0, 1000)) kept += c >= 0x20 && c <= 0x7e ? c : '?';
    return kept.empty() ? if_empty : kept;
}

bool is_uuid(const std::string& text) {
    if (text.size() != 36) return false;
    for (size_t i = 0; i < text.size(); ++i) {
        const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? text[i] != '-' : !std::isxdigit(static_cast<unsigned char>(text[i])))
            return false;
    }
    return true;
}

// A request that cannot be served: its status and why, the body of the answer.
struct Refusal {
    int status;
    std::string why;
};

// A database connection of the pool's, with the statements prepared.
PGconn* connect_prepared(const std::string& conninfo, const std::string& token_query) {
    PGconn* connection = nullptr;
    try {
        // The string parsed (checked at start): libpq's message names host and port, never the
        // password.
        connection = libpq::connect(conninfo);
        libpq::prepare(connection, kTokenStatement, token_query.c_str());
        for (const Statement& statement : kStatements)
            libpq::prepare(connection, statement.name, statement.text);
    } catch (const libpq::Failure& e) {
        PQfinish(connection);
        if (connection == nullptr)
            throw Refusal{503, "database unavailable: " + libpq::first_line(e.what())};
        throw Refusal{pull_failure_status(e.sqlstate(), e.lost()), e.what()};
    }
    return connection;
}

class ConnectionPool {
  public:
    ConnectionPool(std::string conninfo, std::string token_query)
        : conninfo_(std::move(conninfo)), token_query_(std::move(token_query)) {}
    ~ConnectionPool() {
        for (PGconn* connection : idle_) PQfinish(connection);
    }

    // A connection for one request's statements, given back when it goes (closed when a
    // statement found it broken).
    class Borrowed {
      public:
        Borrowed(ConnectionPool& pool, PGconn* connection) : pool_(pool), connection_(connection) {}
        ~Borrowed() { pool_.give_back(connection_); }
        Borrowed(const Borrowed&) = delete;
        Borrowed& operator=(const Borrowed&) = delete;

        PGconn* get() const { return connection_; }

        // Runs a prepared statement; throws Refusal with the status its failure calls for.
        Result execute(const char* statement, const std::vector<const char*>& values,
                       const std::vector<int>& lengths, const std::vector<int>& formats,
                       int result_format) {
            Result result(
                PQexecPrepared(connection_, statement, static_cast<int>(values.size()),
                               values.data(), lengths.data(), formats.data(), result_format),
                PQclear);
            if (PQresultStatus(result.get()) == PGRES_TUPLES_OK) return result;
            const char* sqlstate = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
            const bool lost = PQstatus(connection_) != CONNECTION_OK;
            const char* primary = PQresultErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY);
            const std::string why =
                primary != nullptr ? primary : libpq::first_line(PQerrorMessage(connection_));
            throw Refusal{pull_failure_status(sqlstate == nullptr ? "" : sqlstate, lost), why};
        }

      private:
        ConnectionPool& pool_;
        PGconn* connection_;
    };

    // Waits while every connection is out; connects when there are fewer than the most.
    std::unique_ptr<Borrowed> borrow() {
        std::unique_lock<std::mutex> lock(mutex_);
        given_back_.wait(lock, [&] { return !idle_.empty() || open_ < kPoolConnections; });
        if (!idle_.empty()) {
            PGconn* connection = idle_.back();
            idle_.pop_back();
            return std::make_unique<Borrowed>(*this, connection);
        }
        ++open_;
        lock.unlock();
        try {
            return std::make_unique<Borrowed>(*this, connect_prepared(conninfo_, token_query_));
        } catch (...) {
            give_back(nullptr);
            throw;
        }
    }

  private:
    void give_back(PGconn* connection) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (connection != nullptr && PQstatus(connection) == CONNECTION_OK &&
                PQtransactionStatus(connection) == PQTRANS_IDLE) {
                idle_.push_back(connection);
            } else {
                if (connection != nullptr) PQfinish(connection);
                --open_;
            }
        }
        given_back_.notify_one();
    }

    const std::string conninfo_;
    const std::string token_query_;
    std::mutex mutex_;
    std::condition_variable given_back_;
    std::vector<PGconn*> idle_;
    size_t open_ = 0;  // idle and out
};

// One connection that LISTENs on magic_sync (the relay notifies it after a pass wrote messages)
// and wakes the waiting long polls. While it is away nothing wakes them; once it is back they all
// look again, for what came meanwhile.
class Wakeups {
  public:
    explicit Wakeups(std::string conninfo)
        : conninfo_(std::move(conninfo)), stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
        if (stop_fd_ < 0) throw std::runtime_error("eventfd failed");
        thread_ = std::thread([this] { listen(); });
    }
    ~Wakeups() {
        stop();
        thread_.join();
        close(stop_fd_);
    }

    // How many wake-ups there were: what a request saw before it looked at its outbox.
    uint64_t seen() {
        std::lock_guard<std::mutex> lock(mutex_);
        return wakeups_;
    }
    // Waits for a wake-up after `seen` until `deadline`; false when none came or we are stopping.
    bool wait(uint64_t seen, Clock::time_point deadline) {
        std::unique_lock<std::mutex> lock(mutex_);
        woken_.wait_until(lock, deadline, [&] { return stopping_ || wakeups_ != seen; });
        return !stopping_ && wakeups_ != seen;
    }
    bool stopping() {
        std::lock_guard<std::mutex> lock(mutex_);
        return stopping_;
    }
    // Ends every wait, now and later.
    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        woken_.notify_all();
        const uint64_t one = 1;
        [[maybe_unused]] const ssize_t written = write(stop_fd_, &one, sizeof one);
    }

  private:
    void wake_all() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ++wakeups_;
        }
        woken_.notify_all();
    }

    // Waits on the socket (or, with -1, only) until it is readable or we stop; false when
    // stopping.
    bool await(int socket, int timeout_ms) {
        pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {socket, POLLIN, 0}};
        poll(fds, socket < 0 ? 1 : 2, timeout_ms);
        return (fds[0].revents & POLLIN) == 0;
    }

    void listen() {
        std::chrono::milliseconds retry{1000};
        bool away_logged = false;
        while (!stopping()) {
            PGconn* connection = PQconnectdb(conninfo_.c_str());
            Result listening(connection != nullptr && PQstatus(connection) == CONNECTION_OK
                                 ? PQexec(connection, "LISTEN magic_sync")
                                 : nullptr,
                             PQclear);
            if (PQresultStatus(listening.get()) != PGRES_COMMAND_OK) {
                if (!away_logged)
                    log_line("cannot LISTEN magic_sync (" +
                             libpq::first_line(PQerrorMessage(connection)) +
                             "); long polls wait out --wait until it works, retrying");
                away_logged = true;
                PQfinish(connection);
                if (!await(-1, static_cast<int>(retry.count()))) return;
                retry = std::min(retry * 2, kLongestListenRetry);
                continue;
            }
            if (away_logged) log_line("listening on magic_sync again");
            away_logged = false;
            retry = std::chrono::milliseconds(1000);
            wake_all();  // what arrived while nobody listened
            while (await(PQsocket(connection), -1)) {
                if (PQconsumeInput(connection) != 1) break;
                bool notified = false;
                while (PGnotify* notify = PQnotifies(connection)) {
                    notified = true;
                    PQfreemem(notify);
                }
                if (notified) wake_all();
            }
            PQfinish(connection);
        }
    }

    const std::string conninfo_;
    const int stop_fd_;
    std::mutex mutex_;
    std::condition_variable woken_;
    uint64_t wakeups_ = 0;
    bool stopping_ = false;
    std::thread thread_;
};

std::pair<std::string, int> listen_address(const std::string& listen) {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size())
        throw std::runtime_error("--listen " + listen + ": expected HOST:PORT");
    try {
        return {listen.substr(0, colon), std::stoi(listen.substr(colon + 1))};
    } catch (const std::exception&) {
        throw std::runtime_error("--listen " + listen + ": the port is not a number");
    }
}

void answer(httplib::Response& response, int status, const std::string& text) {
    response.status = status;
    response.set_content(text + "\n", "text/plain; charset=utf-8");
}

}  // namespace

int pull_failure_status(const std::string& sqlstate, bool connection_lost) {
    if (connection_lost) return 503;
    // sync.pull_head: another transport delivers the replica (its row says which).
    if (sqlstate == "42809") return 409;
    const std::string sqlclass = sqlstate.substr(0, 2);
    for (const char* again : {"08", "40", "53", "55", "57"})
        if (sqlclass == again) return 503;
    return 500;
}

struct PullServer::Serving {
    explicit Serving(const Options& options)
        : lease(std::to_string(options.lease_seconds.value_or(60)) + " seconds"),
          wait(std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(options.wait_seconds))),
          pool(options.db, options.token_query),
          wakeups(options.db),
          listen(options.listen) {}

    // The replica the path names (`path_id`), when the request's bearer token may act for it;
    // otherwise throws the refusal: 401 without a token, 404 for a path id that is no uuid, 403
    // when the token query does not give the path's replica for the token.
    std::string authorized(const httplib::Request& request, const std::string& path_id,
                           ConnectionPool::Borrowed& connection) {
        const std::string header = request.get_header_value("Authorization");
        const std::string scheme = "bearer ";
        if (header.size() <= scheme.size() || lowercase(header.substr(0, scheme.size())) != scheme)
            throw Refusal{401, "send Authorization: Bearer TOKEN"};
        const std::string token = header.substr(scheme.size());
        const std::string replica = lowercase(path_id);
        if (!is_uuid(replica)) throw Refusal{404, "no replica " + path_id};
        Result may = connection.execute(kTokenStatement, {token.c_str()}, {0}, {0}, 0);
        for (int row = 0; row < PQntuples(may.get()); ++row)
            if (lowercase(PQgetvalue(may.get(), row, 0)) == replica) return replica;
        throw Refusal{403, "this token may not act for replica " + replica};
    }

    // A request with a body (every POST) is refused on its headers, before its body is read:
    // one whose token may not act for the path's replica, or whose Content-Length is over the
    // limit. Only a device that may send a body has it read, so what others send costs no
    // memory (eight unauthenticated 60 MB uploads at once took the gateway to 945 MB). Returns
    // whether it answered; the connection is closed after, its body unread.
    bool refused_before_body(const httplib::Request& request, httplib::Response& response) {
        static const std::regex posted(R"(/replicas/([^/]+)/(up|ack/[^/]+|refused/[^/]+))");
        std::smatch path;
        if (request.method != "POST" || !std::regex_match(request.path, path, posted)) return false;
        try {
            const std::string length = request.get_header_value("Content-Length");
            if (length.size() > 18 || (!length.empty() && std::stoull(length) > kMaxUploadBytes))
                throw Refusal{
                    413, "a body may hold " + std::to_string(kMaxUploadBytes) + " bytes at most"};
            authorized(request, path[1], *pool.borrow());
            return false;
        } catch (const std::logic_error&) {
            answer(response, 400, "Content-Length is not a number");
        } catch (const Refusal& refusal) {
            if (refusal.status >= 500)
                log_line(request.method + " " + request.path + ": " +
                         std::to_string(refusal.status) + " " + refusal.why);
            answer(response, refusal.status, refusal.why);
        }
        response.set_header("Connection", "close");
        return true;
    }

    // Runs `serve` with the authorized replica; a refusal is the answer. A POST was authorized
    // on its headers (refused_before_body), a GET is here, with a connection of its own.
    template <typename Serve>
    void handle(const httplib::Request& request, httplib::Response& response, Serve serve) {
        try {
            // The connection goes back before serving: a long poll waits without one.
            const std::string replica =
                request.method == "POST" ? lowercase(request.matches[1])
                                         : authorized(request, request.matches[1], *pool.borrow());
            serve(replica);
        } catch (const Refusal& refusal) {
            if (refusal.status >= 500)
                log_line(request.method + " " + request.path + ": " +
                         std::to_string(refusal.status) + " " + refusal.why);
            answer(response, refusal.status, refusal.why);
        }
    }

    void next(const httplib::Request& request, httplib::Response& response) {
        handle(request, response, [&](const std::string& replica) {
            const Clock::time_point deadline = Clock::now() + wait;
            while (true) {
                // Read before looking, so that a message that arrives meanwhile wakes us.
                const uint64_t seen = wakeups.seen();
                {
                    const auto connection = pool.borrow();
                    Result head = connection->execute(kHead.name, {replica.c_str(), lease.c_str()},
                                                      {0, 0}, {0, 0}, 1);
                    if (PQntuples(head.get()) == 1) {
                        response.status = 200;
                        response.set_header("message-id", PQgetvalue(head.get(), 0, 0));
                        response.set_content(
                            stamped_with_origin(std::string(PQgetvalue(head.get(), 0, 1),
                                                            PQgetlength(head.get(), 0, 1)),
                                                PQgetvalue(head.get(), 0, 2)),
                            "application/json");
                        return;
                    }
                }
                if (!wakeups.wait(seen, deadline)) break;
            }
            if (wakeups.stopping()) throw Refusal{503, "the sender is stopping; ask again"};
            response.status = 204;
        });
    }

    void ack(const httplib::Request& request, httplib::Response& response) {
        handle(request, response, [&](const std::string& replica) {
            const std::string message_id = request.matches[2];
            Result taken = pool.borrow()->execute(kAck.name, {replica.c_str(), message_id.c_str()},
                                                  {0, 0}, {0, 0}, 0);
            if (std::string(PQgetvalue(taken.get(), 0, 0)) == "t")
                answer(response, 200, "taken " + message_id);
            else
                answer(response, 409,
                       message_id + " is not the head of replica " + replica + ": nothing taken");
        });
    }

    // The device cannot take the message (the body says why): recorded as a refusal, the message
    // stays the head.
    void refused(const httplib::Request& request, httplib::Response& response) {
        handle(request, response, [&](const std::string& replica) {
            const std::string message_id = request.matches[2];
            const std::string why = printable(request.body, "refused by the device");
            Result recorded = pool.borrow()->execute(
                kRefused.name, {replica.c_str(), message_id.c_str(), why.c_str()},
                {0, 0, static_cast<int>(why.size())}, {0, 0, 0}, 0);
            if (std::string(PQgetvalue(recorded.get(), 0, 0)) == "t")
                answer(response, 200, "refusal of " + message_id + " recorded");
            else
                answer(
                    response, 409,
                    message_id + " is not the head of replica " + replica + ": nothing recorded");
        });
    }

    void up(const httplib::Request& request, httplib::Response& response) {
        handle(request, response, [&](const std::string& replica) {
            Result filed =
                pool.borrow()->execute(kReceive.name, {replica.c_str(), request.body.data()},
                                       {0, static_cast<int>(request.body.size())}, {0, 1}, 0);
            const std::string outcome = PQgetvalue(filed.get(), 0, 0);
            if (outcome == "refused")
                answer(response, 507,
                       "refused: the server keeps as much from replica " + replica +
                           " as it may (sync.status, sync.upload_refusal); nothing was filed, "
                           "send it again later");
            else
                answer(response, 200, outcome);
        });
    }

    const std::string lease;
    const Clock::duration wait;
    ConnectionPool pool;
    Wakeups wakeups;
    const std::string listen;
    httplib::Server server;
    std::thread thread;
};

PullServer::PullServer(const Options& options) {
    try {
        libpq::check_conninfo(options.db);
    } catch (const libpq::Failure& e) {
        throw std::runtime_error(std::string("--db: ") + e.what());
    }
    serving_ = std::make_unique<Serving>(options);
    // A token query or statement the database refuses is said now, not at the first request;
    // a database that is away is not: devices are answered 503 until it is back.
    try {
        const auto connection = serving_->pool.borrow();
        Result described(PQdescribePrepared(connection->get(), kTokenStatement), PQclear);
        if (PQnparams(described.get()) != 1 || PQnfields(described.get()) < 1)
            throw std::runtime_error(
                "--token-query must take the token as $1, and nothing else, and return the ids "
                "of the replicas it may act for in its first column");
    } catch (const Refusal& refusal) {
        if (refusal.status != 503) throw std::runtime_error(refusal.why);
        log_line(refusal.why + "; devices are answered 503 until it is back");
    }
    httplib::Server& server = serving_->server;
    server.new_task_queue = [devices = options.devices] {
        return new httplib::ThreadPool(devices);
    };
    server.set_payload_max_length(kMaxUploadBytes);
    server.set_pre_routing_handler(
        [&serving = *serving_](const httplib::Request& request, httplib::Response& response) {
            return serving.refused_before_body(request, response)
                       ? httplib::Server::HandlerResponse::Handled
                       : httplib::Server::HandlerResponse::Unhandled;
        });
    // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which a second sender
    // would share the port.
    server.set_socket_options([](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    using Handler = void (Serving::*)(const httplib::Request&, httplib::Response&);
    const auto to = [&serving = *serving_](Handler handler) {
        return [&serving, handler](const httplib::Request& request, httplib::Response& response) {
            (serving.*handler)(request, response);
        };
    };
    server.Get(R"(/replicas/([^/]+)/next)", to(&Serving::next));
    server.Post(R"(/replicas/([^/]+)/ack/([^/]+))", to(&Serving::ack));
    server.Post(R"(/replicas/([^/]+)/refused/([^/]+))", to(&Serving::refused));
    server.Post(R"(/replicas/([^/]+)/up)", to(&Serving::up));
    const auto [host, port] = listen_address(options.listen);
    if (!server.bind_to_port(host, port))
        throw std::runtime_error("--listen " + options.listen +
                                 ": cannot listen there (in use, or not an address of this host)");
}

PullServer::~PullServer() {
    serving_->wakeups.stop();
    serving_->server.stop();
    if (serving_->thread.joinable()) serving_->thread.join();
}

int PullServer::run(int signal_fd) {
    serving_->thread = std::thread([this] { serving_->server.listen_after_bind(); });
    log_line("pull: serving devices on " + serving_->listen);
    pollfd stop{signal_fd, POLLIN, 0};
    while (poll(&stop, 1, -1) < 0) {
    }
    log_line("stopping: answering the waiting devices");
    serving_->wakeups.stop();
    serving_->server.stop();
    serving_->thread.join();
    log_line("stopped");
    return 0;
}

}  // namespace magic_sync::sender
