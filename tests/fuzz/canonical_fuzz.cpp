// libFuzzer target: canonical_json (src/protocol/canonical.hpp) on arbitrary bytes.
//
// It refuses with DecodeError and nothing else. What it accepts:
//   - is a fixed point: canonical_json(canonical_json(x)) == canonical_json(x);
//   - means the same value: nlohmann parses x and the canonical text to equal values (its floats
//     as long doubles, as canonical_json reads them: a number past a double's range is accepted
//     and kept as written; a row holding one does not travel, protocol::row_travels);
//   - is spelled as the header says: when x holds no number that nlohmann reads as a double (the
//     only values whose spelling canonical_json keeps as written), the canonical text is exactly
//     nlohmann's dump (sorted keys, no whitespace, its escapes).
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "protocol/canonical.hpp"

namespace {

namespace protocol = magic_sync::protocol;
using magic_sync::fuzz::check;
using Json = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                  std::uint64_t, long double>;

bool has_double(const Json& value) {
    if (value.is_number_float()) return true;
    if (value.is_structured()) {
        for (const Json& item : value) {
            if (has_double(item)) return true;
        }
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    std::string canonical;
    try {
        canonical = protocol::canonical_json(text);
    } catch (const protocol::DecodeError&) {
        return 0;
    }
    std::string again;
    try {
        again = protocol::canonical_json(canonical);
    } catch (const protocol::DecodeError& error) {
        magic_sync::fuzz::fail("canonical text is accepted again", error.what());
    }
    check(again == canonical, "canonical_json is idempotent", canonical);

    Json original = Json::parse(text.begin(), text.end(), nullptr, false);
    check(!original.is_discarded(), "what canonical_json accepts is JSON", text);
    Json parsed = Json::parse(canonical, nullptr, false);
    check(!parsed.is_discarded(), "canonical text is JSON", canonical);
    check(parsed == original, "canonical text means the same value", canonical);
    if (!has_double(original)) {
        check(canonical == original.dump(-1, ' ', false, Json::error_handler_t::strict),
              "canonical text is nlohmann's dump when no number is a double", canonical);
    }
    return 0;
}
