// What a checkpoint checks, after quiescence: every live replica against the oracle
// (sync.expected) row by row and scope by scope, the server's fingerprints against the oracle's,
// every upload filed exactly once or kept with its reason, no message over bytes_per_message,
// and sync.status saying `in sync`.
#pragma once

#include <string>

#include "sim/scenario.hpp"
#include "sim/world.hpp"

namespace magic_sync::sim {

// Waits (up to the timeout) until the system is quiet and checks it. Returns "" when every
// check holds; otherwise what was still pending or what differed, readable.
std::string checkpoint(World& world, const Scenario& scenario, const Step& step);

}  // namespace magic_sync::sim
