// run_subprocess: fork/exec with redirected output, a deadline, and process-group cleanup.
#include "gpuopt/core/subprocess.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace gpuopt {

StatusOr<SubprocessResult> run_subprocess(const std::vector<std::string>& argv,
                                          const std::string& stdout_path,
                                          const std::string& stderr_path,
                                          std::chrono::milliseconds limit) {
  if (argv.empty()) return invalid_argument("run_subprocess: empty command");
  int out_fd = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) {
    return unavailable(fmt::format("cannot write {}: {}", stdout_path, std::strerror(errno)));
  }
  int err_fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err_fd < 0) {
    ::close(out_fd);
    return unavailable(fmt::format("cannot write {}: {}", stderr_path, std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);

  auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out_fd);
    ::close(err_fd);
    return unavailable(fmt::format("fork failed: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: own process group so a timeout can stop everything it started.
    ::setpgid(0, 0);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::execv(args[0], args.data());
    dprintf(STDERR_FILENO, "gpuopt: cannot start %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out_fd);
  ::close(err_fd);

  SubprocessResult result;
  int status = 0;
  bool terminated = false;
  auto term_sent = std::chrono::steady_clock::time_point{};
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      return internal_error(fmt::format("waitpid failed: {}", std::strerror(errno)));
    }
    auto now = std::chrono::steady_clock::now();
    if (!terminated && now - start > limit) {
      result.timed_out = true;
      terminated = true;
      term_sent = now;
      ::kill(-pid, SIGTERM);
    } else if (terminated && now - term_sent > std::chrono::seconds(5)) {
      ::kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

StatusOr<std::string> current_executable() {
  char buffer[4096];
  ssize_t length = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (length <= 0) {
    return unavailable(fmt::format("cannot read /proc/self/exe: {}", std::strerror(errno)));
  }
  return std::string(buffer, static_cast<std::size_t>(length));
}

}  // namespace gpuopt
