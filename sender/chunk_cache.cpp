#include "chunk_cache.hpp"

namespace magic_sync::sender {

namespace {

size_t size_of(const protocol::StoredChunk& chunk) {
    size_t bytes = chunk.body.size() + chunk.deflated.bytes.size();
    for (const protocol::KeyNote& note : chunk.withheld)
        bytes += note.table.size() + note.key.size() + note.why.size() + sizeof note;
    return bytes + sizeof chunk;
}

}  // namespace

std::shared_ptr<const protocol::StoredChunk> ChunkCache::find(const std::string& origin,
                                                              int64_t id) {
    if (origin != origin_) return nullptr;
    const auto found = entries_.find(id);
    if (found == entries_.end()) return nullptr;
    recent_.splice(recent_.begin(), recent_, found->second.place);
    return found->second.chunk;
}

void ChunkCache::add(const std::string& origin, int64_t id,
                     std::shared_ptr<const protocol::StoredChunk> chunk) {
    if (origin != origin_) {
        entries_.clear();
        recent_.clear();
        bytes_ = 0;
        origin_ = origin;
    }
    if (entries_.count(id) != 0) return;
    const size_t bytes = size_of(*chunk);
    recent_.push_front(id);
    entries_[id] = Entry{std::move(chunk), recent_.begin(), bytes};
    bytes_ += bytes;
    while (bytes_ > limit_ && !recent_.empty()) {
        const auto oldest = entries_.find(recent_.back());
        bytes_ -= oldest->second.bytes;
        entries_.erase(oldest);
        recent_.pop_back();
    }
}

}  // namespace magic_sync::sender
