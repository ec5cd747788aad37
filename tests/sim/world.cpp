#include "sim/world.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>

namespace magic_sync::sim {

using namespace std::chrono_literals;

int run_program(const std::vector<std::string>& arguments, std::string* output, bool with_stderr) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
        close(pipe_fds[0]);
        dup2(pipe_fds[1], 1);
        if (with_stderr) {
            dup2(pipe_fds[1], 2);
        } else {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 2);
        }
        std::vector<char*> argv;
        for (const auto& a : arguments) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    close(pipe_fds[1]);
    std::string captured;
    std::array<char, 8192> buffer{};
    ssize_t n = 0;
    while ((n = read(pipe_fds[0], buffer.data(), buffer.size())) > 0)
        captured.append(buffer.data(), static_cast<size_t>(n));
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (output) *output = captured;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

World::World(const Options& options) : options_(options) {
    char pattern[] = "/tmp/magic_sync_sim.XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    directory_ = pattern;
    // The relay by itself, quick: passes every 50 ms when idle, what was set aside tried again
    // every 2 s, a replicas view read every second, messages small enough that big rows occur.
    cluster_ = std::make_unique<test::Cluster>(std::vector<std::string>{
        "magic_sync.database = 'sim'", "magic_sync.idle = 50", "magic_sync.retry_every = 2",
        "magic_sync.audit_every = 3", "magic_sync.replica_scan = 1", "magic_sync.prune_every = 3",
        "magic_sync.report_every = 5", "magic_sync.backoff = 100", "magic_sync.backoff_max = 1000",
        "magic_sync.rows_per_message = 25",
        "magic_sync.bytes_per_message = " + std::to_string(options.bytes_per_message),
        "max_worker_processes = 16"});
    cluster_->create_database("sim");
    // The route files as a role of its own, granted sync_receiver and, on the app's tables,
    // exactly what sync.check() says filing needs (see grant_what_check_names()).
    exec("CREATE ROLE " + std::string(kRouteRole) + " LOGIN; GRANT sync_receiver TO " + kRouteRole);
    if (db().value("SELECT to_regprocedure('sync.expected(uuid)') IS NULL") == "t")
        throw std::runtime_error("this build has no sync.expected(uuid): the simulation's oracle");
    router_ = std::make_unique<test::Router>();
    start_sender();
}

World::~World() {
    sender_.reset();
    replicas_.clear();
    db_.reset();
    route_.reset();
    if (cluster_) {
        std::string log = cluster_->log();
        if (keep_) {
            FILE* file = fopen((directory_ + "/server.log").c_str(), "w");
            if (file) {
                fwrite(log.data(), 1, log.size(), file);
                fclose(file);
            }
        }
        cluster_.reset();
    }
    router_.reset();
    if (!keep_) test::run("rm -rf " + directory_);
}

test::Connection& World::db() { return connected(db_, cluster_->conninfo("sim")); }

std::string World::route_conninfo() const {
    return cluster_->conninfo("sim") + " user=" + kRouteRole;
}

test::Connection& World::connected(std::unique_ptr<test::Connection>& connection,
                                   const std::string& conninfo) {
    if (connection && connection->ok()) return *connection;
    connection.reset();
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
        try {
            auto made = std::make_unique<test::Connection>(conninfo);
            made->value("SELECT 1");
            connection = std::move(made);
            return *connection;
        } catch (const std::exception&) {
            std::this_thread::sleep_for(100ms);
        }
    }
    throw std::runtime_error("the server did not take connections for 60 s");
}

// A user who declares a table runs sync.check() and does what it says; what filing needs beyond
// what it names shows as uploads kept with "permission denied".
void World::grant_what_check_names() {
    for (const auto& row : db().query("SELECT fix FROM sync.check() WHERE fix LIKE 'GRANT %'"))
        exec(*row[0]);
}

std::string World::replica_id(int n) const {
    char id[40];
    snprintf(id, sizeof id, "00000000-0000-0000-0000-%012d", n);
    return id;
}

std::vector<std::string> World::replica_command(int n) const {
    const ReplicaProcess& replica = replicas_.at(n);
    return {options_.bin + "/magic-sync-replica", "--id", replica.id, "--db", replica.file};
}

void World::start_replica(int n) {
    ReplicaProcess& replica = replicas_[n];
    replica.id = replica_id(n);
    replica.file = directory_ + "/replica" + std::to_string(n) + ".db";
    int port = test::free_port();
    router_->route(replica.id, port);
    std::vector<std::string> command = replica_command(n);
    for (const std::string& a :
         {std::string("serve"), std::string("--listen"), "127.0.0.1:" + std::to_string(port),
          std::string("--up"), route_conninfo(), std::string("--upload-every"), std::string("0.2")})
        command.push_back(a);
    replica.process = std::make_unique<test::Process>(
        command, directory_ + "/replica" + std::to_string(n) + ".log");
}

void World::start_sender() {
    sender_ = std::make_unique<test::Process>(
        std::vector<std::string>{
            options_.bin + "/magic-sync-sender", "--db", cluster_->conninfo("sim"), "--transport",
            "http", "--url",
            "http://127.0.0.1:" + std::to_string(router_->port()) + "/replicas/{replica}",
            "--report", "0", "--send-timeout", "5"},
        directory_ + "/sender.log");
}

std::string World::show(int n) {
    std::vector<std::string> command = replica_command(n);
    command.push_back("show");
    command.push_back("--json");
    std::string output;
    if (run_program(command, &output, false) != 0)
        throw std::runtime_error("show failed for replica " + std::to_string(n));
    return output;
}

void World::exec(const std::string& sql) {
    PGresult* result = PQexec(db().raw(), sql.c_str());
    auto status = PQresultStatus(result);
    std::string error = PQresultErrorMessage(result);
    PQclear(result);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        // A failed multi-statement string may leave a transaction open.
        PQclear(PQexec(db().raw(), "ROLLBACK"));
        throw std::runtime_error(error);
    }
}

std::string World::relay_pid() {
    std::string pid;
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (pid.empty() && std::chrono::steady_clock::now() < deadline) {
        try {
            pid = db().value("SELECT sync.relay_lock_holder()");
        } catch (const std::exception&) {
            db_.reset();
        }
        if (pid.empty()) std::this_thread::sleep_for(100ms);
    }
    if (pid.empty()) throw std::runtime_error("no relay holds the lock after 60 s");
    return pid;
}

void World::await_relay_other_than(const std::string& pid) {
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
        try {
            std::string holder = db().value("SELECT sync.relay_lock_holder()");
            if (!holder.empty() && holder != pid) return;
        } catch (const std::exception&) {
            db_.reset();
        }
        std::this_thread::sleep_for(100ms);
    }
    throw std::runtime_error("the relay did not come back within 60 s");
}

void World::run(const Step& step) {
    switch (step.action) {
        case Action::Sql:
            exec(step.sql);
            grant_what_check_names();
            return;
        case Action::StartReplica:
            exec(step.sql);
            grant_what_check_names();
            start_replica(step.replica);
            return;
        case Action::Write: {
            std::vector<std::string> command = replica_command(step.replica);
            for (const std::string& a : {std::string("write"), step.table, step.json})
                command.push_back(a);
            if (!step.key_columns.empty()) {
                command.push_back("--key");
                command.push_back(step.key_columns);
            }
            std::string output;
            if (run_program(command, &output, true) != 0)
                throw std::runtime_error("write failed: " + output);
            // The upload it will go in, printed as the app would take it: sent again later.
            command = replica_command(step.replica);
            command.push_back("upload");
            if (run_program(command, &output, false) == 0 && output.rfind("{", 0) == 0)
                last_upload_[step.replica] = output.substr(0, output.find('\n'));
            return;
        }
        case Action::Resend: {
            if (!last_upload_.count(step.replica)) return;
            connected(route_, route_conninfo())
                .query("SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))",
                       {replica_id(step.replica), last_upload_[step.replica]});
            return;
        }
        case Action::Receive: {
            // As a device would: sent again until it is answered (a replica the relay has not
            // taken as live yet is dropped, unanswered).
            std::string answer;
            auto deadline = std::chrono::steady_clock::now() + 60s;
            while (std::chrono::steady_clock::now() < deadline) {
                try {
                    answer = connected(route_, route_conninfo())
                                 .value("SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))",
                                        {replica_id(step.replica), step.json});
                    if (answer == step.answer || answer == "answered again") return;
                } catch (const std::exception& e) {
                    answer = e.what();
                    route_.reset();
                }
                std::this_thread::sleep_for(200ms);
            }
            throw std::runtime_error("sync.receive did not answer " + step.answer +
                                     " within 60 s: " + answer);
        }
        case Action::KillSender:
            sender_->stop(SIGKILL);
            start_sender();
            return;
        case Action::KillReplica: {
            test::Process& process = *replicas_.at(step.replica).process;
            process.stop(SIGKILL);
            process.start();
            return;
        }
        case Action::KillRelay: {
            std::string pid = relay_pid();
            kill(std::stoi(pid), SIGKILL);
            db_.reset();
            route_.reset();
            await_relay_other_than(pid);
            return;
        }
        case Action::RestartPostgres: {
            std::string pid = relay_pid();
            db_.reset();
            route_.reset();
            cluster_->stop("immediate");
            cluster_->start();
            await_relay_other_than(pid);
            return;
        }
        case Action::Cut:
            router_->cut(replica_id(step.replica), true);
            return;
        case Action::Heal:
            router_->cut(replica_id(step.replica), false);
            return;
        case Action::Checkpoint:
            return;
    }
}

}  // namespace magic_sync::sim
