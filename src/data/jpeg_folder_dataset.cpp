// JPEG-folder dataset: libjpeg-turbo decodes each image (real CPU work) and a bilinear resize
// brings it to one fixed [height, width, 3] RGB8 shape so samples collate.
#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "gpuopt/data/dataset.hpp"

namespace gpuopt::data {
namespace {

// One decompressor per thread: tjhandle is not thread-safe but keeps no state between images.
struct Decompressor {
  tjhandle handle = tjInitDecompress();
  ~Decompressor() {
    if (handle != nullptr) tjDestroy(handle);
  }
};

Status read_file(const std::string& path, std::vector<unsigned char>& bytes) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return not_found(fmt::format("cannot open {}", path));
  bytes.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  if (file.bad()) return data_loss(fmt::format("read error on {}", path));
  return ok_status();
}

// [in_h, in_w, 3] → [out_h, out_w, 3], bilinear, pixel centres aligned.
void resize_bilinear(const unsigned char* in, int in_h, int in_w, unsigned char* out, int out_h,
                     int out_w) {
  float scale_y = static_cast<float>(in_h) / out_h;
  float scale_x = static_cast<float>(in_w) / out_w;
  for (int y = 0; y < out_h; ++y) {
    float sy = std::clamp((y + 0.5f) * scale_y - 0.5f, 0.0f, static_cast<float>(in_h - 1));
    int y0 = static_cast<int>(sy);
    int y1 = std::min(y0 + 1, in_h - 1);
    float fy = sy - y0;
    for (int x = 0; x < out_w; ++x) {
      float sx = std::clamp((x + 0.5f) * scale_x - 0.5f, 0.0f, static_cast<float>(in_w - 1));
      int x0 = static_cast<int>(sx);
      int x1 = std::min(x0 + 1, in_w - 1);
      float fx = sx - x0;
      for (int c = 0; c < 3; ++c) {
        float top = in[(y0 * in_w + x0) * 3 + c] * (1 - fx) + in[(y0 * in_w + x1) * 3 + c] * fx;
        float bottom = in[(y1 * in_w + x0) * 3 + c] * (1 - fx) + in[(y1 * in_w + x1) * 3 + c] * fx;
        out[(y * out_w + x) * 3 + c] =
            static_cast<unsigned char>(std::clamp(top * (1 - fy) + bottom * fy + 0.5f, 0.f, 255.f));
      }
    }
  }
}

class JpegFolderDataset final : public Dataset {
 public:
  JpegFolderDataset(JpegFolderOptions options, std::vector<std::string> files)
      : options_(std::move(options)), files_(std::move(files)) {}

  std::size_t size() const override { return files_.size(); }
  std::size_t sample_bytes() const override {
    return static_cast<std::size_t>(options_.height) * options_.width * 3;
  }

  Status read(std::size_t index, std::span<std::byte> out) override {
    if (index >= files_.size()) {
      return out_of_range(fmt::format("image {} of folder {}: only {} images", index,
                                      options_.folder, files_.size()));
    }
    const std::string& path = files_[index];
    auto fail = [&](const std::string& why) {
      return data_loss(fmt::format("image {} ({}): {}", index, path, why));
    };
    thread_local Decompressor decompressor;
    if (decompressor.handle == nullptr) return internal_error("tjInitDecompress failed");
    thread_local std::vector<unsigned char> compressed;
    thread_local std::vector<unsigned char> decoded;
    Status status = read_file(path, compressed);
    if (!status.ok()) return fail(status.message());
    if (compressed.empty()) return fail("empty file");
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    if (tjDecompressHeader3(decompressor.handle, compressed.data(), compressed.size(), &width,
                            &height, &subsampling, &colorspace) != 0) {
      return fail(fmt::format("not a JPEG: {}", tjGetErrorStr2(decompressor.handle)));
    }
    if (width <= 0 || height <= 0 || static_cast<long long>(width) * height > (1LL << 28)) {
      return fail(fmt::format("implausible size {}x{}", width, height));
    }
    decoded.resize(static_cast<std::size_t>(width) * height * 3);
    int flags = options_.warnings_are_errors ? TJFLAG_STOPONWARNING : 0;
    if (tjDecompress2(decompressor.handle, compressed.data(), compressed.size(), decoded.data(),
                      width, 0, height, TJPF_RGB, flags) != 0) {
      bool warning = tjGetErrorCode(decompressor.handle) == TJERR_WARNING;
      if (!warning || options_.warnings_are_errors) {
        return fail(fmt::format("corrupt JPEG: {}", tjGetErrorStr2(decompressor.handle)));
      }
    }
    resize_bilinear(decoded.data(), height, width, reinterpret_cast<unsigned char*>(out.data()),
                    options_.height, options_.width);
    return ok_status();
  }

  std::string describe() const override {
    return fmt::format("JPEG folder {}: {} images decoded to {}x{}x3 (libjpeg-turbo)",
                       options_.folder, files_.size(), options_.height, options_.width);
  }

 private:
  JpegFolderOptions options_;
  std::vector<std::string> files_;
};

}  // namespace

StatusOr<std::unique_ptr<Dataset>> open_jpeg_folder(const JpegFolderOptions& options) {
  namespace fs = std::filesystem;
  if (options.height <= 0 || options.width <= 0) {
    return invalid_argument(fmt::format("JPEG folder {}: output shape {}x{} must be positive",
                                        options.folder, options.height, options.width));
  }
  std::error_code error;
  if (!fs::is_directory(options.folder, error)) {
    return not_found(fmt::format("JPEG folder {}: not a directory", options.folder));
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(options.folder, error)) {
    if (!entry.is_regular_file()) continue;
    std::string extension = entry.path().extension().string();
    std::transform(extension.begin(), extension.end(), extension.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (extension == ".jpg" || extension == ".jpeg") files.push_back(entry.path().string());
  }
  if (error) {
    return unavailable(fmt::format("JPEG folder {}: {}", options.folder, error.message()));
  }
  if (files.empty()) {
    return not_found(fmt::format("JPEG folder {}: no *.jpg or *.jpeg files", options.folder));
  }
  std::sort(files.begin(), files.end());
  return std::unique_ptr<Dataset>(std::make_unique<JpegFolderDataset>(options, std::move(files)));
}

}  // namespace gpuopt::data
