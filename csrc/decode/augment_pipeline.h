// A transform group: one RGB image and the targets that follow it (masks,
// boxes, keypoints, per-box rows), run through one list of ops with one set
// of random draws per sample (NOTE [ Transform groups ] in
// augment_pipeline.cpp).
//
// The image goes through the lazy canvas of the classic ops (canvas.h): crops,
// flips and resizes stay lazy, a JPEG is decoded by region and DCT-scaled; an
// op that needs pixels (a warp, a colour op, padding with a fill) makes them
// once and goes on from there. Every geometric op also moves one composed map
// (TargetGeometry); masks are resampled through it once, nearest-neighbour,
// at the end, and boxes and keypoints moved through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "decode/augment_ops.h"
#include "decode/pixel_writer.h"
#include "decode/target_geometry.h"

namespace stoker {

/// One field of a group.
struct GroupMember {
  enum class Kind : uint8_t {
    kImage,      ///< the RGB image the ops act on (exactly one)
    kMask,       ///< a 1-channel image (a grayscale PNG): nearest, no colour ops
    kBoxes,      ///< float32 rows of 4 (`format`, `normalized`)
    kKeypoints,  ///< float32 rows of k x (x, y, visibility)
    kRows,       ///< any other variable-length field: rows dropped with their boxes
  };
  Kind kind = Kind::kImage;
  std::string name;  ///< for messages
  BoxFormat format = BoxFormat::kXYXY;
  bool normalized = false;
  int num_keypoints = 0;
  std::vector<int32_t> flip_perm;  ///< keypoints: left/right swap under a horizontal flip
  size_t row_bytes = 0;            ///< kRows: bytes of one row
};

struct GroupSpec {
  std::vector<GroupMember> members;
  std::vector<AugmentOp> ops;
  ImageLayout layout = ImageLayout::kHWC;  ///< of the image and masks
  int64_t max_pixels = 100'000'000;
  BoxFilter filter;
};

/// A member's bytes in (a record's field) and where its output goes.
struct MemberIO {
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* out = nullptr;   ///< image: h x w x 3 of out_dtype(); mask: h x w uint8;
                         ///< rows: room for the input's rows
  int64_t out_rows = 0;  ///< rows written (row members)
};

class AugmentPipeline {
 public:
  /// Checks the ops and the group (UsageError naming the field or op): one
  /// image, targets only with ops that can move them (AutoAugment refuses
  /// masks, boxes and keypoints, as torchvision does).
  explicit AugmentPipeline(GroupSpec spec);

  DType out_dtype() const { return out_dtype_; }
  ImageLayout layout() const { return spec_.layout; }
  const GroupSpec& spec() const { return spec_; }
  /// (h, w) when the ops fix the output size, else nullopt.
  std::optional<std::pair<int, int>> fixed_size() const { return fixed_; }
  /// Output (h, w) for this image, from its header. DecodeError.
  std::pair<int, int> output_size(const uint8_t* data, size_t n) const;

  /// Runs the group on one sample: io[i] is member i. Draws come from `seed`
  /// only. DataError naming the member for inconsistent inputs (a mask of
  /// another size, per-box rows not matching the boxes). Thread-safe.
  void run(MemberIO* io, uint64_t seed, int out_h, int out_w, int64_t* decode_ns = nullptr) const;

 private:
  GroupSpec spec_;
  size_t image_ = 0;  // index of the image member
  DType out_dtype_;
  std::optional<std::pair<int, int>> fixed_;
  const ops::Normalize* norm_ = nullptr;
};

}  // namespace stoker
