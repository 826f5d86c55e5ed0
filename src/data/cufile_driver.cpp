// cuFile through dlopen: loads the library, opens the driver once per process (shared), and
// decides whether cuFile runs in GDS or compatibility mode.
#include "cufile_driver.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

namespace gpuopt::data::cufile {
namespace {

// CUfileOpError values from cufile.h (CUFILEOP_BASE_ERR = 5000).
const char* op_error_name(int code) {
  switch (code) {
    case 0:
      return "CU_FILE_SUCCESS";
    case 5001:
      return "CU_FILE_DRIVER_NOT_INITIALIZED (nvidia-fs not loaded, compat mode not allowed)";
    case 5002:
      return "CU_FILE_DRIVER_INVALID_PROPS";
    case 5003:
      return "CU_FILE_DRIVER_UNSUPPORTED_LIMIT";
    case 5004:
      return "CU_FILE_DRIVER_VERSION_MISMATCH";
    case 5005:
      return "CU_FILE_DRIVER_VERSION_READ_ERROR";
    case 5006:
      return "CU_FILE_DRIVER_CLOSING";
    case 5007:
      return "CU_FILE_PLATFORM_NOT_SUPPORTED";
    case 5008:
      return "CU_FILE_IO_NOT_SUPPORTED (GDS not supported on this file)";
    case 5009:
      return "CU_FILE_DEVICE_NOT_SUPPORTED";
    case 5010:
      return "CU_FILE_NVFS_DRIVER_ERROR";
    case 5011:
      return "CU_FILE_CUDA_DRIVER_ERROR";
    case 5012:
      return "CU_FILE_CUDA_POINTER_INVALID";
    case 5013:
      return "CU_FILE_CUDA_MEMORY_TYPE_INVALID";
    case 5014:
      return "CU_FILE_CUDA_POINTER_RANGE_ERROR";
    case 5015:
      return "CU_FILE_CUDA_CONTEXT_MISMATCH";
    case 5016:
      return "CU_FILE_INVALID_MAPPING_SIZE";
    case 5017:
      return "CU_FILE_INVALID_MAPPING_RANGE";
    case 5018:
      return "CU_FILE_INVALID_FILE_TYPE";
    case 5019:
      return "CU_FILE_INVALID_FILE_OPEN_FLAG";
    case 5020:
      return "CU_FILE_DIO_NOT_SET (file not opened with O_DIRECT)";
    case 5022:
      return "CU_FILE_INVALID_VALUE";
    case 5023:
      return "CU_FILE_MEMORY_ALREADY_REGISTERED";
    case 5024:
      return "CU_FILE_MEMORY_NOT_REGISTERED";
    case 5025:
      return "CU_FILE_PERMISSION_DENIED";
    case 5026:
      return "CU_FILE_DRIVER_ALREADY_OPEN";
    case 5027:
      return "CU_FILE_HANDLE_NOT_REGISTERED";
    case 5028:
      return "CU_FILE_HANDLE_ALREADY_REGISTERED";
    case 5029:
      return "CU_FILE_DEVICE_NOT_FOUND";
    case 5030:
      return "CU_FILE_INTERNAL_ERROR";
    case 5031:
      return "CU_FILE_GETNEWFD_FAILED";
    case 5033:
      return "CU_FILE_NVFS_SETUP_ERROR";
    case 5034:
      return "CU_FILE_IO_DISABLED (GDS disabled by config for this file)";
    case 5036:
      return "CU_FILE_GPU_MEMORY_PINNING_FAILED";
    case 5043:
      return "CU_FILE_NOMEM_ERROR";
    case 5044:
      return "CU_FILE_IO_ERROR";
    case 5045:
      return "CU_FILE_INTERNAL_BUF_REGISTER_ERROR";
    default:
      return "unknown cuFile error";
  }
}

// Weak owners, so the last file closes the driver. Recursive: a driver dropped inside open()
// (an error path) is destroyed under the lock, and destruction takes it too, so a close never
// races a concurrent open of the same library.
std::recursive_mutex registry_mutex;
std::map<std::string, std::weak_ptr<Driver>>& registry() {
  static auto* drivers = new std::map<std::string, std::weak_ptr<Driver>>();
  return *drivers;
}

}  // namespace

std::string error_text(Error error) {
  if (error.err == 5011) {
    return fmt::format("{} ({}, CUresult {})", op_error_name(error.err), error.err, error.cu_err);
  }
  return fmt::format("{} ({})", op_error_name(error.err), error.err);
}

std::string io_error_text(ssize_t result, int saved_errno) {
  if (result == -1) return fmt::format("errno {}: {}", saved_errno, std::strerror(saved_errno));
  return error_text({static_cast<int>(-result), 0});
}

StatusOr<std::shared_ptr<Driver>> Driver::open(const std::vector<std::string>& library_names) {
  if (library_names.empty()) return invalid_argument("cuFile: no library name to load");
  std::string key;
  for (const auto& name : library_names) key += name + ";";
  std::lock_guard<std::recursive_mutex> guard(registry_mutex);
  if (auto existing = registry()[key].lock()) return existing;

  std::shared_ptr<Driver> driver(new Driver(), [](Driver* doomed) {
    std::lock_guard<std::recursive_mutex> lock(registry_mutex);
    delete doomed;
  });
  std::string attempts;
  for (const auto& name : library_names) {
    auto library = DynamicLibrary::open({name.c_str()}, "CUFILE");
    if (library.ok()) {
      driver->library_ = std::move(library).value();
      break;
    }
    attempts += (attempts.empty() ? "" : "; ") + library.status().message();
  }
  if (!driver->library_.loaded()) {
    return unavailable(fmt::format("cuFile: {} not found ({})", library_names.front(), attempts));
  }
  const DynamicLibrary& lib = driver->library_;
  Api& api = driver->api_;
  api.driver_open = lib.function<decltype(api.driver_open)>({"cuFileDriverOpen"});
  // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 in newer releases.
  api.driver_close =
      lib.function<decltype(api.driver_close)>({"cuFileDriverClose_v2", "cuFileDriverClose"});
  api.driver_get_properties =
      lib.function<decltype(api.driver_get_properties)>({"cuFileDriverGetProperties"});
  api.get_parameter_bool =
      lib.function<decltype(api.get_parameter_bool)>({"cuFileGetParameterBool"});
  api.handle_register = lib.function<decltype(api.handle_register)>({"cuFileHandleRegister"});
  api.handle_deregister = lib.function<decltype(api.handle_deregister)>({"cuFileHandleDeregister"});
  api.buf_register = lib.function<decltype(api.buf_register)>({"cuFileBufRegister"});
  api.buf_deregister = lib.function<decltype(api.buf_deregister)>({"cuFileBufDeregister"});
  api.read = lib.function<decltype(api.read)>({"cuFileRead"});
  if (api.driver_open == nullptr || api.driver_close == nullptr || api.handle_register == nullptr ||
      api.handle_deregister == nullptr || api.buf_register == nullptr ||
      api.buf_deregister == nullptr || api.read == nullptr) {
    return unavailable(
        fmt::format("cuFile: {} lacks a needed entry point (cuFileDriverOpen, "
                    "cuFileHandleRegister, cuFileBufRegister, cuFileRead, ...)",
                    lib.name()));
  }
  Error opened = api.driver_open();
  if (opened.err != 0) {
    return unavailable(fmt::format("cuFile: driver open failed: {}", error_text(opened)));
  }
  driver->opened_ = true;

  // Which mode: compatibility mode reads with POSIX I/O inside cuFile and copies to the GPU;
  // only a loaded nvidia-fs module makes true GPUDirect transfers possible.
  bool forced_compat = false;
  if (api.get_parameter_bool != nullptr) {
    constexpr int kForceCompatMode = 2;  // cufile.h: CUFILE_PARAM_FORCE_COMPAT_MODE
    bool value = false;
    if (api.get_parameter_bool(kForceCompatMode, &value).err == 0) forced_compat = value;
  }
  std::string nvfs_version;
  {
    std::ifstream version("/proc/driver/nvidia-fs/version");
    if (version) std::getline(version, nvfs_version);
  }
  if (forced_compat) {
    driver->mode_ = "compat";
    driver->mode_detail_ = "compat mode forced by the cuFile configuration (force_compat_mode)";
  } else if (nvfs_version.empty()) {
    driver->mode_ = "compat";
    driver->mode_detail_ =
        "nvidia-fs is not loaded (/proc/driver/nvidia-fs/version absent): compat mode, cuFile "
        "reads with POSIX I/O and copies to the GPU";
  } else {
    driver->mode_ = "gds";
    driver->mode_detail_ = fmt::format("nvidia-fs loaded ({})", nvfs_version);
    if (api.driver_get_properties != nullptr) {
      DriverProperties properties{};
      if (api.driver_get_properties(&properties).err == 0) {
        driver->mode_detail_ +=
            fmt::format(", driver properties report nvfs {}.{}", properties.nvfs.major_version,
                        properties.nvfs.minor_version);
      }
    }
  }
  registry()[key] = driver;
  return driver;
}

Driver::~Driver() {
  if (opened_) (void)api_.driver_close();
}

}  // namespace gpuopt::data::cufile
