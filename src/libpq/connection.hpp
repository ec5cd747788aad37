// Connecting to PostgreSQL through libpq, for the programs outside the server (the sender and its
// pull server, the reference replica's up route, the tests): the connection string checked before
// it is used, the connection made, statements prepared, and what failed said one way. Header-only:
// each program links libpq itself.
#pragma once

#include <libpq-fe.h>

#include <stdexcept>
#include <string>

#include "protocol/conninfo.hpp"

namespace magic_sync::libpq {

// The first line of a libpq message (the rest, when there is one, is detail).
inline std::string first_line(const char* text) {
    std::string line = text == nullptr ? "" : text;
    const auto end = line.find('\n');
    if (end != std::string::npos) line.resize(end);
    return line;
}

// Connecting or preparing failed: what() says why in libpq's words (once the connection string
// parsed, they name host and port, never the password), with the SQLSTATE of a statement that
// failed and whether the connection is lost.
class Failure : public std::runtime_error {
  public:
    explicit Failure(const std::string& why, std::string sqlstate = "", bool lost = true)
        : std::runtime_error(why), sqlstate_(std::move(sqlstate)), lost_(lost) {}
    const std::string& sqlstate() const { return sqlstate_; }
    bool lost() const { return lost_; }

  private:
    std::string sqlstate_;
    bool lost_;
};

// Refuses a connection string that does not parse, without what libpq quotes of it
// (protocol::unparsable_conninfo).
inline void check_conninfo(const std::string& conninfo) {
    char* parse_error = nullptr;
    PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error);
    if (parsed == nullptr) {
        const std::string why = protocol::unparsable_conninfo(parse_error);
        PQfreemem(parse_error);
        throw Failure(why);
    }
    PQconninfoFree(parsed);
}

// A connection to `conninfo` (checked first), which the caller ends with PQfinish.
inline PGconn* connect(const std::string& conninfo) {
    check_conninfo(conninfo);
    PGconn* connection = PQconnectdb(conninfo.c_str());
    if (connection == nullptr) throw Failure("out of memory");
    if (PQstatus(connection) != CONNECTION_OK) {
        const std::string why = PQerrorMessage(connection);
        PQfinish(connection);
        throw Failure(why);
    }
    return connection;
}

// Prepares `text` as the statement `name` on `connection`, which stays the caller's whether or not
// it fails: "cannot prepare <name>: <libpq's first line>".
inline void prepare(PGconn* connection, const char* name, const char* text) {
    PGresult* prepared = PQprepare(connection, name, text, 0, nullptr);
    const bool ok = PQresultStatus(prepared) == PGRES_COMMAND_OK;
    const char* sqlstate = PQresultErrorField(prepared, PG_DIAG_SQLSTATE);
    const std::string why = first_line(PQresultErrorMessage(prepared));
    Failure failure(std::string("cannot prepare ") + name + (why.empty() ? "" : ": " + why),
                    sqlstate == nullptr ? "" : sqlstate, PQstatus(connection) != CONNECTION_OK);
    PQclear(prepared);
    if (!ok) throw failure;
}

}  // namespace magic_sync::libpq
