// The pull gateway under load: N devices (default 10,000) long-polling one magic-sync-sender
// --transport pull at once. A throwaway cluster with the relay worker, N registers with a token
// each, a table whose rows go each to one register (shop.notices, "to" => 'register_id'). The
// devices are one thread of this program: epoll, non-blocking sockets, HTTP/1.1 kept alive, each
// looping GET next (long poll) -> on 200 POST ack -> GET next again; on 204 GET again; any other
// status, a reset or a closed connection is a failure: it reconnects and goes on.
//
// After every device drained its provisioning and waits, with no unsent message: the gateway's
// threads, RSS and peak RSS, open descriptors and CPU over a quiet window, then K commits (one
// notice for one device each, spaced): from the commit's return to that device's GET answered
// 200 with its notice, p50, p90, p99 and max. Then the same with only a few devices connected
// (default 100; the others hang up), in the same run and against the same gateway, side by side:
// the ratio is what the count of waiting devices costs. Nothing is asserted on a timing; it exits
// 1 when the gateway did not hold the devices (a device failed, a commit was never answered, the
// warm-up did not end before the deadline), after printing what it saw.
//   build/bench/pull_load [devices] [options]   (--help)
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <queue>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "server/deployment.hpp"
#include "server/holdings.hpp"
#include "support/pull_gateway.hpp"

namespace {

using namespace magic_sync::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const char* const kUsage = R"(usage: build/bench/pull_load [devices] [options]

N devices (default 10000) long-poll one magic-sync-sender --transport pull at once, from one
epoll thread of this program. Measures the gateway with all N waiting, then with only --few of
them connected, side by side in one run: threads, RSS, peak RSS, descriptors, CPU over a quiet
window, and commit -> device answered latency (p50, p90, p99, max) of --commits commits.

  --devices N          devices (also the first positional argument; default 10000)
  --few N              devices left connected for the side-by-side phase (default 100;
                       0: measure with all N only)
  --commits K          commits per phase, one notice for one random device each (default 100)
  --spacing MS         between two commits (default 200)
  --wait SECONDS       the gateway's --wait (default 25)
  --gateway-devices N  the gateway's --devices (default: devices + 64)
  --batch N            connections being made at once, at most (default 100)
  --rate N             devices that start connecting per second at most (default 500)
  --quiet SECONDS      the quiet window the gateway's CPU is measured over (default 10)
  --rounds R           measure all, few, all, few, ... R times each (default 1); a round
                       after the first waits about --wait more (a device that connects
                       again counts as waiting once it was answered: its 204)
  --deadline SECONDS   the whole run ends by then, reporting what it saw (default 300)
  --bin DIRECTORY      where magic-sync-sender is (default build/bin)
  --keep               keep the work directory (the gateway's log, the server's log)
  --help               this text

Exits 1, after printing what it saw, when the gateway did not hold the devices: a failure (a
status other than 200 or 204 to GET next, other than 200 to an ack, a connection refused, reset
or closed by the gateway, no answer within --wait + 30 s), a commit not answered, or the warm-up
not done by the deadline. The extension must be installed (make install).
)";

struct Options {
    int devices = 10000;
    int few = 100;
    int commits = 100;
    int spacing_ms = 200;
    int wait_seconds = 25;
    int gateway_devices = 0;
    int batch = 100;
    int rate = 500;
    int quiet_seconds = 10;
    int rounds = 1;
    int deadline_seconds = 300;
    std::string bin = "build/bin";
    bool keep = false;
};

int positive(const std::string& name, const std::string& text, int least) {
    size_t used = 0;
    int value = 0;
    try {
        value = std::stoi(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != text.size() || value < least)
        throw std::runtime_error(name + " " + text + ": expected a whole number of at least " +
                                 std::to_string(least));
    return value;
}

Options parse(int argc, char** argv) {
    Options options;
    const std::map<std::string, std::pair<int*, int>> numbers{
        {"--devices", {&options.devices, 1}},
        {"--few", {&options.few, 0}},
        {"--commits", {&options.commits, 1}},
        {"--spacing", {&options.spacing_ms, 0}},
        {"--wait", {&options.wait_seconds, 1}},
        {"--gateway-devices", {&options.gateway_devices, 1}},
        {"--batch", {&options.batch, 1}},
        {"--rate", {&options.rate, 1}},
        {"--quiet", {&options.quiet_seconds, 1}},
        {"--rounds", {&options.rounds, 1}},
        {"--deadline", {&options.deadline_seconds, 10}}};
    for (int i = 1; i < argc; ++i) {
        const std::string argument = argv[i];
        if (argument == "--help" || argument == "-h") {
            std::fputs(kUsage, stdout);
            std::exit(0);
        } else if (argument == "--keep") {
            options.keep = true;
        } else if (argument == "--bin" && i + 1 < argc) {
            options.bin = argv[++i];
        } else if (numbers.count(argument) && i + 1 < argc) {
            const auto& [field, least] = numbers.at(argument);
            *field = positive(argument, argv[++i], least);
        } else if (i == 1 && !argument.empty() && argument[0] != '-') {
            options.devices = positive("devices", argument, 1);
        } else {
            throw std::runtime_error("unknown or incomplete argument " + argument + " (--help)");
        }
    }
    if (options.few >= options.devices) options.few = 0;
    if (options.gateway_devices == 0) options.gateway_devices = options.devices + 64;
    return options;
}

// The run's deadline passed: what was being waited for.
struct Expired {
    std::string what;
};

Clock::time_point g_deadline;

void check_deadline(const std::string& what) {
    if (Clock::now() >= g_deadline) throw Expired{what};
}

int64_t nanoseconds(Clock::time_point at) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
}

// The tag of probe k in its notice's body, which the device finds in its message.
constexpr const char* kProbeTag = "pull-load-probe-";

// When each probe's commit returned and when its device's GET was answered with it (steady
// clock, ns; 0: not yet).
class Probes {
  public:
    explicit Probes(size_t count)
        : count_(count),
          committed_(new std::atomic<int64_t>[count]),
          answered_(new std::atomic<int64_t>[count]) {
        for (size_t k = 0; k < count; ++k) {
            committed_[k] = 0;
            answered_[k] = 0;
        }
    }
    size_t count() const { return count_; }
    std::atomic<int64_t>& committed(size_t k) { return committed_[k]; }
    std::atomic<int64_t>& answered(size_t k) { return answered_[k]; }

  private:
    size_t count_;
    std::unique_ptr<std::atomic<int64_t>[]> committed_;
    std::unique_ptr<std::atomic<int64_t>[]> answered_;
};

// What the devices did, counted from the start (so a phase is the difference of two).
struct Tally {
    long answered_200 = 0;
    long answered_204 = 0;
    long early_204 = 0;     // a 204 before --wait had passed: answered with nothing new
    long unprobed_200 = 0;  // a 200 that carried no probe
    long acks = 0;
    long failures = 0;
    long planned_reconnects = 0;  // the gateway said Connection: close (its keep-alive limit)
    long failure_reconnects = 0;

    Tally operator-(const Tally& before) const {
        Tally d;
        d.answered_200 = answered_200 - before.answered_200;
        d.answered_204 = answered_204 - before.answered_204;
        d.early_204 = early_204 - before.early_204;
        d.unprobed_200 = unprobed_200 - before.unprobed_200;
        d.acks = acks - before.acks;
        d.failures = failures - before.failures;
        d.planned_reconnects = planned_reconnects - before.planned_reconnects;
        d.failure_reconnects = failure_reconnects - before.failure_reconnects;
        return d;
    }
};

// Where the devices stand, sampled by their thread every 100 ms.
struct Standing {
    int active = 0;   // connected or connecting, as asked
    int served = 0;   // of those, answered at least once since they were made active
    int polling = 0;  // of those, with a GET next outstanding (not acking, not backing off)
    int waiting = 0;  // of those, with a GET next sent whole and no answer yet
    int most_waiting = 0;
};

// The devices: one thread, epoll, a non-blocking socket each.
class Fleet {
  public:
    Fleet(int port, int devices, int batch, int rate, std::chrono::seconds wait, Probes& probes)
        : port_(port), batch_(batch), rate_(rate), wait_(wait), probes_(probes), devices_(devices) {
        for (int n = 1; n <= devices; ++n) {
            const std::string id = replica_id(n);
            Device& device = devices_[n - 1];
            device.next = "GET /replicas/" + id +
                          "/next HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer device-" +
                          std::to_string(n) + "\r\n\r\n";
            device.ack_prefix = "POST /replicas/" + id + "/ack/";
            device.ack_suffix = " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer device-" +
                                std::to_string(n) + "\r\nContent-Length: 0\r\n\r\n";
        }
        epoll_ = epoll_create1(EPOLL_CLOEXEC);
        if (epoll_ < 0) throw std::runtime_error("epoll_create1 failed");
        thread_ = std::thread([this] { run(); });
    }
    ~Fleet() {
        stop_ = true;
        thread_.join();
        for (Device& device : devices_)
            if (device.fd >= 0) close(device.fd);
        close(epoll_);
    }
    Fleet(const Fleet&) = delete;
    Fleet& operator=(const Fleet&) = delete;

    // Devices 1..n are connected (made gradually: --batch and --rate), the others
    // hang up.
    void set_active(int n) { target_ = n; }
    void set_measuring(bool measuring) { measuring_ = measuring; }

    Tally tally() {
        std::lock_guard<std::mutex> lock(mutex_);
        return tally_;
    }
    Standing standing() {
        std::lock_guard<std::mutex> lock(mutex_);
        return standing_;
    }
    // Each kind of failure and how often it happened.
    std::map<std::string, long> failures() {
        std::lock_guard<std::mutex> lock(mutex_);
        return reasons_;
    }

  private:
    enum class Phase { Off, Backoff, Connecting, Writing, Reading };
    enum class Want { Next, Ack };
    struct Device {
        std::string next;  // the GET next request, whole
        std::string ack_prefix, ack_suffix;
        std::string ack_id;  // the message-id of the 200 it acks
        int fd = -1;
        Phase phase = Phase::Off;
        Want want = Want::Next;
        bool served = false;
        uint32_t events = 0;
        std::string out;
        size_t written = 0;
        std::string in;
        Clock::time_point since;  // connecting since, or the request sent whole then
    };

    void run() {
        epoll_event events[512];
        Clock::time_point swept;
        while (!stop_) {
            const int ready = epoll_wait(epoll_, events, 512, 10);
            for (int i = 0; i < ready; ++i) handle(events[i].data.u32, events[i].events);
            const Clock::time_point now = Clock::now();
            while (!retries_.empty() && retries_.top().first <= now) {
                const int index = retries_.top().second;
                retries_.pop();
                if (devices_[index].phase == Phase::Backoff) {
                    count([](Tally& t) { ++t.failure_reconnects; });
                    connect_device(index);
                }
            }
            reach_target();
            if (now - swept >= 100ms) {
                sweep(now);
                swept = now;
            }
        }
    }

    template <typename Change>
    void count(Change change) {
        std::lock_guard<std::mutex> lock(mutex_);
        change(tally_);
    }

    // Makes devices active, at most --rate a second and --batch connections being made at once
    // (a burst overflows the gateway's listen queue: cpp-httplib listens with a backlog of 5), or
    // hangs up the ones over the target.
    void reach_target() {
        const int target = target_;
        while (active_ > target) {
            Device& device = devices_[--active_];
            hang_up(device);
            device.phase = Phase::Off;
        }
        // --rate a second, in bursts of at most 10 ms' worth.
        const Clock::time_point now = Clock::now();
        const double seconds = std::chrono::duration<double>(now - refilled_).count();
        refilled_ = now;
        tokens_ = std::min(tokens_ + rate_ * seconds, std::max(1.0, rate_ / 100.0));
        while (tokens_ >= 1 && active_ < target && connecting_ < batch_) {
            tokens_ -= 1;
            Device& device = devices_[active_];
            device.served = false;
            device.want = Want::Next;
            connect_device(active_++);
        }
    }

    void hang_up(Device& device) {
        if (device.fd >= 0) close(device.fd);
        if (device.phase == Phase::Connecting) --connecting_;
        device.fd = -1;
        device.events = 0;
        device.in.clear();
    }

    void watch(int index, uint32_t events) {
        Device& device = devices_[index];
        if (device.events == events) return;
        epoll_event event{};
        event.events = events;
        event.data.u32 = static_cast<uint32_t>(index);
        epoll_ctl(epoll_, device.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, device.fd, &event);
        device.events = events;
    }

    void connect_device(int index) {
        Device& device = devices_[index];
        device.phase = Phase::Off;
        device.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (device.fd < 0) return fail(index, std::string("socket: ") + std::strerror(errno));
        const int yes = 1;
        setsockopt(device.fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<uint16_t>(port_));
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        device.since = Clock::now();
        if (connect(device.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0)
            return request(index);
        if (errno != EINPROGRESS)
            return fail(index, std::string("connect: ") + std::strerror(errno));
        device.phase = Phase::Connecting;
        ++connecting_;
        watch(index, EPOLLOUT);
    }

    // Sends the request the device wants now: GET next, or the ack of the message it was given.
    void request(int index) {
        Device& device = devices_[index];
        device.out = device.want == Want::Next
                         ? device.next
                         : device.ack_prefix + device.ack_id + device.ack_suffix;
        device.written = 0;
        device.in.clear();
        device.phase = Phase::Writing;
        flush(index);
    }

    void flush(int index) {
        Device& device = devices_[index];
        while (device.written < device.out.size()) {
            const ssize_t sent = send(device.fd, device.out.data() + device.written,
                                      device.out.size() - device.written, MSG_NOSIGNAL);
            if (sent < 0 && errno == EAGAIN) return watch(index, EPOLLOUT);
            if (sent < 0) return fail(index, std::string("send: ") + std::strerror(errno));
            device.written += static_cast<size_t>(sent);
        }
        device.phase = Phase::Reading;
        device.since = Clock::now();
        watch(index, EPOLLIN | EPOLLRDHUP);
    }

    void handle(int index, uint32_t events) {
        Device& device = devices_[index];
        if (device.phase == Phase::Connecting) {
            int error = 0;
            socklen_t length = sizeof error;
            getsockopt(device.fd, SOL_SOCKET, SO_ERROR, &error, &length);
            --connecting_;
            device.phase = Phase::Off;
            if (error != 0) return fail(index, std::string("connect: ") + std::strerror(error));
            return request(index);
        }
        if (device.phase == Phase::Writing) return flush(index);
        if (device.phase != Phase::Reading) return;
        char buffer[16384];
        bool closed = false;
        for (;;) {
            const ssize_t got = recv(device.fd, buffer, sizeof buffer, 0);
            if (got > 0) {
                device.in.append(buffer, static_cast<size_t>(got));
                continue;
            }
            if (got == 0) closed = true;
            if (got < 0 && errno != EAGAIN)
                return fail(index, std::string("recv: ") + std::strerror(errno));
            break;
        }
        if (answered(index)) return;
        if (closed || (events & (EPOLLERR | EPOLLHUP)) != 0)
            return fail(index, device.want == Want::Next
                                   ? "GET next: connection closed by the gateway, no answer"
                                   : "ack: connection closed by the gateway, no answer");
    }

    static std::string lowercase(std::string text) {
        for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return text;
    }

    // Reads a whole answer when one came: acts on it (true), or waits for more (false).
    bool answered(int index) {
        Device& device = devices_[index];
        const size_t end = device.in.find("\r\n\r\n");
        if (end == std::string::npos) {
            if (device.in.size() > 65536) fail(index, "an answer's headers over 64 KiB");
            return device.in.size() > 65536;
        }
        int status = 0;
        size_t length = 0;
        bool close_after = false;
        std::string message_id;
        std::istringstream head(device.in.substr(0, end));
        std::string line;
        std::getline(head, line);
        if (line.compare(0, 5, "HTTP/") != 0 || line.size() < 12) {
            fail(index, "not an HTTP answer: " + line.substr(0, 40));
            return true;
        }
        status = std::atoi(line.c_str() + 9);
        while (std::getline(head, line)) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            const size_t colon = line.find(':');
            if (colon == std::string::npos) continue;
            const std::string name = lowercase(line.substr(0, colon));
            std::string value = line.substr(colon + 1);
            value.erase(0, value.find_first_not_of(' '));
            if (name == "content-length") length = std::strtoul(value.c_str(), nullptr, 10);
            if (name == "connection") close_after = lowercase(value) == "close";
            if (name == "message-id") message_id = value;
        }
        if (device.in.size() < end + 4 + length) return false;
        const Clock::time_point now = Clock::now();
        const std::string body = device.in.substr(end + 4, length);
        device.in.clear();
        device.served = true;
        if (device.want == Want::Next && status == 200) {
            if (message_id.empty()) {
                fail(index, "GET next answered 200 without a message-id");
                return true;
            }
            bool probed = false;
            for (size_t at = body.find(kProbeTag); at != std::string::npos;
                 at = body.find(kProbeTag, at + 1)) {
                const size_t k =
                    std::strtoul(body.c_str() + at + std::strlen(kProbeTag), nullptr, 10);
                if (k >= probes_.count()) continue;
                probed = true;
                int64_t none = 0;
                probes_.answered(k).compare_exchange_strong(none, nanoseconds(now));
            }
            count([&](Tally& t) {
                ++t.answered_200;
                if (!probed && measuring_) ++t.unprobed_200;
            });
            device.ack_id = message_id;
            device.want = Want::Ack;
        } else if (device.want == Want::Next && status == 204) {
            const bool early = now - device.since < wait_ - 1s;
            count([&](Tally& t) {
                ++t.answered_204;
                if (early) ++t.early_204;
            });
        } else if (device.want == Want::Ack && status == 200) {
            count([](Tally& t) { ++t.acks; });
            device.want = Want::Next;
        } else {
            fail(index, std::string(device.want == Want::Next ? "GET next" : "ack") + " answered " +
                            std::to_string(status));
            return true;
        }
        if (close_after) {
            count([](Tally& t) { ++t.planned_reconnects; });
            hang_up(device);
            connect_device(index);
        } else {
            request(index);
        }
        return true;
    }

    // Counts the failure, hangs up, and connects again in half a second, asking for next.
    void fail(int index, const std::string& why) {
        Device& device = devices_[index];
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ++tally_.failures;
            ++reasons_[why];
        }
        hang_up(device);
        device.phase = Phase::Backoff;
        device.want = Want::Next;
        retries_.push({Clock::now() + 500ms, index});
    }

    // Fails what waited too long, and samples where the devices stand.
    void sweep(Clock::time_point now) {
        Standing standing;
        for (int index = 0; index < active_; ++index) {
            Device& device = devices_[index];
            if (device.phase == Phase::Connecting && now - device.since > 30s) {
                fail(index, "connect: not accepted in 30 s");
            } else if (device.phase == Phase::Reading &&
                       now - device.since > (device.want == Want::Next ? wait_ + 30s : 30s)) {
                fail(index, device.want == Want::Next ? "GET next: no answer in --wait + 30 s"
                                                      : "ack: no answer in 30 s");
            }
            const bool polling = device.want == Want::Next && device.phase != Phase::Backoff &&
                                 device.phase != Phase::Off;
            ++standing.active;
            standing.served += device.served;
            standing.polling += polling;
            standing.waiting += polling && device.phase == Phase::Reading;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        standing.most_waiting = std::max(standing_.most_waiting, standing.waiting);
        standing_ = standing;
    }

    const int port_;
    const int batch_;
    const int rate_;
    double tokens_ = 0;  // devices that may start connecting now
    Clock::time_point refilled_;
    const std::chrono::seconds wait_;
    Probes& probes_;
    std::vector<Device> devices_;
    int epoll_ = -1;
    int active_ = 0;      // devices_[0, active_) are active
    int connecting_ = 0;  // connections being made
    std::priority_queue<std::pair<Clock::time_point, int>,
                        std::vector<std::pair<Clock::time_point, int>>, std::greater<>>
        retries_;
    std::atomic<int> target_{0};
    std::atomic<bool> measuring_{false};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    Tally tally_;
    Standing standing_;
    std::map<std::string, long> reasons_;
    std::thread thread_;
};

// A process as /proc shows it.
struct ProcessLook {
    int threads = 0;
    long rss_kb = 0;
    long peak_rss_kb = 0;
    int descriptors = 0;
};

ProcessLook look_at(pid_t pid) {
    ProcessLook look;
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("Threads:", 0) == 0) look.threads = std::atoi(line.c_str() + 8);
        if (line.rfind("VmRSS:", 0) == 0) look.rss_kb = std::atol(line.c_str() + 6);
        if (line.rfind("VmHWM:", 0) == 0) look.peak_rss_kb = std::atol(line.c_str() + 6);
    }
    if (DIR* fds = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
        while (const dirent* entry = readdir(fds)) look.descriptors += entry->d_name[0] != '.';
        closedir(fds);
    }
    return look;
}

// The fields of /proc/PID/stat after the command: [0] is the state (field 3).
std::vector<std::string> stat_fields(pid_t pid) {
    std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    std::vector<std::string> fields;
    if (paren == std::string::npos) return fields;
    std::istringstream rest(stat.substr(paren + 1));
    for (std::string field; rest >> field;) fields.push_back(field);
    return fields;
}

// The process's CPU time (user and system), in seconds.
double cpu_seconds(pid_t pid) {
    const std::vector<std::string> fields = stat_fields(pid);
    if (fields.size() < 13) return 0;
    return (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
}

// The CPU time of the postmaster and its children (the backends, the relay worker), in seconds.
double database_cpu_seconds(const std::string& data_directory) {
    std::ifstream pid_file(data_directory + "/postmaster.pid");
    pid_t postmaster = 0;
    pid_file >> postmaster;
    if (postmaster <= 0) return 0;
    double total = cpu_seconds(postmaster);
    if (DIR* proc = opendir("/proc")) {
        while (const dirent* entry = readdir(proc)) {
            const pid_t pid = std::atoi(entry->d_name);
            if (pid <= 0) continue;
            const std::vector<std::string> fields = stat_fields(pid);
            if (fields.size() >= 13 && std::atoi(fields[1].c_str()) == postmaster)
                total += (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
        }
        closedir(proc);
    }
    return total;
}

// The kernel's count of connections dropped because a listen queue was full (the whole machine's:
// TcpExt ListenOverflows in /proc/net/netstat).
long listen_overflows() {
    std::ifstream netstat("/proc/net/netstat");
    std::string names, values;
    while (std::getline(netstat, names) && std::getline(netstat, values)) {
        if (names.rfind("TcpExt:", 0) != 0) continue;
        std::istringstream name_fields(names), value_fields(values);
        for (std::string name, value; name_fields >> name && value_fields >> value;)
            if (name == "ListenOverflows") return std::atol(value.c_str());
    }
    return -1;
}

// The listen backlog of the socket listening on 127.0.0.1:`port`, as ss shows it ("" unknown).
std::string listen_backlog(int port) {
    std::string output;
    if (run("ss -Hltn 'sport = :" + std::to_string(port) + "'", &output) != 0) return "";
    std::istringstream fields(output);
    std::string state, queued, backlog;
    fields >> state >> queued >> backlog;
    return backlog;
}

// What one phase measured.
struct Measured {
    std::string name;
    int devices = 0;
    int waiting = 0;  // waiting when the quiet window began
    ProcessLook gateway;
    double quiet_seconds = 0;
    double gateway_cpu = 0;  // seconds of CPU over the quiet window
    double database_cpu = 0;
    double quiet_pull_heads = 0;   // sync.pull_head calls over the quiet window
    double commit_pull_heads = 0;  // from the first commit until its answers, per commit
    int commits = 0;
    std::vector<double> latencies_ms;  // of the commits answered
    std::vector<double> relay_ms;      // commit -> the relay's next NOTIFY, of those
    std::vector<double> gateway_ms;    // that NOTIFY -> answered
    Tally tally;
};

double percentile(std::vector<double> values, double p) {
    if (values.empty()) return NAN;
    std::sort(values.begin(), values.end());
    const size_t rank = static_cast<size_t>(std::ceil(p * values.size()));
    return values[std::min(values.size(), std::max<size_t>(rank, 1)) - 1];
}

double median(std::vector<double> values) { return percentile(std::move(values), 0.5); }

const char* const kShop = R"sql(
    CREATE SCHEMA shop;
    CREATE TABLE shop.registers (id uuid PRIMARY KEY, token text UNIQUE);
    CREATE TABLE shop.notices (id bigserial PRIMARY KEY, register_id uuid NOT NULL, body text);
    SELECT sync.replicas('shop.registers', 'registers');
    SELECT sync.catalog('shop.notices', "to" => 'register_id');
)sql";

// Notes not planned yet, messages not taken, members behind their scope's head.
const char* const kUndelivered = R"sql(
    SELECT (SELECT count(*) FROM sync.note) + (SELECT count(*) FROM sync.outbox WHERE sent_at IS NULL)
         + (SELECT count(*) FROM sync.member m JOIN sync.scope s ON s.id = m.scope WHERE m.sent < s.head)
)sql";

const char* const kTokenQuery = "SELECT id FROM shop.registers WHERE token = $1";

// When the relay's notifications (NOTIFY magic_sync, sent after a pass wrote messages) came, on a
// connection of its own: splits a commit's latency into the relay's part and the gateway's.
class Notifications {
  public:
    explicit Notifications(const std::string& conninfo) : connection_(conninfo) {
        connection_.query("LISTEN magic_sync");
        thread_ = std::thread([this] { run(); });
    }
    ~Notifications() {
        stop_ = true;
        thread_.join();
    }
    Notifications(const Notifications&) = delete;
    Notifications& operator=(const Notifications&) = delete;

    // When the first notification at or after `at` came (ns), or 0.
    int64_t first_after(int64_t at) {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto found = std::lower_bound(times_.begin(), times_.end(), at);
        return found == times_.end() ? 0 : *found;
    }

  private:
    void run() {
        while (!stop_) {
            if (!await_notify(connection_.raw(), 100ms)) continue;
            const int64_t now = nanoseconds(Clock::now());
            std::lock_guard<std::mutex> lock(mutex_);
            times_.push_back(now);
        }
    }

    Connection connection_;
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::vector<int64_t> times_;
    std::thread thread_;
};

class Bench {
  public:
    Bench(const Options& options, std::string command)
        : options_(options),
          command_(std::move(command)),
          probes_(static_cast<size_t>(options.commits) * options.rounds * 2) {}

    int run() {
        int status = 0;
        try {
            status = measure();
        } catch (const Expired& expired) {
            failed_ = "the deadline (" + std::to_string(options_.deadline_seconds) +
                      " s) passed while " + expired.what;
            status = 1;
        } catch (const std::exception& e) {
            failed_ = e.what();
            status = 1;
        }
        report();
        return status;
    }

  private:
    int measure() {
        log("cluster, " + std::to_string(options_.devices) + " registers");
        deployment_ = std::make_unique<Deployment>(
            "pull_load",
            // track_functions: the gateway's sync.pull_head calls are counted.
            std::vector<std::string>{"magic_sync.idle = 100", "track_functions = 'pl'"}, "shop",
            kShop, options_.bin);
        if (options_.keep) deployment_->keep_directory();
        Connection& db = deployment_->db();
        db.query(
            "INSERT INTO shop.registers SELECT ('00000000-0000-0000-0000-' || lpad(n::text, 12, "
            "'0'))::uuid, 'device-' || n FROM generate_series(1, $1::int) n",
            {std::to_string(options_.devices)});
        // The relay provisions every register (its reset) before the gateway starts.
        wait_for("the relay provisions the registers", [&] {
            return db.value("SELECT count(*) FROM sync.note") == "0" &&
                   db.value("SELECT count(DISTINCT replica) FROM sync.outbox") ==
                       std::to_string(options_.devices);
        });
        start_gateway();
        fleet_ = std::make_unique<Fleet>(port_, options_.devices, options_.batch, options_.rate,
                                         std::chrono::seconds(options_.wait_seconds), probes_);
        notifications_ = std::make_unique<Notifications>(deployment_->conninfo());

        log("warm-up: " + std::to_string(options_.devices) +
            " devices connect and drain their provisioning");
        fleet_->set_active(options_.devices);
        settle(options_.devices, "the devices drained their provisioning");
        for (int round = 0; round < options_.rounds; ++round) {
            if (round > 0) {
                log("all " + std::to_string(options_.devices) + " devices connect again");
                fleet_->set_active(options_.devices);
                settle(options_.devices, "the devices connected again");
            }
            phase("all", options_.devices);
            if (options_.few == 0) continue;
            log("only " + std::to_string(options_.few) + " devices stay; the others hang up");
            fleet_->set_active(options_.few);
            // The gateway lets a hung-up long poll go when it answers it, after --wait at most.
            const auto let_go = Clock::now() + std::chrono::seconds(options_.wait_seconds + 10);
            while (Clock::now() < let_go &&
                   look_at(gateway_pid()).descriptors > idle_descriptors_ + 8 + options_.few + 16) {
                check_deadline("the gateway let the hung-up devices go");
                std::this_thread::sleep_for(500ms);
            }
            settle(options_.few, "the remaining devices settled");
            phase("few", options_.few);
        }
        return verdict();
    }

    void log(const std::string& line) {
        const double at = std::chrono::duration<double>(Clock::now() - started_).count();
        std::fprintf(stderr, "[%6.1f s] %s\n", at, line.c_str());
    }

    template <typename Condition>
    void wait_for(const std::string& what, Condition condition) {
        while (!condition()) {
            check_deadline(what);
            std::this_thread::sleep_for(200ms);
        }
    }

    pid_t gateway_pid() {
        std::unique_ptr<Process>& gateway = deployment_->sender();
        if (!gateway || !gateway->running())
            throw std::runtime_error("the gateway exited; its log:\n" + tail(gateway_log()));
        return gateway->pid();
    }

    std::string gateway_log() const { return deployment_->directory() + "/sender.log"; }

    static std::string tail(const std::string& path) {
        std::ifstream file(path);
        std::vector<std::string> lines;
        for (std::string line; std::getline(file, line);) lines.push_back(line);
        std::string kept;
        for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i)
            kept += "  " + lines[i] + "\n";
        return kept;
    }

    void start_gateway() {
        port_ = free_port();
        gateway_command_ =
            pull_gateway_command(options_.bin + "/magic-sync-sender", deployment_->conninfo(),
                                 port_, kTokenQuery, std::to_string(options_.wait_seconds),
                                 {"--devices", std::to_string(options_.gateway_devices)});
        deployment_->sender() = std::make_unique<Process>(gateway_command_, gateway_log());
        const auto until = Clock::now() + 30s;
        for (;;) {
            gateway_pid();
            const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_in address{};
            address.sin_family = AF_INET;
            address.sin_port = htons(static_cast<uint16_t>(port_));
            address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            const bool up = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
            close(fd);
            if (up) break;
            if (Clock::now() > until)
                throw std::runtime_error("the gateway did not listen in 30 s; its log:\n" +
                                         tail(gateway_log()));
            std::this_thread::sleep_for(100ms);
        }
        std::this_thread::sleep_for(500ms);
        idle_descriptors_ = look_at(gateway_pid()).descriptors;
        backlog_ = listen_backlog(port_);
        overflows_from_ = listen_overflows();
        const ProcessLook idle = look_at(gateway_pid());
        log("gateway up: " + std::to_string(idle.threads) + " threads, " +
            std::to_string(idle.rss_kb / 1024) + " MiB RSS, " + std::to_string(idle.descriptors) +
            " descriptors before any device, listen backlog " + backlog_);
    }

    // Waits until `devices` devices were each answered at least once and all of them poll, and
    // the database has nothing left to deliver; says how it goes every 5 s.
    void settle(int devices, const std::string& what) {
        Clock::time_point said = Clock::now();
        Connection& db = deployment_->db();
        for (;;) {
            gateway_pid();
            const Standing standing = fleet_->standing();
            const bool polled = standing.active == devices && standing.served == devices &&
                                standing.polling == devices;
            std::string undelivered = "?";
            if (polled || Clock::now() - said >= 5s) undelivered = db.value(kUndelivered);
            if (polled && undelivered == "0") break;
            if (Clock::now() - said >= 5s) {
                said = Clock::now();
                const Tally tally = fleet_->tally();
                log("  " + std::to_string(standing.active) + " active, " +
                    std::to_string(standing.served) + " served, " +
                    std::to_string(standing.waiting) + " waiting (at most " +
                    std::to_string(standing.most_waiting) + "), " + undelivered + " undelivered, " +
                    std::to_string(tally.answered_200) + " messages, " +
                    std::to_string(tally.failures) + " failures");
            }
            check_deadline(what + " (" + std::to_string(standing.served) + " of " +
                           std::to_string(devices) + " devices served, " +
                           std::to_string(standing.polling) + " polling)");
            std::this_thread::sleep_for(200ms);
        }
        log("settled: " + std::to_string(devices) + " devices waiting, nothing undelivered");
    }

    void phase(const std::string& kind, int devices) {
        Measured measured;
        measured.name = kind;
        measured.devices = devices;
        const Tally before = fleet_->tally();
        fleet_->set_measuring(true);
        const pid_t pid = gateway_pid();
        const std::string data = deployment_->cluster().directory() + "/data";
        measured.waiting = fleet_->standing().waiting;
        log(kind + ": " + std::to_string(measured.waiting) + " devices waiting; quiet " +
            std::to_string(options_.quiet_seconds) + " s");
        const auto quiet_from = Clock::now();
        const double gateway_from = cpu_seconds(pid);
        const double database_from = database_cpu_seconds(data);
        const long heads_from = pull_heads();
        std::this_thread::sleep_for(std::chrono::seconds(options_.quiet_seconds));
        measured.gateway_cpu = cpu_seconds(pid) - gateway_from;
        measured.database_cpu = database_cpu_seconds(data) - database_from;
        measured.quiet_pull_heads = pull_heads() - heads_from;
        measured.quiet_seconds = std::chrono::duration<double>(Clock::now() - quiet_from).count();
        measured.gateway = look_at(pid);

        log(kind + ": " + std::to_string(options_.commits) + " commits, one every " +
            std::to_string(options_.spacing_ms) + " ms");
        // Each commit to another device while there are devices enough, in a random order.
        std::vector<int> order(devices);
        std::iota(order.begin(), order.end(), 1);
        std::shuffle(order.begin(), order.end(), random_);
        Connection& db = deployment_->db();
        const size_t first = next_probe_;
        const long commit_heads_from = pull_heads();
        const auto commits_from = Clock::now();
        for (int k = 0; k < options_.commits; ++k) {
            check_deadline(kind + ": committing");
            std::this_thread::sleep_until(commits_from +
                                          k * std::chrono::milliseconds(options_.spacing_ms));
            const size_t probe = next_probe_++;
            db.query("INSERT INTO shop.notices (register_id, body) VALUES ($1, $2)",
                     {replica_id(order[k % devices]), kProbeTag + std::to_string(probe) + "."});
            probes_.committed(probe) = nanoseconds(Clock::now());
        }
        measured.commits = options_.commits;
        // Answered within --wait + 30 s, or never.
        const auto until = Clock::now() + std::chrono::seconds(options_.wait_seconds + 30);
        const auto answered_all = [&] {
            for (size_t k = first; k < next_probe_; ++k)
                if (probes_.answered(k) == 0) return false;
            return true;
        };
        while (!answered_all() && Clock::now() < until) {
            gateway_pid();
            check_deadline(kind + ": waiting for the commits' answers");
            std::this_thread::sleep_for(50ms);
        }
        for (size_t k = first; k < next_probe_; ++k) {
            const int64_t committed = probes_.committed(k);
            const int64_t answered = probes_.answered(k);
            if (answered == 0) continue;
            measured.latencies_ms.push_back((answered - committed) / 1e6);
            // The first NOTIFY after the commit returned: the pass that wrote its message, or
            // (when a pass was under way) the one before it.
            const int64_t notified = notifications_->first_after(committed);
            if (notified == 0 || notified > answered) continue;
            measured.relay_ms.push_back((notified - committed) / 1e6);
            measured.gateway_ms.push_back((answered - notified) / 1e6);
        }
        fleet_->set_measuring(false);
        measured.tally = fleet_->tally() - before;
        // A backend sends its counts within a second of going idle.
        std::this_thread::sleep_for(1500ms);
        measured.commit_pull_heads =
            static_cast<double>(pull_heads() - commit_heads_from) / options_.commits;
        measured.gateway.peak_rss_kb = look_at(pid).peak_rss_kb;
        measured.gateway.threads = std::max(measured.gateway.threads, look_at(pid).threads);
        log(kind + ": " + std::to_string(measured.latencies_ms.size()) + " of " +
            std::to_string(measured.commits) + " answered, p50 " +
            figure(percentile(measured.latencies_ms, 0.5)) + " ms");
        phases_.push_back(measured);
    }

    // The gateway's sync.pull_head calls so far (pg_stat_user_functions).
    long pull_heads() {
        return std::atol(deployment_->db()
                             .value("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                                    "WHERE schemaname = 'sync' AND funcname = 'pull_head'")
                             .c_str());
    }

    int verdict() {
        const Tally tally = fleet_->tally();
        int unanswered = 0;
        for (const Measured& measured : phases_)
            unanswered += measured.commits - static_cast<int>(measured.latencies_ms.size());
        if (tally.failures > 0 || unanswered > 0) {
            failed_ = "the gateway did not hold the devices: " + std::to_string(tally.failures) +
                      " failures, " + std::to_string(unanswered) + " commits never answered";
            return 1;
        }
        return 0;
    }

    static std::string figure(double value, int decimals = 1) {
        if (std::isnan(value)) return "-";
        char text[64];
        std::snprintf(text, sizeof text, "%.*f", decimals, value);
        return text;
    }

    void row(const std::string& label, const std::vector<std::string>& cells,
             const std::string& ratio = "") {
        std::printf("| %-48s |", label.c_str());
        for (const std::string& cell : cells) std::printf(" %12s |", cell.c_str());
        if (!ratio.empty()) std::printf(" %10s |", ratio.c_str());
        std::printf("\n");
    }

    // all / few of the medians over each kind's phases.
    std::string ratio(double (*of)(const Measured&)) {
        std::vector<double> all, few;
        for (const Measured& measured : phases_)
            (measured.name == "all" ? all : few).push_back(of(measured));
        if (all.empty() || few.empty() || !(median(few) > 0)) return "-";
        return figure(median(all) / median(few), 2) + "x";
    }

    void report() {
        std::printf(
            "\npull gateway under load: %d devices long-polling (--wait %d, --devices %d)\n",
            options_.devices, options_.wait_seconds, options_.gateway_devices);
        std::printf("command: %s\n", command_.c_str());
        if (!gateway_command_.empty()) {
            std::string gateway;
            for (const std::string& argument : gateway_command_)
                gateway +=
                    (gateway.empty() ? "" : " ") +
                    (argument.find(' ') == std::string::npos ? argument : "'" + argument + "'");
            std::printf("gateway: %s\n", gateway.c_str());
        }
        if (!phases_.empty()) {
            const bool ratios = options_.few > 0;
            std::printf("\n");
            std::vector<std::string> names;
            for (const Measured& measured : phases_)
                names.push_back(std::to_string(measured.devices) + " waiting");
            row("", names, ratios ? "all / few" : "");
            std::vector<std::string> cells;
            const auto line = [&](const std::string& label, auto cell,
                                  double (*of)(const Measured&) = nullptr) {
                cells.clear();
                for (const Measured& measured : phases_) cells.push_back(cell(measured));
                row(label, cells, ratios && of ? ratio(of) : (ratios ? " " : ""));
            };
            line("devices waiting (request sent, no answer)",
                 [](const Measured& m) { return std::to_string(m.waiting); });
            line("gateway threads",
                 [](const Measured& m) { return std::to_string(m.gateway.threads); });
            line("gateway descriptors",
                 [](const Measured& m) { return std::to_string(m.gateway.descriptors); });
            line(
                "gateway RSS (MiB)",
                [](const Measured& m) { return figure(m.gateway.rss_kb / 1024.0); },
                [](const Measured& m) { return m.gateway.rss_kb / 1024.0; });
            line("gateway peak RSS so far (MiB)",
                 [](const Measured& m) { return figure(m.gateway.peak_rss_kb / 1024.0); });
            line("gateway CPU, quiet window (% of a core)",
                 [](const Measured& m) { return figure(100 * m.gateway_cpu / m.quiet_seconds); });
            line("database CPU, quiet window (% of a core)",
                 [](const Measured& m) { return figure(100 * m.database_cpu / m.quiet_seconds); });
            line("sync.pull_head calls a second, quiet window",
                 [](const Measured& m) { return figure(m.quiet_pull_heads / m.quiet_seconds); });
            line(
                "sync.pull_head calls a commit (while answered)",
                [](const Measured& m) { return figure(m.commit_pull_heads); },
                [](const Measured& m) { return m.commit_pull_heads; });
            line("commits answered", [](const Measured& m) {
                return std::to_string(m.latencies_ms.size()) + "/" + std::to_string(m.commits);
            });
            line(
                "commit -> answered p50 (ms)",
                [](const Measured& m) { return figure(percentile(m.latencies_ms, 0.5)); },
                [](const Measured& m) { return percentile(m.latencies_ms, 0.5); });
            line(
                "commit -> answered p90 (ms)",
                [](const Measured& m) { return figure(percentile(m.latencies_ms, 0.9)); },
                [](const Measured& m) { return percentile(m.latencies_ms, 0.9); });
            line(
                "commit -> answered p99 (ms)",
                [](const Measured& m) { return figure(percentile(m.latencies_ms, 0.99)); },
                [](const Measured& m) { return percentile(m.latencies_ms, 0.99); });
            line(
                "commit -> answered max (ms)",
                [](const Measured& m) { return figure(percentile(m.latencies_ms, 1.0)); },
                [](const Measured& m) { return percentile(m.latencies_ms, 1.0); });
            line(
                "  of which commit -> relay's NOTIFY p50 (ms)",
                [](const Measured& m) { return figure(percentile(m.relay_ms, 0.5)); },
                [](const Measured& m) { return percentile(m.relay_ms, 0.5); });
            line(
                "  of which NOTIFY -> answered p50 (ms)",
                [](const Measured& m) { return figure(percentile(m.gateway_ms, 0.5)); },
                [](const Measured& m) { return percentile(m.gateway_ms, 0.5); });
            line(
                "  of which NOTIFY -> answered p99 (ms)",
                [](const Measured& m) { return figure(percentile(m.gateway_ms, 0.99)); },
                [](const Measured& m) { return percentile(m.gateway_ms, 0.99); });
            line("spurious: 200 without a probe",
                 [](const Measured& m) { return std::to_string(m.tally.unprobed_200); });
            line("spurious: 204 before --wait",
                 [](const Measured& m) { return std::to_string(m.tally.early_204); });
            line("204 after --wait", [](const Measured& m) {
                return std::to_string(m.tally.answered_204 - m.tally.early_204);
            });
            line("failures", [](const Measured& m) { return std::to_string(m.tally.failures); });
            line("reconnects: gateway's keep-alive limit",
                 [](const Measured& m) { return std::to_string(m.tally.planned_reconnects); });
            line("reconnects: after a failure",
                 [](const Measured& m) { return std::to_string(m.tally.failure_reconnects); });
            std::printf(
                "(each phase: the quiet window, then the commits until answered or --wait + 30 s;"
                " ratios: medians over the rounds)\n");
        }
        if (fleet_) {
            const Tally tally = fleet_->tally();
            const Standing standing = fleet_->standing();
            std::printf(
                "\nwhole run: %ld messages taken (%ld acks), %ld 204s, %ld failures, %ld "
                "reconnects after failures, %ld at the gateway's keep-alive limit; at most %d "
                "devices waiting at once (request sent, no answer); at the end %d devices "
                "connected, %d of them answered since they connected\n",
                tally.answered_200, tally.acks, tally.answered_204, tally.failures,
                tally.failure_reconnects, tally.planned_reconnects, standing.most_waiting,
                standing.active, standing.served);
            std::printf(
                "the gateway's listen backlog: %s; listen queue overflows during the run (the "
                "kernel's count, whole machine): %ld\n",
                backlog_.c_str(), listen_overflows() - overflows_from_);
            rusage own{};
            getrusage(RUSAGE_SELF, &own);
            std::printf("this benchmark's own CPU (the devices' thread and the rest): %.1f s\n",
                        own.ru_utime.tv_sec + own.ru_stime.tv_sec +
                            (own.ru_utime.tv_usec + own.ru_stime.tv_usec) / 1e6);
            for (const auto& [why, times] : fleet_->failures())
                std::printf("  failure x%ld: %s\n", times, why.c_str());
        }
        if (!failed_.empty()) {
            if (deployment_ && deployment_->sender())
                std::printf("gateway log (last lines):\n%s", tail(gateway_log()).c_str());
            std::printf("FAILED: %s\n", failed_.c_str());
        }
        std::fflush(stdout);
    }

    const Options options_;
    const std::string command_;
    const Clock::time_point started_ = Clock::now();
    Probes probes_;
    size_t next_probe_ = 0;
    std::mt19937 random_{26};
    std::unique_ptr<Deployment> deployment_;
    std::unique_ptr<Fleet> fleet_;  // after the deployment: hangs up before the gateway goes
    std::unique_ptr<Notifications> notifications_;
    int port_ = 0;
    int idle_descriptors_ = 0;
    std::string backlog_;
    long overflows_from_ = 0;
    std::vector<std::string> gateway_command_;
    std::vector<Measured> phases_;
    std::string failed_;
};

// Descriptors for every device here and in the gateway (which inherits the limit), and margin.
void raise_descriptor_limit(int devices) {
    const rlim_t needed = static_cast<rlim_t>(devices) + 512;
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    if (limit.rlim_cur >= needed) return;
    if (limit.rlim_max < needed) {
        rlimit raised{needed, needed};
        if (setrlimit(RLIMIT_NOFILE, &raised) != 0)
            throw std::runtime_error(
                std::to_string(devices) + " devices need " + std::to_string(needed) +
                " descriptors (RLIMIT_NOFILE) here and in the gateway; the hard limit is " +
                std::to_string(limit.rlim_max) + " and cannot be raised (" + std::strerror(errno) +
                "): run as root or raise it (ulimit -Hn)");
        return;
    }
    limit.rlim_cur = needed;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0)
        throw std::runtime_error(std::string("setrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
    signal(SIGPIPE, SIG_IGN);
    std::string command;
    for (int i = 0; i < argc; ++i) {
        const std::string argument = argv[i];
        command += (i ? " " : "") + argument;
    }
    try {
        const Options options = parse(argc, argv);
        raise_descriptor_limit(options.devices);
        g_deadline = Clock::now() + std::chrono::seconds(options.deadline_seconds);
        return Bench(options, command).run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "pull_load: %s\n", e.what());
        return 2;
    }
}
