#include "pg/spi.hpp"

#include "pg/bridge.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
}

#include <cstring>
#include <list>
#include <unordered_map>

namespace magic_sync::pg {

namespace {

Oid type_oid(Param::Type type) {
    switch (type) {
        case Param::Type::kBigint:
            return INT8OID;
        case Param::Type::kBoolean:
            return BOOLOID;
        case Param::Type::kBytea:
            return BYTEAOID;
        case Param::Type::kUuid:
            return UUIDOID;
        case Param::Type::kJsonb:
            return JSONBOID;
        case Param::Type::kTextArray:
            return TEXTARRAYOID;
        case Param::Type::kBigintArray:
            return INT8ARRAYOID;
        case Param::Type::kText:
            break;
    }
    return TEXTOID;
}

// A statement's plan, kept in CacheMemoryContext (SPI_keepplan) until it is freed.
SPIPlanPtr prepare(const std::string& sql, const std::vector<Param>& params) {
    return guard([&]() noexcept {
        Oid types[FUNC_MAX_ARGS];
        for (size_t i = 0; i < params.size(); ++i) types[i] = type_oid(params[i].type());
        SPIPlanPtr prepared = SPI_prepare(sql.c_str(), static_cast<int>(params.size()), types);
        if (prepared == nullptr)
            elog(ERROR, "magic_sync: could not plan a statement: %s",
                 SPI_result_code_string(SPI_result));
        SPI_keepplan(prepared);
        return prepared;
    });
}

// The plans of a backend, by statement text and parameter types: every fixed statement's for the
// backend's life, the kBuiltPlansKept most recently used built statements'. A built plan that is
// running (a statement that runs another through a function or a trigger) is not freed under it.
class Plans {
  public:
    // A plan in use: a built one is not freed until release().
    struct InUse {
        SPIPlanPtr plan;
        int* running;  // of a built plan; none for a fixed one
    };

    InUse use(const Sql& sql, const std::vector<Param>& params) {
        std::string key = sql.text();
        for (const Param& param : params)
            key += static_cast<char>('0' + static_cast<int>(param.type()));
        if (sql.fixed()) {
            auto found = fixed_.find(key);
            if (found != fixed_.end()) return {found->second, nullptr};
            SPIPlanPtr plan = prepare(sql.text(), params);
            fixed_.emplace(std::move(key), plan);
            return {plan, nullptr};
        }
        auto found = built_.find(key);
        if (found != built_.end()) {
            recent_.splice(recent_.begin(), recent_, found->second);
            ++recent_.front().running;
        } else {
            SPIPlanPtr plan = prepare(sql.text(), params);
            auto inserted = built_.emplace(std::move(key), recent_.end()).first;
            recent_.push_front({plan, 1, &inserted->first});
            inserted->second = recent_.begin();
            drop_least_recent();
        }
        return {recent_.front().plan, &recent_.front().running};
    }

    static void release(const InUse& use) {
        if (use.running != nullptr) --*use.running;
    }

  private:
    struct Built {
        SPIPlanPtr plan;
        int running;
        const std::string* key;  // its key in built_
    };

    void drop_least_recent() {
        auto candidate = recent_.end();
        while (built_.size() > kBuiltPlansKept && candidate != recent_.begin()) {
            --candidate;
            if (candidate->running > 0) continue;
            SPIPlanPtr plan = candidate->plan;
            built_.erase(built_.find(*candidate->key));
            candidate = recent_.erase(candidate);
            guard([plan]() noexcept { SPI_freeplan(plan); });
        }
    }

    std::unordered_map<std::string, SPIPlanPtr> fixed_;
    std::list<Built> recent_;  // most recently used first
    std::unordered_map<std::string, std::list<Built>::iterator> built_;
};

Plans& plans() {
    static Plans kept;
    return kept;
}

Datum datum_of(const Param& param) {
    switch (param.type()) {
        case Param::Type::kBigint:
            return Int64GetDatum(param.integer());
        case Param::Type::kBoolean:
            return BoolGetDatum(param.integer() != 0);
        case Param::Type::kUuid:
            return guard([&]() noexcept {
                return DirectFunctionCall1(uuid_in, CStringGetDatum(param.text().c_str()));
            });
        case Param::Type::kJsonb:
            return guard([&]() noexcept {
                return DirectFunctionCall1(jsonb_in, CStringGetDatum(param.text().c_str()));
            });
        case Param::Type::kTextArray:
            return guard([&]() noexcept {
                const std::vector<std::string>& texts = param.texts();
                Datum* elements = static_cast<Datum*>(palloc(sizeof(Datum) * (texts.size() + 1)));
                for (size_t i = 0; i < texts.size(); ++i)
                    elements[i] = PointerGetDatum(cstring_to_text_with_len(
                        texts[i].data(), static_cast<int>(texts[i].size())));
                return PointerGetDatum(construct_array(elements, static_cast<int>(texts.size()),
                                                       TEXTOID, -1, false, TYPALIGN_INT));
            });
        case Param::Type::kBigintArray:
            return guard([&]() noexcept {
                const std::vector<int64_t>& integers = param.integers();
                Datum* elements =
                    static_cast<Datum*>(palloc(sizeof(Datum) * (integers.size() + 1)));
                for (size_t i = 0; i < integers.size(); ++i)
                    elements[i] = Int64GetDatum(integers[i]);
                return PointerGetDatum(construct_array(elements, static_cast<int>(integers.size()),
                                                       INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
                                                       TYPALIGN_DOUBLE));
            });
        case Param::Type::kText:
        case Param::Type::kBytea:
            break;
    }
    // text and bytea are both a varlena of the bytes.
    return guard([&]() noexcept {
        return PointerGetDatum(
            cstring_to_text_with_len(param.text().data(), static_cast<int>(param.text().size())));
    });
}

// Runs a statement; the result is in SPI_tuptable. Returns SPI_processed.
uint64_t run(const Sql& sql, const std::vector<Param>& params, bool read_only) {
    if (params.size() > FUNC_MAX_ARGS) throw Error("magic_sync: too many parameters");
    Datum values[FUNC_MAX_ARGS];
    char nulls[FUNC_MAX_ARGS];
    for (size_t i = 0; i < params.size(); ++i) {
        nulls[i] = params[i].is_null() ? 'n' : ' ';
        values[i] = params[i].is_null() ? Datum(0) : datum_of(params[i]);
    }
    const Plans::InUse plan = plans().use(sql, params);
    uint64_t processed = 0;
    try {
        processed = guard([&]() noexcept {
            int result = SPI_execute_plan(plan.plan, values, nulls, read_only, 0);
            if (result < 0)
                elog(ERROR, "magic_sync: statement failed: %s", SPI_result_code_string(result));
            return static_cast<uint64_t>(SPI_processed);
        });
    } catch (...) {
        Plans::release(plan);
        throw;
    }
    Plans::release(plan);
    return processed;
}

// The text output of `datum`, of type `type`.
std::string output_of(Datum datum, Oid type) {
    char* text = guard([&]() noexcept {
        Oid output = InvalidOid;
        bool is_varlena = false;
        getTypeOutputInfo(type, &output, &is_varlena);
        return OidOutputFunctionCall(output, datum);
    });
    std::string value(text);
    guard([&]() noexcept { pfree(text); });
    return value;
}

// The elements of the array `datum`, of element type `element` (text or an integer type).
void deconstruct(Datum datum, Oid element, Datum** elements, bool** nulls, int* count) {
    guard([&]() noexcept {
        int16 length = 0;
        bool by_value = false;
        char align = 0;
        get_typlenbyvalalign(element, &length, &by_value, &align);
        deconstruct_array(DatumGetArrayTypeP(datum), element, length, by_value, align, elements,
                          nulls, count);
    });
}

Value text_array_cell(Datum datum) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct(datum, TEXTOID, &elements, &nulls, &count);
    std::vector<std::optional<std::string>> texts;
    texts.reserve(count);
    for (int i = 0; i < count; ++i) {
        if (nulls[i]) {
            texts.emplace_back(std::nullopt);
            continue;
        }
        auto* text = reinterpret_cast<struct varlena*>(DatumGetPointer(elements[i]));
        texts.emplace_back(std::string(VARDATA_ANY(text), VARSIZE_ANY_EXHDR(text)));
    }
    return Value::text_array(output_of(datum, TEXTARRAYOID), std::move(texts));
}

Value integer_array_cell(Datum datum, Oid array_type, Oid element) {
    Datum* elements = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct(datum, element, &elements, &nulls, &count);
    std::vector<int64_t> integers;
    integers.reserve(count);
    for (int i = 0; i < count; ++i) {
        if (nulls[i]) throw Error("magic_sync: an integer array read as integers holds a NULL");
        integers.push_back(element == INT8OID ? DatumGetInt64(elements[i])
                                              : DatumGetInt32(elements[i]));
    }
    return Value::integer_array(output_of(datum, array_type), std::move(integers));
}

// A result cell: booleans, integers, bytea and arrays of text or integers from the datum, any
// other type by its output function.
Value cell(HeapTuple tuple, TupleDesc descriptor, int column) {
    bool is_null = false;
    Datum datum =
        guard([&]() noexcept { return SPI_getbinval(tuple, descriptor, column, &is_null); });
    if (is_null) return std::nullopt;
    const Oid type = SPI_gettypeid(descriptor, column);
    switch (type) {
        case BOOLOID:
            return Value::boolean(DatumGetBool(datum));
        case INT8OID:
            return Value::integer(DatumGetInt64(datum));
        case INT4OID:
            return Value::integer(DatumGetInt32(datum));
        case INT2OID:
            return Value::integer(DatumGetInt16(datum));
        case BYTEAOID: {
            auto* bytes = guard([&]() noexcept { return DatumGetByteaPP(datum); });
            return Value::bytea(std::string(VARDATA_ANY(bytes), VARSIZE_ANY_EXHDR(bytes)));
        }
        case TEXTARRAYOID:
            return text_array_cell(datum);
        case INT8ARRAYOID:
            return integer_array_cell(datum, type, INT8OID);
        case INT4ARRAYOID:
            return integer_array_cell(datum, type, INT4OID);
        default:
            return output_of(datum, type);
    }
}

// The names of a result's columns.
Row::Names names_of(TupleDesc descriptor) {
    auto names = std::make_shared<std::vector<std::string>>();
    names->reserve(descriptor->natts);
    for (int c = 0; c < descriptor->natts; ++c)
        names->push_back(NameStr(TupleDescAttr(descriptor, c)->attname));
    return names;
}

}  // namespace

void Value::expect(Type type, const char* name) const {
    if (has_value() && type_ != type)
        throw Error(std::string("magic_sync: a result cell read as ") + name +
                    " is not of that type: " + **this);
}

bool Value::flag_or(bool if_null) const {
    expect(Type::kBoolean, "a boolean");
    return has_value() ? number_ != 0 : if_null;
}

int64_t Value::integer_or(int64_t if_null) const {
    expect(Type::kInteger, "an integer");
    return has_value() ? number_ : if_null;
}

int64_t Value::integer() const {
    if (!has_value()) throw Error("magic_sync: a result cell read as an integer is NULL");
    return integer_or(0);
}

const std::string& Value::bytes() const {
    if (!has_value()) throw Error("magic_sync: a result cell read as bytea is NULL");
    expect(Type::kBytea, "bytea");
    return **this;
}

const std::vector<std::optional<std::string>>& Value::elements() const {
    expect(Type::kTextArray, "text[]");
    return elements_;
}

std::vector<std::string> Value::texts() const {
    std::vector<std::string> texts;
    for (const auto& element : elements()) {
        if (!element)
            throw Error("magic_sync: a text[] result cell holds a NULL element: " + **this);
        texts.push_back(*element);
    }
    return texts;
}

const std::vector<int64_t>& Value::integers() const {
    expect(Type::kIntegerArray, "an integer array");
    return integers_;
}

const Value& Row::operator[](std::string_view name) const {
    if (names_) {
        for (size_t c = 0; c < names_->size(); ++c)
            if ((*names_)[c] == name) return at(c);
    }
    std::string names;
    if (names_)
        for (const std::string& column : *names_) names += (names.empty() ? "" : ", ") + column;
    throw Error("magic_sync: the result has no column " + std::string(name) + " (it has " +
                (names.empty() ? std::string("none") : names) + ")");
}

Spi::Spi() {
    guard([]() noexcept {
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "magic_sync: SPI_connect failed");
    });
    connected_ = true;
}

void Spi::finish() {
    if (!connected_) return;
    connected_ = false;
    guard([]() noexcept { SPI_finish(); });
}

uint64_t Spi::execute(const Sql& sql, const std::vector<Param>& params) {
    return run(sql, params, false);
}

std::vector<Row> Spi::query(const Sql& sql, const std::vector<Param>& params) {
    uint64_t count = run(sql, params, false);
    std::vector<Row> rows;
    if (SPI_tuptable == nullptr) return rows;
    rows.reserve(count);
    TupleDesc descriptor = SPI_tuptable->tupdesc;
    const Row::Names names = names_of(descriptor);
    for (uint64_t r = 0; r < count; ++r) {
        HeapTuple tuple = SPI_tuptable->vals[r];
        std::vector<Value> cells;
        cells.reserve(descriptor->natts);
        for (int c = 1; c <= descriptor->natts; ++c) cells.push_back(cell(tuple, descriptor, c));
        rows.emplace_back(std::move(cells), names);
    }
    return rows;
}

Value Spi::scalar(const Sql& sql, const std::vector<Param>& params) {
    auto rows = query(sql, params);
    if (rows.empty() || rows.front().empty()) return std::nullopt;
    return rows.front().front();
}

bool Spi::flag(const Sql& sql, const std::vector<Param>& params) {
    if (run(sql, params, false) == 0 || SPI_tuptable == nullptr) return false;
    TupleDesc descriptor = SPI_tuptable->tupdesc;
    if (descriptor->natts != 1 || SPI_gettypeid(descriptor, 1) != BOOLOID)
        throw Error("magic_sync: Spi::flag needs one boolean column: " + sql.text());
    bool is_null = false;
    Datum value = guard(
        [&]() noexcept { return SPI_getbinval(SPI_tuptable->vals[0], descriptor, 1, &is_null); });
    return !is_null && DatumGetBool(value);
}

void subtransaction(const std::function<void()>& work) {
    MemoryContext caller_context = CurrentMemoryContext;
    ResourceOwner caller_owner = CurrentResourceOwner;
    guard([]() noexcept { BeginInternalSubTransaction(nullptr); });
    try {
        work();
    } catch (...) {
        guard([&]() noexcept {
            RollbackAndReleaseCurrentSubTransaction();
            MemoryContextSwitchTo(caller_context);
            CurrentResourceOwner = caller_owner;
        });
        throw;
    }
    guard([&]() noexcept {
        ReleaseCurrentSubTransaction();
        MemoryContextSwitchTo(caller_context);
        CurrentResourceOwner = caller_owner;
    });
}

std::string quote_identifier(const std::string& name) {
    return guard([&]() noexcept { return ::quote_identifier(name.c_str()); });
}

std::string quote_literal(const std::string& text) {
    char* quoted = guard([&]() noexcept { return quote_literal_cstr(text.c_str()); });
    std::string result(quoted);
    guard([&]() noexcept { pfree(quoted); });
    return result;
}

}  // namespace magic_sync::pg
