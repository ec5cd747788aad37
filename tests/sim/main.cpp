// The seeded whole-system simulation (issue 19): a random schema, replicas and history of steps
// from a seed, run against real processes, every replica checked against sync.expected at
// checkpoints. `build/tests/sim --help` says how to run and replay it.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "sim/checks.hpp"
#include "sim/scenario.hpp"
#include "sim/world.hpp"

namespace magic_sync::sim {
namespace {

const char* const kHelp =
    R"(usage: build/tests/sim [--seed N | --seeds N | --from A --to B] [OPTIONS]

The seeded whole-system simulation of magic_sync. From each seed it generates a random schema
(3-6 tables of every declaration kind, keys of every kind, columns of many types), 3-8 replicas
and a random history of steps, and runs it against real processes: a throwaway PostgreSQL with
magic_sync preloaded and its relay worker, magic-sync-sender over http through a router that can
cut lines, and one magic-sync-replica serve process per replica. At checkpoints and at the end
it waits until everything is quiet and checks every live replica against sync.expected row by
row and scope by scope, the server's fingerprints, every upload (filed exactly once, or kept
with its reason), the largest message each replica got, and sync.status. The same seed and
options give the same steps. Run it from the repository's root, after `make install`.

  --seed N          run seed N (default 1)
  --seeds N         run seeds 1..N, one line each, then the figures
  --from A --to B   run seeds A..B
  --steps N         random steps after the set-up (default 40)
  --without LIST    leave out step kinds or groups, comma separated (groups: data, replicas,
                    schema, uploads, faults, history); --list-kinds names them all
  --list-kinds      print every step kind with its group, and exit
  --print           print the steps of each seed without running them
  --timeout S       seconds a checkpoint waits for quiescence (default 90)
  --bytes N         magic_sync.bytes_per_message of the cluster (default 12288)
  --keep            keep the work directory (replica files, logs, server log) of a failing seed
  --verbose         print each step as it runs
  --bin DIR         where magic-sync-sender and magic-sync-replica are (default build/bin)
  --help            this text

A failing seed prints its seed, its whole step log, what differed, the tail of the server log
and the command that replays it. `make sim SEED=n` replays one seed, `make sim SEEDS=200` runs
seeds 1..200; SIM_ARGS='--steps 60 --without faults' passes options. Exit status 0 when every
seed passed, 1 when one failed, 2 for a usage error.
)";

struct Outcome {
    bool passed = true;
    int steps = 0;
    std::string report;
};

std::string replay_command(uint64_t seed, const Options& options, const Options& defaults) {
    std::string args;
    if (options.steps != defaults.steps) args += " --steps " + std::to_string(options.steps);
    if (!options.without.empty()) {
        std::string list;
        for (const auto& w : options.without) list += (list.empty() ? "" : ",") + w;
        args += " --without " + list;
    }
    if (options.bytes_per_message != defaults.bytes_per_message)
        args += " --bytes " + std::to_string(options.bytes_per_message);
    std::string command = "make sim SEED=" + std::to_string(seed);
    if (!args.empty()) command += " SIM_ARGS='" + args.substr(1) + "'";
    return command;
}

std::string tail(const std::string& text, int lines) {
    size_t at = text.size();
    for (int i = 0; i <= lines && at != std::string::npos && at > 0; ++i)
        at = text.rfind('\n', at - 1);
    return at == std::string::npos ? text : text.substr(at + 1);
}

Outcome run_seed(uint64_t seed, const Options& options, std::map<std::string, int>& kinds) {
    Outcome outcome;
    Scenario scenario = generate(seed, options.steps, options.without);
    World world(options);
    size_t failed_at = scenario.steps.size();
    std::string what;
    for (size_t i = 0; i < scenario.steps.size(); ++i) {
        const Step& step = scenario.steps[i];
        if (options.verbose) std::cerr << "[" << i << "] " << step.text() << std::endl;
        ++kinds[step.kind];
        ++outcome.steps;
        try {
            if (step.action == Action::Checkpoint) {
                what = checkpoint(world, scenario, step);
            } else {
                world.run(step);
            }
        } catch (const std::exception& e) {
            what = std::string("the step failed: ") + e.what() + "\n";
        }
        if (!what.empty()) {
            failed_at = i;
            break;
        }
    }
    if (failed_at == scenario.steps.size()) return outcome;

    outcome.passed = false;
    // The verdict last: a failed job's log is shown by its end (scripts/run-tests.sh).
    std::ostringstream report;
    report << "server log (last 40 lines):\n" << tail(world.cluster().log(), 40) << "\n";
    report << "seed " << seed << " FAILED at step " << failed_at << " ("
           << scenario.steps[failed_at].kind << ")\n"
           << "replay: " << replay_command(seed, options, Options{}) << "\n"
           << "schema: " << (scenario.partitioned ? "partitioned" : "not partitioned") << ", "
           << scenario.replicas << " replicas\nsteps:\n";
    for (size_t i = 0; i <= failed_at; ++i)
        report << "  [" << i << "] " << scenario.steps[i].text()
               << (i == failed_at ? "   <-- failed here" : "") << "\n";
    report << what;
    if (options.keep) {
        world.keep_directory();
        report << "work directory kept: " << world.directory() << "\n";
    }
    outcome.report = report.str();
    return outcome;
}

std::set<std::string> split(const std::string& text) {
    std::set<std::string> out;
    std::stringstream stream(text);
    std::string item;
    while (std::getline(stream, item, ','))
        if (!item.empty()) out.insert(item);
    return out;
}

int main_(int argc, char** argv) {
    Options options;
    uint64_t from = 1, to = 1;
    bool print = false;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "--help") {
            std::cout << kHelp;
            return 0;
        } else if (arg == "--list-kinds") {
            for (const StepKind& k : step_kinds())
                printf("%-24s %-9s %s\n", k.name.c_str(), k.group.c_str(), k.what.c_str());
            return 0;
        } else if (arg == "--seed") {
            from = to = std::stoull(value());
        } else if (arg == "--seeds") {
            from = 1;
            to = std::stoull(value());
        } else if (arg == "--from") {
            from = std::stoull(value());
        } else if (arg == "--to") {
            to = std::stoull(value());
        } else if (arg == "--steps") {
            options.steps = std::stoi(value());
        } else if (arg == "--without") {
            options.without = split(value());
        } else if (arg == "--timeout") {
            options.timeout_seconds = std::stoi(value());
        } else if (arg == "--bytes") {
            options.bytes_per_message = std::stoi(value());
        } else if (arg == "--print") {
            print = true;
        } else if (arg == "--keep") {
            options.keep = true;
        } else if (arg == "--verbose") {
            options.verbose = true;
        } else if (arg == "--bin") {
            options.bin = value();
        } else {
            throw std::invalid_argument("unknown option " + arg + " (see --help)");
        }
    }
    if (to < from) to = from;
    generate(from, 0, options.without);  // refuses an unknown --without name before anything starts

    if (print) {
        for (uint64_t seed = from; seed <= to; ++seed) {
            Scenario scenario = generate(seed, options.steps, options.without);
            printf("seed %llu: %s, %d replicas\n", static_cast<unsigned long long>(seed),
                   scenario.partitioned ? "partitioned" : "not partitioned", scenario.replicas);
            for (size_t i = 0; i < scenario.steps.size(); ++i)
                printf("  [%zu] %s\n", i, scenario.steps[i].text().c_str());
        }
        return 0;
    }
    std::map<std::string, int> kinds;
    std::vector<uint64_t> failures;
    int steps = 0;
    for (uint64_t seed = from; seed <= to; ++seed) {
        auto start = std::chrono::steady_clock::now();
        Outcome outcome;
        try {
            outcome = run_seed(seed, options, kinds);
        } catch (const std::exception& e) {
            outcome.passed = false;
            outcome.report = "seed " + std::to_string(seed) + " could not run: " + e.what() + "\n";
        }
        steps += outcome.steps;
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        printf("seed %llu: %s, %d steps, %.1f s\n", static_cast<unsigned long long>(seed),
               outcome.passed ? "passed" : "FAILED", outcome.steps, seconds);
        if (!outcome.passed) {
            failures.push_back(seed);
            printf("%s\n", outcome.report.c_str());
        }
        fflush(stdout);
    }
    if (to > from) {
        printf("\nseeds %llu..%llu: %llu seeds, %d steps run\n",
               static_cast<unsigned long long>(from), static_cast<unsigned long long>(to),
               static_cast<unsigned long long>(to - from + 1), steps);
        std::string faults;
        for (const StepKind& k : step_kinds())
            if (k.group == "faults" && kinds.count(k.name))
                faults += " " + k.name + " " + std::to_string(kinds[k.name]);
        printf("faults:%s\n", faults.empty() ? " none" : faults.c_str());
        printf("failures: %zu", failures.size());
        for (uint64_t seed : failures) printf(" %llu", static_cast<unsigned long long>(seed));
        printf("\n");
    }
    return failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace magic_sync::sim

int main(int argc, char** argv) {
    try {
        return magic_sync::sim::main_(argc, argv);
    } catch (const std::invalid_argument& e) {
        std::cerr << "sim: " << e.what() << std::endl;
        return 2;
    }
}
