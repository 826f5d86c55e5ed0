// Queries through the vector server: the query message and its reply (round trips, truncations,
// hostile fields), and a server thread answering several clients at once, while another client
// adds rows, with the results checked against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "common/vector_fixtures.hpp"
#include "gpuopt/vector/ingest.hpp"
#include "gpuopt/vector/store.hpp"

namespace gpuopt::vector {
namespace {

namespace fs = std::filesystem;
using gpuopt::testing::id_range;
using gpuopt::testing::random_vectors;
using gpuopt::testing::TempDir;

constexpr std::size_t kDim = 16;

IngestRequest query_request(std::size_t rows) {
  IngestRequest request;
  request.op = IngestOp::kQuery;
  request.collection = "default";
  request.dim = kDim;
  request.rows = rows;
  request.request_id = 77;
  request.k = 5;
  request.engine = QueryEngine::kAuto;
  request.index = IndexKind::kIvf;
  request.nprobe = 3;
  request.where_json = R"({"genre": "jazz"})";
  request.queries = random_vectors(rows, kDim, 9);
  return request;
}

TEST(QueryProtocol, QueryAndResultsRoundTrip) {
  auto request = query_request(3);
  auto parsed = parse_request(encode_request(request));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->op, IngestOp::kQuery);
  EXPECT_EQ(parsed->rows, 3u);
  EXPECT_EQ(parsed->k, 5u);
  EXPECT_EQ(parsed->engine, QueryEngine::kAuto);
  EXPECT_EQ(parsed->index, IndexKind::kIvf);
  EXPECT_EQ(parsed->nprobe, 3u);
  EXPECT_EQ(parsed->where_json, request.where_json);
  EXPECT_EQ(parsed->queries, request.queries);
  EXPECT_TRUE(parsed->ids.empty());

  IngestReply reply;
  reply.request_id = 77;
  reply.total = 1000;
  reply.has_results = true;
  reply.engine = QueryEngine::kGpu;
  reply.results = {{{5, 0.5f}, {9, 1.25f}}, {}, {{1ull << 62, -3.0f}}};
  auto back = parse_reply(encode_reply(reply));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->has_results);
  EXPECT_EQ(back->engine, QueryEngine::kGpu);
  ASSERT_EQ(back->results.size(), 3u);
  EXPECT_EQ(back->results[0].size(), 2u);
  EXPECT_EQ(back->results[0][1].id, 9u);
  EXPECT_EQ(back->results[0][1].distance, 1.25f);
  EXPECT_TRUE(back->results[1].empty());
  EXPECT_EQ(back->results[2][0].id, 1ull << 62);
  // A reply without results (an ingest reply) still has none.
  EXPECT_FALSE(parse_reply(encode_reply({StatusCode::kOk, 1, 2, "fine"}))->has_results);
}

TEST(QueryProtocol, EveryTruncationIsRejected) {
  auto body = encode_request(query_request(2));
  for (std::size_t length = 0; length < body.size(); ++length) {
    EXPECT_FALSE(parse_request(std::span(body.data(), length)).ok()) << length;
  }
  IngestReply reply;
  reply.has_results = true;
  reply.results = {{{5, 0.5f}}, {{6, 0.25f}, {7, 0.5f}}};
  auto encoded = encode_reply(reply);
  for (std::size_t length = 0; length < encoded.size(); ++length) {
    // Cut right after the message the reply is a valid ingest reply; anywhere inside the
    // results it is refused.
    auto parsed = parse_reply(std::span(encoded.data(), length));
    if (parsed.ok()) {
      EXPECT_FALSE(parsed->has_results) << length;
    }
  }
}

TEST(QueryProtocol, HostileFieldsAreNamed) {
  auto expect_error = [](const IngestRequest& request, const std::string& words) {
    auto parsed = parse_request(encode_request(request));
    ASSERT_FALSE(parsed.ok()) << words;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(words), std::string::npos)
        << parsed.status().message();
  };
  auto r = query_request(2);
  r.k = 0;
  expect_error(r, "k 0");
  r = query_request(2);
  r.k = kIngestMaxK + 1;
  expect_error(r, "k 4097");
  r = query_request(2);
  r.nprobe = 0;
  expect_error(r, "nprobe is 0");
  r = query_request(2);
  r.queries.pop_back();
  expect_error(r, "wrong size");
  r = query_request(2);
  r.rows = 3;
  expect_error(r, "wrong size");
  r = query_request(2);
  r.rows = 0;
  r.queries.clear();
  expect_error(r, "rows");
  r = query_request(2);
  r.dim = 0;
  expect_error(r, "dim 0");
  r = query_request(2);
  r.where_json.assign(kIngestMaxWhere + 1, ' ');
  expect_error(r, "where filter");
  // Fields the encoder cannot produce, patched into the bytes.
  auto body = encode_request(query_request(1));
  const std::size_t tail = 32 + std::strlen("default");  // header + collection name
  auto patched = body;
  patched[tail + 4] = 7;  // engine
  EXPECT_NE(parse_request(patched).status().message().find("unknown engine 7"), std::string::npos);
  patched = body;
  patched[tail + 6] = 2;  // index
  EXPECT_NE(parse_request(patched).status().message().find("unknown index 2"), std::string::npos);
  patched = body;
  patched[8] = 1;  // payload shm
  EXPECT_NE(parse_request(patched).status().message().find("payload must be none"),
            std::string::npos);
  // A where length past the body, and a huge one.
  patched = body;
  std::uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(patched.data() + tail + 12, &huge, 4);
  EXPECT_FALSE(parse_request(patched).ok());
  // A reply whose counts promise more than its bytes is refused before allocating for them.
  IngestReply reply;
  reply.has_results = true;
  reply.results = {{{1, 1.0f}}};
  auto encoded = encode_reply(reply);
  std::uint32_t many = 0x7FFFFFFF;
  std::memcpy(encoded.data() + encoded.size() - 24, &many, 4);  // the query count
  EXPECT_FALSE(parse_reply(encoded).ok());
  encoded = encode_reply(reply);
  std::memcpy(encoded.data() + encoded.size() - 16, &many, 4);  // the hit count
  EXPECT_FALSE(parse_reply(encoded).ok());
}

TEST(QueryProtocol, RandomCorruptionsNeverCrash) {
  std::mt19937_64 rng(7);
  auto body = encode_request(query_request(3));
  IngestReply reply;
  reply.has_results = true;
  reply.results = {{{5, 0.5f}, {9, 1.25f}}, {{3, 2.0f}}};
  auto reply_body = encode_reply(reply);
  for (int trial = 0; trial < 20000; ++trial) {
    auto corrupted = trial % 2 ? body : reply_body;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) corrupted[rng() % corrupted.size()] = rng();
    corrupted.resize(rng() % (corrupted.size() + 8));
    auto parsed = parse_request(corrupted);
    if (parsed.ok() && parsed->op == IngestOp::kQuery) {
      EXPECT_EQ(parsed->queries.size(), parsed->rows * parsed->dim);
    }
    auto parsed_reply = parse_reply(corrupted);
    (void)parsed_reply;
  }
}

// The k ids nearest to `query` among rows (ids 0..n-1), in double precision.
std::vector<std::uint64_t> brute_force(const std::vector<float>& rows, const float* query,
                                       std::size_t k) {
  const std::size_t n = rows.size() / kDim;
  std::vector<std::pair<double, std::uint64_t>> d(n);
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (std::size_t j = 0; j < kDim; ++j) {
      double diff = double(rows[i * kDim + j]) - query[j];
      sum += diff * diff;
    }
    d[i] = {sum, i};
  }
  std::partial_sort(d.begin(), d.begin() + k, d.end());
  std::vector<std::uint64_t> ids;
  for (std::size_t i = 0; i < k; ++i) ids.push_back(d[i].second);
  return ids;
}

class QueryServerTest : public ::testing::Test {
 protected:
  void start(bool read_only) {
    {
      auto store = Store::open(dir_.path() / "store", {.create = true});
      ASSERT_TRUE(store.ok());
      auto c = (*store)->create_collection("default", {kDim, Metric::kL2});
      ASSERT_TRUE(c.ok());
      rows_ = random_vectors(500, kDim, 3);
      std::vector<Metadata> metadata(500);
      for (std::size_t i = 0; i < 500; ++i) metadata[i]["even"] = double(i % 2 == 0);
      ASSERT_TRUE((*c)->add(id_range(0, 500), rows_.data(), metadata).ok());
    }
    auto store = Store::open(dir_.path() / "store", {.read_only = read_only});
    ASSERT_TRUE(store.ok());
    store_ = std::move(*store);
    socket_ = dir_.path() / "serve.sock";
    IngestServerOptions options;
    options.receive_timeout_s = 5;
    options.query.threads = 1;
    auto server = IngestServer::start(store_.get(), socket_, options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    thread_ = std::thread([this] { served_ = server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->request_stop();
    if (thread_.joinable()) thread_.join();
    EXPECT_TRUE(served_.ok()) << served_.to_string();
  }
  TempDir dir_{"gpuopt-serve-query"};
  std::vector<float> rows_;
  std::unique_ptr<Store> store_;
  fs::path socket_;
  std::unique_ptr<IngestServer> server_;
  std::thread thread_;
  Status served_;
};

TEST_F(QueryServerTest, ManyClientsGetBruteForceAnswersWhileAnotherAdds) {
  ASSERT_NO_FATAL_FAILURE(start(/*read_only=*/false));
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      auto client = IngestClient::connect(socket_, 10);
      if (!client.ok()) {
        ++failures;
        return;
      }
      auto queries = random_vectors(8, kDim, 100 + c);
      QueryOptions options;
      options.k = 7;
      for (int round = 0; round < 20; ++round) {
        QueryReport report;
        auto results = (*client)->query("default", queries.data(), 8, kDim, options, &report);
        if (!results.ok() || results->size() != 8 || report.engine != QueryEngine::kCpu) {
          ++failures;
          continue;
        }
        // The rows added meanwhile are far away (see below): the nearest stay the first 500's.
        for (std::size_t q = 0; q < 8; ++q) {
          std::vector<std::uint64_t> got;
          for (const auto& hit : (*results)[q]) got.push_back(hit.id);
          if (got != brute_force(rows_, queries.data() + q * kDim, 7)) ++failures;
        }
      }
    });
  }
  // Another client adds rows far from every query while the others ask.
  auto writer = IngestClient::connect(socket_, 10);
  ASSERT_TRUE(writer.ok());
  std::vector<float> far(10 * kDim, 50.0f);
  for (int batch = 0; batch < 5; ++batch) {
    for (std::size_t i = 0; i < 10; ++i) far[i * kDim] = 50.0f + float(batch * 10 + i);
    auto total = (*writer)->add("default", id_range(1000 + batch * 10, 10), far.data(), kDim);
    ASSERT_TRUE(total.ok()) << total.status().to_string();
    EXPECT_EQ(*total, 510u + batch * 10);
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);

  // Filters travel too, and the added rows are found by their own vectors.
  auto client = IngestClient::connect(socket_, 10);
  ASSERT_TRUE(client.ok());
  QueryOptions options;
  options.k = 5;
  options.where_json = R"({"even": 1})";
  auto even = (*client)->query("default", rows_.data() + 3 * kDim, 1, kDim, options);
  ASSERT_TRUE(even.ok()) << even.status().to_string();
  ASSERT_EQ((*even)[0].size(), 5u);
  for (const auto& hit : (*even)[0]) EXPECT_EQ(hit.id % 2, 0u) << hit.id;
  options.where_json.clear();
  options.k = 1;
  for (std::size_t i = 0; i < 10; ++i) far[i * kDim] = 90.0f + float(i);
  auto found = (*client)->query("default", far.data() + 2 * kDim, 1, kDim, options);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)[0][0].id, 1042u);
  EXPECT_EQ((*found)[0][0].distance, 0.0f);
}

TEST_F(QueryServerTest, BadQueriesGetErrorRepliesAndTheServerGoesOn) {
  ASSERT_NO_FATAL_FAILURE(start(/*read_only=*/false));
  auto client = IngestClient::connect(socket_, 10);
  ASSERT_TRUE(client.ok());
  QueryOptions options;
  auto queries = random_vectors(2, kDim, 5);
  auto wrong_dim = (*client)->query("default", queries.data(), 1, kDim - 1, options);
  EXPECT_EQ(wrong_dim.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_dim.status().message().find("dim mismatch"), std::string::npos);
  EXPECT_EQ((*client)->query("nope", queries.data(), 1, kDim, options).status().code(),
            StatusCode::kNotFound);
  options.where_json = "{not json";
  EXPECT_EQ((*client)->query("default", queries.data(), 1, kDim, options).status().code(),
            StatusCode::kInvalidArgument);
  // Hostile frames: each answered with an error, the connection then closed; a new one works.
  auto body = encode_request(query_request(2));
  body[32 + 7] = 0;  // k = 0 (its low byte)
  for (std::size_t cut : {body.size(), std::size_t{10}, std::size_t{40}}) {
    auto raw = IngestClient::connect(socket_, 10);
    ASSERT_TRUE(raw.ok());
    auto reply = (*raw)->send_raw(std::span(body.data(), cut), /*add_length_prefix=*/true);
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    EXPECT_EQ(reply->code, StatusCode::kInvalidArgument) << reply->message;
    EXPECT_FALSE(reply->has_results);
  }
  options.where_json.clear();
  auto fine = (*client)->query("default", queries.data(), 2, kDim, options);
  EXPECT_TRUE(fine.ok()) << fine.status().to_string();
}

TEST_F(QueryServerTest, ReadOnlyServerAnswersAndRefusesWrites) {
  ASSERT_NO_FATAL_FAILURE(start(/*read_only=*/true));
  auto client = IngestClient::connect(socket_, 10);
  ASSERT_TRUE(client.ok());
  QueryOptions options;
  options.k = 3;
  auto results = (*client)->query("default", rows_.data() + 9 * kDim, 1, kDim, options);
  ASSERT_TRUE(results.ok()) << results.status().to_string();
  EXPECT_EQ((*results)[0][0].id, 9u);
  auto added = (*client)->add("default", id_range(900, 1), rows_.data(), kDim);
  EXPECT_EQ(added.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(added.status().message().find("read-only"), std::string::npos);
  EXPECT_EQ(*(*client)->count("default"), 500u);
}

TEST_F(QueryServerTest, SecondServerOnALiveSocketIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start(/*read_only=*/false));
  auto second = IngestServer::start(store_.get(), socket_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find("another server is listening"), std::string::npos);
  // The first still answers.
  auto client = IngestClient::connect(socket_, 10);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ(*(*client)->count("default"), 500u);
}

}  // namespace
}  // namespace gpuopt::vector
