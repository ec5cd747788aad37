// The shared chunks of rows messages a sender fetched (sync.chunks), so that it reads each chunk
// once and not once per replica it sends it to (docs/DESIGN.md §5).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "protocol/messages.hpp"

namespace magic_sync::sender {

// Chunks by id within one history (the `origin` sync.next returned them with): a restored or
// re-created database starts its chunk ids again, so a chunk of another origin is never found,
// and the first chunk added of another origin empties the cache. At most `limit` bytes of bodies
// (deflated ones too, with --gzip) and notes; those used least recently go first.
class ChunkCache {
  public:
    explicit ChunkCache(size_t limit) : limit_(limit) {}

    // The chunk of that id in that history, or null; found, it is the most recently used.
    std::shared_ptr<const protocol::StoredChunk> find(const std::string& origin, int64_t id);
    void add(const std::string& origin, int64_t id,
             std::shared_ptr<const protocol::StoredChunk> chunk);
    size_t bytes() const { return bytes_; }

  private:
    struct Entry {
        std::shared_ptr<const protocol::StoredChunk> chunk;
        std::list<int64_t>::iterator place;  // in recent_
        size_t bytes = 0;
    };

    size_t limit_;
    size_t bytes_ = 0;
    std::string origin_;
    std::list<int64_t> recent_;  // most recently used first
    std::unordered_map<int64_t, Entry> entries_;
};

}  // namespace magic_sync::sender
