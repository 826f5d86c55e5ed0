// PinnedPool logic on the CPU: reuse only after (fake) GPU work completes, budget, growth,
// splitting and coalescing, double release.
#include "gpuopt/runtime/pinned_pool.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace gpuopt::runtime {
namespace {

// Stands in for CUDA events: each release on a non-null stream is pending until the test says so.
class FakeTracker final : public CompletionTracker {
 public:
  StatusOr<Token> record(StreamHandle stream) override {
    if (stream == nullptr) return Token{0};
    Token token = next_++;
    complete_[token] = false;
    return token;
  }
  StatusOr<bool> is_complete(Token token) override { return complete_.at(token); }
  Status wait(Token token) override {
    ++waits;
    complete_.at(token) = true;
    return ok_status();
  }
  void forget(Token token) override {
    complete_.erase(token);
    ++forgotten;
  }
  void complete_all() {
    for (auto& [token, done] : complete_) done = true;
  }
  std::size_t live() const { return complete_.size(); }
  int waits = 0;
  int forgotten = 0;

 private:
  Token next_ = 1;
  std::map<Token, bool> complete_;
};

StreamHandle fake_stream() { return reinterpret_cast<StreamHandle>(0x1234); }

struct PoolWithTracker {
  std::unique_ptr<PinnedPool> pool;
  std::shared_ptr<FakeTracker> tracker;
};

PoolWithTracker make_pool(std::size_t max_bytes, std::size_t slab_bytes) {
  auto tracker = std::make_shared<FakeTracker>();
  PinnedPoolOptions options{max_bytes, slab_bytes, HostMemory::kPageable, tracker};
  auto pool = PinnedPool::create(options);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return {std::move(pool).value(), tracker};
}

TEST(PinnedPool, RejectsBadOptionsAndZeroBytes) {
  EXPECT_EQ(PinnedPool::create({0, 1024}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PinnedPool::create({1024, 0}).status().code(), StatusCode::kInvalidArgument);
  auto p = make_pool(1 << 20, 1 << 16);
  EXPECT_EQ(p.pool->acquire(0).status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedPool, GrowsInSlabsAndAlignsBlocks) {
  auto p = make_pool(1 << 20, 64 << 10);
  EXPECT_EQ(p.pool->bytes_reserved(), 0u);
  auto a = p.pool->acquire(1000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(p.pool->bytes_reserved(), 64u << 10);
  EXPECT_EQ(p.pool->bytes_in_use(), 1024u);  // rounded to 256
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a->data) % PinnedPool::kAlignment, 0u);
  EXPECT_EQ(a->size, 1000u);
  // The block is real memory the host may write.
  std::memset(a->data, 0xab, a->size);
  // A request bigger than a slab gets its own slab of its size.
  auto big = p.pool->acquire(200 << 10);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(p.pool->bytes_reserved(), (64u << 10) + (200u << 10));
  EXPECT_EQ(p.pool->stats().slabs, 2u);
  p.pool->release(std::move(*a));
  p.pool->release(std::move(*big));
  EXPECT_EQ(p.pool->bytes_in_use(), 0u);
}

TEST(PinnedPool, HostOnlyReleaseIsReusedAtOnce) {
  auto p = make_pool(64 << 10, 64 << 10);
  auto a = p.pool->acquire(4096);
  ASSERT_TRUE(a.ok());
  void* address = a->data;
  p.pool->release(std::move(*a), nullptr);
  auto b = p.pool->acquire(4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data, address);
  EXPECT_EQ(p.pool->stats().reuses, 1u);
  EXPECT_EQ(p.pool->stats().slabs, 1u);
}

TEST(PinnedPool, PendingBlockIsNotReusedWhileBudgetAllowsGrowth) {
  auto p = make_pool(1 << 20, 4096);
  auto a = p.pool->acquire(4096);
  ASSERT_TRUE(a.ok());
  void* first = a->data;
  p.pool->release(std::move(*a), fake_stream());
  auto b = p.pool->acquire(4096);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->data, first) << "handed out a block the GPU may still be reading";
  EXPECT_EQ(p.tracker->waits, 0);
  // Once the work completes, the first block comes back without growing.
  p.tracker->complete_all();
  auto c = p.pool->acquire(4096);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data, first);
  EXPECT_EQ(p.pool->stats().slabs, 2u);
  EXPECT_EQ(p.tracker->live(), 0u) << "completed tokens must be forgotten (events recycled)";
}

TEST(PinnedPool, WaitsForPendingWorkWhenTheBudgetIsSpent) {
  auto p = make_pool(8192, 8192);
  auto a = p.pool->acquire(8192);
  ASSERT_TRUE(a.ok());
  void* first = a->data;
  p.pool->release(std::move(*a), fake_stream());
  auto b = p.pool->acquire(8192);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->data, first);
  EXPECT_EQ(p.tracker->waits, 1);
  EXPECT_EQ(p.pool->stats().host_waits, 1u);
}

TEST(PinnedPool, BudgetErrorNamesTheBudget) {
  auto p = make_pool(8192, 4096);
  auto a = p.pool->acquire(4096);
  auto b = p.pool->acquire(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = p.pool->acquire(1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("max_bytes=8192"), std::string::npos) << c.status().message();
  auto too_big = p.pool->acquire(9000);
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(p.pool->bytes_reserved(), 8192u);
  EXPECT_EQ(p.pool->stats().budget_refusals, 2u);
}

TEST(PinnedPool, SplitsAndCoalescesNeighbours) {
  auto p = make_pool(4096, 4096);
  std::vector<PinnedBlock> blocks;
  for (int i = 0; i < 16; ++i) {
    auto block = p.pool->acquire(256);
    ASSERT_TRUE(block.ok()) << i;
    blocks.push_back(*block);
  }
  EXPECT_EQ(p.pool->acquire(256).status().code(), StatusCode::kResourceExhausted);
  // Free every other block: 2 KiB free but only in 256-byte holes.
  for (int i = 0; i < 16; i += 2) p.pool->release(std::move(blocks[i]));
  EXPECT_EQ(p.pool->acquire(512).status().code(), StatusCode::kResourceExhausted)
      << "fragmented holes must not be handed out as one block";
  // Free the rest: neighbours coalesce into the whole slab again.
  for (int i = 1; i < 16; i += 2) p.pool->release(std::move(blocks[i]));
  auto whole = p.pool->acquire(4096);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(p.pool->bytes_in_use(), 4096u);
}

TEST(PinnedPool, CoalescedBlockWaitsForEveryPiece) {
  auto p = make_pool(4096, 4096);
  auto a = p.pool->acquire(2048);
  auto b = p.pool->acquire(2048);
  ASSERT_TRUE(a.ok() && b.ok());
  p.pool->release(std::move(*a), fake_stream());
  p.pool->release(std::move(*b), fake_stream());
  auto whole = p.pool->acquire(4096);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(p.tracker->waits, 2);
}

TEST(PinnedPool, DoubleReleaseIsIgnored) {
  auto p = make_pool(4096, 4096);
  auto a = p.pool->acquire(1024);
  ASSERT_TRUE(a.ok());
  PinnedBlock copy = *a;
  p.pool->release(std::move(*a));
  p.pool->release(std::move(copy));  // reported on stderr, no effect
  EXPECT_EQ(p.pool->bytes_in_use(), 0u);
  auto b = p.pool->acquire(4096);
  EXPECT_TRUE(b.ok());
}

// Random acquire/release: live blocks never overlap and the byte counts stay consistent.
TEST(PinnedPool, RandomTrafficKeepsBlocksDisjoint) {
  auto p = make_pool(1 << 20, 64 << 10);
  std::mt19937 rng(12345);
  std::vector<PinnedBlock> live;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      std::size_t bytes = 1 + rng() % (32 << 10);
      auto block = p.pool->acquire(bytes, fake_stream());
      if (!block.ok()) {
        ASSERT_EQ(block.status().code(), StatusCode::kResourceExhausted);
        continue;
      }
      std::memset(block->data, step & 0xff, block->size);
      live.push_back(*block);
    } else {
      std::size_t i = rng() % live.size();
      p.pool->release(std::move(live[i]), (rng() & 1) ? fake_stream() : nullptr);
      live.erase(live.begin() + static_cast<long>(i));
    }
    if (step % 97 == 0) p.tracker->complete_all();
  }
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> spans;
  std::size_t in_use = 0;
  for (const auto& block : live) {
    auto begin = reinterpret_cast<std::uintptr_t>(block.data);
    spans.push_back({begin, begin + block.size});
    in_use +=
        (block.size + PinnedPool::kAlignment - 1) / PinnedPool::kAlignment * PinnedPool::kAlignment;
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  EXPECT_EQ(p.pool->bytes_in_use(), in_use);
  EXPECT_LE(p.pool->bytes_reserved(), std::size_t{1} << 20);
}

}  // namespace
}  // namespace gpuopt::runtime
