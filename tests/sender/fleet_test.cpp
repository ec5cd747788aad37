// The fleet page's JSON (sender/fleet.cpp): the backlog's hour of samples, the document
// /fleet.json answers, and the page itself holding no reference to anything outside it.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "fleet.hpp"

namespace magic_sync::sender {
namespace {

using namespace std::chrono_literals;
using Time = BacklogHistory::Time;

Time at(long long seconds) { return Time(std::chrono::seconds(seconds)); }

TEST(FleetJson, EscapesTextAsAJsonString) {
    EXPECT_EQ(json_string("plain"), "\"plain\"");
    EXPECT_EQ(json_string("a \"quote\" \\ back\nline\ttab\r"),
              "\"a \\\"quote\\\" \\\\ back\\nline\\ttab\\r\"");
    EXPECT_EQ(json_string(std::string("nul\0bell\a", 9)), "\"nul\\u0000bell\\u0007\"");
    EXPECT_EQ(json_string("caf\xc3\xa9 <b>"), "\"caf\xc3\xa9 <b>\"");
    // Whatever the text, the result parses back to it.
    const std::string hostile = "</script><img src=x onerror=alert(1)>\"\\\x01";
    EXPECT_EQ(nlohmann::json::parse(json_string(hostile)).get<std::string>(), hostile);
    // Bytes that are not UTF-8 still give JSON.
    EXPECT_EQ(json_string("bad \xff\xfe byte"), "\"bad ?? byte\"");
}

TEST(FleetJson, TheBacklogKeepsAnHourOfSamplesOldestFirst) {
    BacklogHistory history(3600s, 15s);
    EXPECT_EQ(history.json(), "{\"every\":15,\"span\":3600,\"samples\":[]}");
    history.add(at(1000), 5);
    history.add(at(1015), 7);
    EXPECT_EQ(history.json(), "{\"every\":15,\"span\":3600,\"samples\":[[1000,5],[1015,7]]}");
    // Exactly an hour old stays; older goes.
    history.add(at(4600), 0);
    EXPECT_EQ(history.json(),
              "{\"every\":15,\"span\":3600,\"samples\":[[1000,5],[1015,7],[4600,0]]}");
    history.add(at(4601), 2);
    EXPECT_EQ(history.json(),
              "{\"every\":15,\"span\":3600,\"samples\":[[1015,7],[4600,0],[4601,2]]}");
    // A day of samples every 15 s holds one hour's: 241 of them, the first an hour before the last.
    BacklogHistory day(3600s, 15s);
    for (long long t = 0; t <= 86400; t += 15) day.add(at(t), t);
    EXPECT_EQ(day.size(), 241u);
    const nlohmann::json samples = nlohmann::json::parse(day.json())["samples"];
    EXPECT_EQ(samples.front(), nlohmann::json::parse("[82800,82800]"));
    EXPECT_EQ(samples.back(), nlohmann::json::parse("[86400,86400]"));
}

TEST(FleetJson, TheDocumentHoldsTheFleetOrWhyItIsMissing) {
    BacklogHistory history(3600s, 15s);
    history.add(at(1700000000), 12);
    EXPECT_EQ(fleet_json(1700000001.25, "{\"replicas\": 3}", "", history),
              "{\"read_at\":1700000001.250,\"fleet\":{\"replicas\": 3},\"error\":null,"
              "\"backlog\":{\"every\":15,\"span\":3600,\"samples\":[[1700000000,12]]}}");
    const nlohmann::json missing = nlohmann::json::parse(
        fleet_json(5, "", "cannot connect: connection to server at \"db\" failed", history));
    EXPECT_TRUE(missing["fleet"].is_null());
    EXPECT_EQ(missing["error"], "cannot connect: connection to server at \"db\" failed");
    EXPECT_EQ(missing["backlog"]["samples"].size(), 1u);
}

TEST(FleetJson, ThePageFetchesNothingButItsData) {
    const std::string page = kFleetPage;
    EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
    EXPECT_NE(page.find("fetch(\"fleet.json\""), std::string::npos);
    // No external assets (the SVG namespace is a name, not a fetch), and no data written as
    // markup.
    std::string rest = page;
    const std::string svg = "http://www.w3.org/2000/svg";
    for (size_t at = rest.find(svg); at != std::string::npos; at = rest.find(svg))
        rest.erase(at, svg.size());
    for (const char* absent : {"http://", "https://", "<link", "src=", "@import", "url(",
                               "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"})
        EXPECT_EQ(rest.find(absent), std::string::npos) << absent;
}

}  // namespace
}  // namespace magic_sync::sender
