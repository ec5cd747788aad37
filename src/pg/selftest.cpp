// Functions that prove the error bridge works: the regress test `bridge` binds them to SQL
// (they are not part of the extension's SQL surface).
#include <cstdint>
#include <new>
#include <optional>
#include <string>

#include "pg/bridge.hpp"
#include "pg/spi.hpp"
#include "pg/values.hpp"

namespace {

// Counts its destructions, to prove a PostgreSQL error unwinds through C++ frames.
struct Counted {
    explicit Counted(int& destroyed) : destroyed_(destroyed) {}
    ~Counted() { ++destroyed_; }
    int& destroyed_;
};

void raise_division_by_zero() {
    ereport(ERROR, (errcode(ERRCODE_DIVISION_BY_ZERO), errmsg("division by zero"),
                    errdetail("raised inside a guarded call")));
}

}  // namespace

MAGIC_SYNC_FUNCTION(magic_sync_selftest_throw) {
    throw magic_sync::Error(magic_sync::pg::text_arg(fcinfo, 0), ERRCODE_DATA_EXCEPTION,
                            "thrown as a C++ exception", "nothing to fix: this is a self-test");
}

MAGIC_SYNC_FUNCTION(magic_sync_selftest_throw_std) {
    throw std::logic_error(magic_sync::pg::text_arg(fcinfo, 0));
}

MAGIC_SYNC_FUNCTION(magic_sync_selftest_bad_alloc) { throw std::bad_alloc(); }

MAGIC_SYNC_FUNCTION(magic_sync_selftest_guarded_error) {
    int destroyed = 0;
    std::string outcome;
    sigjmp_buf* const error_stack = PG_exception_stack;
    try {
        Counted outer(destroyed);
        {
            Counted middle(destroyed);
            Counted inner(destroyed);
            magic_sync::pg::guard([]() noexcept { raise_division_by_zero(); });
        }
    } catch (const magic_sync::pg::PgError& e) {
        outcome = std::string("caught ") + unpack_sql_state(e.sqlstate()) + ": " + e.what() + " (" +
                  e.detail() + "), destructors run: " + std::to_string(destroyed) +
                  ", error stack restored: " + (PG_exception_stack == error_stack ? "yes" : "no");
    }
    return magic_sync::pg::text_datum(outcome);
}

MAGIC_SYNC_FUNCTION(magic_sync_selftest_guarded_error_escapes) {
    int destroyed = 0;
    Counted held(destroyed);
    magic_sync::pg::guard([]() noexcept { raise_division_by_zero(); });
    return magic_sync::pg::text_datum("not reached");
}

// The first cell of `query` read as `as` ('flag', 'integer', 'bytes', 'elements' or 'integers'),
// in text: how the C++ side reads a result cell by its column's type. Bytes are written in hex,
// elements each in brackets.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_read_cell) {
    const std::string query = magic_sync::pg::text_arg(fcinfo, 0);
    const std::string as = magic_sync::pg::text_arg(fcinfo, 1);
    magic_sync::pg::Spi spi;
    const magic_sync::pg::Value cell = spi.query(query).at(0).at(0);
    std::string read;
    if (as == "flag") {
        read = cell.flag_or(false) ? "true" : "false";
    } else if (as == "integer") {
        read = std::to_string(cell.integer());
    } else if (as == "bytes") {
        static const char digits[] = "0123456789abcdef";
        for (unsigned char byte : cell.bytes()) read += {digits[byte >> 4], digits[byte & 15]};
        read = std::to_string(cell.bytes().size()) + " bytes: " + read;
    } else if (as == "elements") {
        for (const auto& element : cell.elements()) read += "[" + element.value_or("NULL") + "]";
    } else if (as == "integers") {
        for (int64_t integer : cell.integers()) read += "[" + std::to_string(integer) + "]";
    } else {
        throw magic_sync::Error(
            "read as 'flag', 'integer', 'bytes', 'elements' or 'integers', not " + as);
    }
    spi.finish();
    return magic_sync::pg::text_datum(read);
}

// The cell of column `name` in the first row of `query`, in text.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_read_column) {
    const std::string query = magic_sync::pg::text_arg(fcinfo, 0);
    const std::string name = magic_sync::pg::text_arg(fcinfo, 1);
    magic_sync::pg::Spi spi;
    const magic_sync::pg::Value cell = spi.query(query).at(0)[name];
    spi.finish();
    return magic_sync::pg::text_datum(cell.value_or("NULL"));
}

// A parameter of kind `kind` ('jsonb', 'text[]', 'bigint[]' or 'bytea') bound to a statement,
// which says the type it received and the value's text.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_bound) {
    const std::string kind = magic_sync::pg::text_arg(fcinfo, 0);
    std::optional<magic_sync::pg::Param> param;
    if (kind == "jsonb")
        param = magic_sync::pg::Param::jsonb(std::string(R"({"b": 1, "a": [true, "x"]})"));
    else if (kind == "text[]")
        param = magic_sync::pg::Param::text_array({"a", "b c", "{", "\"q\"", ""});
    else if (kind == "bigint[]")
        param = magic_sync::pg::Param::bigint_array({1, -2, INT64_MAX});
    else if (kind == "bytea")
        param = magic_sync::pg::Param::bytea(std::string("\0\xff", 2));
    else
        throw magic_sync::Error("bind 'jsonb', 'text[]', 'bigint[]' or 'bytea', not " + kind);
    magic_sync::pg::Spi spi;
    const magic_sync::pg::Value bound =
        spi.scalar("SELECT pg_typeof($1)::text || ' ' || $1::text", {*param});
    spi.finish();
    return magic_sync::pg::text_datum(bound.value_or("NULL"));
}

// Throws a C++ exception out of a PG_TRY block, as guard() no longer lets a call do: the body's
// bridge puts PG_exception_stack back, so the ERROR it raises does not jump into the dead frame.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_throw_inside_pg_try) {
    PG_TRY();
    { throw magic_sync::Error("thrown inside PG_TRY", ERRCODE_DATA_EXCEPTION); }
    PG_CATCH();
    { PG_RE_THROW(); }
    PG_END_TRY();
    return magic_sync::pg::text_datum("not reached");
}

// Runs `statement` through SPI, in a subtransaction, and says what objects the PostgreSQL error it
// raises names, as C++ sees them on the PgError.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_error_objects) {
    const std::string statement = magic_sync::pg::text_arg(fcinfo, 0);
    magic_sync::pg::Spi spi;
    std::string named = "no error";
    try {
        magic_sync::pg::subtransaction([&] { spi.execute(statement); });
    } catch (const magic_sync::pg::PgError& e) {
        const magic_sync::pg::ErrorObjects& objects = e.objects();
        named = "schema: " + objects.schema + ", table: " + objects.table +
                ", column: " + objects.column + ", datatype: " + objects.datatype +
                ", constraint: " + objects.constraint;
    }
    spi.finish();
    return magic_sync::pg::text_datum(named);
}

// Runs `statement` through SPI; its error escapes through the bridge to the caller.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_run) {
    const std::string statement = magic_sync::pg::text_arg(fcinfo, 0);
    magic_sync::pg::Spi spi;
    spi.execute(statement);
    spi.finish();
    PG_RETURN_VOID();
}

// selftest.is_transient(sqlstate text) → boolean: pg::is_transient of a five-character SQLSTATE.
MAGIC_SYNC_FUNCTION(magic_sync_selftest_is_transient) {
    const std::string code = magic_sync::pg::text_arg(fcinfo, 0);
    if (code.size() != 5) throw magic_sync::Error("a SQLSTATE has five characters");
    return BoolGetDatum(
        magic_sync::pg::is_transient(MAKE_SQLSTATE(code[0], code[1], code[2], code[3], code[4])));
}
