// libFuzzer target: the vector server protocol's request and reply parsers (ingest and query
// messages) on arbitrary bytes.
// A body that parses must re-encode to the same bytes (the format has one spelling per message).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "gpuopt/vector/ingest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gpuopt::vector;
  std::span<const std::uint8_t> body(data, size);
  auto request = parse_request(body);
  if (request.ok()) {
    if (request->op == IngestOp::kQuery) {
      if (request->queries.size() != request->rows * request->dim || !request->ids.empty()) {
        std::abort();
      }
    } else if (request->ids.size() != request->rows) {
      std::abort();
    }
    auto again = encode_request(*request);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  }
  auto reply = parse_reply(body);
  if (reply.ok()) {
    auto again = encode_reply(*reply);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  }
  (void)is_ingest_shm_name(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
