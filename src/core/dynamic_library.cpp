// DynamicLibrary: dlopen/dlsym with ordered fallbacks and a test switch to simulate absence.
#include "gpuopt/core/dynamic_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

namespace gpuopt {

StatusOr<DynamicLibrary> DynamicLibrary::open(std::initializer_list<const char*> names,
                                              const char* disable_tag) {
  if (disable_tag != nullptr) {
    std::string variable = fmt::format("GPUOPT_DISABLE_{}", disable_tag);
    const char* value = std::getenv(variable.c_str());
    if (value != nullptr && std::string(value) == "1") {
      return unavailable(fmt::format("{} disabled by {}=1", *names.begin(), variable));
    }
  }
  std::string attempts;
  for (const char* name : names) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      DynamicLibrary library;
      library.handle_ = handle;
      library.name_ = name;
      return library;
    }
    const char* error = dlerror();
    attempts += fmt::format("{}{} ({})", attempts.empty() ? "" : "; ", name,
                            error != nullptr ? error : "unknown error");
  }
  return unavailable(fmt::format("could not load any of: {}", attempts));
}

DynamicLibrary::DynamicLibrary(DynamicLibrary&& other) noexcept
    : handle_(other.handle_), name_(std::move(other.name_)) {
  other.handle_ = nullptr;
}

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = other.handle_;
    name_ = std::move(other.name_);
    other.handle_ = nullptr;
  }
  return *this;
}

DynamicLibrary::~DynamicLibrary() {
  // Driver libraries (NVML, libcuda) misbehave when unloaded while in use; keep them mapped.
  handle_ = nullptr;
}

void* DynamicLibrary::symbol(std::initializer_list<const char*> names,
                             std::string* found_name) const {
  if (handle_ == nullptr) return nullptr;
  for (const char* name : names) {
    void* address = dlsym(handle_, name);
    if (address != nullptr) {
      if (found_name != nullptr) *found_name = name;
      return address;
    }
  }
  return nullptr;
}

}  // namespace gpuopt
