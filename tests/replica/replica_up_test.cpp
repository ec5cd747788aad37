// The up path against a throwaway PostgreSQL: `upload --up` and `serve --up` call
// sync.receive($1::uuid, $2::bytea); a failing route is retried and the upload goes again under the
// same id. The database here has no magic_sync: a stand-in sync.receive records what it receives
// and can be made to fail (the real one is exercised end to end in tests/server/e2e_test.cpp).
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "lib/replica.hpp"
#include "protocol/gzip.hpp"
#include "replica/support.hpp"
#include "support/cluster.hpp"

namespace magic_sync::replica::test {
namespace {

const char* kStandIn = R"sql(
CREATE SCHEMA sync;
CREATE TABLE public.received (replica uuid, body text, raw bytea,
                              at timestamptz DEFAULT clock_timestamp());
CREATE TABLE public.receive_fails (why text);
CREATE TABLE public.receive_answers (answer text);
CREATE FUNCTION sync.receive(replica uuid, message bytea) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM public.receive_fails) THEN
        RAISE EXCEPTION 'test stand-in: receive fails for now';
    END IF;
    IF EXISTS (SELECT FROM public.receive_answers) THEN
        RETURN (SELECT answer FROM public.receive_answers);  -- nothing taken: dropped, refused
    END IF;
    INSERT INTO public.received (replica, body, raw)
    VALUES (replica, CASE WHEN substr(message, 1, 2) <> '\x1f8b' THEN convert_from(message, 'UTF8') END,
            message);
    RETURN 'filed';
END $$;
)sql";

// The command line of the replica whose file is `db`: its id and file, then `args`.
std::vector<std::string> replica_args(const std::string& db, const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--id", kReplicaId, "--db", db};
    all.insert(all.end(), args.begin(), args.end());
    return all;
}

// --gzip-up sends each upload gzip: the bytes sync.receive is given are one gzip member that
// inflates to the upload, which the server reads by its first bytes.
TEST(UpRouteTest, WithGzipUpTheUploadGoesGzip) {
    magic_sync::test::Cluster cluster;
    cluster.sql("postgres", "CREATE DATABASE shop");
    cluster.sql("shop", kStandIn);
    TempDir dir;
    const std::string db = dir.file("replica.db");
    auto with = [&](const std::vector<std::string>& args) { return replica_args(db, args); };
    std::string out;
    ASSERT_EQ(run_cli(with({"write", "shop.sales",
                            R"({"id":1,"note":")" + std::string(2000, 'x') + R"("})"})),
              0);
    ASSERT_EQ(run_cli(with({"upload"}), &out), 0);
    const std::string plain = out.substr(0, out.size() - 1);  // its line's end
    ASSERT_EQ(run_cli(with({"upload", "--up", cluster.conninfo("shop"), "--gzip-up"}), &out), 0)
        << out;
    const std::string hex = cluster.sql("shop", "SELECT encode(raw, 'hex') FROM public.received");
    std::string sent;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        sent += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    ASSERT_TRUE(protocol::is_gzip(sent)) << hex.substr(0, 40);
    EXPECT_EQ(protocol::gunzip(sent, 1 << 20), plain);
    EXPECT_LT(sent.size(), plain.size() / 10);
    EXPECT_EQ(out, protocol::decode_upload(sent).id + "\n");

    // It compresses what goes up a route: without one it is a usage error.
    EXPECT_EQ(run_cli(with({"upload", "--gzip-up"}), &out), 2);
    EXPECT_NE(out.find("--gzip-up compresses uploads: it goes with --up or --up-via-pull"),
              std::string::npos)
        << out;
}

// libpq quotes an unparsable connection string in its reason, password and all: the route says
// why it cannot connect without it, and keeps the upload.
TEST(UpRouteTest, AConnectionStringThatDoesNotParseIsNotPrinted) {
    TempDir dir;
    const std::string db = dir.file("replica.db");
    auto with = [&](const std::vector<std::string>& args) { return replica_args(db, args); };
    ASSERT_EQ(run_cli(with({"write", "shop.sales", R"({"id":1,"total":5})"})), 0);
    std::string out;
    EXPECT_EQ(
        run_cli(with({"upload", "--up", "postgresql://till:hunter2%zz@127.0.0.1/shop"}), &out), 1);
    EXPECT_NE(out.find("cannot connect to the up route: the connection string does not parse: "
                       "invalid percent-encoded token: \"...\" (what it quotes is not shown: it "
                       "may be a password)"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("hunter2"), std::string::npos) << out;
    ASSERT_EQ(run_cli(with({"upload"}), &out), 0);
    EXPECT_EQ(protocol::decode_upload(out).rows.size(), 1u);
}

TEST(UpRouteTest, UploadsReachSyncReceiveAndFailuresAreRetriedUnderTheSameId) {
    magic_sync::test::Cluster cluster;
    cluster.sql("postgres", "CREATE DATABASE shop");
    cluster.sql("shop", kStandIn);
    TempDir dir;
    std::string db = dir.file("replica.db");
    auto with = [&](const std::vector<std::string>& args) { return replica_args(db, args); };
    std::string conninfo = cluster.conninfo("shop");
    std::string out;
    auto received_count = [&] {
        return cluster.sql("shop", "SELECT count(*) FROM public.received");
    };

    ASSERT_EQ(run_cli(with({"write", "shop.sales", R"({"id":1,"total":5})"})), 0);
    ASSERT_EQ(run_cli(with({"upload", "--up", conninfo}), &out), 0) << out;
    std::string first_id = out.substr(0, 36);
    EXPECT_EQ(run_cli(with({"upload"}), &out), 0);
    EXPECT_EQ(out, "nothing to upload\n");  // sent: not offered again

    EXPECT_EQ(cluster.sql("shop", "SELECT replica FROM public.received"), kReplicaId);
    protocol::Upload received =
        protocol::decode_upload(cluster.sql("shop", "SELECT body FROM public.received"));
    EXPECT_EQ(received.id, first_id);
    ASSERT_EQ(received.rows.size(), 1u);
    EXPECT_EQ(received.rows[0].row, R"({"id":1,"total":5})");

    // The route fails: `upload --up` says so and keeps the upload.
    cluster.sql("shop", "INSERT INTO public.receive_fails VALUES ('down')");
    ASSERT_EQ(run_cli(with({"write", "shop.sales", R"({"id":2,"total":6})"})), 0);
    EXPECT_EQ(run_cli(with({"upload", "--up", conninfo}), &out), 1);
    EXPECT_NE(out.find("test stand-in: receive fails for now"), std::string::npos) << out;
    ASSERT_EQ(run_cli(with({"upload"}), &out), 0);
    std::string pending_id = protocol::decode_upload(out).id;

    // The server drops it (it does not know the replica, e.g. not live yet): nothing was taken,
    // so the upload and what it says stay to be sent again, like a failure.
    cluster.sql("shop",
                "DELETE FROM public.receive_fails; INSERT INTO public.receive_answers VALUES "
                "('dropped')");
    EXPECT_EQ(run_cli(with({"upload", "--up", conninfo}), &out), 1);
    EXPECT_NE(out.find("the server dropped upload " + pending_id +
                       ": it does not know this replica (is it live?)"),
              std::string::npos)
        << out;
    ASSERT_EQ(run_cli(with({"upload"}), &out), 0);
    EXPECT_EQ(protocol::decode_upload(out).id, pending_id);
    // Refused (the server keeps as much from this replica as it may): kept, to go again.
    cluster.sql("shop", "UPDATE public.receive_answers SET answer = 'refused'");
    EXPECT_EQ(run_cli(with({"upload", "--up", conninfo}), &out), 1);
    EXPECT_NE(out.find("the server refused upload " + pending_id +
                       ": it keeps as much from this replica as it may; kept here, it goes "
                       "again later"),
              std::string::npos)
        << out;
    ASSERT_EQ(run_cli(with({"upload"}), &out), 0);
    EXPECT_EQ(protocol::decode_upload(out).id, pending_id);
    cluster.sql(
        "shop",
        "DELETE FROM public.receive_answers; INSERT INTO public.receive_fails VALUES ('down')");

    // serve --up keeps trying; once the route works the same upload arrives, once.
    int port = magic_sync::test::free_port();
    Process serve({replica_binary(), "--id", kReplicaId, "--db", db, "serve", "--listen",
                   "127.0.0.1:" + std::to_string(port), "--up", conninfo, "--upload-every", "0.2"},
                  dir.file("serve.log"));
    ASSERT_TRUE(eventually([&] {
        return serve.log().find("cannot upload, will retry") != std::string::npos;
    })) << serve.log();
    // Every line of its log says when.
    EXPECT_TRUE(std::regex_search(
        serve.log(),
        std::regex(R"(^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} magic-sync-replica: )")))
        << serve.log();
    cluster.sql("shop", "DELETE FROM public.receive_fails");
    ASSERT_TRUE(eventually([&] { return received_count() == "2"; })) << serve.log();
    protocol::Upload resent = protocol::decode_upload(
        cluster.sql("shop", "SELECT body FROM public.received ORDER BY at DESC LIMIT 1"));
    EXPECT_EQ(resent.id, pending_id);
    ASSERT_EQ(resent.rows.size(), 1u);
    EXPECT_EQ(resent.rows[0].row, R"({"id":2,"total":6})");

    // The first provisioning (a new generation) offers the unanswered uploads again under their
    // ids: answers in an outbox of an older generation are gone. The resend also carries what
    // was applied and the holdings, said once.
    ASSERT_EQ(
        http_post(port, rows_message(1, 1,
                                     {chunk("all", 0, 4,
                                            {row("shop.products", R"({"id":1})", R"({"id":1})")})},
                                     {"*"})),
        200);
    ASSERT_TRUE(eventually([&] { return received_count() == "4"; })) << serve.log();
    std::vector<protocol::Upload> resends;
    std::stringstream bodies(
        cluster.sql("shop", "SELECT body FROM public.received ORDER BY at OFFSET 2"));
    for (std::string body; std::getline(bodies, body);) {
        resends.push_back(protocol::decode_upload(body));
    }
    ASSERT_EQ(resends.size(), 2u);
    EXPECT_EQ(resends[0].id, first_id);
    EXPECT_EQ(resends[1].id, pending_id);
    EXPECT_EQ(resends[0].applied, 1);
    ASSERT_EQ(resends[0].holds.count("all"), 1u);
    EXPECT_EQ(resends[0].holds["all"].through, 4);
    EXPECT_EQ(resends[0].holds["all"].fingerprint.count, 1);
    EXPECT_TRUE(resends[1].holds.empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    EXPECT_EQ(received_count(), "4");  // nothing new: nothing more is sent
    EXPECT_EQ(serve.terminate(), 0);
}

}  // namespace
}  // namespace magic_sync::replica::test
