// The pull gateway's command line as the tests and the benchmarks start it.
#pragma once

#include <string>
#include <vector>

namespace magic_sync::test {

// `binary` (magic-sync-sender) serving the database `conninfo` to devices on 127.0.0.1:`port`,
// their tokens checked by `token_query`, a long poll waiting `wait` seconds; `options` after.
inline std::vector<std::string> pull_gateway_command(const std::string& binary,
                                                     const std::string& conninfo, int port,
                                                     const std::string& token_query,
                                                     const std::string& wait,
                                                     const std::vector<std::string>& options = {}) {
    std::vector<std::string> command{binary,
                                     "--db",
                                     conninfo,
                                     "--transport",
                                     "pull",
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(port),
                                     "--token-query",
                                     token_query,
                                     "--wait",
                                     wait};
    command.insert(command.end(), options.begin(), options.end());
    return command;
}

}  // namespace magic_sync::test
