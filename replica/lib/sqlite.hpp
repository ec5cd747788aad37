// A thin RAII layer over the SQLite C API: a connection, prepared statements and transactions.
// Every failure becomes a StorageError naming the statement, so callers need no return codes.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace magic_sync::replica {

// The local database failed (locked, full, corrupt): nothing was applied; trying again may help.
class StorageError : public std::runtime_error {
  public:
    explicit StorageError(const std::string& message) : std::runtime_error(message) {}
};

class Statement;

class Database {
  public:
    explicit Database(const std::string& path);
    ~Database();
    Database(const Database&) = delete;
    Database& operator=(const Database&) = delete;

    // Runs statements that take no parameters and return nothing.
    void exec(const std::string& sql);
    Statement prepare(const std::string& sql);
    sqlite3* handle() const { return handle_; }

  private:
    sqlite3* handle_ = nullptr;
};

class Statement {
  public:
    Statement(sqlite3* database, const std::string& sql);
    ~Statement();
    Statement(Statement&& other) noexcept;
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    Statement& operator=(Statement&&) = delete;

    // Parameters are numbered from 1, as in SQLite.
    Statement& bind(int index, std::string_view text);
    Statement& bind(int index, int64_t value);
    Statement& bind_blob(int index, std::string_view bytes);
    Statement& bind_null(int index);
    Statement& bind_optional(int index, const std::optional<std::string>& text);

    // Advances to the next result row; false when there is none. Resets itself after the last row.
    bool step();
    // Runs a statement that returns no rows.
    void run();

    // Columns are numbered from 0.
    bool is_null(int column) const;
    int64_t integer(int column) const;
    std::string text(int column) const;
    std::optional<std::string> optional_text(int column) const;
    std::string blob(int column) const;

  private:
    [[noreturn]] void fail(int code) const;
    // A statement left on a row (the caller read only the first) is reset before it is bound again.
    void rewind();

    sqlite3* database_;
    sqlite3_stmt* statement_ = nullptr;
    bool on_row_ = false;
};

// BEGIN IMMEDIATE on construction (so a writer never fails half way on a lock it could not take);
// ROLLBACK on destruction unless commit() was called.
class Transaction {
  public:
    explicit Transaction(Database& database);
    ~Transaction();
    Transaction(const Transaction&) = delete;
    Transaction& operator=(const Transaction&) = delete;

    void commit();

  private:
    Database& database_;
    bool open_ = true;
};

}  // namespace magic_sync::replica
