// A transform group: fields that move together, run through one list of ops
// (image_ops.h) with one set of random draws per sample (NOTE [ Transform
// groups ] in transform_group.cpp). An RGB image (at most one) goes through
// its ImagePipeline, as an image alone would; the ops' moves compose one map
// (geometry.h) that every target follows:
//
//   masks      one channel (an image field of mode "L": grayscale values or
//              palette indices) or an integer array of the image's (h, w):
//              resampled once through the map, nearest-neighbour, never
//              recoloured; outside the image, the ops' mask_fill;
//   boxes      float32 rows of 4 (xyxy, xywh, cxcywh; pixels or normalised):
//              moved, clipped to the output, filtered (SanitizeBoundingBoxes);
//   keypoints  float32 rows of k x (x, y, visibility): moved, hidden when
//              off the output, left and right swapped by flip_pairs;
//   rows       any other variable-length field: per-box rows (class ids, track
//              ids), dropped with their boxes.
//
// A group without an RGB image runs its ops on the geometry of its first
// mask; ops that need pixels (colour, blur, Normalize) are refused for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "geometry/image_ops.h"
#include "geometry/image_pipeline.h"
#include "geometry/target_geometry.h"

namespace stoker {

/// One field of a group.
struct GroupMember {
  enum class Kind : uint8_t {
    kImage,      ///< the RGB image the ops act on (at most one)
    kMask,       ///< one channel: nearest, no colour ops
    kBoxes,      ///< float32 rows of 4 (`format`, `normalized`)
    kKeypoints,  ///< float32 rows of k x (x, y, visibility)
    kRows,       ///< any other variable-length field: rows dropped with their boxes
  };
  Kind kind = Kind::kImage;
  std::string name;  ///< for messages
  /// kMask: encoded (a JPEG/PNG decoded to one channel), or an array of
  /// (array_h, array_w) elements of `elem_bytes` bytes (an integer ndarray).
  bool encoded = true;
  int elem_bytes = 1;
  int array_h = 0, array_w = 0;
  bool signed_elems = false;            ///< kMask arrays: signed integers (a mix's max)
  BoxFormat format = BoxFormat::kXYXY;  ///< kBoxes
  bool normalized = false;              ///< kBoxes, kKeypoints: fractions of the size
  int num_keypoints = 0;                ///< kKeypoints
  size_t row_bytes = 0;                 ///< kRows: bytes of one row
};

struct GroupSpec {
  std::vector<GroupMember> members;
  std::vector<ImageOp> ops;
  ImageFieldSpec image;  ///< the RGB image's layout, and the decode limit of every member
};

/// A member's bytes in (a record's field) and where its output goes.
struct MemberIO {
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* out = nullptr;   ///< image: out_h x out_w x 3 of image_dtype() in the layout;
                         ///< mask: out_h x out_w elements; rows: room for the input's rows
  int64_t out_rows = 0;  ///< rows written (row members)
  CacheSlot cache = {};  ///< image: its decoded cache's slot (none: decoded every time)
};

class TransformGroup {
 public:
  /// Checks the ops and the group (UsageError naming the field or op): at most
  /// one RGB image, at least one image or mask, at most one boxes field; no op
  /// that targets cannot follow (RandAugment and the other policies, padding
  /// other than 'constant'), no op that needs pixels without an RGB image, no
  /// SanitizeBoundingBoxes without boxes, flip_pairs naming keypoints that exist.
  explicit TransformGroup(GroupSpec spec);

  const GroupSpec& spec() const { return spec_; }
  /// The RGB image member, or -1.
  int image_member() const { return image_; }
  /// The image's output dtype (kUInt8 without Normalize; kUInt8 without an image).
  DType image_dtype() const;
  /// (h, w) when the ops fix the output size, else nullopt.
  std::optional<std::pair<int, int>> fixed_size() const { return fixed_; }
  /// The output (h, w) of this sample, from the header (or shape) of the
  /// member the ops act on. DecodeError.
  std::pair<int, int> output_size(const MemberIO* io) const;

  /// The samples a run reads: the first op's kSamples when the ops start with a
  /// Mosaic or a DetectionMixUp, else 1 (samples_read in image_ops.h).
  int samples() const { return samples_; }
  /// The dataset indices of the samples() - 1 other samples a run with `seed`
  /// reads, drawn uniformly from [0, n) by that seed alone, so that the same
  /// sample reads the same others on any thread and after a resume.
  void partners(uint64_t seed, int64_t n, int64_t* out) const;

  /// Runs the group on one sample: io[i] is member i. Draws come from `seed`
  /// only. With samples() > 1, `others[k][i]` is member i of the k-th partner
  /// (inputs only), and the rows of every sample go to io's outputs, which
  /// have room for all of them. DataError naming the member for inconsistent
  /// inputs (a mask of another size, per-box rows not matching the boxes).
  /// Thread-safe.
  void run(MemberIO* io, uint64_t seed, int out_h, int out_w, int64_t* decode_ns = nullptr,
           const MemberIO* const* others = nullptr) const;

 private:
  // The targets of `k` samples (inputs[j][i]: member i of sample j; inputs[0]
  // is io) through their geometries, into io's outputs; `given_mask`: member
  // `given` of sample 0 already decoded (-1: none; k == 1 only).
  void write_targets(MemberIO* io, const MemberIO* const* inputs, const Geometry* geos, int k,
                     const Pixels& given_mask, int given, int out_h, int out_w,
                     int64_t* decode_ns) const;
  // The mosaic's samples onto its canvas, then the other ops.
  void run_mosaic(MemberIO* io, const MemberIO* const* others, uint64_t seed, int out_h, int out_w,
                  int64_t* decode_ns) const;
  // The other sample letterboxed and blended into this one, then the other ops
  // (detection_mixup.cpp).
  void run_mixup(MemberIO* io, const MemberIO* const* others, uint64_t seed, int out_h, int out_w,
                 int64_t* decode_ns) const;
  // A mixing op's other sample letterboxed to (w0 x h0) as Letterbox fits it:
  // its geometry, the fit, and with an image its resized pixels (f.w x f.h RGB)
  // in `pixels`. Errors name the other sample (detection_mixup.cpp).
  Geometry letterbox_other(const MemberIO* other, int w0, int h0, ops::Letterbox::Fit* f,
                           std::vector<uint8_t>* pixels, int64_t* decode_ns) const;
  // The ops after a mixing op on sample 0, its image first changed by `paint`
  // (none: as it is); their geometry.
  Geometry run_rest(MemberIO* io, detail::SplitMix64& rng,
                    const std::function<void(const Pixels&)>& paint, int out_h, int out_w,
                    int64_t* decode_ns) const;
  // The other sample's objects pasted onto this one, then the other ops (copy_paste.cpp).
  void run_copy_paste(MemberIO* io, const MemberIO* const* others, uint64_t seed, int out_h,
                      int out_w, int64_t* decode_ns) const;
  // CopyPaste's needs of the group (UsageError): an RGB image, one mask, boxes.
  void check_copy_paste();
  // The (w, h) of sample `in`'s member the ops act on, from its header or shape.
  std::pair<int, int> input_size(const MemberIO* in) const;

  GroupSpec spec_;
  int image_ = -1;    // the RGB image member
  int primary_ = -1;  // the member the ops act on: the image, else the first mask
  std::unique_ptr<ImagePipeline> pipeline_;  // the image's
  std::optional<std::pair<int, int>> fixed_;
  BoxFilter filter_;
  uint8_t mask_fill_ = 0;
  int samples_ = 1;
  int paste_mask_ = -1, paste_boxes_ = -1;       // CopyPaste's instance mask and boxes
  std::vector<std::vector<int32_t>> flip_perm_;  // per member: keypoints' left/right swap
};

}  // namespace stoker
