// Errors as values: canonical status codes (as abseil's), Status, StatusOr<T> and propagation
// macros.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gpuopt {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

// Canonical name of a code, e.g. "INVALID_ARGUMENT".
std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string to_string() const;

  // Prefixes context ("while reading X: ") to the message, keeping the code.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
Status invalid_argument(std::string message);
Status not_found(std::string message);
Status unavailable(std::string message);
Status unimplemented(std::string message);
Status internal_error(std::string message);
Status resource_exhausted(std::string message);
Status permission_denied(std::string message);
Status failed_precondition(std::string message);
Status data_loss(std::string message);
Status out_of_range(std::string message);

// Internal invariant broken: a bug in gpuopt, not a user error. Prints file:line and aborts.
[[noreturn]] void invariant_failed(const char* expression, const char* file, int line);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : state_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : state_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(state_).ok()) {
      state_ = Status(StatusCode::kInternal, "StatusOr constructed from an OK status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  Status status() const { return ok() ? Status() : std::get<Status>(state_); }

  const T& value() const& {
    check();
    return std::get<T>(state_);
  }
  T& value() & {
    check();
    return std::get<T>(state_);
  }
  T&& value() && {
    check();
    return std::get<T>(std::move(state_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<T>(state_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  void check() const {
    if (!ok()) {
      std::fprintf(stderr, "gpuopt: value() of a failed StatusOr: %s\n",
                   std::get<Status>(state_).to_string().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> state_;
};

}  // namespace gpuopt

#define GPUOPT_CHECK(expr)                                              \
  do {                                                                  \
    if (!(expr)) ::gpuopt::invariant_failed(#expr, __FILE__, __LINE__); \
  } while (0)

#define GPUOPT_STATUS_CONCAT_INNER(a, b) a##b
#define GPUOPT_STATUS_CONCAT(a, b) GPUOPT_STATUS_CONCAT_INNER(a, b)

#define GPUOPT_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::gpuopt::Status gpuopt_status_ = (expr);        \
    if (!gpuopt_status_.ok()) return gpuopt_status_; \
  } while (0)

#define GPUOPT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// GPUOPT_ASSIGN_OR_RETURN(auto x, make_x());
#define GPUOPT_ASSIGN_OR_RETURN(lhs, expr) \
  GPUOPT_ASSIGN_OR_RETURN_IMPL(GPUOPT_STATUS_CONCAT(gpuopt_statusor_, __LINE__), lhs, expr)
