// Drift repair (DESIGN §7), one step per pass. Ranges of the key hash k are named by a hex prefix
// of k: prefix P covers [P000…, P+1 000…), the empty prefix the whole space, and the 16 ranges of
// a level are the prefixes one digit longer. All the ranges asked of a replica in one message are
// of one level, so the server's fingerprints of all of them are one scan of the scope's rows.
//
// A round is one batch of messages for a (replica, scope): a ranges message, repairs, or both.
// Repairs are rare, so the steps below loop per repair in C++; every value is a bound parameter.
#include "verify/repair.hpp"

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pg/settings.hpp"
#include "pg/spi.hpp"
#include "protocol/messages.hpp"

namespace magic_sync::relay {

namespace {

using pg::Param;
using pg::Spi;
using pg::Value;

constexpr int kStormRounds = 8;     // more rounds than this within storm_window: a storm
constexpr int kStormBackoffS = 30;  // × attempts
constexpr size_t kDigits = 64;      // hex digits of k
const char kHexDigits[] = "0123456789abcdef";

int digit_of(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

std::string lo_hex(const std::string& prefix) {
    return prefix + std::string(kDigits - prefix.size(), '0');
}

// The first k after the range; none: the range reaches the top.
std::optional<std::string> hi_hex(const std::string& prefix) {
    std::string next = prefix;
    for (size_t i = next.size(); i-- > 0;) {
        if (next[i] != 'f') {
            next[i] = kHexDigits[digit_of(next[i]) + 1];
            return lo_hex(next);
        }
        next[i] = '0';
    }
    return std::nullopt;
}

protocol::KeyRange range_of(const std::string& lo, const std::optional<std::string>& hi) {
    protocol::KeyRange range;
    range.lo = protocol::digest_from_hex(lo);
    if (hi) range.hi = protocol::digest_from_hex(*hi);
    return range;
}

protocol::KeyRange range_of(const std::string& prefix) {
    return range_of(lo_hex(prefix), hi_hex(prefix));
}

std::vector<std::string> children_of(const std::string& prefix) {
    std::vector<std::string> children;
    for (int i = 0; i < 16; ++i) children.push_back(prefix + kHexDigits[i]);
    return children;
}

// A text[] literal of hex prefixes (quoted: the empty prefix, the whole space, is an element).
std::string text_array(const std::vector<std::string>& items) {
    std::string out = "{";
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\"" : "\"") + items[i] + "\"";
    return out + "}";
}

struct Target {
    std::string replica;
    std::string scope;  // sync.scope.id
    std::string scope_name;
    int64_t gen = 0;
    std::string phase;  // none: no repair yet
    std::vector<std::string> asked;
    std::string answers;  // the holding's ranges, jsonb text
};

// The header a message is encoded with before it is numbered: sync.enqueue stamps it with its gen
// and seq.
protocol::MessageHeader unnumbered(const Target& target) { return {target.replica, 0, 0}; }

// Puts an unnumbered message in the target's outbox (sync.enqueue). Returns its seq.
int64_t put(Spi& spi, const Target& target, const char* kind, const std::string& body) {
    spi.execute(
        R"sql(
        INSERT INTO pg_temp.magic_sync_enqueue (replica, position, kind, body)
        VALUES ($1, 1, $2, $3))sql",
        {Param::uuid(target.replica), std::string(kind), Param::bytea(body)});
    spi.execute("SELECT sync.enqueue()");
    return spi
        .scalar("SELECT next_seq - 1 FROM sync.replica WHERE id = $1",
                {Param::uuid(target.replica)})
        .integer();
}

// The widest header a message to the target can have: its replica, the largest gen and seq. A
// message is measured with it, so that it fits whatever seq it is given.
protocol::MessageHeader widest_header(const Target& target) {
    return {target.replica, std::numeric_limits<int64_t>::max(),
            std::numeric_limits<int64_t>::max()};
}

protocol::RangesMessage ranges_message(const Target& target,
                                       const std::vector<std::string>& prefixes) {
    protocol::RangesMessage message;
    message.scope = target.scope_name;
    for (const std::string& prefix : prefixes) message.ranges.push_back(range_of(prefix));
    return message;
}

// Whether one ranges message can ask about all of `prefixes` within magic_sync.bytes_per_message,
// whatever its seq and generation.
bool ranges_fit(const Target& target, const std::vector<std::string>& prefixes) {
    protocol::RangesMessage widest = ranges_message(target, prefixes);
    widest.header = widest_header(target);
    return protocol::encode(widest).size() <= static_cast<size_t>(settings::bytes_per_message);
}

int64_t send_ranges(Spi& spi, const Target& target, const std::vector<std::string>& prefixes) {
    protocol::RangesMessage message = ranges_message(target, prefixes);
    message.header = unnumbered(target);
    return put(spi, target, "ranges", protocol::encode(message));
}

struct LeafRow {
    std::string k;  // hex
    protocol::DownRow row;
};

bool fits(const Target& target, protocol::RepairMessage message) {
    message.header = widest_header(target);
    return message.rows.size() <= static_cast<size_t>(settings::rows_per_message) &&
           protocol::encode(message).size() <= static_cast<size_t>(settings::bytes_per_message);
}

// Repair messages covering exactly the range `prefix` with `rows` (its server rows, by k): one
// when it fits the message limits, else its 16 subranges packed into runs that fit, a subrange
// too big alone split again. Returns the seq of the last one.
int64_t send_repairs(Spi& spi, const Target& target, const std::string& lo,
                     const std::optional<std::string>& hi, const std::string& prefix,
                     const std::vector<LeafRow>& rows, int64_t& messages) {
    protocol::RepairMessage message;
    message.scope = target.scope_name;
    message.range = range_of(lo, hi);
    for (const LeafRow& row : rows) message.rows.push_back(row.row);
    if (fits(target, message) || rows.size() <= 1 || prefix.size() >= kDigits) {
        message.header = unnumbered(target);
        ++messages;
        return put(spi, target, "repair", protocol::encode(message));
    }
    // Too big: the subranges of `prefix` within [lo, hi), in runs of consecutive ones that fit.
    std::vector<std::string> children = children_of(prefix);
    std::vector<std::vector<LeafRow>> by_child(children.size());
    for (const LeafRow& row : rows) by_child[digit_of(row.k[prefix.size()])].push_back(row);
    int64_t last = 0;
    size_t start = 0;
    while (start < children.size()) {
        size_t end = start + 1;
        std::vector<LeafRow> run = by_child[start];
        auto run_fits = [&](const std::vector<LeafRow>& candidate, size_t stop) {
            protocol::RepairMessage probe;
            probe.scope = target.scope_name;
            probe.range = range_of(lo_hex(children[start]),
                                   stop == children.size() ? hi : hi_hex(children[stop - 1]));
            for (const LeafRow& row : candidate) probe.rows.push_back(row.row);
            return fits(target, probe);
        };
        if (!run_fits(run, end)) {
            last = send_repairs(spi, target, lo_hex(children[start]),
                                end == children.size() ? hi : hi_hex(children[start]),
                                children[start], run, messages);
            start = end;
            continue;
        }
        while (end < children.size()) {
            std::vector<LeafRow> longer = run;
            longer.insert(longer.end(), by_child[end].begin(), by_child[end].end());
            if (!run_fits(longer, end + 1)) break;
            run = std::move(longer);
            ++end;
        }
        const std::string run_lo = start == 0 ? lo : lo_hex(children[start]);
        const std::optional<std::string> run_hi =
            end == children.size() ? hi : hi_hex(children[end - 1]);
        last = send_repairs(spi, target, run_lo, run_hi, children[start], run, messages);
        start = end;
    }
    return last;
}

// Repair messages for the mismatched `leaves` (prefixes of one level, in order) with their server
// rows: a run of adjacent leaves shares one message covering all of them while it fits the
// message limits; a leaf too big alone is split by send_repairs. Returns the seq of the last one.
int64_t send_leaves(Spi& spi, const Target& target, const std::vector<std::string>& leaves,
                    std::map<std::string, std::vector<LeafRow>>& rows, int64_t& messages) {
    auto covering = [&](size_t first, size_t last, const std::vector<LeafRow>& run) {
        protocol::RepairMessage message;
        message.scope = target.scope_name;
        message.range = range_of(lo_hex(leaves[first]), hi_hex(leaves[last]));
        for (const LeafRow& row : run) message.rows.push_back(row.row);
        return message;
    };
    int64_t last = 0;
    size_t start = 0;
    while (start < leaves.size()) {
        std::vector<LeafRow> run = rows[leaves[start]];
        size_t end = start + 1;
        if (fits(target, covering(start, start, run))) {
            while (end < leaves.size() && hi_hex(leaves[end - 1]) == lo_hex(leaves[end])) {
                std::vector<LeafRow> longer = run;
                const std::vector<LeafRow>& next = rows[leaves[end]];
                longer.insert(longer.end(), next.begin(), next.end());
                if (!fits(target, covering(start, end, longer))) break;
                run = std::move(longer);
                ++end;
            }
        }
        last = send_repairs(spi, target, lo_hex(leaves[start]), hi_hex(leaves[end - 1]),
                            leaves[start], run, messages);
        start = end;
    }
    return last;
}

// The ranges `leaves` (prefixes of one level, in order) sent whole, with the server's rows of
// each. Returns the seq of the last message; adds to `messages` and `rows_sent`.
int64_t send_whole(Spi& spi, const Target& target, const std::vector<std::string>& leaves,
                   int64_t& messages, int64_t& rows_sent) {
    const size_t level = leaves.front().size();
    std::map<std::string, std::vector<LeafRow>> rows;
    for (const auto& row :
         spi.query(R"sql(
                   SELECT left(encode(r.k, 'hex'), $2::int), encode(r.k, 'hex'), c.table_name,
                   sync.canonical(r.key), r.body, encode(r.hash, 'hex')
                   FROM sync.row r JOIN sync.codec c ON c.id = r.codec
                   WHERE r.scope = $1::bigint AND NOT r.gone AND NOT r.withheld
                   AND left(encode(r.k, 'hex'), $2::int) IN (SELECT unnest($3::text[]))
                   ORDER BY r.k)sql",
                   {target.scope, static_cast<int64_t>(level), text_array(leaves)})) {
        LeafRow leaf;
        leaf.k = row[1].value();
        leaf.row.table = row[2].value();
        leaf.row.key = row[3].value();
        leaf.row.body =
            protocol::RowBody{row[4].value(), protocol::digest_from_hex(row[5].value())};
        rows[row[0].value()].push_back(std::move(leaf));
    }
    for (const std::string& prefix : leaves) rows_sent += static_cast<int64_t>(rows[prefix].size());
    return send_leaves(spi, target, leaves, rows, messages);
}

// Counts a round for the repair; false when it is one too many: the breaker trips instead.
bool begin_round(Spi& spi, const Target& target) {
    auto rows = spi.query(
        R"sql(
        UPDATE sync.repair SET
        rounds = CASE WHEN first_round_at IS NULL
         OR first_round_at < now() - make_interval(secs => $3::int / 1000.0) THEN 1
         ELSE rounds + 1 END,
        first_round_at = CASE WHEN first_round_at IS NULL
         OR first_round_at < now() - make_interval(secs => $3::int / 1000.0) THEN now()
         ELSE first_round_at END
        WHERE replica = $1::uuid AND scope = $2::bigint RETURNING rounds, attempts)sql",
        {Param::uuid(target.replica), target.scope, settings::storm_window_ms});
    if (rows.empty()) return false;
    const int64_t rounds = rows.front()[0].integer();
    if (rounds <= kStormRounds) return true;
    const int64_t attempts = rows.front()[1].integer() + 1;
    const int64_t backoff = kStormBackoffS * attempts;
    spi.execute(
        R"sql(
        UPDATE sync.repair SET phase = 'idle', ranges = '{}', level = 0, waiting = NULL,
        rounds = 0, first_round_at = NULL, attempts = $3::int,
        storm_until = now() + make_interval(secs => $4::int)
        WHERE replica = $1::uuid AND scope = $2::bigint)sql",
        {Param::uuid(target.replica), target.scope, attempts, backoff});
    spi.execute(
        R"sql(
        SELECT sync.repair_storm($1::uuid, $2::bigint, $3::int, $4::int,
        make_interval(secs => $5::int)))sql",
        {Param::uuid(target.replica), target.scope, rounds - 1, attempts, backoff});
    return false;
}

// The top: a ranges message for the 16 ranges of level 1.
int64_t start_round(Spi& spi, const Target& target) {
    if (!begin_round(spi, target)) return 0;
    const std::vector<std::string> prefixes = children_of("");
    if (!ranges_fit(target, prefixes)) {
        // A limit too small for even the first level's ranges: the whole scope is sent.
        int64_t messages = 0;
        int64_t rows_sent = 0;
        const int64_t last = send_whole(spi, target, {""}, messages, rows_sent);
        spi.execute(
            R"sql(
            UPDATE sync.repair SET phase = 'checking', level = 0, ranges = '{}',
            waiting = $3::bigint, rows_sent = rows_sent + $4::bigint
            WHERE replica = $1::uuid AND scope = $2::bigint)sql",
            {Param::uuid(target.replica), target.scope, last, rows_sent});
        return messages;
    }
    int64_t seq = send_ranges(spi, target, prefixes);
    spi.execute(
        R"sql(
        UPDATE sync.repair SET phase = 'asking', level = 1, ranges = $3::text[],
        waiting = $4::bigint, ranges_asked = ranges_asked + 16
        WHERE replica = $1::uuid AND scope = $2::bigint)sql",
        {Param::uuid(target.replica), target.scope, text_array(prefixes), seq});
    return 1;
}

// The replica answered the asked ranges: matching ones are done, small mismatched ones are
// resent whole, larger ones are asked again one level down.
int64_t answer_ranges(Spi& spi, const Target& target) {
    // The replica's answers, by lo and hi.
    std::map<std::pair<std::string, std::string>, std::pair<std::string, int64_t>> answers;
    if (!target.answers.empty()) {
        for (const auto& row : spi.query(
                 R"sql(
                 SELECT e->>0, e->>1, e->>2, (e->>3)::bigint FROM jsonb_array_elements(
                 CASE WHEN jsonb_typeof($1::jsonb) = 'array' THEN $1::jsonb ELSE '[]' END) e
                 WHERE jsonb_typeof(e) = 'array')sql",
                 {target.answers}))
            answers[{row[0].value_or(""), row[1].value_or("")}] = {row[2].value_or(""),
                                                                   row[3].integer_or(0)};
    }
    const size_t level = target.asked.empty() ? 0 : target.asked.front().size();
    for (const std::string& prefix : target.asked) {
        if (!answers.count({lo_hex(prefix), hi_hex(prefix).value_or("")}))
            return start_round(spi, target);  // not answered (or answered before): ask again
    }
    // The server's fingerprints of the asked ranges: one scan of the scope's rows. The ranges
    // are matched by a hashed IN, not = ANY: a kept plan is generic, and = ANY of a parameter
    // compares each row with every range (4,096 ranges of 100,000 rows took 50 s).
    std::map<std::string, std::pair<std::string, int64_t>> server;
    for (const auto& row :
         spi.query(R"sql(
                   SELECT left(encode(k, 'hex'), $2::int),
                   encode(sync.fp_sum(sha256(k || hash)), 'hex'), count(*)
                   FROM sync.row WHERE scope = $1::bigint AND NOT gone AND NOT withheld
                   AND left(encode(k, 'hex'), $2::int) IN (SELECT unnest($3::text[]))
                   GROUP BY 1)sql",
                   {target.scope, static_cast<int64_t>(level), text_array(target.asked)}))
        server[row[0].value()] = {row[1].value(), row[2].integer_or(0)};
    const std::string zero(kDigits, '0');
    std::vector<std::string> mismatched;
    std::vector<std::string> leaves;
    std::vector<std::string> deeper;
    for (const std::string& prefix : target.asked) {
        const auto& replica_side = answers[{lo_hex(prefix), hi_hex(prefix).value_or("")}];
        auto found = server.find(prefix);
        const std::pair<std::string, int64_t> server_side =
            found == server.end() ? std::make_pair(zero, int64_t{0}) : found->second;
        if (replica_side == server_side) continue;
        mismatched.push_back(prefix);
        if (server_side.second <= settings::leaf_rows || prefix.size() >= kDigits) {
            leaves.push_back(prefix);
        } else {
            for (std::string& child : children_of(prefix)) deeper.push_back(std::move(child));
        }
    }
    // Drift too wide to ask about one level down in one message: what differs is sent whole
    // (repairs split to fit), as no message may exceed magic_sync.bytes_per_message.
    if (!deeper.empty() && !ranges_fit(target, deeper)) {
        leaves = mismatched;
        deeper.clear();
    }
    if (leaves.empty() && deeper.empty()) {
        // Every range matched, yet the whole did not: compare the whole again.
        spi.execute(
            R"sql(
            UPDATE sync.repair SET phase = 'checking', ranges = '{}', waiting = NULL
            WHERE replica = $1::uuid AND scope = $2::bigint)sql",
            {Param::uuid(target.replica), target.scope});
        return 0;
    }
    if (!begin_round(spi, target)) return 0;
    int64_t messages = 0;
    int64_t last = 0;
    int64_t rows_sent = 0;
    if (!leaves.empty()) last = send_whole(spi, target, leaves, messages, rows_sent);
    if (!deeper.empty()) {
        last = send_ranges(spi, target, deeper);
        ++messages;
    }
    spi.execute(
        R"sql(
        UPDATE sync.repair SET phase = $3, level = $4::int, ranges = $5::text[],
        waiting = $6::bigint, ranges_asked = ranges_asked + $7::int,
        rows_sent = rows_sent + $8::bigint
        WHERE replica = $1::uuid AND scope = $2::bigint)sql",
        {Param::uuid(target.replica), target.scope,
         std::string(deeper.empty() ? "checking" : "asking"),
         static_cast<int64_t>(deeper.empty() ? level : level + 1), text_array(deeper), last,
         static_cast<int64_t>(deeper.size()), rows_sent});
    return messages;
}

}  // namespace

int64_t plan_repairs(Spi& spi) {
    // Nothing to repair any more: the replica left, was provisioned again, or left the scope.
    spi.execute(
        R"sql(
        DELETE FROM sync.repair p WHERE NOT EXISTS (SELECT FROM sync.replica r
         WHERE r.id = p.replica AND r.live AND r.gen = p.gen)
        OR NOT EXISTS (SELECT FROM sync.member m WHERE m.replica = p.replica
         AND m.scope = p.scope))sql");
    // The scope moved on: what was asked is moot; wait for a report at the new head. A tripped
    // breaker is remembered, so changes to the scope do not hide a storm.
    spi.execute(
        R"sql(
        DELETE FROM sync.repair p USING sync.scope s WHERE s.id = p.scope AND s.head <> p.head
        AND p.attempts = 0)sql");
    spi.execute(
        R"sql(
        UPDATE sync.repair p SET head = s.head, phase = 'idle', level = 0, ranges = '{}',
        waiting = NULL FROM sync.scope s WHERE s.id = p.scope AND s.head <> p.head)sql");
    // Converged: the replica reports the server's fingerprint at the head.
    spi.execute(
        R"sql(
        DELETE FROM sync.repair p USING sync.member m, sync.scope s, sync.holding h
        WHERE m.replica = p.replica AND m.scope = p.scope AND s.id = p.scope
        AND h.replica = p.replica AND h.scope = sync.scope_name(s.match, s.value, s.partition)
        AND m.sent = s.head AND m.confirmed >= s.head AND h.through = s.head
        AND h.fp = s.fp AND h.n = s.n AND (p.waiting IS NULL OR NOT EXISTS
         (SELECT FROM sync.outbox o WHERE o.replica = p.replica AND o.seq = p.waiting)))sql");

    // What can move: a report at the head that differs with no repair yet, or a repair whose
    // last message the replica confirmed and whose breaker is not holding it back. Reports of
    // replicas that are not live or of scopes they are not members of never join.
    auto rows = spi.query(
        R"sql(
        SELECT m.replica, m.scope, sync.scope_name(s.match, s.value, s.partition), r.gen,
        p.phase, p.ranges, h.ranges::text
        FROM sync.member m
        JOIN sync.replica r ON r.id = m.replica AND r.live
        JOIN sync.scope s ON s.id = m.scope
        JOIN sync.holding h ON h.replica = m.replica
         AND h.scope = sync.scope_name(s.match, s.value, s.partition)
        LEFT JOIN sync.repair p ON p.replica = m.replica AND p.scope = m.scope
        WHERE m.sent = s.head AND m.confirmed >= s.head AND h.through = s.head
        AND CASE WHEN p.replica IS NULL THEN h.fp <> s.fp OR h.n <> s.n
         ELSE (p.storm_until IS NULL OR p.storm_until <= now())
         AND (p.waiting IS NULL OR NOT EXISTS (SELECT FROM sync.outbox o
          WHERE o.replica = p.replica AND o.seq = p.waiting)) END
        ORDER BY m.replica, m.scope)sql");
    int64_t written = 0;
    for (const auto& row : rows) {
        Target target;
        target.replica = row[0].value();
        target.scope = row[1].value();
        target.scope_name = row[2].value();
        target.gen = row[3].integer();
        target.phase = row[4].value_or("");
        target.answers = row[6].value_or("");
        if (row[5]) {
            for (const auto& item : spi.query("SELECT unnest($1::text[])", {*row[5]}))
                target.asked.push_back(item[0].value());
        }
        if (target.phase.empty()) {
            spi.execute(
                R"sql(
                INSERT INTO sync.repair (replica, scope, gen, head)
                SELECT $1::uuid, id, $3::int, head FROM sync.scope WHERE id = $2::bigint)sql",
                {Param::uuid(target.replica), target.scope, target.gen});
        }
        if (target.phase == "asking") {
            written += answer_ranges(spi, target);
        } else {
            written += start_round(spi, target);
        }
    }
    return written;
}

}  // namespace magic_sync::relay
