// Record-file dataset: fixed-size records read with pread (thread-safe, no shared offset), and the
// GPUDirect Storage probe that decides whether cuFile could be used instead.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gpuopt/core/dynamic_library.hpp"
#include "gpuopt/data/dataset.hpp"

namespace gpuopt::data {
namespace {

class RecordFileDataset final : public Dataset {
 public:
  RecordFileDataset(std::string path, int fd, std::size_t record_bytes, std::size_t file_bytes)
      : path_(std::move(path)), fd_(fd), record_bytes_(record_bytes), file_bytes_(file_bytes) {}
  ~RecordFileDataset() override { ::close(fd_); }

  std::size_t size() const override { return (file_bytes_ + record_bytes_ - 1) / record_bytes_; }
  std::size_t sample_bytes() const override { return record_bytes_; }

  Status read(std::size_t index, std::span<std::byte> out) override {
    if (index >= size()) {
      return out_of_range(fmt::format("record {} of {}: only {} records", index, path_, size()));
    }
    std::size_t offset = index * record_bytes_;
    std::size_t expected = std::min(record_bytes_, file_bytes_ - offset);
    std::size_t done = 0;
    while (done < expected) {
      ssize_t got =
          ::pread(fd_, out.data() + done, expected - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return data_loss(
            fmt::format("record {} of {}: pread failed: {}", index, path_, std::strerror(errno)));
      }
      if (got == 0) break;  // the file shrank under us
      done += static_cast<std::size_t>(got);
    }
    if (done < record_bytes_) {
      return data_loss(fmt::format("record {} of {} is truncated: {} of {} bytes", index, path_,
                                   done, record_bytes_));
    }
    return ok_status();
  }

  std::string describe() const override {
    return fmt::format("record file {}: {} records x {} B (pread)", path_, size(), record_bytes_);
  }

 private:
  std::string path_;
  int fd_;
  std::size_t record_bytes_;
  std::size_t file_bytes_;
};

// cuFile's error struct as returned by value (cufile.h: CUfileError_t { CUfileOpError err;
// CUresult cu_err; }); declared here so no cuFile header is needed to build.
struct CufileError {
  int err;
  int cu_err;
};

}  // namespace

GdsProbe probe_gds() {
  const char* fallback = "reading with pread into pinned buffers";
  auto library = DynamicLibrary::open({"libcufile.so.0", "libcufile.so"}, "CUFILE");
  if (!library.ok()) {
    return {false,
            fmt::format("cuFile unavailable ({}): {}", library.status().message(), fallback)};
  }
  using DriverOpen = CufileError (*)();
  using DriverClose = CufileError (*)();
  auto driver_open = library->function<DriverOpen>({"cuFileDriverOpen_v2", "cuFileDriverOpen"});
  auto driver_close = library->function<DriverClose>({"cuFileDriverClose_v2", "cuFileDriverClose"});
  if (driver_open == nullptr || driver_close == nullptr) {
    return {false, fmt::format("{} lacks cuFileDriverOpen: {}", library->name(), fallback)};
  }
  CufileError opened = driver_open();
  if (opened.err != 0) {
    return {false, fmt::format("cuFileDriverOpen failed (error {}, CUresult {}): {}", opened.err,
                               opened.cu_err, fallback)};
  }
  driver_close();
  // The batch path still reads with pread: direct cuFile reads into device batches are not wired
  // into the loader yet (see docs/data-loader.md).
  return {true, fmt::format("cuFile driver opened via {}; batches still read with pread into "
                            "pinned buffers (direct GDS reads not wired yet)",
                            library->name())};
}

StatusOr<std::unique_ptr<Dataset>> open_record_file(const RecordFileOptions& options,
                                                    GdsProbe* gds) {
  if (options.record_bytes == 0) {
    return invalid_argument(fmt::format("record file {}: record size must be > 0", options.path));
  }
  int fd = ::open(options.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return not_found(fmt::format("record file {}: {}", options.path, std::strerror(errno)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return invalid_argument(fmt::format("record file {}: not a regular file", options.path));
  }
  GdsProbe probe;
  if (options.io == RecordIo::kPread) {
    probe = {false, "pread chosen"};
  } else {
    probe = probe_gds();
    if (options.io == RecordIo::kGds && !probe.usable) {
      ::close(fd);
      return unavailable(
          fmt::format("record file {}: GDS requested: {}", options.path, probe.message));
    }
  }
  if (gds != nullptr) *gds = probe;
  return std::unique_ptr<Dataset>(std::make_unique<RecordFileDataset>(
      options.path, fd, options.record_bytes, static_cast<std::size_t>(info.st_size)));
}

}  // namespace gpuopt::data
