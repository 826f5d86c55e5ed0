// The extension module `gpuopt._gpuopt`: error translation and build facts; each area binds itself
// (vector_bindings.cpp, runtime_bindings.cpp, quant_bindings.cpp, doctor_bindings.cpp). The public
// Python API is the pure-Python package around it (python/gpuopt).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace nb = nanobind;

NB_MODULE(_gpuopt, module) {
  module.doc() =
      "Native core of the gpuopt package (nanobind). Use the public modules gpuopt.vector, "
      "gpuopt.runtime, gpuopt.quant and gpuopt.doctor rather than this one.";
  // A failed Status is raised as gpuopt.errors' class for its code. The classes are Python ones
  // (they also derive from ValueError, FileNotFoundError, ...), looked up when first needed so
  // that this module imports on its own (stub generation does).
  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const gpuopt::python::StatusError& error) {
      nb::object errors = nb::module_::import_("gpuopt.errors");
      nb::object raise_status = errors.attr("_exception_for_status");
      nb::object exception =
          raise_status(static_cast<int>(error.status().code()), error.status().message());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
    }
  });
#if GPUOPT_CUDA
  module.attr("built_with_cuda") = true;
#else
  module.attr("built_with_cuda") = false;
#endif
  gpuopt::python::bind_vector(module);
  gpuopt::python::bind_runtime(module);
  gpuopt::python::bind_quant(module);
  gpuopt::python::bind_doctor(module);
  gpuopt::python::bind_data(module);
  gpuopt::python::bind_amp(module);
}
