// The streaming vector file readers against hand-written files: every format and element type,
// chunked reads equal to whole reads, and truncated or hostile headers refused with a message that
// names the file; plus the JSON Lines metadata reader used by imports.
#include "gpuopt/vector/vector_file.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/vector_fixtures.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;
using Bytes = std::vector<std::uint8_t>;

void append(Bytes& bytes, const void* data, std::size_t size) {
  const std::size_t at = bytes.size();
  bytes.resize(at + size);
  if (size != 0) std::memcpy(bytes.data() + at, data, size);
}
template <typename T>
void append_value(Bytes& bytes, T value) {
  append(bytes, &value, sizeof(value));
}

// A TEXMEX record file: each row is an int32 dimension and then its elements.
template <typename T>
Bytes vecs(const std::vector<std::vector<T>>& rows) {
  Bytes bytes;
  for (const auto& row : rows) {
    append_value<std::int32_t>(bytes, static_cast<std::int32_t>(row.size()));
    append(bytes, row.data(), row.size() * sizeof(T));
  }
  return bytes;
}

// A .npy file with the given header dict text and raw data (format version 1 or 2).
Bytes npy(const std::string& dict, const Bytes& data, int version = 1) {
  std::string header = dict;
  const std::size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(version), 0};
  if (version == 1) {
    append_value<std::uint16_t>(bytes, static_cast<std::uint16_t>(header.size()));
  } else {
    append_value<std::uint32_t>(bytes, static_cast<std::uint32_t>(header.size()));
  }
  append(bytes, header.data(), header.size());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::string npy_dict(const std::string& descr, std::size_t rows, std::size_t dim) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(rows) +
         ", " + std::to_string(dim) + "), }";
}

template <typename T>
Bytes raw(const std::vector<T>& values) {
  Bytes bytes;
  append(bytes, values.data(), values.size() * sizeof(T));
  return bytes;
}

fs::path write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<long>(bytes.size()));
  return path;
}

fs::path write_gzip(const fs::path& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr);
  EXPECT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(file);
  return path;
}

bool mentions(const Status& status, const std::string& words) {
  return status.message().find(words) != std::string::npos;
}

// Reads everything through the streaming interface, `chunk` rows per call.
StatusOr<std::vector<float>> read_chunked(VectorReader& reader, std::size_t chunk) {
  std::vector<float> all;
  std::vector<float> buffer(chunk * reader.dim());
  while (true) {
    GPUOPT_ASSIGN_OR_RETURN(std::size_t rows, reader.read(buffer.data(), chunk));
    if (rows == 0) return all;
    all.insert(all.end(), buffer.begin(), buffer.begin() + rows * reader.dim());
  }
}

TEST(VectorFile, FvecsRowsComeBackInChunks) {
  TempDir dir("gpuopt-vector-file");
  const std::vector<std::vector<float>> rows = {{1.5f, -2}, {0.25f, 3}, {-7, 1e-3f}};
  auto path = write_file(dir.path() / "x.fvecs", vecs(rows));
  // One row per conversion step, two rows per call: the loops inside read() all run.
  auto reader = VectorReader::open(path, {.staging_bytes = 1});
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  EXPECT_EQ((*reader)->format(), "fvecs");
  EXPECT_EQ((*reader)->element_type(), "float32");
  EXPECT_EQ((*reader)->dim(), 2u);
  ASSERT_TRUE((*reader)->rows().has_value());
  EXPECT_EQ(*(*reader)->rows(), 3u);
  auto values = read_chunked(**reader, 2);
  ASSERT_TRUE(values.ok()) << values.status().to_string();
  EXPECT_EQ(*values, (std::vector<float>{1.5f, -2, 0.25f, 3, -7, 1e-3f}));
  EXPECT_EQ((*reader)->rows_read(), 3u);
  EXPECT_EQ((*reader)->bytes_read(), (*reader)->bytes_total());
}

TEST(VectorFile, BvecsAndIvecsBecomeFloats) {
  TempDir dir("gpuopt-vector-file");
  auto bvecs = read_vector_file(
      write_file(dir.path() / "x.bvecs", vecs<std::uint8_t>({{0, 255, 7}, {128, 1, 2}})));
  ASSERT_TRUE(bvecs.ok()) << bvecs.status().to_string();
  EXPECT_EQ(bvecs->format, "bvecs");
  EXPECT_EQ(bvecs->rows, 2u);
  EXPECT_EQ(bvecs->values, (std::vector<float>{0, 255, 7, 128, 1, 2}));
  auto ivecs = read_vector_file(
      write_file(dir.path() / "x.ivecs", vecs<std::int32_t>({{-5, 100000}, {0, 16777216}})));
  ASSERT_TRUE(ivecs.ok()) << ivecs.status().to_string();
  EXPECT_EQ(ivecs->format, "ivecs");
  EXPECT_EQ(ivecs->values, (std::vector<float>{-5, 100000, 0, 16777216}));
}

TEST(VectorFile, FvecsWithAnotherDimensionInARowIsRefused) {
  TempDir dir("gpuopt-vector-file");
  Bytes bytes = vecs<float>({{1, 2}, {3, 4}, {5, 6}});
  const std::int32_t three = 3;
  std::memcpy(bytes.data() + 2 * 12, &three, 4);  // record 2 claims dimension 3
  auto path = write_file(dir.path() / "mixed.fvecs", bytes);
  auto reader = VectorReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();  // sizes still agree
  std::vector<float> out(6);
  auto read = (*reader)->read(out.data(), 3);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(mentions(read.status(), "mixed.fvecs: record 2 has dimension 3, the first has 2"))
      << read.status().to_string();
  // The reader stays failed.
  EXPECT_FALSE((*reader)->read(out.data(), 3).ok());
}

TEST(VectorFile, TruncatedAndHostileFvecsHeadersAreRefusedAtOpen) {
  TempDir dir("gpuopt-vector-file");
  Bytes bytes = vecs<float>({{1, 2, 3}, {4, 5, 6}});
  bytes.resize(bytes.size() - 1);
  auto truncated = VectorReader::open(write_file(dir.path() / "cut.fvecs", bytes));
  ASSERT_FALSE(truncated.ok());
  EXPECT_TRUE(mentions(truncated.status(), "cut.fvecs: 31 bytes is not a whole number of 16-byte"))
      << truncated.status().to_string();
  for (std::int32_t dim : {0, -4, 65537, std::numeric_limits<std::int32_t>::max()}) {
    Bytes hostile;
    append_value(hostile, dim);
    append_value(hostile, 1.0f);
    auto opened = VectorReader::open(write_file(dir.path() / "dim.fvecs", hostile));
    ASSERT_FALSE(opened.ok()) << dim;
    EXPECT_TRUE(mentions(opened.status(), "dim.fvecs: fvecs dimension " + std::to_string(dim)))
        << opened.status().to_string();
  }
  auto empty = VectorReader::open(write_file(dir.path() / "empty.bvecs", {}));
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(mentions(empty.status(), "empty.bvecs: bvecs file is empty"));
}

TEST(VectorFile, NpyFloat32VersionOneAndTwo) {
  const std::vector<float> values = {1, -2, 3.5f, 4, 5, 6};
  for (int version : {1, 2}) {
    auto file = parse_npy(npy(npy_dict("<f4", 3, 2), raw(values), version), "v.npy");
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_EQ(file->rows, 3u);
    EXPECT_EQ(file->dim, 2u);
    EXPECT_EQ(file->values, values);
  }
  // max_rows keeps the first rows only.
  auto first = parse_npy(npy(npy_dict("<f4", 3, 2), raw(values)), "v.npy", 2);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->values, (std::vector<float>{1, -2, 3.5f, 4}));
}

TEST(VectorFile, NpyFloat16IsConvertedExactly) {
  // binary16 bit patterns and their values, worked out by hand from sign/exponent/mantissa.
  const std::vector<std::uint16_t> halves = {
      0x3C00,  // 1
      0xC000,  // -2
      0x3555,  // 2^-2 * (1 + 341/1024) = 0.333251953125
      0x7BFF,  // largest normal: 2^15 * (1 + 1023/1024) = 65504
      0x0001,  // smallest subnormal: 2^-24
      0x03FF,  // largest subnormal: 1023 * 2^-24
      0x0400,  // smallest normal: 2^-14
      0x8000,  // -0
  };
  const std::vector<float> expected = {
      1, -2, 0.333251953125f, 65504, 0x1p-24f, 1023 * 0x1p-24f, 0x1p-14f, -0.0f};
  const auto bytes = npy(npy_dict("<f2", 2, 4), raw(halves));  // outlives the reader, as it must
  auto reader = VectorReader::open_bytes(bytes, "h.npy");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  EXPECT_EQ((*reader)->element_type(), "float16");
  auto values = read_chunked(**reader, 1);
  ASSERT_TRUE(values.ok()) << values.status().to_string();
  ASSERT_EQ(values->size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ((*values)[i], expected[i]) << "element " << i;
    EXPECT_EQ(std::signbit((*values)[i]), std::signbit(expected[i])) << "element " << i;
  }
}

TEST(VectorFile, NonFiniteValuesAreRefusedWithTheirPosition) {
  // fp16 +inf (0x7C00) in row 1, element 0.
  auto half = parse_npy(npy(npy_dict("<f2", 2, 2), raw<std::uint16_t>({0x3C00, 0x3C00, 0x7C00, 0})),
                        "inf.npy");
  ASSERT_FALSE(half.ok());
  EXPECT_TRUE(mentions(half.status(), "inf.npy: vector 1 has a non-finite value at index 0"))
      << half.status().to_string();
  auto nan = parse_fvecs(vecs<float>({{1, 2}, {3, std::nanf("")}}), "nan.fvecs");
  ASSERT_FALSE(nan.ok());
  EXPECT_TRUE(mentions(nan.status(), "nan.fvecs: vector 1 has a non-finite value at index 1"));
}

TEST(VectorFile, NpyFloat64Uint8AndInt8) {
  auto f64 = parse_npy(npy(npy_dict("<f8", 1, 3), raw<double>({0.5, -1e10, 3})), "d.npy");
  ASSERT_TRUE(f64.ok()) << f64.status().to_string();
  EXPECT_EQ(f64->values, (std::vector<float>{0.5f, -1e10f, 3}));
  auto u8 = parse_npy(npy(npy_dict("|u1", 2, 2), Bytes{0, 255, 9, 10}), "u.npy");
  ASSERT_TRUE(u8.ok()) << u8.status().to_string();
  EXPECT_EQ(u8->values, (std::vector<float>{0, 255, 9, 10}));
  auto i8 = parse_npy(npy(npy_dict("|i1", 1, 2), Bytes{0xFF, 0x80}), "i.npy");
  ASSERT_TRUE(i8.ok()) << i8.status().to_string();
  EXPECT_EQ(i8->values, (std::vector<float>{-1, -128}));
}

TEST(VectorFile, NpyLayoutsAndDtypesItCannotReadAreNamed) {
  const Bytes data(64, 0);
  auto fortran =
      parse_npy(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", data), "f.npy");
  ASSERT_FALSE(fortran.ok());
  EXPECT_TRUE(mentions(fortran.status(), "f.npy: .npy array has fortran_order True"))
      << fortran.status().to_string();
  for (const char* descr : {">f4", "<i8", "<c8", "<f16"}) {
    auto parsed = parse_npy(npy(npy_dict(descr, 2, 2), data), "t.npy");
    ASSERT_FALSE(parsed.ok()) << descr;
    EXPECT_TRUE(mentions(parsed.status(), std::string("t.npy: .npy dtype '") + descr + "'"))
        << parsed.status().to_string();
  }
  for (const char* shape : {"(4,)", "(2, 2, 1)", "()", "(2, x)"}) {
    auto parsed = parse_npy(
        npy(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + shape + ", }",
            data),
        "s.npy");
    ASSERT_FALSE(parsed.ok()) << shape;
    EXPECT_TRUE(mentions(parsed.status(), std::string("s.npy: .npy shape ") + shape))
        << parsed.status().to_string();
  }
}

TEST(VectorFile, HostileNpyHeadersFailBeforeAnyAllocation) {
  // A declared 10^12 x 128 array over 16 bytes of data: refused by size, nothing allocated.
  auto huge = parse_npy(npy(npy_dict("<f4", 1000000000000, 128), Bytes(16, 0)), "big.npy");
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(mentions(huge.status(), "big.npy: .npy shape (1000000000000, 128) is out of range"))
      << huge.status().to_string();
  auto many = parse_npy(npy(npy_dict("<f4", 1000000, 128), Bytes(16, 0)), "many.npy");
  ASSERT_FALSE(many.ok());
  EXPECT_TRUE(mentions(many.status(), "many.npy: .npy data is 16 bytes"))
      << many.status().to_string();
  EXPECT_TRUE(mentions(many.status(), "truncated"));
  auto overflow = parse_npy(
      npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 4), }",
          Bytes(16, 0)),
      "o.npy");
  ASSERT_FALSE(overflow.ok());
  EXPECT_TRUE(mentions(overflow.status(), "o.npy: .npy shape")) << overflow.status().to_string();
  // Header length past the end of the file.
  Bytes header_past = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0xFF, 0xFF, '{'};
  auto past = parse_npy(header_past, "h.npy");
  ASSERT_FALSE(past.ok());
  EXPECT_TRUE(mentions(past.status(), "h.npy: .npy header (65535 bytes) runs past the end"));
  Bytes bad_magic = {0x93, 'N', 'U', 'M', 'P', 'X', 1, 0, 0, 0};
  EXPECT_TRUE(mentions(parse_npy(bad_magic, "m.npy").status(), "m.npy: not a .npy file"));
  Bytes version9 = {0x93, 'N', 'U', 'M', 'P', 'Y', 9, 0, 0, 0};
  EXPECT_TRUE(mentions(parse_npy(version9, "v.npy").status(), "format version 9"));
}

TEST(VectorFile, GzipFilesStreamWithoutAKnownLength) {
  TempDir dir("gpuopt-vector-file");
  auto values = random_vectors(1000, 17, 3);
  std::vector<std::vector<float>> rows;
  for (std::size_t r = 0; r < 1000; ++r) {
    rows.emplace_back(values.begin() + r * 17, values.begin() + (r + 1) * 17);
  }
  auto path = write_gzip(dir.path() / "x.fvecs.gz", vecs(rows));
  auto reader = VectorReader::open(path, {.staging_bytes = 1000});
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  EXPECT_FALSE((*reader)->rows().has_value());  // only the end of the stream says
  auto read = read_chunked(**reader, 64);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(*read, values);
  auto whole = read_vector_file(path, 10);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->rows, 10u);
  EXPECT_EQ(whole->values, std::vector<float>(values.begin(), values.begin() + 170));

  // A gzip'd npy that ends early fails at the row where the data stops.
  auto cut = write_gzip(dir.path() / "cut.npy.gz",
                        npy(npy_dict("<f4", 4, 2), raw<float>({1, 2, 3, 4, 5})));
  auto cut_reader = VectorReader::open(cut);
  ASSERT_TRUE(cut_reader.ok()) << cut_reader.status().to_string();
  std::vector<float> out(8);
  auto short_read = (*cut_reader)->read(out.data(), 4);
  ASSERT_FALSE(short_read.ok());
  EXPECT_TRUE(mentions(short_read.status(),
                       "cut.npy.gz: truncated: the header declares 4 rows, the data ends inside "
                       "row 2"))
      << short_read.status().to_string();
}

TEST(VectorFile, ChunkedReadsEqualWholeReadsForEveryWriter) {
  TempDir dir("gpuopt-vector-file");
  auto values = random_vectors(1000, 33, 11);
  ASSERT_TRUE(write_npy(dir.path() / "x.npy", values.data(), 1000, 33).ok());
  ASSERT_TRUE(write_fvecs(dir.path() / "x.fvecs", values.data(), 1000, 33).ok());
  for (const char* name : {"x.npy", "x.fvecs"}) {
    for (std::size_t chunk : {1, 7, 999, 1000, 5000}) {
      auto reader =
          VectorReader::open(dir.path() / name, {.drop_cache_behind = true, .staging_bytes = 4096});
      ASSERT_TRUE(reader.ok()) << reader.status().to_string();
      auto read = read_chunked(**reader, chunk);
      ASSERT_TRUE(read.ok()) << read.status().to_string();
      EXPECT_EQ(*read, values) << name << " in chunks of " << chunk;
    }
  }
}

TEST(VectorFile, FormatComesFromTheExtensionOrTheFirstBytes) {
  TempDir dir("gpuopt-vector-file");
  auto npy_bytes = npy(npy_dict("<f4", 1, 2), raw<float>({1, 2}));
  auto sniffed = read_vector_file(write_file(dir.path() / "data.bin", npy_bytes));
  ASSERT_TRUE(sniffed.ok()) << sniffed.status().to_string();
  EXPECT_EQ(sniffed->format, "npy");
  // IDX: 2 items of 2x2 unsigned bytes.
  Bytes idx = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8};
  auto images = read_vector_file(write_file(dir.path() / "images-ubyte", idx));
  ASSERT_TRUE(images.ok()) << images.status().to_string();
  EXPECT_EQ(images->dim, 4u);
  EXPECT_EQ(images->values, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  idx.pop_back();
  auto short_idx = read_vector_file(write_file(dir.path() / "short-ubyte", idx));
  ASSERT_FALSE(short_idx.ok());
  EXPECT_TRUE(mentions(short_idx.status(), "short-ubyte: IDX data is 7 bytes"));
  auto unknown = read_vector_file(write_file(dir.path() / "notes.txt", Bytes{'h', 'i', '!', '\n'}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(mentions(unknown.status(), "notes.txt: unknown vector file format"));
}

fs::path write_text(const fs::path& path, const std::string& text) {
  return write_file(path, Bytes(text.begin(), text.end()));
}

TEST(MetadataLines, OneObjectPerLineInOrder) {
  TempDir dir("gpuopt-metadata");
  auto path = write_text(dir.path() / "m.jsonl",
                         "{\"genre\": \"jazz\", \"year\": 1990}\r\n{}\n{\"year\": 2001.5}");
  auto count = count_metadata_lines(path);
  ASSERT_TRUE(count.ok()) << count.status().to_string();
  EXPECT_EQ(*count, 3u);
  auto reader = MetadataLineReader::open(path, /*max_line_bytes=*/64);
  ASSERT_TRUE(reader.ok());
  std::vector<Metadata> out;
  auto first = (*reader)->read(2, &out);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(*first, 2u);
  auto rest = (*reader)->read(5, &out);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, 1u);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(std::get<std::string>(out[0].at("genre")), "jazz");
  EXPECT_EQ(std::get<double>(out[0].at("year")), 1990);
  EXPECT_TRUE(out[1].empty());
  EXPECT_EQ(std::get<double>(out[2].at("year")), 2001.5);
  EXPECT_EQ((*reader)->lines_read(), 3u);
}

TEST(MetadataLines, BadLinesAreNamedByNumber) {
  TempDir dir("gpuopt-metadata");
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{}\n{}\n{\"a\": \n", "m.jsonl: line 3: metadata: not valid JSON"},
      {"{}\n[1, 2]\n", "m.jsonl: line 2: metadata: expected a JSON object"},
      {"{\"a\": {\"b\": 1}}\n", "m.jsonl: line 1: "},
      {"{}\n\n{}\n", "m.jsonl: line 2 is empty"},
      {"{}\n{\"long\": \"" + std::string(100, 'x') + "\"}\n", "m.jsonl: line 2 is longer than 64"},
  };
  for (const auto& c : cases) {
    auto path = write_text(dir.path() / "m.jsonl", c.text);
    auto count = count_metadata_lines(path, 64);
    ASSERT_FALSE(count.ok()) << c.text;
    EXPECT_TRUE(mentions(count.status(), c.message)) << count.status().to_string();
  }
}

}  // namespace
}  // namespace gpuopt::vector
