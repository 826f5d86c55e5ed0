// Datasets for the prefetch loader: index → fixed-size sample bytes, from a record file, a folder
// of JPEGs (decoded and resized by libjpeg-turbo) or a synthetic source with a chosen cost profile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "gpuopt/core/status.hpp"

namespace gpuopt::data {

// A dataset maps an index in [0, size()) to exactly sample_bytes() bytes, so samples collate into a
// batch by placement. read() is called concurrently from several worker threads and must be
// thread-safe. Bad input (a truncated record, a corrupt JPEG) is DATA_LOSS naming the index and the
// file; the loader applies the user's policy (skip and count, or stop).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  virtual std::size_t sample_bytes() const = 0;
  // Writes sample `index` into `out` (out.size() == sample_bytes()).
  virtual Status read(std::size_t index, std::span<std::byte> out) = 0;
  // One line for people: what the source is and where it reads from.
  virtual std::string describe() const = 0;
};

// ---- fixed-size records in one file -------------------------------------------------------------
enum class RecordIo {
  kAuto,   // GPUDirect Storage when cuFile and GDS are usable, else pread (with a note why)
  kPread,  // pread into host (pinned staging) buffers
  kGds,    // insist on cuFile; UNAVAILABLE when it cannot be used
};

struct RecordFileOptions {
  std::string path;
  std::size_t record_bytes = 0;
  RecordIo io = RecordIo::kAuto;
};

// What the record-file source decided about GPUDirect Storage, and why.
struct GdsProbe {
  bool usable = false;
  std::string message;  // "cuFile unavailable (...): reading with pread into pinned buffers"
};

// A file whose length is not a multiple of record_bytes keeps its last, partial record as an index:
// reading it is DATA_LOSS ("record 9 of FILE is truncated: 100 of 4096 bytes").
StatusOr<std::unique_ptr<Dataset>> open_record_file(const RecordFileOptions& options,
                                                    GdsProbe* gds = nullptr);

// Probes cuFile (dlopen libcufile.so.0/libcufile.so, GPUOPT_DISABLE_CUFILE=1 refuses) and opens its
// driver. Never fails: the reason for a fallback is in the message.
GdsProbe probe_gds();

// ---- a folder of JPEG images
// ---------------------------------------------------------------------
struct JpegFolderOptions {
  std::string folder;  // every *.jpg / *.jpeg (case-insensitive), sorted by name
  int height = 224;    // every sample is resized (bilinear) to height x width x 3, RGB8
  int width = 224;
  bool warnings_are_errors = true;  // libjpeg-turbo warns on a truncated file ("premature end")
};

StatusOr<std::unique_ptr<Dataset>> open_jpeg_folder(const JpegFolderOptions& options);

// ---- synthetic
// -----------------------------------------------------------------------------------
enum class CostDistribution {
  kConstant,       // every sample costs median_us
  kLognormal,      // median_us * exp(sigma * N(0,1)), a heavy right tail
  kPeriodicStall,  // median_us, except every stall_every-th sample costs stall_us
};

enum class CostMode {
  kBusyWait,  // burns real CPU time (models decode/augment work)
  kSleep,     // sleeps (models waiting on storage); no CPU used
};

struct SyntheticOptions {
  std::size_t samples = 1024;
  std::size_t sample_bytes = 4096;
  CostDistribution distribution = CostDistribution::kConstant;
  CostMode mode = CostMode::kSleep;
  double median_us = 100;
  double sigma = 1.0;             // lognormal only
  std::size_t stall_every = 256;  // periodic only
  double stall_us = 20000;        // periodic only
  std::uint64_t seed = 1;         // costs are a pure function of (seed, index): reproducible
  // Fault injection for tests: these indices fail with DATA_LOSS / throw std::runtime_error.
  std::set<std::size_t> corrupt_indices;
  std::set<std::size_t> throwing_indices;
};

// Sample i is filled with 64-bit words (i << 32 | word_index), so tests can check placement.
std::unique_ptr<Dataset> make_synthetic(const SyntheticOptions& options);
// Cost of sample `index` in microseconds under `options` (the same value read() spends).
double synthetic_cost_us(const SyntheticOptions& options, std::size_t index);
// The word read() writes at `word` of sample `index`.
inline std::uint64_t synthetic_word(std::size_t index, std::size_t word) {
  return (static_cast<std::uint64_t>(index) << 32) | static_cast<std::uint32_t>(word);
}

}  // namespace gpuopt::data
