// The record file between the injection library and gpuopt: round trip, merge, and clear errors
// for malformed input.
#include "gpuopt/trace/record_file.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "trace_fixture.hpp"

namespace gpuopt::trace {
namespace {

using nlohmann::json;
using testing::fixture_trace;

void expect_same_records(const TraceData& a, const TraceData& b) {
  ASSERT_EQ(a.records.size(), b.records.size());
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    const ActivityRecord& x = a.records[i];
    const ActivityRecord& y = b.records[i];
    EXPECT_EQ(x.kind, y.kind) << i;
    EXPECT_EQ(x.name, y.name) << i;
    EXPECT_EQ(x.start_ns, y.start_ns) << i;
    EXPECT_EQ(x.end_ns, y.end_ns) << i;
    EXPECT_EQ(x.stream_id, y.stream_id) << i;
    EXPECT_EQ(x.correlation_id, y.correlation_id) << i;
    EXPECT_EQ(x.direction, y.direction) << i;
    EXPECT_EQ(x.bytes, y.bytes) << i;
    EXPECT_EQ(x.grid, y.grid) << i;
    EXPECT_EQ(x.block, y.block) << i;
    EXPECT_EQ(x.process_id, y.process_id) << i;
    EXPECT_EQ(x.thread_id, y.thread_id) << i;
  }
}

TEST(RecordFile, JsonRoundTrip) {
  TraceData data = fixture_trace();
  data.records[0].name = "void k<float>(float*, int) \"quoted\"";
  data.records[0].start_ns = 1'700'000'000'000'000'000ull;  // realistic CUPTI magnitudes
  data.records[0].end_ns = 1'700'000'000'000'100'000ull;
  data.realtime_offset_ns = -123456789;
  data.dropped_records = 3;
  auto back = trace_data_from_json(json::parse(to_json(data).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_records(data, *back);
  EXPECT_EQ(back->window_end_ns, 1000u);
  EXPECT_EQ(back->realtime_offset_ns, -123456789);
  EXPECT_EQ(back->dropped_records, 3u);
  ASSERT_EQ(back->devices.size(), 1u);
  EXPECT_EQ(back->devices[0].sm_count, 4);
  EXPECT_EQ(back->devices[0].name, "Test GPU");
}

TEST(RecordFile, FileRoundTripAndMissingFile) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "gpuopt_record_file_test.json").string();
  ASSERT_TRUE(write_record_file(fixture_trace(), path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto back = read_record_file(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_records(fixture_trace(), *back);
  std::remove(path.c_str());
  EXPECT_EQ(read_record_file(path).status().code(), StatusCode::kNotFound);
}

TEST(RecordFile, TruncatedFileIsAClearError) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "gpuopt_record_file_truncated.json").string();
  {
    std::ofstream out(path);
    out << to_json(fixture_trace()).dump().substr(0, 80);
  }
  auto back = read_record_file(path);
  EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find(path), std::string::npos);
  std::remove(path.c_str());
}

TEST(RecordFile, MalformedFieldsNameWhere) {
  json good = to_json(fixture_trace());
  {
    json bad = good;
    bad["schema_version"] = 99;
    EXPECT_NE(trace_data_from_json(bad).status().message().find("schema_version"),
              std::string::npos);
  }
  {
    json bad = good;
    bad.erase("records");
    EXPECT_NE(trace_data_from_json(bad).status().message().find("'records' is missing"),
              std::string::npos);
  }
  {
    json bad = good;
    bad["records"][2][0] = "teleport";
    const Status status = trace_data_from_json(bad).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("records[2]"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("teleport"), std::string::npos) << status.message();
  }
  {
    json bad = good;
    bad["records"][1][2] = -5;
    EXPECT_NE(trace_data_from_json(bad).status().message().find("records[1] start"),
              std::string::npos);
  }
  {
    json bad = good;
    bad["records"][1][3] = 1;  // ends before it starts
    EXPECT_NE(trace_data_from_json(bad).status().message().find("before it starts"),
              std::string::npos);
  }
  {
    json bad = good;
    bad["records"][0] = json::array({"kernel"});
    EXPECT_NE(trace_data_from_json(bad).status().message().find("17 fields"), std::string::npos);
  }
  EXPECT_FALSE(trace_data_from_json(json::array()).ok());
}

TEST(RecordFile, MergeTakesTheHullAndAddsUp) {
  TraceData first = fixture_trace();
  TraceData second = fixture_trace();
  second.window_start_ns = 500;
  second.window_end_ns = 3000;
  second.dropped_records = 2;
  second.process_ids = {777};
  second.devices = {{0, "Test GPU", std::nullopt}, {1, "Other", 132}};
  const TraceData merged = merge_traces({first, second});
  EXPECT_EQ(merged.window_start_ns, 0u);
  EXPECT_EQ(merged.window_end_ns, 3000u);
  EXPECT_EQ(merged.records.size(), first.records.size() * 2);
  EXPECT_EQ(merged.dropped_records, 2u);
  EXPECT_EQ(merged.process_ids, (std::vector<std::uint32_t>{4242, 777}));
  ASSERT_EQ(merged.devices.size(), 2u);
  EXPECT_EQ(merged.devices[0].sm_count, 4);  // the known SM count survives the merge
  EXPECT_EQ(merged.devices[1].sm_count, 132);
  EXPECT_TRUE(merge_traces({}).records.empty());
}

}  // namespace
}  // namespace gpuopt::trace
