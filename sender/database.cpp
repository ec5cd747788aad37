#include "database.hpp"

#include <cstring>
#include <memory>
#include <set>

namespace magic_sync::sender {

namespace {

using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

std::string first_line(const char* text) {
    std::string line = text == nullptr ? "" : text;
    const auto end = line.find('\n');
    if (end != std::string::npos) line.resize(end);
    return line;
}

// libpq's reason for a connection string it cannot parse quotes the string's own text: a password
// cut short by a bad %-escape ("invalid percent-encoded token: "hunter2%zz""), the whole URI when
// an IPv6 bracket is not closed. Logged, such a reason leaves out whatever it quotes.
std::string unquoted(const std::string& reason) {
    std::string out;
    bool quoted = false;
    for (char c : reason) {
        if (c == '"') {
            if (!quoted) out += "\"...\"";
            quoted = !quoted;
        } else if (!quoted) {
            out += c;
        }
    }
    return out;
}

int64_t big_endian_int64(const char* bytes) {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
    return static_cast<int64_t>(value);
}

// Every value that comes from outside is a bound parameter; these are the statements, prepared
// once per connection.
struct Statement {
    const char* name;
    const char* text;
};
constexpr Statement kSent{
    "magic_sync_sent", "SELECT recovered::text FROM sync.sent($1::uuid[], $2::bigint[]) recovered"};
constexpr Statement kFailed{"magic_sync_failed",
                            "SELECT sync.failed($1::uuid, $2::bigint, $3::boolean, $4::text)"};
// Binary results: the bytes arrive as they are, and seq as 8 bytes.
constexpr Statement kNext{
    "magic_sync_next",
    "SELECT replica::text, seq, message_id, message FROM sync.next($1::int, $2::interval)"};
constexpr Statement kNextAmong{"magic_sync_next_among",
                               "SELECT replica::text, seq, message_id, message "
                               "FROM sync.next($1::int, $2::interval, $3::uuid[])"};
constexpr Statement kStatements[] = {kSent, kFailed, kNext, kNextAmong};

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

Database::Database(std::string conninfo) : conninfo_(std::move(conninfo)) {}

Database::~Database() { disconnect(); }

void Database::disconnect() {
    if (connection_ != nullptr) PQfinish(connection_);
    connection_ = nullptr;
}

void Database::fail(const std::string& what) {
    const std::string reason =
        connection_ == nullptr ? "" : first_line(PQerrorMessage(connection_));
    // Whatever state the connection was left in (a half-read pipeline), a new one is cleaner.
    disconnect();
    throw DatabaseError(what + (reason.empty() ? "" : ": " + reason));
}

void Database::connect() {
    disconnect();
    char* parse_error = nullptr;
    PQconninfoOption* parsed = PQconninfoParse(conninfo_.c_str(), &parse_error);
    if (parsed == nullptr) {
        const std::string reason =
            parse_error == nullptr ? "out of memory" : first_line(parse_error);
        PQfreemem(parse_error);
        throw DatabaseError(
            "cannot connect: the connection string does not parse: " + unquoted(reason) +
            " (what it quotes is not shown: it may be a password)");
    }
    PQconninfoFree(parsed);
    connection_ = PQconnectdb(conninfo_.c_str());
    if (connection_ == nullptr) throw DatabaseError("cannot connect: out of memory");
    if (PQstatus(connection_) != CONNECTION_OK) {
        // The string parsed: libpq's message names host and port, never the password.
        const std::string reason = first_line(PQerrorMessage(connection_));
        disconnect();
        throw DatabaseError("cannot connect: " + reason);
    }
    Result listen(PQexec(connection_, "LISTEN magic_sync"), PQclear);
    if (PQresultStatus(listen.get()) != PGRES_COMMAND_OK) fail("LISTEN magic_sync failed");
    for (const Statement& statement : kStatements) {
        Result prepared(PQprepare(connection_, statement.name, statement.text, 0, nullptr),
                        PQclear);
        if (PQresultStatus(prepared.get()) != PGRES_COMMAND_OK)
            fail(std::string("cannot prepare ") + statement.name);
    }
}

int Database::socket() const { return connection_ == nullptr ? -1 : PQsocket(connection_); }

std::string Database::describe() const {
    if (connection_ == nullptr) return "(not connected)";
    return std::string(PQuser(connection_)) + "@" + PQhost(connection_) + ":" +
           PQport(connection_) + "/" + PQdb(connection_);
}

Exchange Database::exchange(const std::vector<Settlement>& settlements, const Wants& wants,
                            double lease_seconds) {
    if (connection_ == nullptr) throw DatabaseError("not connected");
    std::vector<const Settlement*> taken;
    std::vector<const Settlement*> failed;
    for (const Settlement& settlement : settlements)
        (settlement.outcome.verdict == Verdict::taken ? taken : failed).push_back(&settlement);
    const auto replica_of = [](const Settlement* settlement) { return settlement->replica; };
    const std::string taken_replicas = array_literal(taken, replica_of);
    const std::string taken_seqs = array_literal(
        taken, [](const Settlement* settlement) { return std::to_string(settlement->seq); });
    const std::string lease = std::to_string(lease_seconds) + " seconds";
    const bool ask_among = wants.among_taken > 0 && !taken.empty();

    // A pipeline: everything up to the sync point is one implicit transaction, so either all of
    // it is applied or none of it, and it costs one round trip. Every delivery taken is recorded
    // by one statement, and the next messages of their replicas are leased by one more.
    if (PQenterPipelineMode(connection_) != 1) fail("cannot enter pipeline mode");
    const auto send = [&](const Statement& statement, std::vector<const char*> values, int binary) {
        if (PQsendQueryPrepared(connection_, statement.name, static_cast<int>(values.size()),
                                values.data(), nullptr, nullptr, binary) != 1)
            fail("cannot send the exchange");
    };
    if (!taken.empty()) send(kSent, {taken_replicas.c_str(), taken_seqs.c_str()}, 0);
    std::vector<std::string> failed_seqs;
    for (const Settlement* settlement : failed)
        failed_seqs.push_back(std::to_string(settlement->seq));
    for (size_t i = 0; i < failed.size(); ++i) {
        const bool retry = failed[i]->outcome.verdict == Verdict::transient;
        send(kFailed,
             {failed[i]->replica.c_str(), failed_seqs[i].c_str(), retry ? "true" : "false",
              failed[i]->outcome.error.c_str()},
             0);
    }
    const std::string among_count = std::to_string(wants.among_taken);
    const std::string any_count = std::to_string(wants.any);
    if (ask_among)
        send(kNextAmong, {among_count.c_str(), lease.c_str(), taken_replicas.c_str()}, 1);
    if (wants.any > 0) send(kNext, {any_count.c_str(), lease.c_str()}, 1);
    if (PQpipelineSync(connection_) != 1) fail("cannot send the exchange");

    Exchange exchange;
    std::string error;
    // Each query's result, or nothing after an error; each query's results end with a null.
    const auto take_result = [&](const auto& use) {
        Result result(PQgetResult(connection_), PQclear);
        if (result == nullptr) fail("the connection ended during the exchange");
        const ExecStatusType status = PQresultStatus(result.get());
        if (status == PGRES_FATAL_ERROR && error.empty())
            error = first_line(PQresultErrorMessage(result.get()));
        if (status == PGRES_TUPLES_OK && error.empty()) use(result.get());
        Result end(PQgetResult(connection_), PQclear);
    };
    const auto take_leased = [&](size_t* count) {
        take_result([&](PGresult* result) {
            for (int row = 0; row < PQntuples(result); ++row) {
                Delivery delivery;
                delivery.replica.assign(PQgetvalue(result, row, 0), PQgetlength(result, row, 0));
                delivery.seq = big_endian_int64(PQgetvalue(result, row, 1));
                delivery.message_id.assign(PQgetvalue(result, row, 2), PQgetlength(result, row, 2));
                delivery.bytes.assign(PQgetvalue(result, row, 3), PQgetlength(result, row, 3));
                exchange.leased.push_back(std::move(delivery));
            }
            *count = static_cast<size_t>(PQntuples(result));
        });
    };
    std::set<std::string> recovered;
    if (!taken.empty()) {
        take_result([&](PGresult* result) {
            for (int row = 0; row < PQntuples(result); ++row)
                recovered.insert(PQgetvalue(result, row, 0));
        });
    }
    std::set<std::string> backing_off;
    for (const Settlement* settlement : failed) {
        take_result([&](PGresult* result) {
            if (std::strcmp(PQgetvalue(result, 0, 0), "t") == 0)
                backing_off.insert(settlement->replica);
        });
    }
    if (ask_among) take_leased(&exchange.leased_among_taken);
    if (wants.any > 0) take_leased(&exchange.leased_any);
    Result sync(PQgetResult(connection_), PQclear);
    if (sync == nullptr || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC)
        fail("the exchange did not complete");
    if (PQexitPipelineMode(connection_) != 1) fail("cannot leave pipeline mode");
    if (!error.empty()) throw DatabaseError(error);
    for (const Settlement& settlement : settlements) {
        const bool was_taken = settlement.outcome.verdict == Verdict::taken;
        const auto& changed = was_taken ? recovered : backing_off;
        exchange.changes.push_back(changed.count(settlement.replica) == 0 ? ReplicaChange::none
                                   : was_taken                            ? ReplicaChange::recovered
                                               : ReplicaChange::backing_off);
    }
    return exchange;
}

bool Database::notified() {
    if (connection_ == nullptr) return false;
    if (PQconsumeInput(connection_) != 1) fail("lost the connection");
    bool any = false;
    while (PGnotify* notify = PQnotifies(connection_)) {
        any = true;
        PQfreemem(notify);
    }
    return any;
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
