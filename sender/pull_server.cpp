#include "pull_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chunk_cache.hpp"
#include "database.hpp"
#include "http_head.hpp"
#include "libpq/connection.hpp"
#include "log.hpp"
#include "metrics.hpp"
#include "program/http_status.hpp"
#include "program/text.hpp"
#include "rows_reference.hpp"

namespace magic_sync::sender {

namespace {

using Clock = std::chrono::steady_clock;
using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// Larger than magic_sync.max_upload_bytes' default, so that sync.receive keeps and answers an
// upload over the database's limit itself; a body over this one is answered 413.
constexpr size_t kMaxUploadBytes = 64 * 1024 * 1024;
// What an ack's or a refusal's body may hold (a refusal's says why; an ack's is not read).
constexpr size_t kMaxNoteBytes = 64 * 1024;
// A body's deadline: the header timeout, and a second more for each 64 KiB it announces.
constexpr size_t kBodyBytesPerSecond = 64 * 1024;
// How long an answer may take to be written before the connection is dropped.
constexpr std::chrono::seconds kWriteTimeout{30};
constexpr std::chrono::milliseconds kLongestListenRetry{30000};
// How often the deadlines are looked at.
constexpr std::chrono::milliseconds kSweepEvery{100};

// The statements, prepared on every connection; every value from a request is a bound parameter.
constexpr const char* kTokenStatement = "magic_sync_pull_token";
struct Statement {
    const char* name;
    const char* text;
};
// A binary result (seq as 8 bytes, gen as 4, arrays as array_send writes them), columns in the
// order of enum HeadColumn: a rows message comes by reference (rows_reference.hpp).
constexpr Statement kHead{"magic_sync_pull_head",
                          "SELECT message_id, message, origin, seq, gen, reset, drops, "
                          "table_drops, chunks "
                          "FROM sync.pull_head($1::uuid, $2::interval, by_reference => true)"};
enum HeadColumn { kHeadMessageId, kHeadMessage, kHeadOrigin, kHeadSeq, kHeadGen };
constexpr Statement kChunks{"magic_sync_pull_chunks", kChunksQuery};
constexpr Statement kAck{"magic_sync_pull_ack", "SELECT sync.pull_ack($1::uuid, $2::text)"};
constexpr Statement kRefused{"magic_sync_pull_refused",
                             "SELECT sync.pull_refused($1::uuid, $2::text, $3::text)"};
constexpr Statement kReceive{"magic_sync_pull_receive", "SELECT sync.receive($1::uuid, $2::bytea)"};
constexpr Statement kWaiting{"magic_sync_pull_waiting",
                             "SELECT replica::text FROM sync.pull_waiting($1::uuid[]) replica"};
constexpr Statement kStatements[] = {kHead, kChunks, kAck, kRefused, kReceive, kWaiting};

using program::lowercase;

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

// With --cors-origin: what every answer says to a browser, so that a page of that origin may read
// it (and the message-id header of a head).
std::string cors_headers(const std::string& origin) {
    if (origin.empty()) return "";
    return "Access-Control-Allow-Origin: " + origin +
           "\r\nAccess-Control-Allow-Methods: GET, POST, OPTIONS"
           "\r\nAccess-Control-Allow-Headers: Authorization, Content-Type, Content-Encoding"
           "\r\nAccess-Control-Expose-Headers: message-id\r\nVary: Origin\r\n";
}

// An answer as it goes on the wire; `cors`: what cors_headers() says, or nothing;
// `varies_by_encoding`: whether the same request with another Accept-Encoding would have had
// another body (a head, from a gateway run with --gzip), which a cache in front must know.
std::string response(int status, const std::string& body, const std::string& content_type,
                     const std::string& message_id, bool close, const std::string& cors = "",
                     const std::string& content_encoding = "", bool varies_by_encoding = false) {
    std::string out =
        "HTTP/1.1 " + std::to_string(status) + " " + program::reason_phrase(status) + "\r\n";
    out += cors;
    if (status == 204 && !cors.empty()) out += "Access-Control-Max-Age: 600\r\n";
    if (status != 204) {
        out += "Content-Type: " + content_type + "\r\n";
        out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    if (!content_encoding.empty()) out += "Content-Encoding: " + content_encoding + "\r\n";
    if (varies_by_encoding) out += "Vary: Accept-Encoding\r\n";
    if (!message_id.empty()) out += "message-id: " + message_id + "\r\n";
    if (close) out += "Connection: close\r\n";
    out += "\r\n";
    if (status != 204) out += body;
    return out;
}

// A database connection with the statements prepared; throws Refusal (503 when it is away).
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

// Runs a prepared statement; throws Refusal with the status its failure calls for.
Result execute(PGconn* connection, const char* statement, const std::vector<const char*>& values,
               const std::vector<int>& lengths, const std::vector<int>& formats,
               int result_format) {
    Result result(PQexecPrepared(connection, statement, static_cast<int>(values.size()),
                                 values.data(), lengths.data(), formats.data(), result_format),
                  PQclear);
    if (PQresultStatus(result.get()) == PGRES_TUPLES_OK) return result;
    const char* sqlstate = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
    const bool lost = PQstatus(connection) != CONNECTION_OK;
    const char* primary = PQresultErrorField(result.get(), PG_DIAG_MESSAGE_PRIMARY);
    const std::string why =
        primary != nullptr ? primary : libpq::first_line(PQerrorMessage(connection));
    throw Refusal{pull_failure_status(sqlstate == nullptr ? "" : sqlstate, lost), why};
}

// What a request asks of the database, done by a worker: never in the event loop, which only
// moves bytes and so never waits on the database.
struct Task {
    enum class Kind { authorize, head, ack, refused, up, waiting };
    Kind kind;
    uint64_t connection = 0;  // the request's (0: the loop's own, for `waiting`)
    std::string replica;
    std::string token;
    std::string message_id;
    std::string body;
    std::vector<std::string> replicas;  // waiting: whose devices wait
    uint64_t wakes_seen = 0;            // head: the wake-ups counted when it was asked
    bool gzip = false;                  // head: served gzip (--gzip, and the device takes it)
};

Task task_for(Task::Kind kind, uint64_t connection) {
    Task task;
    task.kind = kind;
    task.connection = connection;
    return task;
}

struct TaskOutcome {
    Task::Kind kind;
    uint64_t connection = 0;
    int status = 200;
    std::string body;
    std::string content_type = "text/plain; charset=utf-8";
    std::string content_encoding;  // head: "gzip" when the body is the message gzip-compressed
    std::string message_id;
    bool none = false;               // head: nothing to serve now
    std::vector<std::string> ready;  // waiting: the replicas with a message
    uint64_t wakes_seen = 0;
};

// Threads that run the tasks, each with its own database connection (made at start, before the
// gateway takes a device, and made again when a statement found it broken). Their results go to
// `done`, and the loop is told through `notify_fd`. Made at start: out of open files, a worker
// that connected at its first request found no descriptor free (the devices held them all), and
// the request was answered 503. They share the chunks of rows messages they fetched
// (`chunk_cache_bytes` of them), so that a chunk is read from the database once, not once per
// device it goes to.
class Workers {
  public:
    Workers(size_t threads, std::string conninfo, std::string token_query, std::string lease,
            size_t chunk_cache_bytes, bool gzip, int notify_fd)
        : conninfo_(std::move(conninfo)),
          token_query_(std::move(token_query)),
          lease_(std::move(lease)),
          gzip_(gzip),
          notify_fd_(notify_fd),
          chunks_(chunk_cache_bytes) {
        for (size_t i = 0; i < threads; ++i) {
            PGconn* connection = nullptr;
            try {
                connection = connect_prepared(conninfo_, token_query_);
            } catch (const Refusal&) {
                // The database is away: the worker connects at its first request.
            }
            threads_.emplace_back([this, connection] { work(connection); });
        }
    }
    ~Workers() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        queued_.notify_all();
        for (std::thread& thread : threads_) thread.join();
    }

    void push(Task task) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            tasks_.push_back(std::move(task));
        }
        queued_.notify_one();
    }
    std::vector<TaskOutcome> take_outcomes() {
        std::lock_guard<std::mutex> lock(mutex_);
        std::vector<TaskOutcome> taken;
        taken.swap(done_);
        return taken;
    }

  private:
    void work(PGconn* connection) {
        while (true) {
            Task task;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                queued_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
                if (stopping_) break;
                task = std::move(tasks_.front());
                tasks_.pop_front();
            }
            TaskOutcome done;
            done.kind = task.kind;
            done.connection = task.connection;
            done.wakes_seen = task.wakes_seen;
            try {
                if (connection == nullptr) connection = connect_prepared(conninfo_, token_query_);
                run(connection, task, done);
            } catch (const Refusal& refusal) {
                done.status = refusal.status;
                done.body = refusal.why + "\n";
                done.content_type = "text/plain; charset=utf-8";
                done.message_id.clear();
                if (connection != nullptr && (PQstatus(connection) != CONNECTION_OK ||
                                              PQtransactionStatus(connection) != PQTRANS_IDLE)) {
                    PQfinish(connection);
                    connection = nullptr;
                }
            }
            {
                std::lock_guard<std::mutex> lock(mutex_);
                done_.push_back(std::move(done));
            }
            const uint64_t one = 1;
            [[maybe_unused]] const ssize_t written = write(notify_fd_, &one, sizeof one);
        }
        PQfinish(connection);
    }

    void run(PGconn* connection, const Task& task, TaskOutcome& done) {
        const char* replica = task.replica.c_str();
        switch (task.kind) {
            case Task::Kind::authorize: {
                Result may =
                    execute(connection, kTokenStatement, {task.token.c_str()}, {0}, {0}, 0);
                for (int row = 0; row < PQntuples(may.get()); ++row)
                    if (lowercase(PQgetvalue(may.get(), row, 0)) == task.replica) return;
                throw Refusal{403, "this token may not act for replica " + task.replica};
            }
            case Task::Kind::head: {
                Result head =
                    execute(connection, kHead.name, {replica, lease_.c_str()}, {0, 0}, {0, 0}, 1);
                if (PQntuples(head.get()) != 1) {
                    done.none = true;
                    return;
                }
                const std::string origin = PQgetvalue(head.get(), 0, kHeadOrigin);
                std::optional<std::string> body;
                if (PQgetisnull(head.get(), 0, kHeadMessage)) {
                    body = assembled(connection, head.get(), task.replica, origin, task.gzip);
                } else {
                    body =
                        whole_message_as_sent(std::string(PQgetvalue(head.get(), 0, kHeadMessage),
                                                          PQgetlength(head.get(), 0, kHeadMessage)),
                                              origin, task.gzip);
                }
                if (!body) {
                    // Its chunks are gone: it was pruned after its lease (its generation ended).
                    done.none = true;
                    return;
                }
                done.message_id = PQgetvalue(head.get(), 0, kHeadMessageId);
                done.body = std::move(*body);
                done.content_type = "application/json";
                if (task.gzip) done.content_encoding = "gzip";
                return;
            }
            case Task::Kind::ack: {
                Result taken = execute(connection, kAck.name, {replica, task.message_id.c_str()},
                                       {0, 0}, {0, 0}, 0);
                if (std::string(PQgetvalue(taken.get(), 0, 0)) == "t") {
                    done.body = "taken " + task.message_id + "\n";
                } else {
                    done.status = 409;
                    done.body = task.message_id + " is not the head of replica " + task.replica +
                                ": nothing taken\n";
                }
                return;
            }
            case Task::Kind::refused: {
                const std::string why = printable(task.body, "refused by the device");
                Result recorded = execute(connection, kRefused.name,
                                          {replica, task.message_id.c_str(), why.c_str()},
                                          {0, 0, static_cast<int>(why.size())}, {0, 0, 0}, 0);
                if (std::string(PQgetvalue(recorded.get(), 0, 0)) == "t") {
                    done.body = "refusal of " + task.message_id + " recorded\n";
                } else {
                    done.status = 409;
                    done.body = task.message_id + " is not the head of replica " + task.replica +
                                ": nothing recorded\n";
                }
                return;
            }
            case Task::Kind::up: {
                Result filed = execute(connection, kReceive.name, {replica, task.body.data()},
                                       {0, static_cast<int>(task.body.size())}, {0, 1}, 0);
                const std::string outcome = PQgetvalue(filed.get(), 0, 0);
                if (outcome == "refused") {
                    done.status = 507;
                    done.body = "refused: the server keeps as much from replica " + task.replica +
                                " as it may (sync.status, sync.upload_refusal); nothing was "
                                "filed, send it again later\n";
                } else {
                    done.body = outcome + "\n";
                }
                return;
            }
            case Task::Kind::waiting: {
                std::string ids = "{";
                for (const std::string& id : task.replicas) ids += (ids.size() > 1 ? "," : "") + id;
                ids += "}";
                Result ready = execute(connection, kWaiting.name, {ids.c_str()}, {0}, {0}, 0);
                for (int row = 0; row < PQntuples(ready.get()); ++row)
                    done.ready.push_back(PQgetvalue(ready.get(), row, 0));
                return;
            }
        }
    }

    // The head's rows message, by reference in `head`, assembled from the chunks the workers share
    // (gzip-compressed when `gzip`); those not held are fetched by one statement, the cache's lock
    // not held meanwhile. None when one of them is gone.
    std::optional<std::string> assembled(PGconn* connection, const PGresult* head,
                                         const std::string& replica, const std::string& origin,
                                         bool gzip) {
        const auto reference = read_reference(
            head, 0, kHeadGen, replica, big_endian_int64(PQgetvalue(head, 0, kHeadSeq)), origin);
        if (!reference)
            throw Refusal{500, "sync.pull_head returned a reference that does not read"};
        Chunks chunks;
        {
            std::lock_guard<std::mutex> lock(chunks_mutex_);
            for (int64_t id : reference->chunks) chunks[id] = chunks_.find(origin, id);
        }
        const std::string missing = missing_chunks(chunks);
        if (!missing.empty()) {
            Result fetched = execute(connection, kChunks.name, {missing.c_str(), origin.c_str()},
                                     {0, 0}, {0, 0}, 1);
            auto found = read_chunks(fetched.get(), gzip_);
            if (!found) throw Refusal{500, "sync.chunks returned notes that do not read"};
            std::lock_guard<std::mutex> lock(chunks_mutex_);
            for (auto& [id, chunk] : *found) {
                chunks_.add(origin, id, chunk);
                chunks[id] = std::move(chunk);
            }
        }
        return assemble(*reference, chunks, gzip);
    }

    const std::string conninfo_;
    const std::string token_query_;
    const std::string lease_;
    const bool gzip_;  // chunks are deflated as they are fetched (--gzip)
    const int notify_fd_;
    std::mutex chunks_mutex_;  // chunks_'s; never held while a statement runs
    ChunkCache chunks_;
    std::mutex mutex_;
    std::condition_variable queued_;
    std::deque<Task> tasks_;
    std::vector<TaskOutcome> done_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

// Whom a NOTIFY on magic_sync wakes: the replicas the relay's pass wrote messages to, named in its
// payload (sync_internal.pass_end), or everyone (an empty payload: too many to name, or a
// notification from elsewhere).
struct Woken {
    bool everyone = false;
    std::set<std::string> replicas;

    void add(const std::string& payload) {
        if (payload.empty()) everyone = true;
        for (size_t at = 0; !everyone && at < payload.size();) {
            const size_t comma = std::min(payload.find(',', at), payload.size());
            replicas.insert(payload.substr(at, comma - at));
            at = comma + 1;
        }
        if (everyone) replicas.clear();
    }
    void add(Woken&& other) {
        everyone = everyone || other.everyone;
        if (everyone)
            replicas.clear();
        else
            replicas.merge(other.replicas);
    }
    bool empty() const { return !everyone && replicas.empty(); }
};

// One connection that LISTENs on magic_sync (the relay notifies it after a pass wrote messages)
// and tells the loop through `wake_fd` whom it wakes. While it is away nothing wakes the long
// polls; once it is back the loop looks at them all, for what came meanwhile. Made before the
// gateway serves: its first try to listen ends (listening or not) before a device is taken, so
// the look that follows it never finds one waiting for nothing.
class Wakeups {
  public:
    Wakeups(std::string conninfo, int wake_fd)
        : conninfo_(std::move(conninfo)),
          wake_fd_(wake_fd),
          stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
        if (stop_fd_ < 0) throw std::runtime_error("eventfd failed");
        thread_ = std::thread([this] { listen(); });
        std::unique_lock<std::mutex> lock(mutex_);
        first_try_ended_.wait(lock, [&] { return tried_; });
    }
    ~Wakeups() {
        const uint64_t one = 1;
        [[maybe_unused]] const ssize_t written = write(stop_fd_, &one, sizeof one);
        thread_.join();
        close(stop_fd_);
    }

    // Whom the notifications since the last call wake.
    Woken take() {
        std::lock_guard<std::mutex> lock(mutex_);
        return std::exchange(woken_, Woken{});
    }

  private:
    void wake(const std::string& payload) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            woken_.add(payload);
        }
        const uint64_t one = 1;
        [[maybe_unused]] const ssize_t written = write(wake_fd_, &one, sizeof one);
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
        while (await(-1, 0)) {
            PGconn* connection = PQconnectdb(conninfo_.c_str());
            Result listening(connection != nullptr && PQstatus(connection) == CONNECTION_OK
                                 ? PQexec(connection, "LISTEN magic_sync")
                                 : nullptr,
                             PQclear);
            const bool listens = PQresultStatus(listening.get()) == PGRES_COMMAND_OK;
            if (listens) wake("");  // what arrived while nobody listened
            {
                std::lock_guard<std::mutex> lock(mutex_);
                tried_ = true;
            }
            first_try_ended_.notify_all();
            if (!listens) {
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
            while (await(PQsocket(connection), -1)) {
                if (PQconsumeInput(connection) != 1) break;
                while (PGnotify* notify = PQnotifies(connection)) {
                    wake(notify->extra);
                    PQfreemem(notify);
                }
            }
            PQfinish(connection);
        }
    }

    const std::string conninfo_;
    const int wake_fd_;
    const int stop_fd_;
    std::thread thread_;
    std::mutex mutex_;
    Woken woken_;
    std::condition_variable first_try_ended_;
    bool tried_ = false;  // the first try to listen ended
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

// A listening socket on `listen`, non-blocking; throws saying why it cannot be made.
int bind_listener(const std::string& listen) {
    auto [host, port] = listen_address(listen);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 ||
        found == nullptr)
        throw std::runtime_error("--listen " + listen + ": not an address of this host");
    const int fd = socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    // SO_REUSEADDR only: with SO_REUSEPORT a second sender would share the port.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    const bool bound =
        fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0;
    freeaddrinfo(found);
    if (!bound) {
        if (fd >= 0) close(fd);
        throw std::runtime_error("--listen " + listen +
                                 ": cannot listen there (in use, or not an address of this host)");
    }
    return fd;
}

bool is_loopback(const std::string& listen) {
    const std::string host = listen_address(listen).first;
    return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Raises this process's limit of open files to what `devices` connections need, as far as the
// hard limit allows; says so when that is not enough.
void make_room_for(int devices) {
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) != 0) return;
    const rlim_t wanted = static_cast<rlim_t>(devices) + 64;
    if (files.rlim_cur < wanted) {
        files.rlim_cur = std::min(wanted, files.rlim_max);
        setrlimit(RLIMIT_NOFILE, &files);
    }
    if (files.rlim_cur < wanted)
        log_line("--devices " + std::to_string(devices) + " needs " + std::to_string(wanted) +
                 " open files, and this process may open " + std::to_string(files.rlim_cur) +
                 ": raise its limit (LimitNOFILE= in a systemd unit, ulimit -n)");
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

// The event loop: one thread moves every byte of every connection (epoll, non-blocking sockets),
// so a device that waits, or sends slowly, costs a socket and a few hundred bytes, never a
// thread. Deadlines bound each step: the head (--header-timeout), the body (the same, and a
// second per 64 KiB announced), an idle kept-alive connection (--idle-timeout), an answer's
// writing; past one the connection is answered 408 (or, idle, closed).
struct PullServer::Serving {
    // epoll's data for what is not a connection; connections are numbered after them.
    enum : uint64_t { kListener = 1, kDone, kWake, kSignal, kFirstConnection = 16 };

    enum class State { head, authorizing, body, serving, waiting, writing };

    struct Connection {
        int fd = -1;
        State state = State::head;
        std::string in;
        std::string out;
        size_t written = 0;
        Clock::time_point deadline;
        bool close_after = false;
        // The request being served.
        HttpHead head;
        std::string route;  // next, ack, refused, up
        std::string replica;
        std::string message_id;
        size_t body_length = 0;
        Clock::time_point poll_until;  // next: when it is answered 204
    };

    explicit Serving(const Options& options)
        : lease(std::to_string(options.lease_seconds.value_or(60)) + " seconds"),
          cors(cors_headers(options.cors_origin)),
          wait(std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(options.wait_seconds))),
          header_timeout(std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(options.header_timeout_seconds))),
          idle_timeout(std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(options.idle_timeout_seconds))),
          devices(static_cast<size_t>(options.devices)),
          listen(options.listen),
          db(options.db),
          epoll_fd(epoll_create1(EPOLL_CLOEXEC)),
          done_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
          wake_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
          listener(bind_listener(options.listen)),
          workers(std::clamp<size_t>(2 * std::thread::hardware_concurrency(), 2, 8), options.db,
                  options.token_query, lease, options.chunk_cache_mib << 20, options.gzip, done_fd),
          gzip(options.gzip) {
        if (epoll_fd < 0 || done_fd < 0 || wake_fd < 0)
            throw std::runtime_error("cannot make the event loop's descriptors");
        watch(listener, kListener, EPOLLIN);
        watch(done_fd, kDone, EPOLLIN);
        watch(wake_fd, kWake, EPOLLIN);
    }
    ~Serving() {
        for (auto& [id, connection] : connections) close(connection.fd);
        close(listener);
        close(epoll_fd);
        close(done_fd);
        close(wake_fd);
    }

    void watch(int fd, uint64_t id, uint32_t events) {
        epoll_event event{};
        event.events = events;
        event.data.u64 = id;
        epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
    }
    // What the loop waits for on a connection: its bytes while it reads, room to write while it
    // writes, and otherwise only its hanging up (a waiting device that goes).
    void interest(uint64_t id, Connection& connection) {
        epoll_event event{};
        event.events = EPOLLRDHUP;
        if (connection.state == State::head || connection.state == State::body)
            event.events |= EPOLLIN;
        if (connection.state == State::writing) event.events |= EPOLLOUT;
        event.data.u64 = id;
        epoll_ctl(epoll_fd, EPOLL_CTL_MOD, connection.fd, &event);
    }

    void accept_all() {
        while (true) {
            const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                // Out of descriptors: new devices wait in the listen queue until one closes,
                // instead of the loop spinning on a listener it cannot accept from.
                if (errno == EMFILE || errno == ENFILE) {
                    log_line("out of open files at " + std::to_string(connections.size()) +
                             " connections: new ones wait until one closes (raise the limit, or "
                             "lower --devices)");
                    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listener, nullptr);
                    accepting = false;
                }
                return;
            }
            if (connections.size() >= devices) {
                // Past --devices: answered at once, and not kept.
                const std::string busy = response(
                    503, "this gateway serves " + std::to_string(devices) + " devices at once\n",
                    "text/plain; charset=utf-8", "", true, cors);
                [[maybe_unused]] const ssize_t sent =
                    send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                close(fd);
                continue;
            }
            const int yes = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
            const uint64_t id = next_id++;
            Connection& connection = connections[id];
            connection.fd = fd;
            connection.deadline = Clock::now() + idle_timeout;
            watch(fd, id, EPOLLIN | EPOLLRDHUP);
        }
    }

    void drop(uint64_t id) {
        auto found = connections.find(id);
        if (found == connections.end()) return;
        if (found->second.state == State::waiting) stop_waiting(id, found->second);
        close(found->second.fd);
        connections.erase(found);
        if (!accepting && !stopping) {
            watch(listener, kListener, EPOLLIN);
            accepting = true;
        }
    }

    void stop_waiting(uint64_t id, const Connection& connection) {
        auto waiting_for = waiting.find(connection.replica);
        if (waiting_for == waiting.end()) return;
        waiting_for->second.erase(id);
        if (waiting_for->second.empty()) waiting.erase(waiting_for);
    }

    // The answer goes out; the connection then reads its next request, or closes.
    void answer(uint64_t id, Connection& connection, int status, const std::string& body,
                const std::string& content_type = "text/plain; charset=utf-8",
                const std::string& message_id = "", const std::string& content_encoding = "") {
        if (connection.state == State::waiting) stop_waiting(id, connection);
        connection.close_after = connection.close_after || !connection.head.keep_alive() ||
                                 status == 408 || status == 431 || status == 400;
        connection.out = response(status, body, content_type, message_id, connection.close_after,
                                  cors, content_encoding, gzip && connection.route == "next");
        metrics.answered(connection.route.empty() ? "other" : connection.route, status);
        connection.written = 0;
        connection.state = State::writing;
        connection.deadline = Clock::now() + kWriteTimeout;
        write_some(id, connection);
    }
    // A refusal before the body was read closes the connection: what follows the head is that
    // body, not another request.
    void refuse(uint64_t id, Connection& connection, int status, const std::string& why) {
        if (connection.state == State::head || connection.state == State::authorizing)
            connection.close_after = connection.close_after ||
                                     connection.head.header("transfer-encoding") ||
                                     connection.head.header("content-length").value_or("0") != "0";
        answer(id, connection, status, why + "\n");
    }

    void write_some(uint64_t id, Connection& connection) {
        while (connection.written < connection.out.size()) {
            const ssize_t n = send(connection.fd, connection.out.data() + connection.written,
                                   connection.out.size() - connection.written, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    interest(id, connection);
                    return;
                }
                drop(id);
                return;
            }
            connection.written += static_cast<size_t>(n);
            metrics.moved(0, n);
        }
        if (connection.close_after) {
            drop(id);
            return;
        }
        // The next request, which may have come with this one.
        connection.state = State::head;
        connection.out.clear();
        connection.head = HttpHead{};
        connection.route.clear();
        connection.deadline =
            Clock::now() + (connection.in.empty() ? idle_timeout : header_timeout);
        interest(id, connection);
        if (!connection.in.empty()) read_head(id, connection);
    }

    // Bytes came: read them all, then go on with what they complete.
    void readable(uint64_t id, Connection& connection) {
        char buffer[16384];
        while (true) {
            const ssize_t n = recv(connection.fd, buffer, sizeof buffer, 0);
            if (n > 0) {
                if (connection.state == State::head && connection.in.empty())
                    connection.deadline = Clock::now() + header_timeout;
                connection.in.append(buffer, static_cast<size_t>(n));
                metrics.moved(n, 0);
                // Never more than the step needs: a head past its limit is refused below, a body
                // is read to its end and no further (what follows waits in the socket).
                if (connection.state == State::head
                        ? connection.in.size() > kMaxHeadBytes
                        : connection.in.size() >= connection.body_length)
                    break;
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                drop(id);
                return;
            }
            break;
        }
        if (connection.state == State::head)
            read_head(id, connection);
        else if (connection.state == State::body)
            read_body(id, connection);
    }

    void read_head(uint64_t id, Connection& connection) {
        const std::optional<size_t> end = head_end(connection.in);
        if (!end) {
            if (connection.in.size() > kMaxHeadBytes)
                refuse(id, connection, 431,
                       "a request's head may hold " + std::to_string(kMaxHeadBytes) +
                           " bytes at most");
            return;
        }
        try {
            connection.head = parse_head(std::string_view(connection.in).substr(0, *end - 4));
        } catch (const HeadRefusal& refusal) {
            refuse(id, connection, refusal.status, refusal.why);
            return;
        }
        connection.in.erase(0, *end);
        // A browser's preflight (with --cors-origin): answered on its head, before any token,
        // which a preflight never carries.
        if (!cors.empty() && connection.head.method == "OPTIONS") {
            try {
                route(connection, true);
            } catch (const Refusal& refusal) {
                refuse(id, connection, refusal.status, refusal.why);
                return;
            }
            connection.close_after = connection.close_after ||
                                     connection.head.header("transfer-encoding") ||
                                     connection.head.header("content-length").value_or("0") != "0";
            answer(id, connection, 204, "");
            return;
        }
        try {
            route(connection);
        } catch (const Refusal& refusal) {
            refuse(id, connection, refusal.status, refusal.why);
            return;
        }
        // Authorized before anything more is read: a body comes only from a device that may
        // send it, so what others send costs no memory.
        connection.state = State::authorizing;
        interest(id, connection);
        Task task = task_for(Task::Kind::authorize, id);
        task.replica = connection.replica;
        task.token = token_of(connection.head);
        workers.push(std::move(task));
    }

    // What the request asks for, checked on its head alone; throws Refusal. `preflight`: an
    // OPTIONS for the path, checked for the path alone.
    void route(Connection& connection, bool preflight = false) {
        const HttpHead& head = connection.head;
        std::vector<std::string> parts;
        for (size_t at = 1; at <= head.path.size();) {
            const size_t slash = std::min(head.path.find('/', at), head.path.size());
            parts.push_back(head.path.substr(at, slash - at));
            at = slash + 1;
        }
        const bool replicas_path = parts.size() >= 3 && parts[0] == "replicas";
        const std::string what = replicas_path ? parts[2] : "";
        const bool known =
            replicas_path && ((parts.size() == 3 && (what == "next" || what == "up")) ||
                              (parts.size() == 4 && (what == "ack" || what == "refused")));
        if (!known) throw Refusal{404, "no such path: " + printable(head.path, "/")};
        if (preflight) {
            connection.route = "preflight";
            return;
        }
        const bool get = what == "next";
        if (head.method != (get ? "GET" : "POST"))
            throw Refusal{405, head.path + " is asked with " + (get ? "GET" : "POST")};
        connection.route = what;
        connection.replica = lowercase(parts[1]);
        connection.message_id = parts.size() == 4 ? parts[3] : "";
        if (!is_uuid(connection.replica))
            throw Refusal{404, "no replica " + printable(parts[1], "")};
        const std::string header = head.header("authorization").value_or("");
        const std::string scheme = "bearer ";
        if (header.size() <= scheme.size() || lowercase(header.substr(0, scheme.size())) != scheme)
            throw Refusal{401, "send Authorization: Bearer TOKEN"};
        if (head.header("transfer-encoding"))
            throw Refusal{411, "send the body with a Content-Length, not chunked"};
        // An upload may come gzip: sync.receive tells it by its first bytes (docs/PROTOCOL.md
        // §7). Nothing else is taken compressed.
        const std::string encoding = head.header("content-encoding").value_or("identity");
        if (lowercase(encoding) != "identity" && !(what == "up" && lowercase(encoding) == "gzip"))
            throw Refusal{415, "Content-Encoding " + printable(encoding, "") +
                                   " is not taken: send the body as it is" +
                                   (what == "up" ? ", or gzip" : "")};
        // A POST without a body, or without Content-Length, has an empty body: an ack.
        const std::string length = head.header("content-length").value_or("0");
        const size_t limit = what == "up" ? kMaxUploadBytes : kMaxNoteBytes;
        if (length.empty() || length.size() > 18 ||
            !std::all_of(length.begin(), length.end(),
                         [](unsigned char c) { return std::isdigit(c); }))
            throw Refusal{400, "Content-Length is not a number"};
        connection.body_length = std::stoull(length);
        if (connection.body_length > limit)
            throw Refusal{413, "a body may hold " + std::to_string(limit) + " bytes at most"};
    }

    static std::string token_of(const HttpHead& head) {
        return head.header("authorization").value_or("").substr(7);
    }

    void read_body(uint64_t id, Connection& connection) {
        if (connection.in.size() < connection.body_length) return;
        std::string body = connection.in.substr(0, connection.body_length);
        connection.in.erase(0, connection.body_length);
        serve(id, connection, std::move(body));
    }

    void serve(uint64_t id, Connection& connection, std::string body) {
        connection.state = State::serving;
        interest(id, connection);
        Task task = task_for(Task::Kind::head, id);
        task.replica = connection.replica;
        task.message_id = connection.message_id;
        task.wakes_seen = wakes;
        task.gzip = gzip && connection.head.accepts_gzip();
        if (connection.route == "ack") task.kind = Task::Kind::ack;
        if (connection.route == "refused") task.kind = Task::Kind::refused;
        if (connection.route == "up") task.kind = Task::Kind::up;
        if (task.kind != Task::Kind::ack) task.body = std::move(body);
        workers.push(std::move(task));
    }

    void finished(TaskOutcome& done) {
        if (done.kind == Task::Kind::waiting) {
            // Counted once it ran: a statement counted as it was sent might not have read the
            // outbox yet, and a test that waited for the count raced it.
            metrics.asked_on_wake(checking_replicas);
            checking = false;
            for (const std::string& replica : done.ready) {
                auto waiting_for = waiting.find(replica);
                if (waiting_for == waiting.end()) continue;
                const std::set<uint64_t> ids = waiting_for->second;
                waiting.erase(waiting_for);
                for (uint64_t id : ids) {
                    auto found = connections.find(id);
                    if (found != connections.end()) serve(id, found->second, "");
                }
            }
            if (!check_again.empty()) check_waiting(std::exchange(check_again, Woken{}));
            return;
        }
        auto found = connections.find(done.connection);
        if (found == connections.end()) return;  // it went meanwhile
        Connection& connection = found->second;
        const uint64_t id = done.connection;
        if (done.status >= 500 && done.status != 507)
            log_line(connection.head.method + " " + connection.head.path + ": " +
                     std::to_string(done.status) + " " + done.body.substr(0, done.body.find('\n')));
        if (done.kind == Task::Kind::authorize) {
            if (done.status != 200) {
                refuse(id, connection, done.status, done.body.substr(0, done.body.size() - 1));
                return;
            }
            if (connection.route == "next") {
                connection.poll_until = Clock::now() + wait;
                serve(id, connection, "");
                return;
            }
            connection.state = State::body;
            const auto seconds = std::chrono::seconds(connection.body_length / kBodyBytesPerSecond);
            connection.deadline = Clock::now() + header_timeout + seconds;
            connection.in.reserve(connection.body_length);
            if (connection.in.size() < connection.body_length &&
                lowercase(connection.head.header("expect").value_or("")) == "100-continue") {
                const std::string go_on = "HTTP/1.1 100 Continue\r\n\r\n";
                [[maybe_unused]] const ssize_t sent =
                    send(connection.fd, go_on.data(), go_on.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            }
            interest(id, connection);
            read_body(id, connection);
            return;
        }
        if (done.kind == Task::Kind::head && done.status == 200 && done.none) {
            if (done.wakes_seen != wakes) {
                serve(id, connection, "");  // woken while it looked: look again
                return;
            }
            if (Clock::now() >= connection.poll_until) {
                answer(id, connection, 204, "");
                return;
            }
            connection.state = State::waiting;
            connection.deadline = connection.poll_until;
            waiting[connection.replica].insert(id);
            interest(id, connection);
            return;
        }
        answer(id, connection, done.status, done.body, done.content_type, done.message_id,
               done.content_encoding);
    }

    // A NOTIFY came: one statement finds which of the devices it wakes have a message now, only
    // those: the replicas it names that a device waits for (none: no statement), or all waiting.
    void check_waiting(Woken woken) {
        if (checking) {
            check_again.add(std::move(woken));
            return;
        }
        Task task = task_for(Task::Kind::waiting, 0);
        if (woken.everyone) {
            for (const auto& [replica, ids] : waiting) task.replicas.push_back(replica);
        } else {
            for (const std::string& replica : woken.replicas)
                if (waiting.count(replica)) task.replicas.push_back(replica);
        }
        if (task.replicas.empty()) return;
        checking = true;
        checking_replicas = static_cast<int64_t>(task.replicas.size());
        workers.push(std::move(task));
    }

    void sweep(Clock::time_point now) {
        size_t waiting_now = 0;
        for (const auto& [replica, ids] : waiting) waiting_now += ids.size();
        metrics.connections(static_cast<int64_t>(connections.size()),
                            static_cast<int64_t>(waiting_now));
        std::vector<uint64_t> due;
        for (const auto& [id, connection] : connections)
            if (now >= connection.deadline && connection.state != State::authorizing &&
                connection.state != State::serving)
                due.push_back(id);
        for (uint64_t id : due) {
            Connection& connection = connections[id];
            switch (connection.state) {
                case State::waiting:
                    answer(id, connection, 204, "");
                    break;
                case State::head:
                    if (connection.in.empty())
                        drop(id);  // idle
                    else
                        refuse(id, connection, 408, "the request's head took too long");
                    break;
                case State::body:
                    connection.close_after = true;
                    refuse(id, connection, 408, "the request's body took too long");
                    break;
                default:
                    drop(id);  // an answer nobody reads
            }
        }
    }

    // Until a stop signal: then the waiting devices are told to ask again, and the loop ends once
    // the answers are out (or after two seconds).
    void loop(int signal_fd) {
        watch(signal_fd, kSignal, EPOLLIN);
        Clock::time_point last_sweep = Clock::now();
        std::optional<Clock::time_point> stop_by;
        std::vector<epoll_event> events(1024);
        while (true) {
            const int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()),
                                     static_cast<int>(kSweepEvery.count()));
            for (int i = 0; i < n; ++i) {
                const uint64_t id = events[i].data.u64;
                if (id == kListener) {
                    if (!stop_by) accept_all();
                } else if (id == kDone) {
                    uint64_t count;
                    [[maybe_unused]] const ssize_t got = read(done_fd, &count, sizeof count);
                    for (TaskOutcome& done : workers.take_outcomes()) finished(done);
                } else if (id == kWake) {
                    uint64_t count;
                    [[maybe_unused]] const ssize_t got = read(wake_fd, &count, sizeof count);
                    ++wakes;
                    check_waiting(wakeups->take());
                } else if (id == kSignal) {
                    signalfd_siginfo info;
                    [[maybe_unused]] const ssize_t got = read(signal_fd, &info, sizeof info);
                    if (!stop_by) {
                        log_line("stopping: answering the waiting devices");
                        stop_by = Clock::now() + std::chrono::seconds(2);
                        stopping = true;
                        if (accepting) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listener, nullptr);
                        std::vector<uint64_t> ids;
                        for (const auto& [replica, waiting_ids] : waiting)
                            ids.insert(ids.end(), waiting_ids.begin(), waiting_ids.end());
                        for (uint64_t waiter : ids) {
                            Connection& connection = connections[waiter];
                            connection.close_after = true;
                            refuse(waiter, connection, 503, "the sender is stopping; ask again");
                        }
                    }
                } else {
                    auto found = connections.find(id);
                    if (found == connections.end()) continue;
                    Connection& connection = found->second;
                    const uint32_t what = events[i].events;
                    if (connection.state == State::writing && (what & EPOLLOUT)) {
                        write_some(id, connection);
                    } else if (connection.state == State::head || connection.state == State::body) {
                        readable(id, connection);
                    } else if (what & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
                        drop(id);  // gone while it waited or was served
                    }
                }
            }
            const Clock::time_point now = Clock::now();
            if (now - last_sweep >= kSweepEvery) {
                sweep(now);
                last_sweep = now;
            }
            if (stop_by) {
                bool writing = false;
                for (const auto& [id, connection] : connections)
                    writing = writing || connection.state == State::writing;
                if (!writing || now >= *stop_by) return;
            }
        }
    }

    const std::string lease;
    const std::string cors;  // the headers every answer carries with --cors-origin
    const Clock::duration wait;
    const Clock::duration header_timeout;
    const Clock::duration idle_timeout;
    const size_t devices;
    const std::string listen;
    const std::string db;
    const int epoll_fd;
    const int done_fd;
    const int wake_fd;
    const int listener;
    std::unordered_map<uint64_t, Connection> connections;
    std::unordered_map<std::string, std::set<uint64_t>> waiting;  // by replica
    uint64_t next_id = kFirstConnection;
    uint64_t wakes = 0;
    bool accepting = true;          // the listener is watched (not while out of descriptors)
    bool stopping = false;          // a stop signal came
    bool checking = false;          // a `waiting` task is out
    int64_t checking_replicas = 0;  // the replicas it asks about
    Woken check_again;              // whom the NOTIFYs since woke
    Workers workers;
    const bool gzip;  // heads go gzip to the devices that take it (--gzip)
    std::optional<Wakeups> wakeups;
    PullMetrics metrics;
    std::unique_ptr<MetricsServer> metrics_server;
};

PullServer::PullServer(const Options& options) {
    try {
        libpq::check_conninfo(options.db);
    } catch (const libpq::Failure& e) {
        throw std::runtime_error(std::string("--db: ") + e.what());
    }
    // A token query or statement the database refuses is said now, not at the first request;
    // a database that is away is not: devices are answered 503 until it is back.
    try {
        PGconn* connection = connect_prepared(options.db, options.token_query);
        Result described(PQdescribePrepared(connection, kTokenStatement), PQclear);
        const bool takes_the_token =
            PQnparams(described.get()) == 1 && PQnfields(described.get()) >= 1;
        PQfinish(connection);
        if (!takes_the_token)
            throw std::runtime_error(
                "--token-query must take the token as $1, and nothing else, and return the ids "
                "of the replicas it may act for in its first column");
    } catch (const Refusal& refusal) {
        if (refusal.status != 503) throw std::runtime_error(refusal.why);
        log_line(refusal.why + "; devices are answered 503 until it is back");
    }
    make_room_for(options.devices);
    serving_ = std::make_unique<Serving>(options);
    if (!options.metrics.empty())
        serving_->metrics_server = std::make_unique<MetricsServer>(
            [&metrics = serving_->metrics] { return metrics.text(); }, options.metrics, options.db);
    if (!is_loopback(options.listen))
        log_line("--listen " + options.listen +
                 " is not a loopback address: devices' tokens and data cross the network in "
                 "plain HTTP; put a reverse proxy with TLS in front (README, Pull)");
}

PullServer::~PullServer() = default;

int PullServer::run(int signal_fd) {
    serving_->wakeups.emplace(serving_->db, serving_->wake_fd);
    log_line("pull: serving devices on " + serving_->listen);
    serving_->loop(signal_fd);
    log_line("stopped");
    return 0;
}

}  // namespace magic_sync::sender
