// `gpuopt bench loader`: the adaptive prefetch loader (data/loader.hpp) against fixed depths 2
// (PyTorch's default prefetch) and 8, feeding a consumer of set duration (a GPU kernel on a compute
// stream, or a host busy-wait in CPU mode), for a constant and a bursty producer.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gpuopt/bench/testcase.hpp"
#include "gpuopt/data/dataset.hpp"
#include "gpuopt/data/loader.hpp"

namespace gpuopt::bench::loader {

// The done criteria of issue 5.
inline constexpr double kMaxWaitWhenProducerIsFaster = 0.02;  // consumer waits <= 2% of wall time
inline constexpr double kMinBurstyImprovement = 2.0;          // adaptive vs fixed depth 2

struct LoaderBenchOptions {
  bool cpu = false;           // host consumer even when a GPU is present
  double consumer_us = 2000;  // consumer time per batch
  std::size_t batches = 0;    // per run; 0 = 300 (--quick) or 800
  std::size_t batch_size = 32;
  std::size_t sample_bytes = 0;  // 0 = 16 KiB (CPU mode) or 64 KiB (GPU mode)
  int workers = 8;
  data::CostMode producer_cost = data::CostMode::kSleep;
  double sample_us = 100;         // a sample's cost (constant part)
  std::size_t stall_every = 512;  // bursty: one sample in this many stalls...
  double stall_us = 20000;        // ...for this long
  std::size_t pinned_budget_bytes = std::size_t{256} << 20;
};

// One loader configuration under test.
struct DepthConfig {
  std::string key;  // "fixed-2", "fixed-8", "adaptive"
  data::ControllerOptions controller;
};
std::vector<DepthConfig> depth_configs();

// One (scenario, config) run.
struct RunResult {
  std::string scenario;
  std::string config;
  bool gpu = false;
  data::LoaderStats stats;
  double wall_s = 0;
  // The figure judged: GPU mode, the idle gaps between consumer kernels / their span; CPU mode,
  // the time next() blocked / wall time.
  double wait_fraction = 0;
  std::optional<double> gpu_idle_fraction;
};
nlohmann::json to_json(const RunResult& run);

// The synthetic producer of a scenario ("constant" or "bursty").
data::SyntheticOptions scenario_source(const std::string& scenario,
                                       const LoaderBenchOptions& options, bool gpu);

// Runs one configuration end to end. UNAVAILABLE/UNIMPLEMENTED for GPU mode without a device.
StatusOr<RunResult> run_config(const std::string& scenario, const DepthConfig& config,
                               const LoaderBenchOptions& options, bool gpu, int device);

// Verdict lines for a scenario's runs; `met` is false when a done criterion is missed.
std::vector<std::string> judge(const std::string& scenario, const std::vector<RunResult>& runs,
                               bool* met);

// Testcases "constant" and "bursty"; GPU mode unless options.cpu or no usable GPU (then CPU mode,
// with a note saying so).
Suite make_suite(const BenchOptions& bench, const LoaderBenchOptions& options);
std::vector<std::string> testcase_keys();

// 0 every criterion met, 1 a criterion missed, 2 a testcase failed.
int exit_code_for(const std::vector<TestcaseResult>& results);

// The record-file read paths (`--record-file PATH --io ...`): each path reads the whole file
// through a GPU-mode loader (sequential, fixed depth 8), `repeats` times, the file's pages dropped
// from the page cache before each pass; GB/s = bytes delivered / wall time.
struct RecordIoBenchOptions {
  std::string path;
  std::size_t record_bytes = std::size_t{512} << 10;
  std::size_t batch_size = 8;  // records per batch
  int workers = 8;
  int repeats = 3;  // passes over the file per path
};

// Writes `mib` MiB of random bytes to `path` (replacing it) and flushes them to the disk.
Status create_record_file(const std::string& path, std::size_t mib);
// "auto", "pread", "cufile" (data::parse_record_io; empty = auto) or "compare" (pread and cufile).
StatusOr<std::vector<data::RecordIo>> record_io_paths(const std::string& io);
// One testcase per path, keyed by the path's name; cufile is waived when cuFile cannot open the
// file, every path when no GPU is usable.
Suite make_record_io_suite(const RecordIoBenchOptions& options,
                           const std::vector<data::RecordIo>& paths);
// 0 every path ran (or was waived), 2 a testcase failed.
int record_io_exit_code_for(const std::vector<TestcaseResult>& results);

}  // namespace gpuopt::bench::loader
