// Members of a canonical JSON object taken apart and put together again without re-spelling their
// values: a number travels as the server wrote it (12.50 stays 12.50), which a JSON library that
// reads numbers into doubles would not keep.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace magic_sync::replica {

// Member name (decoded) → the member's value as JSON text. Throws std::invalid_argument if
// `canonical_object` (canonical_json output) is not an object.
std::map<std::string, std::string> object_members(std::string_view canonical_object);

// The canonical JSON object of these members.
std::string object_from_members(const std::map<std::string, std::string>& members);

}  // namespace magic_sync::replica
