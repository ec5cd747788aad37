// How the programs (magic-sync-sender's nats transport, magic-sync-replica nats) connect to NATS:
// one server or the members of a cluster, named as one comma-separated list of URLs, through a
// connection that outlives the death of the server it is on.
#pragma once

#include <nats/nats.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace magic_sync::program {

// The URLs of `list` ("nats://a:4222,nats://b:4222"), spaces around each one cut. libnats splits
// such a list only in natsConnection_ConnectTo: natsOptions_SetURL takes it for one URL, which no
// server answers. Throws std::invalid_argument for an empty list or an empty URL in it.
inline std::vector<std::string> nats_servers(const std::string& list) {
    std::vector<std::string> servers;
    size_t start = 0;
    while (true) {
        const size_t comma = list.find(',', start);
        std::string url = list.substr(start, comma == std::string::npos ? comma : comma - start);
        url.erase(0, url.find_first_not_of(" \t"));
        url.erase(url.find_last_not_of(" \t") + 1);
        if (url.empty())
            throw std::invalid_argument("'" + list + "' has an empty URL: give nats://HOST:PORT" +
                                        ", several separated by commas");
        servers.push_back(url);
        if (comma == std::string::npos) return servers;
        start = comma + 1;
    }
}

// Between two attempts to reach a server once the connection is lost.
constexpr int64_t kNatsReconnectWaitMillis = 500;
// A server that vanished without closing the connection (its host gone) is noticed after two
// pings left unanswered, within about 30 s (libnats' default, 2 minutes, would be 6).
constexpr int64_t kNatsPingIntervalMillis = 10000;

template <void (*Log)(const std::string&)>
void nats_disconnected(natsConnection* connection, void*) {
    // libnats calls this when the program closes the connection too.
    if (!natsConnection_IsClosed(connection))
        Log("lost the connection to NATS; reconnecting to any server of the list");
}

template <void (*Log)(const std::string&)>
void nats_reconnected(natsConnection* connection, void*) {
    char url[256] = "";
    natsConnection_GetConnectedUrl(connection, url, sizeof url);
    Log(std::string("connected to NATS again, at ") + url);
}

// Options for a connection named `name` (the servers' monitoring lists it by that, /connz) to
// any server of `list`: the first attempt tries them in random order, and once connected the
// connection reconnects for ever, to them and to the other members of their cluster, which the
// servers announce. What is published while it reconnects is buffered (8 MB, libnats' default)
// and goes once it is back. Each loss and return is logged with `Log`. The caller destroys the
// options; throws std::invalid_argument for a list nats_servers refuses.
template <void (*Log)(const std::string&)>
natsOptions* nats_options(const std::string& list, const std::string& name) {
    const std::vector<std::string> servers = nats_servers(list);
    std::vector<const char*> urls;
    for (const std::string& url : servers) urls.push_back(url.c_str());
    natsOptions* options = nullptr;
    if (natsOptions_Create(&options) != NATS_OK) throw std::runtime_error("out of memory");
    if (natsOptions_SetServers(options, urls.data(), static_cast<int>(urls.size())) != NATS_OK) {
        natsOptions_Destroy(options);
        throw std::invalid_argument("'" + list + "' is not a list of NATS URLs");
    }
    natsOptions_SetName(options, name.c_str());
    natsOptions_SetMaxReconnect(options, -1);
    natsOptions_SetReconnectWait(options, kNatsReconnectWaitMillis);
    natsOptions_SetPingInterval(options, kNatsPingIntervalMillis);
    natsOptions_SetDisconnectedCB(options, &nats_disconnected<Log>, nullptr);
    natsOptions_SetReconnectedCB(options, &nats_reconnected<Log>, nullptr);
    return options;
}

}  // namespace magic_sync::program
