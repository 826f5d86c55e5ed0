// `gpuopt trace -- CMD`: fork/exec with the injection library in the environment, NVML sampling on
// a thread while the command runs, then the per-process record files merged into one trace.
#include "gpuopt/trace/traced_run.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/platform/nvml.hpp"
#include "gpuopt/trace/record_file.hpp"

namespace gpuopt::trace {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInjectionFileName = "libgpuopt_trace_inject.so";

std::uint64_t realtime_ns() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ull +
         static_cast<std::uint64_t>(now.tv_nsec);
}

// CUDA ordinal -> NVML device, matched by PCI bus id so CUDA_VISIBLE_DEVICES and
// CUDA_DEVICE_ORDER cannot pair the wrong GPUs.
struct SampledDevice {
  std::uint32_t cuda_ordinal = 0;
  platform::NvmlDevice nvml;
};

StatusOr<std::vector<SampledDevice>> devices_to_sample() {
  GPUOPT_ASSIGN_OR_RETURN(const platform::Nvml* nvml, platform::Nvml::instance());
  std::vector<SampledDevice> devices;
#if GPUOPT_CUDA
  auto count = cuda_device_count();
  if (!count.ok()) return count.status();
  for (int ordinal = 0; ordinal < *count; ++ordinal) {
    char bus_id[32] = {};
    GPUOPT_CUDA_TRY(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), ordinal));
    GPUOPT_ASSIGN_OR_RETURN(platform::NvmlDevice device, nvml->device_by_pci_bus_id(bus_id));
    devices.push_back({static_cast<std::uint32_t>(ordinal), device});
  }
#else
  GPUOPT_ASSIGN_OR_RETURN(unsigned count, nvml->device_count());
  for (unsigned index = 0; index < count; ++index) {
    GPUOPT_ASSIGN_OR_RETURN(platform::NvmlDevice device, nvml->device_by_index(index));
    devices.push_back({index, device});
  }
#endif
  if (devices.empty()) return unavailable("no GPU to sample");
  return devices;
}

class UtilizationSampler {
 public:
  UtilizationSampler(std::vector<SampledDevice> devices, double period_s)
      : devices_(std::move(devices)),
        period_(std::chrono::microseconds(static_cast<long>(std::max(0.01, period_s) * 1e6))) {
    thread_ = std::thread([this] { loop(); });
  }
  ~UtilizationSampler() { finish(); }

  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<UtilizationSample> samples() const { return samples_; }
  std::optional<std::string> error() const { return error_; }

 private:
  void loop() {
    auto nvml = platform::Nvml::instance();
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      for (const SampledDevice& device : devices_) {
        auto utilization = (*nvml)->utilization(device.nvml);
        if (utilization.ok()) {
          samples_.push_back({realtime_ns(), device.cuda_ordinal, utilization->gpu_percent});
        } else if (!error_) {
          error_ = utilization.status().to_string();
        }
      }
      wake_.wait_for(lock, period_, [this] { return stopping_; });
    }
  }

  std::vector<SampledDevice> devices_;
  std::chrono::microseconds period_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<UtilizationSample> samples_;
  std::optional<std::string> error_;
  std::thread thread_;
};

// Restores SIGINT/SIGQUIT on scope exit: while the command runs, Ctrl-C should end the command
// (same process group) and leave gpuopt alive to write what it traced.
class IgnoreInterrupts {
 public:
  IgnoreInterrupts() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGINT, &ignore, &old_int_);
    sigaction(SIGQUIT, &ignore, &old_quit_);
  }
  ~IgnoreInterrupts() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGQUIT, &old_quit_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_quit_ {};
};

// While the command runs, SIGTERM and SIGHUP sent to gpuopt are passed on to it (a service manager
// or a closed terminal means the traced program, not only gpuopt): without this gpuopt died and
// left the program running, orphaned. The handler only calls kill() and records the signal.
// Lock-free atomics, not volatile sig_atomic_t: the signal may be delivered on any thread of the
// process, so the handler and the thread running the command share these across threads.
std::atomic<pid_t> forward_to_pid{0};
std::atomic<int> forwarded_signal{0};
static_assert(std::atomic<pid_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handler may only touch lock-free atomics");

void forward_signal(int signal_number) {
  const int saved_errno = errno;
  forwarded_signal.store(signal_number);
  const pid_t child = forward_to_pid.load();
  if (child > 0) kill(child, signal_number);
  errno = saved_errno;
}

// Installed before fork, so no signal is missed; one that arrives before the child's pid is known
// is recorded and passed on by forward_to().
class ForwardTerminationSignals {
 public:
  ForwardTerminationSignals() {
    forwarded_signal.store(0);
    forward_to_pid.store(0);
    struct sigaction forward {};
    forward.sa_handler = forward_signal;
    sigemptyset(&forward.sa_mask);
    forward.sa_flags = 0;  // no SA_RESTART: waitpid sees EINTR and loops
    // A signal gpuopt was told to ignore (nohup) stays ignored, by gpuopt and by the command.
    sigaction(SIGTERM, nullptr, &old_term_);
    sigaction(SIGHUP, nullptr, &old_hup_);
    if (old_term_.sa_handler != SIG_IGN) sigaction(SIGTERM, &forward, nullptr);
    if (old_hup_.sa_handler != SIG_IGN) sigaction(SIGHUP, &forward, nullptr);
  }
  // In the child before exec: the dispositions gpuopt was started with.
  void restore() const {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGHUP, &old_hup_, nullptr);
  }
  ~ForwardTerminationSignals() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGHUP, &old_hup_, nullptr);
    forward_to_pid.store(0);
  }
  void forward_to(pid_t child) {
    forward_to_pid.store(child);
    if (const int pending = forwarded_signal.load(); pending != 0) kill(child, pending);
  }
  int signal() const { return forwarded_signal.load(); }

 private:
  struct sigaction old_term_ {};
  struct sigaction old_hup_ {};
};

}  // namespace

Status check_output_path(const std::string& path) {
  if (path.empty()) return invalid_argument("the output path is empty");
  const fs::path file(path);
  std::error_code error;
  const fs::path directory = file.has_parent_path() ? file.parent_path() : fs::path(".");
  const auto directory_status = fs::status(directory, error);
  if (error || !fs::is_directory(directory_status)) {
    return invalid_argument(
        fmt::format("{}: directory {} does not exist", path, directory.string()));
  }
  const auto file_status = fs::status(file, error);
  if (!error && fs::exists(file_status)) {
    if (!fs::is_regular_file(file_status)) {
      struct stat st {};
      std::string what = "not a regular file";
      if (::stat(path.c_str(), &st) == 0) {
        what = fs::is_directory(file_status) ? "a directory"
               : S_ISFIFO(st.st_mode)        ? "a FIFO"
               : S_ISSOCK(st.st_mode)        ? "a socket"
               : S_ISCHR(st.st_mode)         ? "a character device"
               : S_ISBLK(st.st_mode)         ? "a block device"
                                             : what;
      }
      return invalid_argument(fmt::format("{} is {}, not a regular file", path, what));
    }
    if (access(path.c_str(), W_OK) != 0) {
      return permission_denied(fmt::format("{}: not writable: {}", path, std::strerror(errno)));
    }
  } else if (access(directory.c_str(), W_OK | X_OK) != 0) {
    return permission_denied(fmt::format("{}: cannot create a file in {}: {}", path,
                                         directory.string(), std::strerror(errno)));
  }
  return ok_status();
}

StatusOr<std::string> find_injection_library(const std::string& executable_path,
                                             const std::string& override_path) {
  std::vector<std::string> tried;
  if (!override_path.empty()) {
    if (access(override_path.c_str(), R_OK) == 0) return fs::absolute(override_path).string();
    return not_found(fmt::format("{} is not a readable file", override_path));
  }
  const fs::path directory = fs::path(executable_path).parent_path();
  for (const fs::path& candidate :
       {directory / kInjectionFileName, directory / ".." / "bin" / kInjectionFileName,
        directory / ".." / "lib" / kInjectionFileName,
        // The build tree: tools/gpuopt/gpuopt and bin/libgpuopt_trace_inject.so.
        directory / ".." / ".." / "bin" / kInjectionFileName}) {
    if (access(candidate.c_str(), R_OK) == 0) return fs::weakly_canonical(candidate).string();
    tried.push_back(candidate.lexically_normal().string());
  }
  std::string list;
  for (const std::string& path : tried) list += (list.empty() ? "" : ", ") + path;
  return not_found(fmt::format("{} not found (tried {})", kInjectionFileName, list));
}

StatusOr<TracedRun> run_traced(const TracedRunOptions& options) {
  if (options.command.empty()) return invalid_argument("no command to trace");
  if (options.injection_library.empty() || options.injection_library[0] != '/') {
    return invalid_argument("the injection library path must be absolute");
  }
  char directory_template[] = "/tmp/gpuopt-trace-XXXXXX";
  if (mkdtemp(directory_template) == nullptr) {
    return unavailable(
        fmt::format("cannot create a record directory in /tmp: {}", std::strerror(errno)));
  }
  const std::string record_directory = directory_template;

  TracedRun run;
  std::optional<UtilizationSampler> sampler;
  if (auto devices = devices_to_sample(); devices.ok()) {
    sampler.emplace(std::move(*devices), options.nvml_period_s);
  } else {
    run.nvml_unavailable_reason = devices.status().to_string();
  }

  // The child reports an exec failure through a close-on-exec pipe: success closes it unread.
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
    return unavailable(fmt::format("pipe2 failed: {}", std::strerror(errno)));
  }
  std::vector<char*> argv;
  for (const std::string& argument : options.command)
    argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);

  // The child's environment is built before fork: the sampler thread runs, so the child should
  // only exec.
  const std::vector<std::pair<std::string, std::string>> overrides = {
      {"CUDA_INJECTION64_PATH", options.injection_library},
      {kRecordDirEnv, record_directory},
      {kDriverApiEnv, options.driver_api ? "1" : "0"}};
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    bool replaced = false;
    for (const auto& [name, value] : overrides) {
      replaced |= variable.starts_with(name + "=");
    }
    if (!replaced) environment.emplace_back(variable);
  }
  for (const auto& [name, value] : overrides) environment.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);

  std::optional<IgnoreInterrupts> ignore_interrupts;
  ignore_interrupts.emplace();
  std::optional<ForwardTerminationSignals> forward_signals;
  forward_signals.emplace();
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    close(exec_pipe[0]);
    close(exec_pipe[1]);
    return unavailable(fmt::format("fork failed: {}", std::strerror(errno)));
  }
  if (child == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    forward_signals->restore();
    // Should gpuopt die without forwarding (SIGKILL), the command is told rather than orphaned.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) raise(SIGTERM);
    close(exec_pipe[0]);
    execvpe(argv[0], argv.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] ssize_t written = write(exec_pipe[1], &error, sizeof(error));
    _exit(127);
  }
  forward_signals->forward_to(child);
  close(exec_pipe[1]);
  int exec_error = 0;
  ssize_t got;
  do {
    got = read(exec_pipe[0], &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  close(exec_pipe[0]);

  int wait_status = 0;
  while (waitpid(child, &wait_status, 0) < 0) {
    if (errno != EINTR) {
      run.warnings.push_back(fmt::format("waitpid failed: {}", std::strerror(errno)));
      break;
    }
  }
  run.forwarded_signal = forward_signals->signal();
  forward_signals.reset();
  ignore_interrupts.reset();
  if (sampler) {
    sampler->finish();
    run.nvml_samples = sampler->samples();
    if (auto error = sampler->error(); error && run.nvml_samples.empty()) {
      run.nvml_unavailable_reason = *error;
    }
  }
  if (got == static_cast<ssize_t>(sizeof(exec_error))) {
    std::error_code ignored;
    fs::remove_all(record_directory, ignored);
    return not_found(
        fmt::format("cannot run '{}': {}", options.command[0], std::strerror(exec_error)));
  }
  if (WIFEXITED(wait_status)) {
    run.exit_status = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    run.exit_status = 128 + WTERMSIG(wait_status);
    run.warnings.push_back(
        fmt::format("'{}' was killed by signal {} ({}); processes that did not "
                    "exit normally wrote no records",
                    options.command[0], WTERMSIG(wait_status), strsignal(WTERMSIG(wait_status))));
  }

  std::vector<TraceData> parts;
  std::error_code list_error;
  for (const auto& entry : fs::directory_iterator(record_directory, list_error)) {
    const std::string name = entry.path().filename().string();
    // The traced program can write anything here: a FIFO would block the read below.
    std::error_code type_error;
    if (!entry.is_regular_file(type_error)) {
      run.warnings.push_back(
          fmt::format("{} is not a regular file; skipped", entry.path().string()));
      continue;
    }
    if (name.starts_with("records-") && name.ends_with(".json")) {
      auto part = read_record_file(entry.path().string());
      if (part.ok()) {
        parts.push_back(std::move(*part));
      } else {
        run.warnings.push_back(part.status().to_string());
      }
    } else if (name.starts_with("error-")) {
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      std::string message = text.str();
      while (!message.empty() && message.back() == '\n') message.pop_back();
      run.warnings.push_back(
          fmt::format("tracing process {}: {}", name.substr(6, name.size() - 10), message));
    }
  }
  std::error_code ignored;
  fs::remove_all(record_directory, ignored);
  if (!parts.empty()) run.trace = merge_traces(std::move(parts));
  return run;
}

}  // namespace gpuopt::trace
