// doctor --root on a recorded tree whose files were replaced by FIFOs: the scan must finish
// promptly (nothing blocks waiting for a writer) and name what it could not read.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/deadline.hpp"
#include "common/test_support.hpp"
#include "gpuopt/doctor/doctor.hpp"

namespace gpuopt::doctor {
namespace {

namespace fs = std::filesystem;
using ::gpuopt::testing::call_with_deadline;
using ::gpuopt::testing::make_fifo;

class DoctorSpecialFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gpuopt_doctor_fifo_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::copy(gpuopt::testing::test_data_dir() + "/doctor/zombie-holding-gpu", root_,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
  void TearDown() override { fs::remove_all(root_); }

  StatusOr<Report> collect_with_deadline() {
    Options options;
    options.root = root_.string();
    auto report = call_with_deadline([options] { return collect(options); });
    if (!report) return internal_error("doctor --root blocked on a FIFO");
    return std::move(*report);
  }
  fs::path root_;
};

TEST_F(DoctorSpecialFiles, EveryFileAFifoFinishesPromptly) {
  int replaced = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root_)) {
    if (entry.is_regular_file() && !entry.is_symlink()) {
      ASSERT_TRUE(make_fifo(entry.path())) << entry.path();
      ++replaced;
    }
  }
  ASSERT_GT(replaced, 30);
  auto report = collect_with_deadline();
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->processes.processes.empty());  // no stat file could be read
}

TEST_F(DoctorSpecialFiles, FifoConfigSpaceIsNamedAndTheRestStillRead) {
  const fs::path config = root_ / "sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/config";
  ASSERT_TRUE(fs::exists(config));
  ASSERT_TRUE(make_fifo(config));
  ASSERT_TRUE(make_fifo(root_ / "proc/uptime"));
  auto report = collect_with_deadline();
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  ASSERT_EQ(report->pci.devices.size(), 1u);
  const auto& gpu = report->pci.devices[0];
  EXPECT_FALSE(gpu.config.has_value());
  EXPECT_NE(gpu.path.front().config_error.find("config: not a regular file"), std::string::npos)
      << gpu.path.front().config_error;
  EXPECT_FALSE(report->uptime_s.has_value());
  // The process table is untouched and still read.
  EXPECT_FALSE(report->processes.processes.empty());
}

}  // namespace
}  // namespace gpuopt::doctor
