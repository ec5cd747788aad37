#include "exec_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace magic_sync::sender {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTemporaryFailure = 75;  // EX_TEMPFAIL, sysexits.h
constexpr size_t kKeptStderr = 4096;

void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
}

std::string last_line(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
        text.pop_back();
    const auto newline = text.rfind('\n');
    return newline == std::string::npos ? text : text.substr(newline + 1);
}

std::vector<std::string> environment_for(const Delivery& delivery) {
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
        const std::string variable = *entry;
        if (variable.rfind("REPLICA=", 0) == 0 || variable.rfind("MESSAGE_ID=", 0) == 0 ||
            variable.rfind("CONTENT_ENCODING=", 0) == 0)
            continue;
        environment.push_back(variable);
    }
    environment.push_back("REPLICA=" + delivery.replica);
    environment.push_back("MESSAGE_ID=" + delivery.message_id);
    if (!delivery.content_encoding.empty())
        environment.push_back("CONTENT_ENCODING=" + delivery.content_encoding);
    return environment;
}

}  // namespace

struct ExecTransport::Child {
    Delivery delivery;
    Done done;
    pid_t pid = -1;
    int process_fd = -1;  // a pidfd: readable once the child has exited
    int stdin_fd = -1;
    int stderr_fd = -1;
    size_t written = 0;
    std::string stderr_tail;
    Clock::time_point deadline;
    bool timed_out = false;

    ~Child() {
        close_fd(process_fd);
        close_fd(stdin_fd);
        close_fd(stderr_fd);
    }

    void read_stderr() {
        char buffer[4096];
        while (stderr_fd >= 0) {
            const ssize_t n = read(stderr_fd, buffer, sizeof buffer);
            if (n > 0) {
                stderr_tail.append(buffer, static_cast<size_t>(n));
                if (stderr_tail.size() > kKeptStderr)
                    stderr_tail.erase(0, stderr_tail.size() - kKeptStderr);
            } else if (n == 0 || errno != EINTR) {
                if (n == 0 || errno != EAGAIN) close_fd(stderr_fd);
                return;
            }
        }
    }

    void write_stdin() {
        while (stdin_fd >= 0 && written < delivery.bytes.size()) {
            const ssize_t n =
                write(stdin_fd, delivery.bytes.data() + written, delivery.bytes.size() - written);
            if (n > 0) {
                written += static_cast<size_t>(n);
            } else if (errno == EAGAIN) {
                return;
            } else if (errno != EINTR) {
                close_fd(stdin_fd);  // the command does not read it all (EPIPE): its business
                return;
            }
        }
        close_fd(stdin_fd);
    }

    Outcome outcome(int status) const {
        if (timed_out)
            return Outcome::transient("timeout after " + std::to_string(delivery.timeout.count()) +
                                      " ms");
        if (WIFSIGNALED(status))
            return Outcome::transient("killed by signal " + std::to_string(WTERMSIG(status)));
        const int code = WEXITSTATUS(status);
        if (code == 0) return Outcome::taken();
        std::string why = last_line(stderr_tail);
        if (why.empty()) why = "exit status " + std::to_string(code);
        if (code == kTemporaryFailure) return Outcome::transient(std::move(why));
        return Outcome::refused(std::move(why));
    }
};

ExecTransport::ExecTransport(std::string command)
    : command_(std::move(command)), wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
    worker_ = std::thread([this] { run(); });
}

ExecTransport::~ExecTransport() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = write(wake_fd_, &one, sizeof one);
    worker_.join();
    // Abandoned: their leases end with the sender's session and the messages go again.
    for (const auto& child : running_) {
        kill(-child->pid, SIGKILL);
        waitpid(child->pid, nullptr, 0);
    }
    close(wake_fd_);
}

void ExecTransport::send(Delivery delivery, Done done) {
    auto child = std::make_unique<Child>();
    child->deadline = Clock::now() + delivery.timeout;
    child->delivery = std::move(delivery);
    child->done = std::move(done);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        queued_.push_back(std::move(child));
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = write(wake_fd_, &one, sizeof one);
}

bool ExecTransport::start(Child& child) {
    int input[2];
    int errors[2];
    if (pipe2(input, O_CLOEXEC) != 0) {
        child.done(Outcome::transient(std::string("cannot make a pipe: ") + std::strerror(errno)));
        return false;
    }
    if (pipe2(errors, O_CLOEXEC) != 0) {
        close(input[0]);
        close(input[1]);
        child.done(Outcome::transient(std::string("cannot make a pipe: ") + std::strerror(errno)));
        return false;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, input[0], 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, errors[1], 2);
    // Its own process group (a timeout kills the whole of it), with the signal mask and the
    // handling of SIGPIPE, SIGTERM and SIGINT reset from what the sender uses.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(
        &attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attributes, 0);
    sigset_t signals;
    sigemptyset(&signals);
    posix_spawnattr_setsigmask(&attributes, &signals);
    sigaddset(&signals, SIGPIPE);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    posix_spawnattr_setsigdefault(&attributes, &signals);

    const std::vector<std::string> environment = environment_for(child.delivery);
    std::vector<char*> envp;
    for (const std::string& variable : environment)
        envp.push_back(const_cast<char*>(variable.c_str()));
    envp.push_back(nullptr);
    char shell[] = "/bin/sh";
    char dash_c[] = "-c";
    char* argv[] = {shell, dash_c, const_cast<char*>(command_.c_str()), nullptr};
    const int spawned = posix_spawn(&child.pid, shell, &actions, &attributes, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    close(input[0]);
    close(errors[1]);
    child.stdin_fd = input[1];
    child.stderr_fd = errors[0];
    if (spawned != 0) {
        child.done(
            Outcome::transient(std::string("cannot run /bin/sh: ") + std::strerror(spawned)));
        return false;
    }
    fcntl(child.stdin_fd, F_SETFL, O_NONBLOCK);
    fcntl(child.stderr_fd, F_SETFL, O_NONBLOCK);
    child.process_fd = static_cast<int>(syscall(SYS_pidfd_open, child.pid, 0));
    if (child.process_fd < 0) {
        kill(-child.pid, SIGKILL);
        waitpid(child.pid, nullptr, 0);
        child.done(
            Outcome::transient(std::string("cannot watch the command: ") + std::strerror(errno)));
        return false;
    }
    child.write_stdin();
    return true;
}

bool ExecTransport::step(Child& child, Clock::time_point now) {
    child.write_stdin();
    child.read_stderr();
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
        child.read_stderr();  // what it wrote last; a grandchild holding stderr is not waited for
        child.done(child.outcome(status));
        return true;
    }
    if (!child.timed_out && now >= child.deadline) {
        child.timed_out = true;
        kill(-child.pid, SIGKILL);
    }
    return false;
}

void ExecTransport::run() {
    std::vector<pollfd> fds;
    while (true) {
        std::vector<std::unique_ptr<Child>> arrived;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) return;
            arrived.swap(queued_);
        }
        for (auto& child : arrived)
            if (start(*child)) running_.push_back(std::move(child));

        const Clock::time_point now = Clock::now();
        running_.remove_if([&](const std::unique_ptr<Child>& child) { return step(*child, now); });

        fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
        Clock::time_point wake_at = Clock::time_point::max();
        for (const auto& child : running_) {
            fds.push_back({child->process_fd, POLLIN, 0});
            if (child->stdin_fd >= 0) fds.push_back({child->stdin_fd, POLLOUT, 0});
            if (child->stderr_fd >= 0) fds.push_back({child->stderr_fd, POLLIN, 0});
            if (!child->timed_out) wake_at = std::min(wake_at, child->deadline);
        }
        int timeout = -1;
        if (wake_at != Clock::time_point::max())
            timeout = static_cast<int>(std::max<int64_t>(
                0,
                std::chrono::duration_cast<std::chrono::milliseconds>(wake_at - now).count() + 1));
        poll(fds.data(), fds.size(), timeout);
        if (fds[0].revents & POLLIN) {
            uint64_t count = 0;
            [[maybe_unused]] const ssize_t n = read(wake_fd_, &count, sizeof count);
        }
    }
}

}  // namespace magic_sync::sender
