#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "protocol/canonical.hpp"

namespace magic_sync::protocol {
namespace {

std::string refusal(const std::string& text, const Limits& limits = Limits{}) {
    try {
        canonical_json(text, limits);
    } catch (const DecodeError& error) {
        return error.what();
    }
    return "accepted";
}

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(CanonicalJson, RemovesWhitespace) {
    EXPECT_EQ(canonical_json(" {\n\t\"a\" : [ 1 , 2 ,{ } , [ ] ] ,\r\n \"b\":\"x y\" } "),
              R"({"a":[1,2,{},[]],"b":"x y"})");
}

TEST(CanonicalJson, SortsKeysBytewiseAtEveryLevel) {
    EXPECT_EQ(canonical_json(R"({"b":1,"a":{"z":1,"y":[{"d":1,"c":2}]},"aa":0,"B":2})"),
              R"({"B":2,"a":{"y":[{"c":2,"d":1}],"z":1},"aa":0,"b":1})");
    // UTF-8 bytes compare unsigned: "é" (0xc3 0xa9) sorts after "z", and "" first.
    EXPECT_EQ(canonical_json(R"({"é":1,"z":2,"":3})"), R"({"":3,"z":2,"é":1})");
}

TEST(CanonicalJson, KeepsArrayOrder) { EXPECT_EQ(canonical_json("[3,1,2]"), "[3,1,2]"); }

TEST(CanonicalJson, PreservesNumberLexemes) {
    EXPECT_EQ(canonical_json("[12.50, 123456789012345678901234567890.123, 1E+3, 1e-7, -0.0, 0.10]"),
              "[12.50,123456789012345678901234567890.123,1E+3,1e-7,-0.0,0.10]");
    EXPECT_EQ(canonical_json("[18446744073709551615, 18446744073709551616, -9223372036854775808, "
                             "-9223372036854775809, 0, -1]"),
              "[18446744073709551615,18446744073709551616,-9223372036854775808,"
              "-9223372036854775809,0,-1]");
}

TEST(CanonicalJson, WritesNegativeIntegerZeroAsZero) { EXPECT_EQ(canonical_json("-0"), "0"); }

TEST(CanonicalJson, EscapesStringsAsNlohmannDumpDoes) {
    EXPECT_EQ(canonical_json(R"("\u00e9\/\u0001\u001F\t\n\r\b\f\"\\)"
                             "\x7f\xe2\x82\xac"
                             R"(")"),
              "\"\xc3\xa9/\\u0001\\u001f\\t\\n\\r\\b\\f\\\"\\\\\x7f\xe2\x82\xac\"");
    EXPECT_EQ(canonical_json(R"({"k\u0000":"\ud83d\ude00"})"),
              "{\"k\\u0000\":\"\xf0\x9f\x98\x80\"}");
}

TEST(CanonicalJson, AcceptsAnyValueAtTheTop) {
    EXPECT_EQ(canonical_json(" null "), "null");
    EXPECT_EQ(canonical_json("true"), "true");
    EXPECT_EQ(canonical_json("\"x\""), "\"x\"");
    EXPECT_EQ(canonical_json("7"), "7");
}

TEST(CanonicalJson, IsIdempotent) {
    const std::string text = R"({ "b" : [ 1.50, "\u00e9\n", {"y":null,"x":true} ], "a" : -0.0 })";
    std::string once = canonical_json(text);
    EXPECT_EQ(canonical_json(once), once);
}

TEST(CanonicalJson, RefusesDuplicateKeys) {
    EXPECT_EQ(refusal(R"({"a":1,"b":2,"a":3})"), "duplicate key \"a\"");
    EXPECT_EQ(refusal(R"([{"x":{"k":1,"k":1}}])"), "duplicate key \"k\"");
    // Keys are compared after unescaping.
    EXPECT_EQ(refusal(R"({"a":1,"\u0061":2})"), "duplicate key \"a\"");
}

TEST(CanonicalJson, RefusesInvalidUtf8) {
    EXPECT_EQ(refusal("\"\xff\""),
              "invalid JSON: parse error at line 1, column 2: syntax error while parsing value - "
              "invalid string: ill-formed UTF-8 byte; last read: '\"\\xff'");
    EXPECT_EQ(
        refusal("{\"\xc3\x28\":1}"),
        "invalid JSON: parse error at line 1, column 4: syntax error while parsing object key "
        "- invalid string: ill-formed UTF-8 byte; last read: '\"\\xc3('; expected string "
        "literal");
    EXPECT_NE(refusal(R"("\ud800")").find("surrogate U+D800..U+DBFF"), std::string::npos);
}

TEST(CanonicalJson, RefusesWhatIsNotOneJsonValue) {
    EXPECT_EQ(refusal(""),
              "invalid JSON: parse error at line 1, column 1: syntax error while parsing value - "
              "unexpected end of input; expected '[', '{', or a literal");
    EXPECT_NE(refusal("{\"a\":1} x"), "accepted");
    EXPECT_NE(refusal("[1,]"), "accepted");
    EXPECT_NE(refusal("/* c */ 1"), "accepted");
    EXPECT_NE(refusal("NaN"), "accepted");
    EXPECT_NE(refusal("01"), "accepted");
}

// A number no double holds keeps its text: canonical, so the server can hash and withhold a row
// that holds one (row_travels), which a replica may read as a double. Past a long double the text
// way refuses it (the server writes a numeric's text straight from its value).
TEST(CanonicalJson, KeepsANumberPastADoubleAsWritten) {
    EXPECT_EQ(canonical_json(R"({"b":1e400,"a":-1E+400})"), R"({"a":-1E+400,"b":1e400})");
    EXPECT_EQ(canonical_json("1" + std::string(400, '0')), "1" + std::string(400, '0'));
    EXPECT_EQ(refusal("1e99999"), "invalid JSON: number overflow parsing '1e99999'");
}

TEST(CanonicalJson, BoundsNesting) {
    EXPECT_EQ(canonical_json(nested(64)), nested(64));
    EXPECT_EQ(refusal(nested(65)), "nesting deeper than 64 levels");
    EXPECT_EQ(refusal(std::string(100000, '[')), "nesting deeper than 64 levels");
    std::string deep_objects;
    for (int i = 0; i < 100000; ++i) deep_objects += "{\"a\":";
    EXPECT_EQ(refusal(deep_objects), "nesting deeper than 64 levels");
    Limits shallow;
    shallow.max_depth = 2;
    EXPECT_EQ(refusal(R"({"a":{"b":{}}})", shallow), "nesting deeper than 2 levels");
}

TEST(CanonicalJson, BoundsSize) {
    Limits small;
    small.max_bytes = 10;
    EXPECT_EQ(canonical_json("[1,2,3,45]", small), "[1,2,3,45]");
    EXPECT_EQ(refusal("[1,2,3,456]", small), "JSON text is 11 bytes, over the limit of 10");
}

TEST(CanonicalJson, BoundsStrings) {
    Limits small;
    small.max_string = 3;
    EXPECT_EQ(canonical_json(R"({"abc":"xyz"})", small), R"({"abc":"xyz"})");
    EXPECT_EQ(refusal(R"(["abcd"])", small), "string of 4 bytes, over the limit of 3");
    EXPECT_EQ(refusal(R"({"abcd":1})", small), "key of 4 bytes, over the limit of 3");
}

TEST(CanonicalJson, ShortensLongKeysInErrors) {
    std::string key(100, 'k');
    EXPECT_EQ(refusal("{\"" + key + "\":1,\"" + key + "\":2}"),
              "duplicate key \"" + std::string(64, 'k') + "\"...");
}

TEST(AppendJsonString, QuotesAndRefusesInvalidUtf8) {
    std::string out = "x";
    append_json_string(out, "a\"b");
    EXPECT_EQ(out, R"(x"a\"b")");
    EXPECT_THROW(append_json_string(out, "\xff"), std::invalid_argument);
}

TEST(AppendJsonString, SaysWhichByteIsNotUtf8) {
    std::string out;
    try {
        append_json_string(out, "ab\xe2\x82");
        FAIL() << "a cut-short sequence was written";
    } catch (const std::invalid_argument& error) {
        EXPECT_STREQ(error.what(),
                     "cannot write a JSON string that is not valid UTF-8: ill-formed byte at "
                     "index 2: 0xe2");
    }
}

// The canonical form is nlohmann's dump: every byte, and every sequence of two, and the edges of
// three and four byte sequences (overlong forms, surrogates, past U+10FFFF), are written, or
// refused, exactly as nlohmann writes or refuses them.
TEST(AppendJsonString, WritesAndRefusesAsNlohmannDumpDoes) {
    const auto expect_same = [](const std::string& value) {
        std::string ours;
        bool ours_refused = false;
        try {
            append_json_string(ours, value);
        } catch (const std::invalid_argument&) {
            ours_refused = true;
        }
        std::string theirs;
        bool theirs_refused = false;
        try {
            theirs =
                nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
        } catch (const nlohmann::json::type_error&) {
            theirs_refused = true;
        }
        ASSERT_EQ(ours_refused, theirs_refused) << testing::PrintToString(value);
        if (!ours_refused) {
            ASSERT_EQ(ours, theirs) << testing::PrintToString(value);
        }
    };
    for (int first = 0; first < 256; ++first) {
        expect_same(std::string("a") + static_cast<char>(first) + "z");
        for (int second = 0; second < 256; ++second)
            expect_same(std::string{static_cast<char>(first), static_cast<char>(second)});
    }
    for (int lead : {0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5}) {
        for (int second = 0x70; second < 0xd0; ++second) {
            for (int rest : {0x3f, 0x80, 0xbf, 0xc0}) {
                expect_same(std::string{static_cast<char>(lead), static_cast<char>(second),
                                        static_cast<char>(rest)});
                expect_same(std::string{static_cast<char>(lead), static_cast<char>(second),
                                        static_cast<char>(0x80), static_cast<char>(rest)});
            }
        }
    }
}

// The first number no double holds, as written, outside strings; none when all fit.
TEST(NumberPastDouble, FindsTheFirstNumberNoDoubleHolds) {
    EXPECT_EQ(number_past_double(R"({"a":1.5,"b":[1e308,-2],"c":"1e400"})"), std::nullopt);
    EXPECT_EQ(number_past_double(R"({"a":1,"b":[2,1e400],"c":-1E+500})"), "1e400");
    EXPECT_EQ(number_past_double(R"({"a\"1e400":-1E+500})"), "-1E+500");
    EXPECT_EQ(number_past_double(R"({"tiny":1e-400})"), std::nullopt);  // 0 as a double
    EXPECT_EQ(number_past_double("1" + std::string(400, '0')), "1" + std::string(400, '0'));
    EXPECT_EQ(number_past_double_problem(R"({"a":1})"), std::nullopt);
    EXPECT_EQ(number_past_double_problem(R"({"a":1e400})"),
              "the row holds 1e400, a number no double holds");
    EXPECT_EQ(number_past_double_problem("[1" + std::string(400, '0') + "]"),
              "the row holds 1" + std::string(39, '0') + "..., a number no double holds");
}

}  // namespace

}  // namespace magic_sync::protocol
