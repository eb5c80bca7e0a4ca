// Unit tests of transform groups (geometry/transform_group): an image with its
// mask, boxes, keypoints and per-box rows through one set of draws; masks
// alone (the ops on their geometry), array masks, palette masks; the group's
// refusals.
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "common/detail/half.h"
#include "common/error.h"
#include "geometry/image_pipeline.h"
#include "geometry/transform_group.h"
#include "test_images.h"

using namespace stoker;
using namespace stoker::test;

namespace {

constexpr int kW = 96, kH = 72;

// Ops built field by field (aggregate initialisation of some fields trips
// -Wmissing-field-initializers).
ops::Pad pad(int l, int t, int r, int b) {
  ops::Pad p;
  p.left = l, p.top = t, p.right = r, p.bottom = b;
  return p;
}
ops::RandomCrop random_crop(int h, int w) {
  ops::RandomCrop c;
  c.h = h, c.w = w;
  return c;
}
ops::RandomRotation rotation(double lo, double hi, bool expand = false, int interpolation = 0) {
  ops::RandomRotation r;
  r.degrees = {lo, hi};
  r.expand = expand;
  r.interpolation = interpolation;
  return r;
}
ops::RandomAffine affine() {
  ops::RandomAffine a;
  a.degrees = {-15, 15};
  a.translate = {0.1, 0.1};
  a.scale = {0.8, 1.2};
  a.shear = {-10, 10, 0, 0};
  return a;
}
ops::RandomPerspective perspective(double d, double p) {
  ops::RandomPerspective q;
  q.distortion_scale = d, q.p = p;
  return q;
}
ops::RandomVerticalFlip vflip(double p) {
  ops::RandomVerticalFlip v;
  v.p = p;
  return v;
}
ops::Letterbox letterbox(int h, int w) {
  ops::Letterbox l;
  l.h = h, l.w = w;
  return l;
}
ops::RandomHorizontalFlip hflip(double p, std::vector<int> pairs = {}) {
  ops::RandomHorizontalFlip f;
  f.p = p;
  f.flip_pairs = std::move(pairs);
  return f;
}
ops::SanitizeBoundingBoxes sanitize(double min_area) {
  ops::SanitizeBoundingBoxes s;
  s.min_size = 0;
  s.min_area = min_area;
  return s;
}

// An image with a red rectangle on a gray background, its mask (label 3 under
// the rectangle), and the rectangle's box: the three must stay aligned.
struct Scene {
  Bytes image, mask;
  float box[4] = {30, 20, 70, 50};  // xyxy
};

Scene scene() {
  Scene s;
  Bytes rgb(kW * kH * 3), m(kW * kH);
  for (int y = 0; y < kH; ++y)
    for (int x = 0; x < kW; ++x) {
      const bool in = x >= 30 && x < 70 && y >= 20 && y < 50;
      uint8_t* p = &rgb[(y * kW + x) * 3];
      p[0] = in ? 230 : 90;
      p[1] = in ? 20 : 90;
      p[2] = in ? 20 : 90;
      m[y * kW + x] = in ? 3 : 0;
    }
  s.image = encode_png(rgb, kW, kH, PNG_COLOR_TYPE_RGB);
  s.mask = encode_png(m, kW, kH, PNG_COLOR_TYPE_GRAY);
  return s;
}

GroupMember member(GroupMember::Kind k, const char* name) {
  GroupMember m;
  m.kind = k;
  m.name = name;
  return m;
}

struct Outputs {
  Bytes image, mask;
  std::vector<float> boxes, points;
  std::vector<int64_t> classes;
  int64_t n_boxes = 0, n_points = 0, n_classes = 0;
};

// Runs a group of image, mask, boxes (2: the rectangle and a box near the left
// edge), classes and keypoints (one per box) with `ops` (and a filter of boxes
// of at least 4 pixels).
Outputs run_group(std::vector<ImageOp> ops, uint64_t seed, bool targets = true) {
  GroupSpec spec;
  spec.members.push_back(member(GroupMember::Kind::kImage, "image"));
  if (targets) {
    spec.members.push_back(member(GroupMember::Kind::kMask, "mask"));
    spec.members.push_back(member(GroupMember::Kind::kBoxes, "boxes"));
    GroupMember cls = member(GroupMember::Kind::kRows, "classes");
    cls.row_bytes = 8;
    spec.members.push_back(cls);
    GroupMember kp = member(GroupMember::Kind::kKeypoints, "kp");
    kp.num_keypoints = 2;
    spec.members.push_back(kp);
    ops.push_back(sanitize(4));
  }
  spec.ops = ops;
  const TransformGroup group(spec);
  static const Scene sc = scene();
  const std::vector<float> boxes = {sc.box[0], sc.box[1], sc.box[2], sc.box[3], 0, 0, 6, 6};
  const std::vector<int64_t> classes = {7, 9};
  const std::vector<float> points = {35, 25, 2, 65, 25, 2, 2, 2, 2, 4, 4, 2};
  std::vector<MemberIO> io(spec.members.size());
  io[0] = {sc.image.data(), sc.image.size()};
  if (targets) {
    io[1] = {sc.mask.data(), sc.mask.size()};
    io[2] = {reinterpret_cast<const uint8_t*>(boxes.data()), 32};
    io[3] = {reinterpret_cast<const uint8_t*>(classes.data()), 16};
    io[4] = {reinterpret_cast<const uint8_t*>(points.data()), 48};
  }
  const auto [h, w] = group.output_size(io.data());
  Outputs o;
  o.image.resize(static_cast<size_t>(h) * w * 3 * dtype_size(group.image_dtype()));
  o.mask.resize(static_cast<size_t>(h) * w);
  o.boxes.resize(8);
  o.classes.resize(2);
  o.points.resize(12);
  io[0].out = o.image.data();
  if (targets) {
    io[1].out = o.mask.data();
    io[2].out = o.boxes.data();
    io[3].out = o.classes.data();
    io[4].out = o.points.data();
  }
  group.run(io.data(), seed, h, w);
  if (targets) {
    o.n_boxes = io[2].out_rows;
    o.n_classes = io[3].out_rows;
    o.n_points = io[4].out_rows;
  }
  return o;
}

// The mask's label-3 pixels lie inside the first box, and the image is red there.
void check_aligned(const Outputs& o, int w, int h, const char* what) {
  CHECK(o.n_boxes >= 1 && o.n_classes == o.n_boxes && o.n_points == o.n_boxes);
  CHECK_EQ(o.classes[0], 7);
  const float* b = o.boxes.data();
  int labelled = 0, red = 0;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      if (o.mask[y * w + x] != 3) continue;
      ++labelled;
      // pixel centre inside the box, a pixel of slack for the resampling
      if (!(x + 0.5 >= b[0] - 1 && x + 0.5 <= b[2] + 1 && y + 0.5 >= b[1] - 1 &&
            y + 0.5 <= b[3] + 1)) {
        std::fprintf(stderr, "%s: mask pixel (%d, %d) outside box %.1f %.1f %.1f %.1f\n", what, x,
                     y, b[0], b[1], b[2], b[3]);
        std::exit(1);
      }
      const uint8_t* p = &o.image[(y * w + x) * 3];
      red += p[0] > 150 && p[1] < 80;
    }
  CHECK(labelled > 0);
  CHECK(red > labelled * 8 / 10);  // the edge pixels of the rectangle may blend
}

void test_targets_follow_classic_ops() {
  const std::vector<ImageOp> ops = {ops::RandomResizedCrop{48, 48, 0.5, 1.0, 3.0 / 4, 4.0 / 3},
                                    hflip(0.5, {0, 1})};
  int flipped = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const Outputs o = run_group(ops, seed);
    check_aligned(o, 48, 48, "rrc+flip");
    // Keypoint 0 is the rectangle's left one: under a flip flip_pairs swaps it
    // with keypoint 1, so that it stays on the left.
    if (o.points[2] > 0 && o.points[5] > 0) CHECK(o.points[0] < o.points[3]);
    // The small box in the top-left corner lands on the right when flipped.
    if (o.n_boxes == 2) flipped += o.boxes[4] > 24;
  }
  CHECK(flipped > 0);
}

void test_targets_follow_new_geometry() {
  const std::vector<std::vector<ImageOp>> lists = {
      {letterbox(128, 128)},
      {pad(5, 7, 3, 1), random_crop(64, 80)},
      {rotation(-30, 30)},
      {affine()},
      {perspective(0.3, 1.0)},
      {vflip(1.0), ops::CenterCrop{60, 90}},
      {rotation(10, 20, true, 1), ops::Resize{80, 80, 0, 0}},
      {ops::Resize{0, 0, 0, 120}},
  };
  for (const auto& ops : lists)
    for (uint64_t seed = 0; seed < 10; ++seed) {
      const Outputs o = run_group(ops, seed);
      const auto fixed = fixed_output_size(ops);
      std::pair<int, int> hw{kH, kW};
      for (const ImageOp& op : ops) hw = size_after(op, hw);
      const int w = fixed ? fixed->second : hw.second, h = fixed ? fixed->first : hw.first;
      check_aligned(o, w, h, op_name(ops[0]));
    }
}

void test_letterbox_pads_with_114_and_places_boxes() {
  const Outputs o = run_group({letterbox(128, 128)}, 0);
  // 96 x 72 -> 128 x 96, 16 rows of padding above and below
  for (int x = 0; x < 128; ++x)
    for (int c = 0; c < 3; ++c) CHECK(o.image[x * 3 + c] == 114 && o.mask[x] == 0);
  const double r = 128.0 / 96;
  CHECK(std::abs(o.boxes[0] - 30 * r) < 1e-3 && std::abs(o.boxes[1] - (20 * r + 16)) < 1e-3);
  CHECK(std::abs(o.boxes[2] - 70 * r) < 1e-3 && std::abs(o.boxes[3] - (50 * r + 16)) < 1e-3);
}

void test_rows_drop_with_their_boxes() {
  // A crop that leaves out the small box at the top-left corner.
  const Outputs o = run_group({pad(0, 0, 0, 0), ops::CenterCrop{40, 40}}, 0);
  CHECK(o.n_boxes == 1 && o.n_classes == 1 && o.n_points == 1);
  CHECK_EQ(o.classes[0], 7);
  // The image alone gets the same pixels: targets do not change the draws.
  ops::ColorJitter jitter;
  jitter.brightness = jitter.contrast = jitter.saturation = {0.6, 1.4};
  jitter.hue = {-0.1, 0.1};
  const std::vector<ImageOp> ops = {ops::RandomResizedCrop{32, 40, 0.3, 1.0, 0.75, 1.35},
                                    hflip(0.5), jitter, rotation(-20, 20)};
  for (uint64_t seed = 0; seed < 5; ++seed)
    CHECK(run_group(ops, seed).image == run_group(ops, seed, false).image);
  // Colour ops leave masks alone (the jitter last: the geometry's draws are the same).
  const std::vector<ImageOp> geo = {ops::RandomResizedCrop{32, 40, 0.3, 1.0, 0.75, 1.35},
                                    hflip(0.5), rotation(-20, 20)};
  std::vector<ImageOp> jittered = geo;
  jittered.push_back(jitter);
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const Outputs a = run_group(geo, seed), b = run_group(jittered, seed);
    CHECK(b.mask == a.mask && b.boxes == a.boxes);
    CHECK(b.image != a.image);
  }
}

// A group of masks alone runs the ops on their geometry, with the draws an
// image would get: the same masks as beside the image; an array mask (int32
// class ids) comes out as the PNG mask does, and a palette PNG gives indices.
void test_masks_alone_arrays_and_palettes() {
  const Scene sc = scene();
  const std::vector<ImageOp> ops = {ops::RandomResizedCrop{40, 40, 0.3, 1.0, 0.75, 1.35},
                                    hflip(0.5), rotation(-25, 25), vflip(0.5)};
  std::vector<int32_t> ids(kW * kH);
  Bytes gray(kW * kH);
  for (int i = 0; i < kW * kH; ++i) {
    ids[i] = (i % 7) * 1000 + 3;
    gray[i] = static_cast<uint8_t>(i % 7);
  }
  const Bytes palette = encode_png(gray, kW, kH, PNG_COLOR_TYPE_PALETTE);
  GroupMember arr = member(GroupMember::Kind::kMask, "ids");
  arr.encoded = false;
  arr.elem_bytes = 4;
  arr.array_h = kH;
  arr.array_w = kW;
  GroupSpec alone;
  alone.members = {member(GroupMember::Kind::kMask, "mask"), arr,
                   member(GroupMember::Kind::kMask, "palette")};
  alone.ops = ops;
  const TransformGroup g(alone);
  CHECK(g.image_member() == -1 && g.fixed_size() == std::make_pair(40, 40));
  for (uint64_t seed = 0; seed < 8; ++seed) {
    Bytes m(40 * 40), p(40 * 40);
    std::vector<int32_t> a(40 * 40);
    MemberIO io[3] = {{sc.mask.data(), sc.mask.size(), m.data()},
                      {reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * 4, a.data()},
                      {palette.data(), palette.size(), p.data()}};
    g.run(io, seed, 40, 40);
    CHECK(m == run_group(ops, seed).mask);
    for (int i = 0; i < 40 * 40; ++i) {
      // the same source pixel in all three (0 outside: the mask fill)
      CHECK(a[i] == 0 || a[i] % 1000 == 3);
      CHECK(p[i] == (a[i] == 0 ? 0 : a[i] / 1000));
    }
  }
}

void test_normalize_bfloat16_and_erasing() {
  ops::RandomErasing e;
  e.p = 1.0;
  e.value = {-7.0, -7.0, -7.0};
  ops::Normalize norm;
  norm.dtype = DType::kBFloat16;
  GroupSpec gs;
  gs.members.push_back(member(GroupMember::Kind::kImage, "image"));
  gs.members.push_back(member(GroupMember::Kind::kMask, "mask"));
  gs.ops = {ops::CenterCrop{32, 32}, norm, e};
  gs.image.layout = ImageLayout::kCHW;
  const TransformGroup group(gs);
  CHECK(group.image_dtype() == DType::kBFloat16);
  const Scene sc = scene();
  std::vector<uint16_t> out(3 * 32 * 32);
  Bytes mask(32 * 32);
  MemberIO io[2] = {{sc.image.data(), sc.image.size(), out.data()},
                    {sc.mask.data(), sc.mask.size(), mask.data()}};
  group.run(io, 3, 32, 32);
  int erased = 0;
  for (uint16_t v : out) erased += detail::bfloat16_to_float(v) == -7.0f;
  CHECK(erased > 0 && erased % 3 == 0 && erased < 3 * 32 * 32);
  // The mask is cropped (columns 32..63, rows 20..51: 30 rows of the
  // rectangle), untouched by Normalize and the erasing.
  int labelled = 0;
  for (uint8_t v : mask) labelled += v == 3;
  CHECK_EQ(labelled, 32 * 30);
}

void test_refusals() {
  auto group = [](std::vector<ImageOp> ops, bool mask, bool image = true) {
    GroupSpec gs;
    if (image) gs.members.push_back(member(GroupMember::Kind::kImage, "image"));
    if (mask) gs.members.push_back(member(GroupMember::Kind::kMask, "mask"));
    gs.ops = std::move(ops);
    return TransformGroup(gs);
  };
  CHECK_THROWS(UsageError, group({ops::RandAugment{}}, true));
  group({ops::RandAugment{}}, false);  // fine without targets
  ops::Pad reflect = pad(2, 0, 0, 0);
  reflect.padding_mode = 2;
  CHECK_THROWS(UsageError, group({reflect}, true));
  CHECK_THROWS(UsageError, group({rotation(0, 10, true)}, false));
  CHECK_THROWS(UsageError, group({ops::Normalize{}, ops::CenterCrop{4, 4}}, false));
  ops::Pad p1 = pad(1, 1, 1, 1), p2 = pad(1, 1, 1, 1);
  p1.mask_fill = 255;
  CHECK_THROWS(UsageError, group({p1, p2}, true));
  ops::GaussianBlur even;
  even.kw = 4;
  CHECK_THROWS(UsageError, group({even}, false));
  // Colour ops on masks alone, boxes without an image, filters without boxes,
  // flip_pairs without keypoints.
  CHECK_THROWS(UsageError, group({ops::ColorJitter{}}, true, false));
  CHECK_THROWS(UsageError, group({ops::Normalize{}}, true, false));
  group({ops::CenterCrop{4, 4}, hflip(0.5)}, true, false);
  CHECK_THROWS(UsageError, group({sanitize(1)}, true));
  CHECK_THROWS(UsageError, group({hflip(0.5, {0, 1})}, true));
  GroupSpec boxes_alone;
  boxes_alone.members = {member(GroupMember::Kind::kBoxes, "boxes")};
  CHECK_THROWS(UsageError, TransformGroup{boxes_alone});
  GroupSpec two;
  two.members = {member(GroupMember::Kind::kImage, "a"), member(GroupMember::Kind::kImage, "b")};
  CHECK_THROWS(UsageError, TransformGroup{two});
  GroupSpec far;
  GroupMember kp = member(GroupMember::Kind::kKeypoints, "kp");
  kp.num_keypoints = 3;
  far.members = {member(GroupMember::Kind::kImage, "image"), kp};
  far.ops = {hflip(0.5, {1, 3})};
  CHECK_THROWS(UsageError, TransformGroup{far});
  // A mask of another size, rows that do not match the boxes.
  GroupSpec gs;
  gs.members = {member(GroupMember::Kind::kImage, "image"),
                member(GroupMember::Kind::kMask, "mask")};
  const TransformGroup pipe(gs);
  const Scene sc = scene();
  const Bytes small = encode_png(Bytes(10 * 10), 10, 10, PNG_COLOR_TYPE_GRAY);
  Bytes img(kW * kH * 3), mask(kW * kH);
  MemberIO io[2] = {{sc.image.data(), sc.image.size(), img.data()},
                    {small.data(), small.size(), mask.data()}};
  CHECK_THROWS(DataError, pipe.run(io, 0, kH, kW));
  GroupSpec rows;
  GroupMember cls = member(GroupMember::Kind::kRows, "classes");
  cls.row_bytes = 8;
  rows.members = {member(GroupMember::Kind::kImage, "image"),
                  member(GroupMember::Kind::kBoxes, "boxes"), cls};
  const TransformGroup with_rows(rows);
  const std::vector<float> b = {1, 1, 5, 5};
  const std::vector<int64_t> c = {1, 2};
  std::vector<float> bo(4);
  std::vector<int64_t> co(2);
  MemberIO rio[3] = {{sc.image.data(), sc.image.size(), img.data()},
                     {reinterpret_cast<const uint8_t*>(b.data()), 16, bo.data()},
                     {reinterpret_cast<const uint8_t*>(c.data()), 16, co.data()}};
  CHECK_THROWS(DataError, with_rows.run(rio, 0, kH, kW));
}

void test_mosaic_places_four_samples_and_their_targets() {
  // ultralytics' placement: the sample's tile ends at the centre, the others start there.
  ops::Mosaic m;
  m.h = m.w = 64;
  const ops::Mosaic::Tile t0 = m.place(0, 96, 72, 50, 70);  // fits 64 wide: 64 x 48
  CHECK(t0.tw == 64 && t0.th == 48 && t0.x == 0 && t0.y == 22 && t0.cw == 50 && t0.ch == 48);
  CHECK(t0.sx == 14 && t0.sy == 0);
  const ops::Mosaic::Tile t3 = m.place(3, 96, 72, 50, 70);
  CHECK(t3.x == 50 && t3.y == 70 && t3.sx == 0 && t3.sy == 0 && t3.cw == 64 && t3.ch == 48);
  const ops::Mosaic::Tile t1 = m.place(1, 72, 96, 100, 20);  // 48 x 64, cut at the top
  CHECK(t1.tw == 48 && t1.th == 64 && t1.x == 100 && t1.y == 0 && t1.cw == 28 && t1.ch == 20);
  CHECK(t1.sy == 44);
  // A group with a mosaic reads four samples: the same scene four times; every
  // tile's box, class and keypoints come out, each on its own red rectangle.
  GroupSpec spec;
  spec.members.push_back(member(GroupMember::Kind::kImage, "image"));
  spec.members.push_back(member(GroupMember::Kind::kMask, "mask"));
  spec.members.push_back(member(GroupMember::Kind::kBoxes, "boxes"));
  GroupMember cls = member(GroupMember::Kind::kRows, "classes");
  cls.row_bytes = 8;
  spec.members.push_back(cls);
  spec.ops = {m};
  const TransformGroup group(spec);
  CHECK_EQ(group.samples(), 4);
  int64_t partners[3], again[3];
  group.partners(42, 1000, partners);
  group.partners(42, 1000, again);
  CHECK(partners[0] == again[0] && partners[1] == again[1] && partners[2] == again[2]);
  const Scene sc = scene();
  const float box[4] = {sc.box[0], sc.box[1], sc.box[2], sc.box[3]};
  const int64_t c[1] = {5};
  MemberIO one[4] = {{sc.image.data(), sc.image.size()},
                     {sc.mask.data(), sc.mask.size()},
                     {reinterpret_cast<const uint8_t*>(box), 16},
                     {reinterpret_cast<const uint8_t*>(c), 8}};
  const MemberIO* others[3] = {one, one, one};
  Bytes img(128 * 128 * 3), mask(128 * 128);
  std::vector<float> boxes(16);
  std::vector<int64_t> classes(4);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    MemberIO io[4] = {one[0], one[1], one[2], one[3]};
    io[0].out = img.data();
    io[1].out = mask.data();
    io[2].out = boxes.data();
    io[3].out = classes.data();
    group.run(io, seed, 128, 128, nullptr, others);
    CHECK(io[2].out_rows >= 1 && io[2].out_rows <= 4 && io[3].out_rows == io[2].out_rows);
    for (int64_t k = 0; k < io[2].out_rows; ++k) {
      CHECK_EQ(classes[k], 5);
      const float* b = &boxes[4 * k];
      // every pixel inside the box is red in the image and labelled in the mask
      for (int y = static_cast<int>(std::ceil(b[1])); y < static_cast<int>(b[3]); ++y)
        for (int x = static_cast<int>(std::ceil(b[0])); x < static_cast<int>(b[2]); ++x) {
          CHECK_EQ(mask[y * 128 + x], 3);
          CHECK(img[(y * 128 + x) * 3] > 150);
        }
    }
    CHECK_THROWS(UsageError, group.run(io, seed, 128, 128));  // the others are needed
  }
}

}  // namespace

TEST_MAIN(test_targets_follow_classic_ops(); test_targets_follow_new_geometry();
          test_letterbox_pads_with_114_and_places_boxes(); test_rows_drop_with_their_boxes();
          test_masks_alone_arrays_and_palettes(); test_normalize_bfloat16_and_erasing();
          test_refusals(); test_mosaic_places_four_samples_and_their_targets())
