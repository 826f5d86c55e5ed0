// The pipeline's result writer: JSON lines and sampled JPEG overlays, on its own thread.
#include "pipeline_writer.hpp"

#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gpuopt::pipeline::detail {

float half_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1Fu,
                      mantissa = bits & 0x3FFu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? std::nanf("") : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

std::vector<Box> decode_boxes(const std::uint16_t* detector, const DetectorLayout& layout,
                              int frame_width, int frame_height) {
  // Anchor sizes in network pixels (YOLOv3's /32 anchors).
  static constexpr float kAnchorW[3] = {116, 156, 373}, kAnchorH[3] = {90, 198, 326};
  std::vector<Box> boxes;
  const float stride = static_cast<float>(layout.network_size) / static_cast<float>(layout.grid_w);
  const float sx = static_cast<float>(frame_width) / static_cast<float>(layout.network_size);
  const float sy = static_cast<float>(frame_height) / static_cast<float>(layout.network_size);
  auto sigmoid = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  const int row = layout.anchors * layout.per_anchor;
  for (int cy = 0; cy < layout.grid_h; ++cy) {
    for (int cx = 0; cx < layout.grid_w; ++cx) {
      const std::uint16_t* cell =
          detector + static_cast<std::size_t>(cy * layout.grid_w + cx) * row;
      for (int a = 0; a < layout.anchors; ++a) {
        const std::uint16_t* p = cell + a * layout.per_anchor;
        // Same test as the GPU decode (objectness logit > threshold), so boxes = detections.
        if (!(half_bits_to_float(p[4]) > layout.objectness_logit_threshold)) continue;
        const float x = (cx + sigmoid(half_bits_to_float(p[0]))) * stride;
        const float y = (cy + sigmoid(half_bits_to_float(p[1]))) * stride;
        const float w = kAnchorW[a % 3] * std::exp(std::clamp(half_bits_to_float(p[2]), -2.f, 2.f));
        const float h = kAnchorH[a % 3] * std::exp(std::clamp(half_bits_to_float(p[3]), -2.f, 2.f));
        Box box;
        box.x0 = std::clamp(static_cast<int>((x - w / 2) * sx), 0, frame_width - 1);
        box.x1 = std::clamp(static_cast<int>((x + w / 2) * sx), 0, frame_width - 1);
        box.y0 = std::clamp(static_cast<int>((y - h / 2) * sy), 0, frame_height - 1);
        box.y1 = std::clamp(static_cast<int>((y + h / 2) * sy), 0, frame_height - 1);
        boxes.push_back(box);
      }
    }
  }
  return boxes;
}

std::vector<std::uint8_t> render_overlay(const std::uint8_t* rgb, int width, int height, int factor,
                                         const std::vector<Box>& boxes, int& out_width,
                                         int& out_height) {
  factor = std::max(factor, 1);
  out_width = std::max(width / factor, 1);
  out_height = std::max(height / factor, 1);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(out_width) * out_height * 3);
  for (int y = 0; y < out_height; ++y) {
    for (int x = 0; x < out_width; ++x) {
      const std::uint8_t* src =
          rgb + (static_cast<std::size_t>(std::min(y * factor, height - 1)) * width +
                 std::min(x * factor, width - 1)) *
                    3;
      std::memcpy(&out[(static_cast<std::size_t>(y) * out_width + x) * 3], src, 3);
    }
  }
  auto paint = [&](int x, int y) {
    if (x < 0 || y < 0 || x >= out_width || y >= out_height) return;
    std::uint8_t* p = &out[(static_cast<std::size_t>(y) * out_width + x) * 3];
    p[0] = 255;
    p[1] = 0;
    p[2] = 255;
  };
  for (const Box& box : boxes) {
    const int x0 = box.x0 / factor, x1 = box.x1 / factor, y0 = box.y0 / factor,
              y1 = box.y1 / factor;
    for (int x = x0; x <= x1; ++x) {
      paint(x, y0);
      paint(x, y1);
    }
    for (int y = y0; y <= y1; ++y) {
      paint(x0, y);
      paint(x1, y);
    }
  }
  return out;
}

Status write_jpeg(const std::filesystem::path& path, const std::uint8_t* rgb, int width, int height,
                  int quality) {
  tjhandle handle = tjInitCompress();
  if (handle == nullptr) return internal_error("write_jpeg: tjInitCompress failed");
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_bytes = 0;
  const int rc = tjCompress2(handle, rgb, width, 0, height, TJPF_RGB, &jpeg, &jpeg_bytes,
                             TJSAMP_420, quality, TJFLAG_FASTDCT);
  Status status;
  if (rc != 0) {
    status =
        internal_error(fmt::format("write_jpeg {}: {}", path.string(), tjGetErrorStr2(handle)));
  } else {
    std::ofstream file(path, std::ios::binary);
    file.write(reinterpret_cast<const char*>(jpeg), static_cast<std::streamsize>(jpeg_bytes));
    if (!file) status = internal_error(fmt::format("write_jpeg: cannot write {}", path.string()));
  }
  tjFree(jpeg);
  tjDestroy(handle);
  return status;
}

ResultWriter::~ResultWriter() { (void)finish(); }

Status ResultWriter::start(const std::filesystem::path& directory, DetectorLayout layout,
                           int frame_width, int frame_height) {
  directory_ = directory;
  layout_ = layout;
  frame_width_ = frame_width;
  frame_height_ = frame_height;
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return internal_error(
        fmt::format("pipeline writer: cannot create {}: {}", directory.string(), error.message()));
  }
  lines_.open(directory / "frames.jsonl", std::ios::trunc);
  if (!lines_) {
    return internal_error(
        fmt::format("pipeline writer: cannot open {}", (directory / "frames.jsonl").string()));
  }
  thread_ = std::thread([this] { loop(); });
  return ok_status();
}

void ResultWriter::push(WriterItem item) {
  {
    std::lock_guard lock(mutex_);
    items_.push_back(std::move(item));
  }
  ready_.notify_one();
}

void ResultWriter::loop() {
  for (;;) {
    WriterItem item;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return closed_ || !items_.empty(); });
      if (items_.empty()) return;
      item = std::move(items_.front());
      items_.pop_front();
    }
    if (!error_.ok()) continue;  // keep draining after a failure; finish() reports it
    if (!item.detector.empty() && item.frame != nullptr) {
      auto boxes = decode_boxes(item.detector.data(), layout_, frame_width_, frame_height_);
      int w = 0, h = 0;
      auto image = render_overlay(item.frame, frame_width_, frame_height_, 3, boxes, w, h);
      item.record.overlay = fmt::format("overlay-{:08d}.jpg", item.record.sequence);
      Status written = write_jpeg(directory_ / item.record.overlay, image.data(), w, h, 85);
      if (!written.ok()) {
        error_ = written;
        continue;
      }
      ++overlays_;
    }
    lines_ << to_json(item.record).dump() << '\n';
    if (!lines_) {
      error_ = internal_error(fmt::format("pipeline writer: writing {} failed",
                                          (directory_ / "frames.jsonl").string()));
      continue;
    }
    ++records_;
  }
}

Status ResultWriter::finish() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  ready_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (lines_.is_open()) {
    lines_.close();
    if (!lines_ && error_.ok())
      error_ = internal_error("pipeline writer: closing frames.jsonl failed");
  }
  return error_;
}

}  // namespace gpuopt::pipeline::detail
