// One line to stderr, as the programs (magic-sync-sender, magic-sync-replica) log: the UTC time to
// the millisecond, the program's name, the text. Lines of several threads never interleave.
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

namespace magic_sync::program {

inline void log_line(const char* program, const std::string& text) {
    static std::mutex mutex;
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000;
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &utc);
    std::lock_guard<std::mutex> lock(mutex);
    std::fprintf(stderr, "%s.%03lld %s: %s\n", stamp, static_cast<long long>(millis), program,
                 text.c_str());
    std::fflush(stderr);
}

}  // namespace magic_sync::program
