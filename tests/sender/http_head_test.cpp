// The pull gateway's parser of a request's head (sender/http_head.cpp): what it takes, and what it
// refuses, with which status, before any body is read.
#include <gtest/gtest.h>

#include <string>

#include "http_head.hpp"

namespace magic_sync::sender {
namespace {

int refused_with(const std::string& head) {
    try {
        parse_head(head);
    } catch (const HeadRefusal& refusal) {
        return refusal.status;
    }
    return 0;
}

TEST(HttpHead, ParsesTheRequestLineAndHeaders) {
    const HttpHead head = parse_head(
        "GET /replicas/abc/next?wait=5 HTTP/1.1\r\nHost: gateway\r\nAuthorization:  Bearer t \r\n"
        "X-Empty:");
    EXPECT_EQ(head.method, "GET");
    EXPECT_EQ(head.path, "/replicas/abc/next");
    EXPECT_EQ(head.header("authorization"), "Bearer t");
    EXPECT_EQ(head.header("x-empty"), "");
    EXPECT_EQ(head.header("content-length"), std::nullopt);
    EXPECT_TRUE(head.keep_alive());
}

TEST(HttpHead, KeepsAliveAsEachVersionDoes) {
    EXPECT_FALSE(parse_head("GET / HTTP/1.1\r\nConnection: Close").keep_alive());
    EXPECT_FALSE(parse_head("GET / HTTP/1.0").keep_alive());
    EXPECT_TRUE(parse_head("GET / HTTP/1.0\r\nConnection: keep-alive").keep_alive());
}

TEST(HttpHead, TakesGzipAsAcceptEncodingSaysIt) {
    const auto accepts = [](const std::string& headers) {
        return parse_head("GET / HTTP/1.1\r\n" + headers).accepts_gzip();
    };
    EXPECT_FALSE(accepts("Host: x"));
    EXPECT_TRUE(accepts("Accept-Encoding: gzip"));
    EXPECT_TRUE(accepts("Accept-Encoding: deflate, GZIP;q=0.5, br"));
    EXPECT_TRUE(accepts("Accept-Encoding: x-gzip"));
    EXPECT_TRUE(accepts("Accept-Encoding: *"));
    EXPECT_TRUE(accepts("Accept-Encoding: br\r\nAccept-Encoding: gzip"));
    EXPECT_FALSE(accepts("Accept-Encoding: br, deflate"));
    EXPECT_FALSE(accepts("Accept-Encoding: gzip;q=0"));
    EXPECT_FALSE(accepts("Accept-Encoding: gzip; q=0.000, identity"));
    EXPECT_FALSE(accepts("Accept-Encoding: gzipped"));
    EXPECT_FALSE(accepts("Accept-Encoding:"));
}

TEST(HttpHead, FindsWhereAHeadEnds) {
    EXPECT_EQ(head_end("GET / HTTP/1.1\r\nHost: x\r\n"), std::nullopt);
    EXPECT_EQ(head_end("GET / HTTP/1.1\r\n\r\nbody"), 18u);
}

TEST(HttpHead, RefusesWhatIsNotAnHttp1Head) {
    EXPECT_EQ(refused_with("GET /"), 400);
    EXPECT_EQ(refused_with("GET relative HTTP/1.1"), 400);
    EXPECT_EQ(refused_with("G@T / HTTP/1.1"), 400);
    EXPECT_EQ(refused_with("GET / HTTP/2.0"), 505);
    EXPECT_EQ(refused_with("GET / HTTP/1.1\r\nno colon here"), 400);
    EXPECT_EQ(refused_with("GET / HTTP/1.1\r\nBad Name: x"), 400);
    EXPECT_EQ(refused_with("GET / HTTP/1.1\r\nX: a\r\n folded"), 400);
    EXPECT_EQ(refused_with(std::string("GET / HTTP/1.1\r\nX: a\x01") + "b"), 400);
    std::string many = "GET / HTTP/1.1";
    for (size_t i = 0; i <= kMaxHeaderLines; ++i) many += "\r\nX-" + std::to_string(i) + ": 1";
    EXPECT_EQ(refused_with(many), 431);
}

}  // namespace
}  // namespace magic_sync::sender
