// The CPU time processes have used, read from /proc, for the benchmarks: a process by its pid,
// and a PostgreSQL cluster as its postmaster and every process under it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace magic_sync::test {

// A process's /proc/PID/stat fields after its command (field 3 on), empty when it is gone.
inline std::vector<std::string> stat_fields(pid_t pid) {
    std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(file, line) || line.rfind(')') == std::string::npos) return {};
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> fields;
    for (std::string field; rest >> field;) fields.push_back(field);
    return fields;
}

// The CPU time (user and system) a process has used so far, in seconds; 0 when it is gone.
inline double cpu_seconds(pid_t pid) {
    const std::vector<std::string> fields = stat_fields(pid);
    if (fields.size() < 13) return 0;
    return (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
}

// The pid of the postmaster of the cluster whose data directory is `data`.
inline pid_t postmaster_pid(const std::string& data) {
    std::ifstream pid_file(data + "/postmaster.pid");
    pid_t postmaster = 0;
    pid_file >> postmaster;
    return postmaster;
}

// The CPU time of the postmaster and of every process it started that is still running (the
// backends, the relay worker, the auxiliary processes), in seconds.
inline double cluster_cpu_seconds(pid_t postmaster) {
    double seconds = cpu_seconds(postmaster);
    const std::string parent = std::to_string(postmaster);
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const std::string name = entry.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const std::vector<std::string> fields = stat_fields(std::stoi(name));
        if (fields.size() > 1 && fields[1] == parent) seconds += cpu_seconds(std::stoi(name));
    }
    return seconds;
}

}  // namespace magic_sync::test
