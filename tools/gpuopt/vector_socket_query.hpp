// `gpuopt vector query --socket PATH`: asks a running `gpuopt vector serve` instead of opening the
// store (vector_serve_command.cpp); vector_command.cpp hands its arguments over.
#pragma once

#include <cstddef>
#include <string>

#include "output_options.hpp"

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
  OutputOptions out;  // --json, -o/--output
};

// Exit code: kExitOk, or kExitErrors with the error on stderr (and as JSON with --json, written
// where the result would have gone).
int run_socket_query(const SocketQueryArgs& args);

}  // namespace gpuopt::cli
