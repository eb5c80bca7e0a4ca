// The augmentation ops beyond the five classic ones (image_ops.h), typed, with
// torchvision.transforms.v2's parameters and defaults, and the rules of a
// transform group: which op applies to which kind of target.
//
// Each op draws its random parameters once per sample (draw_*), from the
// group's stream, on the primary image's current canvas size; the draws are
// then applied to every member of the group (augment_pipeline.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "decode/auto_augment.h"
#include "decode/erasing.h"
#include "decode/image_ops.h"
#include "decode/padding.h"
#include "decode/pixels.h"
#include "decode/warp.h"

namespace stoker {

namespace aug {

/// Fill of pixels that come from outside an image: the image's (None, as
/// torchvision's fill=None, means zero padding with no mask blend) and the
/// masks' (a class id: 0, or an ignore index such as 255).
struct FillSpec {
  std::optional<Fill> image;
  uint8_t mask = 0;
};

/// RandomCrop(size, padding, pad_if_needed, fill, padding_mode).
struct RandomCrop {
  int h = 0, w = 0;
  int pad_left = 0, pad_top = 0, pad_right = 0, pad_bottom = 0;
  bool pad_if_needed = false;
  PadMode mode = PadMode::kConstant;
  FillSpec fill;
};

/// Pad(padding, fill, padding_mode).
struct Pad {
  int left = 0, top = 0, right = 0, bottom = 0;
  PadMode mode = PadMode::kConstant;
  FillSpec fill;
};

/// Letterbox(size, fill=114): resized to fit (h, w) keeping the aspect ratio
/// (ultralytics' LetterBox, centred, scaleup), the rest filled.
struct Letterbox {
  int h = 0, w = 0;
  bool scaleup = true;
  FillSpec fill{Fill{{114, 114, 114}}, 0};
};

struct VerticalFlip {
  double p = 0.5;
};

/// RandomRotation(degrees, interpolation, expand, center, fill).
struct RandomRotation {
  double lo = 0, hi = 0;
  Interpolation interpolation = Interpolation::kNearest;
  bool expand = false;
  std::optional<Point2> center;
  FillSpec fill{Fill{}, 0};
};

/// RandomAffine(degrees, translate, scale, shear, interpolation, fill, center).
struct RandomAffine {
  double deg_lo = 0, deg_hi = 0;
  std::optional<std::array<double, 2>> translate;  ///< max fractions of (w, h)
  std::optional<std::array<double, 2>> scale;      ///< (lo, hi)
  std::optional<std::array<double, 4>> shear;      ///< x lo, x hi, y lo, y hi (y 0 0 for 2 values)
  Interpolation interpolation = Interpolation::kNearest;
  std::optional<Point2> center;
  FillSpec fill{Fill{}, 0};
};

/// RandomPerspective(distortion_scale, p, interpolation, fill).
struct RandomPerspective {
  double distortion = 0.5;
  double p = 0.5;
  Interpolation interpolation = Interpolation::kBilinear;
  FillSpec fill{Fill{}, 0};
};

/// ColorJitter: each factor range, or none; drawn in a random order.
struct ColorJitter {
  std::optional<std::array<double, 2>> brightness, contrast, saturation, hue;
};

struct RandomGrayscale {
  double p = 0.1;
};

/// HSVJitter: ultralytics' augment_hsv (hsv_jitter.h), YOLO's colour jitter.
struct HsvJitter {
  double h = 0.015, s = 0.7, v = 0.4;
};

/// GaussianBlur(kernel_size, sigma=(0.1, 2.0)): one sigma drawn for both axes.
struct GaussianBlur {
  int kx = 3, ky = 3;
  double sigma_lo = 0.1, sigma_hi = 2.0;
};

/// RandAugment, TrivialAugmentWide, AutoAugment (auto_augment.h).
struct AutoAugment {
  AutoAugmentParams params;
};

/// RandomErasing, on the written output (after Normalize, as timm uses it).
struct RandomErasing {
  ErasingParams params;
  bool random_value = false;  ///< value="random": N(0, 1) per element
  float value[3] = {0, 0, 0};
};

}  // namespace aug

using AugmentOp =
    std::variant<ops::RandomResizedCrop, ops::Resize, ops::CenterCrop, ops::RandomHorizontalFlip,
                 ops::Normalize, aug::RandomCrop, aug::Pad, aug::Letterbox, aug::VerticalFlip,
                 aug::RandomRotation, aug::RandomAffine, aug::RandomPerspective, aug::ColorJitter,
                 aug::RandomGrayscale, aug::HsvJitter, aug::GaussianBlur, aug::AutoAugment,
                 aug::RandomErasing>;

/// The op's name as stoker.ops spells it ("RandomCrop", ...), for messages.
const char* augment_op_name(const AugmentOp& op);

/// Whether the op moves pixels (targets follow it), changes only colours
/// (masks, boxes and keypoints ignore it), or works on the written output.
enum class OpRole : uint8_t { kGeometry, kColor, kOutput };
OpRole augment_op_role(const AugmentOp& op);

/// UsageError naming the op for a value out of range (kernel sizes, ranges,
/// probabilities), and for expand=True without a later op fixing the size.
void check_augment_ops(const std::vector<AugmentOp>& ops);

/// The (h, w) `op` gives whatever its input (RandomResizedCrop, Resize((h, w)),
/// CenterCrop, RandomCrop, Letterbox), or nullopt.
std::optional<std::pair<int, int>> augment_fixed_size(const AugmentOp& op);

/// The (h, w) after `op` on an (h, w) canvas, when it does not depend on a
/// draw; nullopt for RandomRotation(expand=True).
std::optional<std::pair<int, int>> augment_size_after(const AugmentOp& op, std::pair<int, int> hw);

/// Letterbox's placement of a (w x h) image: the resized size and the offset.
struct LetterboxFit {
  int w = 0, h = 0, left = 0, top = 0;
};
LetterboxFit letterbox_fit(const aug::Letterbox& op, int w, int h);

}  // namespace stoker
