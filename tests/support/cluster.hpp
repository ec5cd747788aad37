// A throwaway PostgreSQL cluster for tests: initdb in a temporary directory (as the unprivileged
// postgres user when the tests run as root), magic_sync preloaded, a free loopback port. Stopped
// and removed when the object goes away, also when the test fails.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace magic_sync::test {

class Cluster {
  public:
    // `settings` are extra postgresql.conf lines.
    explicit Cluster(const std::vector<std::string>& settings = {});
    // A cluster made from a base backup of another (`backup`, taken by base_backup), started
    // with `settings` after the backup's own, on `port` (0: a free one): a streaming standby when
    // the backup was taken as one, a point-in-time recovery when `settings` name a target and
    // `recovering` (recovery.signal is written).
    static std::unique_ptr<Cluster> from_backup(const std::string& backup,
                                                const std::vector<std::string>& settings,
                                                int port = 0, bool recovering = false);
    ~Cluster();
    Cluster(const Cluster&) = delete;
    Cluster& operator=(const Cluster&) = delete;

    int port() const { return port_; }
    const std::string& directory() const { return directory_; }
    // A libpq connection string for `database` as the superuser postgres.
    std::string conninfo(const std::string& database = "postgres") const;

    // Creates a database with the magic_sync extension in it.
    void create_database(const std::string& name);
    // Runs SQL in a session of its own and returns what `psql -At` would print: notices, then
    // each statement's rows (columns joined by '|'; the trailing newline cut). Throws
    // std::runtime_error with the error and the notices before it when it fails.
    std::string sql(const std::string& database, const std::string& statements) const;

    void stop(const std::string& mode = "fast");
    void start();
    // A base backup of this running cluster into `directory` (pg_basebackup, its WAL streamed;
    // `standby`: ready to start as a streaming standby of this cluster).
    void base_backup(const std::string& directory, bool standby) const;
    // Listens on `port` from its next start (it is stopped): it takes another's place.
    void move_to_port(int port);
    // Ends a standby's recovery: it becomes a primary on a timeline of its own.
    void promote();
    // The server's log so far, for diagnosing a failure.
    std::string log() const;

  private:
    Cluster(const std::string& make_data, const std::vector<std::string>& settings, int port);
    std::string pg_ctl(const std::string& action, const std::string& mode) const;

    std::string bindir_;
    std::string directory_;
    int port_ = 0;
    bool running_ = false;
};

// PostgreSQL's programs' directory (pg_config --bindir).
std::string pg_bindir();

// A new temporary directory the postgres user may write in (an archive, a base backup).
std::string make_postgres_directory(const std::string& prefix);

// A free TCP port on 127.0.0.1.
int free_port();

// Runs a shell command; returns its exit status and fills `output` with stdout and stderr.
int run(const std::string& command, std::string* output = nullptr);

// Prefixes a command so it runs as the postgres user when we are root.
std::string as_postgres(const std::string& command);

}  // namespace magic_sync::test
