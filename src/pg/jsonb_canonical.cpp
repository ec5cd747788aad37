// Canonical JSON straight from a jsonb (protocol/canonical.hpp has the rules): the relay encodes
// every row it plans through here, and writing jsonb out as text only to parse that text again
// cost more than reading the row.
#include "pg/jsonb_canonical.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
}

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "protocol/canonical.hpp"

namespace magic_sync::pg {

namespace {

struct Frame {
    bool is_object = false;
    bool raw_scalar = false;  // jsonb keeps a top-level scalar as a one-element array
    std::string text;         // arrays: "[" and the items so far
    std::vector<std::pair<std::string, std::string>> members;  // objects: key, canonical value
    std::string pending_key;
};

// What the fast walk leaves to the text path, which refuses it with the exact error.
struct Undecided {};

class Walker {
  public:
    explicit Walker(const protocol::Limits& limits) : limits_(limits) {}

    std::string walk(Jsonb* jsonb) {
        JsonbIterator* iterator = guard([&] { return JsonbIteratorInit(&jsonb->root); });
        JsonbValue value;
        for (;;) {
            JsonbIteratorToken token =
                guard([&] { return JsonbIteratorNext(&iterator, &value, false); });
            switch (token) {
                case WJB_DONE:
                    return std::move(result_);
                case WJB_BEGIN_OBJECT:
                case WJB_BEGIN_ARRAY:
                    begin(token == WJB_BEGIN_OBJECT,
                          token == WJB_BEGIN_ARRAY && value.val.array.rawScalar);
                    break;
                case WJB_KEY:
                    frames_.back().pending_key = string_of(value);
                    break;
                case WJB_VALUE:
                case WJB_ELEM:
                    deliver(scalar(value));
                    break;
                case WJB_END_OBJECT:
                    end_object();
                    break;
                case WJB_END_ARRAY:
                    end_array();
                    break;
            }
        }
    }

  private:
    void begin(bool is_object, bool raw_scalar) {
        if (frames_.size() >= static_cast<size_t>(limits_.max_depth)) throw Undecided{};
        Frame frame;
        frame.is_object = is_object;
        frame.raw_scalar = raw_scalar;
        if (!is_object && !raw_scalar) frame.text = "[";
        frames_.push_back(std::move(frame));
    }

    void end_object() {
        Frame frame = std::move(frames_.back());
        frames_.pop_back();
        // jsonb orders keys by length first; canonical JSON by their bytes alone.
        std::sort(frame.members.begin(), frame.members.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        std::string text = "{";
        for (const auto& [key, value] : frame.members) {
            if (text.size() > 1) text += ',';
            append_string(text, key);
            text += ':';
            text += value;
        }
        text += '}';
        deliver(std::move(text));
    }

    void end_array() {
        Frame frame = std::move(frames_.back());
        frames_.pop_back();
        if (!frame.raw_scalar) frame.text += ']';
        deliver(std::move(frame.text));
    }

    void deliver(std::string text) {
        if (frames_.empty()) {
            if (text.size() > limits_.max_bytes) throw Undecided{};
            result_ = std::move(text);
            return;
        }
        Frame& top = frames_.back();
        if (top.is_object) {
            top.members.emplace_back(std::move(top.pending_key), std::move(text));
        } else if (top.raw_scalar) {
            top.text = std::move(text);
        } else {
            if (top.text.size() > 1) top.text += ',';
            top.text += text;
        }
    }

    std::string scalar(const JsonbValue& value) {
        switch (value.type) {
            case jbvNull:
                return "null";
            case jbvBool:
                return value.val.boolean ? "true" : "false";
            case jbvString: {
                std::string text;
                append_string(text, string_of(value));
                return text;
            }
            case jbvNumeric: {
                char* digits = guard([&] {
                    return DatumGetCString(
                        DirectFunctionCall1(numeric_out, NumericGetDatum(value.val.numeric)));
                });
                std::string text(digits);
                guard([&] { pfree(digits); });
                if (text.size() > kLongestSureNumber) throw Undecided{};
                return text;
            }
            default:
                throw Undecided{};
        }
    }

    std::string string_of(const JsonbValue& value) {
        if (static_cast<size_t>(value.val.string.len) > limits_.max_string) throw Undecided{};
        return std::string(value.val.string.val, value.val.string.len);
    }

    void append_string(std::string& out, const std::string& value) {
        try {
            protocol::append_json_string(out, value);
        } catch (const std::invalid_argument&) {
            throw Undecided{};
        }
    }

    const protocol::Limits& limits_;
    std::vector<Frame> frames_;
    std::string result_;
};

}  // namespace

std::optional<std::string> jsonb_canonical_arg(FunctionCallInfo fcinfo, int n,
                                               const protocol::Limits& limits) {
    return jsonb_canonical(guard([&] { return PG_GETARG_DATUM(n); }), limits);
}

std::optional<std::string> jsonb_canonical(Datum value, const protocol::Limits& limits) {
    Jsonb* jsonb = guard([&] { return DatumGetJsonbP(value); });
    try {
        return Walker(limits).walk(jsonb);
    } catch (const Undecided&) {
        return std::nullopt;
    }
}

}  // namespace magic_sync::pg
