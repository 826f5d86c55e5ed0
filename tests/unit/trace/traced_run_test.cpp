// run_traced without a GPU: the command's exit status comes back, record files a process leaves
// in the record directory are gathered (a shell stands in for the injected library), and failures
// to start are errors that name the command.
#include "gpuopt/trace/traced_run.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gpuopt/trace/record_file.hpp"
#include "trace_fixture.hpp"

namespace gpuopt::trace {
namespace {

namespace fs = std::filesystem;

TracedRunOptions shell(const std::string& script) {
  TracedRunOptions options;
  options.command = {"sh", "-c", script};
  options.injection_library = "/nonexistent/libgpuopt_trace_inject.so";
  return options;
}

TEST(TracedRun, PassesTheExitStatusThroughAndTracesNothing) {
  auto run = run_traced(shell("exit 7"));
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->exit_status, 7);
  EXPECT_FALSE(run->trace.has_value());
}

TEST(TracedRun, ChildSeesTheInjectionEnvironment) {
  auto run = run_traced(
      shell("test \"$CUDA_INJECTION64_PATH\" = /nonexistent/libgpuopt_trace_inject.so && "
            "test -d \"$GPUOPT_TRACE_RECORD_DIR\" && test -w \"$GPUOPT_TRACE_RECORD_DIR\""));
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_status, 0);
}

TEST(TracedRun, GathersRecordFilesAndErrorFiles) {
  const std::string fixture =
      (fs::temp_directory_path() / "gpuopt_traced_run_fixture.json").string();
  ASSERT_TRUE(write_record_file(testing::fixture_trace(), fixture).ok());
  // Two "processes" wrote records, a third reported a failure, and one left garbage.
  auto run =
      run_traced(shell("cp '" + fixture + "' \"$GPUOPT_TRACE_RECORD_DIR/records-11.json\" && " +
                       "cp '" + fixture + "' \"$GPUOPT_TRACE_RECORD_DIR/records-12.json\" && " +
                       "echo 'CUPTI said no' > \"$GPUOPT_TRACE_RECORD_DIR/error-13.txt\" && " +
                       "echo '{' > \"$GPUOPT_TRACE_RECORD_DIR/records-14.json\""));
  std::remove(fixture.c_str());
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_EQ(run->exit_status, 0);
  ASSERT_TRUE(run->trace.has_value());
  EXPECT_EQ(run->trace->records.size(), 2 * testing::fixture_trace().records.size());
  bool saw_error = false, saw_garbage = false;
  for (const std::string& warning : run->warnings) {
    saw_error |= warning.find("process 13: CUPTI said no") != std::string::npos;
    saw_garbage |= warning.find("records-14.json") != std::string::npos;
  }
  EXPECT_TRUE(saw_error);
  EXPECT_TRUE(saw_garbage);
}

TEST(TracedRun, MissingCommandIsNotFound) {
  TracedRunOptions options;
  options.command = {"/nonexistent/command", "--flag"};
  options.injection_library = "/nonexistent/lib.so";
  auto run = run_traced(options);
  EXPECT_EQ(run.status().code(), StatusCode::kNotFound);
  EXPECT_NE(run.status().message().find("/nonexistent/command"), std::string::npos);
}

TEST(TracedRun, RejectsBadOptions) {
  EXPECT_EQ(run_traced(TracedRunOptions{}).status().code(), StatusCode::kInvalidArgument);
  TracedRunOptions relative = shell("true");
  relative.injection_library = "libgpuopt_trace_inject.so";
  EXPECT_EQ(run_traced(relative).status().code(), StatusCode::kInvalidArgument);
}

TEST(TracedRun, KilledCommandReports128PlusSignal) {
  auto run = run_traced(shell("kill -TERM $$"));
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->exit_status, 128 + 15);
  EXPECT_FALSE(run->warnings.empty());
}

TEST(FindInjectionLibrary, OverrideAndSearchOrder) {
  const fs::path root = fs::temp_directory_path() / "gpuopt_find_injection";
  fs::remove_all(root);
  fs::create_directories(root / "bin");
  fs::create_directories(root / "tools");
  std::ofstream(root / "bin" / "libgpuopt_trace_inject.so") << "x";
  // Next to the executable.
  auto found = find_injection_library((root / "bin" / "gpuopt").string());
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(*found, (root / "bin" / "libgpuopt_trace_inject.so").string());
  // ../bin from tools/.
  found = find_injection_library((root / "tools" / "gpuopt").string());
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, (root / "bin" / "libgpuopt_trace_inject.so").string());
  // Nowhere: the message lists the places tried.
  auto missing = find_injection_library("/nonexistent/dir/gpuopt");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/bin/libgpuopt_trace_inject.so"),
            std::string::npos)
      << missing.status().message();
  // The override wins, and a bad override is reported rather than silently ignored.
  const std::string library = (root / "bin" / "libgpuopt_trace_inject.so").string();
  found = find_injection_library("/nonexistent/dir/gpuopt", library);
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(*found, library);
  auto bad = find_injection_library((root / "bin" / "gpuopt").string(), "/nonexistent.so");
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("/nonexistent.so"), std::string::npos);
  fs::remove_all(root);
}

}  // namespace
}  // namespace gpuopt::trace
