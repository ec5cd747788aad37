// Drift repair (docs/DESIGN.md §7): a replica's report of what it holds, compared at the scope's
// head with the scope's running fingerprint; a difference is narrowed by range fingerprints over
// the key hash k (16 ranges a level) and the mismatched small ranges resent whole with
// range-replace semantics. A storm breaker stops a repair that does not converge. State in
// sync.repair.
#pragma once

#include <cstdint>

#include "pg/spi.hpp"

namespace magic_sync::relay {

// One step of every repair that can move: drops repairs whose replica, generation or scope head
// changed, ends the ones that converged, starts one for each report that differs, answers the
// range fingerprints replicas sent with repairs and narrower ranges, trips the breaker. Runs in
// the pass, under the relay lock, after the answers were moved. Returns the messages written.
int64_t plan_repairs(pg::Spi& spi);

}  // namespace magic_sync::relay
