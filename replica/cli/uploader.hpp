// Sends the replica's uploads in the background while `serve` or `nats` applies messages: after
// each apply (poke) and every `every`, backing off while the up route fails. An upload that failed
// is sent again under the same id.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lib/replica.hpp"
#include "lib/up_route.hpp"

namespace magic_sync::replica {

class Uploader {
  public:
    Uploader(Replica& replica, std::unique_ptr<UpRoute> route, std::chrono::milliseconds every);
    ~Uploader();
    Uploader(const Uploader&) = delete;
    Uploader& operator=(const Uploader&) = delete;

    void poke();

  private:
    void loop();

    Replica& replica_;
    std::unique_ptr<UpRoute> route_;
    std::chrono::milliseconds every_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool poked_ = false;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace magic_sync::replica
