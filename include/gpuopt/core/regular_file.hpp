// Opening files whose paths a user (or a client, or an edited directory tree) controls without
// ever blocking on them: only regular files are opened and read, everything else is refused by
// name.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "gpuopt/core/status.hpp"

namespace gpuopt {

// An owned POSIX file descriptor, closed when destroyed. Move-only.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { reset(); }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the descriptor.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct RegularFileOptions {
  // false adds O_NOFOLLOW: a symbolic link at the path itself is refused.
  bool follow_symlinks = true;
};

// What a stat mode describes, for messages: "regular file", "directory", "FIFO", "socket",
// "character device", "block device", "symbolic link" or "unknown file type".
std::string_view file_type_name(unsigned mode);

// Opens `path` read-only, close-on-exec, and returns the descriptor only when it is a regular file.
// The type is checked with stat() before the open, so a device is never opened, and again with
// fstat() on the descriptor, which was opened O_NONBLOCK | O_NOCTTY so that a FIFO swapped in
// between cannot block the open; O_NONBLOCK is cleared again before the descriptor is returned.
// Errors name the path: NOT_FOUND when it is absent, PERMISSION_DENIED when it cannot be opened
// for reading, INVALID_ARGUMENT ("<path> is a FIFO, not a regular file") for any other type.
StatusOr<FileDescriptor> open_regular_file(const std::filesystem::path& path,
                                           RegularFileOptions options = {});

// The second half of open_regular_file, for descriptors opened elsewhere (shm_open) with
// O_NONBLOCK | O_NOCTTY: refuses anything but a regular file, naming `name` and its type, then
// clears O_NONBLOCK.
Status require_regular_descriptor(int fd, const std::filesystem::path& name);

// At most `limit` bytes of the regular file at `path`, read through open_regular_file.
StatusOr<std::string> read_regular_file(const std::filesystem::path& path, std::size_t limit,
                                        RegularFileOptions options = {});

// For files that another library opens by name (SQLite's catalogue and journals): OK when nothing
// is at `path` or a regular file is; the INVALID_ARGUMENT of open_regular_file otherwise.
Status refuse_special_file(const std::filesystem::path& path);

}  // namespace gpuopt
