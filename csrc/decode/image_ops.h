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
//     // out_dtype() if it changes the dtype, kLast if it must come last
//   };
//
// and its name in the ImageOp variant below. Kernels draw their randomness
// from ctx.rng() only, in a fixed order, and move the image only through ctx
// (crop, resize, flip), which keeps the sample's geometry (geometry.h) with
// the pixels: that is what lets targets follow the image and one set of draws
// serve a group of fields (one crop for an image and its mask).
#pragma once

#include <array>
#include <optional>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "common/dtype.h"

namespace stoker {

class OpContext;  // op_context.h: what a kernel sees of the image it transforms

namespace ops {

/// One parameter of an op: its name (Python's keyword), the member that holds
/// it, and what it must be (said by the errors about it).
template <typename Op, typename T>
struct Param {
  const char* name;
  T Op::*member;
  const char* what;
};
template <typename Op, typename T>
Param(const char*, T Op::*, const char*) -> Param<Op, T>;

// What parameters must be, as errors say it.
inline constexpr const char* kPositiveWhole = "a positive whole number";
inline constexpr const char* kWholeOrZero = "a whole number >= 0";
inline constexpr const char* kNumber = "a finite number";
inline constexpr const char* kInUnit = "a number in [0, 1]";
inline constexpr const char* kRgb = "3 values (RGB)";
inline constexpr const char* kFloatType = "'float32' or 'float16'";

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
/// (h, w). An antialiased triangle filter (PIL's BILINEAR).
struct Resize {
  static constexpr const char* kKind = "resize";
  static constexpr const char* kName = "Resize";
  int h = 0, w = 0;
  int shorter = 0;
  static constexpr auto params() {
    return std::tuple{Param{"h", &Resize::h, kWholeOrZero}, Param{"w", &Resize::w, kWholeOrZero},
                      Param{"shorter", &Resize::shorter, kWholeOrZero}};
  }
  void check() const;
  std::pair<int, int> size_after(std::pair<int, int> hw) const;
  bool fixes_size() const { return shorter == 0; }
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

/// A left-right mirror with probability p.
struct RandomHorizontalFlip {
  static constexpr const char* kKind = "random_horizontal_flip";
  static constexpr const char* kName = "RandomHorizontalFlip";
  double p = 0.5;
  static constexpr auto params() {
    return std::tuple{Param{"p", &RandomHorizontalFlip::p, kInUnit}};
  }
  void check() const;
  void apply(OpContext& ctx) const;
};

/// (x / 255 - mean) / std per RGB channel, written as float32 or float16.
struct Normalize {
  static constexpr const char* kKind = "normalize";
  static constexpr const char* kName = "Normalize";
  static constexpr bool kLast = true;  // the output's dtype is no longer uint8
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

}  // namespace ops

/// Every image op, in no particular order.
using ImageOp = std::variant<ops::RandomResizedCrop, ops::Resize, ops::CenterCrop,
                             ops::RandomHorizontalFlip, ops::Normalize>;

/// Checks every op (UsageError naming the op and the reason) and the list: an
/// op that must come last (Normalize) is last. The one validation of ops: the
/// bindings call it when Python builds them, and ImagePipeline when it is made.
void check_image_ops(const std::vector<ImageOp>& ops);

/// The (h, w) an image of size (h, w) has after `op` (sizes only, no pixels).
std::pair<int, int> size_after(const ImageOp& op, std::pair<int, int> hw);

/// The output (h, w) when the ops fix it whatever the input size, else nullopt.
std::optional<std::pair<int, int>> fixed_output_size(const std::vector<ImageOp>& ops);

/// kUInt8, or the dtype of an op that changes it (Normalize).
DType output_dtype(const std::vector<ImageOp>& ops);

}  // namespace stoker
