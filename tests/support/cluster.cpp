#include "support/cluster.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "libpq/connection.hpp"
#include "support/temp_dir.hpp"

namespace magic_sync::test {

namespace {

std::string shell_quote(const std::string& text) {
    std::string quoted = "'";
    for (char c : text) {
        if (c == '\'')
            quoted += "'\\''";
        else
            quoted += c;
    }
    return quoted + "'";
}

std::string trimmed(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
}

}  // namespace

int run(const std::string& command, std::string* output) {
    FILE* pipe = popen((command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) throw std::runtime_error("cannot run: " + command);
    std::string captured;
    std::array<char, 4096> buffer{};
    size_t n = 0;
    while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
        captured.append(buffer.data(), n);
    int status = pclose(pipe);
    if (output != nullptr) *output = captured;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string as_postgres(const std::string& command) {
    if (geteuid() != 0) return command;
    return "runuser -u postgres -- sh -c " + shell_quote(command);
}

namespace {

// The suite's processes reserve the ports they hand out: a lock on a file named by the port, held
// until the process ends, which scripts/cluster.sh's free_port takes too. Two test processes
// running side by side each check a port free before either binds it, and without the lock both
// would take it.
constexpr const char* kPortLocks = "/tmp/magic_sync-ports";

// The lock files this process made, removed as it exits: a process that opens one after that
// makes a new file and locks it, which is right, since this process needs the port no more.
std::vector<std::string>& locks_made() {
    static std::vector<std::string> paths;
    return paths;
}

void remove_locks_made() {
    for (const std::string& path : locks_made()) unlink(path.c_str());
}

bool reserve_port(int port) {
    if (mkdir(kPortLocks, 01777) == 0) chmod(kPortLocks, 01777);  // past the umask: every user's
    const std::string path = std::string(kPortLocks) + "/" + std::to_string(port);
    // Read only: a lock needs no more, and a file another user made stays readable. O_CREAT only
    // when it is not there (protected_regular refuses it on another user's file here).
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return true;  // no lock to take: the bind check alone decides, as it did before
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {  // held, never closed, until exit
        if (locks_made().empty()) std::atexit(remove_locks_made);
        locks_made().push_back(path);
        return true;
    }
    close(fd);
    return false;
}

}  // namespace

int free_port() {
    // Below Linux's ephemeral range (32768 and up), where the local end of any connection the
    // tests' processes make could take a port between the moment it is handed out and the moment
    // its user binds it (scripts/cluster.sh does the same); and never the same port twice in one
    // process.
    static std::set<int> given;
    static std::mt19937 pick(std::random_device{}());
    for (int attempt = 0; attempt < 1000; ++attempt) {
        const int port = 20000 + static_cast<int>(pick() % 12000);
        if (given.count(port)) continue;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = htons(static_cast<uint16_t>(port));
        const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
        close(fd);
        if (free && reserve_port(port) && given.insert(port).second) return port;
    }
    throw std::runtime_error("no free port");
}

namespace {

// The command that makes a fresh cluster's data directory in `directory`/data. make test runs
// initdb once and names the result in MAGIC_SYNC_TEST_PGDATA: a copy of it is the same fresh
// cluster at a tenth of initdb's cost.
std::string fresh_data(const std::string& bindir, const std::string& directory) {
    const char* initialized = std::getenv("MAGIC_SYNC_TEST_PGDATA");
    return initialized != nullptr && *initialized != '\0'
               ? "cp -a " + shell_quote(initialized) + " " + directory + "/data"
               : bindir + "/initdb -D " + directory + "/data -U postgres -A trust --no-sync";
}

}  // namespace

std::string pg_bindir() {
    std::string output;
    if (run("pg_config --bindir", &output) != 0) throw std::runtime_error("pg_config not found");
    return trimmed(output);
}

std::string make_postgres_directory(const std::string& prefix) {
    std::string directory = make_temp_directory(prefix);
    run("chmod 755 " + directory);
    if (geteuid() == 0) run("chown postgres: " + directory);
    return directory;
}

Cluster::Cluster(const std::vector<std::string>& settings) : Cluster("", settings, 0) {}

std::unique_ptr<Cluster> Cluster::from_backup(const std::string& backup,
                                              const std::vector<std::string>& settings, int port,
                                              bool recovering) {
    std::string make_data = "cp -a " + shell_quote(backup) + " {data}";
    if (recovering) make_data += " && touch {data}/recovery.signal";
    return std::unique_ptr<Cluster>(new Cluster(make_data, settings, port));
}

// `make_data` makes the data directory ({data} in it names it); empty: a fresh cluster.
Cluster::Cluster(const std::string& make_data, const std::vector<std::string>& settings, int port) {
    bindir_ = pg_bindir();
    directory_ = make_postgres_directory("magic_sync_cluster");
    port_ = port != 0 ? port : free_port();
    std::string command = make_data.empty() ? fresh_data(bindir_, directory_) : make_data;
    for (size_t at; (at = command.find("{data}")) != std::string::npos;)
        command.replace(at, 6, directory_ + "/data");
    std::string output;
    if (run(as_postgres(command), &output) != 0) {
        run("rm -rf " + directory_);
        throw std::runtime_error("cannot make the cluster's data directory: " + output);
    }
    // Lines appended later win: a cluster made from a backup takes its own port and directory.
    std::ofstream conf(directory_ + "/data/postgresql.conf", std::ios::app);
    conf << "listen_addresses = '127.0.0.1'\n"
         << "port = " << port_ << "\n"
         << "unix_socket_directories = '" << directory_ << "'\n"
         << "shared_preload_libraries = 'magic_sync'\n"
         << "fsync = off\n";
    for (const auto& line : settings) conf << line << "\n";
    conf.close();
    start();
}

Cluster::~Cluster() {
    if (running_) pg_ctl("stop", "immediate");
    run("rm -rf " + directory_);
}

std::string Cluster::pg_ctl(const std::string& action, const std::string& mode) const {
    std::string output;
    std::string command = bindir_ + "/pg_ctl -D " + directory_ + "/data -l " + directory_ +
                          "/server.log -w -t 60 " + action;
    if (!mode.empty()) command += " -m " + mode;
    if (run(as_postgres(command), &output) != 0)
        throw std::runtime_error("pg_ctl " + action + " failed: " + output + "\n" + log());
    return output;
}

void Cluster::start() {
    pg_ctl("start", "");
    running_ = true;
}

void Cluster::stop(const std::string& mode) {
    pg_ctl("stop", mode);
    running_ = false;
}

void Cluster::base_backup(const std::string& directory, bool standby) const {
    std::string output;
    std::string command = bindir_ + "/pg_basebackup -h 127.0.0.1 -p " + std::to_string(port_) +
                          " -U postgres -D " + shell_quote(directory) +
                          " -X stream -c fast --no-sync" + (standby ? " -R" : "");
    if (run(as_postgres(command), &output) != 0)
        throw std::runtime_error("pg_basebackup failed: " + output);
}

void Cluster::move_to_port(int port) {
    port_ = port;
    std::ofstream conf(directory_ + "/data/postgresql.conf", std::ios::app);
    conf << "port = " << port_ << "\n";
}

void Cluster::promote() { pg_ctl("promote", ""); }

std::string Cluster::conninfo(const std::string& database) const {
    return "host=127.0.0.1 port=" + std::to_string(port_) + " user=postgres dbname=" + database;
}

void Cluster::create_database(const std::string& name) {
    sql("postgres", "CREATE DATABASE " + name);
    sql(name, "CREATE EXTENSION magic_sync");
}

// Through libpq, not psql: a test that polls ran a psql process per look (in the sender tests
// it used as much CPU as the server). The answer reads as `psql -At` prints it: each statement's
// rows, columns joined by '|', after the notices the statements raised.
std::string Cluster::sql(const std::string& database, const std::string& statements) const {
    std::unique_ptr<PGconn, decltype(&PQfinish)> connection(nullptr, &PQfinish);
    try {
        connection.reset(libpq::connect(conninfo(database)));
    } catch (const libpq::Failure& e) {
        throw std::runtime_error("cannot connect: " + std::string(e.what()) + "SQL: " + statements);
    }
    std::string notices;
    PQsetNoticeProcessor(
        connection.get(),
        [](void* into, const char* message) { static_cast<std::string*>(into)->append(message); },
        &notices);
    if (PQsendQuery(connection.get(), statements.c_str()) != 1)
        throw std::runtime_error("cannot send: " + std::string(PQerrorMessage(connection.get())) +
                                 "\nSQL: " + statements);
    std::string rows, error;
    while (PGresult* result = PQgetResult(connection.get())) {
        if (PQresultStatus(result) == PGRES_TUPLES_OK) {
            for (int row = 0; row < PQntuples(result); ++row) {
                for (int column = 0; column < PQnfields(result); ++column)
                    rows += (column ? "|" : "") + std::string(PQgetvalue(result, row, column));
                rows += "\n";
            }
        } else if (PQresultStatus(result) == PGRES_FATAL_ERROR) {
            error += PQresultErrorMessage(result);
        }
        PQclear(result);
    }
    if (!error.empty())
        throw std::runtime_error("SQL failed: " + notices + error + "SQL: " + statements);
    return trimmed(notices + rows);
}

std::string Cluster::log() const {
    std::ifstream file(directory_ + "/server.log");
    std::stringstream content;
    content << file.rdbuf();
    return content.str();
}

}  // namespace magic_sync::test
