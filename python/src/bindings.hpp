// Shared pieces of the nanobind extension: how a failed Status becomes a Python exception, and
// the registration function of each bound module.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <string>
#include <utility>

#include "gpuopt/core/status.hpp"

namespace gpuopt::python {

// Thrown by the bindings for a failed Status; translated (module.cpp) into the gpuopt.Error
// subclass of its code, carrying the C++ message.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), text_(status_.to_string()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  Status status_;
  std::string text_;
};

inline void throw_if_error(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T value_or_throw(StatusOr<T>&& result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

void bind_vector(nanobind::module_& module);
void bind_runtime(nanobind::module_& module);
void bind_quant(nanobind::module_& module);
void bind_doctor(nanobind::module_& module);
void bind_data(nanobind::module_& module);
void bind_amp(nanobind::module_& module);

}  // namespace gpuopt::python
