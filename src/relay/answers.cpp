#include "relay/answers.hpp"

#include <string>

#include "pg/settings.hpp"

namespace magic_sync::relay {

int64_t move_answers(pg::Spi& spi) {
    spi.execute(
        R"sql(
        WITH moved AS (DELETE FROM sync.answer
         WHERE id IN (SELECT id FROM pg_temp.magic_sync_answer_seen)
         RETURNING id, replica, kind, payload)
        INSERT INTO pg_temp.magic_sync_enqueue (replica, position, kind, payload)
        SELECT m.replica, row_number() OVER (PARTITION BY m.replica ORDER BY m.id, p.n), m.kind,
         p.payload FROM moved m
        CROSS JOIN LATERAL jsonb_array_elements(sync_internal.filed_parts(m.replica, m.payload,
         $1::bigint)) WITH ORDINALITY AS p(payload, n))sql",
        {settings::bytes_per_message});
    return spi.scalar("SELECT sync_internal.enqueue()").integer_or(0);
}

}  // namespace magic_sync::relay
