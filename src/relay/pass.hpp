// The relay pass: one run of the planner (docs/DESIGN.md §4).
#pragma once

#include <cstdint>

#include "pg/spi.hpp"

namespace magic_sync::relay {

struct PassCounts {
    int64_t notes = 0;
    int64_t rows_changed = 0;
    int64_t provisioned = 0;
    int64_t forgotten = 0;
    int64_t messages = 0;
    int64_t set_aside = 0;
};

// Runs one pass in the current transaction, taking the relay lock first (refused with an ERROR
// when another session holds it).
PassCounts run_pass(pg::Spi& spi);

}  // namespace magic_sync::relay
