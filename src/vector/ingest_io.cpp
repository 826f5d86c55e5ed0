// Socket I/O for the ingest protocol: framing, full reads and writes, timeouts.
#include "ingest_io.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
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

namespace {

// One recvmsg: descriptors that ride on the bytes (SCM_RIGHTS) go to `fds`, or are closed when
// the caller takes none, so a peer cannot make this process hold descriptors it never asked for.
ssize_t receive_some(int fd, void* out, std::size_t size, std::vector<int>* fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  iovec io{out, size};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fds != nullptr) {
        fds->push_back(received);
      } else {
        ::close(received);
      }
    }
  }
  return n;
}

Status receive_exact_fds(int fd, void* out, std::size_t size, std::size_t* received,
                         std::vector<int>* fds) {
  auto* p = static_cast<std::uint8_t*>(out);
  std::size_t got = 0;
  Status status;
  while (got < size) {
    ssize_t n = receive_some(fd, p + got, size - got, fds);
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

}  // namespace

Status receive_exact(int fd, void* out, std::size_t size, std::size_t* received) {
  return receive_exact_fds(fd, out, size, received, nullptr);
}

Status send_frame(int fd, std::span<const std::uint8_t> body, int pass_fd) {
  std::uint32_t length = static_cast<std::uint32_t>(body.size());
  std::vector<std::uint8_t> frame(sizeof(length) + body.size());
  std::memcpy(frame.data(), &length, sizeof(length));
  if (!body.empty()) std::memcpy(frame.data() + sizeof(length), body.data(), body.size());
  std::size_t sent = 0;
  if (pass_fd >= 0) {
    // The descriptor rides on the frame's first bytes (SCM_RIGHTS); the rest goes as usual.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec io{frame.data(), frame.size()};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    ssize_t n;
    do {
      n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return errno_status("send", errno);
    sent = static_cast<std::size_t>(n);
  }
  return send_all(fd, std::span(frame).subspan(sent));
}

Status receive_frame(int fd, std::size_t max_body, std::vector<std::uint8_t>* body,
                     std::vector<int>* fds) {
  std::uint32_t length = 0;
  std::size_t got = 0;
  GPUOPT_RETURN_IF_ERROR(receive_exact_fds(fd, &length, sizeof(length), &got, fds));
  if (length > max_body) {
    return invalid_argument(
        fmt::format("frame of {} bytes exceeds the limit of {} bytes", length, max_body));
  }
  // The buffer grows with the bytes that actually arrive (doubling from 64 KiB), so a peer that
  // declares a large frame and sends nothing more costs this process 64 KiB, not the declared
  // size.
  constexpr std::size_t kFirstChunk = std::size_t{64} << 10;
  body->clear();
  got = 0;
  Status status;
  while (got < length) {
    const std::size_t target = std::min<std::size_t>(length, std::max(kFirstChunk, got * 2));
    if (body->size() < target) body->resize(target);
    ssize_t n = receive_some(fd, body->data() + got, target - got, fds);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = errno_status("receive", errno);
      break;
    }
    if (n == 0) {
      status = invalid_argument(
          fmt::format("truncated message: the peer closed after {} of {} body bytes", got, length));
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  body->resize(got);
  if (!status.ok() && status.code() != StatusCode::kInvalidArgument) {
    return status.with_context(fmt::format("frame body ({} of {} bytes)", got, length));
  }
  return status;
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
