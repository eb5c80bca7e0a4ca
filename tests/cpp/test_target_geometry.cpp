// Unit tests of the geometry of targets (geometry/target_geometry, transform2d)
// and of the batch mixes (augment/batch_mix): known boxes and keypoints placed
// on a canvas and followed through every geometric op and combinations.
#include <cmath>
#include <cstring>
#include <vector>

#include "augment/batch_mix.h"
#include "check.h"
#include "common/detail/half.h"
#include "common/error.h"
#include "geometry/convex_polygon.h"
#include "geometry/target_geometry.h"

using namespace stoker;

namespace {

bool near(double a, double b, double tol = 1e-4) { return std::abs(a - b) <= tol; }

bool box_is(const float* b, double x1, double y1, double x2, double y2, double tol = 1e-4) {
  return near(b[0], x1, tol) && near(b[1], y1, tol) && near(b[2], x2, tol) && near(b[3], y2, tol);
}

BoxFilter loose() {
  BoxFilter f;
  f.min_area = 0;
  f.min_size = 0;
  return f;
}

void test_transform2d_basics() {
  const Transform2D t = Transform2D::translation(3, -2).then(Transform2D::scaling(2, 0.5));
  const Point2 p = t.apply({1, 4});
  CHECK(near(p.x, 8) && near(p.y, 1));
  const Point2 q = t.inverse().apply(p);
  CHECK(near(q.x, 1) && near(q.y, 4));
  CHECK(t.is_affine() && t.inverse().is_affine());
  // affine(): rotation by 90 about (5, 5) sends (6, 5) to (5, 6) (clockwise on screen).
  const Point2 r = Transform2D::affine(90, 0, 0, 1, 0, 0, {5, 5}).apply({6, 5});
  CHECK(near(r.x, 5) && near(r.y, 6));
  // Scale and translate: about the centre, then shifted.
  const Point2 s = Transform2D::affine(0, 1, 2, 2, 0, 0, {5, 5}).apply({6, 5});
  CHECK(near(s.x, 8) && near(s.y, 7));
  CHECK_THROWS(UsageError, Transform2D::scaling(0, 1).inverse());
}

void test_boxes_through_crop_flip_resize() {
  // A 100 x 80 canvas, box (10, 20) - (30, 60).
  Geometry g(100, 80);
  g.crop(5, 10, 50, 60);  // box -> (5, 10) - (25, 50)
  g.hflip();              // -> (25, 10) - (45, 50) on a width of 50
  g.resize(100, 30);      // x * 2, y / 2 -> (50, 5) - (90, 25)
  std::vector<float> b = {10, 20, 30, 60};
  uint8_t keep[1];
  CHECK_EQ(transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, g, BoxFilter{}, keep), 1);
  CHECK(box_is(b.data(), 50, 5, 90, 25));
  // The same box in the other formats and normalised gives the same box.
  std::vector<float> xywh = {10, 20, 20, 40};
  transform_boxes(xywh.data(), 1, BoxFormat::kXYWH, false, g, BoxFilter{}, keep);
  CHECK(box_is(xywh.data(), 50, 5, 40, 20));
  std::vector<float> yolo = {20 / 100.f, 40 / 80.f, 20 / 100.f, 40 / 80.f};
  transform_boxes(yolo.data(), 1, BoxFormat::kCXCYWH, true, g, BoxFilter{}, keep);
  CHECK(box_is(yolo.data(), 70 / 100.0, 15 / 30.0, 40 / 100.0, 20 / 30.0, 1e-6));
}

void test_boxes_are_clipped_and_filtered() {
  Geometry g(100, 100);
  g.crop(50, 50, 50, 50);
  std::vector<float> b = {
      40, 40, 60, 60,  // a quarter inside: (0, 0) - (10, 10), visibility 0.25
      0,  0,  10, 10,  // outside
      60, 60, 90, 61,  // 30 x 1: area 30, height 1
      70, 70, 80, 80,  // inside
  };
  std::vector<uint8_t> keep(4);
  BoxFilter f;
  f.min_visibility = 0.3;
  CHECK_EQ(transform_boxes(b.data(), 4, BoxFormat::kXYXY, false, g, f, keep.data()), 2);
  CHECK((keep == std::vector<uint8_t>{0, 0, 1, 1}));
  CHECK(box_is(&b[8], 10, 10, 40, 11));
  CHECK(box_is(&b[12], 20, 20, 30, 30));
  // Looser visibility keeps the clipped quarter; min_size drops the thin box.
  b = {40, 40, 60, 60, 60, 60, 90, 61};
  f.min_visibility = 0.25;
  f.min_size = 2;
  CHECK_EQ(transform_boxes(b.data(), 2, BoxFormat::kXYXY, false, g, f, keep.data()), 1);
  CHECK(keep[0] == 1 && keep[1] == 0);
  CHECK(box_is(b.data(), 0, 0, 10, 10));
  // min_area, and non-finite boxes.
  b = {50, 50, 51, 52, NAN, 0, 10, 10};
  f = BoxFilter{};
  f.min_area = 2.5;
  CHECK_EQ(transform_boxes(b.data(), 2, BoxFormat::kXYXY, false, g, f, keep.data()), 0);
  f.min_area = 2;
  CHECK_EQ(transform_boxes(b.data(), 2, BoxFormat::kXYXY, false, g, f, keep.data()), 1);
}

void test_boxes_through_pad_letterbox_rotation() {
  // Letterbox of a 200 x 100 image into 64 x 64: resize to 64 x 32, pad 16 top/bottom.
  Geometry g(200, 100);
  g.resize(64, 32);
  g.crop(0, -16, 64, 64);  // 16 rows of padding above and below
  std::vector<float> b = {50, 25, 150, 75};
  uint8_t keep[1];
  transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, g, BoxFilter{}, keep);
  CHECK(box_is(b.data(), 16, 24, 48, 40));
  CHECK(g.width() == 64 && g.height() == 64);
  // Rotation by 90 about the centre of a 100 x 100 canvas: (10, 20)-(30, 40)
  // -> corners mapped (x, y) -> (100 - y, x): (60, 10) - (80, 30).
  Geometry r(100, 100);
  r.warp(Transform2D::affine(90, 0, 0, 1, 0, 0, {50, 50}), 100, 100);
  b = {10, 20, 30, 40};
  transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, r, BoxFilter{}, keep);
  CHECK(box_is(b.data(), 60, 10, 80, 30, 1e-3));
  // 45 degrees: the enclosing box of the rotated corners (torchvision's rule).
  Geometry r45(100, 100);
  r45.warp(Transform2D::affine(45, 0, 0, 1, 0, 0, {50, 50}), 100, 100);
  b = {40, 40, 60, 60};
  transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, r45, BoxFilter{}, keep);
  const double d = 10 * std::sqrt(2.0);
  CHECK(box_is(b.data(), 50 - d, 50 - d, 50 + d, 50 + d, 1e-3));
}

void test_boxes_through_perspective() {
  const std::array<Point2, 4> start = {Point2{0, 0}, {99, 0}, {99, 99}, {0, 99}};
  const std::array<Point2, 4> end = {Point2{10, 5}, {90, 0}, {99, 95}, {0, 99}};
  const Transform2D fwd = Transform2D::from_perspective_coeffs(perspective_coeffs(start, end));
  Geometry g(100, 100);
  g.warp(fwd, 100, 100);
  std::vector<float> b = {0, 0, 99, 99};
  uint8_t keep[1];
  transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, g, loose(), keep);
  // The corners go to the end points: enclosing box (0, 0) - (99, 99).
  CHECK(box_is(b.data(), 0, 0, 99, 99, 1e-2));
  b = {0, 0, 1, 1};
  transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, g, loose(), keep);
  CHECK(near(b[0], 10, 0.15) && near(b[1], 5, 0.15));  // the corner (0, 0) goes to (10, 5)
}

void test_keypoints_flip_pairs_and_visibility() {
  // Two instances of 3 keypoints: (left, right, nose).
  Geometry g(100, 50);
  g.hflip();
  std::vector<float> kp = {
      10, 5, 2, 30, 5,  2, 20, 40, 1,  // instance 0
      0,  0, 0, 99, 49, 2, 50, 25, 2,  // instance 1: an unlabelled point
  };
  const int32_t perm[3] = {1, 0, 2};
  transform_keypoints(kp.data(), 2, 3, false, g, perm);
  // x -> 99 - x, then left and right swap.
  const std::vector<float> want = {
      69, 5,  2, 89, 5, 2, 79, 40, 1,  //
      0,  49, 2, 0,  0, 0, 49, 25, 2,  // the unlabelled point stays (0, 0, 0)
  };
  CHECK(kp == want);
  // Two flips swap back; points moved off the canvas become invisible.
  Geometry g2(100, 50);
  g2.hflip();
  g2.hflip();
  g2.crop(20, 0, 50, 50);
  std::vector<float> k2 = {10, 5, 2, 30, 5, 2, 69.5f, 1, 1};
  transform_keypoints(k2.data(), 1, 3, false, g2, perm);
  CHECK((k2 == std::vector<float>{0, 0, 0, 10, 5, 2, 49.5f, 1, 1}));
  // Normalised keypoints flip as 1 - x (ultralytics).
  Geometry g3(100, 50);
  g3.hflip();
  std::vector<float> k3 = {0.25f, 0.5f, 2};
  transform_keypoints(k3.data(), 1, 1, true, g3, nullptr);
  CHECK(near(k3[0], 0.75) && near(k3[1], 0.5) && k3[2] == 2);
  // Keypoints and boxes agree under resize and rotation (same map).
  Geometry g4(100, 100);
  g4.resize(50, 200);
  g4.warp(Transform2D::affine(30, 0, 0, 1, 0, 0, {25, 100}), 50, 200);
  std::vector<float> p = {20, 30, 2};
  transform_keypoints(p.data(), 1, 1, false, g4, nullptr);
  const Point2 q = g4.box_map().apply({20, 30});
  CHECK(near(p[0], q.x) && near(p[1], q.y));
}

void test_compact_rows() {
  std::vector<int64_t> rows = {10, 11, 12, 13, 14};
  const uint8_t keep[5] = {1, 0, 0, 1, 1};
  CHECK_EQ(compact_rows(reinterpret_cast<uint8_t*>(rows.data()), 5, 8, keep), 3);
  CHECK(rows[0] == 10 && rows[1] == 13 && rows[2] == 14);
}

void test_identity_geometry_leaves_boxes_untouched() {
  Geometry g(64, 64);
  CHECK(!g.moved());
  std::vector<float> b = {1.25f, 2.5f, 3.75f, 60.125f};
  uint8_t keep[1];
  transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, g, BoxFilter{}, keep);
  CHECK((b == std::vector<float>{1.25f, 2.5f, 3.75f, 60.125f}));
}

void test_convex_polygon() {
  ConvexPolygon p = ConvexPolygon::rect(-10, 5, 30, 25);
  CHECK(near(p.area(), 800));
  p.clip_to_canvas(20, 20);  // -> [0, 20] x [5, 20]
  double x1, y1, x2, y2;
  p.bounds(&x1, &y1, &x2, &y2);
  CHECK(near(x1, 0) && near(y1, 5) && near(x2, 20) && near(y2, 20) && near(p.area(), 300));
  double lo, hi;
  CHECK(p.span_at(10, &lo, &hi) && near(lo, 0) && near(hi, 20));
  CHECK(!p.span_at(3, &lo, &hi));
  // A diamond: the span narrows towards its tips; clipping keeps it convex.
  ConvexPolygon d = ConvexPolygon::rect(0, 0, 10, 10);
  d.map(Transform2D::affine(45, 0, 0, 1, 0, 0, {5, 5}));
  CHECK(near(d.area(), 100, 1e-9));
  CHECK(d.span_at(5, &lo, &hi) && near(lo, 5 - 5 * std::sqrt(2.0)) &&
        near(hi, 5 + 5 * std::sqrt(2.0)));
  CHECK(d.span_at(0, &lo, &hi) && near(hi - lo, 10 * std::sqrt(2.0) - 10, 1e-9));
  d.clip_to_canvas(10, 10);  // the square minus four corner triangles
  CHECK(near(d.area(), 100 - 4 * 0.5 * std::pow(10 - 5 * std::sqrt(2.0), 2), 1e-9));
  CHECK(ConvexPolygon::rect(3, 3, 3, 9).empty());
  ConvexPolygon gone = ConvexPolygon::rect(30, 30, 40, 40);
  gone.clip_to_canvas(20, 20);
  CHECK(gone.empty());
}

void test_what_a_crop_removed_stays_removed() {
  // The right half of a 100 x 100 image, padded back to 100 wide on the left:
  // the composed map is the identity, but the left half is padding now.
  Geometry g(100, 100);
  g.crop(50, 0, 50, 100);
  g.crop(-50, 0, 100, 100);
  CHECK(near(g.map(10, 10).x, 10));
  const ConvexPolygon v = g.valid_region();
  double x1, y1, x2, y2;
  v.bounds(&x1, &y1, &x2, &y2);
  CHECK(near(x1, 50) && near(x2, 100) && near(y1, 0) && near(y2, 100));
  CHECK(!g.covers_output(v));
  std::vector<float> b = {10, 10, 40, 40, 40, 10, 60, 40};  // gone; half left
  std::vector<uint8_t> keep(2);
  CHECK_EQ(transform_boxes(b.data(), 2, BoxFormat::kXYXY, false, g, loose(), keep.data()), 1);
  CHECK(keep[0] == 0 && keep[1] == 1 && box_is(&b[4], 50, 10, 60, 40));
  std::vector<float> kp = {20, 20, 2, 70, 20, 2};
  transform_keypoints(kp.data(), 2, 1, false, g, nullptr);
  CHECK((kp == std::vector<float>{0, 0, 0, 70, 20, 2}));

  // A crop, then a rotation that turns the cut-off corner back into the canvas:
  // a box there is dropped, one across the crop's edge is clipped to it.
  Geometry r(100, 100);
  r.crop(0, 0, 50, 100);                                               // the left half
  r.warp(Transform2D::affine(180, 0, 0, 1, 0, 0, {25, 50}), 50, 100);  // turned over
  b = {60, 10, 90, 40, 40, 10, 60, 40};
  CHECK_EQ(transform_boxes(b.data(), 2, BoxFormat::kXYXY, false, r, loose(), keep.data()), 1);
  // (40, 10) - (50, 40) is left, turned to (0, 60) - (10, 90)
  CHECK(keep[0] == 0 && box_is(&b[4], 0, 60, 10, 90, 1e-6));
  // Nothing of the region lies outside the turned half: it covers the output.
  CHECK(r.covers_output(r.valid_region()));
  // 45 degrees about the centre of a 100 x 100 crop: the corners of the output are fill.
  Geometry q(200, 200);
  q.crop(50, 50, 100, 100);
  q.warp(Transform2D::affine(45, 0, 0, 1, 0, 0, {50, 50}), 100, 100);
  const ConvexPolygon qv = q.valid_region();
  CHECK(!q.covers_output(qv));
  // At the top, |x - 50| + |y - 50| <= 50 sqrt(2): a span narrower than the row.
  const double half = 50 * std::sqrt(2.0) - 49.5;
  CHECK(qv.span_at(0.5, &x1, &x2) && near(x1, 50 - half, 1e-6) && near(x2, 50 + half, 1e-6));
  // A box of the original's corner, cut by the crop: without the region it would come back.
  b = {0, 0, 40, 40};
  CHECK_EQ(transform_boxes(b.data(), 1, BoxFormat::kXYXY, false, q, loose(), keep.data()), 0);
}

void test_boxes_with_nothing_left_are_dropped() {
  // A box reduced to a line by clipping, a line, and a sliver of a ten
  // thousandth of a pixel are dropped whatever the filter; a hundredth stays.
  Geometry g(100, 100);
  g.crop(0, 0, 50, 50);
  std::vector<float> b = {50, 10, 60, 20, 10, 10, 10, 20, 49.9999f, 10, 70, 20, 49.99f, 10, 70, 20};
  std::vector<uint8_t> keep(4);
  CHECK_EQ(transform_boxes(b.data(), 4, BoxFormat::kXYXY, false, g, loose(), keep.data()), 1);
  CHECK(keep[3] == 1);
}

// --- batch mixes ----------------------------------------------------------

void test_mixup_images_and_labels() {
  BatchMixSpec spec;
  spec.mixup = MixParams{};
  spec.num_classes = 4;
  detail::SplitMix64 rng(3);
  MixDraw d = draw_batch_mix(spec, 2, 2, rng);
  CHECK(d.applied && !d.cutmix && d.lam > 0 && d.lam < 1);
  // Three float images of constants 0, 10, 20 (2 x 2 x 1): row i mixes with row i - 1.
  std::vector<float> img(12);
  for (int i = 0; i < 12; ++i) img[i] = static_cast<float>(10 * (i / 4));
  mix_images(img.data(), DType::kFloat32, false, 3, 2, 2, 1, d);
  const float lam = static_cast<float>(d.lam), rest = static_cast<float>(1 - d.lam);
  CHECK(img[0] == 0 * lam + 20 * rest);
  CHECK(img[4] == 10 * lam + 0 * rest);
  CHECK(img[8] == 20 * lam + 10 * rest);
  const int64_t labels[3] = {0, 2, 3};
  std::vector<float> soft(12);
  mix_labels(labels, 3, 4, d, soft.data());
  CHECK(near(soft[0], d.lam) && near(soft[3], 1 - d.lam));          // row 0: 0 with 3
  CHECK(near(soft[4 + 2], d.lam) && near(soft[4 + 0], 1 - d.lam));  // row 1: 2 with 0
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int k = 0; k < 4; ++k) s += soft[r * 4 + k];
    CHECK(near(s, 1, 1e-6));
  }
  const int64_t bad[2] = {0, 4};
  CHECK_THROWS(DataError, mix_labels(bad, 2, 4, d, soft.data()));
  // uint8 rounds half to even; float16 and bfloat16 mix in float.
  MixDraw half = d;
  half.lam = 0.5;
  std::vector<uint8_t> u8 = {1, 2};
  mix_images(u8.data(), DType::kUInt8, false, 2, 1, 1, 1, half);
  CHECK(u8[0] == 2 && u8[1] == 2);  // 1.5 -> 2, 1.5 -> 2
  std::vector<uint16_t> f16 = {detail::float_to_half(1.0f), detail::float_to_half(3.0f)};
  mix_images(f16.data(), DType::kFloat16, false, 2, 1, 1, 1, half);
  CHECK(detail::half_to_float(f16[0]) == 2.0f && detail::half_to_float(f16[1]) == 2.0f);
}

void test_cutmix_box_and_area() {
  BatchMixSpec spec;
  spec.cutmix = MixParams{};
  spec.num_classes = 3;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    detail::SplitMix64 rng(seed);
    const MixDraw d = draw_batch_mix(spec, 16, 24, rng);
    CHECK(d.applied && d.cutmix);
    const PixelRect& r = d.box;
    CHECK(r.x >= 0 && r.y >= 0 && r.x + r.w <= 24 && r.y + r.h <= 16);
    CHECK(near(d.lam, 1.0 - r.w * r.h / (16.0 * 24), 1e-12));
  }
  detail::SplitMix64 rng(8);
  MixDraw d = draw_batch_mix(spec, 4, 4, rng);
  d.box = {1, 1, 2, 2};
  // CHW uint8, 2 images of 2 channels, 4 x 4: image i has value 10 * i + channel.
  std::vector<uint8_t> img(2 * 2 * 16);
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 2; ++c)
      for (int p = 0; p < 16; ++p) img[i * 32 + c * 16 + p] = static_cast<uint8_t>(10 * i + c);
  mix_images(img.data(), DType::kUInt8, true, 2, 4, 4, 2, d);
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 2; ++c)
      for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 4; ++x) {
          const bool in = x >= 1 && x < 3 && y >= 1 && y < 3;
          const int src = in ? 1 - i : i;
          CHECK_EQ(img[i * 32 + c * 16 + y * 4 + x], 10 * src + c);
        }
}

void test_switch_and_probability() {
  BatchMixSpec spec;
  spec.mixup = MixParams{};
  spec.cutmix = MixParams{};
  spec.mixup->p = 0.5;
  spec.cutmix->p = 0.5;
  spec.switch_prob = 0.3;
  spec.num_classes = 2;
  int cut = 0, applied = 0;
  const int n = 4000;
  for (uint64_t seed = 0; seed < n; ++seed) {
    detail::SplitMix64 rng(seed);
    const MixDraw d = draw_batch_mix(spec, 8, 8, rng);
    cut += d.cutmix;
    applied += d.applied;
  }
  CHECK(std::abs(cut - 0.3 * n) < 4 * std::sqrt(n * 0.21));
  CHECK(std::abs(applied - 0.5 * n) < 4 * std::sqrt(n * 0.25));
  // Not applied: one-hot labels, with timm's smoothing.
  MixDraw none;
  none.label_smoothing = 0.1;
  const int64_t y[2] = {1, 0};
  float soft[4];
  mix_labels(y, 2, 2, none, soft);
  CHECK(near(soft[0], 0.05) && near(soft[1], 0.95) && near(soft[2], 0.95) && near(soft[3], 0.05));
}

}  // namespace

TEST_MAIN(test_transform2d_basics(); test_boxes_through_crop_flip_resize();
          test_boxes_are_clipped_and_filtered(); test_boxes_through_pad_letterbox_rotation();
          test_boxes_through_perspective(); test_keypoints_flip_pairs_and_visibility();
          test_compact_rows(); test_identity_geometry_leaves_boxes_untouched();
          test_convex_polygon(); test_what_a_crop_removed_stays_removed();
          test_boxes_with_nothing_left_are_dropped(); test_mixup_images_and_labels();
          test_cutmix_box_and_area(); test_switch_and_probability())
