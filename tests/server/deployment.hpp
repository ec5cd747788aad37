// One deployment of magic_sync for the server tests: a throwaway cluster with magic_sync preloaded
// (the relay worker running by itself) and the test's database, a work directory for the
// processes' files and logs, a router of the test's own between the sender and the replicas
// (which can cut a replica's line, and sees every delivery), and the real programs:
// magic-sync-sender over http or nats and magic-sync-replica processes serving http or consuming
// from NATS. Everything it
// started stops, and its directory goes (unless kept), when it is destroyed. The server tests,
// the benchmarks and the simulation (tests/sim) all stand on it.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/holdings.hpp"
#include "server/pq.hpp"
#include "server/process.hpp"
#include "server/router.hpp"
#include "support/cluster.hpp"
#include "support/temp_dir.hpp"

namespace magic_sync::test {

class Deployment {
  public:
    // A cluster with `settings` and `database` made by `schema`; `name` names the work directory,
    // `bin` the directory of the programs.
    Deployment(const std::string& name, std::vector<std::string> settings,
               const std::string& database, const std::string& schema,
               const std::string& bin = "build/bin")
        : database_(database), bin_(bin) {
        settings.insert(settings.begin(), "magic_sync.database = '" + database + "'");
        cluster_ = std::make_unique<Cluster>(settings);
        cluster_->create_database(database);
        cluster_->sql(database, schema);
        directory_ = make_temp_directory("magic_sync_" + name);
    }
    ~Deployment() {
        sender_.reset();
        router_.reset();
        db_.reset();
        if (keep_) {
            if (FILE* file = fopen((directory_ + "/server.log").c_str(), "w")) {
                const std::string log = cluster_->log();
                fwrite(log.data(), 1, log.size(), file);
                fclose(file);
            }
        }
        cluster_.reset();
        if (!keep_) run("rm -rf " + directory_);
    }
    Deployment(const Deployment&) = delete;
    Deployment& operator=(const Deployment&) = delete;

    Cluster& cluster() { return *cluster_; }

    const std::string& directory() const { return directory_; }
    const std::string& bin() const { return bin_; }
    std::string conninfo() const { return cluster_->conninfo(database_); }
    // Keeps the work directory, with the server's log in it, when the deployment goes.
    void keep_directory() { keep_ = true; }

    // The test's connection to its database; made again after the server restarted under it.
    Connection& db() { return connected(db_, conninfo()); }

    // Connects again, waiting up to a minute for the server to come back.
    void reconnect() {
        db_.reset();
        db();
    }

    // `connection` when it is open, else made again to `conninfo`, waiting up to a minute for
    // the server to come back.
    static Connection& connected(std::unique_ptr<Connection>& connection,
                                 const std::string& conninfo) {
        if (connection && connection->ok()) return *connection;
        connection.reset();
        bool made = eventually(
            [&] {
                try {
                    auto attempt = std::make_unique<Connection>(conninfo);
                    attempt->value("SELECT 1");
                    connection = std::move(attempt);
                    return true;
                } catch (const std::exception&) {
                    return false;
                }
            },
            std::chrono::seconds(60));
        if (!made) throw std::runtime_error("the server did not take connections for 60 s");
        return *connection;
    }

    // The replicas started from now on upload as `role` (by default, as the test's own role).
    void upload_as(const std::string& role) { upload_role_ = role; }
    std::string upload_conninfo() const {
        return upload_role_.empty() ? conninfo() : conninfo() + " user=" + upload_role_;
    }

    // Another cluster takes this one's place (a standby promoted, a backup recovered, on the
    // same port, as a failover behind one address would): the old one stops and goes.
    void replace_cluster(std::unique_ptr<Cluster> cluster) {
        db_.reset();
        cluster_ = std::move(cluster);
    }

    // Drops the test's connection (the next db() connects again).
    void disconnect() { db_.reset(); }

    // The router, made on first use.
    Router& router() {
        if (!router_) router_ = std::make_unique<Router>();
        return *router_;
    }

    // magic-sync-sender over http through the router, with `options` after the usual ones.
    void start_http_sender(const std::vector<std::string>& options = {}) {
        std::vector<std::string> arguments{
            bin_ + "/magic-sync-sender",
            "--db",
            conninfo(),
            "--transport",
            "http",
            "--url",
            "http://127.0.0.1:" + std::to_string(router().port()) + "/replicas/{replica}",
            "--report",
            "0"};
        arguments.insert(arguments.end(), options.begin(), options.end());
        sender_ = std::make_unique<Process>(arguments, directory_ + "/sender.log");
    }
    // magic-sync-sender over nats to `urls` (one server's, or several separated by commas),
    // creating the stream when it is missing, with `options` after the usual ones.
    void start_nats_sender(const std::string& urls, const std::vector<std::string>& options = {}) {
        std::vector<std::string> arguments{bin_ + "/magic-sync-sender",
                                           "--db",
                                           conninfo(),
                                           "--transport",
                                           "nats",
                                           "--nats-url",
                                           urls,
                                           "--nats-create-stream",
                                           "--report",
                                           "0",
                                           "--send-timeout",
                                           "5"};
        arguments.insert(arguments.end(), options.begin(), options.end());
        sender_ = std::make_unique<Process>(arguments, directory_ + "/sender.log");
    }
    // The sender's process, when it was started (stopped with stop_sender, or replaced).
    std::unique_ptr<Process>& sender() { return sender_; }

    // A replica of id `id` whose file is in the work directory; no process yet.
    ReplicaProcess replica(const std::string& id) const {
        ReplicaProcess replica;
        replica.id = id;
        replica.db = directory_ + "/" + id + ".db";
        return replica;
    }

    // Starts the replica's process serving http behind the router on a free port, uploading to
    // the database every `upload_every` seconds (empty: it does not upload), gzip with `gzip_up`;
    // `options` go before `serve`. Returns its port.
    int start_http_replica(ReplicaProcess& replica, const std::vector<std::string>& options = {},
                           const std::string& upload_every = "0.2", bool gzip_up = false) {
        const int port = free_port();
        router().route(replica.id, port);
        std::vector<std::string> arguments{bin_ + "/magic-sync-replica", "--id", replica.id, "--db",
                                           replica.db};
        arguments.insert(arguments.end(), options.begin(), options.end());
        for (const std::string& argument :
             {std::string("serve"), std::string("--listen"), "127.0.0.1:" + std::to_string(port)})
            arguments.push_back(argument);
        if (!upload_every.empty()) {
            for (const std::string& argument : {std::string("--up"), upload_conninfo(),
                                                std::string("--upload-every"), upload_every})
                arguments.push_back(argument);
            if (gzip_up) arguments.push_back("--gzip-up");
        }
        replica.process =
            std::make_unique<Process>(arguments, directory_ + "/" + replica.id + ".log");
        return port;
    }

    // Starts the replica's process consuming from NATS at `urls` (one server's, or several
    // separated by commas), uploading to the database every 0.2 s.
    void start_nats_replica(ReplicaProcess& replica, const std::string& urls) {
        std::vector<std::string> arguments = replica_program(replica);
        for (const std::string& argument :
             {std::string("nats"), std::string("--url"), urls, std::string("--up"),
              upload_conninfo(), std::string("--upload-every"), std::string("0.2")})
            arguments.push_back(argument);
        replica.process =
            std::make_unique<Process>(arguments, directory_ + "/" + replica.id + ".log");
    }

    // The replica program and its options for the replica's file.
    std::vector<std::string> replica_program(const ReplicaProcess& replica) const {
        return {bin_ + "/magic-sync-replica", "--id", replica.id, "--db", replica.db};
    }
    // The replica program's command line for the replica's file.
    std::string replica_cli(const ReplicaProcess& replica) const {
        std::string cli;
        for (const std::string& argument : replica_program(replica))
            cli += (cli.empty() ? "" : " ") + argument;
        return cli;
    }
    // What the replica's file holds, in the form of kExpectedHoldings.
    std::string held(const ReplicaProcess& replica) const {
        return held_by(replica.id, replica.db);
    }

  private:
    std::string database_;
    std::string bin_;
    std::string upload_role_;
    bool keep_ = false;
    std::unique_ptr<Cluster> cluster_;
    std::string directory_;
    std::unique_ptr<Connection> db_;
    std::unique_ptr<Router> router_;
    std::unique_ptr<Process> sender_;
};

}  // namespace magic_sync::test
