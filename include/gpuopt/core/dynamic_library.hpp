// dlopen wrapper: libraries that may be absent (NVML, libcuda, libvulkan, cuFile) are loaded at run
// time so one binary runs on machines with and without a driver.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt {

class DynamicLibrary {
 public:
  // Tries each name in order (e.g. "libnvidia-ml.so.1", "libnvidia-ml.so"); UNAVAILABLE naming
  // every attempt and dlerror's text when none loads, or when `disable_tag` (e.g. "NVML") is
  // switched off by set_disabled.
  static StatusOr<DynamicLibrary> open(std::initializer_list<const char*> names,
                                       const char* disable_tag = nullptr);
  // Process-wide: from now on, open() with this tag refuses to load, so tests and users can
  // simulate a missing library (the gpuopt CLI maps GPUOPT_DISABLE_<TAG>=1 to it). Thread-safe.
  static void set_disabled(const std::string& tag, bool disabled);
  static bool disabled(const std::string& tag);

  DynamicLibrary() = default;
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;
  ~DynamicLibrary();

  bool loaded() const { return handle_ != nullptr; }
  const std::string& name() const { return name_; }

  // First symbol found among `names`: list the newest versioned symbol first ("nvmlInit_v2",
  // "nvmlInit") as nvtop does. Returns nullptr when none exists.
  void* symbol(std::initializer_list<const char*> names, std::string* found_name = nullptr) const;

  template <typename Fn>
  Fn function(std::initializer_list<const char*> names, std::string* found_name = nullptr) const {
    return reinterpret_cast<Fn>(symbol(names, found_name));
  }

 private:
  void* handle_ = nullptr;
  std::string name_;
};

}  // namespace gpuopt
