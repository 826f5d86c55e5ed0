// DynamicLibrary: dlopen/dlsym with ordered fallbacks and a test switch to simulate absence.
#include "gpuopt/core/dynamic_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>
#include <set>

namespace gpuopt {

namespace {
std::mutex& disabled_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<std::string>& disabled_tags() {
  static std::set<std::string> tags;
  return tags;
}
}  // namespace

void DynamicLibrary::set_disabled(const std::string& tag, bool disabled) {
  std::lock_guard<std::mutex> lock(disabled_mutex());
  if (disabled) {
    disabled_tags().insert(tag);
  } else {
    disabled_tags().erase(tag);
  }
}

bool DynamicLibrary::disabled(const std::string& tag) {
  std::lock_guard<std::mutex> lock(disabled_mutex());
  return disabled_tags().count(tag) != 0;
}

StatusOr<DynamicLibrary> DynamicLibrary::open(std::initializer_list<const char*> names,
                                              const char* disable_tag) {
  if (disable_tag != nullptr && disabled(disable_tag)) {
    return unavailable(fmt::format("{} not loaded: {} is switched off (GPUOPT_DISABLE_{}=1)",
                                   *names.begin(), disable_tag, disable_tag));
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
