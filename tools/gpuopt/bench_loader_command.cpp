// `gpuopt bench loader [--cpu] [--quick] [--json]`: the adaptive prefetch loader against fixed
// depths 2 and 8, for a constant and a bursty producer feeding a consumer of set duration; with
// `--record-file PATH --io auto|pread|cufile|compare`, the record-file read paths instead (pread +
// pinned staging + H2D against cuFile straight into device batches).
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_run.hpp"
#include "command_registry.hpp"
#include "gpuopt/bench/loader.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/data/dataset.hpp"
#include "gpuopt/data/loader.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::cli {
namespace {

struct RecordArgs {
  std::string path;
  std::string io;  // auto, pread, cufile, compare; empty = the synthetic suite
  std::size_t record_bytes = std::size_t{512} << 10;
  std::size_t batch_size = 8;
  int workers = 8;
  std::size_t create_mib = 0;  // > 0: write this many MiB of random records first
  int repeats = 3;
};

struct LoaderArgs {
  bench::BenchOptions bench;
  bench::loader::LoaderBenchOptions loader;
  std::string producer_cost = "sleep";
  bool json = false;
  RecordArgs record;
};

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
class RecordReadTestcase final : public bench::Testcase {
 public:
  RecordReadTestcase(RecordArgs args, data::RecordIo io) : args_(std::move(args)), io_(io) {}

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

  Status filter(const bench::BenchContext&) const override {
    auto devices = cuda_device_count();
    if (!devices.ok()) return devices.status();
    if (io_ != data::RecordIo::kCufile) return ok_status();
    // Waived (with cuFile's reason) rather than failed: absence of cuFile is a fact of the machine.
    data::RecordFileOptions options{args_.path, args_.record_bytes, io_};
    return open_record_file(options).status();
  }

  StatusOr<bench::TestcaseResult> run(bench::BenchContext& context) override {
    bench::TestcaseResult result;
    result.key = key();
    result.description = description();
    std::vector<double> passes;
    data::GdsProbe probe;
    data::LoaderStats last;
    std::string source;
    std::uint64_t bytes = 0;
    bool dropped = true;
    for (int pass = 0; pass < args_.repeats; ++pass) {
      dropped = drop_cached_pages(args_.path) && dropped;
      data::RecordFileOptions options{args_.path, args_.record_bytes, io_};
      GPUOPT_ASSIGN_OR_RETURN(auto opened, data::open_record_file(options, &probe));
      std::shared_ptr<data::Dataset> dataset(std::move(opened));
      data::LoaderOptions loader_options;
      loader_options.mode = data::LoaderMode::kGpu;
      loader_options.device = context.options().device;
      loader_options.batch_size = args_.batch_size;
      loader_options.workers = args_.workers;
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
      context.progress(static_cast<double>(pass + 1) / args_.repeats);
    }
    bench::Summary summary = bench::summarize(passes);
    std::string mode = last.io == "cufile" ? probe.cufile_mode : std::string("-");
    result.data = {{"io", last.io},
                   {"io_detail", last.io_detail},
                   {"cufile_mode", probe.cufile_mode.empty() ? nlohmann::json(nullptr)
                                                             : nlohmann::json(probe.cufile_mode)},
                   {"choice_reason", probe.message},
                   {"o_direct", probe.direct_io},
                   {"source", source},
                   {"page_cache_dropped_before_each_pass", dropped},
                   {"file", args_.path},
                   {"bytes_per_pass", bytes},
                   {"record_bytes", args_.record_bytes},
                   {"batch_size", args_.batch_size},
                   {"workers", args_.workers},
                   {"passes_gbps", passes},
                   {"gbps", bench::to_json(summary)},
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
  RecordArgs args_;
  data::RecordIo io_;
};

int run_record_file_bench(const LoaderArgs& args) {
  const RecordArgs& record = args.record;
  if (record.path.empty()) {
    std::fprintf(stderr, "gpuopt bench loader: --io needs --record-file PATH\n");
    return kExitToolFailed;
  }
  std::vector<data::RecordIo> paths;
  if (record.io == "compare") {
    paths = {data::RecordIo::kPread, data::RecordIo::kCufile};
  } else {
    auto parsed = data::parse_record_io(record.io.empty() ? "auto" : record.io);
    if (!parsed.ok()) {
      std::fprintf(stderr, "gpuopt bench loader: --io: %s (or compare)\n",
                   parsed.status().message().c_str());
      return kExitToolFailed;
    }
    paths = {*parsed};
  }
  if (record.create_mib > 0) {
    Status created = create_record_file(record.path, record.create_mib);
    if (!created.ok()) {
      std::fprintf(stderr, "gpuopt bench loader: %s\n", created.to_string().c_str());
      return kExitToolFailed;
    }
  }
  // --io cufile insists: a machine without cuFile is an error here, not a waiver.
  if (record.io == "cufile") {
    auto opened =
        data::open_record_file({record.path, record.record_bytes, data::RecordIo::kCufile});
    if (!opened.ok()) {
      std::fprintf(stderr, "gpuopt bench loader: %s\n", opened.status().to_string().c_str());
      return kExitErrors;
    }
  }
  bench::Suite suite("loader-record-io");
  for (auto io : paths) suite.add(std::make_unique<RecordReadTestcase>(record, io));
  auto results = run_and_print(suite, args.bench, args.json);
  for (const auto& result : results) {
    if (result.outcome == bench::Outcome::kFailed) return kExitErrors;
  }
  return kExitOk;
}

int run_bench_loader(LoaderArgs args) {
  if (!args.record.io.empty() || !args.record.path.empty()) return run_record_file_bench(args);
  if (args.producer_cost == "busy") {
    args.loader.producer_cost = data::CostMode::kBusyWait;
  } else if (args.producer_cost != "sleep") {
    std::fprintf(stderr, "gpuopt bench loader: --producer-cost must be sleep or busy, not '%s'\n",
                 args.producer_cost.c_str());
    return kExitToolFailed;
  }
  for (const auto& key : args.bench.only) {
    auto keys = bench::loader::testcase_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::fprintf(stderr, "gpuopt bench loader: unknown testcase '%s' (constant, bursty)\n",
                   key.c_str());
      return kExitToolFailed;
    }
  }
  bench::Suite suite = bench::loader::make_suite(args.bench, args.loader);
  auto results = run_and_print(suite, args.bench, args.json);
  return bench::loader::exit_code_for(results);
}

GPUOPT_REGISTER_COMMAND("bench", 50, [](CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<LoaderArgs>();
  CLI::App* command = parent.add_subcommand(
      "loader", "Adaptive prefetch loader vs fixed depth 2 and 8 (constant and bursty producers)");
  command->add_flag("--cpu", args->loader.cpu, "Host consumer (busy-wait) even when a GPU exists");
  command->add_flag("--quick", args->bench.quick, "Fewer batches per run");
  command->add_flag("--json", args->json, "JSON on stdout instead of text");
  command->add_option("--consumer-us", args->loader.consumer_us, "Consumer time per batch (us)")
      ->check(CLI::PositiveNumber);
  command->add_option("--batches", args->loader.batches,
                      "Batches per run (default 800, quick 300)");
  command->add_option("--batch-size", args->loader.batch_size, "Samples per batch")
      ->check(CLI::PositiveNumber);
  command->add_option("--sample-bytes", args->loader.sample_bytes,
                      "Bytes per sample (default 16 KiB CPU, 64 KiB GPU)");
  command->add_option("--workers", args->loader.workers, "Loader worker threads")
      ->check(CLI::Range(1, 1024));
  command->add_option("--sample-us", args->loader.sample_us, "Producer cost per sample (us)");
  command->add_option("--stall-every", args->loader.stall_every,
                      "Bursty: one sample in this many stalls");
  command->add_option("--stall-us", args->loader.stall_us, "Bursty: stall length (us)");
  command->add_option("--producer-cost", args->producer_cost,
                      "sleep (models I/O, default) or busy (burns CPU)");
  command->add_option("--device", args->bench.device, "CUDA device ordinal");
  command->add_option("--testcase", args->bench.only, "Run only these: constant, bursty");
  command->add_option("--record-file", args->record.path,
                      "Read this record file through the loader instead of the synthetic suite");
  command->add_option("--io", args->record.io,
                      "Record-file read path: auto, pread, cufile, or compare (pread and cufile)");
  command
      ->add_option("--record-bytes", args->record.record_bytes,
                   "Record-file mode: bytes per record (default 512 KiB)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--record-batch", args->record.batch_size,
                   "Record-file mode: records per batch (default 8)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--record-workers", args->record.workers,
                   "Record-file mode: loader workers (default 8)")
      ->check(CLI::Range(1, 1024));
  command->add_option("--create-mib", args->record.create_mib,
                      "Record-file mode: first write this many MiB of random records to the file");
  command
      ->add_option("--repeats", args->record.repeats,
                   "Record-file mode: passes over the file per path (default 3)")
      ->check(CLI::Range(1, 100));
  command->callback([args, &exit_code] { exit_code = run_bench_loader(*args); });
});

}  // namespace
}  // namespace gpuopt::cli
