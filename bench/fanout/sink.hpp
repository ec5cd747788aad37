// The ack-only sink of the fan-out benchmark: one process that answers for every replica. It
// reads each message's header with src/protocol, takes the message as a replica would (a newer
// generation or another origin starts over, a seq already applied is a duplicate), counts its
// rows, acknowledges it on the transport, and reports what each replica applied to the server
// with sync.receive, as a replica's upload does (`applied` and `origin`, no rows), so the relay
// confirms the messages and the cursors advance as with real replicas. It applies nothing.
//
// Its transports: HttpSink, an HTTP/1.1 server on one epoll thread (the sender's http transport
// POSTs to /replicas/<id>), and NatsSink, one JetStream pull consumer on every replica's subject.
#pragma once

#include <libpq-fe.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "protocol/messages.hpp"
#include "server/pq.hpp"

namespace magic_sync::bench {

using Clock = std::chrono::steady_clock;

// What a message brings: its header, its kind and the rows of its chunks.
struct MessageRead {
    protocol::MessageHeader header;
    std::string kind;
    int64_t rows = 0;
};

// Reads messages with protocol::decode_down. Every replica of a scope is sent the same chunks
// (built once, docs/DESIGN.md §3), so the messages of one fan-out differ only in their header:
// a message whose rest (what follows its header) was seen before has only its header decoded,
// closed by an empty chunk list, and the rows counted then; any other is decoded whole. A full
// decode of every 160 kB message would cost the sink more than the server spends sending it.
//
// A message sent gzip, as protocol::assemble_rows_gzip makes it, is one deflate stream of pieces
// each ending byte-aligned: first the envelope's text up to `"chunks":[` (deflated for this
// message), then the chunks (each deflated once, the same bytes for every replica) and the text
// between and after them, then the final block, the CRC-32 and the length. Only that first piece
// is inflated (inflate stops at the end of its block); its rest is the deflated bytes after it up
// to the CRC, inflated on its own once per distinct rest and decoded whole behind the first piece,
// its text's CRC-32 and length kept with its rows so that the trailer of a message that repeats
// it is checked as gunzip checks it. A message that does not split that way, or does not check
// out so, is inflated and decoded whole by decode_down, which refuses what does not decode.
// Not thread-safe: one per thread.
class MessageReader {
  public:
    MessageReader() {
        // 16 + window bits: a gzip header read (and nothing checked at the end: it stops
        // before); negative window bits: raw deflate, as a rest is.
        if (inflateInit2(&head_stream_, 16 + MAX_WBITS) != Z_OK ||
            inflateInit2(&rest_stream_, -MAX_WBITS) != Z_OK)
            throw std::runtime_error("inflateInit2 failed");
    }
    ~MessageReader() {
        inflateEnd(&head_stream_);
        inflateEnd(&rest_stream_);
    }
    MessageReader(const MessageReader&) = delete;
    MessageReader& operator=(const MessageReader&) = delete;

    // Throws protocol::DecodeError for bytes that are not a message.
    MessageRead read(std::string_view message) {
        if (protocol::is_gzip(message)) return read_gzip(message);
        const size_t end = header_end(message);
        if (end == 0) return read_whole(message);
        const std::string_view rest = message.substr(end);
        std::vector<Known>& same_hash = known_[std::hash<std::string_view>{}(rest)];
        for (const Known& known : same_hash) {
            if (known.gzip || known.rest != rest) continue;
            std::string header_only(message.substr(0, end));
            header_only += R"(,"chunks":[]})";
            MessageRead read = read_whole(header_only);
            read.rows = known.rows;
            return read;
        }
        MessageRead read = read_whole(message);
        if (read.kind != "rows") return read;
        remember(same_hash, Known{std::string(rest), read.rows, false, 0, 0});
        return read;
    }

  private:
    // A rest seen before: its bytes, the rows of its chunks and, sent gzip, its text's CRC-32
    // and length.
    struct Known {
        std::string rest;
        int64_t rows;
        bool gzip;
        uint32_t crc;
        size_t size;
    };

    MessageRead read_gzip(std::string_view message) {
        const size_t head_end = inflate_head(message);
        if (head_end == 0) return read_whole(message);
        const std::string_view rest = message.substr(head_end, message.size() - 8 - head_end);
        const uint32_t crc = le32(message.substr(message.size() - 8));
        const uint32_t size = le32(message.substr(message.size() - 4));
        const uint32_t head_crc = static_cast<uint32_t>(crc32(
            0, reinterpret_cast<const Bytef*>(head_.data()), static_cast<uInt>(head_.size())));
        // Whether the head followed by a rest of this CRC-32 and length is what the trailer says.
        const auto checks = [&](uint32_t rest_crc, size_t rest_size) {
            return head_.size() + rest_size <= protocol::Limits{}.max_bytes &&
                   crc32_combine(head_crc, rest_crc, static_cast<z_off_t>(rest_size)) == crc &&
                   static_cast<uint32_t>(head_.size() + rest_size) == size;
        };
        std::vector<Known>& same_hash = known_[std::hash<std::string_view>{}(rest)];
        for (const Known& known : same_hash) {
            if (!known.gzip || known.rest != rest) continue;
            if (!checks(known.crc, known.size)) return read_whole(message);
            try {
                MessageRead read = read_whole(head_ + "]}");
                read.rows = known.rows;
                return read;
            } catch (const protocol::DecodeError&) {
                return read_whole(message);
            }
        }
        std::string text = head_;
        if (!inflate_rest(rest, text)) return read_whole(message);
        const size_t rest_size = text.size() - head_.size();
        const uint32_t rest_crc = static_cast<uint32_t>(
            crc32(0, reinterpret_cast<const Bytef*>(text.data() + head_.size()),
                  static_cast<uInt>(rest_size)));
        if (!checks(rest_crc, rest_size)) return read_whole(message);
        MessageRead read = read_whole(text);
        if (read.kind != "rows") return read;
        remember(same_hash, Known{std::string(rest), read.rows, true, rest_crc, rest_size});
        return read;
    }

    // Inflates the first piece of a gzip message into head_: up to the end of a block, with no
    // bit of the next byte used, that is not the last and after which the text ends with
    // `"chunks":[`. Where its bytes end in `message`, or 0 when it does not split there within
    // kHeadMax bytes of text, before the trailer.
    size_t inflate_head(std::string_view message) {
        constexpr std::string_view kChunks = R"("chunks":[)";
        if (message.size() < 18) return 0;  // the header (10 bytes) and the trailer (8)
        inflateReset(&head_stream_);
        head_.resize(kHeadMax);
        head_stream_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(message.data()));
        head_stream_.avail_in = static_cast<uInt>(message.size() - 8);
        head_stream_.next_out = reinterpret_cast<Bytef*>(head_.data());
        head_stream_.avail_out = static_cast<uInt>(head_.size());
        for (;;) {
            // Z_BLOCK: stop at the end of each block (and of the gzip header).
            if (inflate(&head_stream_, Z_BLOCK) != Z_OK) break;
            const size_t made = head_.size() - head_stream_.avail_out;
            const int state = head_stream_.data_type;
            const bool block_ended = (state & 128) != 0 && (state & 64) == 0 && (state & 63) == 0;
            if (block_ended && made >= kChunks.size() &&
                std::string_view(head_.data(), made).substr(made - kChunks.size()) == kChunks) {
                head_.resize(made);
                return message.size() - 8 - head_stream_.avail_in;
            }
            if (head_stream_.avail_out == 0) break;
        }
        head_.clear();
        return 0;
    }

    // Appends the text of `rest` inflated on its own (raw deflate, no dictionary: it refers to
    // nothing before it) to `text`; false unless it is that, ending with the last block and
    // within the bound on a message's size.
    bool inflate_rest(std::string_view rest, std::string& text) {
        inflateReset(&rest_stream_);
        rest_stream_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(rest.data()));
        rest_stream_.avail_in = static_cast<uInt>(rest.size());
        int status = Z_OK;
        while (status == Z_OK) {
            const size_t from = text.size();
            if (from >= protocol::Limits{}.max_bytes) return false;
            text.resize(std::min(from + std::max<size_t>(rest.size() * 8, 65536),
                                 protocol::Limits{}.max_bytes));
            rest_stream_.next_out = reinterpret_cast<Bytef*>(text.data() + from);
            rest_stream_.avail_out = static_cast<uInt>(text.size() - from);
            status = inflate(&rest_stream_, Z_NO_FLUSH);
            text.resize(text.size() - rest_stream_.avail_out);
        }
        return status == Z_STREAM_END && rest_stream_.avail_in == 0;
    }

    static uint32_t le32(std::string_view bytes) {
        uint32_t value = 0;
        for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
        return value;
    }

    void remember(std::vector<Known>& same_hash, Known known) {
        if (known_.size() > 4096) {
            known_.clear();
            known_[std::hash<std::string_view>{}(known.rest)].push_back(std::move(known));
            return;
        }
        same_hash.push_back(std::move(known));
    }
    static MessageRead read_whole(std::string_view message) {
        MessageRead read;
        std::visit(
            [&](const auto& down) {
                read.header = down.header;
                using Kind = std::decay_t<decltype(down)>;
                if constexpr (std::is_same_v<Kind, protocol::RowsMessage>) {
                    read.kind = "rows";
                    for (const protocol::Chunk& chunk : down.chunks)
                        read.rows += static_cast<int64_t>(chunk.rows.size());
                } else if constexpr (std::is_same_v<Kind, protocol::FiledMessage>) {
                    read.kind = "filed";
                } else if constexpr (std::is_same_v<Kind, protocol::RangesMessage>) {
                    read.kind = "ranges";
                } else {
                    read.kind = "repair";
                }
            },
            protocol::decode_down(message));
        return read;
    }

    // Where the header ends in a rows message as the relay encodes it and the sender stamps it:
    // {"v":V,"kind":"rows","replica":"U","gen":G,"seq":S,"origin":"O" up to O's closing quote
    // (or S when there is no origin); 0 for any other form, which is decoded whole.
    static size_t header_end(std::string_view message) {
        if (message.substr(0, 5) != R"({"v":)") return 0;
        const size_t rows_kind = message.find(R"(,"kind":"rows","replica":")");
        const size_t seq = message.find(R"(,"seq":)");
        if (rows_kind == std::string_view::npos || rows_kind > 16 ||
            seq == std::string_view::npos || seq > 120)
            return 0;
        size_t at = seq + 7;
        while (at < message.size() && message[at] >= '0' && message[at] <= '9') ++at;
        constexpr std::string_view kOrigin = R"(,"origin":")";
        if (message.substr(at, kOrigin.size()) != kOrigin) return at;
        const size_t close = message.find('"', at + kOrigin.size());
        if (close == std::string_view::npos ||
            message.substr(at, close - at).find('\\') != std::string_view::npos)
            return 0;
        return close + 1;
    }

    // The most text the first piece of a gzip message may inflate to (the envelope: header,
    // resets and drops).
    static constexpr size_t kHeadMax = 65536;
    z_stream head_stream_{};
    z_stream rest_stream_{};
    std::string head_;  // the first piece of the gzip message read last, inflated
    std::unordered_map<size_t, std::vector<Known>> known_;
};

inline std::string random_uuid() {
    static thread_local std::mt19937_64 random(std::random_device{}());
    const uint64_t high = (random() & ~0xf000ULL) | 0x4000ULL;                        // version 4
    const uint64_t low = (random() & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;  // variant
    char text[40];
    std::snprintf(text, sizeof text, "%08llx-%04llx-%04llx-%04llx-%012llx",
                  static_cast<unsigned long long>(high >> 32),
                  static_cast<unsigned long long>((high >> 16) & 0xffff),
                  static_cast<unsigned long long>(high & 0xffff),
                  static_cast<unsigned long long>(low >> 48),
                  static_cast<unsigned long long>(low & 0xffffffffffffULL));
    return text;
}

// Every replica's state as the sink keeps it, and what it counted since the round began.
class Replicas {
  public:
    enum class Outcome { kTaken, kDuplicate, kRefused };

    explicit Replicas(const std::vector<std::string>& ids) {
        for (const std::string& id : ids) state_.emplace(id, State{});
    }

    // Takes `message`, sent to the replica `addressed` (by its URL or subject) as a replica
    // would: refused when it is not a message or names another replica.
    Outcome take(std::string_view addressed, std::string_view message, MessageReader& reader) {
        MessageRead read;
        try {
            read = reader.read(message);
        } catch (const protocol::DecodeError&) {
            return refused();
        }
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = state_.find(read.header.replica);
        if (found == state_.end() || read.header.replica != addressed) {
            ++refused_;
            return Outcome::kRefused;
        }
        State& replica = found->second;
        const bool new_history = read.header.origin != replica.origin;
        if (!new_history && (read.header.gen < replica.gen ||
                             (read.header.gen == replica.gen && read.header.seq <= replica.seq))) {
            ++duplicates_;
            return Outcome::kDuplicate;
        }
        replica.origin = read.header.origin;
        replica.gen = read.header.gen;
        replica.seq = read.header.seq;
        if (replica.rows_in_round < round_rows_ && replica.rows_in_round + read.rows >= round_rows_)
            ++complete_;
        replica.rows_in_round += read.rows;
        ++messages_;
        bytes_ += static_cast<int64_t>(message.size());
        const auto now = Clock::now();
        if (messages_ == 1) first_taken_ = now;
        last_taken_ = now;
        return Outcome::kTaken;
    }

    // A round begins: every replica is to receive `rows` rows from now on.
    void begin_round(int64_t rows) {
        std::lock_guard<std::mutex> lock(mutex_);
        round_rows_ = rows;
        for (auto& [id, replica] : state_) replica.rows_in_round = 0;
        complete_ = 0;
        messages_ = bytes_ = duplicates_ = refused_ = 0;
    }

    struct Round {
        int64_t complete = 0;  // replicas that received the round's rows
        int64_t messages = 0, bytes = 0, duplicates = 0, refused = 0;
        int64_t fewest_rows = 0, most_rows = 0;  // received by one replica
        Clock::time_point first_taken, last_taken;
    };
    Round round() const {
        std::lock_guard<std::mutex> lock(mutex_);
        Round round{complete_, messages_, bytes_,       duplicates_, refused_,
                    INT64_MAX, 0,         first_taken_, last_taken_};
        for (const auto& [id, replica] : state_) {
            round.fewest_rows = std::min(round.fewest_rows, replica.rows_in_round);
            round.most_rows = std::max(round.most_rows, replica.rows_in_round);
        }
        return round;
    }
    int64_t complete() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return complete_;
    }
    int64_t count() const { return static_cast<int64_t>(state_.size()); }

    // What a replica would upload now: the seq it applied last, in its origin.
    struct Applied {
        std::string replica;
        int64_t seq;
        std::string origin;
    };
    // The replicas that applied messages since they last reported.
    std::vector<Applied> unreported() const {
        std::vector<Applied> due;
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [id, replica] : state_)
            if (replica.seq != replica.reported || replica.origin != replica.reported_origin)
                due.push_back(Applied{id, replica.seq, replica.origin});
        return due;
    }
    void reported(const Applied& applied) {
        std::lock_guard<std::mutex> lock(mutex_);
        State& replica = state_.at(applied.replica);
        replica.reported = applied.seq;
        replica.reported_origin = applied.origin;
    }

  private:
    struct State {
        std::string origin;
        int64_t gen = 0, seq = 0;
        int64_t reported = 0;
        std::string reported_origin;
        int64_t rows_in_round = 0;
    };

    Outcome refused() {
        std::lock_guard<std::mutex> lock(mutex_);
        ++refused_;
        return Outcome::kRefused;
    }

    mutable std::mutex mutex_;
    std::unordered_map<std::string, State> state_;
    int64_t round_rows_ = 0;
    int64_t complete_ = 0, messages_ = 0, bytes_ = 0, duplicates_ = 0, refused_ = 0;
    Clock::time_point first_taken_, last_taken_;
};

// Reports what the replicas applied, as their uploads would: every `every`, one upload per
// replica that applied something since (`applied` and `origin`, no rows: the server answers none)
// through sync.receive, pipelined, in transactions of up to 500 uploads on one connection. A fleet
// would make one transaction per upload; the server's work per upload is the same function.
class Reporter {
  public:
    Reporter(Replicas& replicas, const std::string& conninfo, std::chrono::milliseconds every)
        : replicas_(replicas), connection_(conninfo), every_(every) {
        PGresult* prepared = PQprepare(connection_.raw(), "receive",
                                       "SELECT sync.receive($1::uuid, $2::bytea)", 2, nullptr);
        const bool ok = PQresultStatus(prepared) == PGRES_COMMAND_OK;
        PQclear(prepared);
        if (!ok) throw std::runtime_error(PQerrorMessage(connection_.raw()));
        backend_pid_ = PQbackendPID(connection_.raw());
        thread_ = std::thread([this] { run(); });
    }
    ~Reporter() {
        stop_ = true;
        thread_.join();
    }
    Reporter(const Reporter&) = delete;
    Reporter& operator=(const Reporter&) = delete;

    pid_t backend_pid() const { return backend_pid_; }
    int64_t uploads() const { return uploads_; }
    int64_t failures() const { return failures_; }

  private:
    void run() {
        while (!stop_) {
            std::this_thread::sleep_for(every_);
            std::vector<Replicas::Applied> due = replicas_.unreported();
            for (size_t from = 0; from < due.size() && !stop_; from += kBatch) {
                const size_t to = std::min(due.size(), from + kBatch);
                if (send(due, from, to))
                    for (size_t i = from; i < to; ++i) replicas_.reported(due[i]);
                else
                    ++failures_;
            }
        }
    }

    // One transaction of the uploads of due[from, to); whether every one was taken.
    bool send(const std::vector<Replicas::Applied>& due, size_t from, size_t to) {
        PGconn* connection = connection_.raw();
        if (PQenterPipelineMode(connection) != 1) return false;
        for (size_t i = from; i < to; ++i) {
            protocol::Upload upload;
            upload.id = random_uuid();
            upload.applied = due[i].seq;
            upload.origin = due[i].origin;
            const std::string body = protocol::encode(upload);
            const char* values[2] = {due[i].replica.c_str(), body.data()};
            const int lengths[2] = {0, static_cast<int>(body.size())};
            const int formats[2] = {0, 1};
            PQsendQueryPrepared(connection, "receive", 2, values, lengths, formats, 0);
        }
        PQpipelineSync(connection);
        bool taken = true;
        for (size_t i = from; i < to; ++i) {
            PGresult* result = PQgetResult(connection);
            taken = taken && PQresultStatus(result) == PGRES_TUPLES_OK &&
                    std::string_view(PQgetvalue(result, 0, 0)) != "refused" &&
                    std::string_view(PQgetvalue(result, 0, 0)) != "dropped";
            PQclear(result);
            PQclear(PQgetResult(connection));  // the null that ends each query's results
        }
        PQclear(PQgetResult(connection));  // the pipeline's sync
        PQexitPipelineMode(connection);
        uploads_ += static_cast<int64_t>(to - from);
        return taken;
    }

    static constexpr size_t kBatch = 500;
    Replicas& replicas_;
    test::Connection connection_;
    std::chrono::milliseconds every_;
    pid_t backend_pid_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int64_t> uploads_{0}, failures_{0};
    std::thread thread_;
};

// The sender's http transport's far end for every replica: POST /replicas/<id> answered 200 once
// the message is taken (or is a duplicate), 400 when refused. HTTP/1.1 with keep-alive and
// Content-Length bodies (what libcurl sends), every connection on one epoll thread.
class HttpSink {
  public:
    explicit HttpSink(Replicas& replicas) : replicas_(replicas) {
        listener_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        if (bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
            listen(listener_, 1024) != 0 ||
            getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
            throw std::runtime_error("sink: cannot listen");
        port_ = ntohs(address.sin_port);
        epoll_ = epoll_create1(EPOLL_CLOEXEC);
        watch(listener_, EPOLLIN, EPOLL_CTL_ADD);
        thread_ = std::thread([this] { loop(); });
    }
    ~HttpSink() {
        stop_ = true;
        thread_.join();
        for (auto& [fd, peer] : peers_) close(fd);
        close(epoll_);
        close(listener_);
    }
    HttpSink(const HttpSink&) = delete;
    HttpSink& operator=(const HttpSink&) = delete;

    std::string url() const {
        return "http://127.0.0.1:" + std::to_string(port_) + "/replicas/{replica}";
    }

  private:
    struct Peer {
        std::string in;
        size_t parsed = 0;  // requests before this were answered
        std::string out;
    };

    void watch(int fd, uint32_t events, int operation) {
        epoll_event event{};
        event.events = events;
        event.data.fd = fd;
        epoll_ctl(epoll_, operation, fd, &event);
    }

    void loop() {
        epoll_event events[256];
        while (!stop_) {
            const int ready = epoll_wait(epoll_, events, 256, 100);
            for (int i = 0; i < ready; ++i) {
                const int fd = events[i].data.fd;
                if (fd == listener_)
                    accept_all();
                else if (!serve(fd, peers_[fd]))
                    hang_up(fd);
            }
        }
    }

    void accept_all() {
        for (int fd;
             (fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
            peers_[fd];
            watch(fd, EPOLLIN, EPOLL_CTL_ADD);
        }
    }

    void hang_up(int fd) {
        epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        peers_.erase(fd);
    }

    // Reads what came, answers every whole request in it, writes the answers; false when the
    // peer is gone or spoke something else than HTTP.
    bool serve(int fd, Peer& peer) {
        char chunk[1 << 16];
        for (;;) {
            const ssize_t n = read(fd, chunk, sizeof chunk);
            if (n > 0) {
                peer.in.append(chunk, static_cast<size_t>(n));
                continue;
            }
            if (n == 0) return false;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno != EINTR) return false;
        }
        for (;;) {
            const std::string_view in = std::string_view(peer.in).substr(peer.parsed);
            const size_t head_end = in.find("\r\n\r\n");
            if (head_end == std::string_view::npos) break;
            const std::string_view head = in.substr(0, head_end);
            const size_t path_start = head.find(' ');
            const size_t path_end = head.find(' ', path_start + 1);
            if (path_start == std::string_view::npos || path_end == std::string_view::npos)
                return false;
            const std::string_view path = head.substr(path_start + 1, path_end - path_start - 1);
            const size_t body_length = content_length(head);
            if (in.size() < head_end + 4 + body_length) {
                peer.in.reserve(peer.parsed + head_end + 4 + body_length);
                break;
            }
            const Replicas::Outcome outcome = replicas_.take(
                path.substr(path.rfind('/') + 1), in.substr(head_end + 4, body_length), reader_);
            peer.out += outcome == Replicas::Outcome::kRefused
                            ? "HTTP/1.1 400 Refused\r\nContent-Length: 0\r\n\r\n"
                            : "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
            peer.parsed += head_end + 4 + body_length;
        }
        if (peer.parsed == peer.in.size()) {
            peer.in.clear();
            peer.parsed = 0;
        }
        while (!peer.out.empty()) {
            const ssize_t n = send(fd, peer.out.data(), peer.out.size(), MSG_NOSIGNAL);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (n < 0 && errno != EINTR) return false;
            if (n > 0) peer.out.erase(0, static_cast<size_t>(n));
        }
        watch(fd, peer.out.empty() ? EPOLLIN : EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
        return true;
    }

    static size_t content_length(std::string_view head) {
        for (size_t line = head.find("\r\n"); line != std::string_view::npos;
             line = head.find("\r\n", line + 2)) {
            constexpr std::string_view kName = "content-length:";
            const std::string_view rest = head.substr(line + 2);
            if (rest.size() < kName.size()) continue;
            bool same = true;
            for (size_t i = 0; i < kName.size() && same; ++i)
                same = std::tolower(static_cast<unsigned char>(rest[i])) == kName[i];
            if (same) return std::strtoull(rest.data() + kName.size(), nullptr, 10);
        }
        return 0;
    }

    Replicas& replicas_;
    MessageReader reader_;
    int listener_ = -1;
    int epoll_ = -1;
    int port_ = 0;
    std::unordered_map<int, Peer> peers_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// The far end of the sender's nats transport for every replica: one durable pull consumer on
// `<prefix>.>` of a stream the sink makes (memory storage, work-queue retention: an acknowledged
// message leaves it), fetched in batches; each message taken or found a duplicate is
// acknowledged, one refused is terminated (not delivered again). A replica's own consumer
// filters on its subject; one consumer on every subject keeps each subject's order the same.
class NatsSink {
  public:
    NatsSink(Replicas& replicas, const std::string& url, const std::string& prefix)
        : replicas_(replicas), prefix_(prefix) {
        if (natsConnection_ConnectTo(&connection_, url.c_str()) != NATS_OK ||
            natsConnection_JetStream(&js_, connection_, nullptr) != NATS_OK)
            throw std::runtime_error("sink: cannot connect to " + url);
        const std::string subject = prefix + ".>";
        const char* subjects[] = {subject.c_str()};
        jsStreamConfig stream;
        jsStreamConfig_Init(&stream);
        stream.Name = prefix.c_str();
        stream.Subjects = subjects;
        stream.SubjectsLen = 1;
        stream.Storage = js_MemoryStorage;
        stream.Retention = js_WorkQueuePolicy;
        jsStreamInfo* info = nullptr;
        jsErrCode error = static_cast<jsErrCode>(0);
        if (js_AddStream(&info, js_, &stream, nullptr, &error) != NATS_OK)
            throw std::runtime_error("sink: cannot create the stream (" +
                                     std::to_string(static_cast<int>(error)) + ")");
        jsStreamInfo_Destroy(info);
        jsSubOptions options;
        jsSubOptions_Init(&options);
        options.Config.AckPolicy = js_AckExplicit;
        options.Config.MaxAckPending = 100000;
        if (js_PullSubscribe(&subscription_, js_, subject.c_str(), "fanout_sink", nullptr, &options,
                             &error) != NATS_OK)
            throw std::runtime_error("sink: cannot subscribe (" +
                                     std::to_string(static_cast<int>(error)) + ")");
        thread_ = std::thread([this] { loop(); });
    }
    ~NatsSink() {
        stop_ = true;
        thread_.join();
        natsSubscription_Destroy(subscription_);
        jsCtx_Destroy(js_);
        natsConnection_Destroy(connection_);
    }
    NatsSink(const NatsSink&) = delete;
    NatsSink& operator=(const NatsSink&) = delete;

  private:
    void loop() {
        while (!stop_) {
            natsMsgList batch{};
            if (natsSubscription_Fetch(&batch, subscription_, 256, 100, nullptr) != NATS_OK)
                continue;
            for (int i = 0; i < batch.Count; ++i) {
                natsMsg* message = batch.Msgs[i];
                const std::string_view subject = natsMsg_GetSubject(message);
                const std::string_view replica = subject.substr(subject.rfind('.') + 1);
                const Replicas::Outcome outcome = replicas_.take(
                    replica,
                    std::string_view(natsMsg_GetData(message),
                                     static_cast<size_t>(natsMsg_GetDataLength(message))),
                    reader_);
                if (outcome == Replicas::Outcome::kRefused)
                    natsMsg_Term(message, nullptr);
                else
                    natsMsg_Ack(message, nullptr);
            }
            natsMsgList_Destroy(&batch);
        }
    }

    Replicas& replicas_;
    std::string prefix_;
    MessageReader reader_;
    natsConnection* connection_ = nullptr;
    jsCtx* js_ = nullptr;
    natsSubscription* subscription_ = nullptr;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace magic_sync::bench
