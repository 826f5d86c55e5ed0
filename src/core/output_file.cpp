// Output files checked up front and replaced atomically (output_file.hpp).
#include "gpuopt/core/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace gpuopt {

namespace fs = std::filesystem;

namespace {

std::string what_is_at(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "not a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  return "not a regular file";
}

fs::path directory_of(const fs::path& file) {
  return file.has_parent_path() ? file.parent_path() : fs::path(".");
}

}  // namespace

Status check_output_path(const std::string& path) {
  if (path.empty()) return invalid_argument("the output path is empty");
  const fs::path file(path);
  const fs::path directory = directory_of(file);
  std::error_code error;
  const auto directory_status = fs::status(directory, error);
  if (error || !fs::is_directory(directory_status)) {
    return invalid_argument(
        fmt::format("{}: directory {} does not exist", path, directory.string()));
  }
  const auto file_status = fs::status(file, error);
  if (!error && fs::exists(file_status)) {
    if (!fs::is_regular_file(file_status)) {
      return invalid_argument(fmt::format("{} is {}, not a regular file", path, what_is_at(path)));
    }
    if (access(path.c_str(), W_OK) != 0) {
      return permission_denied(fmt::format("{}: not writable: {}", path, std::strerror(errno)));
    }
  }
  // Replacing the file means creating a new one beside it, so the directory must be writable
  // even when the file is.
  if (access(directory.c_str(), W_OK | X_OK) != 0) {
    return permission_denied(fmt::format("{}: cannot create a file in {}: {}", path,
                                         directory.string(), std::strerror(errno)));
  }
  return ok_status();
}

namespace {

// A new file beside `path`, created O_EXCL (never someone else's), open for writing.
Status create_temporary(const std::string& path, std::string* temporary, int* fd) {
  static std::atomic<unsigned> counter{0};
  const fs::path file(path);
  *fd = -1;
  for (int attempt = 0; attempt < 100 && *fd < 0; ++attempt) {
    *temporary = (directory_of(file) / fmt::format(".{}.{}.{}.tmp", file.filename().string(),
                                                   getpid(), counter.fetch_add(1)))
                     .string();
    *fd = ::open(temporary->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (*fd < 0 && errno != EEXIST) break;
  }
  if (*fd < 0) {
    return permission_denied(
        fmt::format("{}: cannot create a temporary file: {}", path, std::strerror(errno)));
  }
  return ok_status();
}

// Flushes the written temporary file (`fd`, closed here) to disk and renames it over `path`; on
// any error the temporary file is removed.
Status publish(const std::string& path, const std::string& temporary, int fd) {
  auto fail = [&](const char* what) {
    const int saved = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(temporary.c_str());
    return Status(saved == ENOSPC ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                  fmt::format("{}: {}: {}", path, what, std::strerror(saved)));
  };
  if (::fsync(fd) != 0) return fail("cannot flush to disk");
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail("cannot close");
  if (::rename(temporary.c_str(), path.c_str()) != 0) return fail("cannot rename into place");
  return ok_status();
}

}  // namespace

Status write_file_atomically(const std::string& path, std::string_view contents) {
  GPUOPT_RETURN_IF_ERROR(check_output_path(path));
  std::string temporary;
  int fd = -1;
  GPUOPT_RETURN_IF_ERROR(create_temporary(path, &temporary, &fd));
  std::size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      return Status(saved == ENOSPC ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                    fmt::format("{}: cannot write: {}", path, std::strerror(saved)));
    }
    written += static_cast<std::size_t>(n);
  }
  return publish(path, temporary, fd);
}

Status write_file_atomically(const std::string& path,
                             const std::function<Status(std::ostream&)>& produce) {
  GPUOPT_RETURN_IF_ERROR(check_output_path(path));
  std::string temporary;
  int fd = -1;
  GPUOPT_RETURN_IF_ERROR(create_temporary(path, &temporary, &fd));
  Status produced;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    produced = out ? produce(out)
                   : internal_error(fmt::format("{}: cannot open a temporary "
                                                "file beside it",
                                                path));
    if (produced.ok()) {
      out.close();
      if (!out) produced = internal_error(fmt::format("{}: cannot write (disk full?)", path));
    }
  }
  if (!produced.ok()) {
    ::close(fd);
    ::unlink(temporary.c_str());
    return produced;
  }
  return publish(path, temporary, fd);
}

}  // namespace gpuopt
