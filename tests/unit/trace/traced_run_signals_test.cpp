// SIGTERM/SIGHUP to gpuopt while it traces a command: the command gets the signal too (it must not
// be left running, orphaned), run_traced reports what it forwarded; outputs are checked up front.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "gpuopt/trace/traced_run.hpp"

namespace gpuopt::trace {
namespace {

namespace fs = std::filesystem;

class TracedRunSignals : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpuopt_trace_signals_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A test binary started under nohup (or in the background by a non-interactive shell) has
    // the signal ignored, which run_traced keeps ignored by design: start from the default.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    ASSERT_EQ(sigaction(GetParam(), &default_action, &inherited_), 0);
  }
  void TearDown() override {
    sigaction(GetParam(), &inherited_, nullptr);
    fs::remove_all(dir_);
  }
  fs::path dir_;
  struct sigaction inherited_ {};
};

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST_P(TracedRunSignals, SignalToTheTracerReachesTheCommand) {
  const int signal_number = GetParam();
  const fs::path pid_file = dir_ / "pid";
  TracedRunOptions options;
  // exec: the pid written is the long-running program's own.
  options.command = {"sh", "-c",
                     "echo $$ > '" + pid_file.string() + ".tmp' && mv '" + pid_file.string() +
                         ".tmp' '" + pid_file.string() + "' && exec sleep 60"};
  options.injection_library = "/nonexistent/libgpuopt_trace_inject.so";
  auto running = std::async(std::launch::async, [&] { return run_traced(options); });

  pid_t child = 0;
  for (int i = 0; i < 500 && child == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream in(pid_file);
    in >> child;
  }
  ASSERT_GT(child, 0) << "the command did not start";
  ASSERT_TRUE(alive(child));
  // Sent to this process, as a service manager or a closing terminal would send it to gpuopt.
  ASSERT_EQ(::kill(::getpid(), signal_number), 0);
  ASSERT_EQ(running.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "run_traced did not return after the signal";
  auto run = running.get();
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->forwarded_signal, signal_number);
  EXPECT_EQ(run->exit_status, 128 + signal_number);  // sleep died of the forwarded signal
  EXPECT_FALSE(alive(child)) << "the traced command is still running";
  // Outside a run the signal is back to its previous disposition.
  struct sigaction current {};
  ASSERT_EQ(sigaction(signal_number, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
}

INSTANTIATE_TEST_SUITE_P(TermAndHup, TracedRunSignals, ::testing::Values(SIGTERM, SIGHUP));

TEST(CheckOutputPath, AcceptsWritableAndRefusesTheRestByName) {
  const fs::path dir = fs::temp_directory_path() / ("gpuopt_trace_out_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_TRUE(check_output_path((dir / "new.json").string()).ok());
  std::ofstream(dir / "old.json") << "{}";
  EXPECT_TRUE(check_output_path((dir / "old.json").string()).ok());

  auto missing_dir = check_output_path((dir / "no/such/dir/t.json").string());
  EXPECT_EQ(missing_dir.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing_dir.message().find("does not exist"), std::string::npos);

  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  auto fifo = check_output_path((dir / "fifo").string());
  EXPECT_EQ(fifo.message(), (dir / "fifo").string() + " is a FIFO, not a regular file");
  auto directory = check_output_path(dir.string());
  EXPECT_NE(directory.message().find("is a directory"), std::string::npos);
  auto device = check_output_path("/dev/null");
  EXPECT_NE(device.message().find("character device"), std::string::npos);
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir / "locked");
    fs::permissions(dir / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_EQ(check_output_path((dir / "locked/t.json").string()).code(),
              StatusCode::kPermissionDenied);
    fs::permissions(dir / "locked", fs::perms::owner_all);
  }
  fs::remove_all(dir);
}

TEST(TracedRunRecords, AFifoInTheRecordDirectoryIsSkippedNotRead) {
  TracedRunOptions options;
  options.command = {"sh", "-c",
                     "mkfifo \"$GPUOPT_TRACE_RECORD_DIR/records-1.json\" "
                     "\"$GPUOPT_TRACE_RECORD_DIR/error-2.txt\""};
  options.injection_library = "/nonexistent/libgpuopt_trace_inject.so";
  auto running = std::async(std::launch::async, [&] { return run_traced(options); });
  ASSERT_EQ(running.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "run_traced blocked reading a FIFO the command left";
  auto run = running.get();
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->exit_status, 0);
  EXPECT_FALSE(run->trace.has_value());
  ASSERT_EQ(run->warnings.size(), 2u);
  EXPECT_NE(run->warnings[0].find("is not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt::trace
