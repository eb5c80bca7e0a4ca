#pragma once

// What an op of image_ops.h declares besides its kernel: its parameters
// (Param, and what each must be, as errors say it) and how targets of a
// transform group follow it (TargetRule).

#include <cstdint>

namespace stoker::ops {

/// One parameter of an op: its name (Python's keyword), the member that holds
/// it, and what it must be (said by the errors about it). A parameter added to
/// an op later is `quiet`: its repr leaves it out while it has its default, so
/// the op reads as it did before.
template <typename Op, typename T>
struct Param {
  const char* name;
  T Op::*member;
  const char* what;
  bool quiet = false;
};
template <typename Op, typename T>
Param(const char*, T Op::*, const char*) -> Param<Op, T>;
template <typename Op, typename T>
Param(const char*, T Op::*, const char*, bool) -> Param<Op, T>;

// What parameters must be, as errors say it.
inline constexpr const char* kPositiveWhole = "a positive whole number";
inline constexpr const char* kWholeOrZero = "a whole number >= 0";
inline constexpr const char* kNumber = "a finite number";
inline constexpr const char* kInUnit = "a number in [0, 1]";
inline constexpr const char* kRgb = "3 values (RGB)";
inline constexpr const char* kFloatType = "'float32', 'float16' or 'bfloat16'";
inline constexpr const char* kFlag = "0 or 1";
inline constexpr const char* kInterpolation = "0 (nearest) or 1 (bilinear)";
inline constexpr const char* kPairs = "pairs of keypoint indices, flattened";

/// How an op treats the targets of a transform group (transform_group.h):
/// masks, boxes and keypoints follow every move an op makes through OpContext,
/// unless its rule says otherwise.
enum class TargetRule : uint8_t {
  kFollow,     ///< moves the image: targets follow (the default)
  kImageOnly,  ///< changes pixel values only (colour, blur, Normalize, RandomErasing):
               ///< targets stay as they are; refused where a group has no RGB image
  kNone,       ///< moves pixels in ways targets cannot follow (the auto-augment
               ///< policies' shears and rotations): refused in a group with targets
  kBoxes,      ///< acts on the boxes of a group only (SanitizeBoundingBoxes)
};

template <typename Op>
constexpr TargetRule target_rule() {
  if constexpr (requires { Op::kTargets; })
    return Op::kTargets;
  else
    return TargetRule::kFollow;
}

}  // namespace stoker::ops
