// SQL through SPI, from C++: every call guarded, so a PostgreSQL error arrives as pg::PgError.
// A statement written in the code (a string literal, or a constant the code holds) is planned
// once per backend and kept, keyed by its text: the relay runs the same few dozen on every pass.
// A statement built at run time (filing's insert for an upload's columns, a hook's call) is kept
// among the most recently used few only: one plan per upload shape, kept forever, grew a filing
// backend without bound.
//
// A parameter is bound with its own type (text, bigint, boolean, bytea, uuid, jsonb, text[],
// bigint[]): a value reaches the statement as itself, not as text it casts. A result cell is NULL
// or its text output, and is read as itself from the datum when its column is a boolean, an
// integer, bytea (its bytes), text[] or an integer array (their elements). A row finds its cells
// by position or by their column's name.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace magic_sync::pg {

// A result cell: NULL or its text output (for a bytea column, its bytes), and for a boolean, an
// integer or an array column its value read from the datum. Reading a cell as a type its column
// does not have is an error (Error).
class Value : public std::optional<std::string> {
  public:
    enum class Type { kOther, kBoolean, kInteger, kBytea, kTextArray, kIntegerArray };

    using std::optional<std::string>::optional;
    Value(std::optional<std::string> text) : std::optional<std::string>(std::move(text)) {}
    static Value boolean(bool value) { return Value(value ? "t" : "f", Type::kBoolean, value); }
    static Value integer(int64_t value) {
        return Value(std::to_string(value), Type::kInteger, value);
    }
    static Value bytea(std::string bytes) { return Value(std::move(bytes), Type::kBytea, 0); }
    // A text[] cell: its text output and its elements (NULL ones none).
    static Value text_array(std::string text, std::vector<std::optional<std::string>> elements) {
        Value value(std::move(text), Type::kTextArray, 0);
        value.elements_ = std::move(elements);
        return value;
    }
    // An integer array cell: its text output and its elements.
    static Value integer_array(std::string text, std::vector<int64_t> integers) {
        Value value(std::move(text), Type::kIntegerArray, 0);
        value.integers_ = std::move(integers);
        return value;
    }

    Type type() const { return type_; }
    // A boolean column's value; `if_null` when the cell is NULL.
    bool flag_or(bool if_null) const;
    // An integer column's value; `if_null` when the cell is NULL.
    int64_t integer_or(int64_t if_null) const;
    // An integer column's value, which must not be NULL.
    int64_t integer() const;
    // A bytea column's bytes, which must not be NULL.
    const std::string& bytes() const;
    // A text[] column's elements (none when the cell is NULL).
    const std::vector<std::optional<std::string>>& elements() const;
    // A text[] column's elements, none of which may be NULL (none when the cell is NULL).
    std::vector<std::string> texts() const;
    // An integer array column's elements (none when the cell is NULL).
    const std::vector<int64_t>& integers() const;

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
    std::vector<std::optional<std::string>> elements_;
    std::vector<int64_t> integers_;
};

// A result row: its cells in column order, each found by position or by its column's name.
class Row : public std::vector<Value> {
  public:
    using Names = std::shared_ptr<const std::vector<std::string>>;

    Row() = default;
    Row(std::vector<Value> cells, Names names)
        : std::vector<Value>(std::move(cells)), names_(std::move(names)) {}

    using std::vector<Value>::operator[];
    // The cell of the column named `name`; a name the result does not have is an error.
    const Value& operator[](std::string_view name) const;

  private:
    Names names_;
};

// A statement's parameter: NULL, text, a bigint, a boolean, bytea, a uuid, jsonb, text[] or
// bigint[]. Text by default; integers and flags by their C++ type; the others by name. A result
// cell binds as text, but a bytea cell as its bytes.
class Param {
  public:
    enum class Type { kText, kBigint, kBoolean, kBytea, kUuid, kJsonb, kTextArray, kBigintArray };

    Param(std::nullopt_t) : null_(true) {}
    Param(const char* text) : text_(text) {}
    Param(std::string text) : text_(std::move(text)) {}
    Param(const Value& cell)
        : type_(cell.type() == Value::Type::kBytea ? Type::kBytea : Type::kText),
          null_(!cell),
          text_(cell.value_or("")) {}
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
    // JSON text (none: NULL), bound as jsonb; text that is not JSON is an error when the
    // statement runs.
    static Param jsonb(const Value& json) {
        Param param(Type::kJsonb, json.value_or(""));
        param.null_ = !json;
        return param;
    }
    static Param text_array(std::vector<std::string> elements) {
        Param param(Type::kTextArray, "");
        param.texts_ = std::move(elements);
        return param;
    }
    static Param bigint_array(std::vector<int64_t> elements) {
        Param param(Type::kBigintArray, "");
        param.integers_ = std::move(elements);
        return param;
    }

    Type type() const { return type_; }
    bool is_null() const { return null_; }
    const std::string& text() const { return text_; }
    int64_t integer() const { return integer_; }
    const std::vector<std::string>& texts() const { return texts_; }
    const std::vector<int64_t>& integers() const { return integers_; }

  private:
    Param(Type type, std::string text) : type_(type), text_(std::move(text)) {}

    Type type_ = Type::kText;
    bool null_ = false;
    std::string text_;
    int64_t integer_ = 0;
    std::vector<std::string> texts_;
    std::vector<int64_t> integers_;
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
