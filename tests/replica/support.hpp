// Helpers of the replica tests: temporary directories, down messages built with the protocol's own
// encoder, child processes of the CLI (killed when the test ends, also when it fails) and a tiny
// HTTP client.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "protocol/canonical.hpp"
#include "protocol/messages.hpp"
#include "support/eventually.hpp"
#include "support/temp_dir.hpp"

namespace magic_sync::replica::test {

inline const std::string kReplicaId = "11111111-2222-4333-8444-555555555555";

using magic_sync::test::TempDir;

inline protocol::DownRow row(const std::string& table, const std::string& key,
                             const std::string& json) {
    std::string canonical = protocol::canonical_json(json);
    return protocol::DownRow{table, protocol::canonical_json(key),
                             protocol::RowBody{canonical, protocol::row_hash(canonical)}};
}

inline protocol::DownRow gone(const std::string& table, const std::string& key) {
    return protocol::DownRow{table, protocol::canonical_json(key), std::nullopt};
}

inline protocol::Chunk chunk(const std::string& scope, int64_t from, int64_t to,
                             std::vector<protocol::DownRow> rows) {
    return protocol::Chunk{scope, from, to, std::move(rows)};
}

inline std::string rows_message(int64_t gen, int64_t seq, std::vector<protocol::Chunk> chunks,
                                std::vector<std::string> reset = {},
                                std::vector<std::string> drop = {},
                                const std::string& replica = kReplicaId) {
    protocol::RowsMessage message;
    message.header = {replica, gen, seq, ""};
    message.reset = std::move(reset);
    message.drop = std::move(drop);
    message.chunks = std::move(chunks);
    return protocol::encode(message);
}

inline std::string filed_message(int64_t gen, int64_t seq, const std::string& upload,
                                 std::vector<protocol::KeyNote> kept = {}, bool more = false) {
    protocol::FiledMessage message;
    message.header = {kReplicaId, gen, seq, ""};
    message.upload = upload;
    message.kept = std::move(kept);
    message.more = more;
    return protocol::encode(message);
}

inline std::string ranges_message(int64_t gen, int64_t seq, const std::string& scope,
                                  std::vector<protocol::KeyRange> ranges) {
    protocol::RangesMessage message;
    message.header = {kReplicaId, gen, seq, ""};
    message.scope = scope;
    message.ranges = std::move(ranges);
    return protocol::encode(message);
}

inline std::string repair_message(int64_t gen, int64_t seq, const std::string& scope,
                                  const protocol::KeyRange& range,
                                  std::vector<protocol::DownRow> rows) {
    protocol::RepairMessage message;
    message.header = {kReplicaId, gen, seq, ""};
    message.scope = scope;
    message.range = range;
    message.rows = std::move(rows);
    return protocol::encode(message);
}

// The key space cut into `count` equal ranges by the first byte of k (count divides 256).
inline std::vector<protocol::KeyRange> split_key_space(int count) {
    std::vector<protocol::KeyRange> ranges;
    int step = 256 / count;
    for (int i = 0; i < count; ++i) {
        protocol::KeyRange range;
        range.lo[0] = static_cast<uint8_t>(i * step);
        if (i + 1 < count) {
            protocol::Digest hi{};
            hi[0] = static_cast<uint8_t>((i + 1) * step);
            range.hi = hi;
        }
        ranges.push_back(range);
    }
    return ranges;
}

inline std::string read_file(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    std::stringstream content;
    content << file.rdbuf();
    return content.str();
}

inline void write_file(const std::string& path, const std::string& content) {
    std::ofstream file(path, std::ios::binary);
    file << content;
}

using magic_sync::test::eventually;

// build/tests/replica_tests → build/bin/magic-sync-replica
inline std::string replica_binary() {
    char path[4096];
    ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
    if (length <= 0) throw std::runtime_error("cannot find the test binary");
    std::string self(path, static_cast<size_t>(length));
    return self.substr(0, self.rfind('/')) + "/../bin/magic-sync-replica";
}

// A child process with stdout and stderr in `log`; killed with SIGKILL when it goes out of scope.
class Process {
  public:
    Process(const std::vector<std::string>& args, const std::string& log) : log_(log) {
        pid_ = fork();
        if (pid_ < 0) throw std::runtime_error("fork failed");
        if (pid_ == 0) {
            int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            dup2(fd, 1);
            dup2(fd, 2);
            std::vector<char*> argv;
            for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
    }
    ~Process() { kill9(); }
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;

    void kill9() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

    // SIGTERM, then the exit status (or -1 when it did not exit by itself in time).
    int terminate() {
        ::kill(pid_, SIGTERM);
        for (int i = 0; i < 200; ++i) {
            int status = 0;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(25));
        }
        kill9();
        return -1;
    }

    std::string log() const { return read_file(log_); }

  private:
    pid_t pid_ = -1;
    std::string log_;
};

// Runs the CLI to completion; returns its exit status, its stdout in `out`.
inline int run_cli(const std::vector<std::string>& args, std::string* out = nullptr,
                   const std::string& input_file = "") {
    std::string command = "'" + replica_binary() + "'";
    for (const std::string& arg : args) {
        std::string quoted = "'";
        for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
        command += " " + quoted + "'";
    }
    if (!input_file.empty()) command += " < '" + input_file + "'";
    command += " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    std::string captured;
    char buffer[4096];
    size_t n = 0;
    while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) captured.append(buffer, n);
    int status = pclose(pipe);
    if (out != nullptr) *out = captured;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// POSTs `body` to 127.0.0.1:port; returns the status, or none when no answer came in time.
inline std::optional<int> http_post(int port, const std::string& body,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(10),
                                    const std::string& message_id = "test",
                                    const std::string& headers = "") {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        close(fd);
        return std::nullopt;
    }
    std::string request = "POST /replicas/" + kReplicaId +
                          " HTTP/1.1\r\nHost: test\r\nmessage-id: " + message_id + "\r\n" +
                          headers + "Content-Length: " + std::to_string(body.size()) +
                          "\r\nConnection: close\r\n\r\n" + body;
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
        close(fd);
        return std::nullopt;
    }
    std::string answer;
    auto until = std::chrono::steady_clock::now() + timeout;
    while (answer.find("\r\n") == std::string::npos && std::chrono::steady_clock::now() < until) {
        pollfd poll_fd{fd, POLLIN, 0};
        if (poll(&poll_fd, 1, 50) <= 0) continue;
        char buffer[1024];
        ssize_t n = recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        answer.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    if (answer.compare(0, 9, "HTTP/1.1 ") != 0 || answer.size() < 12) return std::nullopt;
    return std::stoi(answer.substr(9, 3));
}

}  // namespace magic_sync::replica::test
