// Unit tests of the augmentation kernels on pixels (csrc/augment, csrc/geometry: color_ops,
// gaussian_blur, warp, padding, erasing, auto_augment) and of the draws that
// parametrise them. The reference tests against NumPy/Pillow definitions
// are in tests/test_augment_kernels.py; these check the properties and the
// fusion itself, and run under the sanitizers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "augment/auto_augment.h"
#include "augment/color_ops.h"
#include "augment/erasing.h"
#include "augment/gaussian_blur.h"
#include "check.h"
#include "common/detail/half.h"
#include "common/error.h"
#include "geometry/detail/random_draws.h"
#include "geometry/padding.h"
#include "geometry/warp.h"

using namespace stoker;
using Bytes = std::vector<uint8_t>;

namespace {

Bytes noise_image(int w, int h, int ch, uint32_t seed) {
  Bytes px(static_cast<size_t>(w) * h * ch);
  detail::SplitMix64 rng(seed);
  for (size_t i = 0; i < px.size(); ++i) {
    // A smooth base plus noise, so histograms and means are not trivial.
    const size_t p = i / ch;
    const double v = 100 + 60 * std::sin(static_cast<double>(p % w) / 7.0 + (i % ch)) +
                     40 * std::cos(static_cast<double>(p / w) / 5.0) + rng.uniform(-20, 20);
    px[i] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
  }
  return px;
}

Pixels view(Bytes& b, int w, int h, int ch) { return packed_pixels(b.data(), w, h, ch); }

// Each step alone, in turn: what the fused program must equal.
Bytes one_by_one(Bytes img, int w, int h, int ch, const std::vector<ColorStep>& steps) {
  for (const ColorStep& s : steps) apply_color_steps(view(img, w, h, ch), &s, 1);
  return img;
}

Bytes fused(Bytes img, int w, int h, int ch, const std::vector<ColorStep>& steps) {
  apply_color_steps(view(img, w, h, ch), steps.data(), steps.size());
  return img;
}

// --- colour ---------------------------------------------------------------

void test_single_steps_known_values() {
  const int w = 4, h = 1;
  Bytes img = {10, 100, 200, 0, 128, 255, 30, 60, 90, 255, 255, 255};
  Bytes a = img;
  ColorStep b{ColorKind::kBrightness, 1.5f};
  apply_color_steps(view(a, w, h, 3), &b, 1);
  CHECK((a == Bytes{15, 150, 255, 0, 192, 255, 45, 90, 135, 255, 255, 255}));
  a = img;
  ColorStep inv{ColorKind::kInvert, 0};
  apply_color_steps(view(a, w, h, 3), &inv, 1);
  for (size_t i = 0; i < img.size(); ++i) CHECK_EQ(a[i], 255 - img[i]);
  a = img;
  ColorStep post{ColorKind::kPosterize, 2};
  apply_color_steps(view(a, w, h, 3), &post, 1);
  for (size_t i = 0; i < img.size(); ++i) CHECK_EQ(a[i], img[i] & 0xC0);
  a = img;
  ColorStep sol{ColorKind::kSolarize, 127.5f};
  apply_color_steps(view(a, w, h, 3), &sol, 1);
  for (size_t i = 0; i < img.size(); ++i) CHECK_EQ(a[i], img[i] >= 128 ? 255 - img[i] : img[i]);
  a = img;
  ColorStep gray{ColorKind::kGrayscale, 0};
  apply_color_steps(view(a, w, h, 3), &gray, 1);
  // 0.2989 * 10 + 0.587 * 100 + 0.114 * 200 = 84.489 -> 84
  CHECK(a[0] == 84 && a[1] == 84 && a[2] == 84);
  CHECK(a[9] == 255 || a[9] == 254);  // 0.2989 + 0.587 + 0.114 = 0.9999 of 255
  // Saturation 0 is the grayscale (floored); 1 is the identity.
  a = img;
  ColorStep sat0{ColorKind::kSaturation, 0};
  apply_color_steps(view(a, w, h, 3), &sat0, 1);
  CHECK(a[0] == 84 && a[1] == 84 && a[2] == 84);
  a = img;
  ColorStep sat1{ColorKind::kSaturation, 1};
  apply_color_steps(view(a, w, h, 3), &sat1, 1);
  CHECK(a == img);
  // Hue 0 and hue +-0.5 twice are (near) identities; gray pixels never change.
  a = img;
  ColorStep hue0{ColorKind::kHue, 0};
  apply_color_steps(view(a, w, h, 3), &hue0, 1);
  for (size_t i = 0; i < img.size(); ++i) CHECK(std::abs(a[i] - img[i]) <= 1);
  CHECK(a[9] == 255 && a[10] == 255 && a[11] == 255);
}

void test_contrast_equalize_autocontrast_use_whole_image_statistics() {
  // Contrast 0 gives the mean of the floored grayscale everywhere.
  const int w = 3, h = 2;
  Bytes img = {0, 0, 0, 255, 255, 255, 10, 10, 10, 20, 20, 20, 30, 30, 30, 40, 40, 40};
  Bytes a = img;
  ColorStep c0{ColorKind::kContrast, 0};
  apply_color_steps(view(a, w, h, 3), &c0, 1);
  // grays: 0, 254 (0.9999 * 255 floored), 9, 19, 29, 39 -> mean 58.33
  for (uint8_t v : a) CHECK(v == 58);
  // Autocontrast stretches each channel's [min, max] to [0, 255].
  Bytes g = {50, 100, 150, 200};
  ColorStep ac{ColorKind::kAutocontrast, 0};
  apply_color_steps(view(g, 4, 1, 1), &ac, 1);
  // In float32 as torchvision: 150 / (150 * (1 / 255)) = 254.99998, truncated to 254.
  CHECK((g == Bytes{0, 85, 170, 254}));
  // A flat channel is left alone.
  Bytes flat(12, 77);
  apply_color_steps(view(flat, 4, 1, 3), &ac, 1);
  CHECK(flat == Bytes(12, 77));
  // Equalize: PIL's table. 512 pixels of two values: step = 256 // 255 = 1,
  // lut[40] = cdf[39] = 0, lut[90] = cdf[89] = 256, clamped to 255. 8 pixels
  // 0..7: step = 7 // 255 = 0, unchanged.
  Bytes eq(512);
  for (size_t i = 0; i < eq.size(); ++i) eq[i] = i < 256 ? 40 : 90;
  ColorStep e{ColorKind::kEqualize, 0};
  apply_color_steps(view(eq, 512, 1, 1), &e, 1);
  CHECK(eq[0] == 0 && eq[300] == 255);
  Bytes few = {0, 1, 2, 3, 4, 5, 6, 7};
  apply_color_steps(view(few, 8, 1, 1), &e, 1);
  CHECK((few == Bytes{0, 1, 2, 3, 4, 5, 6, 7}));
}

void test_fused_program_equals_steps_one_by_one() {
  const int w = 37, h = 23;
  using K = ColorKind;
  const std::vector<std::vector<ColorStep>> programs = {
      {{K::kBrightness, 1.3f}, {K::kContrast, 0.7f}, {K::kSaturation, 1.4f}, {K::kHue, 0.08f}},
      {{K::kHue, -0.2f}, {K::kSaturation, 0.5f}, {K::kBrightness, 0.6f}, {K::kContrast, 1.6f}},
      {{K::kContrast, 1.2f}, {K::kEqualize, 0}, {K::kPosterize, 5}, {K::kSolarize, 200}},
      {{K::kSharpness, 1.8f}, {K::kAutocontrast, 0}, {K::kInvert, 0}, {K::kSharpness, 0.2f}},
      {{K::kEqualize, 0}, {K::kSharpness, 1.5f}, {K::kContrast, 0.4f}, {K::kGrayscale, 0}},
      {{K::kGrayscale, 0}, {K::kHue, 0.3f}, {K::kAutocontrast, 0}},
  };
  for (int ch : {3, 1})
    for (const auto& prog : programs) {
      const Bytes img = noise_image(w, h, ch, 7);
      CHECK(fused(img, w, h, ch, prog) == one_by_one(img, w, h, ch, prog));
    }
}

void test_fusion_pass_counts() {
  using K = ColorKind;
  auto passes = [](std::vector<ColorStep> s, int ch = 3) {
    return detail::color_pass_count(s.data(), s.size(), ch);
  };
  // ColorJitter: the steps before contrast gather its mean, then one more pass.
  CHECK_EQ(passes({{K::kBrightness, 1}, {K::kSaturation, 1}, {K::kContrast, 1}, {K::kHue, 0}}), 2);
  CHECK_EQ(passes({{K::kBrightness, 1}, {K::kSaturation, 1}, {K::kHue, 0.1f}}), 1);
  // Contrast first: a read-only statistics pass, then the pass.
  CHECK_EQ(passes({{K::kContrast, 1}, {K::kBrightness, 1}}), 2);
  CHECK_EQ(passes({{K::kPosterize, 4}, {K::kSolarize, 9}, {K::kInvert, 0}}), 1);
  CHECK_EQ(passes({{K::kSharpness, 2}, {K::kInvert, 0}}), 1);
  CHECK_EQ(passes({{K::kInvert, 0}, {K::kSharpness, 2}}), 2);
  // On one channel saturation and hue vanish.
  CHECK_EQ(passes({{K::kSaturation, 2}, {K::kHue, 0.2f}}, 1), 0);
}

// The SIMD table lookup (NOTE [ Byte tables with VBMI ]) gives the scalar loop's
// bytes: one table and three interleaved ones, every length from empty to a few
// blocks (the masked tail), at offsets that start a block on each channel.
void test_table_lookup_simd_equals_scalar() {
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint8_t>(state >> 56);
  };
  uint8_t luts[3][256];
  for (auto& l : luts)
    for (auto& v : l) v = next();
  const uint8_t* tables[3] = {luts[0], luts[1], luts[2]};
  Bytes src(3 * 200);
  for (auto& v : src) v = next();
  for (int tables_n : {1, 3})
    for (size_t n = 0; n <= src.size(); n += tables_n) {
      Bytes a(src.begin(), src.begin() + n), b = a;
      detail::lookup_bytes(tables, tables_n, a.data(), n, /*simd=*/true);
      detail::lookup_bytes(tables, tables_n, b.data(), n, /*simd=*/false);
      CHECK(a == b);
      for (size_t i = 0; i < n; ++i)
        CHECK_EQ(int(b[i]), int(luts[tables_n == 1 ? 0 : i % 3][src[i]]));
    }
  std::printf("  table lookup: SIMD path %s on this CPU\n",
              detail::lookup_bytes_has_simd() ? "checked" : "absent (scalar only)");
}

void test_sharpness_keeps_border_and_smooths_interior() {
  const int w = 5, h = 5;
  Bytes img(w * h, 100);
  img[12] = 230;  // a bright centre
  Bytes a = img;
  ColorStep s0{ColorKind::kSharpness, 0};  // factor 0: the smoothed image
  apply_color_steps(view(a, w, h, 1), &s0, 1);
  // centre: (8 * 100 + 5 * 230) / 13 = 150; a neighbour: (7 * 100 + 230 + 5 * 100) / 13 = 110
  CHECK_EQ(a[12], 150);
  CHECK_EQ(a[7], 110);
  for (int x = 0; x < w; ++x) CHECK(a[x] == 100 && a[20 + x] == 100);  // border rows kept
  // Factor 1 is the identity; tiny images are left alone.
  Bytes b = img;
  ColorStep s1{ColorKind::kSharpness, 1};
  apply_color_steps(view(b, w, h, 1), &s1, 1);
  CHECK(b == img);
  Bytes tiny = {1, 2, 3, 4};
  apply_color_steps(view(tiny, 2, 2, 1), &s0, 1);
  CHECK((tiny == Bytes{1, 2, 3, 4}));
}

// --- blur -----------------------------------------------------------------

void test_gaussian_blur() {
  // A constant image stays constant; an impulse spreads as the outer product.
  Bytes flat(20 * 9 * 3, 123);
  gaussian_blur(view(flat, 20, 9, 3), 5, 7, 1.3f, 2.0f);
  CHECK(flat == Bytes(20 * 9 * 3, 123));
  const int w = 15, h = 15;
  Bytes imp(w * h, 0);
  imp[7 * w + 7] = 255;
  gaussian_blur(view(imp, w, h, 1), 5, 3, 1.0f, 0.8f);
  float kx[5], ky[3];
  gaussian_kernel(5, 1.0f, kx);
  gaussian_kernel(3, 0.8f, ky);
  for (int dy = -1; dy <= 1; ++dy)
    for (int dx = -2; dx <= 2; ++dx) {
      const double want = 255.0 * kx[dx + 2] * ky[dy + 1];
      CHECK(std::abs(imp[(7 + dy) * w + 7 + dx] - want) <= 0.5 + 1e-3);
    }
  CHECK_EQ(imp[7 * w + 10], 0);
  // Kernel: symmetric, sums to 1, sigma -> 0 is a delta.
  float k[9];
  gaussian_kernel(9, 2.0f, k);
  double sum = 0;
  for (int i = 0; i < 9; ++i) sum += k[i];
  CHECK(std::abs(sum - 1) < 1e-6 && k[0] == k[8] && k[4] > k[3]);
  // Reflect at the border: a row 0..4 blurred with k=3 keeps the ends' mirror.
  Bytes tiny = {0, 40, 80, 120, 160};
  gaussian_blur(view(tiny, 5, 1, 1), 3, 1, 1e6f, 1.0f);  // box filter of 3
  CHECK((tiny == Bytes{27, 40, 80, 120, 133}));          // (40 + 0 + 40) / 3 at the left edge
  // Kernels larger than the image (torchvision refuses) still give finite, bounded output.
  Bytes small = noise_image(3, 2, 3, 1);
  gaussian_blur(view(small, 3, 2, 3), 9, 9, 3.0f, 3.0f);
  CHECK_THROWS(UsageError, gaussian_blur(view(small, 3, 2, 3), 4, 3, 1.0f, 1.0f));
}

// --- warps ----------------------------------------------------------------

void test_warp_identity_translation_rotation() {
  const int w = 9, h = 7;
  Bytes img = noise_image(w, h, 3, 3);
  Bytes out(img.size());
  for (Interpolation it : {Interpolation::kNearest, Interpolation::kBilinear}) {
    warp_pixels(view(img, w, h, 3), view(out, w, h, 3), Transform2D(), it, nullptr);
    CHECK(out == img);
    // Translation by (2, 1): out(j, i) = in(j - 2, i - 1), zeros / fill outside.
    const Fill fill{{9, 8, 7}};
    warp_pixels(view(img, w, h, 3), view(out, w, h, 3), Transform2D::translation(2, 1).inverse(),
                it, &fill);
    for (int i = 0; i < h; ++i)
      for (int j = 0; j < w; ++j)
        for (int c = 0; c < 3; ++c) {
          const uint8_t want = (j >= 2 && i >= 1) ? img[((i - 1) * w + j - 2) * 3 + c] : fill.v[c];
          CHECK_EQ(out[(i * w + j) * 3 + c], want);
        }
  }
  // A 90-degree rotation of a square about its centre moves pixels exactly.
  const int n = 6;
  Bytes sq = noise_image(n, n, 1, 4), rot(n * n);
  const Transform2D r90 = Transform2D::affine(90, 0, 0, 1, 0, 0, {n / 2.0, n / 2.0});
  warp_pixels(view(sq, n, n, 1), view(rot, n, n, 1), r90.inverse(), Interpolation::kNearest,
              nullptr);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      // forward: (x, y) -> (c - (y - c), c + (x - c)) on centres
      const int si = n - 1 - j, sj = i;
      CHECK_EQ(rot[i * n + j], sq[si * n + sj]);
    }
  // Bilinear halfway between two columns averages them (round half to even).
  Bytes two = {10, 21};
  Bytes mid(1);
  warp_pixels(view(two, 2, 1, 1), view(mid, 1, 1, 1), Transform2D::translation(0.5, 0),
              Interpolation::kBilinear, nullptr);
  CHECK_EQ(mid[0], 16);  // 15.5 -> 16
}

void test_warp_fill_blend_at_edges() {
  // Bilinear, a quarter pixel past the left edge: m = 0.75 of the weight is
  // inside. Without fill: 0.75 * v. With fill f: m * (0.75 v) + (1 - m) f, as
  // torchvision's mask blend (the in-image part is multiplied by m again).
  Bytes src(4 * 1, 200);
  Bytes out(4);
  const Transform2D shift = Transform2D::translation(-0.25, 0);  // output x samples input x + 0.25
  warp_pixels(view(src, 4, 1, 1), view(out, 4, 1, 1), shift.inverse(), Interpolation::kBilinear,
              nullptr);
  // out pixel 3 samples at x = 3.25: taps 3 (0.75) and 4 (outside)
  CHECK_EQ(out[3], 150);
  Fill f{{100, 0, 0}};
  warp_pixels(view(src, 4, 1, 1), view(out, 4, 1, 1), shift.inverse(), Interpolation::kBilinear,
              &f);
  CHECK_EQ(out[3], 138);  // 0.75 * 150 + 0.25 * 100 = 137.5 -> 138 (half to even)
  warp_pixels(view(src, 4, 1, 1), view(out, 4, 1, 1), shift.inverse(), Interpolation::kNearest, &f);
  CHECK_EQ(out[3], 200);  // nearbyint(3.25) = 3, inside
}

void test_perspective_coefficients() {
  // Identity corners give the identity; a known homography is recovered.
  const std::array<Point2, 4> sq = {Point2{0, 0}, {99, 0}, {99, 79}, {0, 79}};
  const auto id = perspective_coeffs(sq, sq);
  const double want[8] = {1, 0, 0, 0, 1, 0, 0, 0};
  for (int i = 0; i < 8; ++i) CHECK(std::abs(id[i] - want[i]) < 1e-6);
  const std::array<Point2, 4> end = {Point2{5, 3}, {90, 8}, {95, 70}, {2, 75}};
  const auto c = perspective_coeffs(sq, end);
  const Transform2D back({c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], 1});
  for (int i = 0; i < 4; ++i) {
    const Point2 p = back.apply(end[i]);
    CHECK(std::abs(p.x - sq[i].x) < 1e-3 && std::abs(p.y - sq[i].y) < 1e-3);
  }
  const Transform2D fwd = Transform2D::from_perspective_coeffs(c);
  const Point2 q = fwd.apply(sq[2]);
  CHECK(std::abs(q.x - 95) < 1e-3 && std::abs(q.y - 70) < 1e-3);
  int ow, oh;
  rotated_canvas_size(90, 30, 20, &ow, &oh);
  CHECK(ow == 20 && oh == 30);
  rotated_canvas_size(45, 10, 10, &ow, &oh);
  CHECK(ow == 16 && oh == 16);  // corners at 5 +- 7.07: floor(-2.07) .. ceil(12.07)
}

// --- padding --------------------------------------------------------------

void test_padding_modes() {
  Bytes row = {1, 2, 3, 4};
  const Pixels src = view(row, 4, 1, 1);
  auto pad = [&](PadMode m) {
    Bytes out(8);
    copy_window(src, -2, 0, view(out, 8, 1, 1), m, Fill{{9, 9, 9}});
    return out;
  };
  CHECK((pad(PadMode::kConstant) == Bytes{9, 9, 1, 2, 3, 4, 9, 9}));
  CHECK((pad(PadMode::kEdge) == Bytes{1, 1, 1, 2, 3, 4, 4, 4}));
  CHECK((pad(PadMode::kReflect) == Bytes{3, 2, 1, 2, 3, 4, 3, 2}));
  CHECK((pad(PadMode::kSymmetric) == Bytes{2, 1, 1, 2, 3, 4, 4, 3}));
  // 2-D, 3 channels, window fully outside: constant fill everywhere.
  Bytes img = noise_image(3, 3, 3, 5), out(2 * 2 * 3);
  copy_window(view(img, 3, 3, 3), 10, 10, view(out, 2, 2, 3), PadMode::kConstant, Fill{{1, 2, 3}});
  CHECK((out == Bytes{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}));
  // Vertical reflection.
  Bytes col = {10, 20, 30};
  Bytes vout(7);
  copy_window(view(col, 1, 3, 1), 0, -2, view(vout, 1, 7, 1), PadMode::kReflect, Fill{});
  CHECK((vout == Bytes{30, 20, 10, 20, 30, 20, 10}));
  CHECK(pad_mode_from_name("symmetric") == PadMode::kSymmetric);
  CHECK_THROWS(UsageError, pad_mode_from_name("wrap"));
}

// --- erasing --------------------------------------------------------------

void test_erasing_draw_and_write() {
  ErasingParams p;
  p.p = 1.0;
  int drawn = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    detail::SplitMix64 rng(seed);
    const auto r = draw_erasing(p, 64, 48, rng);
    if (!r) continue;
    ++drawn;
    CHECK(r->x >= 0 && r->y >= 0 && r->x + r->w <= 64 && r->y + r->h <= 48);
    CHECK(r->h < 48 && r->w < 64);
    const double frac = static_cast<double>(r->w) * r->h / (64.0 * 48);
    CHECK(frac > 0.005 && frac < 0.4);
  }
  CHECK(drawn > 1900);  // nearly every draw fits on a 64x48 image
  p.p = 0.25;
  int hits = 0;
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    detail::SplitMix64 rng(seed);
    hits += draw_erasing(p, 64, 48, rng).has_value();
  }
  CHECK(hits > 850 && hits < 1150);
  // Writing: constant into float CHW, noise into float16 HWC.
  std::vector<float> chw(3 * 4 * 5, 7.0f);
  const float v[3] = {1, 2, 3};
  erase_rect(chw.data(), DType::kFloat32, true, 4, 5, 3, PixelRect{1, 2, 3, 2}, v, nullptr);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x) {
        const bool in = x >= 1 && x < 4 && y >= 2 && y < 4;
        CHECK_EQ(chw[c * 20 + y * 5 + x], in ? v[c] : 7.0f);
      }
  std::vector<uint16_t> hwc(32 * 32 * 3, 0);
  detail::SplitMix64 noise(11);
  erase_rect(hwc.data(), DType::kFloat16, false, 32, 32, 3, PixelRect{0, 0, 32, 32}, nullptr,
             &noise);
  double mean = 0, var = 0;
  for (uint16_t hv : hwc) mean += detail::half_to_float(hv);
  mean /= hwc.size();
  for (uint16_t hv : hwc) var += std::pow(detail::half_to_float(hv) - mean, 2);
  var /= hwc.size();
  CHECK(std::abs(mean) < 0.08 && std::abs(var - 1) < 0.1);
  std::vector<uint8_t> u8(16, 5);
  CHECK_THROWS(UsageError, erase_rect(u8.data(), DType::kUInt8, false, 4, 4, 1,
                                      PixelRect{0, 0, 2, 2}, nullptr, &noise));
}

// --- auto augment -----------------------------------------------------------

void test_rand_augment_picks_ops_uniformly() {
  AutoAugmentParams p;
  std::map<int, int> counts;
  int negative = 0, signed_total = 0;
  const int draws = 28000;
  for (uint64_t seed = 0; seed < draws / 2; ++seed) {
    detail::SplitMix64 rng(seed * 977 + 1);
    AugOp ops[kMaxAugOps];
    CHECK_EQ(draw_auto_augment(p, 224, 224, rng, ops), 2);
    for (int i = 0; i < 2; ++i) {
      ++counts[static_cast<int>(ops[i].kind)];
      if (ops[i].kind == AugKind::kRotate) {
        CHECK(std::abs(std::abs(ops[i].magnitude) - 9.0) < 1e-9);  // linspace(0, 30, 31)[9]
        ++signed_total;
        negative += ops[i].magnitude < 0;
      }
      if (ops[i].kind == AugKind::kPosterize) CHECK_EQ(ops[i].magnitude, 7.0);
      if (ops[i].kind == AugKind::kSolarize) CHECK(std::abs(ops[i].magnitude - 0.7) < 1e-9);
      if (ops[i].kind == AugKind::kTranslateX)
        CHECK(std::abs(std::abs(ops[i].magnitude) - 150.0 / 331 * 224 * 0.3) < 1e-9);
    }
  }
  CHECK_EQ(counts.size(), 14u);  // Identity .. Equalize; never Invert
  // chi-square against uniform over 14 ops, 13 dof: p = 0.001 at 34.5
  double chi2 = 0;
  const double expect = draws / 14.0;
  for (auto& [k, n] : counts) chi2 += (n - expect) * (n - expect) / expect;
  CHECK(chi2 < 34.5);
  CHECK(std::abs(negative - signed_total / 2.0) < 4 * std::sqrt(signed_total / 4.0));
}

void test_auto_augment_policy_and_trivial_augment() {
  AutoAugmentParams p;
  p.policy = AutoAugmentPolicy::kImageNet;
  std::map<int, int> kinds;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    detail::SplitMix64 rng(seed);
    AugOp ops[kMaxAugOps];
    const int n = draw_auto_augment(p, 100, 80, rng, ops);
    CHECK(n >= 0 && n <= 2);
    for (int i = 0; i < n; ++i) ++kinds[static_cast<int>(ops[i].kind)];
  }
  // The ImageNet policy uses these 10 ops only.
  for (auto& [k, n] : kinds) {
    const AugKind kind = static_cast<AugKind>(k);
    CHECK(kind != AugKind::kIdentity && kind != AugKind::kTranslateX &&
          kind != AugKind::kTranslateY && kind != AugKind::kShearY && kind != AugKind::kBrightness);
  }
  CHECK(kinds.count(static_cast<int>(AugKind::kEqualize)) &&
        kinds.count(static_cast<int>(AugKind::kInvert)));
  p.policy = AutoAugmentPolicy::kTrivialAugmentWide;
  double max_rot = 0;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    detail::SplitMix64 rng(seed);
    AugOp ops[kMaxAugOps];
    CHECK_EQ(draw_auto_augment(p, 100, 80, rng, ops), 1);
    if (ops[0].kind == AugKind::kRotate) max_rot = std::max(max_rot, std::abs(ops[0].magnitude));
    if (ops[0].kind == AugKind::kTranslateY) CHECK(std::abs(ops[0].magnitude) <= 32.0);
  }
  CHECK(max_rot > 120 && max_rot <= 135);
}

void test_apply_aug_ops_matches_the_pieces() {
  const int w = 31, h = 17;
  const Bytes img = noise_image(w, h, 3, 9);
  AutoAugmentParams p;
  const AugOp ops[] = {{AugKind::kBrightness, 0.3},  {AugKind::kContrast, -0.2},
                       {AugKind::kRotate, 12.0},     {AugKind::kPosterize, 6},
                       {AugKind::kTranslateX, -5.7}, {AugKind::kIdentity, 0},
                       {AugKind::kShearY, 0.2},      {AugKind::kEqualize, 0}};
  Bytes a = img;
  apply_aug_ops(view(a, w, h, 3), ops, 8, p);
  // By hand: colour steps, warps through the forward maps' inverses.
  Bytes b = img, tmp(img.size());
  auto color = [&](std::vector<ColorStep> s) {
    apply_color_steps(view(b, w, h, 3), s.data(), s.size());
  };
  auto warp = [&](const AugOp& op) {
    warp_pixels(view(b, w, h, 3), view(tmp, w, h, 3), aug_geometry(op, w, h).inverse(),
                Interpolation::kNearest, nullptr);
    b = tmp;
  };
  color({{ColorKind::kBrightness, 1.0 + 0.3}, {ColorKind::kContrast, 1.0 - 0.2}});
  warp(ops[2]);
  color({{ColorKind::kPosterize, 6}});
  warp(ops[4]);  // int(-5.7) = -5 pixels
  warp(ops[6]);
  color({{ColorKind::kEqualize, 0}});
  CHECK(a == b);
  // TranslateX by -5 is a shift with zeros entering on the right.
  Bytes t = img;
  const AugOp tx{AugKind::kTranslateX, -5.7};
  apply_aug_ops(view(t, w, h, 3), &tx, 1, p);
  for (int i = 0; i < h; ++i)
    for (int j = 0; j < w; ++j)
      for (int c = 0; c < 3; ++c)
        CHECK_EQ(t[(i * w + j) * 3 + c], j + 5 < w ? img[(i * w + j + 5) * 3 + c] : 0);
}

void test_distributions() {
  detail::SplitMix64 rng(5);
  // The ziggurat's normals: moments, and the mass beyond 2 and in the tail
  // past its last layer (r = 3.44).
  {
    const detail::NormalZiggurat& z = detail::normal_ziggurat();
    const int n = 400000;
    double m1 = 0, m2 = 0, m4 = 0;
    int beyond2 = 0, tail = 0;
    for (int i = 0; i < n; ++i) {
      const double x = z(rng);
      m1 += x, m2 += x * x, m4 += x * x * x * x;
      beyond2 += std::abs(x) > 2;
      tail += std::abs(x) > 3.442619855899;
    }
    m1 /= n, m2 /= n, m4 /= n;
    CHECK(std::abs(m1) < 0.01 && std::abs(m2 - 1) < 0.01 && std::abs(m4 - 3) < 0.06);
    CHECK(std::abs(beyond2 / double(n) - 0.0455) < 0.002);
    CHECK(std::abs(tail / double(n) - 0.000576) < 0.00015);
  }
  const int n = 20000;
  for (double a : {0.2, 0.8, 1.0, 3.0}) {
    double m = 0, m2 = 0;
    for (int i = 0; i < n; ++i) {
      const double b = detail::beta(rng, a, a);
      CHECK(b >= 0 && b <= 1);
      m += b;
      m2 += b * b;
    }
    m /= n;
    const double var = m2 / n - m * m;
    const double want_var = 1.0 / (4 * (2 * a + 1));  // Beta(a, a)
    CHECK(std::abs(m - 0.5) < 0.01);
    CHECK(std::abs(var - want_var) < 0.01);
  }
}

}  // namespace

TEST_MAIN(test_single_steps_known_values();
          test_contrast_equalize_autocontrast_use_whole_image_statistics();
          test_fused_program_equals_steps_one_by_one(); test_fusion_pass_counts();
          test_table_lookup_simd_equals_scalar();
          test_sharpness_keeps_border_and_smooths_interior(); test_gaussian_blur();
          test_warp_identity_translation_rotation(); test_warp_fill_blend_at_edges();
          test_perspective_coefficients(); test_padding_modes(); test_erasing_draw_and_write();
          test_rand_augment_picks_ops_uniformly(); test_auto_augment_policy_and_trivial_augment();
          test_apply_aug_ops_matches_the_pieces(); test_distributions())
