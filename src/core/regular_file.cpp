// open_regular_file: stat, non-blocking open, fstat, then blocking mode for the regular file.
#include "gpuopt/core/regular_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpuopt {

namespace {

Status errno_status(int error, std::string_view what, const std::filesystem::path& path) {
  std::string message = fmt::format("{}: {}: {}", path.string(), what, std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return not_found(std::move(message));
    case EACCES:
    case EPERM:
      return permission_denied(std::move(message));
    case ELOOP:
      return invalid_argument(
          fmt::format("{}: is a symbolic link, which is not followed here", path.string()));
    default:
      return unavailable(std::move(message));
  }
}

Status not_regular(const std::filesystem::path& path, unsigned mode) {
  return invalid_argument(
      fmt::format("{} is a {}, not a regular file", path.string(), file_type_name(mode)));
}

}  // namespace

void FileDescriptor::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string_view file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "regular file";
    case S_IFDIR:
      return "directory";
    case S_IFIFO:
      return "FIFO";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "character device";
    case S_IFBLK:
      return "block device";
    case S_IFLNK:
      return "symbolic link";
    default:
      return "unknown file type";
  }
}

StatusOr<FileDescriptor> open_regular_file(const std::filesystem::path& path,
                                           RegularFileOptions options) {
  struct stat before {};
  int stat_result =
      options.follow_symlinks ? ::stat(path.c_str(), &before) : ::lstat(path.c_str(), &before);
  if (stat_result != 0) return errno_status(errno, "cannot open", path);
  if (!options.follow_symlinks && S_ISLNK(before.st_mode)) return errno_status(ELOOP, "", path);
  if (!S_ISREG(before.st_mode)) return not_regular(path, before.st_mode);

  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  if (!options.follow_symlinks) flags |= O_NOFOLLOW;
  FileDescriptor fd(::open(path.c_str(), flags));
  if (!fd.valid()) {
    // ENXIO: a socket (or a FIFO without a writer) replaced the file after the stat.
    if (errno == ENXIO)
      return invalid_argument(fmt::format("{} is not a regular file", path.string()));
    return errno_status(errno, "cannot open", path);
  }
  GPUOPT_RETURN_IF_ERROR(require_regular_descriptor(fd.get(), path));
  return fd;
}

Status require_regular_descriptor(int fd, const std::filesystem::path& name) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(errno, "fstat", name);
  if (!S_ISREG(st.st_mode)) return not_regular(name, st.st_mode);
  int status_flags = ::fcntl(fd, F_GETFL);
  if (status_flags < 0 || ::fcntl(fd, F_SETFL, status_flags & ~O_NONBLOCK) != 0) {
    return errno_status(errno, "fcntl", name);
  }
  return ok_status();
}

StatusOr<std::string> read_regular_file(const std::filesystem::path& path, std::size_t limit,
                                        RegularFileOptions options) {
  GPUOPT_ASSIGN_OR_RETURN(FileDescriptor fd, open_regular_file(path, options));
  std::string text;
  std::size_t chunk = limit < 64 * 1024 ? limit : 64 * 1024;
  while (text.size() < limit) {
    std::size_t offset = text.size();
    std::size_t want = std::min(chunk, limit - offset);
    text.resize(offset + want);
    ssize_t n = ::read(fd.get(), text.data() + offset, want);
    if (n < 0) {
      if (errno == EINTR) {
        text.resize(offset);
        continue;
      }
      return errno_status(errno, "read", path);
    }
    text.resize(offset + static_cast<std::size_t>(n));
    if (n == 0) break;
  }
  return text;
}

Status refuse_special_file(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ok_status();
    return errno_status(errno, "stat", path);
  }
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  return ok_status();
}

}  // namespace gpuopt
