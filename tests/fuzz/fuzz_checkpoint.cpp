// libFuzzer target: the checkpoint readers on arbitrary bytes: the safetensors header and tensor
// table, the .npy header, quantize_config.json, and one layer's tensors checked against each
// other. Whatever parses must describe bytes inside the input and sizes that agree.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/kernels/safetensors.hpp"

namespace {

void check_file(const gpuopt::kernels::SafetensorsFile& file, const std::uint8_t* data,
                std::size_t size) {
  using namespace gpuopt::kernels;
  for (const std::string& name : file.names()) {
    auto tensor = file.tensor(name);
    if (!tensor.ok()) continue;
    // parse() keeps its own copy of the bytes: the view must lie inside that copy, and be as
    // long as its shape and dtype say.
    if (tensor->elements() < 0) std::abort();
    if (tensor->data.size() !=
        static_cast<std::size_t>(tensor->elements()) * tensor_dtype_bytes(tensor->dtype)) {
      std::abort();
    }
    if (tensor->data.size() > size) std::abort();
    (void)tensor_as_int32(*tensor);
    (void)tensor_as_float16(*tensor);
  }
  // A layer named after the first tensor's prefix, under each config flavour.
  auto names = file.names();
  if (names.empty()) return;
  std::string_view first = names.front();
  std::string_view layer = first.substr(0, first.rfind('.'));
  for (const char* config : {R"({"bits": 4, "group_size": 128, "desc_act": false})",
                             R"({"bits": 4, "group_size": -1, "desc_act": true})",
                             R"({"quant_method": "awq", "bits": 4, "group_size": 64})"}) {
    auto parsed = parse_quantize_config(config, "fuzz");
    if (!parsed.ok()) std::abort();  // fixed, valid configs
    (void)load_checkpoint_layer(file, layer, *parsed);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuopt::kernels;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  auto file = SafetensorsFile::parse(std::vector<std::byte>(bytes, bytes + size), "fuzz");
  if (file.ok()) check_file(*file, data, size);
  auto npy = parse_npy(std::span<const std::byte>(bytes, size), "fuzz");
  if (npy.ok()) {
    if (npy->rows < 0 || npy->cols < 0) std::abort();
    if (npy->data.size() !=
        static_cast<std::size_t>(npy->rows * npy->cols) * tensor_dtype_bytes(npy->dtype)) {
      std::abort();
    }
  }
  (void)parse_quantize_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  return 0;
}
