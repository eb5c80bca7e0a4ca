#include "geometry/transform_group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>
#include <variant>

#include "codecs/codecs.h"
#include "codecs/jpeg_decoder.h"
#include "codecs/png_decoder.h"
#include "codecs/raw_image.h"
#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/detail/rng.h"
#include "geometry/op_context.h"
#include "geometry/warp.h"

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
// pixel per resize. Boxes are clipped once, at the end, where torchvision
// clamps after every op: a box cropped and then rotated keeps the corners the
// crop cut off (it encloses more). The image's bytes do not depend on which
// targets come with it.

namespace {

using Clock = std::chrono::steady_clock;

// Per-thread buffers of masks (decoded, and the RGB a colour mask decodes to first).
struct MaskScratch {
  std::vector<uint8_t> gray[2];
  std::vector<uint8_t> rgb;
  JpegDecoder jpeg;
  std::vector<uint8_t> keep;
};

MaskScratch& mask_scratch() {
  thread_local MaskScratch s;
  return s;
}

bool is_target(GroupMember::Kind k) { return k != GroupMember::Kind::kImage; }

// An encoded mask as one channel (png_decode_gray's rule; a JPEG's RGB
// decode as PIL's convert("L")).
Pixels decode_mask(const MemberIO& io, int64_t max_pixels, std::vector<uint8_t>& out,
                   MaskScratch& s) {
  ImageInfo info;
  if (is_raw(io.data, io.size)) {  // pixels stored decoded: one channel as is, RGB as PIL's "L"
    const RawImage r = raw_image(io.data, io.size);
    info = {r.width, r.height};
    check_declared(info, max_pixels);
    const size_t n = static_cast<size_t>(r.width) * r.height;
    if (r.channels == 1) {
      out.assign(r.pixels, r.pixels + n);
    } else {
      out.resize(n);
      const uint8_t* p = r.pixels;
      for (size_t i = 0; i < n; ++i, p += 3)
        out[i] =
            static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    }
  } else if (is_png(io.data, io.size)) {
    info = png_decode_gray(io.data, io.size, max_pixels, out, s.rgb);
  } else if (is_jpeg(io.data, io.size)) {
    info = s.jpeg.open(io.data, io.size, max_pixels);
    s.rgb.resize(static_cast<size_t>(info.width) * info.height * 3);
    s.jpeg.decode_full(s.rgb.data(), static_cast<size_t>(info.width) * 3);
    const size_t n = static_cast<size_t>(info.width) * info.height;
    out.resize(n);
    const uint8_t* p = s.rgb.data();
    for (size_t i = 0; i < n; ++i, p += 3)
      out[i] = static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
  } else {
    not_an_image(io.data, io.size);
  }
  return packed_pixels(out.data(), info.width, info.height, 1);
}

// A mask member's pixels (elements of elem_bytes as "channels").
Pixels mask_pixels(const GroupMember& m, const MemberIO& io, int64_t max_pixels,
                   std::vector<uint8_t>& buf, MaskScratch& s) {
  if (m.encoded) return decode_mask(io, max_pixels, buf, s);
  const size_t want = static_cast<size_t>(m.array_h) * m.array_w * m.elem_bytes;
  STOKER_CHECK(io.size == want, DataError, "mask '", m.name, "': ", io.size, " bytes, expected ",
               want);
  return packed_pixels(const_cast<uint8_t*>(io.data), m.array_w, m.array_h, m.elem_bytes);
}

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

void TransformGroup::run(MemberIO* io, uint64_t seed, int out_h, int out_w,
                         int64_t* decode_ns) const {
  MaskScratch& s = mask_scratch();
  auto timed = [&](auto&& fn) {
    const auto t0 = Clock::now();
    auto r = fn();
    if (decode_ns)
      *decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    return r;
  };
  Geometry geo;
  Pixels primary_mask;
  if (pipeline_) {
    pipeline_->run(io[image_].data, io[image_].size, seed, io[image_].out, out_h, out_w, decode_ns,
                   &geo, io[image_].cache);
  } else {
    // The ops on the geometry of the first mask, with the draws an image would get.
    const GroupMember& m = spec_.members[primary_];
    primary_mask =
        timed([&] { return mask_pixels(m, io[primary_], spec_.image.max_pixels, s.gray[0], s); });
    detail::SplitMix64 rng(seed);
    OpContext ctx(primary_mask.width, primary_mask.height, rng);
    for (const ImageOp& op : spec_.ops) std::visit([&](const auto& o) { o.apply(ctx); }, op);
    geo = ctx.geometry();
    if (geo.width() != out_w || geo.height() != out_h)
      STOKER_THROW(DecodeError, "mask '", m.name, "' comes out ", geo.height(), "x", geo.width(),
                   " but the batch expects ", out_h, "x", out_w);
  }
  const std::string& source = spec_.members[primary_].name;

  // Masks, and boxes (whose keep mask the rows after them need).
  const GroupMember* boxes = nullptr;
  int64_t n_boxes = -1;
  const uint8_t mask_fill[8] = {mask_fill_, 0, 0, 0, 0, 0, 0, 0};  // one element, little-endian
  for (size_t k = 0; k < spec_.members.size(); ++k) {
    const GroupMember& m = spec_.members[k];
    MemberIO& mio = io[k];
    if (m.kind == GroupMember::Kind::kMask) {
      const Pixels mask = static_cast<int>(k) == primary_ && !pipeline_ ? primary_mask : timed([&] {
        return mask_pixels(m, mio, spec_.image.max_pixels, s.gray[1], s);
      });
      if (mask.width != geo.in_width() || mask.height != geo.in_height())
        STOKER_THROW(DataError, "mask '", m.name, "' is ", mask.height, "x", mask.width, " but '",
                     source, "' is ", geo.in_height(), "x", geo.in_width(),
                     ": the fields of a group must have the same size");
      const Pixels dst = packed_pixels(static_cast<uint8_t*>(mio.out), out_w, out_h, mask.channels);
      if (!geo.moved() && mask.width == out_w && mask.height == out_h)
        for (int y = 0; y < out_h; ++y) std::memcpy(dst.row(y), mask.row(y), dst.row_bytes());
      else
        warp_nearest_elements(mask, dst, geo.box_map().inverse(), mask_fill);
    } else if (m.kind == GroupMember::Kind::kBoxes) {
      STOKER_CHECK(mio.size % 16 == 0, DataError, "boxes '", m.name, "': ", mio.size,
                   " bytes is not a whole number of boxes");
      const int64_t n = static_cast<int64_t>(mio.size / 16);
      std::memcpy(mio.out, mio.data, mio.size);
      s.keep.resize(static_cast<size_t>(n));
      transform_boxes(static_cast<float*>(mio.out), n, m.format, m.normalized, geo, filter_,
                      s.keep.data());
      mio.out_rows = compact_rows(static_cast<uint8_t*>(mio.out), n, 16, s.keep.data());
      boxes = &m;
      n_boxes = n;
    }
  }
  // Rows that follow the boxes.
  for (size_t k = 0; k < spec_.members.size(); ++k) {
    const GroupMember& m = spec_.members[k];
    MemberIO& mio = io[k];
    if (m.kind != GroupMember::Kind::kKeypoints && m.kind != GroupMember::Kind::kRows) continue;
    const size_t row = m.kind == GroupMember::Kind::kKeypoints
                           ? static_cast<size_t>(m.num_keypoints) * 12
                           : m.row_bytes;
    STOKER_CHECK(mio.size % row == 0, DataError, "'", m.name, "': ", mio.size,
                 " bytes is not a whole number of rows of ", row);
    const int64_t n = static_cast<int64_t>(mio.size / row);
    if (boxes && n != n_boxes)
      STOKER_THROW(DataError, "'", m.name, "' has ", n, " rows but '", boxes->name, "' has ",
                   n_boxes, " boxes: the per-box fields of a group have one row per box");
    std::memcpy(mio.out, mio.data, mio.size);
    if (m.kind == GroupMember::Kind::kKeypoints)
      transform_keypoints(static_cast<float*>(mio.out), n, m.num_keypoints, m.normalized, geo,
                          flip_perm_[k].empty() ? nullptr : flip_perm_[k].data());
    mio.out_rows = boxes ? compact_rows(static_cast<uint8_t*>(mio.out), n, row, s.keep.data()) : n;
  }
}

}  // namespace stoker
