// The pipeline's result writer (internal): a thread that takes finished frames and writes one JSON
// line each plus, for a sample of frames, a JPEG overlay with the detector's boxes, so result
// output never holds up a GPU worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/pipeline/pipeline.hpp"

namespace gpuopt::pipeline::detail {

// Where the detector head's output sits: [grid_h * grid_w cells][anchors * per_anchor] fp16 with
// (tx, ty, tw, th, objectness logit, class logits...) per anchor, on a network_size² input.
struct DetectorLayout {
  int grid_h = 0, grid_w = 0, anchors = 3, per_anchor = 85;
  int network_size = 640;
  float objectness_logit_threshold = 2.2f;
};

struct Box {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // frame pixels, inclusive, clamped to the frame
};

float half_bits_to_float(std::uint16_t bits);

// YOLO-style decode of every anchor above the threshold: centre (cell + sigmoid(t)) · stride, size
// anchor · exp(clamp(t, ±2)), scaled from the network input to a frame_width × frame_height frame.
std::vector<Box> decode_boxes(const std::uint16_t* detector, const DetectorLayout& layout,
                              int frame_width, int frame_height);

// A copy of the frame shrunk by `factor` (nearest sample) with each box outlined, [h][w][3] RGB8.
std::vector<std::uint8_t> render_overlay(const std::uint8_t* rgb, int width, int height, int factor,
                                         const std::vector<Box>& boxes, int& out_width,
                                         int& out_height);

Status write_jpeg(const std::filesystem::path& path, const std::uint8_t* rgb, int width, int height,
                  int quality);

struct WriterItem {
  FrameRecord record;
  std::vector<std::uint16_t> detector;  // detector output for an overlay frame; empty otherwise
  const std::uint8_t* frame = nullptr;  // the source frame (outlives the writer)
};

class ResultWriter {
 public:
  ~ResultWriter();
  // Opens <directory>/frames.jsonl and starts the thread.
  Status start(const std::filesystem::path& directory, DetectorLayout layout, int frame_width,
               int frame_height);
  void push(WriterItem item);
  // Drains the queue, joins the thread, returns the first write error.
  Status finish();
  std::uint64_t records_written() const { return records_; }
  std::uint64_t overlays_written() const { return overlays_; }

 private:
  void loop();
  std::filesystem::path directory_;
  DetectorLayout layout_;
  int frame_width_ = 0, frame_height_ = 0;
  std::ofstream lines_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<WriterItem> items_;
  bool closed_ = false;
  std::thread thread_;
  Status error_;
  std::uint64_t records_ = 0, overlays_ = 0;
};

}  // namespace gpuopt::pipeline::detail
