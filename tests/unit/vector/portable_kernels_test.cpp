// The vector store's CPU kernels that have an x86 path and a portable one (GPUOPT_X86_SIMD): the
// dot-product tiles against a double-precision dot product with a bound on float rounding, and
// CRC32C against a bit-at-a-time CRC and the standard check value. Both paths run on x86-64; the
// `portable` preset builds without the x86 one, so there dot_tile and crc32c are the portable ones.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpuopt/version.hpp"
#include "vector/search_kernels.hpp"
#include "vector/segment.hpp"

namespace gpuopt::vector::detail {
namespace {

using DotTileFunction = void (*)(const float*, std::size_t, const float*, std::size_t, std::size_t,
                                 float*);

std::vector<float> random_floats(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> out(count);
  for (float& x : out) x = value(rng);
  return out;
}

// Checks every dot of a [queries x rows] tile against the dot in double precision. A float sum of
// n products is within n * FLT_EPSILON * sum|a_i b_i| of the exact value (the recursive summation
// bound, with room for the multiply's rounding), whatever order or width the tile sums in.
void expect_tile_matches_reference(DotTileFunction tile, const char* name, std::size_t query_count,
                                   std::size_t row_count, std::size_t dim, std::mt19937& rng) {
  std::vector<float> queries = random_floats(query_count * dim, rng);
  std::vector<float> rows = random_floats(row_count * dim, rng);
  std::vector<float> dots(query_count * row_count, std::numeric_limits<float>::quiet_NaN());
  tile(queries.data(), query_count, rows.data(), row_count, dim, dots.data());
  for (std::size_t i = 0; i < query_count; ++i) {
    for (std::size_t j = 0; j < row_count; ++j) {
      double exact = 0, magnitude = 0;
      for (std::size_t t = 0; t < dim; ++t) {
        double product = double(queries[i * dim + t]) * double(rows[j * dim + t]);
        exact += product;
        magnitude += std::fabs(product);
      }
      double bound = double(dim + 1) * FLT_EPSILON * magnitude + 1e-30;
      float got = dots[i * row_count + j];
      ASSERT_LE(std::fabs(double(got) - exact), bound)
          << name << ": query " << i << ", row " << j << " of a " << query_count << " x "
          << row_count << " tile, dim " << dim << ": got " << got << ", exact " << exact;
    }
  }
}

// Query and row counts on both sides of the 4-query x 2-row tile, and dims on both sides of each
// vector width (4, 8, 16) so the remainder loops run too.
TEST(PortableKernels, DotTilesMatchDoublePrecisionDots) {
  std::mt19937 rng(20261203);
  const std::size_t query_counts[] = {1, 2, 3, 4, 5, 8, 9};
  const std::size_t row_counts[] = {1, 2, 3, 7, 130};
  const std::size_t dims[] = {1, 3, 4, 5, 8, 15, 16, 17, 33, 64, 100, 257, 784};
  const std::pair<DotTileFunction, const char*> tiles[] = {{dot_tile_portable, "dot_tile_portable"},
                                                           {dot_tile, "dot_tile"}};
  for (const auto& [tile, name] : tiles) {
    for (std::size_t queries : query_counts) {
      for (std::size_t rows : row_counts) {
        for (std::size_t dim : dims) {
          expect_tile_matches_reference(tile, name, queries, rows, dim, rng);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The distances the search ranks by, from the portable tile and the dispatched one, against
// direct_distance (the double-precision oracle the store's tests use), on the same inputs.
TEST(PortableKernels, DistancesAgreeWithTheDirectReference) {
  std::mt19937 rng(7);
  const std::size_t dim = 96, count = 64;
  std::vector<float> a = random_floats(count * dim, rng);
  std::vector<float> b = random_floats(count * dim, rng);
  std::vector<float> a_norms(count), b_norms(count);
  squared_norms(a.data(), count, dim, a_norms.data());
  squared_norms(b.data(), count, dim, b_norms.data());
  for (DotTileFunction tile : {DotTileFunction{dot_tile_portable}, DotTileFunction{dot_tile}}) {
    std::vector<float> dots(count * count);
    tile(a.data(), count, b.data(), count, dim, dots.data());
    for (Metric metric : {Metric::kL2, Metric::kInnerProduct, Metric::kCosine}) {
      for (std::size_t i = 0; i < count; ++i) {
        for (std::size_t j = 0; j < count; ++j) {
          float got = distance_from_dot(metric, dots[i * count + j], a_norms[i], b_norms[j]);
          float expected = direct_distance(metric, &a[i * dim], &b[j * dim], dim);
          // Inputs in [-1, 1]: norms and |dot| are at most dim, so a few dim * eps covers them.
          double tolerance = metric == Metric::kCosine ? 1e-4 : 8.0 * dim * dim * FLT_EPSILON;
          ASSERT_NEAR(got, expected, tolerance)
              << "metric " << static_cast<int>(metric) << ", pair " << i << "," << j;
        }
      }
    }
  }
}

TEST(PortableKernels, DotTileRunsThePortableTileWithoutX86Simd) {
  std::string isa = dot_tile_isa();
  if (!build_info::kX86Simd) {
    EXPECT_EQ(isa, "portable");
  } else {
    EXPECT_TRUE(isa == "avx512" || isa == "avx2" || isa == "portable") << isa;
  }
}

// CRC32C one bit at a time from the definition (reflected polynomial 0x82F63B78), sharing nothing
// with the table or the SSE4.2 instruction.
std::uint32_t crc32c_bitwise(const unsigned char* data, std::size_t bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < bytes; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(PortableKernels, Crc32cGivesTheStandardCheckValue) {
  // The CRC-32C check value: the CRC of the ASCII digits "123456789" (RFC 3720, B.4 test data).
  const char digits[] = "123456789";
  EXPECT_EQ(crc32c_portable(0, digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(0, digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(0, digits, 0), 0u);
  EXPECT_EQ(crc32c(0, digits, 0), 0u);
}

TEST(PortableKernels, Crc32cMatchesBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(42);
  std::vector<unsigned char> buffer(4096 + 64);
  for (auto& byte : buffer) byte = static_cast<unsigned char>(rng());
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 40; ++n) lengths.push_back(n);
  for (std::size_t n : {63, 64, 65, 1000, 4095, 4096, 4097}) lengths.push_back(n);
  for (std::size_t offset = 0; offset < 8; ++offset) {
    for (std::size_t length : lengths) {
      const unsigned char* p = buffer.data() + offset;
      std::uint32_t expected = crc32c_bitwise(p, length);
      ASSERT_EQ(crc32c_portable(0, p, length), expected)
          << "offset " << offset << " length " << length;
      ASSERT_EQ(crc32c(0, p, length), expected)
          << crc32c_isa() << ": offset " << offset << " length " << length;
    }
  }
}

TEST(PortableKernels, Crc32cContinuesAcrossPieces) {
  std::mt19937 rng(3);
  std::vector<unsigned char> data(1000);
  for (auto& byte : data) byte = static_cast<unsigned char>(rng());
  std::uint32_t whole = crc32c_bitwise(data.data(), data.size());
  for (std::size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    std::uint32_t portable = crc32c_portable(0, data.data(), split);
    portable = crc32c_portable(portable, data.data() + split, data.size() - split);
    EXPECT_EQ(portable, whole) << "split at " << split;
    // The two implementations continue each other's CRC: a segment written on one machine
    // verifies on another.
    std::uint32_t mixed = crc32c(0, data.data(), split);
    mixed = crc32c_portable(mixed, data.data() + split, data.size() - split);
    EXPECT_EQ(mixed, whole) << "split at " << split;
  }
}

TEST(PortableKernels, Crc32cRunsThePortableCodeWithoutX86Simd) {
  std::string isa = crc32c_isa();
  if (!build_info::kX86Simd) {
    EXPECT_EQ(isa, "portable");
  } else {
    EXPECT_TRUE(isa == "sse4.2" || isa == "portable") << isa;
  }
}

}  // namespace
}  // namespace gpuopt::vector::detail
