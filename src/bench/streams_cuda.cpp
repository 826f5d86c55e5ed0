// The streams benchmark's testcases (streams_unavailable.cpp: without CUDA): a host thread issues a
// ~5 µs critical kernel every 200 µs while another keeps ~1 ms-per-block spin kernels queued on two
// background streams; a poller thread timestamps each critical completion. Latency = host issue ->
// host-observed completion (docs/runtime.md).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "gpuopt/bench/streams.hpp"
#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/device_buffer.hpp"
#include "gpuopt/runtime/graph.hpp"
#include "gpuopt/runtime/partition.hpp"
#include "gpuopt/runtime/stream.hpp"
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::bench::streams {

namespace {

using Clock = std::chrono::steady_clock;
using runtime::StreamHandle;

Status require_gpu() { return cuda_device_count().status(); }

struct Workload {
  double window_s = 2.0;            // per mode
  double critical_period_us = 200;  // issue rate of the critical task
  double critical_work_us = 5;      // spin per critical block
  int critical_blocks = 8;          // fits the critical partition: one block per SM
  int critical_threads = 128;
  double background_block_us = 1000;  // each background block holds its SM slot this long
  int background_threads = 1024;      // two blocks fill an SM's 2048 thread slots
  int background_waves = 4;           // blocks per kernel = waves * 2 * SMs
  int background_depth = 2;           // kernels in flight per background stream
  int critical_sms = 8;
};

struct ModeSetup {
  std::string key;
  std::string description;
  StreamHandle critical = nullptr;       // null: no critical task
  std::vector<StreamHandle> background;  // empty: no background
  int critical_sms = 0, background_sms = 0;
  bool isolated = false;
  std::string note;
};

struct ModeResult {
  std::vector<double> latency_us;
  long long background_blocks = 0;
  double background_seconds = 0;
  double blocks_per_s() const {
    return background_seconds > 0 ? background_blocks / background_seconds : 0;
  }
};

double micros_since(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::micro>(end - start).count();
}

// Runs one mode for the window. Background and critical issue from their own threads; a third
// thread polls critical completion events in order.
StatusOr<ModeResult> run_mode(const ModeSetup& setup, const Workload& w, int sm_count,
                              double clock_hz) {
  ModeResult result;
  const auto critical_cycles = static_cast<std::int64_t>(w.critical_work_us * 1e-6 * clock_hz);
  const auto background_cycles = static_cast<std::int64_t>(w.background_block_us * 1e-6 * clock_hz);
  const int background_blocks = w.background_waves * 2 * std::max(sm_count, 1);
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  Status first_error;
  std::mutex error_mutex;
  auto fail = [&](Status status) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (first_error.ok()) first_error = std::move(status);
    failed = true;
    stop = true;
  };

  // Events: a ring for critical completions, a depth ring per background stream.
  constexpr std::size_t kRing = 4096;
  std::vector<runtime::Event> critical_events;
  std::vector<Clock::time_point> issued_at(kRing);
  if (setup.critical != nullptr) {
    for (std::size_t i = 0; i < kRing; ++i) {
      GPUOPT_ASSIGN_OR_RETURN(auto event, runtime::Event::create(false));
      critical_events.push_back(std::move(event));
    }
  }
  std::vector<std::vector<runtime::Event>> background_events(setup.background.size());
  for (auto& ring : background_events) {
    for (int i = 0; i < w.background_depth; ++i) {
      GPUOPT_ASSIGN_OR_RETURN(auto event, runtime::Event::create(false));
      ring.push_back(std::move(event));
    }
  }
  std::atomic<std::uint64_t> issued{0};
  std::atomic<std::uint64_t> observed{0};
  std::vector<double> latencies;
  latencies.reserve(static_cast<std::size_t>(w.window_s * 1e6 / w.critical_period_us) + 16);

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::microseconds(static_cast<long long>(w.window_s * 1e6));

  std::thread background_thread([&] {
    if (setup.background.empty()) return;
    std::vector<long long> launched(setup.background.size(), 0);
    while (!stop && Clock::now() < deadline) {
      for (std::size_t s = 0; s < setup.background.size(); ++s) {
        auto& event = background_events[s][launched[s] % w.background_depth];
        // The kernel `depth` launches ago must be done before its event is reused.
        if (launched[s] >= w.background_depth) {
          if (Status synced = event.synchronize(); !synced.ok()) return fail(synced);
        }
        if (Status launched_ok = runtime::launch_spin(setup.background[s], background_blocks,
                                                      w.background_threads, background_cycles);
            !launched_ok.ok()) {
          return fail(launched_ok);
        }
        if (Status recorded = event.record(setup.background[s]); !recorded.ok()) {
          return fail(recorded);
        }
        ++launched[s];
        result.background_blocks += background_blocks;
      }
    }
    for (auto stream : setup.background) {
      if (Status synced =
              GPUOPT_CUDA_STATUS(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
          !synced.ok()) {
        return fail(synced);
      }
    }
    result.background_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  });

  std::thread poller;
  if (setup.critical != nullptr) {
    poller = std::thread([&] {
      while (true) {
        std::uint64_t next = observed.load();
        if (next >= issued.load(std::memory_order_acquire)) {
          if (stop && next >= issued.load(std::memory_order_acquire)) return;
          std::this_thread::yield();
          continue;
        }
        auto complete = critical_events[next % kRing].query();
        if (!complete.ok()) return fail(complete.status());
        if (!*complete) continue;
        latencies.push_back(micros_since(issued_at[next % kRing], Clock::now()));
        observed.store(next + 1, std::memory_order_release);
      }
    });
    // The critical issuer runs on this thread: open loop at a fixed period.
    const auto period =
        std::chrono::nanoseconds(static_cast<long long>(w.critical_period_us * 1e3));
    Clock::time_point next_issue = start + period;
    while (!failed && Clock::now() < deadline) {
      while (Clock::now() < next_issue) {
      }
      next_issue += period;
      std::uint64_t k = issued.load();
      if (k - observed.load(std::memory_order_acquire) >= kRing) continue;  // ring full: skip
      issued_at[k % kRing] = Clock::now();
      if (Status s = runtime::launch_spin(setup.critical, w.critical_blocks, w.critical_threads,
                                          critical_cycles);
          !s.ok()) {
        fail(s);
        break;
      }
      if (Status s = critical_events[k % kRing].record(setup.critical); !s.ok()) {
        fail(s);
        break;
      }
      issued.store(k + 1, std::memory_order_release);
    }
  } else {
    std::this_thread::sleep_until(deadline);
  }
  background_thread.join();
  stop = true;
  if (poller.joinable()) poller.join();
  if (failed) return first_error;
  result.latency_us = std::move(latencies);
  return result;
}

class ContentionTestcase final : public Testcase {
 public:
  std::string key() const override { return "contention"; }
  std::string description() const override {
    return "Critical ~5 us task every 200 us vs ~1 ms-per-block background kernels: p50/p99 "
           "latency (host issue to completion) and background throughput per isolation mode";
  }
  Status filter(const BenchContext&) const override { return require_gpu(); }

  StatusOr<TestcaseResult> run(BenchContext& context) override {
    const auto& options = context.options();
    Workload w;
    w.window_s = options.quick ? 0.4 : 2.0;
    GPUOPT_ASSIGN_OR_RETURN(auto device, runtime::Device::open(options.device));
    GPUOPT_ASSIGN_OR_RETURN(double clock_hz, runtime::sm_clock_hz(device.ordinal()));
    const auto& props = device.properties();
    const int sms = props.sm_count;

    GPUOPT_ASSIGN_OR_RETURN(auto normal_a, runtime::Stream::create(device, 0));
    GPUOPT_ASSIGN_OR_RETURN(auto normal_b, runtime::Stream::create(device, 0));
    GPUOPT_ASSIGN_OR_RETURN(auto normal_c, runtime::Stream::create(device, 0));
    GPUOPT_ASSIGN_OR_RETURN(auto low_a, runtime::Stream::create(device, props.least_priority));
    GPUOPT_ASSIGN_OR_RETURN(auto low_b, runtime::Stream::create(device, props.least_priority));
    GPUOPT_ASSIGN_OR_RETURN(auto high, runtime::Stream::create(device, props.greatest_priority));

    std::vector<ModeSetup> modes = {
        {"background_alone",
         "background kernels only (throughput baseline)",
         nullptr,
         {normal_a.handle(), normal_b.handle()},
         0,
         sms,
         false,
         {}},
        {"critical_alone",
         "critical task only (solo latency)",
         normal_c.handle(),
         {},
         sms,
         0,
         false,
         {}},
        {"same_stream",
         "critical task queued on a background stream",
         normal_a.handle(),
         {normal_a.handle(), normal_b.handle()},
         sms,
         sms,
         false,
         {}},
        {"default_priority",
         "separate streams, default priorities",
         normal_c.handle(),
         {normal_a.handle(), normal_b.handle()},
         sms,
         sms,
         false,
         {}},
        {"high_priority",
         "critical on the highest-priority stream, background on the lowest",
         high.handle(),
         {low_a.handle(), low_b.handle()},
         sms,
         sms,
         false,
         {}},
    };

    TestcaseResult result;
    result.table.columns = {"mode",         "critical p50 us",         "critical p99 us",
                            "background %", "SMs critical/background", "critical tasks"};
    nlohmann::json mode_json = nlohmann::json::array();
    double solo_p50 = 0, solo_p99 = 0, background_solo = 0;
    nlohmann::json partition_json;

    auto record = [&](const ModeSetup& setup, const ModeResult& measured) {
      nlohmann::json m;
      m["mode"] = setup.key;
      m["description"] = setup.description;
      m["isolated_sms"] = setup.isolated;
      m["critical_sms"] = setup.critical_sms;
      m["background_sms"] = setup.background_sms;
      std::string p50 = "-", p99 = "-", pct = "-";
      if (setup.critical != nullptr && !measured.latency_us.empty()) {
        Summary s = summarize(measured.latency_us);
        m["critical_latency_us"] = to_json(s);
        m["critical_p50_us"] = s.median;
        m["critical_p99_us"] = s.p99;
        m["critical_tasks"] = s.count;
        p50 = fmt::format("{:.1f}", s.median);
        p99 = fmt::format("{:.1f}", s.p99);
        if (setup.key == "critical_alone") {
          solo_p50 = s.median;
          solo_p99 = s.p99;
        }
      } else {
        m["critical_p50_us"] = nullptr;
        m["critical_p99_us"] = nullptr;
      }
      if (!setup.background.empty()) {
        m["background_blocks_per_s"] = measured.blocks_per_s();
        if (setup.key == "background_alone") background_solo = measured.blocks_per_s();
        if (background_solo > 0) {
          double percent = 100.0 * measured.blocks_per_s() / background_solo;
          m["background_throughput_pct"] = percent;
          pct = fmt::format("{:.1f}", percent);
        }
      } else {
        m["background_throughput_pct"] = nullptr;
      }
      if (!setup.note.empty()) m["note"] = setup.note;
      result.table.rows.push_back({setup.key, p50, p99, pct,
                                   fmt::format("{}/{}", setup.critical_sms, setup.background_sms),
                                   std::to_string(measured.latency_us.size())});
      mode_json.push_back(m);
      return m;
    };

    const std::size_t total_modes = modes.size() + 1;
    for (std::size_t i = 0; i < modes.size(); ++i) {
      context.progress(static_cast<double>(i) / total_modes);
      GPUOPT_ASSIGN_OR_RETURN(auto measured, run_mode(modes[i], w, sms, clock_hz));
      record(modes[i], measured);
    }

    // SM partition: streams come from the plan only while it is alive.
    context.progress(static_cast<double>(modes.size()) / total_modes);
    {
      runtime::PartitionOptions partition_options;
      partition_options.use_green_contexts = options.use_green_contexts;
      GPUOPT_ASSIGN_OR_RETURN(auto plan,
                              runtime::PartitionPlan::create(
                                  device,
                                  {{"critical", w.critical_sms, runtime::Priority::kCritical, 1},
                                   {"background", 0, runtime::Priority::kBackground, 2}},
                                  partition_options));
      GPUOPT_ASSIGN_OR_RETURN(const runtime::Workload* critical, plan->workload("critical"));
      GPUOPT_ASSIGN_OR_RETURN(const runtime::Workload* background, plan->workload("background"));
      ModeSetup setup{
          "sm_partition",       fmt::format("green-context SM partition: {}", plan->describe()),
          critical->stream(0),  {background->stream(0), background->stream(1)},
          critical->sm_count(), background->sm_count(),
          plan->isolated(),     plan->fallback_reason()};
      w.critical_blocks = std::min(w.critical_blocks, std::max(critical->sm_count(), 1));
      GPUOPT_ASSIGN_OR_RETURN(auto measured, run_mode(setup, w, background->sm_count(), clock_hz));
      partition_json = record(setup, measured);
      if (!plan->isolated()) result.notes.push_back(plan->fallback_reason());
    }
    context.progress(1.0);

    result.data["modes"] = mode_json;
    result.data["workload"] = {{"window_s", w.window_s},
                               {"critical_period_us", w.critical_period_us},
                               {"critical_work_us", w.critical_work_us},
                               {"critical_blocks", w.critical_blocks},
                               {"background_block_us", w.background_block_us},
                               {"background_threads_per_block", w.background_threads},
                               {"background_streams", 2},
                               {"sm_count", sms},
                               {"sm_clock_mhz", clock_hz / 1e6},
                               {"latency_definition", "host issue to host-observed completion"}};
    result.data["device"] = {{"name", props.name},
                             {"driver_version", props.driver_version},
                             {"priority_range", {props.greatest_priority, props.least_priority}}};
    // Done criterion of issue 4: partition p99 <= 2x solo, background >= 80% of solo throughput.
    if (partition_json.contains("critical_p99_us") &&
        !partition_json["critical_p99_us"].is_null() && solo_p99 > 0 &&
        partition_json.contains("background_throughput_pct")) {
      double p99 = partition_json["critical_p99_us"];
      double pct = partition_json["background_throughput_pct"];
      bool met = p99 <= 2 * solo_p99 && pct >= 80.0;
      result.data["criterion"] = {{"partition_p99_over_solo_p99", p99 / solo_p99},
                                  {"partition_p99_over_solo_p50", p99 / solo_p50},
                                  {"background_throughput_pct", pct},
                                  {"met", met}};
      result.notes.push_back(fmt::format(
          "SM partition: critical p99 {:.1f} us = {:.2f}x solo p99 ({:.1f} us), {:.2f}x solo "
          "p50; background keeps {:.1f}% of its solo throughput -> criterion (p99 <= 2x solo, "
          ">= 80%) {}",
          p99, p99 / solo_p99, solo_p99, p99 / solo_p50, pct, met ? "MET" : "NOT met"));
    }
    return result;
  }
};

class GraphLaunchTestcase final : public Testcase {
 public:
  std::string key() const override { return "graph_launch"; }
  std::string description() const override {
    return "Per-kernel cost of N tiny kernels launched eagerly vs one CUDA Graph replay "
           "(host issue to completion)";
  }
  Status filter(const BenchContext&) const override { return require_gpu(); }

  StatusOr<TestcaseResult> run(BenchContext& context) override {
    const auto& options = context.options();
    const int kernels = options.quick ? 200 : 1000;
    const int samples = options.samples > 0 ? options.samples : (options.quick ? 5 : 15);
    GPUOPT_ASSIGN_OR_RETURN(auto device, runtime::Device::open(options.device));
    GPUOPT_ASSIGN_OR_RETURN(auto stream, runtime::Stream::create(device));
    constexpr int kElements = 256;
    GPUOPT_ASSIGN_OR_RETURN(runtime::DeviceBuffer owned,
                            runtime::DeviceBuffer::allocate(2 * kElements * sizeof(float)));
    float* buffer = owned.data_as<float>();
    GPUOPT_RETURN_IF_ERROR(owned.zero(stream.handle()));
    // Each kernel reads the previous one's output: a real dependency chain.
    auto chain = [&](StreamHandle s) -> Status {
      for (int i = 0; i < kernels; ++i) {
        float* in = buffer + (i % 2) * kElements;
        float* out = buffer + ((i + 1) % 2) * kElements;
        GPUOPT_RETURN_IF_ERROR(runtime::launch_affine(s, in, out, kElements, 1.0f, 1.0f));
      }
      return ok_status();
    };
    auto time_us = [&](const std::function<Status()>& issue) -> StatusOr<double> {
      GPUOPT_RETURN_IF_ERROR(stream.synchronize());
      auto begin = Clock::now();
      GPUOPT_RETURN_IF_ERROR(issue());
      GPUOPT_RETURN_IF_ERROR(stream.synchronize());
      return micros_since(begin, Clock::now());
    };
    auto instantiate_begin = Clock::now();
    GPUOPT_ASSIGN_OR_RETURN(auto graph, runtime::StageGraph::capture(stream.handle(), chain));
    double instantiate_us = micros_since(instantiate_begin, Clock::now());

    std::vector<double> eager, replay;
    for (int i = 0; i < samples + 2; ++i) {  // the first two are warm-up
      GPUOPT_ASSIGN_OR_RETURN(double e, time_us([&] { return chain(stream.handle()); }));
      GPUOPT_ASSIGN_OR_RETURN(double g, time_us([&] { return graph.replay(stream.handle()); }));
      if (i >= 2) {
        eager.push_back(e / kernels);
        replay.push_back(g / kernels);
      }
      context.progress(static_cast<double>(i + 1) / (samples + 2));
    }
    Summary eager_summary = summarize(eager);
    Summary replay_summary = summarize(replay);
    TestcaseResult result;
    result.table.columns = {"launch", "us per kernel (median)", "spread"};
    result.table.rows.push_back({"eager", fmt::format("{:.2f}", eager_summary.median),
                                 fmt::format("{:.0f}%", 100 * eager_summary.relative_spread())});
    result.table.rows.push_back({"graph replay", fmt::format("{:.2f}", replay_summary.median),
                                 fmt::format("{:.0f}%", 100 * replay_summary.relative_spread())});
    result.data["kernels"] = kernels;
    result.data["eager_us_per_kernel"] = to_json(eager_summary);
    result.data["graph_us_per_kernel"] = to_json(replay_summary);
    result.data["graph_capture_and_instantiate_us"] = instantiate_us;
    if (replay_summary.median > 0) {
      result.data["eager_over_graph"] = eager_summary.median / replay_summary.median;
      result.notes.push_back(fmt::format(
          "{} chained tiny kernels: eager {:.2f} us/kernel, graph replay {:.2f} us/kernel "
          "({:.1f}x); capture + instantiate once {:.0f} us",
          kernels, eager_summary.median, replay_summary.median,
          eager_summary.median / replay_summary.median, instantiate_us));
    }
    return result;
  }
};

}  // namespace

std::unique_ptr<Testcase> make_contention_testcase() {
  return std::make_unique<ContentionTestcase>();
}
std::unique_ptr<Testcase> make_graph_launch_testcase() {
  return std::make_unique<GraphLaunchTestcase>();
}

}  // namespace gpuopt::bench::streams
