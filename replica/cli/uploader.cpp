#include "cli/uploader.hpp"

#include <algorithm>

#include "cli/log.hpp"

namespace magic_sync::replica {

namespace {
constexpr std::chrono::milliseconds kLongestBackoff{30000};
}

Uploader::Uploader(Replica& replica, std::unique_ptr<UpRoute> route,
                   std::chrono::milliseconds every)
    : replica_(replica), route_(std::move(route)), every_(every), thread_([this] { loop(); }) {}

Uploader::~Uploader() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void Uploader::poke() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        poked_ = true;
    }
    wake_.notify_all();
}

void Uploader::loop() {
    std::chrono::milliseconds wait = every_;
    bool failing = false;
    while (true) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            // While failing, a poke does not cut the backoff short: the route is what is broken.
            wake_.wait_for(lock, wait, [&] { return stopping_ || (poked_ && !failing); });
            if (stopping_) return;
            poked_ = false;
        }
        try {
            for (const std::string& id : send_uploads(replica_, *route_)) {
                log("sent upload " + id);
            }
            if (failing) log("up route works again");
            failing = false;
            wait = every_;
        } catch (const std::exception& error) {
            // One line when it starts failing, not one per try.
            if (!failing) {
                log(std::string("cannot upload, will retry: ") + error.what());
            }
            wait = failing ? std::min(wait * 2, kLongestBackoff) : every_;
            failing = true;
        }
    }
}

}  // namespace magic_sync::replica
