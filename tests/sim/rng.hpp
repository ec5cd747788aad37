// The simulation's only source of chance: std::mt19937_64 with range and choice helpers of our
// own, so a seed gives the same history with every standard library (the std::uniform_*
// distributions differ between them).
#pragma once

#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

namespace magic_sync::sim {

class Rng {
  public:
    explicit Rng(uint64_t seed) : engine_(seed) {}

    // A number in [low, high], both included.
    int64_t range(int64_t low, int64_t high) {
        if (high < low) throw std::logic_error("empty range");
        uint64_t span = static_cast<uint64_t>(high - low) + 1;
        // Rejection keeps every value equally likely.
        uint64_t limit = span == 0 ? 0 : UINT64_MAX - UINT64_MAX % span;
        uint64_t drawn = engine_();
        while (span != 0 && drawn >= limit) drawn = engine_();
        return low + static_cast<int64_t>(span == 0 ? drawn : drawn % span);
    }

    // True with probability `percent` / 100.
    bool chance(int percent) { return range(0, 99) < percent; }

    template <typename T>
    const T& pick(const std::vector<T>& items) {
        if (items.empty()) throw std::logic_error("pick from nothing");
        return items[static_cast<size_t>(range(0, static_cast<int64_t>(items.size()) - 1))];
    }

    // An index drawn with the given weights (at least one positive).
    size_t weighted(const std::vector<int>& weights) {
        int64_t total = 0;
        for (int w : weights) total += w;
        int64_t drawn = range(0, total - 1);
        for (size_t i = 0; i < weights.size(); ++i) {
            if (drawn < weights[i]) return i;
            drawn -= weights[i];
        }
        return weights.size() - 1;
    }

    template <typename T>
    void shuffle(std::vector<T>& items) {
        for (size_t i = items.size(); i > 1; --i)
            std::swap(items[i - 1],
                      items[static_cast<size_t>(range(0, static_cast<int64_t>(i) - 1))]);
    }

  private:
    std::mt19937_64 engine_;
};

}  // namespace magic_sync::sim
