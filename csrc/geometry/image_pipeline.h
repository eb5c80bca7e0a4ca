// The image path of one field: decode (JPEG via libjpeg-turbo, PNG via libpng)
// to 8-bit RGB, then the field's ops (image_ops.h), written straight into the
// batch slot (pixel_writer.h).
//
// Every image comes out 3-channel RGB: grayscale is replicated, CMYK/YCCK
// converted (Adobe-inverted CMYK too), palettes expanded, 16-bit PNGs keep the
// high byte, and alpha is dropped (not composited over any background).
//
// The ops run lazily on a canvas (canvas.h): crops and flips only move the
// view, and pixels are produced when a resize or the output needs them. Each
// op's kernel sees the image through an OpContext (op_context.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cache/decoded_cache.h"
#include "codecs/image_info.h"
#include "common/dtype.h"
#include "geometry/geometry.h"
#include "geometry/image_ops.h"
#include "geometry/pixel_writer.h"

namespace stoker {

struct Canvas;    // canvas.h
class CanvasOps;  // canvas.h
namespace detail {
class SplitMix64;  // detail/rng.h
}

/// How one image field is decoded and written, whatever its ops.
struct ImageFieldSpec {
  ImageLayout layout = ImageLayout::kHWC;
  int64_t max_pixels = 100'000'000;  ///< larger declared images are refused before decoding
};

/// Reads only the header. Throws DecodeError for anything but a sane JPEG, PNG
/// or raw pixel record (codecs/raw_image.h).
ImageInfo probe_image(const uint8_t* data, size_t n);

class ImagePipeline {
 public:
  /// Checks the ops (check_image_ops: UsageError naming the bad op). A build
  /// without image codecs refuses, unless the images are only ever raw pixel
  /// records (`raw_only`: a video's decoded frames).
  explicit ImagePipeline(const ImageFieldSpec& spec, std::vector<ImageOp> ops = {},
                         bool raw_only = false);

  /// kUInt8, or kFloat16 / kFloat32 after Normalize.
  DType out_dtype() const { return out_dtype_; }
  ImageLayout layout() const { return layout_; }
  /// (h, w) when the ops fix the output size, else nullopt.
  std::optional<std::pair<int, int>> fixed_size() const { return fixed_; }
  /// Output (h, w) of this image, from its header. Throws DecodeError.
  std::pair<int, int> output_size(const uint8_t* data, size_t n) const;
  /// Output (h, w) of an image of (h, w) pixels (a video's frames).
  std::pair<int, int> output_size_for(std::pair<int, int> hw) const;
  /// Decodes and transforms one image into `out` (out_h * out_w * 3 elements
  /// of out_dtype(), in layout()). Random draws come from `seed` only, so the
  /// same seed gives bit-identical output on any thread. Thread-safe (scratch
  /// is thread-local); throws DecodeError with the reason.
  /// @param decode_ns if given, the codec's share of the time is added there
  /// @param geometry if given, where the output's pixels come from in the
  ///   decoded image (what targets of the image would be mapped through)
  /// @param cache if given, the decoded cache's slot of this image: decoded
  ///   pixels come from there and go there (NOTE [ Exact pixels ] in canvas.cpp)
  void run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h, int out_w,
           int64_t* decode_ns = nullptr, Geometry* geometry = nullptr, CacheSlot cache = {}) const;
  /// The ops from `first` on, on a canvas already made (a mosaic's), drawing
  /// from `rng`; written into `out` as run() writes. Thread-safe.
  void run_from(size_t first, CanvasOps& ops, Canvas& c, detail::SplitMix64& rng, void* out,
                int out_h, int out_w, Geometry* geometry = nullptr) const;

 private:
  std::vector<ImageOp> ops_;
  ImageLayout layout_;
  int64_t max_pixels_;
  DType out_dtype_;
  std::optional<std::pair<int, int>> fixed_;
};

}  // namespace stoker
