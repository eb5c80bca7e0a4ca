// Unit tests of transform groups (decode/augment_pipeline): an image with its
// mask, boxes, keypoints and per-box rows through one set of draws; the
// classic ops giving the classic path's bytes; the group's refusals.
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "decode/augment_pipeline.h"
#include "decode/detail/half.h"
#include "decode/image_pipeline.h"
#include "test_images.h"

using namespace stoker;
using namespace stoker::test;

namespace {

constexpr int kW = 96, kH = 72;

// Ops built field by field (aggregate initialisation of some fields trips
// -Wmissing-field-initializers).
aug::Pad pad(int l, int t, int r, int b) {
  aug::Pad p;
  p.left = l, p.top = t, p.right = r, p.bottom = b;
  return p;
}
aug::RandomCrop random_crop(int h, int w) {
  aug::RandomCrop c;
  c.h = h, c.w = w;
  return c;
}
aug::RandomRotation rotation(double lo, double hi, bool expand = false,
                             Interpolation i = Interpolation::kNearest) {
  aug::RandomRotation r;
  r.lo = lo, r.hi = hi, r.expand = expand, r.interpolation = i;
  return r;
}
aug::RandomAffine affine() {
  aug::RandomAffine a;
  a.deg_lo = -15, a.deg_hi = 15;
  a.translate = std::array<double, 2>{0.1, 0.1};
  a.scale = std::array<double, 2>{0.8, 1.2};
  a.shear = std::array<double, 4>{-10, 10, 0, 0};
  return a;
}
aug::RandomPerspective perspective(double d, double p) {
  aug::RandomPerspective q;
  q.distortion = d, q.p = p;
  return q;
}
aug::VerticalFlip vflip(double p) {
  aug::VerticalFlip v;
  v.p = p;
  return v;
}
aug::Letterbox letterbox(int h, int w) {
  aug::Letterbox l;
  l.h = h, l.w = w;
  return l;
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
// edge), classes and keypoints (one per box) with `ops`.
Outputs run_group(const std::vector<AugmentOp>& ops, uint64_t seed, bool targets = true) {
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
    kp.flip_perm = {1, 0};
    spec.members.push_back(kp);
  }
  spec.ops = ops;
  spec.filter.min_area = 4;
  const AugmentPipeline pipe(spec);
  static const Scene sc = scene();
  const auto [h, w] = pipe.output_size(sc.image.data(), sc.image.size());
  Outputs o;
  o.image.resize(static_cast<size_t>(h) * w * 3 * dtype_size(pipe.out_dtype()));
  o.mask.resize(static_cast<size_t>(h) * w);
  const std::vector<float> boxes = {sc.box[0], sc.box[1], sc.box[2], sc.box[3], 0, 0, 6, 6};
  const std::vector<int64_t> classes = {7, 9};
  const std::vector<float> points = {35, 25, 2, 65, 25, 2, 2, 2, 2, 4, 4, 2};
  o.boxes.resize(8);
  o.classes.resize(2);
  o.points.resize(12);
  std::vector<MemberIO> io(spec.members.size());
  io[0] = {sc.image.data(), sc.image.size(), o.image.data()};
  if (targets) {
    io[1] = {sc.mask.data(), sc.mask.size(), o.mask.data()};
    io[2] = {reinterpret_cast<const uint8_t*>(boxes.data()), 32, o.boxes.data()};
    io[3] = {reinterpret_cast<const uint8_t*>(classes.data()), 16, o.classes.data()};
    io[4] = {reinterpret_cast<const uint8_t*>(points.data()), 48, o.points.data()};
  }
  pipe.run(io.data(), seed, h, w);
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
  const std::vector<AugmentOp> ops = {ops::RandomResizedCrop{48, 48, 0.5, 1.0, 3.0 / 4, 4.0 / 3},
                                      ops::RandomHorizontalFlip{0.5}};
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
  const std::vector<std::vector<AugmentOp>> lists = {
      {letterbox(128, 128)},
      {pad(5, 7, 3, 1), random_crop(64, 80)},
      {rotation(-30, 30)},
      {affine()},
      {perspective(0.3, 1.0)},
      {vflip(1.0), ops::CenterCrop{60, 90}},
      {rotation(10, 20, true, Interpolation::kBilinear), ops::Resize{80, 80, 0}},
  };
  for (const auto& ops : lists)
    for (uint64_t seed = 0; seed < 10; ++seed) {
      GroupSpec probe;
      probe.members.push_back(member(GroupMember::Kind::kImage, "image"));
      probe.ops = ops;
      const Outputs o = run_group(ops, seed);
      const auto fixed = AugmentPipeline(probe).fixed_size();
      const int w = fixed ? fixed->second : kW, h = fixed ? fixed->first : kH;
      check_aligned(o, w, h, augment_op_name(ops[0]));
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
  const std::vector<AugmentOp> ops = {
      ops::RandomResizedCrop{32, 40, 0.3, 1.0, 0.75, 1.35}, ops::RandomHorizontalFlip{0.5},
      aug::ColorJitter{std::array<double, 2>{0.6, 1.4}, std::array<double, 2>{0.6, 1.4},
                       std::array<double, 2>{0.6, 1.4}, std::array<double, 2>{-0.1, 0.1}},
      rotation(-20, 20)};
  for (uint64_t seed = 0; seed < 5; ++seed)
    CHECK(run_group(ops, seed).image == run_group(ops, seed, false).image);
  // Colour ops leave masks alone (the jitter last: the geometry's draws are the same).
  const std::vector<AugmentOp> geo = {ops::RandomResizedCrop{32, 40, 0.3, 1.0, 0.75, 1.35},
                                      ops::RandomHorizontalFlip{0.5}, rotation(-20, 20)};
  std::vector<AugmentOp> jittered = geo;
  jittered.push_back(ops[2]);
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const Outputs a = run_group(geo, seed), b = run_group(jittered, seed);
    CHECK(b.mask == a.mask && b.boxes == a.boxes);
    CHECK(b.image != a.image);
  }
}

void test_classic_ops_keep_their_bytes() {
  // The classic list through a group gives what the classic path gives.
  ops::Normalize norm;
  norm.mean = {0.5, 0.4, 0.3};
  norm.stddev = {0.2, 0.25, 0.3};
  const ops::RandomResizedCrop rrc{40, 48, 0.2, 1.0, 0.74, 1.35};
  const ops::RandomHorizontalFlip flip{0.5};
  const ImagePipeline classic(ImageFieldSpec{}, {rrc, flip, norm});
  const std::vector<AugmentOp> ops = {rrc, flip, norm};
  GroupSpec gs;
  gs.members.push_back(member(GroupMember::Kind::kImage, "image"));
  gs.ops = ops;
  const AugmentPipeline group(gs);
  const Bytes jpeg = encode_jpeg(photo(200, 150, 3), 200, 150, JCS_RGB);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> a(40 * 48 * 3), b(40 * 48 * 3);
    classic.run(jpeg.data(), jpeg.size(), seed, a.data(), 40, 48);
    MemberIO io{jpeg.data(), jpeg.size(), b.data()};
    group.run(&io, seed, 40, 48);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  }
}

void test_normalize_and_erasing() {
  aug::RandomErasing e;
  e.params.p = 1.0;
  e.random_value = false;
  e.value[0] = e.value[1] = e.value[2] = -7.0f;
  const std::vector<AugmentOp> ops = {ops::CenterCrop{32, 32}, ops::Normalize{}, e};
  GroupSpec gs;
  gs.members.push_back(member(GroupMember::Kind::kImage, "image"));
  gs.ops = ops;
  gs.layout = ImageLayout::kCHW;
  const AugmentPipeline pipe(gs);
  CHECK(pipe.out_dtype() == DType::kFloat32);
  const Bytes jpeg = encode_jpeg(photo(64, 64, 3), 64, 64, JCS_RGB);
  std::vector<float> out(3 * 32 * 32);
  MemberIO io{jpeg.data(), jpeg.size(), out.data()};
  pipe.run(&io, 3, 32, 32);
  int erased = 0;
  for (float v : out) erased += v == -7.0f;
  CHECK(erased > 0 && erased % 3 == 0 && erased < 3 * 32 * 32);
}

void test_refusals() {
  auto group = [](std::vector<AugmentOp> ops, bool mask) {
    GroupSpec gs;
    gs.members.push_back(member(GroupMember::Kind::kImage, "image"));
    if (mask) gs.members.push_back(member(GroupMember::Kind::kMask, "mask"));
    gs.ops = std::move(ops);
    return AugmentPipeline(gs);
  };
  aug::AutoAugment ra;
  CHECK_THROWS(UsageError, group({ra}, true));
  group({ra}, false);  // fine without targets
  aug::Pad reflect;
  reflect.mode = PadMode::kReflect;
  reflect.left = 2;
  CHECK_THROWS(UsageError, group({reflect}, true));
  CHECK_THROWS(UsageError, group({rotation(0, 10, true)}, false));
  CHECK_THROWS(UsageError, group({ops::Normalize{}, ops::CenterCrop{4, 4}}, false));
  aug::Pad p1, p2;
  p1.fill.mask = 255;
  CHECK_THROWS(UsageError, group({p1, p2}, true));
  aug::GaussianBlur even;
  even.kx = 4;
  CHECK_THROWS(UsageError, group({even}, false));
  GroupSpec two;
  two.members = {member(GroupMember::Kind::kImage, "a"), member(GroupMember::Kind::kImage, "b")};
  CHECK_THROWS(UsageError, AugmentPipeline{two});
  // A mask of another size, a palette PNG mask, rows that do not match the boxes.
  GroupSpec gs;
  gs.members = {member(GroupMember::Kind::kImage, "image"),
                member(GroupMember::Kind::kMask, "mask")};
  const AugmentPipeline pipe(gs);
  const Scene sc = scene();
  const Bytes small = encode_png(Bytes(10 * 10), 10, 10, PNG_COLOR_TYPE_GRAY);
  Bytes img(kW * kH * 3), mask(kW * kH);
  MemberIO io[2] = {{sc.image.data(), sc.image.size(), img.data()},
                    {small.data(), small.size(), mask.data()}};
  CHECK_THROWS(DataError, pipe.run(io, 0, kH, kW));
  const Bytes palette = encode_png(Bytes(kW * kH), kW, kH, PNG_COLOR_TYPE_PALETTE);
  io[1] = {palette.data(), palette.size(), mask.data()};
  CHECK_THROWS(DataError, pipe.run(io, 0, kH, kW));
}

}  // namespace

TEST_MAIN(test_targets_follow_classic_ops(); test_targets_follow_new_geometry();
          test_letterbox_pads_with_114_and_places_boxes(); test_rows_drop_with_their_boxes();
          test_classic_ops_keep_their_bytes(); test_normalize_and_erasing(); test_refusals())
