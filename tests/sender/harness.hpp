// What the sender's tests share: a cluster with one database per test, the sender as a real
// process, and a temporary directory. Everything is stopped and removed when the objects go away,
// also when a test fails.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/cluster.hpp"
#include "support/eventually.hpp"
#include "support/temp_dir.hpp"

namespace magic_sync::test::sender {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Ours, for the tests: a fixed gen, so message ids are "2.<seq>".
constexpr int kGen = 2;
// In every test connection string: the sender must never print it.
constexpr const char* kPassword = "hunter2-never-printed";

inline std::string replica_id(int n) {
    char text[40];
    std::snprintf(text, sizeof text, "00000000-0000-0000-0000-%012x", n);
    return text;
}

inline std::string message_id(int seq) { return std::to_string(kGen) + "." + std::to_string(seq); }

inline std::string message_body(int replica, int seq) {
    return "{\"replica\":\"" + replica_id(replica) + "\",\"seq\":" + std::to_string(seq) + "}";
}

inline std::string read_file(const std::string& path) {
    std::ifstream file(path);
    std::stringstream content;
    content << file.rdbuf();
    return content.str();
}

inline int count_of(const std::string& text, const std::string& part) {
    int count = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
        ++count;
    return count;
}

// A program run by the test, its stdout and stderr in a file; killed with SIGKILL if the test
// leaves it running.
class Process {
  public:
    Process(const std::vector<std::string>& argv, std::string log_path)
        : log_path_(std::move(log_path)) {
        // posix_spawn, not fork: a fork copies the page tables of a test or benchmark that has
        // grown large (a sink holding every message it took), which took 300 ms on this project's
        // 2-core VM and was counted in the sender's time.
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(),
                                         O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        std::vector<char*> args;
        for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
        args.push_back(nullptr);
        const int failed = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        if (failed != 0) {
            pid_ = -1;
            throw std::runtime_error("cannot run " + argv[0] + ": " + std::strerror(failed));
        }
    }
    ~Process() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;

    void signal(int number) {
        if (pid_ > 0) kill(pid_, number);
    }
    // The exit status, or -1 (and the process killed) when it did not end within `limit`.
    int wait(std::chrono::milliseconds limit) {
        const auto until = Clock::now() + limit;
        while (pid_ > 0) {
            int status = 0;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            if (Clock::now() >= until) {
                kill(pid_, SIGKILL);
                waitpid(pid_, nullptr, 0);
                pid_ = -1;
                return -1;
            }
            std::this_thread::sleep_for(10ms);
        }
        return -1;
    }
    std::string log() const { return read_file(log_path_); }

  private:
    std::string log_path_;
    pid_t pid_ = -1;
};

inline std::string sender_binary() {
    const char* configured = std::getenv("MAGIC_SYNC_SENDER");
    return configured != nullptr ? configured : "build/bin/magic-sync-sender";
}

// One cluster for the whole binary (initdb once); each test gets its own database.
inline Cluster& cluster() {
    static std::unique_ptr<Cluster> shared = [] {
        auto made = std::make_unique<Cluster>();
        made->create_database("sender_roles");
        // A login role with only what the sender is granted.
        made->sql("postgres", "CREATE ROLE magic_sender LOGIN IN ROLE sync_sender");
        return made;
    }();
    return *shared;
}

// Until the relay's sync.message lands, a stand-in lets sync.next plan; tests put the bytes in
// outbox.body, which sync.next prefers.
constexpr const char* kMessageStandIn = R"(
DO $$
BEGIN
    IF to_regprocedure('sync.message(uuid,bigint)') IS NULL THEN
        CREATE FUNCTION sync.message(uuid, bigint) RETURNS bytea LANGUAGE sql AS 'SELECT NULL::bytea';
    END IF;
END
$$;)";

// A database with `replicas` replicas, each with `messages` messages (seq 1..messages) whose
// bytes are message_body(replica, seq). Backoff 200 ms doubling to 1 s, so tests are quick.
class Outbox {
  public:
    Outbox(const std::string& name, int replicas, int messages) : name_(name) {
        cluster().create_database(name_);
        sql(kMessageStandIn);
        sql("ALTER DATABASE " + name_ + " SET magic_sync.backoff = '200ms';" + " ALTER DATABASE " +
            name_ + " SET magic_sync.backoff_max = '1s'");
        add(1, replicas, 1, messages);
    }
    ~Outbox() {
        try {
            cluster().sql("postgres", "DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
        } catch (const std::exception&) {
            // the cluster may be stopped by a failed test; it is removed anyway
        }
    }

    // Replicas first..last, messages from..to each.
    void add(int first, int last, int from, int to) {
        sql("INSERT INTO sync.replica (id, gen) SELECT ('00000000-0000-0000-0000-' || "
            "lpad(to_hex(r), 12, '0'))::uuid, " +
            std::to_string(kGen) + " FROM generate_series(" + std::to_string(first) + ", " +
            std::to_string(last) +
            ") r ON CONFLICT DO NOTHING;"
            "INSERT INTO sync.outbox (replica, seq, gen, kind, body) SELECT r.id, s, r.gen, "
            "'rows', "
            "convert_to(format('{\"replica\":\"%s\",\"seq\":%s}', r.id, s), 'UTF8') "
            "FROM sync.replica r, generate_series(" +
            std::to_string(from) + ", " + std::to_string(to) + ") s WHERE r.id >= '" +
            replica_id(first) + "' AND r.id <= '" + replica_id(last) + "'");
    }

    std::string sql(const std::string& statements) const {
        return cluster().sql(name_, statements);
    }
    long long number(const std::string& query) const { return std::stoll(sql(query)); }
    long long unsent() const {
        return number("SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL");
    }
    // Connection string of the sender's own role, with a password it must never print.
    std::string conninfo() const {
        return "host=127.0.0.1 port=" + std::to_string(cluster().port()) +
               " user=magic_sender dbname=" + name_ + " password=" + kPassword;
    }
    const std::string& name() const { return name_; }

  private:
    std::string name_;
};

// The sender as a process: `arguments` after --db.
class SenderProcess : public Process {
  public:
    SenderProcess(const Outbox& outbox, const TempDir& dir,
                  const std::vector<std::string>& arguments,
                  const std::string& log_name = "sender.log")
        : Process(argv_for(outbox, arguments), dir.path() + "/" + log_name) {}

  private:
    static std::vector<std::string> argv_for(const Outbox& outbox,
                                             const std::vector<std::string>& arguments) {
        std::vector<std::string> argv = {sender_binary(), "--db", outbox.conninfo(), "--report",
                                         "0"};
        argv.insert(argv.end(), arguments.begin(), arguments.end());
        return argv;
    }
};

// "done: N sent" / "stopped: N sent" from a sender's log.
inline long long sent_count(const std::string& log) {
    for (const char* marker : {"done: ", "stopped: "}) {
        const auto at = log.rfind(marker);
        if (at != std::string::npos) return std::stoll(log.substr(at + std::strlen(marker)));
    }
    return -1;
}

}  // namespace magic_sync::test::sender
