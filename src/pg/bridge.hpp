// The bridge between C++ exceptions and PostgreSQL's ereport/longjmp error handling.
//
// Two rules keep the two worlds apart:
//   1. Every SQL-callable function is declared with MAGIC_SYNC_FUNCTION. Its body runs inside a
//      C++ try/catch; whatever escapes is copied into a plain struct, the exception is destroyed,
//      and only then is the error raised with ereport, from a frame that holds no C++ object.
//   2. Every call from C++ into PostgreSQL code that may ereport goes through pg::guard(). An
//      ereport inside it longjmps back to guard() (never through C++ frames), which restores the
//      caller's memory context, copies the error, clears the error state and throws pg::PgError,
//      so C++ destructors run as the exception unwinds.
// A lambda given to guard() must hold no object with a destructor: it is the one C++ frame a
// longjmp may cross. It must be noexcept too (a compile error otherwise): a C++ exception leaving
// it would skip PG_END_TRY and leave PG_exception_stack pointing into a frame that is gone.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
#include "utils/elog.h"
#include "utils/memutils.h"
}

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace magic_sync {

// An error meant for the client: a message, a SQLSTATE, and optionally a detail and a hint.
class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& message, int sqlstate = ERRCODE_INTERNAL_ERROR,
                   std::string detail = {}, std::string hint = {})
        : std::runtime_error(message),
          sqlstate_(sqlstate),
          detail_(std::move(detail)),
          hint_(std::move(hint)) {}

    int sqlstate() const { return sqlstate_; }
    const std::string& detail() const { return detail_; }
    const std::string& hint() const { return hint_; }

  private:
    int sqlstate_;
    std::string detail_;
    std::string hint_;
};

namespace pg {

// The objects a PostgreSQL error names (empty when it names none): a unique or foreign key
// violation names its constraint and table, a NOT NULL violation its column, a bad input its type.
struct ErrorObjects {
    std::string schema;
    std::string table;
    std::string column;
    std::string datatype;
    std::string constraint;
};

// A PostgreSQL error caught by guard(), carried through C++ as an exception. It keeps a copy of
// what the client needs (the ErrorData itself is freed at once: its memory context may not
// outlive the unwinding).
class PgError : public Error {
  public:
    PgError(const std::string& message, int sqlstate, std::string detail, std::string hint,
            std::string context, ErrorObjects objects)
        : Error(message, sqlstate, std::move(detail), std::move(hint)),
          context_(std::move(context)),
          objects_(std::move(objects)) {}

    const std::string& context() const { return context_; }
    const ErrorObjects& objects() const { return objects_; }

  private:
    std::string context_;
    ErrorObjects objects_;
};

// Whether an error is of the moment, not of the row or the upload being handled: the whole
// transaction fails and is tried again (the relay's next pass, the next retry, the device sending
// again); nothing is set aside for it. Every catch that keeps, sets aside or skips what failed
// rethrows such an error first. Catching a cancel and carrying on is wrong besides: the cancel is
// spent, and a statement_timeout is not armed again until the next statement from the client.
//   40  transaction rollback: serialization failure, deadlock (the standard says: try again).
//   53  insufficient resources: out of memory, disk full, too many connections.
//   57  operator intervention: query_canceled (statement_timeout, pg_cancel_backend),
//       admin and crash shutdown, cannot connect now, database dropped: the session ends or the
//       server is going away; none of it says anything about the row.
//   58  system error: I/O errors (58000, 58030), of the machine.
//   55P03 lock_not_available: lock_timeout, NOWAIT.
// Not transient, so set aside with the reason while the rest goes on: XX (internal error, data
// corrupted: a bug or a broken page, which a retry meets again); 58P01 and 58P02 (a file missing
// or in the way: a type's library not deployed, a relation's segment lost), which name what one
// table or type needs, not the moment; class 08, as the backend has no connection of its own and
// a trigger's (dblink, postgres_fdw) is the row's reason.
inline bool is_transient(int sqlstate) {
    switch (ERRCODE_TO_CATEGORY(sqlstate)) {
        case ERRCODE_TRANSACTION_ROLLBACK:
        case ERRCODE_INSUFFICIENT_RESOURCES:
        case ERRCODE_OPERATOR_INTERVENTION:
            return true;
        case ERRCODE_SYSTEM_ERROR:
            return sqlstate != ERRCODE_UNDEFINED_FILE && sqlstate != ERRCODE_DUPLICATE_FILE;
        default:
            return sqlstate == ERRCODE_LOCK_NOT_AVAILABLE;
    }
}

// Throws the PostgreSQL error that is being handled in a PG_CATCH block as a PgError, after
// switching back to `caller_context` and flushing the error state.
[[noreturn]] void throw_caught_error(MemoryContext caller_context);

// Runs `call` (PostgreSQL code that may ereport) and turns an ereport into a PgError.
template <typename Call>
auto guard(Call&& call) -> decltype(call()) {
    using Result = decltype(call());
    static_assert(noexcept(call()),
                  "a guarded call is noexcept: a C++ exception leaving PG_TRY would leave "
                  "PG_exception_stack pointing at a dead frame");
    static_assert(std::is_void_v<Result> || std::is_trivially_destructible_v<Result>,
                  "a guarded call returns a plain value: a longjmp cannot run destructors");
    if constexpr (std::is_void_v<Result>) {
        MemoryContext caller_context = CurrentMemoryContext;
        volatile bool failed = false;  // read after a longjmp
        PG_TRY();
        { call(); }
        PG_CATCH();
        { failed = true; }
        PG_END_TRY();
        if (failed) throw_caught_error(caller_context);
    } else {
        // The result lives outside the frame that calls sigsetjmp, so a longjmp cannot clobber it.
        Result result{};
        guard([&]() noexcept { result = call(); });
        return result;
    }
}

// What escaped a function body, in a form that needs no destructor.
struct Failure {
    enum class Kind { none, out_of_memory, error } kind = Kind::none;
    int sqlstate = 0;
    char message[2048];
    char detail[2048];
    char hint[1024];
    char context[1024];
    // What the error names (ErrorObjects), each an identifier.
    char schema[NAMEDATALEN];
    char table[NAMEDATALEN];
    char column[NAMEDATALEN];
    char datatype[NAMEDATALEN];
    char constraint[NAMEDATALEN];
};

using Body = Datum (*)(FunctionCallInfo);

// Runs `body`; on an exception fills `failure`, puts PostgreSQL's error stacks back as they were
// when the body began, and returns 0. Never lets an exception out.
Datum run_body(Body body, FunctionCallInfo fcinfo, Failure& failure) noexcept;

// Raises `failure` with ereport(ERROR). Called from a frame with no C++ objects.
[[noreturn]] void raise(const Failure& failure);

}  // namespace pg
}  // namespace magic_sync

// Declares a SQL-callable function `name` whose body follows as a C++ block.
#define MAGIC_SYNC_FUNCTION(name)                                                \
    static Datum name##_body(FunctionCallInfo fcinfo);                           \
    extern "C" {                                                                 \
    PG_FUNCTION_INFO_V1(name);                                                   \
    }                                                                            \
    extern "C" Datum name(PG_FUNCTION_ARGS) {                                    \
        ::magic_sync::pg::Failure failure;                                       \
        Datum result = ::magic_sync::pg::run_body(name##_body, fcinfo, failure); \
        if (failure.kind != ::magic_sync::pg::Failure::Kind::none)               \
            ::magic_sync::pg::raise(failure);                                    \
        return result;                                                           \
    }                                                                            \
    static Datum name##_body([[maybe_unused]] FunctionCallInfo fcinfo)
