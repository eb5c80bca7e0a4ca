// DetectionMixUp (mixing_ops.h): its checks, and the transform group's run of
// it (NOTE [ DetectionMixUp ]).
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <variant>
#include <vector>

#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/detail/op_checks.h"
#include "geometry/detail/random_draws.h"
#include "geometry/detail/rng.h"
#include "geometry/group_masks.h"
#include "geometry/image_ops.h"
#include "geometry/op_context.h"
#include "geometry/transform_group.h"

namespace stoker {

namespace ops {

void DetectionMixUp::check() const {
  STOKER_CHECK(std::isfinite(alpha) && alpha > 0, UsageError, kName,
               ": alpha must be a number > 0 (Beta(alpha, alpha)), got ", alpha);
  STOKER_CHECK(p >= 0 && p <= 1, UsageError, kName, ": p must be ", kInUnit, ", got ", p);
  check_fill(kName, fill, 0);
}

void DetectionMixUp::apply(OpContext&) const {
  STOKER_THROW(UsageError, kName,
               " reads another sample: it runs first in a transform group (or alone on an "
               "image field), not in an op list of its own");
}

}  // namespace ops

namespace {

// Adds a canvas's codec time to the caller's count on every exit, errors included.
struct DecodeReport {
  const CanvasOps& ops;
  int64_t* to;
  ~DecodeReport() {
    if (to) *to += ops.decode_ns;
  }
};

// dst = trunc(other + (dst - other) * r) per channel, `other` being the
// letterboxed sample: its (f.w x f.h) pixels at (f.left, f.top), `fill`
// around them. The form keeps a colour the two share exactly (ultralytics'
// img * r + img2 * (1 - r) in float64 can land a hair below it).
void blend(const Pixels& dst, const uint8_t* other, const ops::Letterbox::Fit& f, const Fill& fill,
           double r) {
  const float rf = static_cast<float>(r);
  auto mix = [rf](uint8_t a, uint8_t b) {
    return static_cast<uint8_t>(static_cast<float>(b) + (static_cast<float>(a) - b) * rf);
  };
  for (int y = 0; y < dst.height; ++y) {
    uint8_t* row = dst.row(y);
    const bool inside_rows = y >= f.top && y < f.top + f.h;
    const uint8_t* src = inside_rows ? other + static_cast<size_t>(y - f.top) * f.w * 3 : nullptr;
    for (int x = 0; x < dst.width; ++x) {
      uint8_t* px = row + static_cast<size_t>(x) * 3;
      const bool inside = inside_rows && x >= f.left && x < f.left + f.w;
      const uint8_t* b = inside ? src + static_cast<size_t>(x - f.left) * 3 : fill.v;
      for (int c = 0; c < 3; ++c) px[c] = mix(px[c], b[c]);
    }
  }
}

}  // namespace

// NOTE [ DetectionMixUp ]
// YOLO's MixUp as ultralytics makes it (img * r + img2 * (1 - r), r ~
// Beta(32, 32), the labels of both), for a sample and another drawn by its
// own seed (partners(), as a mosaic's). ultralytics mixes two images of the
// same size (both out of its mosaic and affine); here the other is brought to
// this one's size by ultralytics' LetterBox (fit, centred, `fill` around it),
// and its targets follow that letterbox: its geometry is the resize and the
// window of the letterbox, then the ops after the mix; this sample's is those
// ops alone. The draws, in order: whether to mix (p), r, then the ops after
// it; the partner is read whether or not the sample mixes (it is drawn before
// the ops run), and its rows count in the batch's padding either way.
void TransformGroup::run_mixup(MemberIO* io, const MemberIO* const* others, uint64_t seed,
                               int out_h, int out_w, int64_t* decode_ns) const {
  using Clock = std::chrono::steady_clock;
  const ops::DetectionMixUp& m = std::get<ops::DetectionMixUp>(spec_.ops[0]);
  detail::SplitMix64 rng(seed);
  const bool mix = rng.uniform(0, 1) < m.p;
  const double r = detail::beta(rng, m.alpha, m.alpha);
  const MemberIO* inputs[2] = {io, others[0]};
  const auto [w0, h0] = input_size(io);
  Geometry geos[2] = {Geometry(w0, h0), Geometry()};
  ops::Letterbox box;
  box.h = h0;
  box.w = w0;
  ops::Letterbox::Fit f;
  thread_local std::vector<uint8_t> other;  // the other sample, resized to fit
  if (mix) {
    try {
      const auto [w1, h1] = input_size(others[0]);
      f = box.fit(w1, h1);
      geos[1] = Geometry(w1, h1);
      geos[1].resize(f.w, f.h);
      geos[1].crop(-f.left, -f.top, w0, h0);
      if (pipeline_) {
        const MemberIO& in = others[0][image_];
        CanvasOps ops(thread_scratch(), in.data, in.size);
        const DecodeReport report{ops, decode_ns};
        Canvas c;
        ops.open(spec_.image.max_pixels, c);
        detail::SplitMix64 none(0);
        OpContext ctx(ops, c, none);
        ctx.resize(f.w, f.h);
        const Pixels p = ctx.pixels();
        other.resize(static_cast<size_t>(f.w) * f.h * 3);
        for (int y = 0; y < f.h; ++y)
          std::memcpy(&other[static_cast<size_t>(y) * f.w * 3], p.row(y),
                      static_cast<size_t>(f.w) * 3);
      }
    } catch (const std::exception& e) {
      // The partner's error names it (the caller adds the sample's file and record).
      STOKER_THROW(DecodeError, "the ", m.kName,
                   "'s other sample (another record, drawn by this one): ", e.what());
    }
  }
  Geometry rest;
  Pixels primary_mask;
  if (pipeline_) {
    const MemberIO& in = io[image_];
    CanvasOps ops(thread_scratch(), in.data, in.size, in.cache);
    const DecodeReport report{ops, decode_ns};
    Canvas c;
    ops.open(spec_.image.max_pixels, c);
    if (mix) {
      detail::SplitMix64 none(0);
      OpContext ctx(ops, c, none);
      blend(ctx.pixels(), other.data(), f, ops::fill_of(m.fill), r);
    }
    pipeline_->run_from(1, ops, c, rng, in.out, out_h, out_w, &rest);
  } else {
    if (!mix) {  // write_targets takes the first mask decoded (the one-sample path's rule)
      const auto t0 = Clock::now();
      MaskScratch& s = mask_scratch();
      primary_mask =
          mask_pixels(spec_.members[primary_], io[primary_], spec_.image.max_pixels, s.gray[0], s);
      if (decode_ns)
        *decode_ns +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    }
    OpContext ctx(w0, h0, rng);
    for (size_t i = 1; i < spec_.ops.size(); ++i)
      std::visit([&](const auto& o) { o.apply(ctx); }, spec_.ops[i]);
    rest = ctx.geometry();
    if (rest.width() != out_w || rest.height() != out_h)
      STOKER_THROW(DecodeError, "mask '", spec_.members[primary_].name, "' comes out ",
                   rest.height(), "x", rest.width(), " but the batch expects ", out_h, "x", out_w);
  }
  for (int k = 0; k < (mix ? 2 : 1); ++k) geos[k].append(rest);
  write_targets(io, inputs, geos, mix ? 2 : 1, primary_mask, out_h, out_w, decode_ns);
}

}  // namespace stoker
