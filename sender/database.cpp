#include "database.hpp"

#include <cstring>
#include <memory>
#include <set>

#include "libpq/connection.hpp"
#include "protocol/messages.hpp"
#include "rows_reference.hpp"

namespace magic_sync::sender {

std::string whole_message_as_sent(const std::string& message, const std::string& origin,
                                  bool gzip) {
    std::string stamped;
    try {
        stamped = protocol::with_origin(message, origin);
    } catch (const protocol::DecodeError&) {
        stamped = message;
    }
    return gzip ? protocol::gzip(stamped) : stamped;
}

namespace {

using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// Every value that comes from outside is a bound parameter; these are the statements, prepared
// once per connection.
struct Statement {
    const char* name;
    const char* text;
};
constexpr Statement kSent{
    "magic_sync_sent",
    "SELECT recovered::text FROM sync.sent($1::uuid[], $2::bigint[], $3::text[]) recovered"};
constexpr Statement kFailed{
    "magic_sync_failed",
    "SELECT sync.failed($1::uuid, $2::bigint, $3::boolean, $4::text, $5::text)"};
// Binary results: the bytes arrive as they are, seq as 8 bytes, gen as 4, arrays as array_send
// writes them. Columns in the order of enum Column below.
constexpr Statement kNext{"magic_sync_next",
                          "SELECT replica::text, seq, message_id, message, origin, gen, reset, "
                          "drops, table_drops, chunks "
                          "FROM sync.next($1::int, $2::interval, NULL, $3::int, $4::text, "
                          "by_reference => true)"};
constexpr Statement kNextAmong{"magic_sync_next_among",
                               "SELECT replica::text, seq, message_id, message, origin, gen, "
                               "reset, drops, table_drops, chunks "
                               "FROM sync.next($1::int, $2::interval, $3::uuid[], $4::int, "
                               "$5::text, by_reference => true)"};
enum Column {
    kReplica,
    kSeq,
    kMessageId,
    kMessage,
    kOrigin,
    kGen,
    kReset,
    kDrops,
    kTableDrops,
    kChunks
};
constexpr Statement kFetchChunks{"magic_sync_chunks", kChunksQuery};
constexpr Statement kStatements[] = {kSent, kFailed, kNext, kNextAmong, kFetchChunks};

// An array literal of values that came from the database (uuids, numbers): nothing to quote.
template <typename Value, typename Text>
std::string array_literal(const std::vector<Value>& values, Text text) {
    std::string literal = "{";
    for (const Value& value : values) {
        if (literal.size() > 1) literal += ',';
        literal += text(value);
    }
    return literal + "}";
}

}  // namespace

// An exchange sent and not read to its end: what each of its results is, in order.
struct Database::Pending {
    enum class Step { sent, failed, next_among, next_any, chunks };
    std::vector<Step> steps;
    size_t step = 0;
    bool result_read = false;  // the step's result was read: the null that ends it comes next
    bool synced = false;       // the pipeline's end was read: only the chunks' statement may follow
    bool done = false;
    std::vector<std::pair<std::string, bool>> recorded;  // replica, taken
    std::vector<std::string> failed_replicas;            // of the failed steps, in order
    size_t failed_read = 0;
    std::set<std::string> recovered;
    std::set<std::string> backing_off;
    std::string error;  // the first statement's error: nothing was applied
    Exchange exchange;
    // The rows messages leased by reference: exchange.leased[delivery] once assembled.
    std::vector<std::pair<size_t, RowsReference>> references;  // delivery, reference
    std::string origin;                                        // the history they were leased in
    // The chunks they name, from the cache or fetched (none: not found yet).
    Chunks chunks;
};

Database::Database(std::string conninfo, std::string transport, size_t chunk_cache_bytes, bool gzip)
    : conninfo_(std::move(conninfo)),
      transport_(std::move(transport)),
      chunks_(chunk_cache_bytes),
      gzip_(gzip) {}

Database::~Database() { disconnect(); }

void Database::disconnect() {
    pending_.reset();
    if (connection_ != nullptr) PQfinish(connection_);
    connection_ = nullptr;
}

void Database::fail(const std::string& what) {
    const std::string reason =
        connection_ == nullptr ? "" : libpq::first_line(PQerrorMessage(connection_));
    // Whatever state the connection was left in (a half-read pipeline), a new one is cleaner.
    disconnect();
    throw DatabaseError(what + (reason.empty() ? "" : ": " + reason));
}

void Database::connect() {
    disconnect();
    try {
        connection_ = libpq::connect(conninfo_);
    } catch (const libpq::Failure& e) {
        throw DatabaseError("cannot connect: " + libpq::first_line(e.what()));
    }
    Result listen(PQexec(connection_, "LISTEN magic_sync"), PQclear);
    if (PQresultStatus(listen.get()) != PGRES_COMMAND_OK) fail("LISTEN magic_sync failed");
    for (const Statement& statement : kStatements) {
        try {
            libpq::prepare(connection_, statement.name, statement.text);
        } catch (const libpq::Failure& e) {
            disconnect();
            throw DatabaseError(e.what());
        }
    }
}

int Database::socket() const { return connection_ == nullptr ? -1 : PQsocket(connection_); }

std::string Database::describe() const {
    if (connection_ == nullptr) return "(not connected)";
    return std::string(PQuser(connection_)) + "@" + PQhost(connection_) + ":" +
           PQport(connection_) + "/" + PQdb(connection_);
}

void Database::start_exchange(const std::vector<Settlement>& settlements, const Wants& wants,
                              double lease_seconds) {
    if (connection_ == nullptr) throw DatabaseError("not connected");
    if (pending_ != nullptr) throw std::logic_error("an exchange is already pending");
    auto pending = std::make_unique<Pending>();
    std::vector<const Settlement*> taken;
    std::vector<const Settlement*> failed;
    for (const Settlement& settlement : settlements) {
        const bool was_taken = settlement.outcome.verdict == Verdict::taken;
        (was_taken ? taken : failed).push_back(&settlement);
        pending->recorded.emplace_back(settlement.replica, was_taken);
    }
    const auto replica_of = [](const Settlement* settlement) { return settlement->replica; };
    const std::string taken_replicas = array_literal(taken, replica_of);
    const std::string taken_seqs = array_literal(
        taken, [](const Settlement* settlement) { return std::to_string(settlement->seq); });
    const std::string taken_origins = array_literal(
        taken, [](const Settlement* settlement) { return '"' + settlement->origin + '"'; });
    const std::string lease = std::to_string(lease_seconds) + " seconds";
    const std::string run = std::to_string(wants.run);

    // A pipeline: everything up to the sync point is one implicit transaction, so either all of
    // it is applied or none of it, and it costs one round trip. Every delivery taken is recorded
    // by one statement, and the next runs of their replicas are leased by one more.
    if (PQenterPipelineMode(connection_) != 1) fail("cannot enter pipeline mode");
    const auto send = [&](Pending::Step step, const Statement& statement,
                          std::vector<const char*> values, int binary) {
        if (PQsendQueryPrepared(connection_, statement.name, static_cast<int>(values.size()),
                                values.data(), nullptr, nullptr, binary) != 1)
            fail("cannot send the exchange");
        pending->steps.push_back(step);
    };
    if (!taken.empty())
        send(Pending::Step::sent, kSent,
             {taken_replicas.c_str(), taken_seqs.c_str(), taken_origins.c_str()}, 0);
    for (const Settlement* settlement : failed) {
        const bool retry = settlement->outcome.verdict == Verdict::transient;
        const std::string seq = std::to_string(settlement->seq);
        send(Pending::Step::failed, kFailed,
             {settlement->replica.c_str(), seq.c_str(), retry ? "true" : "false",
              settlement->outcome.error.c_str(), settlement->origin.c_str()},
             0);
        pending->failed_replicas.push_back(settlement->replica);
    }
    const std::string among_count = std::to_string(wants.among_taken);
    const std::string any_count = std::to_string(wants.any);
    if (wants.among_taken > 0 && !taken.empty())
        send(Pending::Step::next_among, kNextAmong,
             {among_count.c_str(), lease.c_str(), taken_replicas.c_str(), run.c_str(),
              transport_.c_str()},
             1);
    if (wants.any > 0)
        send(Pending::Step::next_any, kNext,
             {any_count.c_str(), lease.c_str(), run.c_str(), transport_.c_str()}, 1);
    if (PQpipelineSync(connection_) != 1) fail("cannot send the exchange");
    pending_ = std::move(pending);
}

bool Database::fetch_missing_chunks() {
    Pending& pending = *pending_;
    const std::string ids = missing_chunks(pending.chunks);
    if (ids.empty()) return false;
    const char* values[] = {ids.c_str(), pending.origin.c_str()};
    if (PQsendQueryPrepared(connection_, kFetchChunks.name, 2, values, nullptr, nullptr, 1) != 1)
        fail("cannot send the exchange");
    pending.steps.push_back(Pending::Step::chunks);
    return true;
}

bool Database::read_one_result() {
    Pending& pending = *pending_;
    if (pending.synced && pending.step == pending.steps.size()) {
        pending.done = true;
        return false;
    }
    if (PQisBusy(connection_)) return false;
    Result result(PQgetResult(connection_), PQclear);
    if (pending.step == pending.steps.size()) {
        if (result == nullptr || PQresultStatus(result.get()) != PGRES_PIPELINE_SYNC)
            fail("the exchange did not complete");
        if (PQexitPipelineMode(connection_) != 1) fail("cannot leave pipeline mode");
        pending.synced = true;
        // The lease is in (its transaction committed); the chunks follow in one more statement.
        if (pending.error.empty() && fetch_missing_chunks()) return true;
        pending.done = true;
        return false;
    }
    if (pending.result_read) {
        // Each statement's results end with a null.
        if (result != nullptr) fail("the exchange answered more than it was asked");
        ++pending.step;
        pending.result_read = false;
        return true;
    }
    if (result == nullptr) fail("the connection ended during the exchange");
    pending.result_read = true;
    const Pending::Step step = pending.steps[pending.step];
    const ExecStatusType status = PQresultStatus(result.get());
    if (status == PGRES_FATAL_ERROR && pending.error.empty())
        pending.error = libpq::first_line(PQresultErrorMessage(result.get()));
    if (status != PGRES_TUPLES_OK || !pending.error.empty()) return true;
    PGresult* rows = result.get();
    switch (step) {
        case Pending::Step::sent:
            for (int row = 0; row < PQntuples(rows); ++row)
                pending.recovered.insert(PQgetvalue(rows, row, 0));
            break;
        case Pending::Step::failed:
            if (std::strcmp(PQgetvalue(rows, 0, 0), "t") == 0)
                pending.backing_off.insert(pending.failed_replicas[pending.failed_read]);
            ++pending.failed_read;
            break;
        case Pending::Step::next_among:
        case Pending::Step::next_any: {
            size_t& replicas = step == Pending::Step::next_among
                                   ? pending.exchange.replicas_among_taken
                                   : pending.exchange.replicas_any;
            std::vector<Delivery>& leased = pending.exchange.leased;
            const auto cell = [&](int row, Column column) {
                return std::string(PQgetvalue(rows, row, column),
                                   static_cast<size_t>(PQgetlength(rows, row, column)));
            };
            for (int row = 0; row < PQntuples(rows); ++row) {
                Delivery delivery;
                delivery.replica = cell(row, kReplica);
                delivery.seq = big_endian_int64(PQgetvalue(rows, row, kSeq));
                delivery.message_id = cell(row, kMessageId);
                delivery.origin = cell(row, kOrigin);
                if (gzip_) delivery.content_encoding = "gzip";
                if (!PQgetisnull(rows, row, kMessage)) {
                    delivery.bytes =
                        whole_message_as_sent(cell(row, kMessage), delivery.origin, gzip_);
                } else {
                    // A rows message by reference: assembled once its chunks are in.
                    auto reference = read_reference(rows, row, kGen, delivery.replica, delivery.seq,
                                                    delivery.origin);
                    if (!reference) fail("sync.next returned a reference that does not read");
                    // All of an exchange's leases are of one transaction: one origin.
                    pending.origin = delivery.origin;
                    for (int64_t id : reference->chunks) {
                        auto& chunk = pending.chunks[id];
                        if (chunk == nullptr) chunk = chunks_.find(delivery.origin, id);
                    }
                    pending.references.emplace_back(leased.size(), std::move(*reference));
                }
                // A replica's run comes in one piece.
                if (row == 0 || leased.back().replica != delivery.replica) ++replicas;
                leased.push_back(std::move(delivery));
            }
            break;
        }
        case Pending::Step::chunks: {
            auto fetched = read_chunks(rows, gzip_);
            if (!fetched) fail("sync.chunks returned notes that do not read");
            for (auto& [id, chunk] : *fetched) {
                chunks_.add(pending.origin, id, chunk);
                pending.chunks[id] = std::move(chunk);
            }
            break;
        }
    }
    return true;
}

void Database::assemble(Pending& pending) {
    std::vector<Delivery>& leased = pending.exchange.leased;
    std::vector<bool> gone(leased.size(), false);
    for (const auto& [at, reference] : pending.references) {
        std::optional<std::string> bytes = sender::assemble(reference, pending.chunks, gzip_);
        if (!bytes) {
            // Its run from here on is left out: never a message after one that was not sent.
            for (size_t i = at; i < leased.size() && leased[i].replica == leased[at].replica; ++i)
                gone[i] = true;
            std::string missing;
            int missing_count = 0;
            for (int64_t id : reference.chunks) {
                const auto chunk = pending.chunks.find(id);
                if (chunk == pending.chunks.end() || chunk->second == nullptr) {
                    missing += (missing.empty() ? "" : ", ") + std::to_string(id);
                    ++missing_count;
                }
            }
            pending.exchange.left_out.push_back(
                "replica " + leased[at].replica + ": message " + leased[at].message_id +
                " and the rest of its run left out: " +
                (missing_count == 1 ? "chunk " : "chunks ") + missing + " not found in history " +
                leased[at].origin + "; leased, they go again when the lease ends");
            continue;
        }
        leased[at].bytes = std::move(*bytes);
    }
    size_t kept = 0;
    for (size_t i = 0; i < leased.size(); ++i)
        if (!gone[i] && kept++ != i) leased[kept - 1] = std::move(leased[i]);
    leased.resize(kept);
}

Arrived Database::read() {
    Arrived arrived;
    if (connection_ == nullptr) return arrived;
    // Once per readable socket: what it reads is all there is until the socket is readable again.
    if (PQconsumeInput(connection_) != 1) fail("lost the connection");
    if (pending_ != nullptr) {
        while (!pending_->done && read_one_result()) {
        }
        if (!pending_->done) return arrived;
        const std::unique_ptr<Pending> pending = std::move(pending_);
        if (!pending->error.empty()) throw DatabaseError(pending->error);
        assemble(*pending);
        for (const auto& [replica, taken] : pending->recorded) {
            const auto& changed = taken ? pending->recovered : pending->backing_off;
            pending->exchange.changes.push_back(changed.count(replica) == 0 ? ReplicaChange::none
                                                : taken ? ReplicaChange::recovered
                                                        : ReplicaChange::backing_off);
        }
        arrived.exchange = std::move(pending->exchange);
    }
    while (PGnotify* notify = PQnotifies(connection_)) {
        arrived.notified = true;
        PQfreemem(notify);
    }
    return arrived;
}

std::optional<long long> Database::setting(const std::string& name) {
    if (connection_ == nullptr) throw DatabaseError("not connected");
    const char* values[] = {name.c_str()};
    Result result(PQexecParams(connection_, "SELECT setting FROM pg_settings WHERE name = $1", 1,
                               nullptr, values, nullptr, nullptr, 0),
                  PQclear);
    if (PQresultStatus(result.get()) != PGRES_TUPLES_OK) fail("cannot read " + name);
    if (PQntuples(result.get()) == 0) return std::nullopt;
    return std::atoll(PQgetvalue(result.get(), 0, 0));
}

Backlog Database::backlog() {
    if (connection_ == nullptr) throw DatabaseError("not connected");
    Result result(PQexec(connection_,
                         "SELECT unsent, in_backoff, "
                         "coalesce(extract(epoch FROM oldest_unsent), 0) FROM sync.backlog()"),
                  PQclear);
    if (PQresultStatus(result.get()) != PGRES_TUPLES_OK) fail("cannot read the backlog");
    Backlog backlog;
    backlog.unsent = std::atoll(PQgetvalue(result.get(), 0, 0));
    backlog.in_backoff = std::atoll(PQgetvalue(result.get(), 0, 1));
    backlog.oldest_unsent_seconds = std::atof(PQgetvalue(result.get(), 0, 2));
    return backlog;
}

}  // namespace magic_sync::sender
