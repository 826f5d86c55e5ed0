// gpuopt.doctor(): the same report `gpuopt doctor --json` prints, as JSON text (Python parses it).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "gpuopt/doctor/doctor.hpp"

namespace nb = nanobind;

namespace gpuopt::python {

void bind_doctor(nb::module_& module) {
  module.def(
      "doctor_json",
      [](const std::string& root, bool all_devices, bool use_nvml, bool use_vulkan) {
        std::string text;
        {
          nb::gil_scoped_release release;
          doctor::Options options;
          options.root = root;
          options.all_devices = all_devices;
          options.use_nvml = use_nvml;
          options.use_vulkan = use_vulkan;
          doctor::Report report = value_or_throw(doctor::collect(options));
          doctor::judge(report);
          text = doctor::to_json(report).dump();
        }
        return text;
      },
      nb::arg("root") = "/", nb::arg("all_devices") = false, nb::arg("use_nvml") = true,
      nb::arg("use_vulkan") = true,
      "Collects and judges the platform as `gpuopt doctor --json` does and returns that JSON "
      "text. `root` other than \"/\" reads a recorded machine (no NVML, no Vulkan).");
}

}  // namespace gpuopt::python
