#include "decode/augment_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "decode/canvas.h"
#include "decode/canvas_pixels.h"
#include "decode/codecs.h"
#include "decode/color_ops.h"
#include "decode/crop_params.h"
#include "decode/detail/random_draws.h"
#include "decode/detail/rng.h"
#include "decode/gaussian_blur.h"
#include "decode/hsv_jitter.h"
#include "decode/image_pipeline.h"
#include "decode/jpeg_decoder.h"
#include "decode/png_decoder.h"

namespace stoker {

// NOTE [ Transform groups ]
//
// transforms={("image", "mask", "boxes", "classes"): [...]} runs the ops once
// per sample with one random stream: each op draws its parameters from the
// primary image's current canvas (its size: a mask has the same), then
//
//   image     follows the op on the lazy canvas (or on pixels, once an op
//             needed them), colour ops included;
//   geometry  records the op's map: crop, resize, flip, pad, warp compose
//             into one (target_geometry.h);
//   masks     are resampled once at the end through that map, nearest-
//             neighbour (no label is ever blended), never recoloured;
//   boxes     are moved through it, clipped, filtered; their keep mask drops
//             the same rows of keypoints and of every other row field.
//
// Resampling a mask once through the composed map, instead of once per op,
// keeps it aligned with the image to a pixel where torchvision's per-op
// NEAREST (floor(i * in / out), no half-pixel offset) drifts by up to half a
// pixel per resize.

namespace {

// Per-thread buffers of the group path, beside the canvas's own (Scratch).
struct AugScratch {
  std::vector<uint8_t> mask_rgb;
  std::vector<uint8_t> mask;
  JpegDecoder jpeg;
  std::vector<uint8_t> keep;
  std::vector<ColorStep> steps;
};

AugScratch& aug_scratch() {
  thread_local AugScratch s;
  return s;
}

using Rng = detail::SplitMix64;

// The canvas as plain pixels (canvas_pixels.h), and the other buffer to resample into.
void flatten(CanvasOps& ops, Canvas& c, const Fill& fill, AugScratch&) {
  canvas_pixels(ops, c, fill);
}

Pixels pixels_of(const Canvas& c) {
  return {const_cast<uint8_t*>(c.pix.data), c.src_w, c.src_h, 3, c.pix.stride};
}

Pixels other_buffer(const Canvas& c, AugScratch&, int w, int h) { return canvas_spare(c, w, h); }

void adopt(Canvas& c, const Pixels& p) { adopt_pixels(c, p); }

bool is_zero(const Fill& f) { return f.v[0] == 0 && f.v[1] == 0 && f.v[2] == 0; }

// Applies one op to the image canvas and the geometry, drawing from rng.
struct Step {
  CanvasOps& ops;
  Canvas& c;
  TargetGeometry& geo;
  Rng& rng;
  AugScratch& a;
  std::vector<ColorStep>& pending;  // colour steps not yet run

  // Runs pending colour steps on the (flattened) pixels.
  void flush() {
    if (pending.empty()) return;
    flatten(ops, c, Fill{}, a);
    apply_color_steps(pixels_of(c), pending.data(), pending.size());
    pending.clear();
  }

  // The window r of the current canvas (may reach past it) becomes the canvas.
  void window(const PixelRect& r, PadMode mode, const std::optional<Fill>& fill) {
    const Fill f = fill.value_or(Fill{});
    const bool inside = r.x >= 0 && r.y >= 0 && r.x + r.w <= c.view.w && r.y + r.h <= c.view.h;
    if (inside || (mode == PadMode::kConstant && is_zero(f))) {
      CanvasOps::crop(c, r);  // lazy: zeros past the edges, as a CenterCrop's padding
    } else {
      flatten(ops, c, Fill{}, a);
      const Pixels out = other_buffer(c, a, r.w, r.h);
      copy_window(pixels_of(c), r.x, r.y, out, mode, f);
      adopt(c, out);
    }
    geo.crop(r.x, r.y, r.w, r.h);
  }

  // Resamples the canvas through `forward` onto (w x h).
  void warp(const Transform2D& forward, int w, int h, Interpolation interp,
            const std::optional<Fill>& fill) {
    flatten(ops, c, Fill{}, a);
    const Pixels out = other_buffer(c, a, w, h);
    warp_pixels(pixels_of(c), out, forward.inverse(), interp, fill ? &*fill : nullptr);
    adopt(c, out);
    geo.warp(forward, w, h);
  }

  void operator()(const ops::RandomResizedCrop& o) {
    flush();
    const PixelRect r = random_resized_crop_rect(c.view.w, c.view.h, o.scale_lo, o.scale_hi,
                                                 std::log(o.ratio_lo), std::log(o.ratio_hi), rng);
    CanvasOps::crop(c, r);
    geo.crop(r.x, r.y, r.w, r.h);
    ops.resize(c, o.w, o.h);
    geo.resize(o.w, o.h);
  }
  void operator()(const ops::Resize& o) {
    flush();
    const auto [h, w] = o.size_after({c.view.h, c.view.w});
    ops.resize(c, w, h);
    geo.resize(w, h);
  }
  void operator()(const ops::CenterCrop& o) {
    flush();
    const PixelRect r = center_crop_rect(c.view.w, c.view.h, o.w, o.h);
    CanvasOps::crop(c, r);
    geo.crop(r.x, r.y, r.w, r.h);
  }
  void operator()(const ops::RandomHorizontalFlip& o) {
    if (rng.uniform(0, 1) < o.p) {  // always drawn, as the classic path
      flush();
      c.flip = !c.flip;
      geo.hflip();
    }
  }
  void operator()(const ops::Normalize&) {}
  void operator()(const aug::RandomCrop& o) {
    flush();
    int pl = o.pad_left, pt = o.pad_top, pr = o.pad_right, pb = o.pad_bottom;
    int ph = c.view.h + pt + pb, pw = c.view.w + pl + pr;
    if (o.pad_if_needed) {  // torchvision pads both sides by the shortfall
      if (ph < o.h) {
        const int d = o.h - ph;
        pt += d, pb += d, ph += 2 * d;
      }
      if (pw < o.w) {
        const int d = o.w - pw;
        pl += d, pr += d, pw += 2 * d;
      }
    }
    if (ph < o.h || pw < o.w)
      STOKER_THROW(DataError, "RandomCrop: crop size ", o.h, "x", o.w, " is larger than the ",
                   pl || pt || pr || pb ? "padded " : "", "image (", ph, "x", pw,
                   "); pass pad_if_needed=True");
    const int top = ph > o.h ? static_cast<int>(rng.randint(0, ph - o.h)) : 0;
    const int left = pw > o.w ? static_cast<int>(rng.randint(0, pw - o.w)) : 0;
    window({left - pl, top - pt, o.w, o.h}, o.mode, o.fill.image);
  }
  void operator()(const aug::Pad& o) {
    flush();
    window({-o.left, -o.top, c.view.w + o.left + o.right, c.view.h + o.top + o.bottom}, o.mode,
           o.fill.image);
  }
  void operator()(const aug::Letterbox& o) {
    flush();
    const LetterboxFit f = letterbox_fit(o, c.view.w, c.view.h);
    ops.resize(c, f.w, f.h);
    geo.resize(f.w, f.h);
    window({-f.left, -f.top, o.w, o.h}, PadMode::kConstant, o.fill.image);
  }
  void operator()(const aug::VerticalFlip& o) {
    if (!(rng.uniform(0, 1) < o.p)) return;
    flush();
    flatten(ops, c, Fill{}, a);
    const Pixels p = pixels_of(c);
    std::vector<uint8_t>& tmp = a.mask_rgb;  // free until the masks
    tmp.resize(p.row_bytes());
    for (int i = 0, j = p.height - 1; i < j; ++i, --j) {
      std::memcpy(tmp.data(), p.row(i), p.row_bytes());
      std::memcpy(p.row(i), p.row(j), p.row_bytes());
      std::memcpy(p.row(j), tmp.data(), p.row_bytes());
    }
    geo.vflip();
  }
  void operator()(const aug::RandomRotation& o) {
    const double angle = rng.uniform(o.lo, o.hi);
    flush();
    const int w = c.view.w, h = c.view.h;
    if (o.expand) {
      int ow, oh;
      rotated_canvas_size(angle, w, h, &ow, &oh);
      // About the centre of both canvases (F.rotate(expand=True)).
      const Transform2D fwd = Transform2D::translation(-0.5 * w, -0.5 * h)
                                  .then(Transform2D::affine(-angle, 0, 0, 1, 0, 0, {0, 0}))
                                  .then(Transform2D::translation(0.5 * ow, 0.5 * oh));
      warp(fwd, ow, oh, o.interpolation, o.fill.image);
      return;
    }
    const Point2 centre = o.center.value_or(Point2{0.5 * w, 0.5 * h});
    warp(Transform2D::affine(-angle, 0, 0, 1, 0, 0, centre), w, h, o.interpolation, o.fill.image);
  }
  void operator()(const aug::RandomAffine& o) {
    const int w = c.view.w, h = c.view.h;
    const double angle = rng.uniform(o.deg_lo, o.deg_hi);
    double tx = 0, ty = 0, scale = 1, shx = 0, shy = 0;
    if (o.translate) {
      const double mx = (*o.translate)[0] * w, my = (*o.translate)[1] * h;
      tx = std::nearbyint(rng.uniform(-mx, mx));  // Python's round(): half to even
      ty = std::nearbyint(rng.uniform(-my, my));
    }
    if (o.scale) scale = rng.uniform((*o.scale)[0], (*o.scale)[1]);
    if (o.shear) {
      shx = rng.uniform((*o.shear)[0], (*o.shear)[1]);
      if ((*o.shear)[2] != 0 || (*o.shear)[3] != 0) shy = rng.uniform((*o.shear)[2], (*o.shear)[3]);
    }
    flush();
    const Point2 centre = o.center.value_or(Point2{0.5 * w, 0.5 * h});
    warp(Transform2D::affine(angle, tx, ty, scale, shx, shy, centre), w, h, o.interpolation,
         o.fill.image);
  }
  void operator()(const aug::RandomPerspective& o) {
    if (!(rng.uniform(0, 1) < o.p)) return;
    const int w = c.view.w, h = c.view.h;
    const int hh = h / 2, hw = w / 2;
    const int bh = static_cast<int>(o.distortion * hh) + 1,
              bw = static_cast<int>(o.distortion * hw) + 1;
    auto ri = [&](int lo, int hi) { return static_cast<double>(rng.randint(lo, hi - 1)); };
    const std::array<Point2, 4> end = {
        Point2{ri(0, bw), ri(0, bh)}, Point2{ri(w - bw, w), ri(0, bh)},
        Point2{ri(w - bw, w), ri(h - bh, h)}, Point2{ri(0, bw), ri(h - bh, h)}};
    const std::array<Point2, 4> start = {Point2{0, 0}, Point2{w - 1.0, 0}, Point2{w - 1.0, h - 1.0},
                                         Point2{0, h - 1.0}};
    flush();
    warp(Transform2D::from_perspective_coeffs(perspective_coeffs(start, end)), w, h,
         o.interpolation, o.fill.image);
  }
  void operator()(const aug::ColorJitter& o) {
    // torch.randperm(4), then each factor (drawn whether or not set, so that
    // the stream does not depend on which are)
    int order[4] = {0, 1, 2, 3};
    for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.randint(0, i)]);
    const std::optional<std::array<double, 2>>* ranges[4] = {&o.brightness, &o.contrast,
                                                             &o.saturation, &o.hue};
    const ColorKind kinds[4] = {ColorKind::kBrightness, ColorKind::kContrast,
                                ColorKind::kSaturation, ColorKind::kHue};
    double factor[4];
    for (int k = 0; k < 4; ++k) {
      const double u = rng.uniform(0, 1);
      if (*ranges[k]) factor[k] = (**ranges[k])[0] + ((**ranges[k])[1] - (**ranges[k])[0]) * u;
    }
    for (int k : order)
      if (*ranges[k]) pending.push_back({kinds[k], factor[k]});
  }
  void operator()(const aug::RandomGrayscale& o) {
    if (rng.uniform(0, 1) < o.p) pending.push_back({ColorKind::kGrayscale, 0});
  }
  void operator()(const aug::HsvJitter& o) {
    const HsvGains g = draw_hsv_gains(o.h, o.s, o.v, rng);
    flush();
    flatten(ops, c, Fill{}, a);
    apply_hsv_gains(pixels_of(c), g);
  }
  void operator()(const aug::GaussianBlur& o) {
    const double sigma = rng.uniform(o.sigma_lo, o.sigma_hi);
    flush();
    flatten(ops, c, Fill{}, a);
    gaussian_blur(pixels_of(c), o.kx, o.ky, static_cast<float>(sigma), static_cast<float>(sigma));
  }
  void operator()(const aug::AutoAugment& o) {
    flush();
    flatten(ops, c, Fill{}, a);
    AugOp drawn[kMaxAugOps];
    const Pixels p = pixels_of(c);
    const int n = draw_auto_augment(o.params, p.width, p.height, rng, drawn);
    apply_aug_ops(p, drawn, n, o.params);
  }
  void operator()(const aug::RandomErasing&) {}  // on the output, after the write
};

bool is_target(GroupMember::Kind k) { return k != GroupMember::Kind::kImage; }

// The mask fill of a group (the ops must agree), and whether any op pads with
// a mode other than constant.
struct FillUse {
  std::optional<uint8_t> mask;
  bool non_constant = false;
  const char* non_constant_op = nullptr;
};

FillUse fill_use(const std::vector<AugmentOp>& ops) {
  FillUse u;
  auto take = [&](const aug::FillSpec& f, const char* name) {
    STOKER_CHECK(!u.mask || *u.mask == f.mask, UsageError,
                 "the ops of a group fill masks with different values (", int(*u.mask), " and ",
                 int(f.mask), " in ", name, "): give them the same mask fill");
    u.mask = f.mask;
  };
  for (const AugmentOp& op : ops) {
    const char* name = augment_op_name(op);
    if (const auto* c = std::get_if<aug::RandomCrop>(&op)) {
      take(c->fill, name);
      if (c->mode != PadMode::kConstant) u.non_constant = true, u.non_constant_op = name;
    } else if (const auto* p = std::get_if<aug::Pad>(&op)) {
      take(p->fill, name);
      if (p->mode != PadMode::kConstant) u.non_constant = true, u.non_constant_op = name;
    } else if (const auto* l = std::get_if<aug::Letterbox>(&op)) {
      take(l->fill, name);
    } else if (const auto* r = std::get_if<aug::RandomRotation>(&op)) {
      take(r->fill, name);
    } else if (const auto* a = std::get_if<aug::RandomAffine>(&op)) {
      take(a->fill, name);
    } else if (const auto* q = std::get_if<aug::RandomPerspective>(&op)) {
      take(q->fill, name);
    }
  }
  return u;
}

// Decodes a mask to one channel (the first of its RGB decode: a grayscale PNG
// or JPEG gives its values). A palette PNG would give colours, not class ids.
Pixels decode_mask(const GroupMember& m, const MemberIO& io, int64_t max_pixels, AugScratch& a) {
  ImageInfo info;
  if (is_png(io.data, io.size)) {
    // colour type: byte 25 of the IHDR; 3 is a palette
    STOKER_CHECK(io.size < 26 || io.data[25] != 3, DataError, "mask '", m.name,
                 "' is a palette PNG: its pixels would decode to colours, not class ids; store "
                 "masks as grayscale PNGs (PIL mode 'L')");
    info = png_decode(io.data, io.size, max_pixels, a.mask_rgb);
  } else if (is_jpeg(io.data, io.size)) {
    info = a.jpeg.open(io.data, io.size, max_pixels);
    a.mask_rgb.resize(static_cast<size_t>(info.width) * info.height * 3);
    a.jpeg.decode_full(a.mask_rgb.data(), static_cast<size_t>(info.width) * 3);
  } else {
    not_an_image(io.data, io.size);
  }
  const size_t n = static_cast<size_t>(info.width) * info.height;
  a.mask.resize(n);
  for (size_t i = 0; i < n; ++i) a.mask[i] = a.mask_rgb[3 * i];
  return packed_pixels(a.mask.data(), info.width, info.height, 1);
}

}  // namespace

AugmentPipeline::AugmentPipeline(GroupSpec spec) : spec_(std::move(spec)) {
  require_image_codecs();
  check_augment_ops(spec_.ops);
  STOKER_CHECK(spec_.max_pixels > 0, UsageError, "max_pixels must be positive");
  size_t images = 0;
  bool targets = false;
  size_t boxes = 0;
  for (size_t i = 0; i < spec_.members.size(); ++i) {
    const GroupMember& m = spec_.members[i];
    if (m.kind == GroupMember::Kind::kImage) {
      image_ = i;
      ++images;
    }
    targets = targets || is_target(m.kind);
    boxes += m.kind == GroupMember::Kind::kBoxes;
    if (m.kind == GroupMember::Kind::kKeypoints) {
      STOKER_CHECK(m.num_keypoints > 0, UsageError, "keypoints '", m.name, "': k must be > 0");
      if (!m.flip_perm.empty()) {
        STOKER_CHECK(static_cast<int>(m.flip_perm.size()) == m.num_keypoints, UsageError,
                     "keypoints '", m.name, "': flip_pairs must name keypoints of 0..",
                     m.num_keypoints - 1);
        for (int32_t j : m.flip_perm)
          STOKER_CHECK(j >= 0 && j < m.num_keypoints, UsageError, "keypoints '", m.name,
                       "': flip_pairs names keypoint ", j, " of ", m.num_keypoints);
      }
    }
  }
  STOKER_CHECK(images == 1, UsageError, "a transform group needs exactly one RGB image field, got ",
               images);
  STOKER_CHECK(boxes <= 1, UsageError, "a transform group takes one boxes field, got ", boxes);
  const FillUse fills = fill_use(spec_.ops);
  for (const AugmentOp& op : spec_.ops) {
    if (targets && std::holds_alternative<aug::AutoAugment>(op))
      STOKER_THROW(UsageError, augment_op_name(op),
                   " cannot move masks, boxes or keypoints (nor does torchvision's): put it in "
                   "the image's own transforms, without targets");
    if (const auto* n = std::get_if<ops::Normalize>(&op)) norm_ = n;
  }
  if (targets && fills.non_constant)
    STOKER_THROW(UsageError, fills.non_constant_op,
                 ": a padding_mode other than 'constant' cannot move masks, boxes or keypoints "
                 "(torchvision refuses it for boxes too)");
  out_dtype_ = norm_ ? norm_->dtype : DType::kUInt8;
  std::optional<std::pair<int, int>> fixed;
  for (const AugmentOp& op : spec_.ops) {
    if (auto f = augment_fixed_size(op))
      fixed = f;
    else if (fixed)
      fixed = augment_size_after(op, *fixed);  // nullopt after Resize(int) or expand=True
    if (const auto* r = std::get_if<ops::Resize>(&op); r && r->shorter > 0) fixed.reset();
  }
  fixed_ = fixed;
}

std::pair<int, int> AugmentPipeline::output_size(const uint8_t* data, size_t n) const {
  if (fixed_) return *fixed_;
  const ImageInfo info = probe_image(data, n);
  check_declared(info, spec_.max_pixels);
  std::pair<int, int> hw{info.height, info.width};
  for (const AugmentOp& op : spec_.ops) {
    const auto next = augment_size_after(op, hw);
    STOKER_CHECK(next, UsageError, "the output size of ", augment_op_name(op), " is random");
    hw = *next;
  }
  return hw;
}

void AugmentPipeline::run(MemberIO* io, uint64_t seed, int out_h, int out_w,
                          int64_t* decode_ns) const {
  Scratch& s = thread_scratch();
  AugScratch& a = aug_scratch();
  const GroupMember& im = spec_.members[image_];
  CanvasOps ops(s, io[image_].data, io[image_].size);
  struct Report {
    const CanvasOps& ops;
    int64_t* to;
    ~Report() {
      if (to) *to += ops.decode_ns;
    }
  } report{ops, decode_ns};
  Canvas c;
  ops.open(spec_.max_pixels, c);
  TargetGeometry geo(c.src_w, c.src_h);
  Rng rng(seed);
  a.steps.clear();
  Step step{ops, c, geo, rng, a, a.steps};
  size_t i = 0;
  for (; i < spec_.ops.size(); ++i) {
    if (std::holds_alternative<aug::RandomErasing>(spec_.ops[i])) break;
    std::visit(step, spec_.ops[i]);
  }
  if (c.view.w != out_w || c.view.h != out_h)
    STOKER_THROW(DecodeError, "image '", im.name, "' comes out ", c.view.h, "x", c.view.w,
                 " but the batch expects ", out_h, "x", out_w);
  // The write: the classic fast paths when no colour step is left to run.
  const bool u8_hwc = out_dtype_ == DType::kUInt8 && spec_.layout == ImageLayout::kHWC;
  void* out = io[image_].out;
  if (!a.steps.empty()) step.flush();
  if (!(u8_hwc && (ops.try_resize_into(c, static_cast<uint8_t*>(out)) ||
                   ops.try_decode_into(c, static_cast<uint8_t*>(out))))) {
    ops.ensure_pixels(c);
    write_pixels(c, out, out_h, out_w, spec_.layout, out_dtype_, norm_, s);
  }
  for (; i < spec_.ops.size(); ++i) {  // RandomErasing, on the output
    const auto& e = std::get<aug::RandomErasing>(spec_.ops[i]);
    const auto r = draw_erasing(e.params, out_w, out_h, rng);
    if (r)
      erase_rect(out, out_dtype_, spec_.layout == ImageLayout::kCHW, out_h, out_w, 3, *r,
                 e.random_value ? nullptr : e.value, &rng);
  }

  // Targets.
  const FillUse fills = fill_use(spec_.ops);
  const Fill mask_fill{{fills.mask.value_or(0), 0, 0}};
  const GroupMember* boxes = nullptr;
  int64_t n_boxes = -1;
  for (size_t k = 0; k < spec_.members.size(); ++k) {
    const GroupMember& m = spec_.members[k];
    MemberIO& mio = io[k];
    switch (m.kind) {
      case GroupMember::Kind::kImage:
        break;
      case GroupMember::Kind::kMask: {
        const auto t0 = std::chrono::steady_clock::now();
        const Pixels mask = decode_mask(m, mio, spec_.max_pixels, a);
        if (decode_ns)
          *decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
        if (mask.width != geo.in_width() || mask.height != geo.in_height())
          STOKER_THROW(DataError, "mask '", m.name, "' is ", mask.height, "x", mask.width,
                       " but image '", im.name, "' is ", geo.in_height(), "x", geo.in_width());
        const Pixels dst = packed_pixels(static_cast<uint8_t*>(mio.out), out_w, out_h, 1);
        if (!geo.moved() && mask.width == out_w && mask.height == out_h)
          std::memcpy(dst.data, mask.data, static_cast<size_t>(out_w) * out_h);
        else
          warp_pixels(mask, dst, geo.box_map().inverse(), Interpolation::kNearest, &mask_fill);
        break;
      }
      case GroupMember::Kind::kBoxes: {
        STOKER_CHECK(mio.size % 16 == 0, DataError, "boxes '", m.name, "': ", mio.size,
                     " bytes is not a whole number of boxes");
        const int64_t n = static_cast<int64_t>(mio.size / 16);
        std::memcpy(mio.out, mio.data, mio.size);
        a.keep.resize(n);
        transform_boxes(static_cast<float*>(mio.out), n, m.format, m.normalized, geo, spec_.filter,
                        a.keep.data());
        mio.out_rows = compact_rows(static_cast<uint8_t*>(mio.out), n, 16, a.keep.data());
        boxes = &m;
        n_boxes = n;
        break;
      }
      default:
        break;
    }
  }
  // Rows that follow the boxes (after them: the keep mask is known).
  for (size_t k = 0; k < spec_.members.size(); ++k) {
    const GroupMember& m = spec_.members[k];
    MemberIO& mio = io[k];
    if (m.kind != GroupMember::Kind::kKeypoints && m.kind != GroupMember::Kind::kRows) continue;
    const size_t row = m.kind == GroupMember::Kind::kKeypoints
                           ? static_cast<size_t>(m.num_keypoints) * 12
                           : m.row_bytes;
    STOKER_CHECK(row > 0 && mio.size % row == 0, DataError, "'", m.name, "': ", mio.size,
                 " bytes is not a whole number of rows of ", row);
    const int64_t n = static_cast<int64_t>(mio.size / row);
    if (boxes && n != n_boxes)
      STOKER_THROW(DataError, "'", m.name, "' has ", n, " rows but '", boxes->name, "' has ",
                   n_boxes, " boxes: the fields of a group drop rows together");
    std::memcpy(mio.out, mio.data, mio.size);
    if (m.kind == GroupMember::Kind::kKeypoints)
      transform_keypoints(static_cast<float*>(mio.out), n, m.num_keypoints, m.normalized, geo,
                          m.flip_perm.empty() ? nullptr : m.flip_perm.data());
    mio.out_rows = boxes ? compact_rows(static_cast<uint8_t*>(mio.out), n, row, a.keep.data()) : n;
  }
}

}  // namespace stoker
