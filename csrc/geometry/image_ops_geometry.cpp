// The kernels of the geometric ops of image_ops.h beyond crops, resizes and
// flips: Letterbox, RandomRotation, RandomAffine, RandomPerspective (and the
// checks of SanitizeBoundingBoxes, which has no kernel: transform_group.h
// reads its filter). Each draws its parameters from the sample's stream in a
// fixed order, then moves the image through OpContext, which moves the
// geometry that a group's targets follow.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "geometry/detail/op_checks.h"
#include "geometry/image_ops.h"
#include "geometry/op_context.h"
#include "geometry/transform2d.h"

namespace stoker::ops {

namespace {

void check_interpolation(const char* op, int interpolation) {
  STOKER_CHECK(interpolation == 0 || interpolation == 1, UsageError, op,
               ": interpolation must be nearest or bilinear");
}

void check_flag(const char* op, const char* name, int v) {
  STOKER_CHECK(v == 0 || v == 1, UsageError, op, ": ", name, " must be 0 or 1, got ", v);
}

void check_range(const char* op, const char* name, double lo, double hi) {
  STOKER_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, UsageError, op, ": ", name,
               " must satisfy lo <= hi, got (", lo, ", ", hi, ")");
}

Interpolation interpolation_of(int i) {
  return i == 0 ? Interpolation::kNearest : Interpolation::kBilinear;
}

}  // namespace

// ---- Letterbox ----------------------------------------------------------------------

void Letterbox::check() const {
  STOKER_CHECK(h > 0 && w > 0 && h <= 1 << 20 && w <= 1 << 20, UsageError, kName,
               ": size must be positive, got (", h, ", ", w, ")");
  check_fill(kName, fill, mask_fill);
  check_flag(kName, "scaleup", scaleup);
}

Letterbox::Fit Letterbox::fit(int img_w, int img_h) const {
  // ultralytics' LetterBox: r = min(H / h, W / w) (at most 1 without scaleup),
  // the resized size rounded, the rest split in two with the odd pixel at the
  // end (its round(dw - 0.1), round(dw + 0.1) on the halves).
  double r = std::min(static_cast<double>(h) / img_h, static_cast<double>(w) / img_w);
  if (!scaleup) r = std::min(r, 1.0);
  Fit f;
  f.w = std::clamp(static_cast<int>(std::nearbyint(img_w * r)), 1, w);
  f.h = std::clamp(static_cast<int>(std::nearbyint(img_h * r)), 1, h);
  f.left = (w - f.w) / 2;
  f.top = (h - f.h) / 2;
  return f;
}

void Letterbox::apply(OpContext& ctx) const {
  const Fit f = fit(ctx.width(), ctx.height());
  ctx.resize(f.w, f.h);
  ctx.window({-f.left, -f.top, w, h}, PadMode::kConstant, fill_of(fill));
}

// ---- RandomRotation ------------------------------------------------------------------

void RandomRotation::check() const {
  check_range(kName, "degrees", degrees[0], degrees[1]);
  check_interpolation(kName, interpolation);
  check_flag(kName, "expand", expand);
  check_flag(kName, "has_center", has_center);
  STOKER_CHECK(std::isfinite(center[0]) && std::isfinite(center[1]), UsageError, kName,
               ": center must be finite");
  STOKER_CHECK(!(expand && has_center), UsageError, kName,
               ": expand=True rotates about the image's centre only (as torchvision)");
  check_fill(kName, fill, mask_fill);
}

void RandomRotation::apply(OpContext& ctx) const {
  const double angle = ctx.rng().uniform(degrees[0], degrees[1]);
  const int w = ctx.width(), h = ctx.height();
  const Fill f = fill_of(fill);
  if (expand) {
    int ow, oh;
    rotated_canvas_size(angle, w, h, &ow, &oh);
    // About the centre of both images (F.rotate(expand=True)).
    const Transform2D fwd = Transform2D::translation(-0.5 * w, -0.5 * h)
                                .then(Transform2D::affine(-angle, 0, 0, 1, 0, 0, {0, 0}))
                                .then(Transform2D::translation(0.5 * ow, 0.5 * oh));
    ctx.warp(fwd, ow, oh, interpolation_of(interpolation), &f);
    return;
  }
  const Point2 c = has_center ? Point2{center[0], center[1]} : Point2{0.5 * w, 0.5 * h};
  // F.rotate turns counter-clockwise for positive angles: F.affine's -angle.
  ctx.warp(Transform2D::affine(-angle, 0, 0, 1, 0, 0, c), w, h, interpolation_of(interpolation),
           &f);
}

// ---- RandomAffine ------------------------------------------------------------------------

void RandomAffine::check() const {
  check_range(kName, "degrees", degrees[0], degrees[1]);
  for (double t : translate)
    STOKER_CHECK(t >= 0 && t <= 1, UsageError, kName, ": translate must be in [0, 1], got ", t);
  STOKER_CHECK(std::isfinite(scale[1]) && scale[0] > 0 && scale[0] <= scale[1], UsageError, kName,
               ": scale must satisfy 0 < lo <= hi, got (", scale[0], ", ", scale[1], ")");
  check_range(kName, "shear (x)", shear[0], shear[1]);
  check_range(kName, "shear (y)", shear[2], shear[3]);
  check_interpolation(kName, interpolation);
  check_flag(kName, "has_center", has_center);
  STOKER_CHECK(std::isfinite(center[0]) && std::isfinite(center[1]), UsageError, kName,
               ": center must be finite");
  check_fill(kName, fill, mask_fill);
}

void RandomAffine::apply(OpContext& ctx) const {
  // torchvision's RandomAffine._get_params: angle, translation (rounded:
  // Python's round, half to even), scale, shear x, shear y; every value drawn
  // whatever the ranges, so the stream does not depend on them.
  detail::SplitMix64& rng = ctx.rng();
  const int w = ctx.width(), h = ctx.height();
  const double angle = rng.uniform(degrees[0], degrees[1]);
  const double mx = translate[0] * w, my = translate[1] * h;
  const double tx = std::nearbyint(rng.uniform(-mx, mx));
  const double ty = std::nearbyint(rng.uniform(-my, my));
  const double s = rng.uniform(scale[0], scale[1]);
  const double shx = rng.uniform(shear[0], shear[1]);
  const double shy = rng.uniform(shear[2], shear[3]);
  const Point2 c = has_center ? Point2{center[0], center[1]} : Point2{0.5 * w, 0.5 * h};
  const Fill f = fill_of(fill);
  ctx.warp(Transform2D::affine(angle, tx, ty, s, shx, shy, c), w, h,
           interpolation_of(interpolation), &f);
}

// ---- RandomPerspective ----------------------------------------------------------------------

void RandomPerspective::check() const {
  STOKER_CHECK(distortion_scale >= 0 && distortion_scale <= 1, UsageError, kName,
               ": distortion_scale must be ", kInUnit, ", got ", distortion_scale);
  STOKER_CHECK(p >= 0 && p <= 1, UsageError, kName, ": p must be ", kInUnit, ", got ", p);
  check_interpolation(kName, interpolation);
  check_fill(kName, fill, mask_fill);
}

void RandomPerspective::apply(OpContext& ctx) const {
  detail::SplitMix64& rng = ctx.rng();
  if (!(rng.uniform(0, 1) < p)) return;
  // torchvision's RandomPerspective._get_params: each corner moved inwards
  // by up to distortion_scale of the half size, drawn as torch.randint.
  const int w = ctx.width(), h = ctx.height();
  const int hh = h / 2, hw = w / 2;
  const int bh = static_cast<int>(distortion_scale * hh) + 1;
  const int bw = static_cast<int>(distortion_scale * hw) + 1;
  auto ri = [&](int lo, int hi) { return static_cast<double>(rng.randint(lo, hi - 1)); };
  const double x0 = ri(0, bw), y0 = ri(0, bh);
  const double x1 = ri(w - bw, w), y1 = ri(0, bh);
  const double x2 = ri(w - bw, w), y2 = ri(h - bh, h);
  const double x3 = ri(0, bw), y3 = ri(h - bh, h);
  const std::array<Point2, 4> end = {Point2{x0, y0}, Point2{x1, y1}, Point2{x2, y2},
                                     Point2{x3, y3}};
  const std::array<Point2, 4> start = {Point2{0, 0}, Point2{w - 1.0, 0}, Point2{w - 1.0, h - 1.0},
                                       Point2{0, h - 1.0}};
  const Fill f = fill_of(fill);
  ctx.warp(Transform2D::from_perspective_coeffs(perspective_coeffs(start, end)), w, h,
           interpolation_of(interpolation), &f);
}

// ---- Mosaic -------------------------------------------------------------------------------------

void Mosaic::check() const {
  STOKER_CHECK(h > 0 && w > 0 && h <= 1 << 19 && w <= 1 << 19, UsageError, kName,
               ": size must be positive, got (", h, ", ", w, ")");
  check_range(kName, "center", center[0], center[1]);
  STOKER_CHECK(center[0] >= 0 && center[1] <= 2, UsageError, kName,
               ": center must lie in [0, 2] (fractions of the size), got (", center[0], ", ",
               center[1], ")");
  check_fill(kName, fill, mask_fill);
}

void Mosaic::apply(OpContext&) const {
  STOKER_THROW(UsageError, kName,
               " reads more samples: it runs first in a transform group (or alone on an "
               "image field), not in an op list of its own");
}

Mosaic::Tile Mosaic::place(int k, int w0, int h0, int xc, int yc) const {
  // ultralytics' load_image: the longer side to the size (here: fit (h, w)),
  // rounded up, at most the size; then _mosaic4's placement.
  const double r = std::min(static_cast<double>(h) / h0, static_cast<double>(w) / w0);
  Tile t;
  t.tw = std::clamp(static_cast<int>(std::ceil(w0 * r - 1e-9)), 1, w);
  t.th = std::clamp(static_cast<int>(std::ceil(h0 * r - 1e-9)), 1, h);
  const int W = 2 * w, H = 2 * h, tw = t.tw, th = t.th;
  int x1a, y1a, x2a, y2a, x1b, y1b;
  switch (k) {
    case 0:  // top left
      x1a = std::max(xc - tw, 0), y1a = std::max(yc - th, 0), x2a = xc, y2a = yc;
      x1b = tw - (x2a - x1a), y1b = th - (y2a - y1a);
      break;
    case 1:  // top right
      x1a = xc, y1a = std::max(yc - th, 0), x2a = std::min(xc + tw, W), y2a = yc;
      x1b = 0, y1b = th - (y2a - y1a);
      break;
    case 2:  // bottom left
      x1a = std::max(xc - tw, 0), y1a = yc, x2a = xc, y2a = std::min(H, yc + th);
      x1b = tw - (x2a - x1a), y1b = 0;
      break;
    default:  // bottom right
      x1a = xc, y1a = yc, x2a = std::min(xc + tw, W), y2a = std::min(H, yc + th);
      x1b = 0, y1b = 0;
      break;
  }
  t.sx = x1b, t.sy = y1b, t.cw = x2a - x1a, t.ch = y2a - y1a, t.x = x1a, t.y = y1a;
  return t;
}

// ---- SanitizeBoundingBoxes --------------------------------------------------------------------

void SanitizeBoundingBoxes::check() const {
  STOKER_CHECK(std::isfinite(min_size) && min_size >= 0 && std::isfinite(min_area) && min_area >= 0,
               UsageError, kName, ": min_size and min_area must be finite and >= 0, got ", min_size,
               " and ", min_area);
  STOKER_CHECK(min_visibility >= 0 && min_visibility <= 1, UsageError, kName,
               ": min_visibility must be ", kInUnit, ", got ", min_visibility);
}

}  // namespace stoker::ops
