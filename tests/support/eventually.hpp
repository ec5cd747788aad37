// Waiting for a condition in a test: the one poll every test binary uses.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace magic_sync::test {

// Polls `condition` until it holds or `timeout` passes; returns whether it held. The first looks
// come within milliseconds, then the pause doubles up to 100 ms, and past two seconds of waiting
// up to 500 ms: a short wait ends at once, and a long one (a repair, a fault healing) does not
// spend its time asking (some conditions read a whole replica, or sync.status).
template <typename Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    std::chrono::milliseconds pause(2);
    while (std::chrono::steady_clock::now() < deadline) {
        if (condition()) return true;
        std::this_thread::sleep_for(pause);
        const bool long_wait = std::chrono::steady_clock::now() - start > std::chrono::seconds(2);
        pause = std::min(pause * 2, std::chrono::milliseconds(long_wait ? 500 : 100));
    }
    return condition();
}

}  // namespace magic_sync::test
