#include "database.hpp"

#include <cstring>
#include <memory>

namespace magic_sync::sender {

namespace {

using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

std::string first_line(const char* text) {
    std::string line = text == nullptr ? "" : text;
    const auto end = line.find('\n');
    if (end != std::string::npos) line.resize(end);
    return line;
}

int64_t big_endian_int64(const char* bytes) {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
    return static_cast<int64_t>(value);
}

// Every value that comes from outside is a bound parameter; these are the statements.
constexpr const char* kSent = "SELECT sync.sent($1::uuid, $2::bigint)";
constexpr const char* kFailed = "SELECT sync.failed($1::uuid, $2::bigint, $3::boolean, $4::text)";
// Binary results: the bytes arrive as they are, and seq as 8 bytes.
constexpr const char* kNext =
    "SELECT replica::text, seq, message_id, message FROM sync.next($1::int, $2::interval)";

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
    connection_ = PQconnectdb(conninfo_.c_str());
    if (connection_ == nullptr) throw DatabaseError("cannot connect: out of memory");
    if (PQstatus(connection_) != CONNECTION_OK) {
        // libpq's message names host and port, never the password.
        const std::string reason = first_line(PQerrorMessage(connection_));
        disconnect();
        throw DatabaseError("cannot connect: " + reason);
    }
    Result listen(PQexec(connection_, "LISTEN magic_sync"), PQclear);
    if (PQresultStatus(listen.get()) != PGRES_COMMAND_OK) fail("LISTEN magic_sync failed");
}

int Database::socket() const { return connection_ == nullptr ? -1 : PQsocket(connection_); }

std::string Database::describe() const {
    if (connection_ == nullptr) return "(not connected)";
    return std::string(PQuser(connection_)) + "@" + PQhost(connection_) + ":" +
           PQport(connection_) + "/" + PQdb(connection_);
}

Exchange Database::exchange(const std::vector<Settlement>& settlements, int want,
                            double lease_seconds) {
    if (connection_ == nullptr) throw DatabaseError("not connected");
    // A pipeline: everything up to the sync point is one implicit transaction, so either all of
    // it is applied or none of it, and it costs one round trip.
    if (PQenterPipelineMode(connection_) != 1) fail("cannot enter pipeline mode");
    for (const Settlement& settlement : settlements) {
        const std::string seq = std::to_string(settlement.seq);
        const bool taken = settlement.outcome.verdict == Verdict::taken;
        const char* retry = settlement.outcome.verdict == Verdict::transient ? "true" : "false";
        const char* values[] = {settlement.replica.c_str(), seq.c_str(), retry,
                                settlement.outcome.error.c_str()};
        if (PQsendQueryParams(connection_, taken ? kSent : kFailed, taken ? 2 : 4, nullptr, values,
                              nullptr, nullptr, 0) != 1)
            fail("cannot send the outcomes");
    }
    const std::string count = std::to_string(want);
    const std::string lease = std::to_string(lease_seconds) + " seconds";
    if (want > 0) {
        const char* values[] = {count.c_str(), lease.c_str()};
        if (PQsendQueryParams(connection_, kNext, 2, nullptr, values, nullptr, nullptr, 1) != 1)
            fail("cannot ask for messages");
    }
    if (PQpipelineSync(connection_) != 1) fail("cannot send the exchange");

    Exchange exchange;
    std::string error;
    auto take_result = [&](bool is_next) {
        Result result(PQgetResult(connection_), PQclear);
        if (result == nullptr) fail("the connection ended during the exchange");
        const ExecStatusType status = PQresultStatus(result.get());
        if (status == PGRES_FATAL_ERROR && error.empty())
            error = first_line(PQresultErrorMessage(result.get()));
        if (status == PGRES_TUPLES_OK && error.empty()) {
            if (!is_next) {
                const bool changed = std::strcmp(PQgetvalue(result.get(), 0, 0), "t") == 0;
                const bool was_sent =
                    exchange.changes.size() < settlements.size() &&
                    settlements[exchange.changes.size()].outcome.verdict == Verdict::taken;
                exchange.changes.push_back(!changed   ? ReplicaChange::none
                                           : was_sent ? ReplicaChange::recovered
                                                      : ReplicaChange::backing_off);
            } else {
                for (int row = 0; row < PQntuples(result.get()); ++row) {
                    Delivery delivery;
                    delivery.replica.assign(PQgetvalue(result.get(), row, 0),
                                            PQgetlength(result.get(), row, 0));
                    delivery.seq = big_endian_int64(PQgetvalue(result.get(), row, 1));
                    delivery.message_id.assign(PQgetvalue(result.get(), row, 2),
                                               PQgetlength(result.get(), row, 2));
                    delivery.bytes.assign(PQgetvalue(result.get(), row, 3),
                                          PQgetlength(result.get(), row, 3));
                    exchange.leased.push_back(std::move(delivery));
                }
            }
        }
        // Each query's results end with a null.
        Result end(PQgetResult(connection_), PQclear);
    };
    for (size_t i = 0; i < settlements.size(); ++i) take_result(false);
    if (want > 0) take_result(true);
    Result sync(PQgetResult(connection_), PQclear);
    if (sync == nullptr || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC)
        fail("the exchange did not complete");
    if (PQexitPipelineMode(connection_) != 1) fail("cannot leave pipeline mode");
    if (!error.empty()) throw DatabaseError(error);
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
