// The image ops: one struct per op, holding its parameters, with its kernel.
// Python builds them (stoker.ops: each Op's `kind` names one of these, its
// args() gives the parameters in order) through the bindings, which bind
// every alternative of ImageOp as a type from its params(); nothing parses
// them again. Sizes are named (h, w) everywhere, so no call site has to
// remember an argument order.
//
// A new op is a struct here and its kernel, nothing else:
//
//   struct MyOp {
//     static constexpr const char* kKind = "my_op";  // Op.kind in Python
//     static constexpr const char* kName = "MyOp";   // errors say "MyOp: ..."
//     double p = 0.5;
//     static constexpr auto params() { return std::tuple{Param{"p", &MyOp::p, kInUnit}}; }
//     void check() const;                 // UsageError naming the op and the parameter
//     void apply(OpContext& ctx) const;   // the kernel (image_ops.cpp)
//     // optional: size_after(hw) and fixes_size() if it changes the size,
//     // out_dtype() if it changes the dtype, kLast if it must come last,
//     // kTargets if targets do not simply follow it (TargetRule below)
//   };
//
// and its name in the ImageOp variant below. Kernels draw their randomness
// from ctx.rng() only, in a fixed order, and move the image only through ctx
// (crop, resize, flip, window, warp), which keeps the sample's geometry
// (geometry.h) with the pixels: that is what lets targets follow the image and
// one set of draws serve a group of fields (one crop for an image, its mask
// and its boxes: transform_group.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "common/dtype.h"
#include "geometry/mixing_ops.h"
#include "geometry/op_params.h"
#include "geometry/warp.h"

namespace stoker {

class OpContext;  // op_context.h: what a kernel sees of the image it transforms
namespace detail {
class SplitMix64;  // detail/rng.h
}

namespace ops {

/// torchvision's RandomResizedCrop: a random crop of area fraction in
/// [scale_lo, scale_hi] and aspect ratio in [ratio_lo, ratio_hi] (drawn
/// log-uniform), resized to (h, w).
struct RandomResizedCrop {
  static constexpr const char* kKind = "random_resized_crop";
  static constexpr const char* kName = "RandomResizedCrop";
  int h = 0, w = 0;
  double scale_lo = 0.08, scale_hi = 1.0;
  double ratio_lo = 3.0 / 4.0, ratio_hi = 4.0 / 3.0;
  static constexpr auto params() {
    using T = RandomResizedCrop;
    return std::tuple{
        Param{"h", &T::h, kPositiveWhole},        Param{"w", &T::w, kPositiveWhole},
        Param{"scale_lo", &T::scale_lo, kNumber}, Param{"scale_hi", &T::scale_hi, kNumber},
        Param{"ratio_lo", &T::ratio_lo, kNumber}, Param{"ratio_hi", &T::ratio_hi, kNumber}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int>) const { return {h, w}; }
  bool fixes_size() const { return true; }
  void apply(OpContext& ctx) const;
};

/// torchvision's Resize: with `shorter` > 0, the shorter side becomes
/// `shorter` and the longer int(shorter * long / short); otherwise exactly
/// (h, w). With `max_size` > 0 (and no (h, w)), the longer side is then at
/// most `max_size` (shrunk to it with the shorter side scaled alike); with
/// `max_size` alone, the longer side becomes `max_size`. An antialiased
/// triangle filter (PIL's BILINEAR).
struct Resize {
  static constexpr const char* kKind = "resize";
  static constexpr const char* kName = "Resize";
  int h = 0, w = 0;
  int shorter = 0;
  int max_size = 0;
  static constexpr auto params() {
    return std::tuple{Param{"h", &Resize::h, kWholeOrZero}, Param{"w", &Resize::w, kWholeOrZero},
                      Param{"shorter", &Resize::shorter, kWholeOrZero},
                      Param{"max_size", &Resize::max_size, kWholeOrZero, true}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int> hw) const;
  bool fixes_size() const { return shorter == 0 && max_size == 0; }
  void apply(OpContext& ctx) const;
};

/// torchvision's CenterCrop: the central (h, w) region, zero-padded where it
/// is larger than the image.
struct CenterCrop {
  static constexpr const char* kKind = "center_crop";
  static constexpr const char* kName = "CenterCrop";
  int h = 0, w = 0;
  static constexpr auto params() {
    return std::tuple{Param{"h", &CenterCrop::h, kPositiveWhole},
                      Param{"w", &CenterCrop::w, kPositiveWhole}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int>) const { return {h, w}; }
  bool fixes_size() const { return true; }
  void apply(OpContext& ctx) const;
};

/// A left-right mirror with probability p. Keypoints of a group swap left
/// and right by `flip_pairs` (pairs of keypoint indices, flattened), as
/// ultralytics' flip_idx.
struct RandomHorizontalFlip {
  static constexpr const char* kKind = "random_horizontal_flip";
  static constexpr const char* kName = "RandomHorizontalFlip";
  double p = 0.5;
  std::vector<int> flip_pairs = {};
  static constexpr auto params() {
    return std::tuple{Param{"p", &RandomHorizontalFlip::p, kInUnit},
                      Param{"flip_pairs", &RandomHorizontalFlip::flip_pairs, kPairs, true}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// A top-bottom mirror with probability p.
struct RandomVerticalFlip {
  static constexpr const char* kKind = "random_vertical_flip";
  static constexpr const char* kName = "RandomVerticalFlip";
  double p = 0.5;
  static constexpr auto params() { return std::tuple{Param{"p", &RandomVerticalFlip::p, kInUnit}}; }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// (x / 255 - mean) / std per RGB channel, written as float32, float16 or bfloat16.
struct Normalize {
  static constexpr const char* kKind = "normalize";
  static constexpr const char* kName = "Normalize";
  static constexpr bool kLast = true;  // the output's dtype is no longer uint8
  static constexpr TargetRule kTargets = TargetRule::kImageOnly;
  std::array<double, 3> mean = {0, 0, 0};
  std::array<double, 3> stddev = {1, 1, 1};
  DType dtype = DType::kFloat32;
  static constexpr auto params() {
    return std::tuple{Param{"mean", &Normalize::mean, kRgb}, Param{"std", &Normalize::stddev, kRgb},
                      Param{"dtype", &Normalize::dtype, kFloatType}};
  }
  void check() const;
  DType out_dtype() const { return dtype; }
  void apply(OpContext& ctx) const;
};

// ---- augmentation (kernels in augment/image_ops_augment.cpp) ---------------
// Colour ops follow torchvision.transforms.v2 on uint8 tensors (augment/color_ops.h);
// the auto-augment policies draw as torchvision and apply its ops
// (augment/auto_augment.h); none moves the image, so the geometry stays as it is.

inline constexpr const char* kRange = "a pair (lo, hi) with lo <= hi";
inline constexpr const char* kMaskFill = "a whole number in [0, 255]";

/// ColorJitter: factors drawn uniformly in each range, applied in a random
/// order; a range (1, 1) (hue: (0, 0)) leaves that property alone.
struct ColorJitter {
  static constexpr const char* kKind = "color_jitter";
  static constexpr const char* kName = "ColorJitter";
  static constexpr TargetRule kTargets = TargetRule::kImageOnly;
  std::array<double, 2> brightness = {1, 1}, contrast = {1, 1}, saturation = {1, 1};
  std::array<double, 2> hue = {0, 0};
  static constexpr auto params() {
    using T = ColorJitter;
    return std::tuple{Param{"brightness", &T::brightness, kRange},
                      Param{"contrast", &T::contrast, kRange},
                      Param{"saturation", &T::saturation, kRange}, Param{"hue", &T::hue, kRange}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// RandomGrayscale: with probability p, the gray in every channel.
struct RandomGrayscale {
  static constexpr const char* kKind = "random_grayscale";
  static constexpr const char* kName = "RandomGrayscale";
  static constexpr TargetRule kTargets = TargetRule::kImageOnly;
  double p = 0.1;
  static constexpr auto params() { return std::tuple{Param{"p", &RandomGrayscale::p, kInUnit}}; }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// GaussianBlur(kernel_size, sigma): one sigma drawn in [lo, hi] for both axes.
struct GaussianBlur {
  static constexpr const char* kKind = "gaussian_blur";
  static constexpr const char* kName = "GaussianBlur";
  static constexpr TargetRule kTargets = TargetRule::kImageOnly;
  int kh = 3, kw = 3;
  std::array<double, 2> sigma = {0.1, 2.0};
  static constexpr auto params() {
    using T = GaussianBlur;
    return std::tuple{Param{"kh", &T::kh, kPositiveWhole}, Param{"kw", &T::kw, kPositiveWhole},
                      Param{"sigma", &T::sigma, kRange}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// HSVJitter: ultralytics' augment_hsv (augment/hsv_jitter.h), YOLO's colour jitter.
struct HSVJitter {
  static constexpr const char* kKind = "hsv_jitter";
  static constexpr const char* kName = "HSVJitter";
  static constexpr TargetRule kTargets = TargetRule::kImageOnly;
  double h = 0.015, s = 0.7, v = 0.4;
  static constexpr auto params() {
    using T = HSVJitter;
    return std::tuple{Param{"h", &T::h, kInUnit}, Param{"s", &T::s, kInUnit},
                      Param{"v", &T::v, kInUnit}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// RandAugment(num_ops, magnitude, num_magnitude_bins), nearest, no fill.
struct RandAugment {
  static constexpr const char* kKind = "rand_augment";
  static constexpr const char* kName = "RandAugment";
  static constexpr TargetRule kTargets = TargetRule::kNone;
  int num_ops = 2, magnitude = 9, num_magnitude_bins = 31;
  static constexpr auto params() {
    using T = RandAugment;
    return std::tuple{Param{"num_ops", &T::num_ops, kWholeOrZero},
                      Param{"magnitude", &T::magnitude, kWholeOrZero},
                      Param{"num_magnitude_bins", &T::num_magnitude_bins, kPositiveWhole}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// TrivialAugmentWide(num_magnitude_bins), nearest, no fill.
struct TrivialAugmentWide {
  static constexpr const char* kKind = "trivial_augment_wide";
  static constexpr const char* kName = "TrivialAugmentWide";
  static constexpr TargetRule kTargets = TargetRule::kNone;
  int num_magnitude_bins = 31;
  static constexpr auto params() {
    return std::tuple{
        Param{"num_magnitude_bins", &TrivialAugmentWide::num_magnitude_bins, kPositiveWhole}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// AutoAugment with torchvision's ImageNet policy, nearest, no fill.
struct AutoAugment {
  static constexpr const char* kKind = "auto_augment";
  static constexpr const char* kName = "AutoAugment";
  static constexpr TargetRule kTargets = TargetRule::kNone;
  static constexpr auto params() { return std::tuple{}; }
  void check() const {}
  void apply(OpContext& ctx) const;
};

/// RandomErasing on the written output (after Normalize, as timm uses it):
/// with probability p a rectangle of area fraction in `scale` and aspect ratio
/// in `ratio` gets `value` per channel, or N(0, 1) noise when `random`.
struct RandomErasing {
  static constexpr const char* kKind = "random_erasing";
  static constexpr const char* kName = "RandomErasing";
  static constexpr TargetRule kTargets = TargetRule::kImageOnly;
  static constexpr bool kOutput = true;  // may follow Normalize
  double p = 0.5;
  std::array<double, 2> scale = {0.02, 0.33};
  std::array<double, 2> ratio = {0.3, 3.3};
  std::array<double, 3> value = {0, 0, 0};
  int random = 0;
  static constexpr auto params() {
    using T = RandomErasing;
    return std::tuple{Param{"p", &T::p, kInUnit}, Param{"scale", &T::scale, kRange},
                      Param{"ratio", &T::ratio, kRange}, Param{"value", &T::value, kRgb},
                      Param{"random", &T::random, "0 or 1"}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
  /// The kernel, on the output tensor (uint8 or float; HWC, or CHW when `chw`).
  void erase(void* out, DType dtype, bool chw, int h, int w, detail::SplitMix64& rng) const;
};

/// RandomCrop(size, padding, pad_if_needed, fill, padding_mode): torchvision's;
/// padding_mode 0 constant (fill), 1 edge, 2 reflect, 3 symmetric. Masks of a
/// group are padded with `mask_fill` (a class id, or an ignore index).
struct RandomCrop {
  static constexpr const char* kKind = "random_crop";
  static constexpr const char* kName = "RandomCrop";
  int h = 0, w = 0;
  int pad_left = 0, pad_top = 0, pad_right = 0, pad_bottom = 0;
  int pad_if_needed = 0;
  std::array<double, 3> fill = {0, 0, 0};
  int padding_mode = 0;
  int mask_fill = 0;
  static constexpr auto params() {
    using T = RandomCrop;
    return std::tuple{Param{"h", &T::h, kPositiveWhole},
                      Param{"w", &T::w, kPositiveWhole},
                      Param{"pad_left", &T::pad_left, kWholeOrZero},
                      Param{"pad_top", &T::pad_top, kWholeOrZero},
                      Param{"pad_right", &T::pad_right, kWholeOrZero},
                      Param{"pad_bottom", &T::pad_bottom, kWholeOrZero},
                      Param{"pad_if_needed", &T::pad_if_needed, "0 or 1"},
                      Param{"fill", &T::fill, kRgb},
                      Param{"padding_mode", &T::padding_mode, "0 to 3"},
                      Param{"mask_fill", &T::mask_fill, kMaskFill}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int>) const { return {h, w}; }
  bool fixes_size() const { return true; }
  void apply(OpContext& ctx) const;
};

/// Pad(padding, fill, padding_mode): torchvision's; modes as RandomCrop's.
struct Pad {
  static constexpr const char* kKind = "pad";
  static constexpr const char* kName = "Pad";
  int left = 0, top = 0, right = 0, bottom = 0;
  std::array<double, 3> fill = {0, 0, 0};
  int padding_mode = 0;
  int mask_fill = 0;
  static constexpr auto params() {
    using T = Pad;
    return std::tuple{Param{"left", &T::left, kWholeOrZero},
                      Param{"top", &T::top, kWholeOrZero},
                      Param{"right", &T::right, kWholeOrZero},
                      Param{"bottom", &T::bottom, kWholeOrZero},
                      Param{"fill", &T::fill, kRgb},
                      Param{"padding_mode", &T::padding_mode, "0 to 3"},
                      Param{"mask_fill", &T::mask_fill, kMaskFill}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int> hw) const {
    return {hw.first + top + bottom, hw.second + left + right};
  }
  bool fixes_size() const { return false; }
  void apply(OpContext& ctx) const;
};

// ---- geometry beyond crops (kernels in image_ops_geometry.cpp) ---------------
// Warps resample through the plane maps of transform2d.h as torchvision's
// tensor kernels (grid_sample, align_corners=False; warp.h), with its fill
// blend; masks of a group take the same map with nearest sampling and their
// own `mask_fill`.

/// Letterbox(size, fill): ultralytics' LetterBox (YOLO): resized to fit (h, w)
/// keeping the aspect ratio (never enlarged unless `scaleup`), centred, the
/// rest `fill`.
struct Letterbox {
  static constexpr const char* kKind = "letterbox";
  static constexpr const char* kName = "Letterbox";
  int h = 0, w = 0;
  std::array<double, 3> fill = {114, 114, 114};
  int mask_fill = 0;
  int scaleup = 1;
  static constexpr auto params() {
    using T = Letterbox;
    return std::tuple{Param{"h", &T::h, kPositiveWhole}, Param{"w", &T::w, kPositiveWhole},
                      Param{"fill", &T::fill, kRgb}, Param{"mask_fill", &T::mask_fill, kMaskFill},
                      Param{"scaleup", &T::scaleup, kFlag}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int>) const { return {h, w}; }
  bool fixes_size() const { return true; }
  void apply(OpContext& ctx) const;
  /// The placement of a (w x h) image: the resized size and the offset.
  struct Fit {
    int w = 0, h = 0, left = 0, top = 0;
  };
  Fit fit(int img_w, int img_h) const;
};

/// RandomRotation(degrees, interpolation, expand, center, fill): an angle
/// drawn uniformly in `degrees`, counter-clockwise, about `center` (the
/// image's centre unless `has_center`); `expand` enlarges the output to hold
/// the whole rotated image (a size of its own per image: an op that fixes
/// the size must follow).
struct RandomRotation {
  static constexpr const char* kKind = "random_rotation";
  static constexpr const char* kName = "RandomRotation";
  std::array<double, 2> degrees = {0, 0};
  int interpolation = 0;
  int expand = 0;
  std::array<double, 2> center = {0, 0};
  int has_center = 0;
  std::array<double, 3> fill = {0, 0, 0};
  int mask_fill = 0;
  static constexpr auto params() {
    using T = RandomRotation;
    return std::tuple{Param{"degrees", &T::degrees, kRange},
                      Param{"interpolation", &T::interpolation, kInterpolation},
                      Param{"expand", &T::expand, kFlag},
                      Param{"center", &T::center, "a point (x, y)"},
                      Param{"has_center", &T::has_center, kFlag},
                      Param{"fill", &T::fill, kRgb},
                      Param{"mask_fill", &T::mask_fill, kMaskFill}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int> hw) const { return hw; }
  bool fixes_size() const { return false; }
  bool random_size() const { return expand != 0; }
  void apply(OpContext& ctx) const;
};

/// RandomAffine(degrees, translate, scale, shear, interpolation, fill, center):
/// torchvision's draws (angle, then the translation in pixels, rounded, then
/// the scale, then the shears) and its affine map.
struct RandomAffine {
  static constexpr const char* kKind = "random_affine";
  static constexpr const char* kName = "RandomAffine";
  std::array<double, 2> degrees = {0, 0};
  std::array<double, 2> translate = {0, 0};  ///< the largest fractions of (w, h)
  std::array<double, 2> scale = {1, 1};
  std::array<double, 4> shear = {0, 0, 0, 0};  ///< x lo, x hi, y lo, y hi
  int interpolation = 0;
  std::array<double, 3> fill = {0, 0, 0};
  int mask_fill = 0;
  std::array<double, 2> center = {0, 0};
  int has_center = 0;
  static constexpr auto params() {
    using T = RandomAffine;
    return std::tuple{Param{"degrees", &T::degrees, kRange},
                      Param{"translate", &T::translate, "a pair of fractions in [0, 1]"},
                      Param{"scale", &T::scale, kRange},
                      Param{"shear", &T::shear, "4 values (x lo, x hi, y lo, y hi)"},
                      Param{"interpolation", &T::interpolation, kInterpolation},
                      Param{"fill", &T::fill, kRgb},
                      Param{"mask_fill", &T::mask_fill, kMaskFill},
                      Param{"center", &T::center, "a point (x, y)"},
                      Param{"has_center", &T::has_center, kFlag}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// RandomPerspective(distortion_scale, p, interpolation, fill): torchvision's
/// corner draws and homography.
struct RandomPerspective {
  static constexpr const char* kKind = "random_perspective";
  static constexpr const char* kName = "RandomPerspective";
  double distortion_scale = 0.5;
  double p = 0.5;
  int interpolation = 1;
  std::array<double, 3> fill = {0, 0, 0};
  int mask_fill = 0;
  static constexpr auto params() {
    using T = RandomPerspective;
    return std::tuple{Param{"distortion_scale", &T::distortion_scale, kInUnit},
                      Param{"p", &T::p, kInUnit},
                      Param{"interpolation", &T::interpolation, kInterpolation},
                      Param{"fill", &T::fill, kRgb}, Param{"mask_fill", &T::mask_fill, kMaskFill}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// Mosaic(size, center, fill, mask_fill): YOLO's four-image mosaic
/// (ultralytics' Mosaic, YOLOv5's load_mosaic). The sample and three more,
/// drawn from the dataset by the sample's own draws (TransformGroup::partners),
/// each resized so that it fits (h, w) keeping its aspect ratio, meet at a
/// random centre (x, y drawn uniformly in center[0..1] times (w, h)) of a
/// (2h, 2w) canvas of `fill`: the sample top-left of it, the others top-right,
/// bottom-left and bottom-right. Their masks, boxes, keypoints and per-box
/// rows come along (the rows of all four, in that order). It must be the first
/// op of a transform group's list: the ops after it work on the canvas.
struct Mosaic {
  static constexpr const char* kKind = "mosaic";
  static constexpr const char* kName = "Mosaic";
  static constexpr int kSamples = 4;  ///< the sample and three more
  int h = 0, w = 0;
  std::array<double, 2> center = {0.5, 1.5};
  std::array<double, 3> fill = {114, 114, 114};
  int mask_fill = 0;
  static constexpr auto params() {
    using T = Mosaic;
    return std::tuple{Param{"h", &T::h, kPositiveWhole}, Param{"w", &T::w, kPositiveWhole},
                      Param{"center", &T::center, kRange}, Param{"fill", &T::fill, kRgb},
                      Param{"mask_fill", &T::mask_fill, kMaskFill}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int>) const { return {2 * h, 2 * w}; }
  bool fixes_size() const { return true; }
  /// Never called: a transform group runs the mosaic (UsageError).
  void apply(OpContext& ctx) const;

  /// Where sample `k` (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right)
  /// of size (w0 x h0) goes on the canvas with its centre at (xc, yc), as
  /// ultralytics places it: resized to (tw x th), its part [sx, sx + cw) x
  /// [sy, sy + ch) shown at (x, y) of the canvas.
  struct Tile {
    int tw = 0, th = 0;
    int sx = 0, sy = 0, cw = 0, ch = 0;
    int x = 0, y = 0;
  };
  Tile place(int k, int w0, int h0, int xc, int yc) const;
};

/// SanitizeBoundingBoxes(min_size, min_area, min_visibility): what the boxes
/// of a group must keep to stay (target_geometry.h's BoxFilter), whatever its
/// place in the list; the rows of the group's other per-box fields go with
/// the boxes dropped.
struct SanitizeBoundingBoxes {
  static constexpr const char* kKind = "sanitize_bounding_boxes";
  static constexpr const char* kName = "SanitizeBoundingBoxes";
  static constexpr TargetRule kTargets = TargetRule::kBoxes;
  double min_size = 1.0, min_area = 1.0, min_visibility = 0.0;
  static constexpr auto params() {
    using T = SanitizeBoundingBoxes;
    return std::tuple{Param{"min_size", &T::min_size, kNumber},
                      Param{"min_area", &T::min_area, kNumber},
                      Param{"min_visibility", &T::min_visibility, kInUnit}};
  }
  void check() const;
  void apply(OpContext&) const {}
};

}  // namespace ops

/// Every image op, in no particular order.
using ImageOp =
    std::variant<ops::RandomResizedCrop, ops::Resize, ops::CenterCrop, ops::RandomHorizontalFlip,
                 ops::Normalize, ops::ColorJitter, ops::RandomGrayscale, ops::GaussianBlur,
                 ops::HSVJitter, ops::RandAugment, ops::TrivialAugmentWide, ops::AutoAugment,
                 ops::RandomErasing, ops::RandomCrop, ops::Pad, ops::RandomVerticalFlip,
                 ops::Letterbox, ops::RandomRotation, ops::RandomAffine, ops::RandomPerspective,
                 ops::SanitizeBoundingBoxes, ops::Mosaic, ops::DetectionMixUp, ops::CopyPaste>;

/// The op's name as stoker.ops spells it ("RandomCrop"), for messages.
const char* op_name(const ImageOp& op);
/// The op's TargetRule.
ops::TargetRule op_target_rule(const ImageOp& op);

/// Checks every op (UsageError naming the op and the reason) and the list: an
/// op that must come last (Normalize) is last, but for ops on the output
/// (RandomErasing) after it; an op that reads more samples (Mosaic,
/// DetectionMixUp, CopyPaste) is first;
/// an op that gives every image a size of its own
/// (RandomRotation(expand=True)) is followed by one that fixes it. The one
/// validation of ops: the bindings call it when Python builds them, and
/// ImagePipeline and TransformGroup when they are made.
void check_image_ops(const std::vector<ImageOp>& ops);

/// The (h, w) an image of size (h, w) has after `op` (sizes only, no pixels).
std::pair<int, int> size_after(const ImageOp& op, std::pair<int, int> hw);

/// The output (h, w) when the ops fix it whatever the input size, else nullopt.
std::optional<std::pair<int, int>> fixed_output_size(const std::vector<ImageOp>& ops);

/// kUInt8, or the dtype of an op that changes it (Normalize).
DType output_dtype(const std::vector<ImageOp>& ops);

/// The most samples one run of a list reads (a Mosaic's four).
inline constexpr int kMaxSamples = ops::Mosaic::kSamples;
/// The samples the ops read: the first op's kSamples (Mosaic's 4,
/// DetectionMixUp's and CopyPaste's 2), else 1.
int samples_read(const std::vector<ImageOp>& ops);

}  // namespace stoker
