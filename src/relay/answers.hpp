// Answers that sync.receive() left in sync.answer, moved into the replicas' outboxes by the relay
// pass (DESIGN §6): receive never touches relay state, so message seqs are drawn only here, under
// the relay lock, in commit order.
#pragma once

#include <cstdint>

#include "pg/spi.hpp"

namespace magic_sync::relay {

// Moves every visible answer of a live replica into its outbox as a complete message (seqs from
// sync.replica.next_seq in answer order, next_seq advanced) and drops the answers of replicas
// that are not live. Returns the number of messages written.
int64_t move_answers(pg::Spi& spi);

}  // namespace magic_sync::relay
