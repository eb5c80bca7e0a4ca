// The image path of one field: decode (JPEG via libjpeg-turbo, PNG via libpng)
// to 8-bit RGB, then the field's ops, written straight into the batch slot.
//
// Ops (OpSpec.kind and its args, mirrored by python/stoker/ops.py):
//   "random_resized_crop"    h, w, scale_lo, scale_hi, log_ratio_lo, log_ratio_hi
//   "resize"                 size, -1 (shorter side to size)  or  h, w (exact)
//   "center_crop"            h, w
//   "random_horizontal_flip" p
//   "normalize"              mean0..2, std0..2, dtype (0 = float32, 1 = float16); must be last
//
// Every image comes out 3-channel RGB: grayscale is replicated, CMYK/YCCK
// converted (Adobe-inverted CMYK too), palettes expanded, 16-bit PNGs keep the
// high byte, and alpha is dropped (not composited over any background).
//
// The ops run lazily on a view of the image: crops and flips only move the
// view, and pixels are produced when a resize or the output needs them. For a
// JPEG this means the decoder is asked only for the rows and iMCU columns of
// the first crop, at the smallest DCT scale (1/8, 1/4, 1/2) that still covers
// the resize target. See csrc/README.md for the trade-offs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "decode/image_info.h"

namespace stoker {

/// One op of an image field, as passed from Python (see the table above).
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

/// Reads only the header. Throws DecodeError for anything but a sane JPEG/PNG.
ImageInfo probe_image(const uint8_t* data, size_t n);

class ImagePipeline {
 public:
  /// Validates the op list: UsageError for an unknown kind, wrong argument
  /// count, sizes < 1, or Normalize anywhere but last.
  explicit ImagePipeline(ImageFieldSpec spec);

  /// kUInt8, or kFloat16 / kFloat32 after Normalize.
  DType out_dtype() const { return out_dtype_; }
  ImageLayout layout() const { return spec_.layout; }
  /// (h, w) when the ops fix the output size, else nullopt.
  std::optional<std::pair<int, int>> fixed_size() const { return fixed_; }
  /// Output (h, w) of this image, from its header. Throws DecodeError.
  std::pair<int, int> output_size(const uint8_t* data, size_t n) const;
  /// Decodes and transforms one image into `out` (out_h * out_w * 3 elements
  /// of out_dtype(), in layout()). Random draws come from `seed` only, so the
  /// same seed gives bit-identical output on any thread. Thread-safe (scratch
  /// is thread-local); throws DecodeError with the reason.
  void run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h, int out_w) const;

 private:
  ImageFieldSpec spec_;
  std::vector<uint8_t> kinds_;  // spec_.ops[i].kind parsed once, as an OpKind (image_pipeline.cpp)
  DType out_dtype_ = DType::kUInt8;
  std::optional<std::pair<int, int>> fixed_;
};

}  // namespace stoker
