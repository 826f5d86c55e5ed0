// `gpuopt bench loader --record-file PATH --io ...`: the record-file read paths as testcases (pread
// + pinned staging + host-to-device copies against cuFile straight into device batches), and the
// random record file they read.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpuopt/bench/loader.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::bench::loader {
namespace {

// Drops the file's clean pages from the page cache (no root needed), so a buffered read path is
// not served from memory by an earlier pass. O_DIRECT paths bypass the cache anyway.
bool drop_cached_pages(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool dropped = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return dropped;
}

// One read path over the whole record file, `repeats` times: GPU-mode loader, sequential order,
// a consumer that only orders its stream after each batch; GB/s = bytes delivered / wall, from the
// loader's creation to the consumer stream's last synchronize.
class RecordReadTestcase final : public Testcase {
 public:
  RecordReadTestcase(RecordIoBenchOptions options, data::RecordIo io)
      : options_(std::move(options)), io_(io) {}

  std::string key() const override { return data::record_io_name(io_); }
  std::string description() const override {
    switch (io_) {
      case data::RecordIo::kPread:
        return "pread (O_DIRECT where aligned) into pinned staging, then host-to-device copies";
      case data::RecordIo::kCufile:
        return "cuFileRead straight into registered device batch buffers";
      default:
        return "the path auto chooses: cuFile when usable, else pread";
    }
  }

  Status filter(const BenchContext&) const override {
    auto devices = cuda_device_count();
    if (!devices.ok()) return devices.status();
    if (io_ != data::RecordIo::kCufile) return ok_status();
    // Waived (with cuFile's reason) rather than failed: absence of cuFile is a fact of the machine.
    data::RecordFileOptions options{options_.path, options_.record_bytes, io_};
    return open_record_file(options).status();
  }

  StatusOr<TestcaseResult> run(BenchContext& context) override {
    TestcaseResult result;
    result.key = key();
    result.description = description();
    std::vector<double> passes;
    data::GdsProbe probe;
    data::LoaderStats last;
    std::string source;
    std::uint64_t bytes = 0;
    bool dropped = true;
    for (int pass = 0; pass < options_.repeats; ++pass) {
      dropped = drop_cached_pages(options_.path) && dropped;
      data::RecordFileOptions options{options_.path, options_.record_bytes, io_};
      GPUOPT_ASSIGN_OR_RETURN(auto opened, data::open_record_file(options, &probe));
      std::shared_ptr<data::Dataset> dataset(std::move(opened));
      data::LoaderOptions loader_options;
      loader_options.mode = data::LoaderMode::kGpu;
      loader_options.device = context.options().device;
      loader_options.batch_size = options_.batch_size;
      loader_options.workers = options_.workers;
      loader_options.depth.adaptive = false;
      loader_options.depth.initial_depth = 8;
      loader_options.on_error = data::ErrorPolicy::kSkipAndCount;  // a partial last record
      GPUOPT_ASSIGN_OR_RETURN(auto device, runtime::Device::open(context.options().device));
      GPUOPT_ASSIGN_OR_RETURN(auto stream, runtime::Stream::create(device));
      auto began = std::chrono::steady_clock::now();
      GPUOPT_ASSIGN_OR_RETURN(auto loader, data::Loader::create(dataset, loader_options));
      bytes = 0;
      while (true) {
        GPUOPT_ASSIGN_OR_RETURN(auto batch, loader->next());
        if (!batch) break;
        GPUOPT_RETURN_IF_ERROR(batch->wait_on(stream.handle()));
        bytes += batch->bytes();
        GPUOPT_RETURN_IF_ERROR(loader->release(*batch, stream.handle()));
      }
      GPUOPT_RETURN_IF_ERROR(stream.synchronize());
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      passes.push_back(static_cast<double>(bytes) / seconds / 1e9);
      last = loader->stats();
      source = dataset->describe();  // after the pass: pread's O_DIRECT/buffered read counts
      context.progress(static_cast<double>(pass + 1) / options_.repeats);
    }
    Summary summary = summarize(passes);
    std::string mode = last.io == "cufile" ? probe.cufile_mode : std::string("-");
    result.data = {{"io", last.io},
                   {"io_detail", last.io_detail},
                   {"cufile_mode", probe.cufile_mode.empty() ? nlohmann::json(nullptr)
                                                             : nlohmann::json(probe.cufile_mode)},
                   {"choice_reason", probe.message},
                   {"o_direct", probe.direct_io},
                   {"source", source},
                   {"page_cache_dropped_before_each_pass", dropped},
                   {"file", options_.path},
                   {"bytes_per_pass", bytes},
                   {"record_bytes", options_.record_bytes},
                   {"batch_size", options_.batch_size},
                   {"workers", options_.workers},
                   {"passes_gbps", passes},
                   {"gbps", to_json(summary)},
                   {"loader", data::to_json(last)}};
    result.table.columns = {"path", "cuFile mode", "O_DIRECT", "GB/s median", "min", "max"};
    result.table.rows.push_back(
        {last.io, mode, probe.direct_io ? "yes" : "no", fmt::format("{:.2f}", summary.median),
         fmt::format("{:.2f}", summary.min), fmt::format("{:.2f}", summary.max)});
    result.notes.push_back(probe.message);
    result.notes.push_back(fmt::format(
        "page cache: {} before each pass; {}", dropped ? "file's pages dropped" : "NOT dropped",
        probe.direct_io ? "O_DIRECT reads bypass it" : "reads go through it"));
    return result;
  }

 private:
  RecordIoBenchOptions options_;
  data::RecordIo io_;
};

}  // namespace

// Random bytes (splitmix64), written in 8 MiB pieces and flushed, so the read passes see the disk.
Status create_record_file(const std::string& path, std::size_t mib) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return unavailable(fmt::format("create {}: {}", path, std::strerror(errno)));
  std::vector<std::uint64_t> chunk((std::size_t{8} << 20) / 8);
  std::uint64_t state = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(::getpid());
  std::size_t remaining = mib << 20;
  Status status;
  while (remaining > 0 && status.ok()) {
    for (auto& word : chunk) {
      std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      word = z ^ (z >> 31);
    }
    std::size_t bytes = std::min(remaining, chunk.size() * 8);
    ssize_t wrote = ::write(fd, chunk.data(), bytes);
    if (wrote != static_cast<ssize_t>(bytes)) {
      status = unavailable(
          fmt::format("write {}: {}", path, wrote < 0 ? std::strerror(errno) : "short write"));
    }
    remaining -= bytes;
  }
  if (status.ok() && ::fdatasync(fd) != 0) {
    status = unavailable(fmt::format("fdatasync {}: {}", path, std::strerror(errno)));
  }
  ::close(fd);
  return status;
}

StatusOr<std::vector<data::RecordIo>> record_io_paths(const std::string& io) {
  if (io == "compare") {
    return std::vector<data::RecordIo>{data::RecordIo::kPread, data::RecordIo::kCufile};
  }
  GPUOPT_ASSIGN_OR_RETURN(data::RecordIo parsed, data::parse_record_io(io.empty() ? "auto" : io));
  return std::vector<data::RecordIo>{parsed};
}

Suite make_record_io_suite(const RecordIoBenchOptions& options,
                           const std::vector<data::RecordIo>& paths) {
  Suite suite("loader-record-io");
  for (auto io : paths) suite.add(std::make_unique<RecordReadTestcase>(options, io));
  return suite;
}

int record_io_exit_code_for(const std::vector<TestcaseResult>& results) {
  for (const auto& result : results) {
    if (result.outcome == Outcome::kFailed) return 2;
  }
  return 0;
}

}  // namespace gpuopt::bench::loader
