// gpuopt.quant's native half: a GPTQ/AWQ layer read from safetensors into the W4A16 kernel layout
// (host arrays the Python side turns into torch buffers), the CPU twin, and a GEMM plan that runs
// on device pointers the caller owns (torch tensors), so torch manages every allocation.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "gpuopt/kernels/safetensors.hpp"
#include "gpuopt/kernels/w4a16.hpp"

namespace nb = nanobind;

namespace gpuopt::python {
namespace {

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T>&& values) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(owned->data(), {owned->size()}, owner);
}

kernels::ActivationType parse_activation(const std::string& name) {
  if (name == "float16") return kernels::ActivationType::kFloat16;
  if (name == "bfloat16") return kernels::ActivationType::kBFloat16;
  throw StatusError(
      invalid_argument("activation type \"" + name + "\": expected \"float16\" or \"bfloat16\""));
}

nb::dict weights_to_dict(kernels::W4A16Weights&& weights) {
  nb::dict result;
  result["k"] = weights.k;
  result["n"] = weights.n;
  result["group_size"] = weights.group_size;
  result["dtype"] =
      std::string(weights.type == kernels::ActivationType::kFloat16 ? "float16" : "bfloat16");
  result["has_zeros"] = weights.has_zeros;
  result["tiles"] = to_numpy(std::move(weights.tiles));
  result["scales"] = to_numpy(std::move(weights.scales));
  result["zeros"] = to_numpy(std::move(weights.zeros));
  result["perm"] = to_numpy(std::move(weights.perm));
  return result;
}

using U32 = nb::ndarray<const std::uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U16 = nb::ndarray<const std::uint16_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U8 = nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32 = nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// One W4A16Gemm planned for one M over weights held in caller-owned device memory.
class PyW4A16Plan {
 public:
  PyW4A16Plan(int m, int k, int n, int group_size, const std::string& dtype, bool has_zeros,
              std::uintptr_t tiles, std::uintptr_t scales, std::uintptr_t zeros,
              std::uintptr_t perm, int sm_count, bool deterministic, int fallback_min_m)
      : gemm_(make_options(sm_count, deterministic, fallback_min_m)) {
    throw_if_error(kernels::check_w4a16_shape(k, n, group_size));
    if (m < 1) throw StatusError(invalid_argument("M must be at least 1"));
    weights_.k = k;
    weights_.n = n;
    weights_.group_size = group_size;
    weights_.type = parse_activation(dtype);
    weights_.has_zeros = has_zeros;
    weights_.tiles = reinterpret_cast<const void*>(tiles);
    weights_.scales = reinterpret_cast<const void*>(scales);
    weights_.zeros = has_zeros ? reinterpret_cast<const void*>(zeros) : nullptr;
    weights_.perm = perm != 0 ? reinterpret_cast<const void*>(perm) : nullptr;
    arguments_.m = m;
    arguments_.weights = &weights_;
  }

  std::size_t workspace_size(std::uintptr_t x, std::uintptr_t y) {
    set_xy(x, y);
    throw_if_error(kernels::W4A16Gemm::can_implement(arguments_));
    return value_or_throw(gemm_.workspace_size(arguments_));
  }

  void initialize(std::uintptr_t x, std::uintptr_t y, std::uintptr_t workspace,
                  std::uintptr_t stream) {
    set_xy(x, y);
    nb::gil_scoped_release release;
    throw_if_error(gemm_.initialize(arguments_, reinterpret_cast<void*>(workspace),
                                    reinterpret_cast<kernels::StreamHandle>(stream)));
  }

  // Queues y = x @ W on `stream`; no host synchronisation.
  void run(std::uintptr_t x, std::uintptr_t y, std::uintptr_t stream) {
    gemm_.update(reinterpret_cast<const void*>(x), reinterpret_cast<void*>(y));
    throw_if_error(gemm_.run(reinterpret_cast<kernels::StreamHandle>(stream)));
  }

  std::string describe() const { return gemm_.config().describe(); }

 private:
  static kernels::W4A16Options make_options(int sm_count, bool deterministic, int fallback_min_m) {
    kernels::W4A16Options options;
    options.sm_count = sm_count;
    options.deterministic = deterministic;
    options.fallback_min_m = fallback_min_m;
    return options;
  }
  void set_xy(std::uintptr_t x, std::uintptr_t y) {
    arguments_.x = reinterpret_cast<const void*>(x);
    arguments_.y = reinterpret_cast<void*>(y);
  }

  kernels::W4A16Gemm gemm_;
  kernels::W4A16DeviceWeights weights_;  // a view: owns nothing
  kernels::W4A16Gemm::Arguments arguments_;
};

}  // namespace

void bind_quant(nb::module_& module) {
  module.def(
      "quant_load_layer",
      [](const std::string& path, const std::string& layer, const std::string& config_json,
         const std::string& dtype) {
        kernels::W4A16Weights weights;
        {
          nb::gil_scoped_release release;
          auto type = parse_activation(dtype);
          auto file = value_or_throw(kernels::SafetensorsFile::open(path));
          auto config = value_or_throw(kernels::parse_quantize_config(config_json, path));
          auto checkpoint = value_or_throw(kernels::load_checkpoint_layer(file, layer, config));
          auto unpacked = value_or_throw(kernels::unpack_checkpoint_layer(checkpoint));
          weights = value_or_throw(kernels::repack_for_kernel(unpacked, type));
        }
        return weights_to_dict(std::move(weights));
      },
      nb::arg("path"), nb::arg("layer"), nb::arg("config_json"), nb::arg("dtype"),
      "Reads LAYER.qweight/scales/qzeros/g_idx from a safetensors file and returns the W4A16 "
      "kernel layout as a dict of numpy arrays (tiles, scales, zeros, perm) and sizes.");

  module.def(
      "quant_reference",
      [](int k, int n, int group_size, const std::string& dtype, bool has_zeros, U32 tiles,
         U16 scales, U8 zeros, I32 perm, U16 x, int m) {
        kernels::W4A16Weights weights;
        weights.k = k;
        weights.n = n;
        weights.group_size = group_size;
        weights.type = parse_activation(dtype);
        weights.has_zeros = has_zeros;
        throw_if_error(kernels::check_w4a16_shape(k, n, group_size));
        const std::size_t groups = static_cast<std::size_t>(k / group_size);
        if (tiles.shape(0) != static_cast<std::size_t>(k) * n / 8 ||
            scales.shape(0) != groups * n || (has_zeros && zeros.shape(0) != groups * n) ||
            (perm.shape(0) != 0 && perm.shape(0) != static_cast<std::size_t>(k)) || m < 0 ||
            x.shape(0) != static_cast<std::size_t>(m) * k) {
          throw StatusError(invalid_argument("quant_reference: array sizes do not match K, N, M"));
        }
        weights.tiles.assign(tiles.data(), tiles.data() + tiles.shape(0));
        weights.scales.assign(scales.data(), scales.data() + scales.shape(0));
        weights.zeros.assign(zeros.data(), zeros.data() + zeros.shape(0));
        weights.perm.assign(perm.data(), perm.data() + perm.shape(0));
        std::vector<float> y;
        {
          nb::gil_scoped_release release;
          y = kernels::w4a16_reference(weights, x.data(), m);
        }
        return to_numpy(std::move(y));
      },
      nb::arg("k"), nb::arg("n"), nb::arg("group_size"), nb::arg("dtype"), nb::arg("has_zeros"),
      nb::arg("tiles"), nb::arg("scales"), nb::arg("zeros"), nb::arg("perm"), nb::arg("x"),
      nb::arg("m"),
      "CPU twin of the GEMM: x [M*K] fp16/bf16 bits -> y [M*N] float32, from the kernel layout.");

  nb::class_<PyW4A16Plan>(module, "W4A16Plan",
                          "A W4A16 GEMM planned for one M over caller-owned device buffers.")
      .def(nb::init<int, int, int, int, const std::string&, bool, std::uintptr_t, std::uintptr_t,
                    std::uintptr_t, std::uintptr_t, int, bool, int>(),
           nb::arg("m"), nb::arg("k"), nb::arg("n"), nb::arg("group_size"), nb::arg("dtype"),
           nb::arg("has_zeros"), nb::arg("tiles"), nb::arg("scales"), nb::arg("zeros"),
           nb::arg("perm"), nb::arg("sm_count") = 0, nb::arg("deterministic") = false,
           nb::arg("fallback_min_m") = 0,
           "Device pointers as integers; perm 0 = identity. Checks the shape.")
      .def("workspace_size", &PyW4A16Plan::workspace_size, nb::arg("x"), nb::arg("y"),
           "Bytes of device workspace the GEMM needs.")
      .def("initialize", &PyW4A16Plan::initialize, nb::arg("x"), nb::arg("y"), nb::arg("workspace"),
           nb::arg("stream"), "Chooses the kernel and clears the workspace on `stream`.")
      .def("run", &PyW4A16Plan::run, nb::arg("x"), nb::arg("y"), nb::arg("stream"),
           "Queues y[M, N] = x[M, K] @ W on `stream`.")
      .def("describe", &PyW4A16Plan::describe, "The chosen configuration.");
}

}  // namespace gpuopt::python
