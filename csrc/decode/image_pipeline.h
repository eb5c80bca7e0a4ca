// The image path of one field: decode (JPEG via libjpeg-turbo, PNG via libpng)
// to 8-bit RGB, then the field's ops, written straight into the batch slot.
//
// Ops (OpSpec.kind and its args, mirrored by python/stoker/ops.py):
//   "random_resized_crop"   h, w, scale_lo, scale_hi, log_ratio_lo, log_ratio_hi
//   "resize"                size (shorter side; w = -1)  or  h, w (exact)
//   "center_crop"           h, w
//   "random_horizontal_flip" p
//   "normalize"             mean0..2, std0..2, dtype (0 = float32, 1 = float16); last
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"

namespace stoker {

struct OpSpec {
  std::string kind;
  std::vector<double> args;
};

enum class ImageLayout { kHWC, kCHW };

struct ImageFieldSpec {
  ImageLayout layout = ImageLayout::kHWC;
  std::vector<OpSpec> ops;           ///< applied in order
  int64_t max_pixels = 100'000'000;  ///< larger declared images are refused before decoding
};

/// Header facts of an encoded image.
struct ImageInfo {
  int width = 0;
  int height = 0;
};

/// Reads only the header. Throws DecodeError for anything but a sane JPEG/PNG.
ImageInfo probe_image(const uint8_t* data, size_t n);

class ImagePipeline {
 public:
  /// Validates the op list (UsageError).
  explicit ImagePipeline(ImageFieldSpec spec);

  DType out_dtype() const { return out_dtype_; }
  ImageLayout layout() const { return spec_.layout; }
  /// (h, w) when the ops fix the output size, else nullopt.
  std::optional<std::pair<int, int>> fixed_size() const { return fixed_; }
  /// Output (h, w) of this image, from its header. Throws DecodeError.
  std::pair<int, int> output_size(const uint8_t* data, size_t n) const;
  /// Decodes and transforms one image into `out` (out_h * out_w * 3 elements of
  /// out_dtype(), in layout()). Random draws come from `seed` only.
  /// Thread-safe; throws DecodeError with the reason.
  void run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h, int out_w) const;

 private:
  ImageFieldSpec spec_;
  DType out_dtype_ = DType::kUInt8;
  std::optional<std::pair<int, int>> fixed_;
};

}  // namespace stoker
