// A child process for tests: started with arguments, its output in a log file, stopped (or
// killed for real) on demand and always on destruction.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace magic_sync::test {

class Process {
  public:
    Process(std::vector<std::string> arguments, std::string log)
        : arguments_(std::move(arguments)), log_(std::move(log)) {
        start();
    }
    ~Process() { stop(SIGKILL); }
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;

    void start() {
        if (pid_ > 0) return;
        pid_ = fork();
        if (pid_ < 0) throw std::runtime_error("fork failed");
        if (pid_ == 0) {
            int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            dup2(fd, 1);
            dup2(fd, 2);
            std::vector<char*> argv;
            for (auto& a : arguments_) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
    }

    // Sends `signal` and waits for the process to end.
    void stop(int signal = SIGTERM) {
        if (pid_ <= 0) return;
        kill(pid_, signal);
        int status = 0;
        waitpid(pid_, &status, 0);
        pid_ = -1;
    }

    // The running process's id, or -1.
    pid_t pid() const { return pid_; }

    bool running() {
        if (pid_ <= 0) return false;
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            return false;
        }
        return true;
    }

    std::string log() const {
        std::ifstream file(log_);
        std::stringstream content;
        content << file.rdbuf();
        return content.str();
    }

  private:
    std::vector<std::string> arguments_;
    std::string log_;
    pid_t pid_ = -1;
};

}  // namespace magic_sync::test
