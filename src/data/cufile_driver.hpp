// cuFile (GPUDirect Storage) through dlopen: the few cufile.h types and entry points the
// record-file source needs, declared here from the public ABI so no cuFile header or library is
// needed to build, and a process-wide driver that stays open while any file uses it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gpuopt/core/dynamic_library.hpp"
#include "gpuopt/core/status.hpp"

namespace gpuopt::data::cufile {

// cufile.h: typedef struct CUfileError { CUfileOpError err; CUresult cu_err; } CUfileError_t;
// both members are C enums (int-sized), returned by value.
struct Error {
  int err;
  int cu_err;
};

// cufile.h: CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1.
constexpr int kHandleTypeOpaqueFd = 1;

// cufile.h: struct CUfileDescr_t { enum CUfileFileHandleType type; union { int fd; void* handle; }
// handle; const CUfileFSOps_t* fs_ops; }.
struct Descriptor {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

using Handle = void*;  // CUfileHandle_t

// cufile.h: CUfileDrvProps_t, read only for the nvidia-fs version and flags.
struct DriverProperties {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};

// "CU_FILE_DRIVER_NOT_INITIALIZED (5001)", "CU_FILE_CUDA_DRIVER_ERROR (5011, CUresult 100)".
std::string error_text(Error error);
// A negative cuFileRead/Write result: -1 with errno, or minus a CUfileOpError.
std::string io_error_text(ssize_t result, int saved_errno);

struct Api {
  Error (*driver_open)() = nullptr;
  Error (*driver_close)() = nullptr;
  Error (*driver_get_properties)(DriverProperties*) = nullptr;  // optional
  Error (*get_parameter_bool)(int, bool*) = nullptr;            // optional
  Error (*handle_register)(Handle*, Descriptor*) = nullptr;
  void (*handle_deregister)(Handle) = nullptr;
  Error (*buf_register)(const void*, std::size_t, int) = nullptr;
  Error (*buf_deregister)(const void*) = nullptr;
  ssize_t (*read)(Handle, void*, std::size_t, off_t, off_t) = nullptr;
};

// The open driver. cuFileDriverOpen/Close are process-wide, so one Driver per library name is
// shared by every file; the last owner closes the driver.
class Driver {
 public:
  // UNAVAILABLE with "cuFile: <library> not found (...)" or "cuFile: driver open failed: ...".
  static StatusOr<std::shared_ptr<Driver>> open(const std::vector<std::string>& library_names);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const Api& api() const { return api_; }
  const std::string& library() const { return library_.name(); }
  // "compat" (nvidia-fs absent or compat forced: cuFile reads with POSIX I/O and copies),
  // "gds" (nvidia-fs loaded) or "unknown"; `mode_detail` says how that was decided.
  const std::string& mode() const { return mode_; }
  const std::string& mode_detail() const { return mode_detail_; }

 private:
  Driver() = default;
  DynamicLibrary library_;
  bool opened_ = false;
  Api api_;
  std::string mode_ = "unknown";
  std::string mode_detail_;
};

}  // namespace gpuopt::data::cufile
