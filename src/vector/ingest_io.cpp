// Socket I/O for the ingest protocol: framing, full reads and writes, timeouts.
#include "ingest_io.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace gpuopt::vector::detail {

namespace {

Status errno_status(const char* what, int error) {
  if (error == EAGAIN || error == EWOULDBLOCK) {
    return Status(StatusCode::kDeadlineExceeded, fmt::format("{}: timed out", what));
  }
  return unavailable(fmt::format("{}: {}", what, std::strerror(error)));
}

}  // namespace

Status errno_error(const std::string& what) {
  int error = errno;
  std::string message = fmt::format("{}: {}", what, std::strerror(error));
  if (error == ENOENT) return not_found(message);
  if (error == EACCES || error == EPERM) return permission_denied(message);
  return unavailable(message);
}

Status send_all(int fd, std::span<const std::uint8_t> bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("send", errno);
    }
    sent += static_cast<std::size_t>(n);
  }
  return ok_status();
}

Status receive_exact(int fd, void* out, std::size_t size, std::size_t* received) {
  auto* p = static_cast<std::uint8_t*>(out);
  std::size_t got = 0;
  Status status;
  while (got < size) {
    ssize_t n = ::recv(fd, p + got, size - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = errno_status("receive", errno);
      break;
    }
    if (n == 0) {
      status = got == 0
                   ? not_found("connection closed")
                   : invalid_argument(fmt::format(
                         "truncated message: the peer closed after {} of {} bytes", got, size));
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  if (received != nullptr) *received = got;
  return status;
}

Status send_frame(int fd, std::span<const std::uint8_t> body) {
  std::uint32_t length = static_cast<std::uint32_t>(body.size());
  std::vector<std::uint8_t> frame(sizeof(length) + body.size());
  std::memcpy(frame.data(), &length, sizeof(length));
  if (!body.empty()) std::memcpy(frame.data() + sizeof(length), body.data(), body.size());
  return send_all(fd, frame);
}

Status receive_frame(int fd, std::size_t max_body, std::vector<std::uint8_t>* body) {
  std::uint32_t length = 0;
  std::size_t got = 0;
  GPUOPT_RETURN_IF_ERROR(receive_exact(fd, &length, sizeof(length), &got));
  if (length > max_body) {
    return invalid_argument(
        fmt::format("frame of {} bytes exceeds the limit of {} bytes", length, max_body));
  }
  body->resize(length);
  Status status = receive_exact(fd, body->data(), length, &got);
  if (!status.ok() && status.code() == StatusCode::kNotFound) {
    return invalid_argument(
        fmt::format("truncated message: the peer closed after 0 of {} body bytes", length));
  }
  if (!status.ok())
    return status.with_context(fmt::format("frame body ({} of {} bytes)", got, length));
  return ok_status();
}

Status set_timeouts(int fd, int seconds) {
  timeval timeout{};
  timeout.tv_sec = seconds;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)) != 0) {
    return errno_status("setsockopt timeouts", errno);
  }
  return ok_status();
}

}  // namespace gpuopt::vector::detail
