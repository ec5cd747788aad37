#include "pg/spi.hpp"

#include "pg/bridge.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/resowner.h"
}

#include <cstring>
#include <unordered_map>

namespace magic_sync::pg {

namespace {

// Plans kept for the backend's life, by statement text.
std::unordered_map<std::string, SPIPlanPtr>& kept_plans() {
    static std::unordered_map<std::string, SPIPlanPtr> plans;
    return plans;
}

SPIPlanPtr plan_for(const std::string& sql, int nargs) {
    auto& plans = kept_plans();
    auto found = plans.find(sql);
    if (found != plans.end()) return found->second;
    SPIPlanPtr plan = guard([&] {
        Oid types[FUNC_MAX_ARGS];
        for (int i = 0; i < nargs; ++i) types[i] = TEXTOID;
        SPIPlanPtr prepared = SPI_prepare(sql.c_str(), nargs, types);
        if (prepared == nullptr)
            elog(ERROR, "magic_sync: could not plan a statement: %s",
                 SPI_result_code_string(SPI_result));
        SPI_keepplan(prepared);
        return prepared;
    });
    plans.emplace(sql, plan);
    return plan;
}

// Runs a kept plan; the result is in SPI_tuptable. Returns SPI_processed.
uint64_t run(const std::string& sql, const std::vector<Value>& params, bool read_only) {
    if (params.size() > FUNC_MAX_ARGS) throw Error("magic_sync: too many parameters");
    SPIPlanPtr plan = plan_for(sql, static_cast<int>(params.size()));
    Datum values[FUNC_MAX_ARGS];
    char nulls[FUNC_MAX_ARGS];
    for (size_t i = 0; i < params.size(); ++i) {
        nulls[i] = params[i] ? ' ' : 'n';
        values[i] = params[i] ? guard([&] {
            return PointerGetDatum(
                cstring_to_text_with_len(params[i]->data(), static_cast<int>(params[i]->size())));
        })
                              : Datum(0);
    }
    return guard([&] {
        int result = SPI_execute_plan(plan, values, nulls, read_only, 0);
        if (result < 0)
            elog(ERROR, "magic_sync: statement failed: %s", SPI_result_code_string(result));
        return static_cast<uint64_t>(SPI_processed);
    });
}

}  // namespace

Spi::Spi() {
    guard([] {
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "magic_sync: SPI_connect failed");
    });
    connected_ = true;
}

void Spi::finish() {
    if (!connected_) return;
    connected_ = false;
    guard([] { SPI_finish(); });
}

uint64_t Spi::execute(const std::string& sql, const std::vector<Value>& params) {
    return run(sql, params, false);
}

std::vector<Row> Spi::query(const std::string& sql, const std::vector<Value>& params) {
    uint64_t count = run(sql, params, false);
    std::vector<Row> rows;
    if (SPI_tuptable == nullptr) return rows;
    rows.reserve(count);
    TupleDesc descriptor = SPI_tuptable->tupdesc;
    for (uint64_t r = 0; r < count; ++r) {
        HeapTuple tuple = SPI_tuptable->vals[r];
        Row row;
        row.reserve(descriptor->natts);
        for (int c = 1; c <= descriptor->natts; ++c) {
            char* text = guard([&] { return SPI_getvalue(tuple, descriptor, c); });
            if (text == nullptr) {
                row.emplace_back(std::nullopt);
            } else {
                row.emplace_back(std::string(text));
                pfree(text);
            }
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

Value Spi::scalar(const std::string& sql, const std::vector<Value>& params) {
    auto rows = query(sql, params);
    if (rows.empty() || rows.front().empty()) return std::nullopt;
    return rows.front().front();
}

void subtransaction(const std::function<void()>& work) {
    MemoryContext caller_context = CurrentMemoryContext;
    ResourceOwner caller_owner = CurrentResourceOwner;
    guard([] { BeginInternalSubTransaction(nullptr); });
    try {
        work();
    } catch (...) {
        guard([&] {
            RollbackAndReleaseCurrentSubTransaction();
            MemoryContextSwitchTo(caller_context);
            CurrentResourceOwner = caller_owner;
        });
        throw;
    }
    guard([&] {
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
    });
}

std::string quote_identifier(const std::string& name) {
    return guard([&] { return ::quote_identifier(name.c_str()); });
}

std::string quote_literal(const std::string& text) {
    char* quoted = guard([&] { return quote_literal_cstr(text.c_str()); });
    std::string result(quoted);
    guard([&] { pfree(quoted); });
    return result;
}

}  // namespace magic_sync::pg
