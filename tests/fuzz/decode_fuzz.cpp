// libFuzzer target: the protocol decoder (src/protocol/messages.hpp) on arbitrary bytes.
//
// decode_down and decode_upload with the default Limits must refuse bad input with DecodeError
// and nothing else (no crash, no other exception, no hang, no leak). Whatever decodes must encode
// without throwing and decode again to an equal value and the same bytes (the round trip).
// Tight limits refuse more but never change what a message means: whatever decodes under them
// decodes to the same value under the defaults.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "protocol/messages.hpp"

namespace {

namespace protocol = magic_sync::protocol;
using magic_sync::fuzz::check;

protocol::Limits tight_limits() {
    protocol::Limits limits;
    limits.max_bytes = 512;
    limits.max_depth = 8;
    limits.max_rows = 3;
    limits.max_string = 40;
    return limits;
}

template <typename Message, typename Decode>
std::optional<Message> try_decode(std::string_view text, const protocol::Limits& limits,
                                  Decode decode) {
    try {
        return decode(text, limits);
    } catch (const protocol::DecodeError&) {
        return std::nullopt;  // refused, as it should be; anything else escapes and crashes
    }
}

template <typename Message, typename Decode>
void round_trip(std::string_view text, Decode decode) {
    std::optional<Message> message = try_decode<Message>(text, protocol::Limits{}, decode);
    if (message) {
        const std::string encoded = protocol::encode(*message);
        std::optional<Message> again = try_decode<Message>(encoded, protocol::Limits{}, decode);
        check(again.has_value(), "an encoded message decodes", encoded);
        check(*again == *message, "decode(encode(m)) == m", encoded);
        check(protocol::encode(*again) == encoded, "encode is stable over a round trip", encoded);
    }
    std::optional<Message> tight = try_decode<Message>(text, tight_limits(), decode);
    if (tight) {
        check(message.has_value(), "what decodes under tight limits decodes under the defaults",
              text);
        check(*tight == *message, "limits do not change what a message means", text);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    round_trip<protocol::DownMessage>(text, [](std::string_view t, const protocol::Limits& l) {
        return protocol::decode_down(t, l);
    });
    round_trip<protocol::Upload>(text, [](std::string_view t, const protocol::Limits& l) {
        return protocol::decode_upload(t, l);
    });
    return 0;
}
