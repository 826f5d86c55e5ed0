// Readers for the vector file formats the CLI imports and queries: fvecs / bvecs / ivecs
// (ann-benchmarks/TEXMEX), NumPy .npy (2-D, float32/float16/float64/uint8/int8, C order) and IDX
// (MNIST/Fashion-MNIST), each optionally gzip'd. VectorReader streams rows in chunks so a file of
// any size is read in bounded memory; read_vector_file() loads a whole file through it. Headers and
// sizes are checked before any row is read, and every error names the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::vector {

struct VectorFile {
  std::size_t rows = 0;
  std::size_t dim = 0;
  std::vector<float> values;  // [rows, dim] row-major
  std::string format;         // "fvecs", "bvecs", "ivecs", "npy", "idx"
};

enum class VectorFormat { kDetect, kFvecs, kBvecs, kIvecs, kNpy, kIdx };

struct VectorReaderOptions {
  // Picks the format; kDetect uses the extension (.fvecs, .bvecs, .ivecs, .npy, .idx*, *-ubyte,
  // each optionally .gz) and then the first bytes.
  VectorFormat format = VectorFormat::kDetect;
  // Tells the kernel to drop the input's pages from the page cache once they are read
  // (posix_fadvise DONTNEED), so importing a file larger than memory does not evict everything
  // else. Plain (not gzip'd) files only.
  bool drop_cache_behind = false;
  // Bytes of raw input converted per step (a whole row at least): bounds the reader's own memory.
  std::size_t staging_bytes = std::size_t{4} << 20;
};

// Streams a vector file as fp32 rows. open() reads and checks the header: the dimension must be
// 1..65536, the declared shape must fit the file (plain files: the size is checked up front, so
// a truncated file fails before the first row; gzip'd ones fail at the row where the data ends),
// and nothing is allocated from a declared size. read() converts each element to fp32 and
// rejects non-finite values and (fvecs family) records whose dimension differs from the first.
class VectorReader {
 public:
  ~VectorReader();
  VectorReader(const VectorReader&) = delete;
  VectorReader& operator=(const VectorReader&) = delete;

  // Only a regular file is opened: a FIFO or device named as input fails at once.
  static StatusOr<std::unique_ptr<VectorReader>> open(const std::filesystem::path& path,
                                                      const VectorReaderOptions& options = {});
  // Over bytes already in memory (gzip already undone), which must outlive the reader; `name` is
  // used in messages. kDetect looks at the name's extension, then at the bytes.
  static StatusOr<std::unique_ptr<VectorReader>> open_bytes(
      std::span<const std::uint8_t> bytes, const std::string& name,
      const VectorReaderOptions& options = {});

  const std::string& name() const;
  std::size_t dim() const;
  // Rows in the file when the header or the file size says (absent for a gzip'd fvecs family
  // file, whose length is known only at its end).
  std::optional<std::size_t> rows() const;
  std::string_view format() const;        // "fvecs", "bvecs", "ivecs", "npy", "idx"
  std::string_view element_type() const;  // "float32", "float16", "float64", "uint8", ...
  std::size_t rows_read() const;
  // Input bytes consumed so far (compressed bytes for a gzip'd file) and the input's size.
  std::uint64_t bytes_read() const;
  std::uint64_t bytes_total() const;

  // Reads the next min(max_rows, rows left) rows into `out` ([max_rows, dim] fp32 row-major);
  // returns how many, 0 at the end of the file. After an error the reader stays failed.
  StatusOr<std::size_t> read(float* out, std::size_t max_rows);

 private:
  struct State;
  explicit VectorReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Reads up to `max_rows` rows (0 = all) of a file into memory: the rows' fp32 values and nothing
// else (no copy of the raw file).
StatusOr<VectorFile> read_vector_file(const std::filesystem::path& path,
                                      std::size_t max_rows = 0 /* 0 = all */);

// Parsers over bytes already in memory (gzip already undone); `name` is used in messages.
StatusOr<VectorFile> parse_fvecs(std::span<const std::uint8_t> bytes, const std::string& name,
                                 std::size_t max_rows = 0);
StatusOr<VectorFile> parse_npy(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows = 0);
StatusOr<VectorFile> parse_idx(std::span<const std::uint8_t> bytes, const std::string& name,
                               std::size_t max_rows = 0);

// Metadata for an import: a JSON Lines file holding one flat JSON object per row, in row order
// (`{}` for a row without metadata). Lines are read one at a time; a line longer than
// `max_line_bytes` or one that is not a flat object is an error naming the file and line number.
class MetadataLineReader {
 public:
  ~MetadataLineReader();
  MetadataLineReader(const MetadataLineReader&) = delete;
  MetadataLineReader& operator=(const MetadataLineReader&) = delete;

  static StatusOr<std::unique_ptr<MetadataLineReader>> open(const std::filesystem::path& path,
                                                            std::size_t max_line_bytes = 1 << 20);
  // Appends the next min(count, lines left) rows' metadata to `out`; returns how many.
  StatusOr<std::size_t> read(std::size_t count, std::vector<Metadata>* out);
  // Lines read so far (the number of the last line read, counting from 1).
  std::size_t lines_read() const;

 private:
  struct State;
  explicit MetadataLineReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Reads every line of a metadata file once, checking each: returns the number of rows it holds.
StatusOr<std::size_t> count_metadata_lines(const std::filesystem::path& path,
                                           std::size_t max_line_bytes = 1 << 20);

// Writers used by tests and benchmarks.
Status write_fvecs(const std::filesystem::path& path, const float* values, std::size_t rows,
                   std::size_t dim);
Status write_npy(const std::filesystem::path& path, const float* values, std::size_t rows,
                 std::size_t dim);

}  // namespace gpuopt::vector
