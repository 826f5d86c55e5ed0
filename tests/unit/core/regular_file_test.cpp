// open_regular_file / read_regular_file: regular files are read; FIFOs, sockets, devices and
// directories are refused by name and promptly (a FIFO without a writer must not block).
#include "gpuopt/core/regular_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/deadline.hpp"

namespace gpuopt {
namespace {

namespace fs = std::filesystem;
using ::gpuopt::testing::call_with_deadline;
using ::gpuopt::testing::make_fifo;

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpuopt_regular_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(RegularFileTest, ReadsARegularFileUpToTheLimit) {
  std::ofstream(dir_ / "text") << "hello world";
  auto whole = read_regular_file(dir_ / "text", 1024);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(*whole, "hello world");
  auto head = read_regular_file(dir_ / "text", 5);
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, "hello");
  // The descriptor is blocking again: O_NONBLOCK was only for the open.
  auto fd = open_regular_file(dir_ / "text");
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
}

TEST_F(RegularFileTest, MissingFileIsNotFound) {
  auto result = read_regular_file(dir_ / "absent", 16);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_NE(result.status().message().find("absent"), std::string::npos);
  EXPECT_TRUE(refuse_special_file(dir_ / "absent").ok());
}

TEST_F(RegularFileTest, FifoIsRefusedWithoutBlocking) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_TRUE(make_fifo(fifo));
  auto result = call_with_deadline([&] { return read_regular_file(fifo, 16); });
  ASSERT_TRUE(result.has_value()) << "reading a FIFO blocked";
  ASSERT_FALSE(result->ok());
  EXPECT_EQ(result->status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result->status().message(), fifo.string() + " is a FIFO, not a regular file");
  EXPECT_FALSE(refuse_special_file(fifo).ok());
}

TEST_F(RegularFileTest, DirectorySocketAndDeviceAreRefusedByType) {
  auto directory = read_regular_file(dir_, 16);
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("is a directory"), std::string::npos);

  const fs::path socket_path = dir_ / "socket";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  auto socket_result = read_regular_file(socket_path, 16);
  ::close(fd);
  ASSERT_FALSE(socket_result.ok());
  EXPECT_NE(socket_result.status().message().find("is a socket"), std::string::npos);

  auto device = call_with_deadline([] { return read_regular_file("/dev/zero", 16); });
  ASSERT_TRUE(device.has_value());
  ASSERT_FALSE(device->ok());
  EXPECT_NE(device->status().message().find("is a character device"), std::string::npos);
}

TEST_F(RegularFileTest, SymlinkFollowedOnlyWhenAllowed) {
  std::ofstream(dir_ / "target") << "x";
  fs::create_symlink(dir_ / "target", dir_ / "link");
  EXPECT_TRUE(read_regular_file(dir_ / "link", 16).ok());
  auto refused = read_regular_file(dir_ / "link", 16, {.follow_symlinks = false});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("symbolic link"), std::string::npos);
  // A link to a FIFO is judged by what it points at.
  ASSERT_TRUE(make_fifo(dir_ / "fifo"));
  fs::create_symlink(dir_ / "fifo", dir_ / "fifo_link");
  auto via_link = call_with_deadline([&] { return read_regular_file(dir_ / "fifo_link", 16); });
  ASSERT_TRUE(via_link.has_value());
  EXPECT_FALSE(via_link->ok());
}

}  // namespace
}  // namespace gpuopt
