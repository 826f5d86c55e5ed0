// run_subprocess: exit codes, captured output, timeouts and start failures.
#include "gpuopt/core/subprocess.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpuopt {
namespace {

namespace fs = std::filesystem;

class SubprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpuopt_subprocess_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string read(const std::string& name) {
    std::ifstream in(dir_ / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::string path(const std::string& name) { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(SubprocessTest, CapturesOutputAndExitCode) {
  auto result = run_subprocess({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, path("o"),
                               path("e"), std::chrono::seconds(10));
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->exit_code, 7);
  EXPECT_FALSE(result->timed_out);
  EXPECT_EQ(read("o"), "out\n");
  EXPECT_EQ(read("e"), "err\n");
}

TEST_F(SubprocessTest, KillsTheWholeGroupPastTheLimit) {
  auto result = run_subprocess({"/bin/sh", "-c", "sleep 30 & sleep 30; echo never"}, path("o"),
                               path("e"), std::chrono::milliseconds(300));
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->timed_out);
  EXPECT_EQ(result->signal, SIGTERM);
  EXPECT_LT(result->seconds, 10.0);
  EXPECT_EQ(read("o"), "");
}

TEST_F(SubprocessTest, MissingProgramIsExit127WithMessage) {
  auto result =
      run_subprocess({"/nonexistent/gpuopt-x"}, path("o"), path("e"), std::chrono::seconds(5));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 127);
  EXPECT_NE(read("e").find("/nonexistent/gpuopt-x"), std::string::npos);
}

TEST_F(SubprocessTest, UnwritableOutputIsAStatus) {
  auto result =
      run_subprocess({"/bin/true"}, "/nonexistent-dir/o", path("e"), std::chrono::seconds(5));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("/nonexistent-dir/o"), std::string::npos);
}

TEST(CurrentExecutable, IsThisTestBinary) {
  auto self = current_executable();
  ASSERT_TRUE(self.ok());
  EXPECT_NE(self->find("unit_core"), std::string::npos);
}

}  // namespace
}  // namespace gpuopt
