// Output files: refused up front by what is at the path, replaced by rename (a new inode, nothing
// left behind).
#include "gpuopt/core/output_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpuopt {
namespace {

namespace fs = std::filesystem;

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gpuopt-output-file-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code error;
    fs::permissions(dir_, fs::perms::owner_all, error);
    fs::remove_all(dir_, error);
  }
  static std::string read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static ino_t inode(const fs::path& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return st.st_ino;
  }
  fs::path dir_;
};

TEST_F(OutputFileTest, WritesANewFile) {
  const fs::path path = dir_ / "out.json";
  ASSERT_TRUE(check_output_path(path.string()).ok());
  ASSERT_TRUE(write_file_atomically(path.string(), "{\"a\": 1}\n").ok());
  EXPECT_EQ(read(path), "{\"a\": 1}\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// Streamed output: what the producer writes replaces the file; a producer that fails (part way
// through) leaves the old file and no temporary, and its Status comes back.
TEST_F(OutputFileTest, StreamedOutputReplacesTheFileOrLeavesItAsItWas) {
  const fs::path path = dir_ / "trace.json";
  std::ofstream(path) << "old\n";
  ASSERT_TRUE(write_file_atomically(path.string(), [](std::ostream& out) {
                out << "streamed " << 42 << "\n";
                return ok_status();
              }).ok());
  EXPECT_EQ(read(path), "streamed 42\n");
  const Status failed = write_file_atomically(path.string(), [](std::ostream& out) {
    out << "half of it";
    return internal_error("the producer stopped");
  });
  EXPECT_EQ(failed.code(), StatusCode::kInternal);
  EXPECT_EQ(failed.message(), "the producer stopped");
  EXPECT_EQ(read(path), "streamed 42\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  const Status missing = write_file_atomically((dir_ / "no/such/x.json").string(),
                                               [](std::ostream&) { return ok_status(); });
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
}

TEST_F(OutputFileTest, ReplacesByRenameLeavingNoTemporaryFile) {
  const fs::path path = dir_ / "out.txt";
  std::ofstream(path) << "old contents that are longer than the new ones\n";
  const ino_t before = inode(path);
  ASSERT_TRUE(write_file_atomically(path.string(), "new\n").ok());
  EXPECT_EQ(read(path), "new\n");
  EXPECT_NE(inode(path), before);  // a new file took the name: readers never see a half-written one
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(OutputFileTest, RefusesWhatIsNotARegularFileOrCannotBeWritten) {
  const Status empty = check_output_path("");
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);

  const Status missing = check_output_path((dir_ / "no" / "such" / "x.json").string());
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("does not exist"), std::string::npos) << missing.message();

  const Status directory = check_output_path(dir_.string());
  EXPECT_EQ(directory.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(directory.message().find("is a directory"), std::string::npos) << directory.message();

  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const Status is_fifo = write_file_atomically(fifo.string(), "x");
  EXPECT_EQ(is_fifo.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(is_fifo.message().find("a FIFO"), std::string::npos) << is_fifo.message();

  if (geteuid() != 0) {  // root writes anywhere
    const fs::path locked = dir_ / "locked";
    fs::create_directory(locked);
    std::ofstream(locked / "kept.txt") << "kept\n";
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    const Status denied = write_file_atomically((locked / "kept.txt").string(), "lost\n");
    EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied) << denied.message();
    EXPECT_EQ(read(locked / "kept.txt"), "kept\n");
    fs::permissions(locked, fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace gpuopt
