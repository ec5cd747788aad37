// nats-server, for the tests that deliver through NATS JetStream (Debian's package nats-server,
// which scripts/setup.sh installs).
#pragma once

#include <unistd.h>

#include <stdexcept>
#include <string>

namespace magic_sync::test {

// The path of the nats-server program.
inline std::string nats_server_program() {
    for (const char* path : {"/usr/sbin/nats-server", "/usr/bin/nats-server"})
        if (access(path, X_OK) == 0) return path;
    throw std::runtime_error("nats-server is not installed (apt-get install nats-server)");
}

}  // namespace magic_sync::test
