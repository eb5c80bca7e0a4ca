// CopyPaste (mixing_ops.h): its checks, and the transform group's run of it
// (NOTE [ CopyPaste ]).
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/detail/rng.h"
#include "geometry/group_masks.h"
#include "geometry/image_ops.h"
#include "geometry/transform_group.h"
#include "geometry/warp.h"

namespace stoker {

namespace ops {

void CopyPaste::check() const {
  STOKER_CHECK(p >= 0 && p <= 1, UsageError, kName, ": p must be ", kInUnit, ", got ", p);
  STOKER_CHECK(occlusion >= 0 && occlusion <= 1, UsageError, kName, ": occlusion must be ", kInUnit,
               ", got ", occlusion);
}

void CopyPaste::apply(OpContext&) const {
  STOKER_THROW(UsageError, kName,
               " reads another sample: it runs first in a transform group, not in an op list "
               "of its own");
}

}  // namespace ops

namespace {

// An instance id: the element as an unsigned number; a negative one is none (0).
uint64_t id_at(const uint8_t* p, size_t e, bool signed_elems) {
  if (signed_elems && (p[e - 1] & 0x80)) return 0;
  uint64_t v = 0;
  std::memcpy(&v, p, e);  // little-endian, as every mask here
  return v;
}

// The largest id an element holds.
uint64_t max_id(size_t e, bool signed_elems) {
  const unsigned bits = static_cast<unsigned>(8 * e) - (signed_elems ? 1 : 0);
  return bits >= 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << bits) - 1;
}

// The pixel box [x1, x2) x [y1, y2) as a row of `fmt` (fractions of (w, h) when normalized).
void write_box(float* out, double x1, double y1, double x2, double y2, BoxFormat fmt,
               bool normalized, int w, int h) {
  const double sx = normalized ? 1.0 / w : 1.0, sy = normalized ? 1.0 / h : 1.0;
  double v[4] = {x1, y1, x2, y2};
  if (fmt == BoxFormat::kXYWH) v[2] = x2 - x1, v[3] = y2 - y1;
  if (fmt == BoxFormat::kCXCYWH)
    v[0] = (x1 + x2) / 2, v[1] = (y1 + y2) / 2, v[2] = x2 - x1, v[3] = y2 - y1;
  for (int k = 0; k < 4; ++k) out[k] = static_cast<float>(v[k] * (k % 2 ? sy : sx));
}

// A member's rows, checked against the boxes: n rows of `row` bytes.
const uint8_t* rows_of(const GroupMember& m, const MemberIO& in, size_t row, int64_t n,
                       const char* whose) {
  STOKER_CHECK(in.size == static_cast<size_t>(n) * row, DataError, "'", m.name, "' has ",
               in.size / row, " rows for ", n, " boxes", whose,
               ": the per-box fields of a group have one row per box");
  return in.data;
}

}  // namespace

void TransformGroup::check_copy_paste() {
  int masks = 0;
  for (size_t i = 0; i < spec_.members.size(); ++i) {
    if (spec_.members[i].kind == GroupMember::Kind::kMask)
      ++masks, paste_mask_ = static_cast<int>(i);
    if (spec_.members[i].kind == GroupMember::Kind::kBoxes) paste_boxes_ = static_cast<int>(i);
  }
  const std::string& first = spec_.members[0].name;
  STOKER_CHECK(image_ >= 0, UsageError, "CopyPaste pastes pixels: the group of '", first,
               "' needs an RGB image field");
  STOKER_CHECK(masks == 1, UsageError,
               "CopyPaste takes the objects from one instance mask (value k: the object of box "
               "k - 1): the group of '",
               first, "' has ", masks, " masks");
  STOKER_CHECK(paste_boxes_ >= 0, UsageError,
               "CopyPaste pastes objects with their boxes: the group of '", first,
               "' has no boxes field (stoker.boxes())");
}

// NOTE [ CopyPaste ]
// Simple copy-paste (Ghiasi et al. 2021) on an instance mask: value k (1..n)
// is the object of box k - 1 (of its per-box rows and keypoints), any other
// value background. The other sample (partners(), as a mosaic's) is
// letterboxed to this one's size as DetectionMixUp brings it; each of its
// objects is drawn (p, in box order) and pasted: the pixels its mask covers,
// on top of this sample, with its box, keypoints and rows moved by that
// letterbox. This sample's objects are counted over their mask: one covered
// over more than `occlusion` of its pixels is dropped (its rows too), one
// covered less keeps the enclosing box of what its mask still shows. The mask
// comes out renumbered so that value k is again box k - 1 (kept objects, then
// pasted ones; pasted objects that would not fit the mask's element are not
// pasted); later ops that drop boxes do not renumber it. Everything happens in
// this sample's frame, as one sample: its targets then follow the ops after
// CopyPaste through write_targets() like a group's single sample.
void TransformGroup::run_copy_paste(MemberIO* io, const MemberIO* const* others, uint64_t seed,
                                    int out_h, int out_w, int64_t* decode_ns) const {
  const ops::CopyPaste& cp = std::get<ops::CopyPaste>(spec_.ops[0]);
  const GroupMember& mm = spec_.members[paste_mask_];
  const GroupMember& bm = spec_.members[paste_boxes_];
  const MemberIO* other = others[0];
  static const char* const kDrawn = " (in a sample the CopyPaste drew)";
  detail::SplitMix64 rng(seed);
  // plain names, not a structured binding: the lambdas below capture them (which
  // clang before 16 refuses for bindings)
  const std::pair<int, int> size0 = input_size(io);
  const int w0 = size0.first, h0 = size0.second;
  MaskScratch& s = mask_scratch();
  const size_t e = static_cast<size_t>(mm.encoded ? 1 : mm.elem_bytes);
  const bool sgn = !mm.encoded && mm.signed_elems;
  const Pixels m0 = mask_pixels(mm, io[paste_mask_], spec_.image.max_pixels, s.gray[0], s);
  STOKER_CHECK(m0.width == w0 && m0.height == h0, DataError, "mask '", mm.name, "' is ", m0.height,
               "x", m0.width, " but '", spec_.members[primary_].name, "' is ", h0, "x", w0,
               ": the fields of a group must have the same size");
  // The other sample on this one's canvas: pixels, mask, boxes.
  ops::Letterbox::Fit f;
  thread_local std::vector<uint8_t> pixels, m1buf, outbuf;
  const Geometry g1 = letterbox_other(other, w0, h0, &f, &pixels, decode_ns);
  m1buf.resize(static_cast<size_t>(w0) * h0 * e);
  const Pixels m1 = packed_pixels(m1buf.data(), w0, h0, static_cast<int>(e));
  {
    const Pixels src = mask_pixels(mm, other[paste_mask_], spec_.image.max_pixels, s.gray[1], s);
    STOKER_CHECK(src.width == g1.in_width() && src.height == g1.in_height(), DataError, "mask '",
                 mm.name, "' is ", src.height, "x", src.width, " but '",
                 spec_.members[primary_].name, "' is ", g1.in_height(), "x", g1.in_width(),
                 ": the fields of a group must have the same size", kDrawn);
    const uint8_t zero[8] = {};
    warp_nearest_elements(src, m1, g1.box_map().inverse(), zero);
  }
  for (const MemberIO* in : {static_cast<const MemberIO*>(io), other})
    STOKER_CHECK(in[paste_boxes_].size % 16 == 0, DataError, "boxes '", bm.name,
                 "': ", in[paste_boxes_].size, " bytes is not a whole number of boxes");
  const int64_t n0 = static_cast<int64_t>(io[paste_boxes_].size / 16);
  const int64_t n1 = static_cast<int64_t>(other[paste_boxes_].size / 16);
  thread_local std::vector<float> boxes1;
  thread_local std::vector<uint8_t> paste;
  boxes1.resize(static_cast<size_t>(4 * n1));
  paste.resize(static_cast<size_t>(n1));
  if (n1) std::memcpy(boxes1.data(), other[paste_boxes_].data, static_cast<size_t>(n1) * 16);
  transform_boxes(boxes1.data(), n1, bm.format, bm.normalized, g1, BoxFilter{}, paste.data());
  // The draws: one per object of the other, in order (then the ops after).
  for (int64_t j = 0; j < n1; ++j) paste[j] = (rng.uniform(0, 1) < cp.p) & paste[j];
  // Objects shown, and so pasted: at most as many as the mask's element can number.
  thread_local std::vector<int64_t> shown1, area0, covered0, new_id;
  thread_local std::vector<double> bbox;  // per object of this sample: what its mask still shows
  shown1.assign(static_cast<size_t>(n1), 0);
  const size_t npx = static_cast<size_t>(w0) * h0;
  for (size_t i = 0; i < npx; ++i)
    if (const uint64_t id = id_at(m1.data + i * e, e, sgn); id >= 1 && id <= uint64_t(n1))
      shown1[id - 1] += paste[id - 1];
  const uint64_t room = max_id(e, sgn) > uint64_t(n0) ? max_id(e, sgn) - n0 : 0;
  uint64_t n_pasted = 0;
  for (int64_t j = 0; j < n1; ++j) {
    paste[j] = paste[j] && shown1[j] > 0 && n_pasted < room;
    n_pasted += paste[j];
  }
  auto pasted_id = [&](size_t i) -> uint64_t {  // the other's object at pixel i, pasted, or 0
    const uint64_t id = id_at(m1.data + i * e, e, sgn);
    return id >= 1 && id <= uint64_t(n1) && paste[id - 1] ? id : 0;
  };
  area0.assign(static_cast<size_t>(n0), 0);
  covered0.assign(static_cast<size_t>(n0), 0);
  for (size_t i = 0; i < npx; ++i)
    if (const uint64_t id = id_at(m0.row(0) + i * e, e, sgn); id >= 1 && id <= uint64_t(n0)) {
      ++area0[id - 1];
      covered0[id - 1] += pasted_id(i) != 0;
    }
  // New numbers: this sample's kept objects, then the pasted ones.
  new_id.assign(static_cast<size_t>(n0 + n1), 0);
  int64_t next = 1;
  for (int64_t k = 0; k < n0; ++k)
    if (!(area0[k] > 0 && covered0[k] > cp.occlusion * area0[k])) new_id[k] = next++;
  const int64_t kept = next - 1;
  for (int64_t j = 0; j < n1; ++j)
    if (paste[j]) new_id[n0 + j] = next++;
  // The mask, and the boxes of what this sample's covered objects still show.
  outbuf.resize(npx * e);
  bbox.assign(static_cast<size_t>(4 * n0), 0);
  for (int64_t k = 0; k < n0; ++k) bbox[4 * k] = w0, bbox[4 * k + 1] = h0;
  for (int y = 0; y < h0; ++y)
    for (int x = 0; x < w0; ++x) {
      const size_t i = static_cast<size_t>(y) * w0 + x;
      uint64_t v = 0;
      if (const uint64_t id1 = pasted_id(i)) {
        v = new_id[n0 + id1 - 1];
      } else if (const uint64_t id0 = id_at(m0.row(0) + i * e, e, sgn);
                 id0 >= 1 && id0 <= uint64_t(n0) && new_id[id0 - 1]) {
        v = new_id[id0 - 1];
        double* b = &bbox[4 * (id0 - 1)];
        b[0] = std::min<double>(b[0], x), b[1] = std::min<double>(b[1], y);
        b[2] = std::max<double>(b[2], x + 1), b[3] = std::max<double>(b[3], y + 1);
      }
      std::memcpy(&outbuf[i * e], &v, e);
    }
  // This sample's kept rows, then the pasted ones: one sample's inputs.
  thread_local std::vector<std::vector<uint8_t>> rows;
  thread_local std::vector<MemberIO> synth;
  rows.resize(spec_.members.size());
  synth.assign(io, io + spec_.members.size());
  for (size_t m = 0; m < spec_.members.size(); ++m) {
    const GroupMember& gm = spec_.members[m];
    const bool is_boxes = gm.kind == GroupMember::Kind::kBoxes;
    if (!is_boxes && gm.kind != GroupMember::Kind::kKeypoints &&
        gm.kind != GroupMember::Kind::kRows)
      continue;
    const size_t row = is_boxes ? 16
                       : gm.kind == GroupMember::Kind::kKeypoints
                           ? static_cast<size_t>(gm.num_keypoints) * 12
                           : gm.row_bytes;
    const uint8_t* r0 = rows_of(gm, io[m], row, n0, "");
    const uint8_t* r1 = is_boxes ? reinterpret_cast<const uint8_t*>(boxes1.data())
                                 : rows_of(gm, other[m], row, n1, kDrawn);
    std::vector<uint8_t>& out = rows[m];
    out.resize(static_cast<size_t>(n0 + n1) * row);
    size_t at = 0;
    for (int64_t k = 0; k < n0; ++k, at += row) {
      if (!new_id[k]) {
        at -= row;
        continue;
      }
      std::memcpy(&out[at], r0 + k * row, row);
      const double* b = &bbox[4 * k];
      if (is_boxes && covered0[k] > 0 && b[2] > b[0])
        write_box(reinterpret_cast<float*>(&out[at]), b[0], b[1], b[2], b[3], bm.format,
                  bm.normalized, w0, h0);
    }
    const size_t first_pasted = at;
    for (int64_t j = 0; j < n1; ++j)
      if (paste[j]) {
        std::memcpy(&out[at], r1 + j * row, row);
        at += row;
      }
    if (gm.kind == GroupMember::Kind::kKeypoints)
      transform_keypoints(reinterpret_cast<float*>(&out[first_pasted]),
                          static_cast<int64_t>(n_pasted), gm.num_keypoints, gm.normalized, g1,
                          nullptr);
    synth[m].data = out.data();
    synth[m].size = at;
  }
  // The pixels of the pasted objects, then the ops after CopyPaste.
  const Geometry rest = run_rest(
      io, rng,
      [&](const Pixels& p) {
        for (int y = 0; y < h0; ++y)
          for (int x = 0; x < w0; ++x) {
            const size_t i = static_cast<size_t>(y) * w0 + x;
            uint64_t v = 0;
            std::memcpy(&v, &outbuf[i * e], e);
            const int ox = x - f.left, oy = y - f.top;
            if (v > uint64_t(kept) && ox >= 0 && oy >= 0 && ox < f.w && oy < f.h)
              std::memcpy(p.row(y) + x * 3, &pixels[(static_cast<size_t>(oy) * f.w + ox) * 3], 3);
          }
      },
      out_h, out_w, decode_ns);
  const MemberIO* inputs[1] = {synth.data()};
  write_targets(io, inputs, &rest, 1, packed_pixels(outbuf.data(), w0, h0, static_cast<int>(e)),
                paste_mask_, out_h, out_w, decode_ns);
}

}  // namespace stoker
