// The kernels of the augmentation ops of geometry/image_ops.h: each draws its
// parameters from the sample's stream in a fixed order, then runs the
// kernels of color_ops.h, gaussian_blur.h, hsv_jitter.h, auto_augment.h or
// erasing.h on the image's pixels (or, for RandomErasing, on the output).
#include <cmath>

#include "augment/auto_augment.h"
#include "augment/color_ops.h"
#include "augment/erasing.h"
#include "augment/gaussian_blur.h"
#include "augment/hsv_jitter.h"
#include "common/error.h"
#include "geometry/detail/op_checks.h"
#include "geometry/image_ops.h"
#include "geometry/op_context.h"
#include "geometry/padding.h"

namespace stoker::ops {

namespace {

void check_range(const char* op, const char* name, const std::array<double, 2>& r, double lo,
                 double hi) {
  STOKER_CHECK(
      std::isfinite(r[0]) && std::isfinite(r[1]) && lo <= r[0] && r[0] <= r[1] && r[1] <= hi,
      UsageError, op, ": ", name, " must satisfy ", lo, " <= lo <= hi <= ", hi, ", got (", r[0],
      ", ", r[1], ")");
}

void check_unit(const char* op, const char* name, double v) {
  STOKER_CHECK(v >= 0 && v <= 1, UsageError, op, ": ", name, " must be ", kInUnit, ", got ", v);
}

double draw(const std::array<double, 2>& r, detail::SplitMix64& rng) {
  return r[0] + (r[1] - r[0]) * rng.uniform(0, 1);
}

// The policies run with torchvision's defaults: nearest, no fill.
void auto_augment(OpContext& ctx, const AutoAugmentParams& p) {
  const Pixels px = ctx.pixels();
  AugOp drawn[kMaxAugOps];
  const int n = draw_auto_augment(p, px.width, px.height, ctx.rng(), drawn);
  apply_aug_ops(px, drawn, n, p);
}

}  // namespace

// ---- ColorJitter ------------------------------------------------------------

void ColorJitter::check() const {
  constexpr double kInf = 1e300;
  check_range(kName, "brightness", brightness, 0, kInf);
  check_range(kName, "contrast", contrast, 0, kInf);
  check_range(kName, "saturation", saturation, 0, kInf);
  check_range(kName, "hue", hue, -0.5, 0.5);
}

void ColorJitter::apply(OpContext& ctx) const {
  // torchvision: a random order (randperm(4)), then the factors; a range at
  // its centre is no op (None). All four are drawn whatever is set, so the
  // stream does not depend on which are.
  detail::SplitMix64& rng = ctx.rng();
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.randint(0, i)]);
  const std::array<double, 2>* ranges[4] = {&brightness, &contrast, &saturation, &hue};
  const ColorKind kinds[4] = {ColorKind::kBrightness, ColorKind::kContrast, ColorKind::kSaturation,
                              ColorKind::kHue};
  const double centre[4] = {1, 1, 1, 0};
  double factor[4];
  for (int k = 0; k < 4; ++k) factor[k] = draw(*ranges[k], rng);
  ColorStep steps[4];
  size_t n = 0;
  for (int k : order)
    if (!((*ranges[k])[0] == centre[k] && (*ranges[k])[1] == centre[k]))
      steps[n++] = {kinds[k], factor[k]};
  if (n) ctx.color(steps, n);
}

// ---- RandomGrayscale ----------------------------------------------------------

void RandomGrayscale::check() const { check_unit(kName, "p", p); }

void RandomGrayscale::apply(OpContext& ctx) const {
  if (!(ctx.rng().uniform(0, 1) < p)) return;
  const ColorStep gray{ColorKind::kGrayscale, 0};
  ctx.color(&gray, 1);
}

// ---- GaussianBlur ---------------------------------------------------------------

void GaussianBlur::check() const {
  STOKER_CHECK(kh > 0 && kw > 0 && kh % 2 == 1 && kw % 2 == 1, UsageError, kName,
               ": kernel_size must be odd and positive, got (", kh, ", ", kw, ")");
  STOKER_CHECK(sigma[0] > 0 && sigma[0] <= sigma[1] && std::isfinite(sigma[1]), UsageError, kName,
               ": sigma must satisfy 0 < lo <= hi, got (", sigma[0], ", ", sigma[1], ")");
}

void GaussianBlur::apply(OpContext& ctx) const {
  const float s = static_cast<float>(draw(sigma, ctx.rng()));
  gaussian_blur(ctx.pixels(), kw, kh, s, s);
}

// ---- HSVJitter ------------------------------------------------------------------

void HSVJitter::check() const {
  check_unit(kName, "h", h);
  check_unit(kName, "s", s);
  check_unit(kName, "v", v);
}

void HSVJitter::apply(OpContext& ctx) const {
  const HsvGains g = draw_hsv_gains(h, s, v, ctx.rng());
  ctx.map_pixels([&g](Pixels p) { apply_hsv_gains(p, g); });
}

// ---- RandAugment, TrivialAugmentWide, AutoAugment -------------------------------------

void RandAugment::check() const {
  STOKER_CHECK(num_ops >= 0 && num_ops <= kMaxAugOps, UsageError, kName,
               ": num_ops must be in [0, ", kMaxAugOps, "], got ", num_ops);
  STOKER_CHECK(num_magnitude_bins >= 2 && magnitude >= 0 && magnitude < num_magnitude_bins,
               UsageError, kName, ": magnitude must be in [0, num_magnitude_bins), got ", magnitude,
               " of ", num_magnitude_bins);
}

void RandAugment::apply(OpContext& ctx) const {
  AutoAugmentParams p;
  p.policy = AutoAugmentPolicy::kRandAugment;
  p.num_ops = num_ops;
  p.magnitude = magnitude;
  p.num_magnitude_bins = num_magnitude_bins;
  auto_augment(ctx, p);
}

void TrivialAugmentWide::check() const {
  STOKER_CHECK(num_magnitude_bins >= 2, UsageError, kName,
               ": num_magnitude_bins must be >= 2, got ", num_magnitude_bins);
}

void TrivialAugmentWide::apply(OpContext& ctx) const {
  AutoAugmentParams p;
  p.policy = AutoAugmentPolicy::kTrivialAugmentWide;
  p.num_magnitude_bins = num_magnitude_bins;
  auto_augment(ctx, p);
}

void AutoAugment::apply(OpContext& ctx) const {
  AutoAugmentParams p;
  p.policy = AutoAugmentPolicy::kImageNet;
  auto_augment(ctx, p);
}

// ---- RandomErasing ------------------------------------------------------------------

void RandomErasing::check() const {
  check_unit(kName, "p", p);
  check_range(kName, "scale", scale, 0, 1);
  STOKER_CHECK(ratio[0] > 0 && ratio[0] <= ratio[1] && std::isfinite(ratio[1]), UsageError, kName,
               ": ratio must satisfy 0 < lo <= hi, got (", ratio[0], ", ", ratio[1], ")");
  STOKER_CHECK(random == 0 || random == 1, UsageError, kName, ": random must be 0 or 1");
}

void RandomErasing::apply(OpContext& ctx) const { ctx.on_output(*this); }

void RandomErasing::erase(void* out, DType dtype, bool chw, int h, int w,
                          detail::SplitMix64& rng) const {
  const ErasingParams e{p, scale[0], scale[1], std::log(ratio[0]), std::log(ratio[1])};
  const auto r = draw_erasing(e, w, h, rng);
  if (!r) return;
  STOKER_CHECK(!random || dtype != DType::kUInt8, UsageError, kName,
               "(value='random') needs a float output: put it after Normalize");
  const float v[3] = {static_cast<float>(value[0]), static_cast<float>(value[1]),
                      static_cast<float>(value[2])};
  erase_rect(out, dtype, chw, h, w, 3, *r, random ? nullptr : v, &rng);
}

// ---- RandomCrop, Pad ---------------------------------------------------------------

namespace {

void check_mode(const char* op, int mode) {
  STOKER_CHECK(mode >= 0 && mode <= 3, UsageError, op,
               ": padding_mode must be constant, edge, reflect or symmetric");
}

}  // namespace

void check_fill(const char* op, const std::array<double, 3>& fill, int mask_fill) {
  for (double v : fill)
    STOKER_CHECK(v >= 0 && v <= 255, UsageError, op, ": fill must be 3 values in [0, 255]");
  STOKER_CHECK(mask_fill >= 0 && mask_fill <= 255, UsageError, op, ": mask_fill must be ",
               kMaskFill, ", got ", mask_fill);
}

Fill fill_of(const std::array<double, 3>& f) {
  Fill out;
  for (int c = 0; c < 3; ++c) out.v[c] = static_cast<uint8_t>(std::nearbyint(f[c]));
  return out;
}

void RandomCrop::check() const {
  STOKER_CHECK(h > 0 && w > 0 && pad_left >= 0 && pad_top >= 0 && pad_right >= 0 && pad_bottom >= 0,
               UsageError, kName, ": size must be positive and padding non-negative");
  STOKER_CHECK(pad_if_needed == 0 || pad_if_needed == 1, UsageError, kName,
               ": pad_if_needed must be 0 or 1");
  check_fill(kName, fill, mask_fill);
  check_mode(kName, padding_mode);
}

void RandomCrop::apply(OpContext& ctx) const {
  int pl = pad_left, pt = pad_top, pr = pad_right, pb = pad_bottom;
  int ph = ctx.height() + pt + pb, pw = ctx.width() + pl + pr;
  if (pad_if_needed) {  // torchvision pads both sides by the shortfall
    if (ph < h) {
      const int d = h - ph;
      pt += d, pb += d, ph += 2 * d;
    }
    if (pw < w) {
      const int d = w - pw;
      pl += d, pr += d, pw += 2 * d;
    }
  }
  if (ph < h || pw < w)
    STOKER_THROW(DataError, kName, ": crop size ", h, "x", w, " is larger than the ",
                 pl || pt || pr || pb ? "padded " : "", "image (", ph, "x", pw,
                 "); pass pad_if_needed=True");
  const int top = ph > h ? static_cast<int>(ctx.rng().randint(0, ph - h)) : 0;
  const int left = pw > w ? static_cast<int>(ctx.rng().randint(0, pw - w)) : 0;
  ctx.window({left - pl, top - pt, w, h}, static_cast<PadMode>(padding_mode), fill_of(fill));
}

void Pad::check() const {
  STOKER_CHECK(left >= 0 && top >= 0 && right >= 0 && bottom >= 0, UsageError, kName,
               ": padding must be non-negative");
  check_fill(kName, fill, mask_fill);
  check_mode(kName, padding_mode);
}

void Pad::apply(OpContext& ctx) const {
  ctx.window({-left, -top, ctx.width() + left + right, ctx.height() + top + bottom},
             static_cast<PadMode>(padding_mode), fill_of(fill));
}

}  // namespace stoker::ops
