// RandAugment, TrivialAugmentWide and AutoAugment (ImageNet policy) as
// torchvision.transforms.v2 defines them (_auto_augment.py): the op spaces,
// magnitude bins (torch.linspace over num_bins), signs, probabilities and the
// meaning of each op (colour steps through color_ops.h, shears, translations
// and rotations through geometry/warp.h). Draws come from the per-sample stream.
#pragma once

#include <cstdint>

#include "augment/color_ops.h"
#include "codecs/pixels.h"
#include "geometry/detail/rng.h"
#include "geometry/warp.h"

namespace stoker {

enum class AugKind : uint8_t {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
};

const char* aug_kind_name(AugKind k);

/// One drawn op with its signed magnitude (torchvision's `magnitude` passed to
/// `_apply_image_or_video_transform`).
struct AugOp {
  AugKind kind = AugKind::kIdentity;
  double magnitude = 0;
};

enum class AutoAugmentPolicy : uint8_t { kRandAugment, kTrivialAugmentWide, kImageNet };

struct AutoAugmentParams {
  AutoAugmentPolicy policy = AutoAugmentPolicy::kRandAugment;
  int num_ops = 2;              ///< RandAugment
  int magnitude = 9;            ///< RandAugment: the bin used
  int num_magnitude_bins = 31;  ///< RandAugment, TrivialAugmentWide
  Interpolation interpolation = Interpolation::kNearest;
  bool has_fill = false;  ///< torchvision's fill=None (zero padding) when false
  Fill fill;
};

/// The most ops one draw can give.
constexpr int kMaxAugOps = 64;

/// Draws the ops for one image of (width x height). @return how many (<= kMaxAugOps).
int draw_auto_augment(const AutoAugmentParams& p, int width, int height, detail::SplitMix64& rng,
                      AugOp* out);

/// Applies drawn ops to `img` in place: runs of colour ops fused into one
/// colour program, geometric ones warped through a thread-local buffer.
void apply_aug_ops(Pixels img, const AugOp* ops, int n, const AutoAugmentParams& p);

/// The colour step of a colour op (false for identity and geometric ops).
bool aug_color_step(const AugOp& op, ColorStep* step);

/// The forward map of a geometric op on a (width x height) image.
Transform2D aug_geometry(const AugOp& op, int width, int height);

}  // namespace stoker
