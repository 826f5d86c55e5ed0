// Ingest protocol encoding: round trips, and every malformed body rejected with a message that
// names what was wrong (truncation at every length, bad magic, wrong sizes, bad shm names).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gpuopt/vector/ingest.hpp"

namespace gpuopt::vector {
namespace {

IngestRequest shm_request(std::uint64_t rows) {
  IngestRequest request;
  request.op = IngestOp::kUpsert;
  request.payload = IngestPayload::kShm;
  request.collection = "default";
  request.dim = 16;
  request.rows = rows;
  request.request_id = 77;
  request.shm_name = std::string(kIngestShmPrefix) + "0123456789abcdef0123456789abcdef";
  std::mt19937_64 rng(rows);
  for (std::uint64_t i = 0; i < rows; ++i) request.ids.push_back(rng());
  return request;
}

TEST(IngestProtocol, ShmRequestRoundTrips) {
  IngestRequest request = shm_request(5);
  auto parsed = parse_request(encode_request(request));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->op, IngestOp::kUpsert);
  EXPECT_EQ(parsed->payload, IngestPayload::kShm);
  EXPECT_EQ(parsed->collection, "default");
  EXPECT_EQ(parsed->dim, 16u);
  EXPECT_EQ(parsed->rows, 5u);
  EXPECT_EQ(parsed->request_id, 77u);
  EXPECT_EQ(parsed->shm_name, request.shm_name);
  EXPECT_EQ(parsed->ids, request.ids);
}

TEST(IngestProtocol, CudaIpcAndCountRoundTrip) {
  IngestRequest request;
  request.payload = IngestPayload::kCudaIpc;
  request.collection = "c";
  request.dim = 3;
  request.rows = 2;
  request.cuda_device = 1;
  for (std::size_t i = 0; i < request.cuda_handle.size(); ++i) request.cuda_handle[i] = i * 3;
  request.cuda_offset = 4096;
  request.ids = {9, 10};
  auto parsed = parse_request(encode_request(request));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->cuda_device, 1);
  EXPECT_EQ(parsed->cuda_handle, request.cuda_handle);
  EXPECT_EQ(parsed->cuda_offset, 4096u);
  EXPECT_EQ(parsed->ids, request.ids);

  IngestRequest count;
  count.op = IngestOp::kCount;
  count.collection = "default";
  auto parsed_count = parse_request(encode_request(count));
  ASSERT_TRUE(parsed_count.ok()) << parsed_count.status().to_string();
  EXPECT_EQ(parsed_count->op, IngestOp::kCount);
}

TEST(IngestProtocol, ReplyRoundTrips) {
  IngestReply reply{StatusCode::kAlreadyExists, 12, 3456, "id 4 already exists"};
  auto parsed = parse_reply(encode_reply(reply));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->code, StatusCode::kAlreadyExists);
  EXPECT_EQ(parsed->request_id, 12u);
  EXPECT_EQ(parsed->total, 3456u);
  EXPECT_EQ(parsed->message, "id 4 already exists");
}

TEST(IngestProtocol, EveryTruncationIsRejected) {
  auto body = encode_request(shm_request(4));
  for (std::size_t length = 0; length < body.size(); ++length) {
    auto parsed = parse_request(std::span(body.data(), length));
    ASSERT_FALSE(parsed.ok()) << "prefix of " << length << " bytes parsed";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    const std::string message = parsed.status().message();
    EXPECT_TRUE(message.find("truncated") != std::string::npos ||
                message.find("wrong size") != std::string::npos)
        << length << ": " << message;
  }
  auto reply = encode_reply({StatusCode::kOk, 1, 2, "fine"});
  for (std::size_t length = 0; length < reply.size(); ++length) {
    EXPECT_FALSE(parse_reply(std::span(reply.data(), length)).ok()) << length;
  }
}

TEST(IngestProtocol, MalformedFieldsAreNamed) {
  auto expect_error = [](std::vector<std::uint8_t> body, const std::string& words) {
    auto parsed = parse_request(body);
    ASSERT_FALSE(parsed.ok()) << words;
    EXPECT_NE(parsed.status().message().find(words), std::string::npos)
        << parsed.status().message();
  };
  auto body = encode_request(shm_request(3));
  auto bad_magic = body;
  bad_magic[0] ^= 0xFF;
  expect_error(bad_magic, "bad magic");
  auto bad_version = body;
  bad_version[4] = 9;
  expect_error(bad_version, "version");
  auto bad_op = body;
  bad_op[6] = 0;
  expect_error(bad_op, "unknown op");
  auto extra = body;
  extra.push_back(0);
  expect_error(extra, "wrong size");
  auto missing_id = body;
  missing_id.resize(missing_id.size() - 8);
  expect_error(missing_id, "wrong size");

  IngestRequest huge_rows = shm_request(1);
  huge_rows.rows = ~std::uint64_t{0};
  expect_error(encode_request(huge_rows), "wrong size");
  IngestRequest zero_dim = shm_request(1);
  zero_dim.dim = 0;
  expect_error(encode_request(zero_dim), "dim 0");
  IngestRequest bad_name = shm_request(1);
  bad_name.shm_name = std::string(kIngestShmPrefix) + "0123456789abcdef0123456789abcdeG";
  expect_error(encode_request(bad_name), "shm name");
  bad_name.shm_name = "/etc/passwd";
  expect_error(encode_request(bad_name), "shm name length");
  IngestRequest no_payload = shm_request(1);
  no_payload.payload = IngestPayload::kNone;
  expect_error(encode_request(no_payload), "without a payload");
  IngestRequest no_collection = shm_request(1);
  no_collection.collection.clear();
  expect_error(encode_request(no_collection), "collection name length 0");
}

TEST(IngestProtocol, ShmNamePattern) {
  EXPECT_TRUE(is_ingest_shm_name("/gpuopt-ingest-00000000000000000000000000000000"));
  EXPECT_FALSE(is_ingest_shm_name("/gpuopt-ingest-0000000000000000000000000000000"));
  EXPECT_FALSE(is_ingest_shm_name("/gpuopt-ingest-0000000000000000000000000000000A"));
  EXPECT_FALSE(is_ingest_shm_name("/gpuopt-ingest-../../../../../../../../etc/passw"));
  EXPECT_FALSE(is_ingest_shm_name(""));
}

// Random bytes and random single-byte corruptions never crash the parser (the fuzzer's job at
// scale; this keeps a cheap version in every test run).
TEST(IngestProtocol, RandomCorruptionsNeverCrash) {
  std::mt19937_64 rng(42);
  auto body = encode_request(shm_request(6));
  for (int trial = 0; trial < 20000; ++trial) {
    auto corrupted = body;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) corrupted[rng() % corrupted.size()] = rng();
    corrupted.resize(rng() % (corrupted.size() + 8));
    auto parsed = parse_request(corrupted);
    if (parsed.ok()) EXPECT_EQ(parsed->ids.size(), parsed->rows);
  }
}

}  // namespace
}  // namespace gpuopt::vector
