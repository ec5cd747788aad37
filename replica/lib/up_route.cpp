#include "lib/up_route.hpp"

#include <utility>
#include <vector>

#include "lib/replica.hpp"
#include "libpq/connection.hpp"
#include "protocol/gzip.hpp"

namespace magic_sync::replica {

PostgresUpRoute::PostgresUpRoute(std::string conninfo) : conninfo_(std::move(conninfo)) {}

PostgresUpRoute::~PostgresUpRoute() { PQfinish(connection_); }

void PostgresUpRoute::connect() {
    PQfinish(connection_);
    connection_ = nullptr;
    try {
        connection_ = libpq::connect(conninfo_);
    } catch (const libpq::Failure& e) {
        throw UpRouteError(std::string("cannot connect to the up route: ") + e.what());
    }
}

std::string PostgresUpRoute::send(const std::string& replica_id, const std::string& body) {
    if (connection_ == nullptr || PQstatus(connection_) != CONNECTION_OK) connect();
    const char* values[] = {replica_id.c_str(), body.data()};
    int lengths[] = {0, static_cast<int>(body.size())};
    int formats[] = {0, 1};  // the message goes as binary bytea: no escaping, no size doubling
    PGresult* result = PQexecParams(connection_, "SELECT sync.receive($1::uuid, $2::bytea)", 2,
                                    nullptr, values, lengths, formats, 0);
    ExecStatusType status = PQresultStatus(result);
    std::string error = PQresultErrorMessage(result);
    std::string answer;
    if (status == PGRES_TUPLES_OK && PQntuples(result) == 1 && !PQgetisnull(result, 0, 0))
        answer = PQgetvalue(result, 0, 0);
    PQclear(result);
    if (status == PGRES_TUPLES_OK) return answer;
    // A broken connection is made again on the next send.
    if (PQstatus(connection_) != CONNECTION_OK) {
        PQfinish(connection_);
        connection_ = nullptr;
    }
    throw UpRouteError("sync.receive failed: " + error);
}

GzipUpRoute::GzipUpRoute(std::unique_ptr<UpRoute> route) : route_(std::move(route)) {}

std::string GzipUpRoute::send(const std::string& replica_id, const std::string& body) {
    return route_->send(replica_id, protocol::gzip(body));
}

std::vector<std::string> send_uploads(Replica& replica, UpRoute& route) {
    std::vector<std::string> sent;
    while (std::optional<PreparedUpload> upload = replica.prepare_upload()) {
        const std::string answer = route.send(replica.id(), upload->body);
        if (answer == "dropped")
            throw UpRouteError("the server dropped upload " + upload->id +
                               ": it does not know this replica (is it live?)");
        if (answer == "refused")
            throw UpRouteError("the server refused upload " + upload->id +
                               ": it keeps as much from this replica as it may; kept here, it "
                               "goes again later");
        replica.mark_sent(upload->id, upload->body);
        sent.push_back(upload->id);
    }
    return sent;
}

}  // namespace magic_sync::replica
