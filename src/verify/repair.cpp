// Drift repair (docs/DESIGN.md §7), one step per pass. Ranges of the key hash k are named by a hex
// prefix of k: prefix P covers [P000…, P+1 000…), the empty prefix the whole space, and the 16
// ranges of a level are the prefixes one digit longer. All the ranges asked of a replica in one
// message are of one level, so the server's fingerprints of all of them are one scan of the scope's
// rows.
//
// A round is one batch of messages for a (replica, scope): a ranges message, repairs, or both.
// Repairs are rare, so the steps below loop per repair in C++; their statements are functions of
// src/verify/repair.sql, and every value is a bound parameter.
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

constexpr size_t kDigits = 64;  // hex digits of k
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

struct Target {
    std::string replica;
    std::string scope;  // sync.scope.id
    std::string scope_name;
    int64_t gen = 0;
    std::string phase;  // none: no repair yet
    std::vector<std::string> asked;
    std::string answers;  // the holding's ranges, jsonb text
};

// The header a message is encoded with before it is numbered: sync_internal.enqueue stamps it with
// its gen and seq.
protocol::MessageHeader unnumbered(const Target& target) { return {target.replica, 0, 0, ""}; }

// Puts an unnumbered message in the target's outbox (sync_internal.repair_put). Returns its seq.
int64_t put(Spi& spi, const Target& target, const char* kind, const std::string& body) {
    return spi
        .scalar("SELECT sync_internal.repair_put($1, $2, $3)",
                {Param::uuid(target.replica), std::string(kind), Param::bytea(body)})
        .integer();
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
    widest.header = protocol::widest_header(target.replica);
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
    message.header = protocol::widest_header(target.replica);
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
         spi.query("SELECT * FROM sync_internal.repair_rows($1::bigint, $2::int, $3::text[])",
                   {target.scope, static_cast<int64_t>(level), Param::text_array(leaves)})) {
        LeafRow leaf;
        leaf.k = row["k"].value();
        leaf.row.table = row["table_name"].value();
        leaf.row.key = row["key"].value();
        leaf.row.body = protocol::RowBody{row["body"].value(),
                                          protocol::digest_from_bytes(row["hash"].bytes())};
        rows[row["prefix"].value()].push_back(std::move(leaf));
    }
    for (const std::string& prefix : leaves) rows_sent += static_cast<int64_t>(rows[prefix].size());
    return send_leaves(spi, target, leaves, rows, messages);
}

// Counts a round for the repair; false when it is one too many: the breaker trips instead.
bool begin_round(Spi& spi, const Target& target) {
    return spi.flag("SELECT sync_internal.repair_count_round($1, $2::bigint, $3::int)",
                    {Param::uuid(target.replica), target.scope, settings::storm_window_ms});
}

// The round's messages were sent (sync_internal.repair_sent).
void record_sent(Spi& spi, const Target& target, const char* phase, int64_t level,
                 const std::vector<std::string>& ranges, int64_t waiting, int64_t ranges_asked,
                 int64_t rows_sent) {
    spi.execute(
        "SELECT sync_internal.repair_sent($1, $2::bigint, $3, $4::int, $5::text[], $6, $7::int, "
        "$8)",
        {Param::uuid(target.replica), target.scope, std::string(phase), level,
         Param::text_array(ranges), waiting, ranges_asked, rows_sent});
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
        record_sent(spi, target, "checking", 0, {}, last, 0, rows_sent);
        return messages;
    }
    const int64_t seq = send_ranges(spi, target, prefixes);
    record_sent(spi, target, "asking", 1, prefixes, seq, static_cast<int64_t>(prefixes.size()), 0);
    return 1;
}

// The replica answered the asked ranges: matching ones are done, small mismatched ones are
// resent whole, larger ones are asked again one level down.
int64_t answer_ranges(Spi& spi, const Target& target) {
    // The replica's answers, by lo and hi.
    std::map<std::pair<std::string, std::string>, std::pair<std::string, int64_t>> answers;
    if (!target.answers.empty()) {
        for (const auto& row :
             spi.query("SELECT * FROM sync_internal.repair_answers($1::jsonb)", {target.answers}))
            answers[{row["lo"].value_or(""), row["hi"].value_or("")}] = {row["fp"].value_or(""),
                                                                         row["n"].integer_or(0)};
    }
    const size_t level = target.asked.empty() ? 0 : target.asked.front().size();
    for (const std::string& prefix : target.asked) {
        if (!answers.count({lo_hex(prefix), hi_hex(prefix).value_or("")}))
            return start_round(spi, target);  // not answered (or answered before): ask again
    }
    // The server's fingerprints of the asked ranges: one scan of the scope's rows.
    std::map<std::string, std::pair<std::string, int64_t>> server;
    for (const auto& row : spi.query(
             "SELECT * FROM sync_internal.repair_fingerprints($1::bigint, $2::int, $3::text[])",
             {target.scope, static_cast<int64_t>(level), Param::text_array(target.asked)}))
        server[row["prefix"].value()] = {row["fp"].value(), row["n"].integer_or(0)};
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
        spi.execute("SELECT sync_internal.repair_check_again($1, $2::bigint)",
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
    record_sent(spi, target, deeper.empty() ? "checking" : "asking",
                static_cast<int64_t>(deeper.empty() ? level : level + 1), deeper, last,
                static_cast<int64_t>(deeper.size()), rows_sent);
    return messages;
}

}  // namespace

int64_t plan_repairs(Spi& spi) {
    spi.execute("SELECT sync_internal.repair_end_moot()");
    auto rows = spi.query("SELECT * FROM sync_internal.repair_targets()");
    int64_t written = 0;
    for (const auto& row : rows) {
        Target target;
        target.replica = row["replica"].value();
        target.scope = row["scope"].value();
        target.scope_name = row["scope_name"].value();
        target.gen = row["gen"].integer();
        target.phase = row["phase"].value_or("");
        target.answers = row["answers"].value_or("");
        target.asked = row["asked"].texts();
        if (target.phase.empty()) {
            spi.execute("SELECT sync_internal.repair_begin($1, $2::bigint, $3::int)",
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
