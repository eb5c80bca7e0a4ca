#include "augment/auto_augment.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "common/error.h"
#include "geometry/padding.h"

namespace stoker {

namespace {

// torch.linspace(lo, hi, n)[i].
double linspace(double lo, double hi, int n, int i) {
  return n == 1 ? lo : lo + (hi - lo) * i / (n - 1);
}

// The magnitude ranges of one op space (torchvision's _AUGMENTATION_SPACE).
struct Space {
  double shear_max;
  double translate_max_x, translate_max_y;
  double rotate_max;
  double enhance_max;    // brightness, color, contrast, sharpness
  double posterize_div;  // bits = round(8 - i / ((n - 1) / div))
};

Space space_of(AutoAugmentPolicy p, int width, int height) {
  switch (p) {
    case AutoAugmentPolicy::kTrivialAugmentWide:
      return {0.99, 32.0, 32.0, 135.0, 0.99, 6.0};
    default:
      return {0.3, 150.0 / 331.0 * width, 150.0 / 331.0 * height, 30.0, 0.9, 4.0};
  }
}

// The magnitude of op `k` at bin i of n; whether it is signed.
double magnitude(AugKind k, const Space& s, int n, int i, bool* is_signed) {
  *is_signed = true;
  switch (k) {
    case AugKind::kShearX:
    case AugKind::kShearY:
      return linspace(0, s.shear_max, n, i);
    case AugKind::kTranslateX:
      return linspace(0, s.translate_max_x, n, i);
    case AugKind::kTranslateY:
      return linspace(0, s.translate_max_y, n, i);
    case AugKind::kRotate:
      return linspace(0, s.rotate_max, n, i);
    case AugKind::kBrightness:
    case AugKind::kColor:
    case AugKind::kContrast:
    case AugKind::kSharpness:
      return linspace(0, s.enhance_max, n, i);
    default:
      break;
  }
  *is_signed = false;
  if (k == AugKind::kPosterize)
    return std::nearbyint(8.0 -
                          static_cast<float>(i) / static_cast<float>((n - 1) / s.posterize_div));
  if (k == AugKind::kSolarize) return linspace(1.0, 0.0, n, i);
  return 0.0;  // identity, autocontrast, equalize, invert
}

// RandAugment's and TrivialAugmentWide's op list, in torchvision's key order.
constexpr AugKind kWideOps[] = {
    AugKind::kIdentity,     AugKind::kShearX,    AugKind::kShearY,     AugKind::kTranslateX,
    AugKind::kTranslateY,   AugKind::kRotate,    AugKind::kBrightness, AugKind::kColor,
    AugKind::kContrast,     AugKind::kSharpness, AugKind::kPosterize,  AugKind::kSolarize,
    AugKind::kAutoContrast, AugKind::kEqualize,
};
constexpr int kNumWideOps = sizeof(kWideOps) / sizeof(kWideOps[0]);

// AutoAugment's ImageNet policy: 25 sub-policies of two (op, probability, bin).
struct PolicyOp {
  AugKind kind;
  double p;
  int bin;  // -1: no magnitude
};
using A = AugKind;
constexpr PolicyOp kImageNet[25][2] = {
    {{A::kPosterize, 0.4, 8}, {A::kRotate, 0.6, 9}},
    {{A::kSolarize, 0.6, 5}, {A::kAutoContrast, 0.6, -1}},
    {{A::kEqualize, 0.8, -1}, {A::kEqualize, 0.6, -1}},
    {{A::kPosterize, 0.6, 7}, {A::kPosterize, 0.6, 6}},
    {{A::kEqualize, 0.4, -1}, {A::kSolarize, 0.2, 4}},
    {{A::kEqualize, 0.4, -1}, {A::kRotate, 0.8, 8}},
    {{A::kSolarize, 0.6, 3}, {A::kEqualize, 0.6, -1}},
    {{A::kPosterize, 0.8, 5}, {A::kEqualize, 1.0, -1}},
    {{A::kRotate, 0.2, 3}, {A::kSolarize, 0.6, 8}},
    {{A::kEqualize, 0.6, -1}, {A::kPosterize, 0.4, 6}},
    {{A::kRotate, 0.8, 8}, {A::kColor, 0.4, 0}},
    {{A::kRotate, 0.4, 9}, {A::kEqualize, 0.6, -1}},
    {{A::kEqualize, 0.0, -1}, {A::kEqualize, 0.8, -1}},
    {{A::kInvert, 0.6, -1}, {A::kEqualize, 1.0, -1}},
    {{A::kColor, 0.6, 4}, {A::kContrast, 1.0, 8}},
    {{A::kRotate, 0.8, 8}, {A::kColor, 1.0, 2}},
    {{A::kColor, 0.8, 8}, {A::kSolarize, 0.8, 7}},
    {{A::kSharpness, 0.4, 7}, {A::kInvert, 0.6, -1}},
    {{A::kShearX, 0.6, 5}, {A::kEqualize, 1.0, -1}},
    {{A::kColor, 0.4, 0}, {A::kEqualize, 0.6, -1}},
    {{A::kEqualize, 0.4, -1}, {A::kSolarize, 0.2, 4}},
    {{A::kSolarize, 0.6, 5}, {A::kAutoContrast, 0.6, -1}},
    {{A::kInvert, 0.6, -1}, {A::kEqualize, 1.0, -1}},
    {{A::kColor, 0.6, 4}, {A::kContrast, 1.0, 8}},
    {{A::kEqualize, 0.8, -1}, {A::kEqualize, 0.6, -1}},
};

// torch.rand(()) <= 0.5 flips the sign.
double signed_draw(double m, bool is_signed, detail::SplitMix64& rng) {
  return is_signed && rng.uniform(0, 1) <= 0.5 ? -m : m;
}

}  // namespace

const char* aug_kind_name(AugKind k) {
  static const char* const names[] = {
      "Identity",  "ShearX",     "ShearY",       "TranslateX", "TranslateY",
      "Rotate",    "Brightness", "Color",        "Contrast",   "Sharpness",
      "Posterize", "Solarize",   "AutoContrast", "Equalize",   "Invert",
  };
  return names[static_cast<int>(k)];
}

int draw_auto_augment(const AutoAugmentParams& p, int width, int height, detail::SplitMix64& rng,
                      AugOp* out) {
  const Space s = space_of(p.policy, width, height);
  bool sg = false;
  switch (p.policy) {
    case AutoAugmentPolicy::kRandAugment: {
      const int n = std::min(p.num_ops, kMaxAugOps);
      for (int i = 0; i < n; ++i) {
        const AugKind k = kWideOps[rng.randint(0, kNumWideOps - 1)];
        const double m = magnitude(k, s, p.num_magnitude_bins, p.magnitude, &sg);
        out[i] = {k, signed_draw(m, sg, rng)};
      }
      return n;
    }
    case AutoAugmentPolicy::kTrivialAugmentWide: {
      const AugKind k = kWideOps[rng.randint(0, kNumWideOps - 1)];
      const int bin = static_cast<int>(rng.randint(0, p.num_magnitude_bins - 1));
      const double m = magnitude(k, s, p.num_magnitude_bins, bin, &sg);
      out[0] = {k, signed_draw(m, sg, rng)};
      return 1;
    }
    case AutoAugmentPolicy::kImageNet: {
      const auto& sub = kImageNet[rng.randint(0, 24)];
      int n = 0;
      for (const PolicyOp& op : sub) {
        if (!(rng.uniform(0, 1) <= op.p)) continue;
        const double m = op.bin < 0 ? 0.0 : magnitude(op.kind, s, 10, op.bin, &sg);
        out[n++] = {op.kind, op.bin < 0 ? m : signed_draw(m, sg, rng)};
      }
      return n;
    }
  }
  return 0;
}

bool aug_color_step(const AugOp& op, ColorStep* step) {
  switch (op.kind) {
    case AugKind::kBrightness:
      *step = {ColorKind::kBrightness, 1.0 + op.magnitude};
      return true;
    case AugKind::kColor:
      *step = {ColorKind::kSaturation, 1.0 + op.magnitude};
      return true;
    case AugKind::kContrast:
      *step = {ColorKind::kContrast, 1.0 + op.magnitude};
      return true;
    case AugKind::kSharpness:
      *step = {ColorKind::kSharpness, 1.0 + op.magnitude};
      return true;
    case AugKind::kPosterize:
      *step = {ColorKind::kPosterize, static_cast<double>(static_cast<int>(op.magnitude))};
      return true;
    case AugKind::kSolarize:
      *step = {ColorKind::kSolarize, 255.0 * op.magnitude};
      return true;
    case AugKind::kAutoContrast:
      *step = {ColorKind::kAutocontrast, 0};
      return true;
    case AugKind::kEqualize:
      *step = {ColorKind::kEqualize, 0};
      return true;
    case AugKind::kInvert:
      *step = {ColorKind::kInvert, 0};
      return true;
    default:
      return false;
  }
}

Transform2D aug_geometry(const AugOp& op, int width, int height) {
  const double m = op.magnitude;
  const double deg = 180.0 / std::numbers::pi;
  switch (op.kind) {
    case AugKind::kShearX:  // F.affine(shear=[degrees(atan(m)), 0], center=[0, 0])
      return Transform2D::affine(0, 0, 0, 1, std::atan(m) * deg, 0, {0, 0});
    case AugKind::kShearY:
      return Transform2D::affine(0, 0, 0, 1, 0, std::atan(m) * deg, {0, 0});
    case AugKind::kTranslateX:  // translate=[int(m), 0]
      return Transform2D::translation(std::trunc(m), 0);
    case AugKind::kTranslateY:
      return Transform2D::translation(0, std::trunc(m));
    case AugKind::kRotate:  // F.rotate(angle=m) is F.affine(angle=-m) about the centre
      return Transform2D::affine(-m, 0, 0, 1, 0, 0, {0.5 * width, 0.5 * height});
    default:
      return Transform2D();
  }
}

void apply_aug_ops(Pixels img, const AugOp* ops, int n, const AutoAugmentParams& p) {
  thread_local std::vector<uint8_t> buf;
  ColorStep steps[kMaxAugOps];
  size_t pending = 0;
  auto flush = [&] {
    if (pending) apply_color_steps(img, steps, pending);
    pending = 0;
  };
  const Fill* fill = p.has_fill ? &p.fill : nullptr;
  for (int i = 0; i < n; ++i) {
    const AugOp& op = ops[i];
    if (op.kind == AugKind::kIdentity) continue;
    if (aug_color_step(op, &steps[pending])) {
      ++pending;
      continue;
    }
    flush();
    buf.resize(img.row_bytes() * img.height);
    const Pixels tmp = packed_pixels(buf.data(), img.width, img.height, img.channels);
    if (op.kind == AugKind::kTranslateX || op.kind == AugKind::kTranslateY) {
      // Whole-pixel shifts: exact for both interpolations.
      const Transform2D t = aug_geometry(op, img.width, img.height);
      copy_window(img, static_cast<int>(-t[2]), static_cast<int>(-t[5]), tmp, PadMode::kConstant,
                  fill ? *fill : Fill{});
    } else {
      warp_pixels(img, tmp, aug_geometry(op, img.width, img.height).inverse(), p.interpolation,
                  fill);
    }
    for (int y = 0; y < img.height; ++y) std::memcpy(img.row(y), tmp.row(y), img.row_bytes());
  }
  flush();
}

}  // namespace stoker
