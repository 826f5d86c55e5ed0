// CUPTI injection entry point: the CUDA driver calls InitializeInjection during cuInit in every
// process started with CUDA_INJECTION64_PATH set to this library. It starts a Tracer and, at exit,
// writes records-<pid>.json (or error-<pid>.txt) into $GPUOPT_TRACE_RECORD_DIR.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "gpuopt/trace/record_file.hpp"
#include "gpuopt/trace/traced_run.hpp"
#include "gpuopt/trace/tracer.hpp"

namespace {

gpuopt::trace::Tracer* g_tracer = nullptr;  // leaked: must outlive static destructors at exit
std::string* g_record_directory = nullptr;

void write_error(const std::string& message) {
  if (g_record_directory == nullptr) return;
  std::ofstream out(*g_record_directory + "/error-" + std::to_string(getpid()) + ".txt");
  out << message << "\n";
}

void write_records_at_exit() {
  try {
    if (g_tracer == nullptr || !g_tracer->active()) return;
    auto data = g_tracer->stop();
    if (!data.ok()) {
      write_error(data.status().to_string());
      return;
    }
    const std::string path = *g_record_directory + "/records-" + std::to_string(getpid()) + ".json";
    gpuopt::Status written = gpuopt::trace::write_record_file(*data, path);
    if (!written.ok()) write_error(written.to_string());
  } catch (const std::exception& error) {
    write_error(std::string("exception while writing records: ") + error.what());
  } catch (...) {
    write_error("unknown exception while writing records");
  }
}

}  // namespace

// Returns 1 on every path: a tracing failure must never stop the traced program.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::atomic<bool> initialized{false};
  if (initialized.exchange(true)) return 1;
  try {
    // Loaded by the driver into another process: its environment is this library's only input.
    const char* directory = std::getenv(gpuopt::trace::kRecordDirEnv);
    if (directory == nullptr || *directory == '\0') {
      std::fprintf(stderr, "gpuopt trace: injection library loaded without %s; not tracing\n",
                   gpuopt::trace::kRecordDirEnv);
      return 1;
    }
    g_record_directory = new std::string(directory);
    gpuopt::trace::TracerOptions options;
    options.require_device = false;  // inside cuInit: the runtime must not be called back
    const char* driver = std::getenv(gpuopt::trace::kDriverApiEnv);
    options.driver_api = driver != nullptr && std::string(driver) == "1";
    g_tracer = new gpuopt::trace::Tracer(options);
    gpuopt::Status started = g_tracer->start();
    if (!started.ok()) {
      write_error(started.to_string());
      return 1;
    }
    // Registered after the CUDA runtime's own handler, so it runs first (atexit is LIFO) while
    // the context still exists.
    std::atexit(write_records_at_exit);
  } catch (const std::exception& error) {
    write_error(std::string("exception while starting: ") + error.what());
  } catch (...) {
    write_error("unknown exception while starting");
  }
  return 1;
}
