// SQL through SPI, from C++: every call guarded, so a PostgreSQL error arrives as pg::PgError.
// Statements are planned once per backend and kept (keyed by their text), because the relay runs
// the same few dozen statements on every pass.
//
// Parameters and results travel as text: a parameter is NULL or a string that the statement
// casts ($1::bigint); a result cell is NULL or its text output.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace magic_sync::pg {

using Value = std::optional<std::string>;
using Row = std::vector<Value>;

// A session with SPI: connects on construction; finish() disconnects. When an exception leaves
// the scope without finish(), the transaction's abort cleans up the connection.
class Spi {
  public:
    Spi();
    Spi(const Spi&) = delete;
    Spi& operator=(const Spi&) = delete;
    void finish();

    // Runs a statement; returns the number of rows it processed.
    uint64_t execute(const std::string& sql, const std::vector<Value>& params = {});
    // Runs a query; returns its rows.
    std::vector<Row> query(const std::string& sql, const std::vector<Value>& params = {});
    // The single value of a query that returns one row and one column (NULL: no row).
    Value scalar(const std::string& sql, const std::vector<Value>& params = {});

  private:
    bool connected_ = false;
};

// Runs `work` in a subtransaction: committed when it returns, rolled back (and the exception
// rethrown) when it throws.
void subtransaction(const std::function<void()>& work);

// Quotes an identifier for SQL (quote_identifier).
std::string quote_identifier(const std::string& name);
// Quotes a literal for SQL (quote_literal).
std::string quote_literal(const std::string& text);

}  // namespace magic_sync::pg
