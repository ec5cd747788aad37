// Waiting for a condition in a test: the one poll every test binary uses.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace magic_sync::test {

// Polls `condition` until it holds or `timeout` passes; returns whether it held. The first looks
// come within milliseconds, then the pause doubles up to 100 ms: a short wait ends at once and a
// long one does not spend its time asking (some conditions read a whole replica).
template <typename Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::chrono::milliseconds pause(2);
    while (std::chrono::steady_clock::now() < deadline) {
        if (condition()) return true;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
    return condition();
}

}  // namespace magic_sync::test
