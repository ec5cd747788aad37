// A small libpq connection for tests: queries with bound text parameters, results as text.
#pragma once

#include <libpq-fe.h>
#include <sys/select.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "libpq/connection.hpp"
#include "support/eventually.hpp"

namespace magic_sync::test {

class Connection {
  public:
    explicit Connection(const std::string& conninfo) : connection_(connect(conninfo)) {
        PQsetNoticeProcessor(
            connection_, [](void*, const char*) {}, nullptr);
    }
    ~Connection() { PQfinish(connection_); }
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Rows of the result, each a vector of text values (NULL as std::nullopt).
    std::vector<std::vector<std::optional<std::string>>> query(
        const std::string& sql, const std::vector<std::string>& params = {}) {
        std::vector<const char*> values;
        for (const auto& p : params) values.push_back(p.c_str());
        PGresult* result = PQexecParams(connection_, sql.c_str(), static_cast<int>(values.size()),
                                        nullptr, values.data(), nullptr, nullptr, 0);
        auto status = PQresultStatus(result);
        if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
            std::string error = PQresultErrorMessage(result);
            if (error.empty()) error = PQerrorMessage(connection_);
            PQclear(result);
            throw std::runtime_error(error);
        }
        std::vector<std::vector<std::optional<std::string>>> rows;
        for (int r = 0; r < PQntuples(result); ++r) {
            std::vector<std::optional<std::string>> row;
            for (int c = 0; c < PQnfields(result); ++c)
                row.push_back(PQgetisnull(result, r, c)
                                  ? std::nullopt
                                  : std::optional<std::string>(PQgetvalue(result, r, c)));
            rows.push_back(std::move(row));
        }
        PQclear(result);
        return rows;
    }

    // The first value of the first row ("" for none or NULL).
    std::string value(const std::string& sql, const std::vector<std::string>& params = {}) {
        auto rows = query(sql, params);
        if (rows.empty() || rows.front().empty() || !rows.front().front()) return "";
        return *rows.front().front();
    }

    bool ok() const { return PQstatus(connection_) == CONNECTION_OK; }
    PGconn* raw() { return connection_; }

  private:
    static PGconn* connect(const std::string& conninfo) {
        try {
            return libpq::connect(conninfo);
        } catch (const libpq::Failure& e) {
            throw std::runtime_error(std::string("cannot connect: ") + e.what());
        }
    }

    PGconn* connection_;
};

// Waits until `connection`'s socket has something to read; false once `deadline` has passed.
inline bool await_readable(PGconn* connection, std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    int socket = PQsocket(connection);
    fd_set readable;
    FD_ZERO(&readable);
    FD_SET(socket, &readable);
    timeval wait{static_cast<long>(left.count() / 1000000),
                 static_cast<long>(left.count() % 1000000)};
    select(socket + 1, &readable, nullptr, nullptr, &wait);
    return true;
}

// Waits for a notification on `connection` (one that LISTENs); false after `timeout`.
inline bool await_notify(PGconn* connection, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        PQconsumeInput(connection);
        if (PGnotify* notify = PQnotifies(connection)) {
            PQfreemem(notify);
            return true;
        }
        if (!await_readable(connection, deadline)) return false;
    }
}

// Waits for a notification on `channel` on `connection` (one that LISTENs) and returns its
// payload; nullopt after `timeout`. Notifications on other channels are skipped.
inline std::optional<std::string> await_payload(PGconn* connection, const std::string& channel,
                                                std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        PQconsumeInput(connection);
        while (PGnotify* notify = PQnotifies(connection)) {
            std::optional<std::string> payload;
            if (channel == notify->relname) payload = notify->extra;
            PQfreemem(notify);
            if (payload) return payload;
        }
        if (!await_readable(connection, deadline)) return std::nullopt;
    }
}

}  // namespace magic_sync::test
