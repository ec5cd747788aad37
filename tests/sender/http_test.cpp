// The sender as a real process against a local HTTP sink: order, concurrency, classification,
// timeouts, backoff of one replica while the others carry on, kill -9, two senders, reconnects.
#include <gtest/gtest.h>

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "fleet.hpp"
#include "sender/harness.hpp"
#include "sender/sink.hpp"

namespace magic_sync::test::sender {
namespace {

std::vector<std::string> ids_through(int messages) {
    std::vector<std::string> ids;
    for (int seq = 1; seq <= messages; ++seq) ids.push_back(message_id(seq));
    return ids;
}

// Consecutive repeats dropped: what a replica that ignores a message id it already has applies.
std::vector<std::string> without_repeats(std::vector<std::string> ids) {
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

std::string column(const Outbox& outbox, const std::string& expression, int replica) {
    return outbox.sql("SELECT " + expression +
                      " FROM sync.replica r LEFT JOIN sync.current_delivery d "
                      "ON d.replica = r.id WHERE r.id = '" +
                      replica_id(replica) + "'");
}

TEST(HttpSender, DeliversEveryReplicaInOrderConcurrently) {
    constexpr int kReplicas = 24, kMessages = 15;
    Outbox outbox("http_order", kReplicas, kMessages);
    HttpSink sink;
    sink.delay(3ms);
    TempDir dir;
    SenderProcess sender(
        outbox, dir, {"--transport", "http", "--url", sink.url(), "--concurrency", "8", "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();

    for (int r = 1; r <= kReplicas; ++r)
        EXPECT_EQ(sink.ids(replica_id(r), false), ids_through(kMessages)) << replica_id(r);
    for (const Received& received : sink.received()) {
        const int seq = std::stoi(received.message_id.substr(2));
        EXPECT_EQ(received.body,
                  message_body(std::stoi(received.replica.substr(24), nullptr, 16), seq));
    }
    EXPECT_EQ(sink.most_at_once_per_replica(), 1) << "two messages of one replica were in flight";
    EXPECT_GT(sink.most_at_once(), 1) << "no concurrency across replicas";
    EXPECT_LE(sink.most_at_once(), 8);
    EXPECT_EQ(outbox.unsent(), 0);
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.outbox WHERE lease_until IS NOT NULL"), 0);
    EXPECT_EQ(sent_count(sender.log()), kReplicas * kMessages) << sender.log();
    EXPECT_EQ(sender.log().find(kPassword), std::string::npos) << sender.log();
}

// An exchange the database does not answer (here it waits on the lock DROP EXTENSION takes
// first) is said in the log once, when it has waited past the send timeout; answered, the sender
// goes on. (A sender once sat 30 s with its messages leased and nothing in its log.)
TEST(HttpSender, AnExchangeTheDatabaseHoldsIsSaidOnceItWaitsPastTheSendTimeout) {
    Outbox outbox("http_slow_exchange", 1, 1);
    HttpSink sink;
    TempDir dir;
    std::unique_ptr<PGconn, decltype(&PQfinish)> holder(
        PQconnectdb(cluster().conninfo(outbox.name()).c_str()), &PQfinish);
    ASSERT_EQ(PQstatus(holder.get()), CONNECTION_OK);
    const auto run = [&](const char* statement) {
        std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(holder.get(), statement),
                                                             &PQclear);
        ASSERT_EQ(PQresultStatus(result.get()), PGRES_COMMAND_OK) << statement;
    };
    run("BEGIN; LOCK TABLE sync.relay_state IN ACCESS EXCLUSIVE MODE");
    SenderProcess sender(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--send-timeout", "1"});
    const std::string said = "the database has not answered an exchange sent ";
    ASSERT_TRUE(eventually([&] { return sender.log().find(said) != std::string::npos; }, 20s))
        << sender.log();
    std::this_thread::sleep_for(1500ms);  // said once, not once a second
    EXPECT_EQ(sender.log().find(said), sender.log().rfind(said)) << sender.log();
    EXPECT_NE(sender.log().find("s ago (its statements may wait on a lock: see pg_stat_activity)"),
              std::string::npos)
        << sender.log();
    EXPECT_EQ(sink.received().size(), 0u);
    run("COMMIT");
    ASSERT_TRUE(eventually([&] { return sink.taken() == 1; }, 20s)) << sender.log();
    sender.signal(SIGTERM);
    EXPECT_EQ(sender.wait(30s), 0) << sender.log();
}

// A replica's messages are leased as a run and sent one after the other; the sender starts the
// next one only while the lease has the send timeout (and a second) left, so no message of the run
// can still be out when another sender may lease it. Here a run holds about two sends.
TEST(HttpSender, ARunEndsBeforeItsLeaseCould) {
    constexpr int kMessages = 10;
    Outbox outbox("http_run_lease", 1, kMessages);
    HttpSink sink;
    sink.delay(300ms);
    TempDir dir;
    SenderProcess sender(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--run", "10",
                          "--send-timeout", "1", "--lease", "2.5", "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    EXPECT_EQ(sink.ids(replica_id(1), false), ids_through(kMessages));
    EXPECT_EQ(sink.most_at_once_per_replica(), 1);
    EXPECT_EQ(outbox.unsent(), 0);
    // Each lease is recorded on the head of its run: one run of ten would be one.
    EXPECT_GE(outbox.number("SELECT count(*) FROM sync.outbox WHERE tries > 0"), 4);
}

// Leased as runs, a replica's messages still go one at a time and in order, and a whole run goes
// on one lease.
TEST(HttpSender, ARunGoesInOrderOnOneLease) {
    constexpr int kReplicas = 6, kMessages = 12;
    Outbox outbox("http_run", kReplicas, kMessages);
    HttpSink sink;
    sink.delay(2ms);
    TempDir dir;
    SenderProcess sender(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--run", "5", "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    for (int r = 1; r <= kReplicas; ++r)
        EXPECT_EQ(sink.ids(replica_id(r), false), ids_through(kMessages)) << replica_id(r);
    EXPECT_EQ(sink.most_at_once_per_replica(), 1);
    // Runs of 5 from seq 1: each replica's heads 1, 6 and 11 were leased, once each.
    EXPECT_EQ(outbox.sql("SELECT string_agg(format('%s:%s x%s', seq, tries, n), ',' ORDER BY seq) "
                         "FROM (SELECT seq, tries, count(*) AS n FROM sync.outbox WHERE tries > 0 "
                         "GROUP BY seq, tries) leases"),
              "1:1 x6,6:1 x6,11:1 x6");
}

TEST(HttpSender, ClassifiesAnswersAsTakenTransientOrRefused) {
    // replica 1 is answered 200; the others with these statuses. 422 (a protocol version the
    // device does not speak yet) is not a refusal: refusals in a row provision a replica again.
    const std::vector<int> statuses = {200, 503, 429, 408, 500, 400, 404, 409, 422};
    const std::set<int> refused = {400, 404, 409};
    Outbox outbox("http_classify", static_cast<int>(statuses.size()), 2);
    // A backoff --once cannot wait out however slowly it runs (the harness's 200 ms ran out
    // under the sanitizers on a loaded machine, and the head was sent twice).
    outbox.sql(
        "ALTER DATABASE http_classify SET magic_sync.backoff = '10min';"
        "ALTER DATABASE http_classify SET magic_sync.backoff_max = '10min'");
    HttpSink sink;
    for (size_t i = 1; i < statuses.size(); ++i) sink.answer(replica_id(i + 1), statuses[i]);
    TempDir dir;
    SenderProcess sender(outbox, dir, {"--transport", "http", "--url", sink.url(), "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    const std::string log = sender.log();

    EXPECT_EQ(sink.ids(replica_id(1), true), ids_through(2));
    EXPECT_EQ(column(outbox, "coalesce(last_error, 'none')", 1), "none");
    for (size_t i = 1; i < statuses.size(); ++i) {
        const int replica = static_cast<int>(i + 1);
        const int status = statuses[i];
        SCOPED_TRACE("HTTP " + std::to_string(status));
        // Tried once, then in backoff (which --once does not wait out); message 2 never went.
        EXPECT_EQ(sink.ids(replica_id(replica), false), std::vector<std::string>{message_id(1)});
        EXPECT_EQ(column(outbox, "last_error", replica), "HTTP " + std::to_string(status) +
                                                             ": answer " + std::to_string(status) +
                                                             " from the sink");
        EXPECT_EQ(column(outbox, "refusals", replica), refused.count(status) ? "1" : "0");
        EXPECT_EQ(column(outbox, "backoff IS NOT NULL", replica), "t");
        EXPECT_EQ(count_of(log, "replica " + replica_id(replica) + " backing off"), 1) << log;
    }
    EXPECT_EQ(outbox.unsent(), 2 * (static_cast<long long>(statuses.size()) - 1));
}

TEST(HttpSender, NetworkErrorsAreTransient) {
    Outbox outbox("http_network", 3, 2);
    TempDir dir;
    const std::string nobody = "http://127.0.0.1:" + std::to_string(free_port()) + "/{replica}";
    SenderProcess sender(outbox, dir, {"--transport", "http", "--url", nobody, "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    EXPECT_EQ(outbox.unsent(), 6);
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.delivery WHERE last_error LIKE 'network: %' "
                            "AND refusals = 0 AND backoff IS NOT NULL"),
              3)
        << outbox.sql("SELECT last_error FROM sync.delivery");
}

TEST(HttpSender, ASendLongerThanTheTimeoutIsTransient) {
    Outbox outbox("http_timeout", 3, 2);
    HttpSink sink;
    sink.answer(replica_id(1), kHang);
    TempDir dir;
    const auto started = Clock::now();
    SenderProcess sender(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--send-timeout", "0.5",
                          "--lease", "5", "--once"});
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    EXPECT_LT(Clock::now() - started, 10s);
    EXPECT_EQ(column(outbox, "last_error", 1), "timeout after 500 ms");
    EXPECT_EQ(column(outbox, "refusals", 1), "0");
    EXPECT_EQ(sink.ids(replica_id(2), true), ids_through(2));
    EXPECT_EQ(sink.ids(replica_id(3), true), ids_through(2));
}

TEST(HttpSender, AResendCarriesTheSameMessageId) {
    Outbox outbox("http_resend", 1, 3);
    HttpSink sink;
    sink.answer(replica_id(1), 503, 1);  // the first request only
    TempDir dir;
    std::string first_log;
    {
        SenderProcess first(outbox, dir, {"--transport", "http", "--url", sink.url(), "--once"},
                            "1.log");
        ASSERT_EQ(first.wait(60s), 0) << first.log();
        first_log = first.log();
    }
    std::this_thread::sleep_for(300ms);  // the 200 ms backoff
    SenderProcess second(outbox, dir, {"--transport", "http", "--url", sink.url(), "--once"},
                         "2.log");
    ASSERT_EQ(second.wait(60s), 0) << second.log();
    const std::vector<std::string> expected = {message_id(1), message_id(1), message_id(2),
                                               message_id(3)};
    EXPECT_EQ(sink.ids(replica_id(1), false), expected);
    EXPECT_EQ(sink.received()[0].body, sink.received()[1].body);
    // Recovered once, by whichever sender sent it again: on a loaded machine the first one, still
    // running when the 200 ms backoff ended, did (its look for work comes every backoff).
    const std::string logs = first_log + second.log();
    EXPECT_EQ(count_of(logs, "replica " + replica_id(1) + " recovered"), 1) << logs;
    EXPECT_EQ(outbox.number("SELECT tries FROM sync.outbox WHERE seq = 1"), 2);
    EXPECT_EQ(column(outbox, "coalesce(last_error, 'none')", 1), "none");
}

// The throughput of replicas 2..N while replica 1 is answered `cut_status` (200: not cut).
double others_throughput(const std::string& name, int cut_status) {
    constexpr int kReplicas = 9, kMessages = 40;
    Outbox outbox(name, kReplicas, kMessages);
    HttpSink sink;
    sink.delay(10ms);
    sink.answer(replica_id(1), cut_status);
    TempDir dir;
    SenderProcess sender(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--concurrency", "9"});
    const size_t others = (kReplicas - 1) * kMessages;
    auto others_taken = [&] {
        size_t count = 0;
        for (int r = 2; r <= kReplicas; ++r) count += sink.ids(replica_id(r), true).size();
        return count;
    };
    EXPECT_TRUE(eventually([&] { return others_taken() == others; }, 60s)) << sender.log();
    Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
    for (const Received& received : sink.received()) {
        if (received.replica == replica_id(1)) continue;
        first = std::min(first, received.at);
        last = std::max(last, received.at);
    }
    if (cut_status != 200) {
        // Backing off: a handful of tries, one log line, and the others in order regardless.
        EXPECT_LT(sink.ids(replica_id(1), false).size(), 20u);
        EXPECT_EQ(count_of(sender.log(), "replica " + replica_id(1) + " backing off"), 1)
            << sender.log();
        for (int r = 2; r <= kReplicas; ++r)
            EXPECT_EQ(sink.ids(replica_id(r), true), ids_through(kMessages));
        // Cured: it recovers and catches up.
        sink.answer(replica_id(1), 200);
        EXPECT_TRUE(eventually([&] { return outbox.unsent() == 0; }, 30s)) << sender.log();
        EXPECT_EQ(without_repeats(sink.ids(replica_id(1), false)).back(), message_id(kMessages));
        EXPECT_TRUE(eventually(
            [&] { return count_of(sender.log(), "replica " + replica_id(1) + " recovered") == 1; },
            5s))
            << sender.log();
    }
    sender.signal(SIGTERM);
    EXPECT_EQ(sender.wait(30s), 0) << sender.log();
    return others / std::chrono::duration<double>(last - first).count();
}

TEST(HttpSender, ACutReplicaBacksOffWhileTheOthersCarryOn) {
    const double uncut = others_throughput("http_uncut", 200);
    const double cut = others_throughput("http_cut", 503);
    std::printf(
        "[ figures  ] the other replicas: %.0f msg/s uncut, %.0f msg/s with one cut: "
        "ratio %.2f\n",
        uncut, cut, cut / uncut);
    // A figure, not an assertion: the two runs are timed one after the other, and beside the
    // other suites of make test the ratio fell to 0.28 with nothing wrong. What the behaviour
    // needs is asserted in others_throughput: every other replica's messages all delivered, in
    // order, while the cut one backs off (one log line, under 20 tries), then its recovery.
}

TEST(HttpSender, KillNineMidSendThenRestartLosesNothing) {
    constexpr int kReplicas = 8, kMessages = 30;
    Outbox outbox("http_kill", kReplicas, kMessages);
    HttpSink sink;
    sink.delay(20ms);
    TempDir dir;
    const std::vector<std::string> arguments = {"--transport",    "http", "--url",   sink.url(),
                                                "--send-timeout", "0.5",  "--lease", "1"};
    {
        SenderProcess doomed(outbox, dir, arguments, "doomed.log");
        ASSERT_TRUE(eventually([&] { return sink.taken() >= 60 && sink.in_flight() > 0; }, 60s));
        doomed.signal(SIGKILL);
        doomed.wait(10s);
    }
    EXPECT_GT(outbox.unsent(), 0) << "killed too late to prove anything";
    std::this_thread::sleep_for(1200ms);  // the dead sender's leases expire
    std::vector<std::string> restart = arguments;
    restart.push_back("--once");
    SenderProcess again(outbox, dir, restart, "again.log");
    ASSERT_EQ(again.wait(60s), 0) << again.log();
    EXPECT_EQ(outbox.unsent(), 0) << again.log();

    size_t repeats = 0;
    for (int r = 1; r <= kReplicas; ++r) {
        const auto ids = sink.ids(replica_id(r), true);
        // Every message, in order; HTTP does not dedupe, so the message that was in flight when
        // the sender died may arrive twice, under the same id, right after itself.
        EXPECT_EQ(without_repeats(ids), ids_through(kMessages)) << replica_id(r);
        repeats += ids.size() - without_repeats(ids).size();
    }
    EXPECT_LE(repeats, static_cast<size_t>(kReplicas));
    std::printf("[ figures  ] kill -9 mid-send: %zu message(s) delivered twice (same id)\n",
                repeats);
}

TEST(HttpSender, TwoSendersShareTheReplicasWithoutSendingAMessageTwice) {
    constexpr int kReplicas = 20, kMessages = 20;
    Outbox outbox("http_two", kReplicas, kMessages);
    HttpSink sink;
    sink.delay(5ms);
    TempDir dir;
    const std::vector<std::string> arguments = {"--transport",   "http", "--url", sink.url(),
                                                "--concurrency", "5",    "--once"};
    SenderProcess one(outbox, dir, arguments, "one.log");
    SenderProcess two(outbox, dir, arguments, "two.log");
    ASSERT_EQ(one.wait(60s), 0) << one.log();
    ASSERT_EQ(two.wait(60s), 0) << two.log();
    EXPECT_EQ(sink.received().size(), static_cast<size_t>(kReplicas * kMessages));
    for (int r = 1; r <= kReplicas; ++r)
        EXPECT_EQ(sink.ids(replica_id(r), false), ids_through(kMessages)) << replica_id(r);
    EXPECT_EQ(sink.most_at_once_per_replica(), 1);
    EXPECT_GT(sent_count(one.log()), 0) << one.log();
    EXPECT_GT(sent_count(two.log()), 0) << two.log();
    EXPECT_EQ(sent_count(one.log()) + sent_count(two.log()), kReplicas * kMessages);
}

// What a replica that applies only its next message, and takes again as taken one it applied
// already, makes of the messages it took, in the order they came: the seq it reached, how many it
// took a second time, and whether any came before the one it follows (lost or out of order).
struct Applied {
    int reached = 0;
    int repeats = 0;
    bool in_order = true;
};

Applied apply_in_order(const std::vector<std::string>& ids) {
    Applied applied;
    for (const std::string& id : ids) {
        const int seq = std::stoi(id.substr(id.find('.') + 1));
        if (seq == applied.reached + 1)
            ++applied.reached;
        else if (seq <= applied.reached)
            ++applied.repeats;
        else
            applied.in_order = false;
    }
    return applied;
}

// Issue 27: a sender's leases end with its session. A sender with the defaults (runs of 32, the
// server's send timeout of 30 s, a lease of 65 s) is killed with kill -9 in the middle of runs to
// every replica of a slow receiver (50 ms a message). The replicas are taken over by a sender
// started again right after the kill or, with `already_running`, by one that was running before
// it (and had none of them: the first held them all). `seconds`: from the kill until every
// replica took a message that came after it.
void take_over_after_kill(const std::string& name, bool already_running, double* seconds) {
    constexpr int kReplicas = 20, kMessages = 100, kRun = 32;
    Outbox outbox(name, kReplicas, kMessages);
    HttpSink sink;
    sink.delay(50ms);
    TempDir dir;
    const std::vector<std::string> arguments = {"--transport", "http", "--url", sink.url()};
    auto doomed = std::make_unique<SenderProcess>(outbox, dir, arguments, "doomed.log");
    ASSERT_TRUE(eventually(
        [&] {
            for (int r = 1; r <= kReplicas; ++r)
                if (sink.ids(replica_id(r), true).size() < 2) return false;
            return true;
        },
        60s))
        << doomed->log();
    std::unique_ptr<SenderProcess> taker;
    if (already_running) {
        taker = std::make_unique<SenderProcess>(outbox, dir, arguments, "taker.log");
        ASSERT_TRUE(
            eventually([&] { return taker->log().find("connected to") != std::string::npos; }, 30s))
            << taker->log();
        std::this_thread::sleep_for(500ms);  // it looked, and found every replica leased
    }
    const auto killed_at = Clock::now();
    doomed->signal(SIGKILL);
    doomed->wait(10s);
    ASSERT_GT(outbox.unsent(), kReplicas * kMessages / 2) << "killed too late to prove anything";
    if (!already_running)
        taker = std::make_unique<SenderProcess>(outbox, dir, arguments, "taker.log");

    // The first message each replica took that came after the kill: when it was answered.
    const auto first_after_kill = [&](int r) {
        for (const Received& received : sink.received())
            if (received.replica == replica_id(r) && received.arrived > killed_at &&
                received.status >= 200 && received.status < 300)
                return received.at;
        return Clock::time_point::max();
    };
    const auto every_replica_reached = [&] {
        for (int r = 1; r <= kReplicas; ++r)
            if (first_after_kill(r) == Clock::time_point::max()) return false;
        return true;
    };
    // Longer than the dead sender's leases, so that a failure shows how long it took.
    ASSERT_TRUE(eventually(every_replica_reached, 120s)) << taker->log();
    Clock::time_point last = killed_at;
    for (int r = 1; r <= kReplicas; ++r) last = std::max(last, first_after_kill(r));
    *seconds = std::chrono::duration<double>(last - killed_at).count();

    ASSERT_TRUE(eventually([&] { return outbox.unsent() == 0; }, 120s)) << taker->log();
    int repeats = 0;
    for (int r = 1; r <= kReplicas; ++r) {
        SCOPED_TRACE(replica_id(r));
        const Applied applied = apply_in_order(sink.ids(replica_id(r), true));
        EXPECT_TRUE(applied.in_order);
        EXPECT_EQ(applied.reached, kMessages);
        // Again, under the same ids: at most what the dead sender's run had sent and not recorded.
        EXPECT_LE(applied.repeats, kRun);
        repeats += applied.repeats;
    }
    taker->signal(SIGTERM);
    EXPECT_EQ(taker->wait(30s), 0) << taker->log();
    std::printf(
        "[ figures  ] kill -9 of a sender holding runs of %d replicas: every replica took a "
        "message from the %s sender %.2f s after the kill; %d message(s) sent again (same id)\n",
        kReplicas, already_running ? "other" : "restarted", *seconds, repeats);
}

TEST(HttpSender, AKilledSendersReplicasGoToItsRestartAtOnce) {
    double seconds = 0;
    take_over_after_kill("http_takeover_restart", false, &seconds);
    // The bound; the dead sender's leases ran 65 s.
    EXPECT_LE(seconds, 5.0);
}

TEST(HttpSender, AKilledSendersReplicasGoToTheSenderStillRunningAtOnce) {
    double seconds = 0;
    take_over_after_kill("http_takeover_other", true, &seconds);
    EXPECT_LE(seconds, 5.0);
}

TEST(Sender, ReconnectsWhenTheDatabaseComesBackAndLogsItOnce) {
    Outbox outbox("reconnect", 2, 3);
    HttpSink sink;
    TempDir dir;
    SenderProcess sender(outbox, dir, {"--transport", "http", "--url", sink.url()});
    ASSERT_TRUE(eventually([&] { return sink.taken() == 6; }, 30s)) << sender.log();
    cluster().stop("immediate");
    std::this_thread::sleep_for(3500ms);  // several reconnect attempts
    cluster().start();
    outbox.add(1, 2, 4, 5);
    outbox.sql("NOTIFY magic_sync");
    EXPECT_TRUE(eventually([&] { return sink.taken() == 10; }, 40s)) << sender.log();
    sender.signal(SIGTERM);
    EXPECT_EQ(sender.wait(30s), 0);
    const std::string log = sender.log();
    EXPECT_EQ(count_of(log, "database unavailable"), 1) << log;
    EXPECT_EQ(count_of(log, "database reachable again"), 1) << log;
    EXPECT_EQ(sink.ids(replica_id(1), true), ids_through(5));
    EXPECT_EQ(log.find(kPassword), std::string::npos) << log;
}

TEST(Sender, SigtermFinishesWhatIsInFlightAndExitsZero) {
    Outbox outbox("sigterm", 3, 2);
    HttpSink sink;
    for (int r = 1; r <= 3; ++r) sink.answer(replica_id(r), kHang);
    TempDir dir;
    SenderProcess sender(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--send-timeout", "1"});
    ASSERT_TRUE(eventually([&] { return sink.in_flight() == 3; }, 30s)) << sender.log();
    const auto signalled = Clock::now();
    sender.signal(SIGTERM);
    EXPECT_EQ(sender.wait(30s), 0) << sender.log();
    EXPECT_LT(Clock::now() - signalled, 5s);
    // The sends ended by their timeout and were recorded; nothing else was taken on.
    EXPECT_EQ(sink.received().size(), 3u);
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.delivery WHERE last_error LIKE 'timeout%'"),
              3);
    EXPECT_EQ(outbox.number("SELECT count(*) FROM sync.outbox WHERE lease_until IS NOT NULL"), 0);
}

TEST(Sender, ExitsWithAClearErrorWhenTheDatabaseIsAwayInOnceMode) {
    TempDir dir;
    const std::string conninfo = "host=127.0.0.1 port=" + std::to_string(free_port()) +
                                 " user=magic_sender dbname=none password=" + kPassword;
    Process sender(
        {sender_binary(), "--db", conninfo, "--transport", "exec", "--exec", "true", "--once"},
        dir.path() + "/sender.log");
    EXPECT_EQ(sender.wait(30s), 1);
    EXPECT_NE(sender.log().find("cannot connect"), std::string::npos) << sender.log();
    EXPECT_EQ(sender.log().find(kPassword), std::string::npos) << sender.log();
}

TEST(Sender, RefusesBadOptions) {
    std::string output;
    EXPECT_EQ(run(sender_binary() + " --db x --transport http"), 2);
    EXPECT_EQ(run(sender_binary() + " --db x --transport carrier-pigeon", &output), 2);
    EXPECT_NE(output.find("--transport must be http, nats, exec or pull"), std::string::npos)
        << output;
    EXPECT_EQ(run(sender_binary() + " --db x --transport pull --token-query 'SELECT $1'", &output),
              2);
    EXPECT_NE(output.find("--transport pull needs --listen HOST:PORT"), std::string::npos)
        << output;
    EXPECT_EQ(run(sender_binary() + " --db x --transport pull --listen 127.0.0.1:1", &output), 2);
    EXPECT_NE(output.find("--transport pull needs --token-query SQL"), std::string::npos) << output;
    EXPECT_EQ(
        run(sender_binary() + " --db x --transport exec --exec true --lease 1 --send-timeout 2",
            &output),
        2);
    EXPECT_NE(output.find("--lease must be longer"), std::string::npos) << output;
    EXPECT_EQ(run(sender_binary() + " --db x --transport exec --exec true --run 0", &output), 2);
    // One line that says what is wrong and where to look, not the whole help.
    EXPECT_EQ(output,
              "magic-sync-sender: --run needs a whole number from 1 to 100000, not '0' (see "
              "magic-sync-sender --help)\n");
    EXPECT_EQ(
        run(sender_binary() + " --db x --transport exec --exec true --chunk-cache 0", &output), 2);
    EXPECT_NE(output.find("--chunk-cache needs a whole number from 1 to 100000, not '0'"),
              std::string::npos)
        << output;
    EXPECT_EQ(run(sender_binary() + " --db x --transport nats --nats-url nats://a:4222,", &output),
              2);
    EXPECT_NE(output.find("--nats-url 'nats://a:4222,' has an empty URL"), std::string::npos)
        << output;
    EXPECT_EQ(run(sender_binary() + " --db x --transport nats --nats-replicas 3", &output), 2);
    EXPECT_NE(output.find("--nats-replicas is for the stream --nats-create-stream creates"),
              std::string::npos)
        << output;
    EXPECT_EQ(
        run(sender_binary() + " --db x --transport nats --nats-create-stream --nats-replicas 6",
            &output),
        2);
    EXPECT_NE(output.find("--nats-replicas needs a whole number from 1 to 5, not '6'"),
              std::string::npos)
        << output;
    EXPECT_EQ(
        run(sender_binary() + " --db x --transport exec --exec true --cors-origin '*'", &output),
        2);
    EXPECT_NE(output.find("--cors-origin is for --transport pull"), std::string::npos) << output;
    for (const char* origin :
         {"app.example.com", "https://app.example.com/page", "''", "'https://a b'"}) {
        EXPECT_EQ(run(sender_binary() +
                          " --db x --transport pull --listen 127.0.0.1:1 --token-query 'SELECT "
                          "$1' --cors-origin " +
                          origin,
                      &output),
                  2)
            << origin;
        EXPECT_NE(output.find("--cors-origin wants an origin"), std::string::npos) << output;
    }
    EXPECT_EQ(run(sender_binary() + " --help", &output), 0);
    EXPECT_NE(output.find("--concurrency"), std::string::npos);
    EXPECT_NE(output.find("--cors-origin ORIGIN"), std::string::npos);
}

// --metrics serves Prometheus' text format: what was sent, failed and refused, the bytes, the
// send times, what is in flight, and the backlog the database last reported. Two replicas take
// their four messages; the third refuses its first (and backs off for an hour).
TEST(Sender, ServesMetricsForPrometheus) {
    Outbox outbox("http_metrics", 3, 4);
    outbox.sql(
        "ALTER DATABASE http_metrics SET magic_sync.backoff = '1h';"
        " ALTER DATABASE http_metrics SET magic_sync.backoff_max = '1h'");
    HttpSink sink;
    sink.answer(replica_id(3), 400);
    TempDir dir;
    const std::string listen = "127.0.0.1:" + std::to_string(free_port());
    SenderProcess sender(
        outbox, dir,
        {"--transport", "http", "--url", sink.url(), "--metrics", listen, "--report", "0.2"});
    ASSERT_TRUE(eventually([&] { return outbox.unsent() == 4; }, 30s)) << sender.log();

    httplib::Client client("127.0.0.1", std::stoi(listen.substr(listen.find(':') + 1)));
    std::string text;
    std::string type;
    ASSERT_TRUE(eventually(
        [&] {
            const auto answer = client.Get("/metrics");
            if (!answer || answer->status != 200) return false;
            text = answer->body;
            type = answer->get_header_value("Content-Type");
            return text.find("magic_sync_sender_unsent_messages 4\n") != std::string::npos;
        },
        10s))
        << text << sender.log();
    size_t bytes = 0;
    for (int replica = 1; replica <= 2; ++replica)
        for (int seq = 1; seq <= 4; ++seq) bytes += message_body(replica, seq).size();
    EXPECT_EQ(type, "text/plain; version=0.0.4; charset=utf-8");
    for (const std::string& line : {
             std::string("magic_sync_sender_messages_total{transport=\"http\",outcome=\"sent\"} 8"),
             std::string(
                 "magic_sync_sender_messages_total{transport=\"http\",outcome=\"failed\"} 0"),
             std::string(
                 "magic_sync_sender_messages_total{transport=\"http\",outcome=\"refused\"} 1"),
             "magic_sync_sender_sent_bytes_total{transport=\"http\"} " + std::to_string(bytes),
             std::string("magic_sync_sender_in_flight{transport=\"http\"} 0"),
             std::string("magic_sync_sender_send_seconds_bucket{transport=\"http\",le=\"+Inf\"} 9"),
             std::string("magic_sync_sender_send_seconds_count{transport=\"http\"} 9"),
             std::string("# TYPE magic_sync_sender_send_seconds histogram"),
             std::string("magic_sync_sender_replicas_backing_off 1"),
         })
        EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << "\n" << text;

    // The same port serves the fleet page and its data: sync.fleet(), read as the sender's role.
    const auto page = client.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
    EXPECT_EQ(page->body, ::magic_sync::sender::kFleetPage);
    const auto data = client.Get("/fleet.json");
    ASSERT_TRUE(data);
    EXPECT_EQ(data->status, 200);
    EXPECT_EQ(data->get_header_value("Content-Type"), "application/json");
    const nlohmann::json fleet = nlohmann::json::parse(data->body);
    EXPECT_TRUE(fleet["error"].is_null()) << data->body;
    EXPECT_EQ(fleet["fleet"]["replicas"], 3) << data->body;
    EXPECT_EQ(fleet["fleet"]["unsent"], 4) << data->body;
    const nlohmann::json& slowest = fleet["fleet"]["slowest"];
    ASSERT_EQ(slowest.size(), 3u) << data->body;
    EXPECT_EQ(slowest[0]["replica"], replica_id(3));
    EXPECT_EQ(slowest[0]["state"], "failing");
    EXPECT_EQ(slowest[0]["last_error"], "HTTP 400: answer 400 from the sink");
    EXPECT_EQ(slowest[0]["outbox"], 4);
    // No relay runs here: what the others were delivered is not planned in their scopes yet.
    for (const int n : {1, 2}) {
        EXPECT_EQ(slowest[n]["state"], "catching up") << data->body;
        EXPECT_EQ(slowest[n]["state_detail"], "its scopes change at the relay's next pass")
            << data->body;
        EXPECT_EQ(slowest[n]["outbox"], 0) << data->body;
    }
    EXPECT_EQ(fleet["backlog"]["every"], 15);
    EXPECT_EQ(fleet["backlog"]["span"], 3600);

    // A second sender cannot listen there: it says so, and stops.
    SenderProcess second(outbox, dir,
                         {"--transport", "http", "--url", sink.url(), "--metrics", listen},
                         "second.log");
    EXPECT_EQ(second.wait(30s), 1);
    EXPECT_NE(second.log().find("--metrics " + listen +
                                ": cannot listen there (in use, or not an address of this host)"),
              std::string::npos)
        << second.log();
}

}  // namespace
}  // namespace magic_sync::test::sender
