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
// longjmp may cross.
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

// A PostgreSQL error caught by guard(), carried through C++ as an exception. It keeps a copy of
// what the client needs (the ErrorData itself is freed at once: its memory context may not
// outlive the unwinding).
class PgError : public Error {
  public:
    PgError(const std::string& message, int sqlstate, std::string detail, std::string hint,
            std::string context)
        : Error(message, sqlstate, std::move(detail), std::move(hint)),
          context_(std::move(context)) {}

    const std::string& context() const { return context_; }

  private:
    std::string context_;
};

// Throws the PostgreSQL error that is being handled in a PG_CATCH block as a PgError, after
// switching back to `caller_context` and flushing the error state.
[[noreturn]] void throw_caught_error(MemoryContext caller_context);

// Runs `call` (PostgreSQL code that may ereport) and turns an ereport into a PgError.
template <typename Call>
auto guard(Call&& call) -> decltype(call()) {
    using Result = decltype(call());
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
        guard([&] { result = call(); });
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
};

using Body = Datum (*)(FunctionCallInfo);

// Runs `body`; on an exception fills `failure` and returns 0. Never lets an exception out.
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
