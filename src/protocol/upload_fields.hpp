// What sync.receive computes from a decoded upload before and around filing it, without
// PostgreSQL: the top-level members of a canonical row, the key built from a codec's key columns,
// the JSON of a kept row, of the untaken list and of the holds handed to SQL, and the id of a
// message that does not decode. Here, not in src/filing/receive.cpp, so that the upload fuzzer runs
// the very code the server runs.
#pragma once

#include "protocol/pure.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/messages.hpp"

namespace magic_sync::protocol {

// `text` as a canonical JSON string.
std::string json_string(std::string_view text);

// A top-level member of a canonical JSON object as written: the key token (quotes included) and
// the value's text. Views into the object.
struct Member {
    std::string_view key;
    std::string_view value;
};

// The members of a canonical object in order. Canonical text has no whitespace, so a scan for the
// top level's colons and commas finds them; anything but an object has none.
std::vector<Member> members_of(std::string_view object);

// The value of the member whose key token is `json_name`, if there is one.
std::optional<std::string_view> member(const std::vector<Member>& members,
                                       std::string_view json_name);

// The canonical key object of a row: the key columns (as JSON strings, in canonical member order)
// with the row's values; a key column the row lacks is null.
std::string key_of(const std::vector<std::string>& key_json_names,
                   const std::vector<Member>& members);

// How a kept row's body is stored: {"t": table, "r": row}.
std::string kept_body(const UpRow& row);
// The row of a kept body, for filing it again. Throws DecodeError when `body` is not one.
UpRow kept_row(std::string_view body);

// [{"seq", "t", "k", "why"}, ...]: the upload's untaken rows.
std::string untaken_json(const Upload& upload);

// {scope: {"through", "fp", "n", "ranges": [[lo, hi, fp, n], ...]?}}, as on the wire.
std::string holds_json(const Upload& upload);

// The id of an upload that could not be decoded, when it can still be read: every encoder writes
// "v" and then "id" first, so it survives a message cut short, too deep or too big, sent gzip too.
std::optional<std::string> recover_id(std::string_view message);

}  // namespace magic_sync::protocol
