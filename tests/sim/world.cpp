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

// Every other replica sends its uploads gzip (--gzip-up): filed the same as the others'.
void World::start_replica(int n) {
    test::ReplicaProcess& replica = replicas_[n] = deployment_.replica(replica_id(n));
    deployment_.start_http_replica(replica, {}, "0.2", n % 2 == 1);
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
        case Action::Receive:
            receive_until_answered(step);
            return;
        case Action::PassFault:
            pass_fault(step);
            return;
        case Action::FilingFault:
            filing_fault(step);
            return;
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

// As a device would: sent again until it is answered (a replica the relay has not taken as live
// yet is dropped, unanswered).
void World::receive_until_answered(const Step& step) {
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

namespace {

// A connection of its own, for a session that holds a lock or runs a statement that waits.
std::unique_ptr<test::Connection> session(const std::string& conninfo) {
    return std::make_unique<test::Connection>(conninfo);
}

// Sends `sql` (one statement) without waiting for its result.
void send(test::Connection& connection, const std::string& sql,
          const std::vector<std::string>& params = {}) {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p.c_str());
    if (!PQsendQueryParams(connection.raw(), sql.c_str(), static_cast<int>(values.size()), nullptr,
                           values.data(), nullptr, nullptr, 0))
        throw std::runtime_error(std::string("cannot send: ") + PQerrorMessage(connection.raw()));
}

// Waits for the results of what was sent; returns the error of the first that failed ("" when
// none did), and fills `value` with the first value returned.
std::string finish(test::Connection& connection, std::string* value = nullptr) {
    std::string error;
    while (PGresult* result = PQgetResult(connection.raw())) {
        auto status = PQresultStatus(result);
        if (error.empty() && status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)
            error = PQresultErrorMessage(result);
        if (value && status == PGRES_TUPLES_OK && PQntuples(result) > 0 && PQnfields(result) > 0)
            *value = PQgetvalue(result, 0, 0);
        PQclear(result);
    }
    return error.empty() ? "" : error.substr(0, error.find('\n'));
}

// What no error of the moment may leave in sync.set_aside (pg::is_transient's messages).
const char* const kOfTheMoment =
    "SELECT kind || ': ' || reason FROM sync.set_aside WHERE reason ~ "
    "'canceling statement|lock timeout|deadlock detected|could not serialize|out of memory|"
    "terminating connection'";

}  // namespace

bool World::waits_on_lock(const std::string& pid) {
    return db().value("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = $1::int", {pid}) !=
           "0";
}

void World::wait_until_it_waits_on_lock(const std::string& pid, const std::string& who) {
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!waits_on_lock(pid)) {
        if (std::chrono::steady_clock::now() > deadline)
            throw std::runtime_error(who + " (pid " + pid +
                                     ") did not wait on the lock within 60 s");
        std::this_thread::sleep_for(20ms);
    }
}

void World::require_nothing_set_aside_of_the_moment(const std::string& after) {
    std::string found;
    for (const auto& row : db().query(kOfTheMoment)) found += "\n  " + row[0].value_or("");
    if (!found.empty())
        throw std::runtime_error("set aside for an error of the moment, " + after + ":" + found);
}

// A change committed while another session waits to lock its table: the lock is granted as the
// change commits, before the relay's pass has read the row, so the pass waits on it while it
// encodes the row. A cancel must end that pass (the worker tries again, backed off: a new
// transaction); a lock timeout ends each pass that waits. Nothing is set aside for either, and the
// row arrives once the lock goes (the checkpoint's oracle).
void World::pass_fault(const Step& step) {
    const std::string conninfo = deployment_.conninfo();
    auto writer = session(conninfo);
    auto holder = session(conninfo);
    const std::string holder_pid = holder->value("SELECT pg_backend_pid()");
    // Not under the lock_timeout the relay is given: the holder waits for the writer's commit.
    writer->query("SET lock_timeout = 0");
    holder->query("SET lock_timeout = 0");
    const bool timeout = step.how == "timeout";
    if (timeout) {
        db().query("ALTER SYSTEM SET lock_timeout = '100ms'");
        db().value("SELECT pg_reload_conf()");
        std::this_thread::sleep_for(200ms);  // the worker reads its configuration again
    }
    try {
        writer->query("BEGIN");
        writer->query(step.sql);
        holder->query("BEGIN");
        send(*holder, "LOCK TABLE " + step.table + " IN ACCESS EXCLUSIVE MODE");
        wait_until_it_waits_on_lock(holder_pid, "the session that locks " + step.table);
        writer->query("COMMIT");
        if (std::string error = finish(*holder); !error.empty())
            throw std::runtime_error("cannot lock " + step.table + ": " + error);
        const std::string relay = relay_pid();
        if (timeout) {
            // Passes wait, time out and are tried again, backed off, while the lock is held.
            std::this_thread::sleep_for(800ms);
        } else {
            for (int i = 0; i < 2; ++i) {
                wait_until_it_waits_on_lock(relay, "the relay");
                const std::string began = db().value(
                    "SELECT xact_start FROM pg_stat_activity WHERE pid = $1::int", {relay});
                db().value("SELECT pg_cancel_backend($1::int)", {relay});
                auto deadline = std::chrono::steady_clock::now() + 60s;
                while (db().value("SELECT xact_start FROM pg_stat_activity WHERE pid = $1::int",
                                  {relay}) == began) {
                    if (std::chrono::steady_clock::now() > deadline)
                        throw std::runtime_error(
                            "the relay's pass went on after pg_cancel_backend (60 s in the same "
                            "transaction)");
                    std::this_thread::sleep_for(20ms);
                }
            }
        }
        require_nothing_set_aside_of_the_moment("while " + step.table + " was locked");
        holder->query("ROLLBACK");
    } catch (...) {
        if (timeout) {
            db().query("ALTER SYSTEM RESET lock_timeout");
            db().value("SELECT pg_reload_conf()");
        }
        throw;
    }
    if (timeout) {
        db().query("ALTER SYSTEM RESET lock_timeout");
        db().value("SELECT pg_reload_conf()");
    }
}

// sync.receive of a new upload while its table is locked: cancelled as it waits, or ended by the
// route's statement_timeout. It fails whole (nothing filed, nothing kept); sent again once the
// lock goes, it is filed (the checkpoint checks it is filed once).
void World::filing_fault(const Step& step) {
    auto holder = session(deployment_.conninfo());
    holder->query("BEGIN");
    holder->query("LOCK TABLE " + step.table + " IN ACCESS EXCLUSIVE MODE");
    auto route = session(deployment_.conninfo() + " user=" + kRouteRole);
    const std::string route_pid = route->value("SELECT pg_backend_pid()");
    const std::string receive = "SELECT sync.receive($1::uuid, convert_to($2, 'UTF8'))";
    const std::vector<std::string> params = {replica_id(step.replica), step.json};
    std::string error, answer;
    if (step.how == "timeout") {
        route->query("SET statement_timeout = '200ms'");
        send(*route, receive, params);
        error = finish(*route, &answer);
    } else {
        send(*route, receive, params);
        // A replica that is not known yet is dropped at once, before any table is written.
        auto deadline = std::chrono::steady_clock::now() + 60s;
        while (!waits_on_lock(route_pid) && PQisBusy(route->raw())) {
            if (std::chrono::steady_clock::now() > deadline)
                throw std::runtime_error("sync.receive neither waited on the lock nor answered");
            PQconsumeInput(route->raw());
            std::this_thread::sleep_for(20ms);
        }
        if (PQisBusy(route->raw())) db().value("SELECT pg_cancel_backend($1::int)", {route_pid});
        error = finish(*route, &answer);
    }
    if (error.empty() && answer != "dropped")
        throw std::runtime_error("sync.receive answered " + answer + " while " + step.table +
                                 " was locked and it was " +
                                 (step.how == "timeout" ? "timed out" : "cancelled"));
    require_nothing_set_aside_of_the_moment("after sync.receive failed with \"" + error + "\"");
    holder->query("ROLLBACK");
    receive_until_answered(step);
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
