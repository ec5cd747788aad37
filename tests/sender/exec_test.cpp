// The exec transport through the real program: a shell script per message.
#include <gtest/gtest.h>

#include <fstream>

#include "sender/harness.hpp"

namespace magic_sync::test::sender {
namespace {

TEST(ExecSender, DeliversOnStdinAndClassifiesByExitStatus) {
    Outbox outbox("exec_classify", 4, 3);
    TempDir dir;
    // Replica 1 takes everything; 2 says "try later" (75); 3 refuses; 4 hangs past the timeout.
    // The timeout leaves a shell on a machine busy with other tests time to start (at 0.5 s,
    // replica 2's answer came too late once in a few runs beside the other suites).
    const std::string script = dir.path() + "/deliver.sh";
    std::ofstream(script) << "#!/bin/sh\n"
                          << "case \"$REPLICA\" in\n"
                          << "  *2) echo 'busy, try later' >&2; exit 75 ;;\n"
                          << "  *3) echo 'some noise' >&2; echo 'no such register' >&2; exit 3 ;;\n"
                          << "  *4) echo $$ > " << dir.path() << "/hung.pid; sleep 300 & echo $! > "
                          << dir.path() << "/sleep.pid; wait; exit 0 ;;\n"
                          << "esac\n"
                          // Written once the whole message is read: a try the timeout ends on a
                          // busy machine leaves nothing behind (it is tried again).
                          << "printf '%s\\n%s\\n' \"$MESSAGE_ID\" \"$(cat)\" >> " << dir.path()
                          << "/\"$REPLICA\".out\n";
    SenderProcess sender(outbox, dir,
                         {"--transport", "exec", "--exec", "sh " + script, "--send-timeout", "2",
                          "--lease", "5", "--concurrency", "4", "--once"});
    // Within a fifth of the hanging command's 300 s: it was killed at the timeout, not waited for.
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();

    std::string expected;
    for (int seq = 1; seq <= 3; ++seq)
        expected += message_id(seq) + "\n" + message_body(1, seq) + "\n";
    EXPECT_EQ(read_file(dir.path() + "/" + replica_id(1) + ".out"), expected);
    auto replica = [&](int n, const std::string& column) {
        return outbox.sql(
            "SELECT " + column +
            " FROM sync.replica r LEFT JOIN sync.current_delivery d ON d.replica = r.id "
            "WHERE r.id = '" +
            replica_id(n) + "'");
    };
    EXPECT_EQ(replica(1, "coalesce(last_error, 'none')"), "none");
    EXPECT_EQ(replica(2, "last_error || ' / ' || refusals"), "busy, try later / 0");
    // Refused (maybe more than once: its 200 ms backoff can run out while replica 4 hangs).
    EXPECT_EQ(replica(3, "last_error || ' / ' || (refusals >= 1)"), "no such register / true");
    EXPECT_EQ(replica(4, "last_error || ' / ' || refusals"), "timeout after 2000 ms / 0");
    EXPECT_EQ(outbox.unsent(), 9);
    // The timed-out command was killed with its whole process group.
    for (const char* file : {"/hung.pid", "/sleep.pid"}) {
        const pid_t pid = std::stoi(read_file(dir.path() + file));
        EXPECT_TRUE(eventually([&] { return kill(pid, 0) != 0; }, 5s)) << file;
    }
}

// With --gzip the command reads the message gzip-compressed on stdin, CONTENT_ENCODING=gzip in its
// environment (and none leaks from the sender's own).
TEST(ExecSender, WithGzipTheCommandIsToldAndGzip1ReadsTheMessage) {
    Outbox outbox("exec_gzip", 1, 2);
    TempDir dir;
    const std::string script = dir.path() + "/deliver.sh";
    std::ofstream(script) << "#!/bin/sh\n"
                          << "printf '%s %s\n%s\n' \"$MESSAGE_ID\" \"$CONTENT_ENCODING\" "
                          << "\"$(gzip -dc)\" >> " << dir.path() << "/out\n";
    setenv("CONTENT_ENCODING", "br", 1);
    SenderProcess sender(outbox, dir,
                         {"--transport", "exec", "--exec", "sh " + script, "--once", "--gzip"});
    unsetenv("CONTENT_ENCODING");
    ASSERT_EQ(sender.wait(60s), 0) << sender.log();
    std::string expected;
    for (int seq = 1; seq <= 2; ++seq)
        expected += message_id(seq) + " gzip\n" + message_body(1, seq) + "\n";
    EXPECT_EQ(read_file(dir.path() + "/out"), expected);
    EXPECT_EQ(outbox.unsent(), 0);
}

}  // namespace
}  // namespace magic_sync::test::sender
