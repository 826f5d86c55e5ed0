// Datasets for the prefetch loader: index → fixed-size sample bytes, from a record file, a folder
// of JPEGs (decoded and resized by libjpeg-turbo) or a synthetic source with a chosen cost profile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::data {

class DeviceReader;

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
  // A path that reads samples straight into device memory (cuFile), or nullptr. The loader uses
  // it in GPU mode instead of staging through pinned host memory; it lives as long as the dataset.
  virtual DeviceReader* device_reader() { return nullptr; }
};

// Reads samples into device memory without a host copy in the caller (GPUDirect Storage, or
// cuFile's compatibility mode, which stages inside cuFile). Thread-safe like Dataset::read. The
// calling thread must have the buffer's CUDA device current.
class DeviceReader {
 public:
  virtual ~DeviceReader() = default;
  // Registers a device buffer (a cudaMalloc'd batch) with cuFile once, before reads into it. A
  // failure is not fatal: reads into an unregistered buffer bounce through cuFile's own buffers.
  virtual Status register_buffer(void* device, std::size_t bytes) = 0;
  virtual void deregister_buffer(void* device) = 0;
  // Writes sample `index` at device_base + offset; DATA_LOSS naming the index and file on a
  // truncated record or a failed read.
  virtual Status read(std::size_t index, void* device_base, std::size_t offset) = 0;
  // "cuFile (compat mode: ...), O_DIRECT"
  virtual std::string describe() const = 0;
};

// ---- fixed-size records in one file -------------------------------------------------------------
enum class RecordIo {
  kAuto,    // cuFile when its library loads, its driver opens and the file registers; else pread
  kPread,   // pread into host (pinned staging) buffers, then a host→device copy
  kCufile,  // insist on cuFile; UNAVAILABLE naming the reason when it cannot be used
};

// "auto", "pread", "cufile"; parse_record_io names the bad text.
const char* record_io_name(RecordIo io);
StatusOr<RecordIo> parse_record_io(const std::string& text);

struct RecordFileOptions {
  std::string path;
  std::size_t record_bytes = 0;
  RecordIo io = RecordIo::kAuto;
  // Also open the file with O_DIRECT (bypassing the page cache) when every record offset is a
  // multiple of 4096 and the file system allows it; pread uses it for 4096-aligned buffers.
  bool direct_io = true;
  // Library names tried in order; tests name a missing one to exercise the fallback.
  std::vector<std::string> cufile_libraries = {"libcufile.so.0", "libcufile.so"};
};

// What the record-file source decided about its I/O path, and why.
struct GdsProbe {
  bool usable = false;      // device reads go through cuFile
  std::string io;           // "cufile" or "pread"
  std::string cufile_mode;  // "gds", "compat" or "unknown" when cuFile is used, else empty
  bool direct_io = false;   // an O_DIRECT descriptor is open
  std::string message;      // e.g. "cuFile: libcufile.so.0 not found (...); reading with pread"
};

// A file whose length is not a multiple of record_bytes keeps its last, partial record as an index:
// reading it is DATA_LOSS ("record 9 of FILE is truncated: 100 of 4096 bytes").
StatusOr<std::unique_ptr<Dataset>> open_record_file(const RecordFileOptions& options,
                                                    GdsProbe* gds = nullptr);

// Probes cuFile (dlopen of `libraries`, GPUOPT_DISABLE_CUFILE=1 refuses) and opens its driver,
// without a file. Never fails: the reason for a fallback is in the message.
GdsProbe probe_gds(const std::vector<std::string>& libraries = {"libcufile.so.0", "libcufile.so"});

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
