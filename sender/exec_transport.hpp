// Runs a command per message with /bin/sh -c: the bytes on its stdin, REPLICA and MESSAGE_ID in
// its environment, stdout discarded. Exit 0 taken; 75 (EX_TEMPFAIL) transient; killed by a signal
// or by the timeout transient; any other exit refused, with stderr's last line as the error.
// One worker thread watches every running command (poll), not a thread per command.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport.hpp"

namespace magic_sync::sender {

class ExecTransport : public Transport {
  public:
    explicit ExecTransport(std::string command);
    ~ExecTransport() override;

    void send(Delivery delivery, Done done) override;

  private:
    struct Child;

    void run();
    // Starts the command; false (and `done` called) when it could not be started.
    bool start(Child& child);
    // Watches one child after poll; true once it has ended and `done` was called.
    bool step(Child& child, std::chrono::steady_clock::time_point now);

    const std::string command_;
    int wake_fd_ = -1;
    std::mutex mutex_;
    std::vector<std::unique_ptr<Child>> queued_;
    bool stopping_ = false;
    std::list<std::unique_ptr<Child>> running_;  // only the worker touches it
    std::thread worker_;
};

}  // namespace magic_sync::sender
