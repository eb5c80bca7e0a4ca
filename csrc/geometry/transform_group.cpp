#include "geometry/transform_group.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <variant>

#include "codecs/codecs.h"
#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/convex_polygon.h"
#include "geometry/detail/op_checks.h"
#include "geometry/detail/rng.h"
#include "geometry/group_masks.h"
#include "geometry/mosaic_canvas.h"
#include "geometry/op_context.h"
#include "geometry/resize.h"
#include "geometry/warp.h"
#include "sampler/permutation.h"

namespace stoker {

// NOTE [ Transform groups ]
//
// transforms={("image", "mask", "boxes", "classes"): [...]} runs the ops once
// per sample with one random stream: the image through its ImagePipeline, the
// same code and draws as an image alone, whose OpContext records every move
// in one composed map (geometry.h); then
//
//   masks   are resampled once through that map, nearest-neighbour (no label
//           is ever blended), never recoloured;
//   boxes   are moved through it (the enclosing box of the moved corners, as
//           torchvision), clipped to the output, filtered; their keep mask
//           drops the same rows of keypoints and of every other row field.
//
// Resampling a mask once through the composed map, instead of once per op,
// keeps it aligned with the image to a pixel where torchvision's per-op
// NEAREST (floor(i * in / out), no half-pixel offset) drifts by up to half a
// pixel per resize. The image's bytes do not depend on which targets come
// with it.
//
// The composed map alone forgets what a crop removed: a crop, then a
// rotation (or a padding) brings the cut-off parts back into the canvas,
// where the image shows fill. So every target also follows what is left of
// the image (Geometry::valid_region(): the input's canvas moved and clipped
// stage by stage, a convex polygon):
//
//   masks      take mask_fill outside the region;
//   boxes      are clipped stage by stage (Geometry::follow()): the box kept is
//              the enclosing box of what is left of the moved box, never of
//              parts a crop removed; nothing left, it is dropped;
//   keypoints  are hidden when a stage's canvas left them out.
//
// torchvision clamps boxes after every op, so that a box cropped, then
// rotated, encloses the rotated clamped box; stoker's encloses the rotated
// clamped polygon, which is tighter and never more than the object shows.

namespace {

using Clock = std::chrono::steady_clock;

bool is_target(GroupMember::Kind k) { return k != GroupMember::Kind::kImage; }

template <typename Op>
int mask_fill_of(const Op& op) {
  if constexpr (requires { op.mask_fill; })
    return op.mask_fill;
  else
    return -1;
}

template <typename Op>
int padding_mode_of(const Op& op) {
  if constexpr (requires { op.padding_mode; })
    return op.padding_mode;
  else
    return 0;
}

}  // namespace

TransformGroup::TransformGroup(GroupSpec spec) : spec_(std::move(spec)) {
  check_image_ops(spec_.ops);
  STOKER_CHECK(spec_.image.max_pixels > 0, UsageError, "max_pixels must be positive");
  STOKER_CHECK(!spec_.members.empty(), UsageError, "a transform group names no field");
  int boxes = -1, images = 0;
  bool targets = false, keypoints = false, encoded = false;
  for (size_t i = 0; i < spec_.members.size(); ++i) {
    const GroupMember& m = spec_.members[i];
    switch (m.kind) {
      case GroupMember::Kind::kImage:
        image_ = static_cast<int>(i);
        ++images;
        encoded = true;
        break;
      case GroupMember::Kind::kMask:
        if (primary_ < 0) primary_ = static_cast<int>(i);
        if (m.encoded) {
          encoded = true;
        } else {
          STOKER_CHECK(
              m.elem_bytes == 1 || m.elem_bytes == 2 || m.elem_bytes == 4 || m.elem_bytes == 8,
              UsageError, "mask '", m.name, "': elements of 1, 2, 4 or 8 bytes");
          STOKER_CHECK(m.array_h > 0 && m.array_w > 0, UsageError, "mask '", m.name,
                       "': an array mask needs a fixed (h, w)");
        }
        break;
      case GroupMember::Kind::kBoxes:
        STOKER_CHECK(boxes < 0, UsageError, "a transform group takes one boxes field, got '",
                     spec_.members[boxes].name, "' and '", m.name, "'");
        boxes = static_cast<int>(i);
        break;
      case GroupMember::Kind::kKeypoints:
        STOKER_CHECK(m.num_keypoints > 0, UsageError, "keypoints '", m.name, "': k must be > 0");
        keypoints = true;
        break;
      case GroupMember::Kind::kRows:
        STOKER_CHECK(m.row_bytes > 0, UsageError, "'", m.name, "': rows of 0 bytes");
        break;
    }
    targets = targets || is_target(m.kind);
  }
  STOKER_CHECK(images <= 1, UsageError, "a transform group takes one RGB image, got ", images,
               ": give each image its own group");
  if (image_ >= 0) primary_ = image_;
  STOKER_CHECK(primary_ >= 0, UsageError, "the transform group of '", spec_.members[0].name,
               "' has no image or mask: boxes, keypoints and rows follow the geometry of an "
               "image, so a group needs one (stoker.image(), or a mask)");
  if (encoded) require_image_codecs();

  const char* fill_op = nullptr;
  const char* pairs_op = nullptr;
  bool sanitized = false;
  std::vector<int> pairs;
  for (const ImageOp& op : spec_.ops) {
    const char* name = op_name(op);
    switch (op_target_rule(op)) {
      case ops::TargetRule::kNone:
        STOKER_CHECK(!targets, UsageError, name,
                     " moves pixels in ways masks, boxes and keypoints cannot follow (so does "
                     "torchvision's): use it on an image without targets, or leave it out");
        break;
      case ops::TargetRule::kImageOnly:
        STOKER_CHECK(image_ >= 0, UsageError, name, " cannot apply to mask '",
                     spec_.members[primary_].name,
                     "': masks hold class ids, which colour ops, blur and Normalize do not "
                     "change; a group without an RGB image has nothing for it to act on");
        break;
      case ops::TargetRule::kBoxes:
        STOKER_CHECK(boxes >= 0, UsageError, name, ": the group of '", spec_.members[0].name,
                     "' has no boxes field (stoker.boxes()) to act on");
        STOKER_CHECK(!sanitized, UsageError, name, " is given twice in one group");
        sanitized = true;
        {
          const auto& s = std::get<ops::SanitizeBoundingBoxes>(op);
          filter_ = BoxFilter{s.min_area, s.min_visibility, s.min_size};
        }
        break;
      case ops::TargetRule::kFollow:
        break;
    }
    std::visit(
        [&](const auto& o) {
          if (targets && padding_mode_of(o) != 0)
            STOKER_THROW(UsageError, name,
                         ": a padding_mode other than 'constant' cannot move masks, boxes or "
                         "keypoints (torchvision refuses it for boxes too)");
          const int f = mask_fill_of(o);
          if (f >= 0) {
            STOKER_CHECK(!fill_op || f == mask_fill_, UsageError,
                         "the ops of a group fill masks with different values (", int(mask_fill_),
                         " in ", fill_op, ", ", f, " in ", name,
                         "): give them the same mask_fill (masks are resampled once, through "
                         "all the ops)");
            fill_op = name;
            mask_fill_ = static_cast<uint8_t>(f);
          }
          using Op = std::remove_cvref_t<decltype(o)>;
          if constexpr (std::is_same_v<Op, ops::RandomHorizontalFlip>) {
            if (!o.flip_pairs.empty()) {
              STOKER_CHECK(!pairs_op || o.flip_pairs == pairs, UsageError,
                           "the flips of a group swap keypoints by different flip_pairs");
              pairs_op = name;
              pairs = o.flip_pairs;
            }
          }
        },
        op);
  }
  STOKER_CHECK(!pairs_op || keypoints, UsageError,
               "RandomHorizontalFlip: flip_pairs swaps keypoints, but the group of '",
               spec_.members[0].name, "' has no keypoints field (stoker.keypoints())");
  flip_perm_.resize(spec_.members.size());
  for (size_t i = 0; i < spec_.members.size() && pairs_op; ++i) {
    const GroupMember& m = spec_.members[i];
    if (m.kind != GroupMember::Kind::kKeypoints) continue;
    std::vector<int32_t>& perm = flip_perm_[i];
    perm.resize(static_cast<size_t>(m.num_keypoints));
    for (int j = 0; j < m.num_keypoints; ++j) perm[j] = j;
    for (size_t p = 0; p < pairs.size(); p += 2) {
      const int a = pairs[p], b = pairs[p + 1];
      STOKER_CHECK(a < m.num_keypoints && b < m.num_keypoints, UsageError,
                   "RandomHorizontalFlip: flip_pairs names keypoint ", std::max(a, b),
                   " but keypoints '", m.name, "' has ", m.num_keypoints);
      perm[a] = b;
      perm[b] = a;
    }
  }
  if (image_ >= 0) pipeline_ = std::make_unique<ImagePipeline>(spec_.image, spec_.ops);
  fixed_ = fixed_output_size(spec_.ops);
  samples_ = samples_read(spec_.ops);
  if (!spec_.ops.empty() && std::holds_alternative<ops::CopyPaste>(spec_.ops[0]))
    check_copy_paste();
}

DType TransformGroup::image_dtype() const {
  return pipeline_ ? pipeline_->out_dtype() : DType::kUInt8;
}

std::pair<int, int> TransformGroup::output_size(const MemberIO* io) const {
  if (fixed_) return *fixed_;
  if (pipeline_) return pipeline_->output_size(io[image_].data, io[image_].size);
  const GroupMember& m = spec_.members[primary_];
  std::pair<int, int> hw{m.array_h, m.array_w};
  if (m.encoded) {
    const ImageInfo info = probe_image(io[primary_].data, io[primary_].size);
    check_declared(info, spec_.image.max_pixels);
    hw = {info.height, info.width};
  }
  for (const ImageOp& op : spec_.ops) hw = size_after(op, hw);
  return hw;
}

void TransformGroup::partners(uint64_t seed, int64_t n, int64_t* out) const {
  // A stream of its own, so that the ops' draws do not depend on the dataset's size.
  detail::SplitMix64 rng(hash_combine(seed, 0x6d6f73616963ull /* "mosaic" */));
  for (int k = 0; k + 1 < samples_; ++k)
    out[k] = n > 0 ? static_cast<int64_t>(rng.randint(0, n - 1)) : 0;
}

void TransformGroup::run(MemberIO* io, uint64_t seed, int out_h, int out_w, int64_t* decode_ns,
                         const MemberIO* const* others) const {
  if (samples_ > 1) {
    STOKER_CHECK(others != nullptr, UsageError, op_name(spec_.ops[0]), " reads ", samples_,
                 " samples: the caller gives the other ", samples_ - 1);
    if (std::holds_alternative<ops::Mosaic>(spec_.ops[0]))
      run_mosaic(io, others, seed, out_h, out_w, decode_ns);
    else if (std::holds_alternative<ops::CopyPaste>(spec_.ops[0]))
      run_copy_paste(io, others, seed, out_h, out_w, decode_ns);
    else
      run_mixup(io, others, seed, out_h, out_w, decode_ns);
    return;
  }
  MaskScratch& s = mask_scratch();
  Geometry geo;
  Pixels primary_mask;
  if (pipeline_) {
    pipeline_->run(io[image_].data, io[image_].size, seed, io[image_].out, out_h, out_w, decode_ns,
                   &geo, io[image_].cache);
  } else {
    // The ops on the geometry of the first mask, with the draws an image would get.
    const GroupMember& m = spec_.members[primary_];
    const auto t0 = Clock::now();
    primary_mask = mask_pixels(m, io[primary_], spec_.image.max_pixels, s.gray[0], s);
    if (decode_ns)
      *decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    detail::SplitMix64 rng(seed);
    OpContext ctx(primary_mask.width, primary_mask.height, rng);
    for (const ImageOp& op : spec_.ops) std::visit([&](const auto& o) { o.apply(ctx); }, op);
    geo = ctx.geometry();
    if (geo.width() != out_w || geo.height() != out_h)
      STOKER_THROW(DecodeError, "mask '", m.name, "' comes out ", geo.height(), "x", geo.width(),
                   " but the batch expects ", out_h, "x", out_w);
  }
  const MemberIO* inputs[1] = {io};
  write_targets(io, inputs, &geo, 1, primary_mask, pipeline_ ? -1 : primary_, out_h, out_w,
                decode_ns);
}

// NOTE [ Mosaic ]
// YOLO's mosaic as ultralytics makes it: four samples (this one and three
// drawn by its own seed: partners()), each resized to fit the mosaic's size,
// meet at a random centre of a canvas twice that size. Each sample's targets
// follow their own geometry: its resize and the part of it the canvas shows
// (a crop, then the canvas as padding around it), then the ops after the
// Mosaic, which run once on the canvas. The masks of the four are resampled
// through their own geometries, each kept inside what its tile shows; boxes,
// keypoints and rows come one sample after the other (what is left of each).
// Only the part of the canvas the ops after the Mosaic read is painted
// (mosaic_canvas.h: with an affine warp then a centre crop, often a third of
// it): each tile's share of it resized straight into the canvas, a tile
// outside it not decoded at all. The bytes of the output are the same.
void TransformGroup::run_mosaic(MemberIO* io, const MemberIO* const* others, uint64_t seed,
                                int out_h, int out_w, int64_t* decode_ns) const {
  constexpr int K = ops::Mosaic::kSamples;
  const ops::Mosaic& m = std::get<ops::Mosaic>(spec_.ops[0]);
  const MemberIO* inputs[K] = {io, others[0], others[1], others[2]};
  const int W = 2 * m.w, H = 2 * m.h;
  detail::SplitMix64 rng(seed);
  // ultralytics: int(random.uniform(-border, 2 * s + border)), border = -s / 2
  const int xc = static_cast<int>(rng.uniform(m.center[0] * m.w, m.center[1] * m.w));
  const int yc = static_cast<int>(rng.uniform(m.center[0] * m.h, m.center[1] * m.h));
  thread_local std::vector<uint8_t> canvas_buf;
  std::vector<uint8_t>& canvas = canvas_buf;  // one thread-local lookup, not one per use
  ops::Mosaic::Tile tiles[K];
  std::pair<int, int> sizes[K];
  for (int k = 0; k < K; ++k) {
    sizes[k] = input_size(inputs[k]);
    tiles[k] = m.place(k, sizes[k].first, sizes[k].second, xc, yc);
  }
  // Only what the ops after the mosaic read is painted (the rest is never read).
  const PixelRect need = pipeline_ ? mosaic_read_region(spec_.ops, rng, W, H) : PixelRect{};
  if (pipeline_) {
    canvas.resize(static_cast<size_t>(W) * H * 3);
    fill_around(canvas.data(), W, H, need, tiles, K, ops::fill_of(m.fill));
  }
  Geometry geos[K];
  for (int k = 0; k < K; ++k) {
    const auto [w0, h0] = sizes[k];
    const ops::Mosaic::Tile& t = tiles[k];
    Geometry& g = geos[k];
    g = Geometry(w0, h0);
    g.resize(t.tw, t.th);
    g.crop(t.sx, t.sy, t.cw, t.ch);
    g.crop(-t.x, -t.y, W, H);
    // The part of the tile that is read: none, and the image is not decoded.
    const int vx0 = std::max(t.x, need.x), vx1 = std::min(t.x + t.cw, need.x + need.w);
    const int vy0 = std::max(t.y, need.y), vy1 = std::min(t.y + t.ch, need.y + need.h);
    if (!pipeline_ || vx1 <= vx0 || vy1 <= vy0) continue;
    const PixelRect part{t.sx + vx0 - t.x, t.sy + vy0 - t.y, vx1 - vx0, vy1 - vy0};
    uint8_t* dst = &canvas[(static_cast<size_t>(vy0) * W + vx0) * 3];
    const MemberIO& in = inputs[k][primary_];
    // The tile's pixels: decoded (a JPEG at the DCT scale that still covers the
    // tile), and the part read resized straight into the canvas, the bytes the
    // whole resize gives there.
    CanvasOps ops(thread_scratch(), in.data, in.size);
    Canvas c;
    try {
      ops.open(spec_.image.max_pixels, c);
      detail::SplitMix64 none(0);
      OpContext ctx(ops, c, none);
      ctx.resize(t.tw, t.th);
      if (c.pending) {
        resize_rgb_part(c.pend_src, c.pend_box, t.tw, t.th, part, dst, static_cast<size_t>(W) * 3);
      } else {  // the tile is the image's size: no resize
        ctx.crop(part);
        const Pixels p = ctx.pixels();
        for (int y = 0; y < part.h; ++y)
          std::memcpy(dst + static_cast<size_t>(y) * W * 3, p.row(y),
                      static_cast<size_t>(part.w) * 3);
      }
    } catch (...) {
      if (decode_ns) *decode_ns += ops.decode_ns;
      if (k == 0) throw;
      // A partner's error names it (the caller adds the sample's file and record).
      try {
        throw;
      } catch (const std::exception& e) {
        STOKER_THROW(DecodeError, "the mosaic's sample ", k,
                     " (another record, drawn by this "
                     "one): ",
                     e.what());
      }
    }
    if (decode_ns) *decode_ns += ops.decode_ns;
  }
  // The ops after the mosaic, on its canvas.
  Geometry rest;
  if (pipeline_) {
    CanvasOps ops(thread_scratch(), nullptr, 0);
    Canvas c;
    c.have_pixels = true;
    c.pix = {canvas.data(), W, H, static_cast<size_t>(W) * 3};
    c.src_w = W;
    c.src_h = H;
    c.view = {0, 0, W, H};
    pipeline_->run_from(1, ops, c, rng, io[image_].out, out_h, out_w, &rest);
  } else {
    OpContext ctx(W, H, rng);
    for (size_t i = 1; i < spec_.ops.size(); ++i)
      std::visit([&](const auto& o) { o.apply(ctx); }, spec_.ops[i]);
    rest = ctx.geometry();
    if (rest.width() != out_w || rest.height() != out_h)
      STOKER_THROW(DecodeError, "mask '", spec_.members[primary_].name, "' comes out ",
                   rest.height(), "x", rest.width(), " but the batch expects ", out_h, "x", out_w);
  }
  for (Geometry& g : geos) g.append(rest);
  write_targets(io, inputs, geos, K, Pixels{}, -1, out_h, out_w, decode_ns);
}

std::pair<int, int> TransformGroup::input_size(const MemberIO* in) const {
  const GroupMember& pm = spec_.members[primary_];
  if (pm.kind != GroupMember::Kind::kImage && !pm.encoded) return {pm.array_w, pm.array_h};
  const ImageInfo info = probe_image(in[primary_].data, in[primary_].size);
  check_declared(info, spec_.image.max_pixels);
  return {info.width, info.height};
}

void TransformGroup::write_targets(MemberIO* io, const MemberIO* const* inputs,
                                   const Geometry* geos, int k_samples, const Pixels& given_mask,
                                   int given, int out_h, int out_w, int64_t* decode_ns) const {
  MaskScratch& s = mask_scratch();
  auto timed = [&](auto&& fn) {
    const auto t0 = Clock::now();
    auto r = fn();
    if (decode_ns)
      *decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    return r;
  };
  const std::string& source = spec_.members[primary_].name;
  const bool mosaic = k_samples > 1 && std::holds_alternative<ops::Mosaic>(spec_.ops[0]);
  auto drawn = [&](int j) {  // for messages about sample j
    return j > 0 ? std::string(" (in a sample the ") + op_name(spec_.ops[0]) + " drew)"
                 : std::string();
  };
  for (int j = 0; j < k_samples; ++j)
    STOKER_CHECK(!geos[j].overflowed(), UsageError, "the ops of the group of '", source,
                 "' make more than ", Geometry::kMaxSteps,
                 " moves: targets cannot follow so many; use fewer ops");
  // What each sample's image still shows (masks are filled outside it).
  thread_local std::vector<ConvexPolygon> regions;
  thread_local std::vector<uint8_t> wholes;
  regions.resize(static_cast<size_t>(k_samples));
  wholes.assign(static_cast<size_t>(k_samples), 2);  // 2: not computed yet
  auto region_of = [&](int j) -> const ConvexPolygon& {
    if (wholes[j] == 2) {
      regions[j] = geos[j].valid_region();
      wholes[j] = geos[j].covers_output(regions[j]) ? 1 : 0;
    }
    return regions[j];
  };

  // Masks, and boxes (whose keep mask the rows after them need).
  const GroupMember* boxes = nullptr;
  thread_local std::vector<int64_t> n_boxes;  // per sample
  n_boxes.assign(static_cast<size_t>(k_samples), -1);
  const uint8_t mask_fill[8] = {mask_fill_, 0, 0, 0, 0, 0, 0, 0};  // one element, little-endian
  for (size_t i = 0; i < spec_.members.size(); ++i) {
    const GroupMember& m = spec_.members[i];
    MemberIO& mio = io[i];
    if (m.kind == GroupMember::Kind::kMask) {
      const size_t e = static_cast<size_t>(m.encoded ? 1 : m.elem_bytes);
      const Pixels dst =
          packed_pixels(static_cast<uint8_t*>(mio.out), out_w, out_h, static_cast<int>(e));
      for (int j = 0; j < k_samples; ++j) {
        const Geometry& geo = geos[j];
        const Pixels mask =
            j == 0 && static_cast<int>(i) == given && k_samples == 1 ? given_mask : timed([&] {
              return mask_pixels(m, inputs[j][i], spec_.image.max_pixels, s.gray[1], s);
            });
        if (mask.width != geo.in_width() || mask.height != geo.in_height())
          STOKER_THROW(DataError, "mask '", m.name, "' is ", mask.height, "x", mask.width, " but '",
                       source, "' is ", geo.in_height(), "x", geo.in_width(),
                       ": the fields of a group must have the same size", drawn(j));
        if (k_samples == 1) {
          if (!geo.moved() && mask.width == out_w && mask.height == out_h) {
            for (int y = 0; y < out_h; ++y) std::memcpy(dst.row(y), mask.row(y), dst.row_bytes());
          } else {
            warp_nearest_elements(mask, dst, geo.box_map().inverse(), mask_fill);
            const ConvexPolygon& region = region_of(0);
            if (!wholes[0]) fill_outside(dst, region, mask_fill);
          }
          continue;
        }
        // Several samples: each inside what its tile shows, fill elsewhere.
        if (j == 0)
          for (int y = 0; y < out_h; ++y)
            for (int x = 0; x < out_w; ++x) std::memcpy(dst.row(y) + x * e, mask_fill, e);
        s.tmp.resize(dst.row_bytes() * static_cast<size_t>(out_h));
        const Pixels tmp = packed_pixels(s.tmp.data(), out_w, out_h, static_cast<int>(e));
        warp_nearest_elements(mask, tmp, geo.box_map().inverse(), mask_fill);
        if (j > 0 && !mosaic)  // a mix: the max of the two where the other shows
          max_inside(tmp, dst, region_of(j), m.signed_elems);
        else
          copy_inside(tmp, dst, region_of(j));
      }
    } else if (m.kind == GroupMember::Kind::kBoxes) {
      int64_t total = 0, seen = 0;
      for (int j = 0; j < k_samples; ++j) {
        const MemberIO& in = inputs[j][i];
        STOKER_CHECK(in.size % 16 == 0, DataError, "boxes '", m.name, "': ", in.size,
                     " bytes is not a whole number of boxes");
        const int64_t n = static_cast<int64_t>(in.size / 16);
        float* seg = static_cast<float*>(mio.out) + 4 * total;
        std::memcpy(seg, in.data, in.size);
        s.keep.resize(static_cast<size_t>(seen + n));
        transform_boxes(seg, n, m.format, m.normalized, geos[j], filter_, s.keep.data() + seen);
        total += compact_rows(reinterpret_cast<uint8_t*>(seg), n, 16, s.keep.data() + seen);
        n_boxes[j] = n;
        seen += n;
      }
      mio.out_rows = total;
      boxes = &m;
    }
  }
  // Rows that follow the boxes.
  for (size_t i = 0; i < spec_.members.size(); ++i) {
    const GroupMember& m = spec_.members[i];
    MemberIO& mio = io[i];
    if (m.kind != GroupMember::Kind::kKeypoints && m.kind != GroupMember::Kind::kRows) continue;
    const size_t row = m.kind == GroupMember::Kind::kKeypoints
                           ? static_cast<size_t>(m.num_keypoints) * 12
                           : m.row_bytes;
    int64_t total = 0, seen = 0;
    for (int j = 0; j < k_samples; ++j) {
      const MemberIO& in = inputs[j][i];
      STOKER_CHECK(in.size % row == 0, DataError, "'", m.name, "': ", in.size,
                   " bytes is not a whole number of rows of ", row);
      const int64_t n = static_cast<int64_t>(in.size / row);
      if (boxes && n != n_boxes[j])
        STOKER_THROW(DataError, "'", m.name, "' has ", n, " rows but '", boxes->name, "' has ",
                     n_boxes[j], " boxes: the per-box fields of a group have one row per box",
                     drawn(j));
      uint8_t* seg = static_cast<uint8_t*>(mio.out) + static_cast<size_t>(total) * row;
      std::memcpy(seg, in.data, in.size);
      if (m.kind == GroupMember::Kind::kKeypoints)
        transform_keypoints(reinterpret_cast<float*>(seg), n, m.num_keypoints, m.normalized,
                            geos[j], flip_perm_[i].empty() ? nullptr : flip_perm_[i].data());
      total += boxes ? compact_rows(seg, n, row, s.keep.data() + seen) : n;
      seen += n;
    }
    mio.out_rows = total;
  }
}

}  // namespace stoker
