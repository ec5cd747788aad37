// Answers that sync.receive() left in sync.answer, moved into the replicas' outboxes by the relay
// pass (docs/DESIGN.md §6): receive never touches relay state, so an answer's seq is drawn only by
// the pass, under the relay lock, in commit order.
#pragma once

#include <cstdint>

#include "pg/spi.hpp"

namespace magic_sync::relay {

// Moves the answers the pass saw when it took its notes into their replicas' outboxes
// (sync_internal.enqueue, in answer order), and drops those of replicas that are not live. Returns
// the number of messages written.
int64_t move_answers(pg::Spi& spi);

}  // namespace magic_sync::relay
