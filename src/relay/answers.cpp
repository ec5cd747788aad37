#include "relay/answers.hpp"

#include <string>

#include "pg/settings.hpp"

namespace magic_sync::relay {

int64_t move_answers(pg::Spi& spi) {
    pg::Value written = spi.scalar(
        "WITH moved AS (DELETE FROM sync.answer RETURNING id, replica, kind, payload),"
        " parts AS (SELECT m.id, m.replica, m.kind, p.payload, p.n FROM moved m"
        "  CROSS JOIN LATERAL jsonb_array_elements(sync.filed_parts(m.replica, m.payload,"
        "   $1::bigint)) WITH ORDINALITY AS p(payload, n)),"
        " numbered AS (SELECT p.replica, p.kind, p.payload, r.gen,"
        "  r.next_seq - 1 + row_number() OVER (PARTITION BY p.replica ORDER BY p.id, p.n) AS seq"
        "  FROM parts p JOIN sync.replica r ON r.id = p.replica AND r.live),"
        " written AS (INSERT INTO sync.outbox (replica, seq, gen, kind, body)"
        "  SELECT replica, seq, gen, kind, sync.encode_filed(replica, gen, seq, payload)"
        "  FROM numbered RETURNING replica),"
        " advanced AS (UPDATE sync.replica r SET next_seq = r.next_seq + w.n"
        "  FROM (SELECT replica, count(*) AS n FROM written GROUP BY replica) w"
        "  WHERE r.id = w.replica)"
        " SELECT count(*) FROM written",
        {settings::bytes_per_message});
    return written ? std::stoll(*written) : 0;
}

}  // namespace magic_sync::relay
