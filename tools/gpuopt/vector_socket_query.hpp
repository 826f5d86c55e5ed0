// `gpuopt vector query --socket PATH`: asks a running `gpuopt vector serve` instead of opening the
// store (vector_serve_command.cpp); vector_command.cpp hands its arguments over.
#pragma once

#include <cstddef>
#include <string>

namespace gpuopt::cli {

struct SocketQueryArgs {
  std::string socket;
  std::string file;
  std::string collection;
  std::size_t k = 10;
  std::string index = "exact";
  std::size_t nprobe = 8;
  std::string where;
  std::string engine = "cpu";
  std::size_t limit = 0;
  int repeat = 1;
  bool show_all = false;
  bool json = false;
};

// Exit code: kExitOk, or kExitErrors with the error on stderr (and as JSON with --json).
int run_socket_query(const SocketQueryArgs& args);

}  // namespace gpuopt::cli
