// SQL through SPI, from C++: every call guarded, so a PostgreSQL error arrives as pg::PgError.
// A statement written in the code (a string literal) is planned once per backend and kept, keyed
// by its text: the relay runs the same few dozen on every pass. A statement built at run time
// (filing's insert for an upload's columns, a hook's call) is kept among the most recently used
// few only: one plan per upload shape, kept forever, grew a filing backend without bound.
//
// A parameter is bound with its own type (text, bigint, boolean, bytea, uuid): an integer or a
// flag reaches the statement as itself, not as text it casts. A result cell is NULL or its text
// output; a boolean or integer cell is read as itself too (flag_or, integer_or).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace magic_sync::pg {

// A result cell: NULL or its text output, and for a boolean or integer column its value read
// from the datum. Reading a cell as a type its column does not have is an error (Error).
class Value : public std::optional<std::string> {
  public:
    enum class Type { kOther, kBoolean, kInteger };

    using std::optional<std::string>::optional;
    Value(std::optional<std::string> text) : std::optional<std::string>(std::move(text)) {}
    static Value boolean(bool value) { return Value(value ? "t" : "f", Type::kBoolean, value); }
    static Value integer(int64_t value) {
        return Value(std::to_string(value), Type::kInteger, value);
    }

    // A boolean column's value; `if_null` when the cell is NULL.
    bool flag_or(bool if_null) const;
    // An integer column's value; `if_null` when the cell is NULL.
    int64_t integer_or(int64_t if_null) const;
    // An integer column's value, which must not be NULL.
    int64_t integer() const;

    // Two cells are equal when their texts are (or both are NULL).
    friend bool operator==(const Value& a, const Value& b) { return a.text() == b.text(); }
    friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

  private:
    Value(std::string text, Type type, int64_t number)
        : std::optional<std::string>(std::move(text)), type_(type), number_(number) {}
    void expect(Type type, const char* name) const;
    const std::optional<std::string>& text() const { return *this; }

    Type type_ = Type::kOther;
    int64_t number_ = 0;
};
using Row = std::vector<Value>;

// A statement's parameter: NULL, text, a bigint, a boolean, bytea or a uuid. Text by default;
// integers and flags by their C++ type; bytea and uuid by name.
class Param {
  public:
    enum class Type { kText, kBigint, kBoolean, kBytea, kUuid };

    Param(std::nullopt_t) : null_(true) {}
    Param(const char* text) : text_(text) {}
    Param(std::string text) : text_(std::move(text)) {}
    Param(const Value& text) : null_(!text), text_(text.value_or("")) {}
    Param(int value) : Param(static_cast<int64_t>(value)) {}
    Param(int64_t value) : type_(Type::kBigint), integer_(value) {}
    Param(bool value) : type_(Type::kBoolean), integer_(value) {}
    static Param bytea(std::string bytes) { return Param(Type::kBytea, std::move(bytes)); }
    // A uuid in its text form (none: NULL); one that is not a uuid is an error when the statement
    // runs.
    static Param uuid(const Value& text) {
        Param param(Type::kUuid, text.value_or(""));
        param.null_ = !text;
        return param;
    }

    Type type() const { return type_; }
    bool is_null() const { return null_; }
    const std::string& text() const { return text_; }
    int64_t integer() const { return integer_; }

  private:
    Param(Type type, std::string text) : type_(type), text_(std::move(text)) {}

    Type type_ = Type::kText;
    bool null_ = false;
    std::string text_;
    int64_t integer_ = 0;
};

// A statement's text, and whether it is fixed (written in the code: a string literal, or a
// constant the code holds) or built at run time (a std::string). Never pass the c_str() of a built
// statement: it would be kept as if fixed.
class Sql {
  public:
    Sql(const char* fixed) : text_(fixed), fixed_(true) {}
    Sql(std::string built) : text_(std::move(built)), fixed_(false) {}

    const std::string& text() const { return text_; }
    bool fixed() const { return fixed_; }

  private:
    std::string text_;
    bool fixed_;
};

// How many plans of statements built at run time a backend keeps, the least recently used
// dropped first.
constexpr size_t kBuiltPlansKept = 64;

// A session with SPI: connects on construction; finish() disconnects. When an exception leaves
// the scope without finish(), the transaction's abort cleans up the connection.
class Spi {
  public:
    Spi();
    Spi(const Spi&) = delete;
    Spi& operator=(const Spi&) = delete;
    void finish();

    // Runs a statement; returns the number of rows it processed.
    uint64_t execute(const Sql& sql, const std::vector<Param>& params = {});
    // Runs a query; returns its rows.
    std::vector<Row> query(const Sql& sql, const std::vector<Param>& params = {});
    // The single value of a query that returns one row and one column (NULL: no row).
    Value scalar(const Sql& sql, const std::vector<Param>& params = {});
    // The boolean of a query that returns one row and one boolean column (false: no row, or
    // NULL).
    bool flag(const Sql& sql, const std::vector<Param>& params = {});

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
