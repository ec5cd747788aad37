// Temporary directories for the tests: under $TMPDIR when it is set (make test sets it to a
// directory of its own, in memory where the machine has /dev/shm), else under /tmp.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace magic_sync::test {

// A new directory, `prefix`.XXXXXX under $TMPDIR or /tmp.
inline std::string make_temp_directory(const std::string& prefix) {
    const char* root = std::getenv("TMPDIR");
    std::string pattern =
        std::string(root != nullptr && *root != '\0' ? root : "/tmp") + "/" + prefix + ".XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr)
        throw std::runtime_error("cannot make a directory like " + pattern + ": " +
                                 std::strerror(errno));
    return pattern;
}

// A temporary directory removed, with what it holds, when it goes.
class TempDir {
  public:
    explicit TempDir(const std::string& prefix = "magic_sync_test")
        : path_(make_temp_directory(prefix)) {}
    ~TempDir() {
        std::error_code ignored;  // a destructor has no one to tell
        std::filesystem::remove_all(path_, ignored);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

}  // namespace magic_sync::test
