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

namespace {

constexpr const char* kRouteRole = "sim_route";

// The relay by itself, quick: passes every 50 ms when idle, what was set aside tried again every
// 2 s, a replicas view read every second, messages small enough that big rows occur.
std::vector<std::string> settings(const Options& options) {
    return {"magic_sync.idle = 50",
            "magic_sync.retry_every = 2",
            "magic_sync.audit_every = 3",
            "magic_sync.replica_scan = 1",
            "magic_sync.prune_every = 3",
            "magic_sync.report_every = 5",
            "magic_sync.backoff = 100",
            "magic_sync.backoff_max = 1000",
            "magic_sync.rows_per_message = 25",
            "magic_sync.bytes_per_message = " + std::to_string(options.bytes_per_message),
            "max_worker_processes = 16"};
}

}  // namespace

// The route files as a role of its own, granted sync_receiver and, on the app's tables, exactly
// what sync.check() says filing needs (see grant_what_check_names()).
World::World(const Options& options)
    : options_(options),
      deployment_(
          "sim", settings(options), "sim",
          "CREATE ROLE " + std::string(kRouteRole) + " LOGIN; GRANT sync_receiver TO " + kRouteRole,
          options.bin) {
    if (db().value("SELECT to_regprocedure('sync.expected(uuid)') IS NULL") == "t")
        throw std::runtime_error("this build has no sync.expected(uuid): the simulation's oracle");
    deployment_.upload_as(kRouteRole);
    start_sender();
}

World::~World() {
    replicas_.clear();
    route_.reset();
    if (!backup_.empty()) test::run("rm -rf " + backup_);
}

test::Connection& World::route() {
    return test::Deployment::connected(route_, deployment_.conninfo() + " user=" + kRouteRole);
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
    return deployment_.replica_program(replicas_.at(n));
}

void World::start_replica(int n) {
    test::ReplicaProcess& replica = replicas_[n] = deployment_.replica(replica_id(n));
    deployment_.start_http_replica(replica);
}

void World::start_sender() { deployment_.start_http_sender({"--send-timeout", "5"}); }

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
            pid = db().value("SELECT sync_internal.relay_lock_holder()");
        } catch (const std::exception&) {
            deployment_.disconnect();
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
            std::string holder = db().value("SELECT sync_internal.relay_lock_holder()");
            if (!holder.empty() && holder != pid) return;
        } catch (const std::exception&) {
            deployment_.disconnect();
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
            route().query("SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))",
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
                    answer = route().value("SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))",
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
            deployment_.sender()->stop(SIGKILL);
            start_sender();
            return;
        case Action::KillReplica: {
            test::Process& process = *replicas_.at(step.replica).process;
            process.stop(SIGKILL);
            process.start();
            return;
        }
        case Action::KillRelay:
            kill_relay();
            return;
        case Action::RestartPostgres: {
            std::string pid = relay_pid();
            deployment_.disconnect();
            route_.reset();
            cluster().stop("immediate");
            cluster().start();
            await_relay_other_than(pid);
            return;
        }
        case Action::Cut:
            deployment_.router().cut(replica_id(step.replica), true);
            return;
        case Action::Heal:
            deployment_.router().cut(replica_id(step.replica), false);
            return;
        case Action::Checkpoint:
            return;
        case Action::DumpRestore:
            dump_and_restore();
            return;
        case Action::RecreateExtension:
            exec(step.sql);
            grant_what_check_names();
            // The filed-upload ids went with the extension: an upload made before, sent again by
            // hand, would be filed again.
            last_upload_.clear();
            return;
        case Action::BaseBackup:
            if (!backup_.empty()) test::run("rm -rf " + backup_);
            backup_ = test::make_postgres_directory("magic_sync_sim_backup");
            cluster().base_backup(backup_ + "/data", false);
            return;
        case Action::RollBack:
            roll_back();
            return;
        case Action::SettingChange:
            exec(step.sql);
            kill_relay();
            return;
    }
}

// kill -9 of the relay's backend (the postmaster restarts every backend), until another holds the
// relay lock.
void World::kill_relay() {
    std::string pid = relay_pid();
    kill(std::stoi(pid), SIGKILL);
    deployment_.disconnect();
    route_.reset();
    await_relay_other_than(pid);
}

// As an operator moves a database: the sender stopped first (so no device is told of what the
// dump will not hold), a custom-format dump, the database dropped and restored from it.
void World::dump_and_restore() {
    deployment_.sender()->stop(SIGTERM);
    const std::string dump = directory() + "/sim.dump";
    const std::string bin = test::pg_bindir();
    std::string output;
    if (test::run(bin + "/pg_dump -Fc -f " + dump + " -d '" + deployment_.conninfo() + "'",
                  &output) != 0)
        throw std::runtime_error("pg_dump failed: " + output);
    deployment_.disconnect();
    route_.reset();
    cluster().sql("postgres", "DROP DATABASE sim WITH (FORCE)");
    cluster().sql("postgres", "CREATE DATABASE sim TEMPLATE template0");
    if (test::run(bin + "/pg_restore -d '" + deployment_.conninfo() + "' " + dump, &output) != 0)
        throw std::runtime_error("pg_restore failed: " + output);
    relay_pid();
    start_sender();
}

// A point-in-time recovery to the end of the last base backup: the cluster stopped at once, the
// backup recovered on its port (recovery.signal, no archive: the WAL it streamed), promoted at
// the end of its WAL on a new timeline.
void World::roll_back() {
    if (backup_.empty()) throw std::runtime_error("no base backup to roll back to");
    deployment_.disconnect();
    route_.reset();
    const int port = cluster().port();
    cluster().stop("immediate");
    deployment_.replace_cluster(test::Cluster::from_backup(
        backup_ + "/data", {"restore_command = '/bin/false'"}, port, true));
    relay_pid();
}

}  // namespace magic_sync::sim
