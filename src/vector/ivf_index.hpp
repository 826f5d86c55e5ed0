// The persistent IVF-Flat index file: k-means centroids, each list's row positions and ids, the
// row count it covers and its drift statistics, with a versioned header and CRC32C checksums. The
// list vectors are not stored: they are the segments' rows, gathered by position at load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::vector::detail {

inline constexpr char kIvfMagic[8] = {'G', 'P', 'U', 'O', 'V', 'I', 'V', 'F'};
inline constexpr std::uint32_t kIvfVersion = 1;

// Where k-means ran (recorded in the file, reported by info).
enum class IvfTrainEngine : std::uint32_t { kCpu = 0, kGpu = 1 };

struct IvfFileContents {
  std::size_t dim = 0;
  Metric metric = Metric::kL2;
  std::size_t nlist = 0;
  std::uint64_t generation = 0;    // bumped by every save
  std::uint64_t trained_rows = 0;  // rows in the collection when k-means ran
  std::uint64_t covered_rows = 0;  // positions [0, covered_rows) are in the lists
  IvfTrainEngine engine = IvfTrainEngine::kCpu;
  std::uint32_t iterations = 0;
  double train_seconds = 0;
  // Drift: mean squared L2 distance of the trained rows to their centroid, and the sum of the same
  // over the rows assigned after training (positions [trained_rows, covered_rows)).
  double trained_mean_distance = 0;
  double added_distance_sum = 0;
  std::vector<float> centroids;             // [nlist, dim]
  std::vector<std::uint64_t> list_offsets;  // [nlist + 1] into positions/ids
  std::vector<std::uint64_t> positions;     // [covered_rows] grouped by list
  std::vector<std::uint64_t> ids;           // [covered_rows] the ids at those positions
};

// What the catalogue records about a published index file; read_ivf_file checks against it.
struct IvfFileInfo {
  std::string file;  // name inside the store's segments/ directory
  std::uint64_t generation = 0;
  std::uint64_t bytes = 0;
  std::uint32_t data_crc = 0;
};

// Writes `path`.tmp, fsyncs it, renames it to `path` and fsyncs the directory: a crash leaves
// either no file at `path` or the whole file. The caller then names it in the catalogue.
StatusOr<IvfFileInfo> write_ivf_file(const std::filesystem::path& path,
                                     const IvfFileContents& contents);

// Reads and checks the file: size, magic, version, header and data CRC32C, agreement with the
// catalogue (`expected`), the collection's dimension and metric, and the lists' structure (every
// position in [0, covered_rows) exactly once). Any failure is DATA_LOSS naming the file.
StatusOr<IvfFileContents> read_ivf_file(const std::filesystem::path& path,
                                        const IvfFileInfo& expected, std::size_t dim,
                                        Metric metric);

}  // namespace gpuopt::vector::detail
