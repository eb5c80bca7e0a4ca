// The ops of image_ops.h that mix another sample into this one (besides
// Mosaic, which tiles four): a transform group runs them (NOTE [ DetectionMixUp ]
// in detection_mixup.cpp, NOTE [ CopyPaste ] in copy_paste.cpp), reading the
// other sample by the sample's own draws.
#pragma once

#include <array>
#include <tuple>

#include "geometry/op_params.h"

namespace stoker {

class OpContext;  // op_context.h

namespace ops {

/// DetectionMixUp(alpha, p, fill): YOLO's MixUp of two samples (ultralytics'
/// MixUp, YOLOv5's mixup). With probability p, another sample drawn from the
/// dataset by the sample's own draws (TransformGroup::partners) is letterboxed
/// to this one's size (resized to fit keeping its aspect ratio, centred on
/// `fill`, as Letterbox) and blended in: out = this * r + other * (1 - r),
/// truncated to uint8, r ~ Beta(alpha, alpha). Boxes, keypoints and per-box
/// rows are the two samples' one after the other; a mask is the per-pixel max
/// of the two where the other shows, this one's elsewhere. The size stays this
/// sample's. It must be the first op of a transform group's list: the ops
/// after it work on the blend.
struct DetectionMixUp {
  static constexpr const char* kKind = "detection_mixup";
  static constexpr const char* kName = "DetectionMixUp";
  static constexpr int kSamples = 2;  ///< the sample and one more
  double alpha = 32.0;
  double p = 1.0;
  std::array<double, 3> fill = {114, 114, 114};
  static constexpr auto params() {
    using T = DetectionMixUp;
    return std::tuple{Param{"alpha", &T::alpha, "a number > 0"}, Param{"p", &T::p, kInUnit},
                      Param{"fill", &T::fill, kRgb}};
  }
  void check() const;
  /// Never called: a transform group runs the mix (UsageError).
  void apply(OpContext& ctx) const;
};

/// CopyPaste(p, occlusion): simple copy-paste (Ghiasi et al. 2021; ultralytics'
/// CopyPaste, albumentations-style) on an instance mask, where mask value k
/// (1..n) is the object of box k - 1 and any other value background. Another
/// sample drawn by the sample's own draws is letterboxed to this one's size
/// (as DetectionMixUp); each of its objects is pasted with probability p (its
/// pixels under its mask, its box, keypoints and per-box rows); an object of
/// this sample whose mask is covered over more than `occlusion` of its pixels
/// is dropped, one covered less keeps the enclosing box of what its mask still
/// shows. The mask comes out renumbered: this sample's kept objects 1..m in
/// their order, then the pasted ones, background 0. It must be the first op
/// of a group with an RGB image, one mask (the instance mask) and boxes
/// (NOTE [ CopyPaste ] in copy_paste.cpp).
struct CopyPaste {
  static constexpr const char* kKind = "copy_paste";
  static constexpr const char* kName = "CopyPaste";
  static constexpr int kSamples = 2;  ///< the sample and one more
  double p = 0.5;
  double occlusion = 0.7;
  static constexpr auto params() {
    using T = CopyPaste;
    return std::tuple{Param{"p", &T::p, kInUnit}, Param{"occlusion", &T::occlusion, kInUnit}};
  }
  void check() const;
  /// Never called: a transform group runs the paste (UsageError).
  void apply(OpContext& ctx) const;
};

}  // namespace ops
}  // namespace stoker
