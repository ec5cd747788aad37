#include "pg/bridge.hpp"

#include <cstring>
#include <new>

namespace magic_sync::pg {

namespace {

void copy_text(char* target, size_t size, const char* source) {
    if (source == nullptr) source = "";
    strlcpy(target, source, size);
}

void fill(Failure& failure, int sqlstate, const char* message, const char* detail, const char* hint,
          const char* context) {
    failure.kind = Failure::Kind::error;
    failure.sqlstate = sqlstate;
    copy_text(failure.message, sizeof failure.message, message);
    copy_text(failure.detail, sizeof failure.detail, detail);
    copy_text(failure.hint, sizeof failure.hint, hint);
    copy_text(failure.context, sizeof failure.context, context);
    failure.schema[0] = failure.table[0] = failure.column[0] = failure.datatype[0] =
        failure.constraint[0] = '\0';
}

void fill_objects(Failure& failure, const ErrorObjects& objects) {
    copy_text(failure.schema, sizeof failure.schema, objects.schema.c_str());
    copy_text(failure.table, sizeof failure.table, objects.table.c_str());
    copy_text(failure.column, sizeof failure.column, objects.column.c_str());
    copy_text(failure.datatype, sizeof failure.datatype, objects.datatype.c_str());
    copy_text(failure.constraint, sizeof failure.constraint, objects.constraint.c_str());
}

// Names `text` as the error's field `field` (PG_DIAG_*), when there is one.
int name_object(int field, const char* text) {
    return text[0] != '\0' ? err_generic_string(field, text) : 0;
}

}  // namespace

void throw_caught_error(MemoryContext caller_context) {
    MemoryContextSwitchTo(caller_context);
    ErrorData* data = CopyErrorData();
    FlushErrorState();
    auto text = [](const char* s) { return std::string(s == nullptr ? "" : s); };
    PgError error(text(data->message), data->sqlerrcode, text(data->detail), text(data->hint),
                  text(data->context),
                  {text(data->schema_name), text(data->table_name), text(data->column_name),
                   text(data->datatype_name), text(data->constraint_name)});
    FreeErrorData(data);
    throw error;
}

Datum run_body(Body body, FunctionCallInfo fcinfo, Failure& failure) noexcept {
    // What the error stacks were when the body began: an exception leaves every frame the body
    // made, so none of them can be the target of the error raised next.
    sigjmp_buf* const exception_stack = PG_exception_stack;
    ErrorContextCallback* const context_stack = error_context_stack;
    try {
        return body(fcinfo);
    } catch (const PgError& e) {
        fill(failure, e.sqlstate(), e.what(), e.detail().c_str(), e.hint().c_str(),
             e.context().c_str());
        fill_objects(failure, e.objects());
    } catch (const Error& e) {
        fill(failure, e.sqlstate(), e.what(), e.detail().c_str(), e.hint().c_str(), nullptr);
    } catch (const std::bad_alloc&) {
        failure.kind = Failure::Kind::out_of_memory;
    } catch (const std::exception& e) {
        fill(failure, ERRCODE_INTERNAL_ERROR, e.what(), nullptr, nullptr, nullptr);
    } catch (...) {
        fill(failure, ERRCODE_INTERNAL_ERROR, "unknown C++ exception", nullptr, nullptr, nullptr);
    }
    PG_exception_stack = exception_stack;
    error_context_stack = context_stack;
    return Datum(0);
}

void raise(const Failure& failure) {
    if (failure.kind == Failure::Kind::out_of_memory)
        ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory"),
                        errdetail("A C++ allocation in magic_sync failed.")));
    ereport(ERROR, (errcode(failure.sqlstate), errmsg_internal("%s", failure.message),
                    failure.detail[0] ? errdetail_internal("%s", failure.detail) : 0,
                    failure.hint[0] ? errhint("%s", failure.hint) : 0,
                    failure.context[0] ? errcontext("%s", failure.context) : 0,
                    name_object(PG_DIAG_SCHEMA_NAME, failure.schema),
                    name_object(PG_DIAG_TABLE_NAME, failure.table),
                    name_object(PG_DIAG_COLUMN_NAME, failure.column),
                    name_object(PG_DIAG_DATATYPE_NAME, failure.datatype),
                    name_object(PG_DIAG_CONSTRAINT_NAME, failure.constraint)));
    pg_unreachable();
}

}  // namespace magic_sync::pg
