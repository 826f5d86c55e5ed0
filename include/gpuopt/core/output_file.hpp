// Files a command writes for its user: checked before any work starts (so a typo in a path does
// not lose a long run) and replaced atomically (a reader never sees half a file, and an
// interrupted run leaves the previous file in place).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include "gpuopt/core/status.hpp"

namespace gpuopt {

// OK when a regular file can be created or replaced at `path`: its directory exists and is
// writable, and anything already there is a writable regular file. INVALID_ARGUMENT for an empty
// path, a missing directory or something other than a regular file at the path (a directory, a
// FIFO, a device); PERMISSION_DENIED when it cannot be written. Each message names the path.
Status check_output_path(const std::string& path);

// Writes `contents` to a new file beside `path` (created with mode 0666 less the umask), flushes it
// to disk and renames it over `path`. On any error the temporary file is removed and `path` is left
// as it was.
Status write_file_atomically(const std::string& path, std::string_view contents);

// The same for output written as a stream (a long trace need not be held in memory): `produce`
// writes into the temporary file; a Status it returns that is not OK (or a stream that failed)
// removes the temporary file and leaves `path` as it was.
Status write_file_atomically(const std::string& path,
                             const std::function<Status(std::ostream&)>& produce);

}  // namespace gpuopt
