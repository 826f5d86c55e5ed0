// gpuopt.amp's native half: TensorListScaler over caller-owned device memory (torch tensors given
// as pointers, element counts and dtype codes), queued on the caller's stream, and the CPU twin of
// its passes over numpy arrays for the tests.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "gpuopt/kernels/loss_scaler.hpp"

namespace nb = nanobind;

namespace gpuopt::python {
namespace {

using Pointers = std::vector<std::uintptr_t>;
using Counts = std::vector<std::uint64_t>;
using DtypeCodes = std::vector<int>;

// The tensor list of one call: three parallel lists from Python (dtype 0 fp16, 1 bf16, 2 fp32).
std::vector<kernels::GradientTensor> tensor_list(const Pointers& pointers, const Counts& counts,
                                                 const DtypeCodes& dtypes) {
  if (pointers.size() != counts.size() || pointers.size() != dtypes.size()) {
    throw StatusError(invalid_argument("tensor list: " + std::to_string(pointers.size()) +
                                       " pointers, " + std::to_string(counts.size()) + " counts, " +
                                       std::to_string(dtypes.size()) + " dtypes"));
  }
  std::vector<kernels::GradientTensor> tensors(pointers.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (dtypes[t] < 0 || dtypes[t] > 2) {
      throw StatusError(invalid_argument("tensor " + std::to_string(t) + ": dtype code " +
                                         std::to_string(dtypes[t]) + " is not 0, 1 or 2"));
    }
    tensors[t].data = reinterpret_cast<void*>(pointers[t]);
    tensors[t].count = counts[t];
    tensors[t].dtype = static_cast<kernels::GradientDtype>(dtypes[t]);
  }
  return tensors;
}

template <typename T>
T* device_pointer(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

class PyTensorListScaler {
 public:
  PyTensorListScaler(int device, std::size_t chunk_bytes, int max_blocks, int max_table_slots) {
    kernels::TensorListOptions options;
    options.chunk_bytes = chunk_bytes;
    options.max_blocks = max_blocks;
    options.max_table_slots = max_table_slots;
    scaler_ = value_or_throw(kernels::TensorListScaler::create(device, options));
  }

  void unscale(const Pointers& pointers, const Counts& counts, const DtypeCodes& dtypes,
               std::uintptr_t scale, std::uintptr_t found_inf, std::uintptr_t stream) {
    const auto tensors = tensor_list(pointers, counts, dtypes);
    throw_if_error(scaler_->unscale(tensors, device_pointer<const float>(scale),
                                    device_pointer<float>(found_inf),
                                    reinterpret_cast<CUstream_st*>(stream)));
  }

  void unscale_norm(const Pointers& pointers, const Counts& counts, const DtypeCodes& dtypes,
                    std::uintptr_t scale, std::uintptr_t found_inf, float max_norm,
                    std::uintptr_t total_norm, std::uintptr_t clip_coefficient,
                    std::uintptr_t combined_scale, std::uintptr_t stream) {
    const auto tensors = tensor_list(pointers, counts, dtypes);
    kernels::NormOutputs outputs;
    outputs.total_norm = device_pointer<float>(total_norm);
    outputs.clip_coefficient = device_pointer<float>(clip_coefficient);
    outputs.combined_scale = device_pointer<float>(combined_scale);
    throw_if_error(scaler_->unscale_norm(tensors, device_pointer<const float>(scale),
                                         device_pointer<float>(found_inf), max_norm, outputs,
                                         reinterpret_cast<CUstream_st*>(stream)));
  }

  void scale_twice(const Pointers& pointers, const Counts& counts, const DtypeCodes& dtypes,
                   std::uintptr_t scale, std::uintptr_t second, std::uintptr_t stream) {
    const auto tensors = tensor_list(pointers, counts, dtypes);
    throw_if_error(scaler_->scale_twice(tensors, device_pointer<const float>(scale),
                                        device_pointer<const float>(second),
                                        reinterpret_cast<CUstream_st*>(stream)));
  }

  std::size_t table_slots() const { return scaler_->table_slots(); }
  std::uint64_t table_uploads() const { return scaler_->table_uploads(); }
  int grid_blocks() const { return scaler_->grid_blocks(); }

 private:
  std::unique_ptr<kernels::TensorListScaler> scaler_;
};

using HostFloats = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

kernels::GradientTensor host_tensor(HostFloats values) {
  return {values.data(), values.shape(0), kernels::GradientDtype::kFloat32};
}

}  // namespace

void bind_amp(nb::module_& module) {
  nb::class_<PyTensorListScaler>(
      module, "TensorListScaler",
      "Multi-tensor unscale / unscale+norm / clip multiply over device pointers on one CUDA "
      "device; every call is queued on `stream` with no host synchronisation.")
      .def(nb::init<int, std::size_t, int, int>(), nb::arg("device"),
           nb::arg("chunk_bytes") = 64 * 1024, nb::arg("max_blocks") = 0,
           nb::arg("max_table_slots") = 64)
      .def("unscale", &PyTensorListScaler::unscale, nb::arg("pointers"), nb::arg("counts"),
           nb::arg("dtypes"), nb::arg("scale"), nb::arg("found_inf"), nb::arg("stream"),
           "found_inf |= any inf/NaN; x = x * float(1/double(*scale)); scale 0 = check only.")
      .def("unscale_norm", &PyTensorListScaler::unscale_norm, nb::arg("pointers"),
           nb::arg("counts"), nb::arg("dtypes"), nb::arg("scale"), nb::arg("found_inf"),
           nb::arg("max_norm"), nb::arg("total_norm"), nb::arg("clip_coefficient"),
           nb::arg("combined_scale"), nb::arg("stream"),
           "found_inf, the L2 norm of the unscaled values and the clip factor; writes no "
           "gradient. combined_scale 0 = not wanted.")
      .def("scale_twice", &PyTensorListScaler::scale_twice, nb::arg("pointers"), nb::arg("counts"),
           nb::arg("dtypes"), nb::arg("scale"), nb::arg("second"), nb::arg("stream"),
           "x = (x * float(1/double(*scale))) * (*second), rounded after each multiply.")
      .def_prop_ro("table_slots", &PyTensorListScaler::table_slots)
      .def_prop_ro("table_uploads", &PyTensorListScaler::table_uploads)
      .def_prop_ro("grid_blocks", &PyTensorListScaler::grid_blocks);

  module.def(
      "amp_unscale_norm_reference",
      [](HostFloats values, float inv_scale) {
        const kernels::GradientTensor tensor = host_tensor(values);
        const auto result = kernels::unscale_norm_reference({&tensor, 1}, inv_scale);
        return std::make_tuple(result.found_inf, result.sum_squares);
      },
      nb::arg("values"), nb::arg("inv_scale"),
      "CPU twin of one unscale_norm pass over fp32 values: (found_inf, sum of squares).");
  module.def("amp_clip_coefficient_reference", &kernels::clip_coefficient_reference,
             nb::arg("total_norm"), nb::arg("max_norm"),
             "torch's clip_grad_norm_ factor in its fp32 operations.");
  module.def(
      "amp_scale_twice_reference",
      [](HostFloats values, float first, float second) {
        const kernels::GradientTensor tensor = host_tensor(values);
        kernels::scale_twice_reference({&tensor, 1}, first, second);
      },
      nb::arg("values"), nb::arg("first"), nb::arg("second"),
      "CPU twin of scale_twice over fp32 values, in place.");
  module.def("amp_inverse_scale", &kernels::inverse_scale, nb::arg("scale"),
             "float(1 / double(scale)), as GradScaler.unscale_.");
}

}  // namespace gpuopt::python
