// `gpuopt bench pcie`: host<->device transfer bandwidth and latency as registered testcases, judged
// against the theoretical rate of the GPU's PCIe link, with a verdict per direction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/bench/testcase.hpp"
#include "gpuopt/core/status.hpp"

namespace gpuopt::bench::pcie {

// ---- Efficiency and verdicts (pure; tested without a GPU) -------------------------------------

// Azure's GPU health checks treat a link below 76% of its rate as failed; 80% is what a healthy
// Gen4/Gen5 x16 link delivers with pinned memory and leaves a margin for measurement noise.
inline constexpr double kHealthyEfficiency = 0.80;
inline constexpr double kFailEfficiency = 0.76;
// Above this the reported link cannot be the one carrying the data (a virtual bridge, a stale
// reading); the verdict is then unknown rather than healthy.
inline constexpr double kImplausibleEfficiency = 1.05;

enum class Verdict { kHealthy, kWarn, kFail, kUnknown };
std::string_view verdict_name(Verdict verdict);

// bytes / seconds in GB/s (1e9 bytes per second), from a time in milliseconds; 0 for no time.
double bandwidth_gbps(double bytes, double milliseconds);

// measured / theoretical; nullopt when the theoretical rate is unknown or not positive.
std::optional<double> link_efficiency(double measured_gbps, std::optional<double> theoretical_gbps);

// healthy >= 80%, warn below, fail below 76%; unknown without an efficiency or above 105%.
Verdict verdict_for(std::optional<double> efficiency);

// The link a GPU should get, read from sysfs (its own PCIe function, then the port above it).
struct LinkInfo {
  std::string bus_id;                       // sysfs form
  std::optional<int> generation;            // from the GPU's maximum link speed
  std::optional<int> width;                 // the GPU's maximum link width
  std::optional<double> current_speed_gts;  // as read; GPUs train down when idle
  std::optional<int> current_width;
  std::optional<double> theoretical_gbps;  // per direction, generation × width × encoding
  std::vector<std::string> notes;          // why a field is missing, narrower upstream port
};
nlohmann::json to_json(const LinkInfo& link);

// What the verdict weighs for one direction: the pinned figure from the GPU's own NUMA node, and
// when measured, pageable memory and pinned memory on a remote node, all at the same size.
struct DirectionFigures {
  std::string direction;  // "host_to_device" or "device_to_host"
  std::optional<double> pinned_local_gbps;
  std::optional<double> pageable_gbps;
  std::optional<double> pinned_remote_gbps;
  std::optional<int> remote_node;
  std::size_t bytes = 0;  // the transfer size compared
};

struct DirectionVerdict {
  std::string direction;
  Verdict verdict = Verdict::kUnknown;
  std::optional<double> efficiency;  // pinned local / theoretical
  std::vector<std::string> explanations;
};
// Judges one direction against the link and explains where the rate goes (pageable memory, the
// remote node, a link trained below its capability).
DirectionVerdict judge_direction(const DirectionFigures& figures, const LinkInfo& link);
nlohmann::json to_json(const DirectionVerdict& verdict);

// CLI exit code for a run: 0 healthy or nothing measurable (no GPU), 1 a warn verdict, 2 a fail
// verdict or a failed testcase (including a data mismatch).
int exit_code_for(const std::vector<TestcaseResult>& results);

// ---- Data pattern (the CPU twin of the fill and verify kernels) ------------------------------

// Value of the 8-byte word at `word_index` for a run's `seed`: a splitmix64 mix, so a shifted,
// truncated or stale copy is detected, not just an all-zero one.
std::uint64_t pattern_word(std::uint64_t word_index, std::uint64_t seed);
// Fills `bytes` bytes (little-endian words; a partial last word takes its low bytes).
void fill_pattern_reference(void* data, std::size_t bytes, std::uint64_t seed);
// Bytes that differ from the pattern.
std::size_t count_mismatches_reference(const void* data, std::size_t bytes, std::uint64_t seed);

// ---- The suite -------------------------------------------------------------------------------

// Default sweep: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, 1 GiB; --quick: 1 MiB and 256 MiB.
std::vector<std::size_t> default_sizes(bool quick);

// Every testcase in run order. Detects the device, its link and NUMA placement once, up front;
// with no usable GPU (or a CPU-only build) every testcase is waived with the reason.
Suite make_suite(const BenchOptions& options);

// The keys of make_suite's testcases, for --help and validation of --testcase.
std::vector<std::string> testcase_keys();
// make_suite's testcases without detecting anything (no CUDA initialisation), for --list.
Suite make_catalogue();

}  // namespace gpuopt::bench::pcie
