// The pull transport as a real process (magic-sync-sender --transport pull) asked over HTTP as a
// device would: the head until acknowledged, acks that take only the head, long polls woken by
// NOTIFY magic_sync, tokens, uploads to sync.receive, and which failures say "ask again".
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <future>

#include "protocol/gzip.hpp"
#include "pull_server.hpp"
#include "sender/harness.hpp"
#include "sender/pull_sender.hpp"
#include "support/raw_connection.hpp"

namespace magic_sync::test::sender {
namespace {

using magic_sync::sender::pull_failure_status;

long long unsent_of(const Outbox& outbox, int replica) {
    return outbox.number("SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL AND replica = '" +
                         replica_id(replica) + "'");
}

TEST(PullSender, ServesTheHeadUntilAckedAndAnAckTakesOnlyTheHead) {
    Outbox outbox("pull_head", 2, 3);
    TempDir dir;
    PullSender sender(outbox, dir, "1");

    auto first = sender.get_next(1, 1);
    ASSERT_TRUE(first) << sender.log();
    EXPECT_EQ(first->status, 200);
    EXPECT_EQ(first->get_header_value("message-id"), message_id(1));
    EXPECT_EQ(first->body, message_body(1, 1));
    // Asked again before the ack (the answer was lost): the same head.
    auto again = sender.get_next(1, 1);
    EXPECT_EQ(again->status, 200);
    EXPECT_EQ(again->get_header_value("message-id"), message_id(1));

    // An ack naming a message behind the head takes nothing.
    EXPECT_EQ(sender.ack(1, message_id(2), 1)->status, 409);
    EXPECT_EQ(unsent_of(outbox, 1), 3);
    // The head's ack takes it; the same ack again takes nothing else.
    auto taken = sender.ack(1, message_id(1), 1);
    EXPECT_EQ(taken->status, 200);
    EXPECT_EQ(taken->body, "taken " + message_id(1) + "\n");
    auto twice = sender.ack(1, message_id(1), 1);
    EXPECT_EQ(twice->status, 409);
    EXPECT_EQ(twice->body,
              message_id(1) + " is not the head of replica " + replica_id(1) + ": nothing taken\n");
    EXPECT_EQ(unsent_of(outbox, 1), 2);

    auto second = sender.get_next(1, 1);
    EXPECT_EQ(second->status, 200);
    EXPECT_EQ(second->get_header_value("message-id"), message_id(2));
    EXPECT_EQ(second->body, message_body(1, 2));
    // A stale ack (of the message before) and one of a message not served yet take nothing.
    EXPECT_EQ(sender.ack(1, message_id(1), 1)->status, 409);
    EXPECT_EQ(sender.ack(1, message_id(3), 1)->status, 409);
    EXPECT_EQ(unsent_of(outbox, 1), 2);
    EXPECT_EQ(sender.ack(1, message_id(2), 1)->status, 200);
    // A head no device was served takes no ack that guesses its id (its lease is not a pull's).
    EXPECT_EQ(sender.ack(1, message_id(3), 1)->status, 409);
    EXPECT_EQ(sender.get_next(1, 1)->get_header_value("message-id"), message_id(3));
    EXPECT_EQ(sender.ack(1, message_id(3), 1)->status, 200);

    // Nothing left: 204 once --wait has passed.
    const auto asked = Clock::now();
    auto none = sender.get_next(1, 1);
    EXPECT_EQ(none->status, 204);
    EXPECT_GE(Clock::now() - asked, 900ms);
    EXPECT_EQ(unsent_of(outbox, 1), 0);
    EXPECT_EQ(unsent_of(outbox, 2), 3) << "another replica's messages were taken";
}

// A device that cannot take its head says so: recorded as a push transport's refusal is (the
// replica's refusals and last error), the message stays the head; a refusal that names anything
// but the head records nothing.
TEST(PullSender, ARefusalIsRecordedAndTheHeadStays) {
    Outbox outbox("pull_refused", 1, 2);
    TempDir dir;
    PullSender sender(outbox, dir, "1");
    const auto refusals = [&] {
        return outbox.sql(
            "SELECT coalesce(d.refusals, 0) || ' ' || coalesce(d.last_error, '-') "
            "FROM sync.replica r LEFT JOIN sync.current_delivery d ON d.replica = r.id");
    };

    ASSERT_EQ(sender.get_next(1, 1)->status, 200) << sender.log();
    auto behind = sender.refused(1, message_id(2), "malformed: not a message", 1);
    EXPECT_EQ(behind->status, 409);
    EXPECT_EQ(behind->body, message_id(2) + " is not the head of replica " + replica_id(1) +
                                ": nothing recorded\n");
    EXPECT_EQ(refusals(), "0 -");

    auto recorded = sender.refused(1, message_id(1), "malformed: not a \x01message", 1);
    EXPECT_EQ(recorded->status, 200);
    EXPECT_EQ(recorded->body, "refusal of " + message_id(1) + " recorded\n");
    EXPECT_EQ(refusals(), "1 malformed: not a ?message");
    EXPECT_EQ(unsent_of(outbox, 1), 2);
    auto again = sender.get_next(1, 1);
    EXPECT_EQ(again->status, 200);
    EXPECT_EQ(again->get_header_value("message-id"), message_id(1));
    // A message of a protocol version the device does not speak is not a refusal: the device
    // waits for its upgrade (refusals in a row would provision it again, to no end).
    auto later = sender.refused(1, message_id(1), "unknown version: protocol 9", 1);
    EXPECT_EQ(later->status, 200);
    EXPECT_EQ(refusals(), "1 unknown version: protocol 9");
    // Taken after all (the device was upgraded, and asks again): its ack ends the backoff.
    EXPECT_EQ(sender.get_next(1, 1)->get_header_value("message-id"), message_id(1));
    EXPECT_EQ(sender.ack(1, message_id(1), 1)->status, 200);
    EXPECT_EQ(unsent_of(outbox, 1), 1);
}

TEST(PullSender, ADeviceActsOnlyForItsOwnReplica) {
    Outbox outbox("pull_tokens", 2, 2);
    TempDir dir;
    PullSender sender(outbox, dir, "1");

    // Device 1's token on replica 2: 403 on next, ack and up.
    auto next = sender.get_next(2, 1);
    EXPECT_EQ(next->status, 403);
    EXPECT_EQ(next->body, "this token may not act for replica " + replica_id(2) + "\n");
    EXPECT_EQ(sender.ack(2, message_id(1), 1)->status, 403);
    EXPECT_EQ(sender.refused(2, message_id(1), "no", 1)->status, 403);
    EXPECT_EQ(sender.up(2, "{}", 1)->status, 403);
    // No token, another scheme, an empty or unknown token.
    auto missing = sender.get_next(2, 0);
    EXPECT_EQ(missing->status, 401);
    EXPECT_EQ(missing->body, "send Authorization: Bearer TOKEN\n");
    EXPECT_EQ(sender.ack(2, message_id(1), 0)->status, 401);
    EXPECT_EQ(sender.up(2, "{}", 0)->status, 401);
    httplib::Client client = sender.client();
    const std::string path = "/replicas/" + replica_id(2) + "/next";
    EXPECT_EQ(client.Get(path.c_str(), {{"Authorization", "Basic dG9rZW4tMg=="}})->status, 401);
    EXPECT_EQ(client.Get(path.c_str(), {{"Authorization", "Bearer "}})->status, 401);
    EXPECT_EQ(client.Get(path.c_str(), {{"Authorization", "Bearer token-9"}})->status, 403);
    EXPECT_EQ(
        client.Get("/replicas/not-a-uuid/next", {{"Authorization", "Bearer token-2"}})->status,
        404);
    // Replica 2's outbox was not touched: nothing leased, nothing taken.
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.outbox WHERE replica = '" + replica_id(2) +
                            "' AND (tries > 0 OR sent_at IS NOT NULL)"),
              0);
    // Its own token works.
    auto own = sender.get_next(2, 2);
    EXPECT_EQ(own->status, 200);
    EXPECT_EQ(own->get_header_value("message-id"), message_id(1));
}

// The value of a metric the sender publishes on its metrics port ("none" when it has none).
class Metrics {
  public:
    explicit Metrics(int port) : scrape_("127.0.0.1", port) {}
    std::string operator()(const std::string& name) {
        auto answer = scrape_.Get("/metrics");
        const std::string text = answer ? answer->body : "";
        const size_t at = text.find("\n" + name + " ");
        return at == std::string::npos
                   ? std::string("none")
                   : text.substr(at + name.size() + 2,
                                 text.find('\n', at + 1) - at - name.size() - 2);
    }

  private:
    httplib::Client scrape_;
};

TEST(PullSender, AWaitingAskIsAnsweredByNotifyNotByPolling) {
    Outbox outbox("pull_wake", 1, 0);
    TempDir dir;
    const int metrics_port = free_port();
    PullSender sender(outbox, dir, "20", "",
                      {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
    Metrics metric(metrics_port);

    auto asked = std::async(std::launch::async, [&] { return sender.get_next(1, 1); });
    ASSERT_TRUE(eventually([&] { return metric("magic_sync_pull_waiting") == "1"; }))
        << sender.log();
    // A message without a NOTIFY: the waiting ask does not look again by itself.
    outbox.add(1, 1, 1, 1);
    EXPECT_EQ(asked.wait_for(1500ms), std::future_status::timeout)
        << "the ask was answered without a NOTIFY: it polls";
    const auto notified = Clock::now();
    outbox.sql("NOTIFY magic_sync");
    ASSERT_EQ(asked.wait_for(5s), std::future_status::ready) << sender.log();
    EXPECT_LT(Clock::now() - notified, 2s);
    auto answer = asked.get();
    EXPECT_EQ(answer->status, 200);
    EXPECT_EQ(answer->get_header_value("message-id"), message_id(1));
}

// A NOTIFY wakes only the devices of the replicas it names (the relay's pass names those it wrote
// to): the gateway asks the database about those of them that a device waits for, in one
// statement, and none when nobody waits for them; a NOTIFY that names none asks about everyone
// waiting (issue 38: every NOTIFY used to ask about every waiting device).
TEST(PullSender, ANotifyWakesOnlyTheDevicesOfTheReplicasItNames) {
    Outbox outbox("pull_named", 5, 0);
    TempDir dir;
    const int metrics_port = free_port();
    PullSender sender(outbox, dir, "30", "",
                      {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
    Metrics metric(metrics_port);
    std::vector<std::future<httplib::Result>> asked;
    for (int n = 1; n <= 5; ++n)
        asked.push_back(std::async(std::launch::async, [&, n] { return sender.get_next(n, n); }));
    ASSERT_TRUE(eventually([&] { return metric("magic_sync_pull_waiting") == "5"; }))
        << sender.log();

    outbox.add(3, 3, 1, 1);
    outbox.sql("SELECT pg_notify('magic_sync', '" + replica_id(3) + "')");
    ASSERT_EQ(asked[2].wait_for(10s), std::future_status::ready) << sender.log();
    EXPECT_EQ(asked[2].get()->get_header_value("message-id"), message_id(1));
    EXPECT_EQ(metric("magic_sync_pull_wake_statements_total"), "1");
    EXPECT_EQ(metric("magic_sync_pull_wake_replicas_total"), "1");

    // Named, but nobody waits for it: no statement. Named among others: only it.
    outbox.sql("SELECT pg_notify('magic_sync', '" + replica_id(3) + "')");
    outbox.sql("SELECT pg_notify('magic_sync', '" + replica_id(3) + "," + replica_id(4) + "')");
    ASSERT_TRUE(eventually([&] { return metric("magic_sync_pull_wake_statements_total") == "2"; }))
        << sender.log();
    EXPECT_EQ(metric("magic_sync_pull_wake_replicas_total"), "2");
    EXPECT_EQ(asked[3].wait_for(500ms), std::future_status::timeout) << "no message for it";

    // Naming none: every waiting device's replica is asked about.
    outbox.sql("NOTIFY magic_sync");
    ASSERT_TRUE(eventually([&] { return metric("magic_sync_pull_wake_statements_total") == "3"; }))
        << sender.log();
    EXPECT_EQ(metric("magic_sync_pull_wake_replicas_total"), "6");
    for (int n : {1, 2, 4, 5})
        EXPECT_EQ(asked[n - 1].wait_for(0ms), std::future_status::timeout) << n;
    outbox.add(1, 2, 1, 1);
    outbox.add(4, 5, 1, 1);
    outbox.sql("SELECT pg_notify('magic_sync', '" + replica_id(1) + "," + replica_id(2) + "," +
               replica_id(4) + "," + replica_id(5) + "')");
    for (int n : {1, 2, 4, 5}) EXPECT_EQ(asked[n - 1].get()->status, 200) << n;
    EXPECT_EQ(metric("magic_sync_pull_wake_replicas_total"), "10");
}

TEST(PullSender, UploadsGoToSyncReceiveUnderThePathsReplica) {
    Outbox outbox("pull_up", 1, 0);
    outbox.sql(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pull_route') THEN "
        "CREATE ROLE pull_route LOGIN IN ROLE sync_sender, sync_receiver; END IF; END $$");
    TempDir dir;
    {
        // The sender's own role lacks sync_receiver: failing the same way again, 500.
        PullSender sender(outbox, dir, "1");
        auto refused = sender.up(1, "{}", 1);
        EXPECT_EQ(refused->status, 500);
        EXPECT_EQ(refused->body, "permission denied for function receive\n");
    }
    std::string conninfo = outbox.conninfo();
    conninfo.replace(conninfo.find("user=magic_sender"), 17, "user=pull_route");
    // The replica may keep one item: garbage once is kept, garbage again is refused (507).
    outbox.sql("ALTER ROLE pull_route SET magic_sync.max_kept_items = 1");
    PullSender sender(outbox, dir, "1", conninfo);
    auto filed = sender.up(1, "not an upload", 1);
    EXPECT_EQ(filed->status, 200) << filed->body;
    EXPECT_EQ(filed->body, "kept\n");
    auto refused = sender.up(1, "not an upload either", 1);
    outbox.sql("ALTER ROLE pull_route RESET magic_sync.max_kept_items");
    EXPECT_EQ(refused->status, 507) << refused->body;
    EXPECT_EQ(refused->body, "refused: the server keeps as much from replica " + replica_id(1) +
                                 " as it may (sync.status, sync.upload_refusal); nothing was "
                                 "filed, send it again later\n");
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.set_aside WHERE kind = 'upload' AND "
                            "replica = '" +
                            replica_id(1) + "'"),
              1);
    EXPECT_EQ(outbox.number("SELECT uploads_refused FROM sync.status WHERE replica = '" +
                            replica_id(1) + "'"),
              1);

    // An upload sent gzip goes to sync.receive as it came, which reads it (a replica's --gzip-up).
    const std::string upload = R"({"v":1,"id":"10000000-0000-0000-0000-00000000000a","rows":[]})";
    auto gzipped =
        sender.client().Post(("/replicas/" + replica_id(1) + "/up").c_str(),
                             {{"Authorization", "Bearer token-1"}, {"Content-Encoding", "gzip"}},
                             protocol::gzip(upload), "application/json");
    ASSERT_TRUE(gzipped);
    EXPECT_EQ(gzipped->status, 200) << gzipped->body;
    EXPECT_EQ(gzipped->body, "filed\n");
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.upload WHERE id = "
                            "'10000000-0000-0000-0000-00000000000a'"),
              1);
}

// A body is read only for a device that may send it: a POST is refused on its headers, at once,
// before its body comes (the gateway used to read a 60 MB body first, then answer 401), and so is
// one whose Content-Length is over the limit.
TEST(PullSender, ARequestIsRefusedOnItsHeadersBeforeItsBodyIsRead) {
    Outbox outbox("pull_headers", 2, 1);
    TempDir dir;
    PullSender sender(outbox, dir, "1");
    const auto head = [&](int replica, const std::string& what, const std::string& headers) {
        return "POST /replicas/" + replica_id(replica) + "/" + what +
               " HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n" + headers +
               "\r\n";
    };
    const std::string big = "Content-Length: 60000000\r\n";
    EXPECT_EQ(status_line(sender.answer_to_head(head(1, "up", big), 3s)),
              "HTTP/1.1 401 Unauthorized");
    EXPECT_EQ(status_line(sender.answer_to_head(
                  head(2, "up", big + "Authorization: Bearer token-1\r\n"), 3s)),
              "HTTP/1.1 403 Forbidden");
    EXPECT_EQ(status_line(sender.answer_to_head(head(1, "ack/" + message_id(1), big), 3s)),
              "HTTP/1.1 401 Unauthorized");
    const std::string answer = sender.answer_to_head(
        head(1, "up", "Content-Length: 70000000\r\nAuthorization: Bearer token-1\r\n"), 3s);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 413 Payload Too Large");
    EXPECT_NE(answer.find("a body may hold 67108864 bytes at most"), std::string::npos) << answer;
    // An encoding the gateway does not pass on: refused on the head too. Only an upload may come
    // gzip (sync.receive reads it).
    for (const auto& [route, encoding, why] : std::vector<std::array<std::string, 3>>{
             {"up", "br", "send the body as it is, or gzip"},
             {"refused/" + message_id(1), "gzip", "send the body as it is"}}) {
        const std::string refusal =
            sender.answer_to_head(head(1, route,
                                       "Content-Length: 100\r\nContent-Encoding: " + encoding +
                                           "\r\nAuthorization: Bearer token-1\r\n"),
                                  3s);
        EXPECT_EQ(status_line(refusal), "HTTP/1.1 415 Unsupported Media Type") << route;
        EXPECT_NE(refusal.find("Content-Encoding " + encoding + " is not taken: " + why + "\n"),
                  std::string::npos)
            << refusal;
    }
    // A device that may send its body still does.
    auto filed =
        sender.up(1, R"({"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[]})", 1);
    ASSERT_TRUE(filed);
    EXPECT_EQ(filed->status, 500) << filed->body;  // its role is not sync_receiver here
    EXPECT_EQ(filed->body, "permission denied for function receive\n");
}

// Deadlines (issue 36): a head that comes too slowly, a body that does, and a kept-alive
// connection without a request each end; a connection past --devices is answered 503 at once.
// Before, a slow client held one of --devices threads for as long as it kept sending a byte.
TEST(PullSender, SlowAndIdleClientsMeetDeadlinesAndDevicesBoundTheConnections) {
    Outbox outbox("pull_deadlines", 1, 1);
    TempDir dir;
    PullSender sender(outbox, dir, "1", "",
                      {"--header-timeout", "1", "--idle-timeout", "2", "--devices", "4"});
    const std::string line = "GET /replicas/" + replica_id(1) + "/next HTTP/1.1\r\n";
    const auto started = Clock::now();
    Raw slow_head(sender.port());
    ASSERT_TRUE(slow_head.write(line + "Host: gateway\r\n"));  // and then nothing more
    Raw slow_body(sender.port());
    ASSERT_TRUE(slow_body.write("POST /replicas/" + replica_id(1) +
                                "/up HTTP/1.1\r\nAuthorization: Bearer token-1\r\n"
                                "Content-Length: 1000\r\n\r\n{\"v\":1"));
    Raw idle(sender.port());
    {
        Raw past(sender.port());  // four held: the next one is one too many
        Raw one_more(sender.port());
        EXPECT_EQ(status_line(one_more.read_until_closed(2s)), "HTTP/1.1 503 Service Unavailable");
        EXPECT_TRUE(one_more.closed());
    }
    EXPECT_EQ(status_line(slow_head.read_until_closed(3s)), "HTTP/1.1 408 Request Timeout");
    EXPECT_TRUE(slow_head.closed());
    EXPECT_EQ(status_line(slow_body.read_until_closed(3s)), "HTTP/1.1 408 Request Timeout");
    EXPECT_TRUE(slow_body.closed());
    EXPECT_EQ(idle.read_until_closed(4s), "") << "an idle connection is closed, unanswered";
    EXPECT_TRUE(idle.closed());
    EXPECT_LT(Clock::now() - started, 6s);
    // The gateway serves on.
    auto served = sender.get_next(1, 1);
    ASSERT_TRUE(served);
    EXPECT_EQ(served->status, 200);
}

// What device writers and operators expect (issue 36 item 6): a POST without a body or a
// Content-Length is an ack; a body's content type is not read (curl's default form type); a
// chunked body is refused saying what to send; two requests in one write are both answered.
TEST(PullSender, AnAckWithoutABodyAndABodyOfAnyContentTypeAreServed) {
    Outbox outbox("pull_bodies", 1, 2);
    TempDir dir;
    PullSender sender(outbox, dir, "1");
    const std::string auth = "Authorization: Bearer token-1\r\n";
    const std::string next = "GET /replicas/" + replica_id(1) + "/next HTTP/1.1\r\n" + auth;
    {
        Raw device(sender.port());
        ASSERT_TRUE(device.write(next + "\r\n" + "POST /replicas/" + replica_id(1) + "/ack/" +
                                 message_id(1) + " HTTP/1.1\r\n" + auth +
                                 "Connection: close\r\n\r\n"));
        const std::string answers = device.read_until_closed(5s);
        EXPECT_EQ(status_line(answers), "HTTP/1.1 200 OK") << answers;
        EXPECT_NE(answers.find("message-id: " + message_id(1)), std::string::npos) << answers;
        EXPECT_NE(answers.find("taken " + message_id(1)), std::string::npos) << answers;
    }
    EXPECT_EQ(unsent_of(outbox, 1), 1);
    const std::string why(9000, 'x');
    auto head = sender.get_next(1, 1);
    ASSERT_TRUE(head);
    EXPECT_EQ(head->get_header_value("message-id"), message_id(2));
    auto refused =
        sender.client().Post(("/replicas/" + replica_id(1) + "/refused/" + message_id(2)).c_str(),
                             httplib::Headers{{"Authorization", "Bearer token-1"}},
                             "{\"why\":\"" + why + "\"}", "application/x-www-form-urlencoded");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 200) << refused->body;
    Raw chunked(sender.port());
    ASSERT_TRUE(chunked.write("POST /replicas/" + replica_id(1) + "/up HTTP/1.1\r\n" + auth +
                              "Transfer-Encoding: chunked\r\n\r\n"));
    const std::string answer = chunked.read_until_closed(2s);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 411 Length Required");
    EXPECT_NE(answer.find("send the body with a Content-Length, not chunked"), std::string::npos);
}

// --cors-origin: a page of that origin may call the gateway from a browser. A preflight of a
// gateway path is answered 204 without a token, and every answer (a head, a 204, a refusal)
// names the origin, and lets the page read message-id; without the option an OPTIONS is 405 and
// no answer names an origin.
TEST(PullSender, CorsOriginAnswersABrowsersPreflightAndEveryRequest) {
    Outbox outbox("pull_cors", 1, 1);
    TempDir dir;
    const std::string origin = "http://127.0.0.1:8080";
    PullSender sender(outbox, dir, "1", "", {"--cors-origin", origin});
    const std::string next = "/replicas/" + replica_id(1) + "/next";

    auto preflight = sender.client().Options(
        next.c_str(), httplib::Headers{
                          {"Origin", origin},
                          {"Access-Control-Request-Method", "GET"},
                          {"Access-Control-Request-Headers", "authorization"},
                      });
    ASSERT_TRUE(preflight);
    EXPECT_EQ(preflight->status, 204);
    EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), origin);
    EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Methods"), "GET, POST, OPTIONS");
    EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Headers"),
              "Authorization, Content-Type, Content-Encoding");
    EXPECT_EQ(preflight->get_header_value("Access-Control-Max-Age"), "600");
    EXPECT_EQ(preflight->body, "");
    auto up_preflight = sender.client().Options(("/replicas/" + replica_id(1) + "/up").c_str());
    ASSERT_TRUE(up_preflight);
    EXPECT_EQ(up_preflight->status, 204);
    auto no_path = sender.client().Options("/elsewhere");
    ASSERT_TRUE(no_path);
    EXPECT_EQ(no_path->status, 404);
    EXPECT_EQ(no_path->get_header_value("Access-Control-Allow-Origin"), origin);

    auto head = sender.get_next(1, 1);
    ASSERT_TRUE(head);
    EXPECT_EQ(head->status, 200);
    EXPECT_EQ(head->get_header_value("Access-Control-Allow-Origin"), origin);
    EXPECT_EQ(head->get_header_value("Access-Control-Expose-Headers"), "message-id");
    EXPECT_EQ(head->get_header_value("message-id"), message_id(1));
    auto ack = sender.ack(1, message_id(1), 1);
    ASSERT_TRUE(ack);
    EXPECT_EQ(ack->status, 200);
    EXPECT_EQ(ack->get_header_value("Access-Control-Allow-Origin"), origin);
    auto none = sender.get_next(1, 1);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 204);
    EXPECT_EQ(none->get_header_value("Access-Control-Allow-Origin"), origin);
    auto no_token = sender.get_next(1, 0);
    ASSERT_TRUE(no_token);
    EXPECT_EQ(no_token->status, 401);
    EXPECT_EQ(no_token->get_header_value("Access-Control-Allow-Origin"), origin);

    PullSender plain(outbox, dir, "1");
    auto refused = plain.client().Options(next.c_str());
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 405);
    EXPECT_FALSE(refused->has_header("Access-Control-Allow-Origin"));
    auto asked = plain.get_next(1, 1);
    ASSERT_TRUE(asked);
    EXPECT_FALSE(asked->has_header("Access-Control-Allow-Origin"));
}

// --metrics works for pull (it was ignored): requests by route and status, bytes, devices
// connected and long polls waiting.
TEST(PullSender, MetricsCountRequestsByRouteAndStatus) {
    Outbox outbox("pull_metrics", 1, 1);
    TempDir dir;
    const int metrics_port = free_port();
    PullSender sender(outbox, dir, "3", "",
                      {"--metrics", "127.0.0.1:" + std::to_string(metrics_port)});
    EXPECT_EQ(sender.get_next(1, 0)->status, 401);
    EXPECT_EQ(sender.get_next(1, 1)->status, 200);
    EXPECT_EQ(sender.ack(1, message_id(1), 1)->status, 200);
    EXPECT_EQ(sender.ack(1, message_id(1), 1)->status, 409);
    EXPECT_EQ(sender.client().Get("/nowhere")->status, 404);
    auto waiting = std::async(std::launch::async, [&] { return sender.get_next(1, 1); });
    httplib::Client scrape("127.0.0.1", metrics_port);
    std::string text;
    ASSERT_TRUE(eventually([&] {
        auto answer = scrape.Get("/metrics");
        text = answer ? answer->body : "";
        return text.find("magic_sync_pull_waiting 1\n") != std::string::npos;
    })) << text;
    // The fixture's probe asked once before, unauthenticated.
    for (const char* line : {"magic_sync_pull_requests_total{route=\"next\",status=\"401\"} 2\n",
                             "magic_sync_pull_requests_total{route=\"next\",status=\"200\"} 1\n",
                             "magic_sync_pull_requests_total{route=\"ack\",status=\"200\"} 1\n",
                             "magic_sync_pull_requests_total{route=\"ack\",status=\"409\"} 1\n",
                             "magic_sync_pull_requests_total{route=\"other\",status=\"404\"} 1\n",
                             "magic_sync_pull_connections 1\n"})
        EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;
    EXPECT_EQ(text.find("magic_sync_pull_read_bytes_total 0\n"), std::string::npos) << text;
    EXPECT_EQ(text.find("magic_sync_pull_written_bytes_total 0\n"), std::string::npos) << text;
    EXPECT_EQ(waiting.get()->status, 204);
}

// A gateway that listens beyond loopback says once that tokens and data cross in plain HTTP.
TEST(PullSender, SaysOnceThatListeningBeyondLoopbackIsPlainHttp) {
    Outbox outbox("pull_plain", 1, 0);
    outbox.sql(
        "CREATE TABLE IF NOT EXISTS public.device_token (token text PRIMARY KEY, replica uuid);"
        "GRANT SELECT ON public.device_token TO PUBLIC");
    TempDir dir;
    Process gateway({sender_binary(), "--db", outbox.conninfo(), "--transport", "pull", "--listen",
                     "0.0.0.0:" + std::to_string(free_port()), "--token-query", kTokenQuery},
                    dir.path() + "/gateway.log");
    ASSERT_TRUE(eventually([&] {
        return gateway.log().find("pull: serving devices") != std::string::npos;
    })) << gateway.log();
    const std::string log = gateway.log();
    const std::string said =
        "is not a loopback address: devices' tokens and data cross the "
        "network in plain HTTP; put a reverse proxy with TLS in front";
    EXPECT_NE(log.find(said), std::string::npos) << log;
    EXPECT_EQ(log.find(said), log.rfind(said)) << log;
}

// Out of open files, the gateway leaves new devices in the listen queue (it used to be able to
// spin on a listener it could not accept from) and takes them once a connection closes.
TEST(PullSender, OutOfOpenFilesNewDevicesWaitUntilOneCloses) {
    Outbox outbox("pull_files", 1, 1);
    outbox.sql(
        "CREATE TABLE IF NOT EXISTS public.device_token (token text PRIMARY KEY, replica uuid);"
        "INSERT INTO public.device_token VALUES ('token-1', '" +
        replica_id(1) + "') ON CONFLICT DO NOTHING; GRANT SELECT ON public.device_token TO PUBLIC");
    TempDir dir;
    const int port = free_port();
    Process gateway(
        {"/usr/bin/prlimit", "--nofile=40:40", "--", sender_binary(), "--db", outbox.conninfo(),
         "--transport", "pull", "--listen", "127.0.0.1:" + std::to_string(port), "--token-query",
         kTokenQuery, "--wait", "1"},
        dir.path() + "/gateway.log");
    ASSERT_TRUE(eventually([&] {
        return gateway.log().find("pull: serving devices") != std::string::npos;
    })) << gateway.log();
    std::vector<std::unique_ptr<Raw>> idle;
    for (int i = 0; i < 45; ++i) idle.push_back(std::make_unique<Raw>(port));
    ASSERT_TRUE(eventually([&] {
        return gateway.log().find("out of open files at ") != std::string::npos;
    })) << gateway.log();
    Raw device(port);  // waits in the listen queue
    ASSERT_TRUE(device.write("GET /replicas/" + replica_id(1) +
                             "/next HTTP/1.1\r\nAuthorization: Bearer token-1\r\n"
                             "Connection: close\r\n\r\n"));
    idle.clear();
    const std::string answer = device.read_until_closed(10s);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 200 OK") << answer << gateway.log();
}

TEST(PullSender, RefusesATokenQueryThatDoesNotTakeTheToken) {
    Outbox outbox("pull_bad_query", 1, 0);
    std::string output;
    EXPECT_EQ(run(sender_binary() + " --db '" + outbox.conninfo() +
                      "' --transport pull --listen 127.0.0.1:" + std::to_string(free_port()) +
                      " --token-query 'SELECT id FROM sync.replica'",
                  &output),
              1);
    EXPECT_NE(output.find("--token-query must take the token as $1, and nothing else"),
              std::string::npos)
        << output;
}

TEST(PullSender, FailuresSayWhetherAskingAgainMayHelp) {
    for (const char* again : {"08006", "40001", "40P01", "53300", "55000", "57P01"})
        EXPECT_EQ(pull_failure_status(again, false), 503) << again;
    for (const char* same : {"42501", "22P02", "23505", "XX000", "P0001", ""})
        EXPECT_EQ(pull_failure_status(same, false), 500) << same;
    EXPECT_EQ(pull_failure_status("", true), 503);
    EXPECT_EQ(pull_failure_status("42809", false), 409);  // another transport's replica
}

}  // namespace
}  // namespace magic_sync::test::sender
