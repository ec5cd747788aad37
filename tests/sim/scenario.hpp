// The seeded generator: a random schema, replicas and a history of steps, all decided before
// anything runs, from the seed alone (the generator keeps its own model of the tables and the
// replicas and never looks at the real system). The same seed and options give the same steps.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace magic_sync::sim {

// What a step does to the world.
enum class Action {
    Sql,              // run `sql` (one or more statements) on the database
    StartReplica,     // run `sql`, then start the process of replica `replica`
    Write,            // replica `replica` queues a local write of `table`: `json`
    Resend,           // the last upload replica `replica` printed goes again through sync.receive
    Receive,          // `json`, a whole upload made by hand, goes through sync.receive as from
                      // replica `replica` (a device that is not the reference replica)
    KillSender,       // kill -9 of the sender, then a new one
    KillReplica,      // kill -9 of replica `replica`'s process, then it starts again
    KillRelay,        // kill -9 of the relay's backend (the postmaster restarts every backend)
    RestartPostgres,  // pg_ctl stop -m immediate, then start
    Cut,              // the router cuts replica `replica`'s line
    Heal,             // the router heals it
    Checkpoint,       // wait for quiescence and check everything
    // PostgreSQL's own operations (the history group):
    DumpRestore,        // the sender stopped, pg_dump -Fc, DROP DATABASE, pg_restore, a new sender
    RecreateExtension,  // run `sql` (DROP and CREATE EXTENSION, the declarations again); the
                        // uploads made so far are not sent again by hand (their ids are forgotten)
    BaseBackup,         // pg_basebackup of the running cluster, kept for RollBack
    RollBack,           // the cluster stopped at once and the last base backup recovered in its
                        // place (a new timeline): the database goes back to that point
    SettingChange,  // run `sql` (ALTER DATABASE ... SET), then kill -9 of the relay's backend so
                    // the relay connects again under the database's new settings
    // Errors of the moment (`how`: "cancel" or "timeout"), each while another session holds an
    // ACCESS EXCLUSIVE lock on `table`; nothing may be set aside for them:
    PassFault,    // `sql` changes a row of `table`; the pass that plans it waits on the lock and is
                  // cancelled (pg_cancel_backend, which must end the pass) or times out
                  // (lock_timeout, set for the cluster while the lock is held)
    FilingFault,  // `json`, an upload of a row of `table` as from replica `replica`, goes through
                  // sync.receive, which waits on the lock and is cancelled or times out
                  // (statement_timeout on the route's session); then it is sent again until it is
                  // answered `answer`
};

// An upload the simulation made, and what it must come to.
struct Upload {
    int replica = 0;
    std::string table;     // as it travels, e.g. sim.r1
    std::string key;       // its key, JSON
    std::string contains;  // what the filed row must contain (jsonb @>)
    int blocker = 0;       // the blocker that keeps it from being filed until fixed (0: none)
    bool never = false;    // never filed (an upload of a catalog row): kept with a reason
    bool crafted = false;  // made by hand, not by a reference replica: no kept list to check
};

// What a checkpoint verifies of one upload.
struct Verify {
    int upload = 0;
    bool filed = true;  // filed by now; false: kept with its reason
};

struct Step {
    std::string kind;  // the generator's name for it (see step_kinds())
    Action action = Action::Sql;
    std::string sql;
    int replica = 0;
    std::string table;           // Write
    std::string json;            // Write
    std::string key_columns;     // Write: --key
    int upload = -1;             // Write, Receive: its index in Scenario::uploads
    std::string answer;          // Receive, FilingFault: what sync.receive must answer
    std::string how;             // PassFault, FilingFault: "cancel" or "timeout"
    int unblocks = 0;            // the blocker this step fixes
    std::vector<int> live;       // Checkpoint: the replicas that are live now
    std::vector<Verify> verify;  // Checkpoint: uploads to check

    // One readable line.
    std::string text() const;
};

struct Scenario {
    uint64_t seed = 0;
    bool partitioned = false;
    int replicas = 0;  // replicas numbered 1..replicas exist at some point
    std::vector<Step> steps;
    std::vector<Upload> uploads;
};

struct StepKind {
    std::string name;
    std::string group;  // data, replicas, schema, uploads, faults
    std::string what;
};

// Every kind of step the generator makes, with its group.
const std::vector<StepKind>& step_kinds();

// `steps` random steps after the set-up; `without` names kinds or groups left out.
Scenario generate(uint64_t seed, int steps, const std::set<std::string>& without);

}  // namespace magic_sync::sim
