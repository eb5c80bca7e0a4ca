// DetectionMixUp (mixing_ops.h): its checks, and the transform group's run of
// it (NOTE [ DetectionMixUp ]).
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <variant>
#include <vector>

#include "common/error.h"
#include "geometry/canvas.h"
#include "geometry/detail/op_checks.h"
#include "geometry/detail/random_draws.h"
#include "geometry/detail/rng.h"
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
  const ops::DetectionMixUp& m = std::get<ops::DetectionMixUp>(spec_.ops[0]);
  detail::SplitMix64 rng(seed);
  const bool mix = rng.uniform(0, 1) < m.p;
  const double r = detail::beta(rng, m.alpha, m.alpha);
  const MemberIO* inputs[2] = {io, others[0]};
  const auto [w0, h0] = input_size(io);
  Geometry geos[2] = {Geometry(w0, h0), Geometry()};
  ops::Letterbox::Fit f;
  thread_local std::vector<uint8_t> other;  // the other sample, resized to fit
  if (mix) geos[1] = letterbox_other(others[0], w0, h0, &f, &other, decode_ns);
  const Fill fill = ops::fill_of(m.fill);
  const Geometry rest = run_rest(io, rng,
                                 mix ? [&](const Pixels& p) { blend(p, other.data(), f, fill, r); }
                                     : std::function<void(const Pixels&)>(),
                                 out_h, out_w, decode_ns);
  for (int k = 0; k < (mix ? 2 : 1); ++k) geos[k].append(rest);
  write_targets(io, inputs, geos, mix ? 2 : 1, Pixels{}, -1, out_h, out_w, decode_ns);
}

Geometry TransformGroup::letterbox_other(const MemberIO* other, int w0, int h0,
                                         ops::Letterbox::Fit* f, std::vector<uint8_t>* pixels,
                                         int64_t* decode_ns) const {
  try {
    const auto [w1, h1] = input_size(other);
    ops::Letterbox box;
    box.h = h0;
    box.w = w0;
    *f = box.fit(w1, h1);
    Geometry g(w1, h1);
    g.resize(f->w, f->h);
    g.crop(-f->left, -f->top, w0, h0);
    if (pipeline_ && pixels) {
      const MemberIO& in = other[image_];
      CanvasOps ops(thread_scratch(), in.data, in.size);
      const DecodeReport report{ops, decode_ns};
      Canvas c;
      ops.open(spec_.image.max_pixels, c);
      detail::SplitMix64 none(0);
      OpContext ctx(ops, c, none);
      ctx.resize(f->w, f->h);
      const Pixels p = ctx.pixels();
      pixels->resize(static_cast<size_t>(f->w) * f->h * 3);
      for (int y = 0; y < f->h; ++y)
        std::memcpy(&(*pixels)[static_cast<size_t>(y) * f->w * 3], p.row(y),
                    static_cast<size_t>(f->w) * 3);
    }
    return g;
  } catch (const std::exception& e) {
    // The partner's error names it (the caller adds the sample's file and record).
    STOKER_THROW(DecodeError, "the ", op_name(spec_.ops[0]),
                 "'s other sample (another record, drawn by this one): ", e.what());
  }
}

Geometry TransformGroup::run_rest(MemberIO* io, detail::SplitMix64& rng,
                                  const std::function<void(const Pixels&)>& paint, int out_h,
                                  int out_w, int64_t* decode_ns) const {
  Geometry rest;
  if (pipeline_) {
    const MemberIO& in = io[image_];
    CanvasOps ops(thread_scratch(), in.data, in.size, in.cache);
    const DecodeReport report{ops, decode_ns};
    Canvas c;
    ops.open(spec_.image.max_pixels, c);
    if (paint) {
      detail::SplitMix64 none(0);
      OpContext ctx(ops, c, none);
      paint(ctx.pixels());
    }
    pipeline_->run_from(1, ops, c, rng, in.out, out_h, out_w, &rest);
    return rest;
  }
  const auto [w0, h0] = input_size(io);
  OpContext ctx(w0, h0, rng);
  for (size_t i = 1; i < spec_.ops.size(); ++i)
    std::visit([&](const auto& o) { o.apply(ctx); }, spec_.ops[i]);
  rest = ctx.geometry();
  if (rest.width() != out_w || rest.height() != out_h)
    STOKER_THROW(DecodeError, "mask '", spec_.members[primary_].name, "' comes out ", rest.height(),
                 "x", rest.width(), " but the batch expects ", out_h, "x", out_w);
  return rest;
}

}  // namespace stoker
