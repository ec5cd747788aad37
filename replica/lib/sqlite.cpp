#include "lib/sqlite.hpp"

#include <utility>

namespace magic_sync::replica {

Database::Database(const std::string& path) {
    int code = sqlite3_open_v2(path.c_str(), &handle_,
                               SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                               nullptr);
    if (code != SQLITE_OK) {
        std::string message = handle_ ? sqlite3_errmsg(handle_) : sqlite3_errstr(code);
        sqlite3_close(handle_);
        throw StorageError("cannot open " + path + ": " + message);
    }
    // Another process (a second CLI command on the same file) waits for the lock instead of
    // failing.
    sqlite3_busy_timeout(handle_, 10000);
    // WAL lets readers run beside the writer; synchronous=FULL makes a commit durable before we
    // acknowledge the message it applied.
    exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;");
}

Database::~Database() { sqlite3_close(handle_); }

void Database::exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(handle_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
        std::string message = error ? error : sqlite3_errmsg(handle_);
        sqlite3_free(error);
        throw StorageError(message + " (in: " + sql.substr(0, 80) + ")");
    }
}

Statement Database::prepare(const std::string& sql) { return Statement(handle_, sql); }

Statement::Statement(sqlite3* database, const std::string& sql) : database_(database) {
    if (sqlite3_prepare_v2(database_, sql.c_str(), -1, &statement_, nullptr) != SQLITE_OK) {
        throw StorageError(std::string(sqlite3_errmsg(database_)) + " (in: " + sql + ")");
    }
}

Statement::~Statement() { sqlite3_finalize(statement_); }

Statement::Statement(Statement&& other) noexcept
    : database_(other.database_),
      statement_(std::exchange(other.statement_, nullptr)),
      on_row_(other.on_row_) {}

void Statement::fail(int code) const {
    std::string message = sqlite3_errmsg(database_);
    if (message == "not an error") message = sqlite3_errstr(code);
    throw StorageError(message + " (in: " + sqlite3_sql(statement_) + ")");
}

void Statement::rewind() {
    if (!on_row_) return;
    sqlite3_reset(statement_);
    on_row_ = false;
}

Statement& Statement::bind(int index, std::string_view text) {
    rewind();
    int code = sqlite3_bind_text(statement_, index, text.data(), static_cast<int>(text.size()),
                                 SQLITE_TRANSIENT);
    if (code != SQLITE_OK) fail(code);
    return *this;
}

Statement& Statement::bind(int index, int64_t value) {
    rewind();
    int code = sqlite3_bind_int64(statement_, index, value);
    if (code != SQLITE_OK) fail(code);
    return *this;
}

Statement& Statement::bind_blob(int index, std::string_view bytes) {
    rewind();
    int code = sqlite3_bind_blob(statement_, index, bytes.data(), static_cast<int>(bytes.size()),
                                 SQLITE_TRANSIENT);
    if (code != SQLITE_OK) fail(code);
    return *this;
}

Statement& Statement::bind_null(int index) {
    rewind();
    int code = sqlite3_bind_null(statement_, index);
    if (code != SQLITE_OK) fail(code);
    return *this;
}

Statement& Statement::bind_optional(int index, const std::optional<std::string>& text) {
    return text ? bind(index, *text) : bind_null(index);
}

bool Statement::step() {
    int code = sqlite3_step(statement_);
    on_row_ = code == SQLITE_ROW;
    if (on_row_) return true;
    sqlite3_reset(statement_);
    if (code != SQLITE_DONE) fail(code);
    sqlite3_clear_bindings(statement_);
    return false;
}

void Statement::run() {
    while (step()) {
    }
}

bool Statement::is_null(int column) const {
    return sqlite3_column_type(statement_, column) == SQLITE_NULL;
}

int64_t Statement::integer(int column) const { return sqlite3_column_int64(statement_, column); }

std::string Statement::text(int column) const {
    const unsigned char* text = sqlite3_column_text(statement_, column);
    if (text == nullptr) return {};
    return {reinterpret_cast<const char*>(text),
            static_cast<size_t>(sqlite3_column_bytes(statement_, column))};
}

std::optional<std::string> Statement::optional_text(int column) const {
    if (is_null(column)) return std::nullopt;
    return text(column);
}

std::string Statement::blob(int column) const {
    const void* bytes = sqlite3_column_blob(statement_, column);
    if (bytes == nullptr) return {};
    return {static_cast<const char*>(bytes),
            static_cast<size_t>(sqlite3_column_bytes(statement_, column))};
}

Transaction::Transaction(Database& database) : database_(database) {
    database_.exec("BEGIN IMMEDIATE");
}

Transaction::~Transaction() {
    if (!open_) return;
    // A failed ROLLBACK (the transaction was already rolled back by SQLite) leaves nothing to undo.
    sqlite3_exec(database_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
    database_.exec("COMMIT");
    open_ = false;
}

}  // namespace magic_sync::replica
