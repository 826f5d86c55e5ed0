// Socket I/O shared by the ingest server and client: whole-buffer send/receive with EINTR
// retried and timeouts surfaced as DEADLINE_EXCEEDED, and the u32 length-prefixed framing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::vector::detail {

// Sends all of `bytes` (MSG_NOSIGNAL: a vanished peer is an error, not SIGPIPE).
Status send_all(int fd, std::span<const std::uint8_t> bytes);
// Reads exactly `size` bytes; `*received` gets how many arrived (also on error). A clean EOF
// before the first byte is NOT_FOUND ("closed"), EOF later is INVALID_ARGUMENT (truncated).
Status receive_exact(int fd, void* out, std::size_t size, std::size_t* received);
// One frame: u32 length then the body; bodies over `max_body` are refused before reading them,
// and the body buffer grows only as its bytes arrive. `pass_fd` (when >= 0) travels with the
// frame as SCM_RIGHTS. Descriptors that arrive with a frame go to `fds` (the caller closes
// them), or are closed here when `fds` is null.
Status send_frame(int fd, std::span<const std::uint8_t> body, int pass_fd = -1);
Status receive_frame(int fd, std::size_t max_body, std::vector<std::uint8_t>* body,
                     std::vector<int>* fds = nullptr);
// SO_RCVTIMEO / SO_SNDTIMEO.
Status set_timeouts(int fd, int seconds);
// The current errno as a Status naming `what`: NOT_FOUND, PERMISSION_DENIED or UNAVAILABLE.
Status errno_error(const std::string& what);

}  // namespace gpuopt::vector::detail
