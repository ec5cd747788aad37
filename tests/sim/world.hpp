// The real system a scenario runs against: the server tests' deployment (a throwaway cluster with
// magic_sync preloaded and the relay worker running by itself, the sender over http through the
// router, and one reference replica process per replica, each serving the router and uploading
// with --up as the route's role).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "server/deployment.hpp"
#include "sim/scenario.hpp"

namespace magic_sync::sim {

struct Options {
    int steps = 40;
    std::set<std::string> without;
    bool keep = false;
    bool verbose = false;
    int timeout_seconds = 90;  // for quiescence at a checkpoint
    int bytes_per_message = 12288;
    std::string bin = "build/bin";
};

// Runs a program without a shell; returns its exit status (128 when it did not exit) and
// fills `output` with what it wrote to stdout (stderr too when `with_stderr`).
int run_program(const std::vector<std::string>& arguments, std::string* output,
                bool with_stderr = false);

class World {
  public:
    explicit World(const Options& options);
    ~World();
    World(const World&) = delete;
    World& operator=(const World&) = delete;

    // Runs one step; throws std::runtime_error when it fails.
    void run(const Step& step);

    // The simulation's connection, made again after the server restarted under it.
    test::Connection& db() { return deployment_.db(); }
    test::Cluster& cluster() { return deployment_.cluster(); }
    test::Router& router() { return deployment_.router(); }
    const std::string& directory() const { return deployment_.directory(); }
    const Options& options() const { return options_; }

    std::string replica_id(int n) const;
    // The replica program's `show --json` of replica n.
    std::string show(int n);
    // Keeps the directory, with the server's log, when the world goes (--keep, on a failure).
    void keep_directory() { deployment_.keep_directory(); }

  private:
    std::vector<std::string> replica_command(int n) const;
    void start_replica(int n);
    void start_sender();
    void exec(const std::string& sql);
    test::Connection& route();
    void grant_what_check_names();

    void kill_relay();
    void dump_and_restore();
    void roll_back();
    void pass_fault(const Step& step);
    void filing_fault(const Step& step);
    void receive_until_answered(const Step& step);
    bool waits_on_lock(const std::string& pid);
    void wait_until_it_waits_on_lock(const std::string& pid, const std::string& who);
    void require_nothing_set_aside_of_the_moment(const std::string& after);

    std::string relay_pid();
    void await_relay_other_than(const std::string& pid);

    const Options& options_;
    test::Deployment deployment_;
    std::unique_ptr<test::Connection> route_;  // as the route's role: uploads sent again
    std::map<int, test::ReplicaProcess> replicas_;
    std::map<int, std::string> last_upload_;
    std::string backup_;  // the last base backup's directory (BaseBackup)
};

}  // namespace magic_sync::sim
