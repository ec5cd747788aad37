// The real system a scenario runs against: a throwaway cluster with magic_sync preloaded and the
// relay worker running by itself, the sender over http through the router, and one reference
// replica process per replica, each serving the router and uploading with --up.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "server/pq.hpp"
#include "server/process.hpp"
#include "server/router.hpp"
#include "sim/scenario.hpp"
#include "support/cluster.hpp"

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
    test::Connection& db();
    test::Cluster& cluster() { return *cluster_; }
    test::Router& router() { return *router_; }
    const std::string& directory() const { return directory_; }
    const Options& options() const { return options_; }

    std::string replica_id(int n) const;
    // The replica program's `show --json` of replica n.
    std::string show(int n);
    // Whether the directory is removed when the world goes (--keep keeps a failing one).
    void keep_directory() { keep_ = true; }

  private:
    struct ReplicaProcess {
        std::string id;
        std::string file;
        std::unique_ptr<test::Process> process;
    };

    std::vector<std::string> replica_command(int n) const;
    void start_replica(int n);
    void start_sender();
    void exec(const std::string& sql);
    std::string route_conninfo() const;
    test::Connection& connected(std::unique_ptr<test::Connection>& connection,
                                const std::string& conninfo);
    void grant_what_check_names();

    static constexpr const char* kRouteRole = "sim_route";
    std::string relay_pid();
    void await_relay_other_than(const std::string& pid);

    const Options& options_;
    std::string directory_;
    bool keep_ = false;
    std::unique_ptr<test::Cluster> cluster_;
    std::unique_ptr<test::Connection> db_;
    std::unique_ptr<test::Connection> route_;  // as the route's role: uploads sent again
    std::unique_ptr<test::Router> router_;
    std::unique_ptr<test::Process> sender_;
    std::map<int, ReplicaProcess> replicas_;
    std::map<int, std::string> last_upload_;
};

}  // namespace magic_sync::sim
