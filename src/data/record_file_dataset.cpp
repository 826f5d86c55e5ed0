// Record-file dataset: fixed-size records read with pread (thread-safe, no shared offset; O_DIRECT
// where the alignment allows), or with cuFile straight into device memory (GPUDirect Storage, or
// cuFile's compatibility mode) when the library loads, its driver opens and the file registers.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "cufile_driver.hpp"
#include "gpuopt/data/dataset.hpp"

namespace gpuopt::data {
namespace {

// O_DIRECT needs the offset, length and buffer aligned to the device's logical block; 4096 covers
// every common block size.
constexpr std::size_t kDirectAlignment = 4096;

bool aligned(const void* pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer) % kDirectAlignment == 0;
}

// File systems GDS can serve without compat mode (statfs magic numbers from linux/magic.h and the
// vendors' documentation); anything else runs through cuFile's compatibility path.
const char* gds_file_system(long type, bool* supported) {
  *supported = true;
  switch (static_cast<unsigned long>(type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x6969:
      return "nfs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0x19830326:
      return "beegfs";
    default:
      break;
  }
  *supported = false;
  switch (static_cast<unsigned long>(type)) {
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x9123683E:
      return "btrfs";
    case 0x65735546:
      return "fuse";
    default:
      return "unknown file system";
  }
}

class RecordFile {
 public:
  RecordFile(std::string path, int fd, int direct_fd, std::size_t record_bytes,
             std::size_t file_bytes)
      : path_(std::move(path)),
        fd_(fd),
        direct_fd_(direct_fd),
        record_bytes_(record_bytes),
        file_bytes_(file_bytes) {}
  ~RecordFile() {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  int direct_fd() const { return direct_fd_; }
  std::size_t record_bytes() const { return record_bytes_; }
  std::size_t records() const { return (file_bytes_ + record_bytes_ - 1) / record_bytes_; }

  // The bytes record `index` has in the file (fewer than record_bytes for a truncated last one).
  StatusOr<std::size_t> present_bytes(std::size_t index) const {
    if (index >= records()) {
      return out_of_range(fmt::format("record {} of {}: only {} records", index, path_, records()));
    }
    return std::min(record_bytes_, file_bytes_ - index * record_bytes_);
  }

  Status truncated(std::size_t index, std::size_t got) const {
    return data_loss(fmt::format("record {} of {} is truncated: {} of {} bytes", index, path_, got,
                                 record_bytes_));
  }

 private:
  std::string path_;
  int fd_;
  int direct_fd_;  // O_DIRECT, or -1
  std::size_t record_bytes_;
  std::size_t file_bytes_;
};

class CufileReader final : public DeviceReader {
 public:
  CufileReader(std::shared_ptr<cufile::Driver> driver, cufile::Handle handle,
               const RecordFile& file, std::string description)
      : driver_(std::move(driver)),
        handle_(handle),
        file_(file),
        description_(std::move(description)) {}
  ~CufileReader() override { driver_->api().handle_deregister(handle_); }

  Status register_buffer(void* device, std::size_t bytes) override {
    cufile::Error error = driver_->api().buf_register(device, bytes, 0);
    if (error.err != 0) {
      return unavailable(
          fmt::format("cuFileBufRegister of a {} B buffer: {}", bytes, cufile::error_text(error)));
    }
    return ok_status();
  }

  void deregister_buffer(void* device) override { (void)driver_->api().buf_deregister(device); }

  Status read(std::size_t index, void* device_base, std::size_t offset) override {
    GPUOPT_ASSIGN_OR_RETURN(std::size_t expected, file_.present_bytes(index));
    if (expected < file_.record_bytes()) return file_.truncated(index, expected);
    std::size_t file_offset = index * file_.record_bytes();
    std::size_t done = 0;
    while (done < expected) {
      errno = 0;
      ssize_t got = driver_->api().read(handle_, device_base, expected - done,
                                        static_cast<off_t>(file_offset + done),
                                        static_cast<off_t>(offset + done));
      if (got == -1 && errno == EINTR) continue;
      if (got < 0) {
        return data_loss(fmt::format("record {} of {}: cuFileRead failed: {}", index, file_.path(),
                                     cufile::io_error_text(got, errno)));
      }
      if (got == 0) break;  // the file shrank under us
      done += static_cast<std::size_t>(got);
    }
    if (done < expected) return file_.truncated(index, done);
    return ok_status();
  }

  std::string describe() const override { return description_; }

 private:
  std::shared_ptr<cufile::Driver> driver_;
  cufile::Handle handle_;
  const RecordFile& file_;
  std::string description_;
};

class RecordFileDataset final : public Dataset {
 public:
  explicit RecordFileDataset(std::unique_ptr<RecordFile> file) : file_(std::move(file)) {}
  // The reader deregisters its handle before the descriptors close.
  ~RecordFileDataset() override { reader_.reset(); }

  void set_reader(std::unique_ptr<CufileReader> reader) { reader_ = std::move(reader); }
  const RecordFile& file() const { return *file_; }

  std::size_t size() const override { return file_->records(); }
  std::size_t sample_bytes() const override { return file_->record_bytes(); }
  DeviceReader* device_reader() override { return reader_.get(); }

  Status read(std::size_t index, std::span<std::byte> out) override {
    GPUOPT_ASSIGN_OR_RETURN(std::size_t expected, file_->present_bytes(index));
    std::size_t offset = index * file_->record_bytes();
    // O_DIRECT only for whole, aligned records into an aligned buffer; anything else (a test's
    // vector, the truncated last record) goes through the page cache.
    bool direct = file_->direct_fd() >= 0 && expected == file_->record_bytes() &&
                  aligned(out.data()) && file_->record_bytes() % kDirectAlignment == 0;
    std::size_t done = 0;
    while (done < expected) {
      int fd = direct ? file_->direct_fd() : file_->fd();
      ssize_t got =
          ::pread(fd, out.data() + done, expected - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && direct && errno == EINVAL) {  // stricter alignment than we assumed
        direct = false;
        continue;
      }
      if (got < 0) {
        return data_loss(fmt::format("record {} of {}: pread failed: {}", index, file_->path(),
                                     std::strerror(errno)));
      }
      if (got == 0) break;  // the file shrank under us
      done += static_cast<std::size_t>(got);
      if (done % kDirectAlignment != 0) direct = false;  // a short read leaves an odd offset
    }
    if (done < file_->record_bytes()) return file_->truncated(index, done);
    (direct ? direct_reads_ : buffered_reads_).fetch_add(1, std::memory_order_relaxed);
    return ok_status();
  }

  std::string describe() const override {
    std::string io;
    if (reader_) {
      io = reader_->describe();
    } else {
      io = file_->direct_fd() >= 0 ? "pread, O_DIRECT for whole records into aligned buffers"
                                   : "pread";
      std::uint64_t direct = direct_reads_.load(std::memory_order_relaxed);
      std::uint64_t buffered = buffered_reads_.load(std::memory_order_relaxed);
      if (direct + buffered > 0) {
        io += fmt::format("; {} O_DIRECT and {} buffered reads so far", direct, buffered);
      }
    }
    return fmt::format("record file {}: {} records x {} B ({})", file_->path(), size(),
                       file_->record_bytes(), io);
  }

 private:
  std::unique_ptr<RecordFile> file_;
  std::unique_ptr<CufileReader> reader_;
  std::atomic<std::uint64_t> direct_reads_{0};
  std::atomic<std::uint64_t> buffered_reads_{0};
};

constexpr const char* kFallback = "reading with pread into pinned buffers";

// cuFile for `file`: the driver, a registered handle (on the O_DIRECT descriptor when there is
// one) and how cuFile will move the data. UNAVAILABLE with the reason otherwise.
StatusOr<std::unique_ptr<CufileReader>> open_cufile_reader(const RecordFileOptions& options,
                                                           const RecordFile& file,
                                                           GdsProbe* probe) {
  GPUOPT_ASSIGN_OR_RETURN(auto driver, cufile::Driver::open(options.cufile_libraries));
  std::string mode = driver->mode();
  std::string detail = driver->mode_detail();
  struct statfs fs {};
  if (mode == "gds" && ::fstatfs(file.fd(), &fs) == 0) {
    bool supported = false;
    const char* name = gds_file_system(fs.f_type, &supported);
    if (!supported) {
      mode = "compat";
      detail = fmt::format("GDS unsupported on this filesystem ({}), compat mode", name);
    } else {
      detail += fmt::format("; {} file system", name);
    }
  }
  cufile::Descriptor descriptor{};
  descriptor.type = cufile::kHandleTypeOpaqueFd;
  bool direct = file.direct_fd() >= 0;
  descriptor.handle.fd = direct ? file.direct_fd() : file.fd();
  cufile::Handle handle = nullptr;
  cufile::Error error = driver->api().handle_register(&handle, &descriptor);
  if (error.err != 0 && direct) {
    // Some setups refuse one descriptor kind; the buffered one still works in compat mode.
    descriptor.handle.fd = file.fd();
    direct = false;
    error = driver->api().handle_register(&handle, &descriptor);
  }
  if (error.err != 0) {
    return unavailable(fmt::format("cuFile: cuFileHandleRegister of {} failed: {}", file.path(),
                                   cufile::error_text(error)));
  }
  std::string description =
      fmt::format("cuFile via {}, {} mode: {}; {}", driver->library(), mode, detail,
                  direct ? "O_DIRECT descriptor" : "buffered descriptor (page cache)");
  probe->usable = true;
  probe->io = "cufile";
  probe->cufile_mode = mode;
  probe->message = description;
  return std::make_unique<CufileReader>(std::move(driver), handle, file, description);
}

}  // namespace

const char* record_io_name(RecordIo io) {
  switch (io) {
    case RecordIo::kAuto:
      return "auto";
    case RecordIo::kPread:
      return "pread";
    case RecordIo::kCufile:
      return "cufile";
  }
  return "?";
}

StatusOr<RecordIo> parse_record_io(const std::string& text) {
  if (text == "auto") return RecordIo::kAuto;
  if (text == "pread") return RecordIo::kPread;
  if (text == "cufile") return RecordIo::kCufile;
  return invalid_argument(fmt::format("I/O path '{}': want auto, pread or cufile", text));
}

GdsProbe probe_gds(const std::vector<std::string>& libraries) {
  auto driver = cufile::Driver::open(libraries);
  if (!driver.ok()) {
    return {false, "pread", "", false, fmt::format("{}; {}", driver.status().message(), kFallback)};
  }
  return {true, "cufile", (*driver)->mode(), false,
          fmt::format("cuFile driver opened via {} ({} mode: {})", (*driver)->library(),
                      (*driver)->mode(), (*driver)->mode_detail())};
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
  int direct_fd = -1;
  std::string direct_note;
  if (!options.direct_io) {
    direct_note = "O_DIRECT off";
  } else if (options.record_bytes % kDirectAlignment != 0) {
    direct_note = fmt::format("no O_DIRECT: record size {} is not a multiple of {}",
                              options.record_bytes, kDirectAlignment);
  } else {
    direct_fd = ::open(options.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    direct_note =
        direct_fd >= 0 ? "O_DIRECT" : fmt::format("no O_DIRECT: {}", std::strerror(errno));
  }
  auto file = std::make_unique<RecordFile>(options.path, fd, direct_fd, options.record_bytes,
                                           static_cast<std::size_t>(info.st_size));
  auto dataset = std::make_unique<RecordFileDataset>(std::move(file));

  GdsProbe probe;
  probe.io = "pread";
  probe.direct_io = direct_fd >= 0;
  if (options.io == RecordIo::kPread) {
    probe.message = fmt::format("pread chosen ({})", direct_note);
  } else {
    auto reader = open_cufile_reader(options, dataset->file(), &probe);
    if (reader.ok()) {
      dataset->set_reader(std::move(reader).value());
    } else if (options.io == RecordIo::kCufile) {
      return unavailable(fmt::format("record file {}: cuFile requested but unusable: {}",
                                     options.path, reader.status().message()));
    } else {
      probe.message = fmt::format("{}; {} ({})", reader.status().message(), kFallback, direct_note);
    }
  }
  if (gds != nullptr) *gds = probe;
  return std::unique_ptr<Dataset>(std::move(dataset));
}

}  // namespace gpuopt::data
