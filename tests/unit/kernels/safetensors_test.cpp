// safetensors and .npy parsing: round trips, checkpoint layers, and malformed files with clear
// errors.
#include "gpuopt/kernels/safetensors.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace gpuopt::kernels {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<std::byte> with_header(const std::string& json, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + json.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((json.size() >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const std::vector<std::int32_t> words = {1, -2, 3, 0x7fffffff, 5, 6};
  const std::vector<std::uint16_t> halves = {0x3c00, 0xc000};
  const auto bytes =
      serialize_safetensors({{"a.qweight", TensorDtype::kI32, {2, 3}, as_bytes(words)},
                             {"a.scales", TensorDtype::kF16, {1, 2}, as_bytes(halves)}},
                            {{"format", "pt"}});
  auto file = SafetensorsFile::parse(bytes, "memory");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->names(), (std::vector<std::string>{"a.qweight", "a.scales"}));
  EXPECT_EQ(file->metadata().at("format"), "pt");
  auto tensor = file->tensor("a.qweight");
  ASSERT_TRUE(tensor.ok());
  EXPECT_EQ(tensor->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(*tensor_as_int32(*tensor), words);
  EXPECT_EQ(*tensor_as_float16(*file->tensor("a.scales")), halves);
  EXPECT_THAT(tensor_as_float16(*tensor).status().message(), HasSubstr("is I32, expected F16"));
  EXPECT_EQ(file->tensor("missing").status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  auto error = [](std::vector<std::byte> bytes) {
    auto file = SafetensorsFile::parse(std::move(bytes), "bad.safetensors");
    EXPECT_FALSE(file.ok());
    return file.status().message();
  };
  EXPECT_THAT(error({}), HasSubstr("too short"));
  auto huge = with_header("{}", 0);
  huge[5] = std::byte{1};
  EXPECT_THAT(error(huge), HasSubstr("header length"));
  EXPECT_THAT(error(with_header("{not json", 0)), HasSubstr("not a JSON object"));
  EXPECT_THAT(error(with_header(R"({"t":{"dtype":"F16","shape":[2]}})", 4)),
              HasSubstr("lacks dtype, shape or data_offsets"));
  EXPECT_THAT(error(with_header(R"({"t":{"dtype":"F7","shape":[2],"data_offsets":[0,4]}})", 4)),
              HasSubstr("unknown tensor dtype 'F7'"));
  EXPECT_THAT(error(with_header(R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 4)),
              HasSubstr("outside the 4 data bytes"));
  EXPECT_THAT(error(with_header(R"({"t":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}})", 4)),
              HasSubstr("need 6"));
  EXPECT_THAT(error(with_header(R"({"t":{"dtype":"F16","shape":[-1],"data_offsets":[0,4]}})", 4)),
              HasSubstr("negative"));
  EXPECT_THAT(error(with_header(R"({"t":{"dtype":"F16","shape":[2],"data_offsets":[4,0]}})", 4)),
              HasSubstr("data_offsets"));
  EXPECT_THAT(
      error(with_header(
          R"({"t":{"dtype":"F16","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})",
          4)),
      HasSubstr("overflows"));
}

TEST(Safetensors, FuzzedHeadersNeverCrash) {
  const auto good = serialize_safetensors(
      {{"w", TensorDtype::kF32, {2, 2}, std::vector<std::byte>(16, std::byte{1})}}, {});
  std::mt19937 random(11);
  for (int trial = 0; trial < 2000; ++trial) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(random() % 4);
    for (int f = 0; f < flips; ++f) {
      bytes[random() % bytes.size()] = static_cast<std::byte>(random() & 0xff);
    }
    if (trial % 3 == 0) bytes.resize(random() % bytes.size());
    auto file = SafetensorsFile::parse(std::move(bytes), "fuzz");
    if (file.ok()) {
      for (const auto& name : file->names()) {
        auto tensor = file->tensor(name);
        ASSERT_TRUE(tensor.ok());
        ASSERT_EQ(tensor->data.size(),
                  static_cast<std::size_t>(tensor->elements()) * tensor_dtype_bytes(tensor->dtype));
      }
    }
  }
}

TEST(QuantizeConfig, ReadsGptqAndAwqConfigs) {
  auto gptq = parse_quantize_config(
      R"({"bits":4,"group_size":64,"desc_act":true,"sym":false,"checkpoint_format":"gptq_v2"})",
      "q.json");
  ASSERT_TRUE(gptq.ok()) << gptq.status().to_string();
  EXPECT_EQ(gptq->format, QuantFormat::kGptq);
  EXPECT_EQ(gptq->gptq_zeros, GptqZeros::kV2);
  EXPECT_EQ(gptq->group_size, 64);
  EXPECT_TRUE(gptq->desc_act);
  auto awq = parse_quantize_config(
      R"({"quantization_config":{"quant_method":"awq","w_bit":4,"q_group_size":128,"version":"GEMM","zero_point":true}})",
      "config.json");
  ASSERT_TRUE(awq.ok()) << awq.status().to_string();
  EXPECT_EQ(awq->format, QuantFormat::kAwq);
  EXPECT_EQ(awq->group_size, 128);
  EXPECT_THAT(parse_quantize_config(R"({"bits":8})", "q.json").status().message(),
              HasSubstr("8-bit"));
  EXPECT_THAT(parse_quantize_config(R"({"quant_method":"awq","version":"gemv"})", "q.json")
                  .status()
                  .message(),
              HasSubstr("gemv"));
  EXPECT_THAT(parse_quantize_config("[", "q.json").status().message(), HasSubstr("q.json"));
}

TEST(QuantizeConfig, LoadsALayerFromACheckpoint) {
  for (QuantFormat format : {QuantFormat::kGptq, QuantFormat::kAwq}) {
    const UnpackedLayer layer =
        random_unpacked_layer(128, 64, 32, true, format == QuantFormat::kGptq, 21);
    auto packed = pack_checkpoint_layer(layer, format, GptqZeros::kV1MinusOne);
    ASSERT_TRUE(packed.ok());
    const bool gptq = format == QuantFormat::kGptq;
    std::vector<TensorToWrite> tensors = {
        {"model.mlp.qweight", TensorDtype::kI32,
         gptq ? std::vector<std::int64_t>{16, 64} : std::vector<std::int64_t>{128, 8},
         as_bytes(packed->qweight)},
        {"model.mlp.qzeros", TensorDtype::kI32, {4, 8}, as_bytes(packed->qzeros)},
        {"model.mlp.scales", TensorDtype::kF16, {4, 64}, as_bytes(packed->scales)}};
    if (gptq) {
      tensors.push_back({"model.mlp.g_idx", TensorDtype::kI32, {128}, as_bytes(packed->g_idx)});
    }
    auto file = SafetensorsFile::parse(serialize_safetensors(tensors, {}), "ckpt");
    ASSERT_TRUE(file.ok());
    QuantizeConfig config;
    config.format = format;
    config.group_size = 32;
    auto loaded = load_checkpoint_layer(*file, "model.mlp", config);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    auto unpacked = unpack_checkpoint_layer(*loaded);
    ASSERT_TRUE(unpacked.ok()) << unpacked.status().to_string();
    EXPECT_EQ(unpacked->q, layer.q);
    EXPECT_EQ(unpacked->zeros, layer.zeros);
    EXPECT_EQ(unpacked->perm, layer.perm);
    config.group_size = 64;
    EXPECT_THAT(load_checkpoint_layer(*file, "model.mlp", config).status().message(),
                HasSubstr("group_size=64"));
    EXPECT_THAT(load_checkpoint_layer(*file, "model.attn", config).status().message(),
                HasSubstr("model.attn.qweight"));
  }
}

TEST(Npy, RoundTripsEachType) {
  for (TensorDtype dtype : {TensorDtype::kF16, TensorDtype::kBF16, TensorDtype::kF32}) {
    NpyArray array;
    array.dtype = dtype;
    array.rows = 3;
    array.cols = 5;
    array.data.resize(15 * tensor_dtype_bytes(dtype));
    for (std::size_t i = 0; i < array.data.size(); ++i) array.data[i] = static_cast<std::byte>(i);
    const auto bytes = serialize_npy(array);
    EXPECT_EQ((bytes.size() - array.data.size()) % 64, 0u);  // numpy aligns the data to 64
    auto back = parse_npy(bytes, "x.npy");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->dtype, dtype);
    EXPECT_EQ(back->rows, 3);
    EXPECT_EQ(back->cols, 5);
    EXPECT_EQ(back->data, array.data);
  }
}

TEST(Npy, MalformedFilesGiveClearErrors) {
  NpyArray array;
  array.dtype = TensorDtype::kF16;
  array.rows = 2;
  array.cols = 2;
  array.data.resize(8);
  const auto good = serialize_npy(array);
  auto error = [](std::vector<std::byte> bytes) {
    return parse_npy(bytes, "x.npy").status().message();
  };
  EXPECT_THAT(error({}), HasSubstr("no NUMPY magic"));
  auto truncated = good;
  truncated.pop_back();
  EXPECT_THAT(error(truncated), HasSubstr("needs 8"));
  auto text = [&](std::string header) {
    std::vector<std::byte> bytes(10 + header.size());
    std::memcpy(bytes.data(), "\x93NUMPY\x01\x00", 8);
    bytes[8] = static_cast<std::byte>(header.size());
    std::memcpy(bytes.data() + 10, header.data(), header.size());
    return bytes;
  };
  EXPECT_THAT(error(text("{'descr': '<i8', 'fortran_order': False, 'shape': (1, 1), }")),
              HasSubstr("'<i8'"));
  EXPECT_THAT(error(text("{'descr': '<f2', 'fortran_order': True, 'shape': (1, 1), }")),
              HasSubstr("fortran_order"));
  EXPECT_THAT(error(text("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 1, 1), }")),
              HasSubstr("3-D"));
  EXPECT_THAT(error(text("{'descr': '<f2', 'fortran_order': False, 'shape': (x), }")),
              HasSubstr("shape"));
  auto long_header = good;
  long_header[8] = std::byte{0xff};
  long_header[9] = std::byte{0xff};
  EXPECT_THAT(error(long_header), HasSubstr("past the end"));
}

}  // namespace
}  // namespace gpuopt::kernels
