// Bounds on untrusted input, and the error every decoder throws when input breaks them or is
// malformed.
#pragma once

#include "protocol/pure.hpp"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace magic_sync::protocol {

struct Limits {
    size_t max_bytes = 16 * 1024 * 1024;   // whole input, refused before parsing
    int max_depth = 64;                    // nested arrays and objects, counted from the outermost
    size_t max_rows = 1'000'000;           // row entries in one message, over all its lists
    size_t max_string = 16 * 1024 * 1024;  // one string or object key, in bytes
};

// Input that is not what it should be. The message names what is wrong and where; it is meant to be
// logged and stored beside the input that was set aside.
class DecodeError : public std::runtime_error {
  public:
    explicit DecodeError(const std::string& message) : std::runtime_error(message) {}
};

// Input that broke only the bound on its size (max_bytes), whole or once inflated: it may decode
// once the bound is raised.
class OverTheLimit : public DecodeError {
  public:
    explicit OverTheLimit(const std::string& message) : DecodeError(message) {}
};

}  // namespace magic_sync::protocol
