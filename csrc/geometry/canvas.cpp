#include "geometry/canvas.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "codecs/png_decoder.h"
#include "common/activity.h"
#include "common/clock.h"
#include "common/error.h"

namespace stoker {

namespace {

PixelRect intersect(const PixelRect& r, int w, int h) {
  const int x0 = std::max(r.x, 0), y0 = std::max(r.y, 0);
  const int x1 = std::min(r.x + r.w, w), y1 = std::min(r.y + r.h, h);
  return {x0, y0, std::max(0, x1 - x0), std::max(0, y1 - y0)};
}

}  // namespace

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

[[noreturn]] void not_an_image(const uint8_t* data, size_t n) {
  char head[40] = "";
  for (size_t i = 0; i < std::min<size_t>(n, 4); ++i)
    std::snprintf(head + 2 * i, sizeof head - 2 * i, "%02x", data[i]);
  STOKER_THROW(DecodeError, "not a JPEG or PNG (", n, " bytes, starts with 0x", head, ")");
}

void check_declared(const ImageInfo& info, int64_t max_pixels) {
  if (info.width <= 0 || info.height <= 0)
    STOKER_THROW(DecodeError, "image declares an empty size (", info.width, "x", info.height, ")");
  const int64_t px = int64_t{info.width} * info.height;
  if (px > max_pixels)
    STOKER_THROW(DecodeError, "image declares ", info.width, "x", info.height, " = ", px,
                 " pixels, above the limit of ", max_pixels);
}

CanvasOps::Clock::time_point CanvasOps::begin_decode() const {
  set_activity(Activity::kDecoding);
  return Clock::now();
}

void CanvasOps::end_decode(Clock::time_point t0) {
  decode_ns += ns_between(t0, Clock::now());
  set_activity(Activity::kOps);
}

void CanvasOps::open(int64_t max_pixels, Canvas& c) {
  ImageInfo info;
  if (is_jpeg(data_, n_)) {
    info = s_.jpeg.open(data_, n_, max_pixels);
  } else if (is_png(data_, n_)) {
    const auto t0 = begin_decode();
    info = png_decode(data_, n_, max_pixels, s_.decoded);
    end_decode(t0);
    c.have_pixels = true;
    c.pix = {s_.decoded.data(), info.width, info.height, static_cast<size_t>(info.width) * 3};
  } else {
    not_an_image(data_, n_);
  }
  c.src_w = info.width;
  c.src_h = info.height;
  c.view = {0, 0, info.width, info.height};
}

void CanvasOps::crop(Canvas& c, const PixelRect& r) {
  const int x = c.flip ? c.view.x + c.view.w - r.x - r.w : c.view.x + r.x;
  c.view = {x, c.view.y + r.y, r.w, r.h};
}

void CanvasOps::resize(Canvas& c, int out_w, int out_h) {
  if (out_w == c.view.w && out_h == c.view.h) return;  // the triangle filter is the identity
  materialize(c);
  const PixelRect in = intersect(c.view, c.src_w, c.src_h);
  const bool past_edges = !(in == c.view);
  ResizeBox box;
  if (!c.have_pixels && !past_edges) {
    // The common path of RandomResizedCrop: decode only the crop, scaled down
    // by the DCT while it still covers the target.
    const int num = JpegDecoder::choose_scale(in.w, in.h, out_w, out_h);
    int ox = 0, oy = 0;
    const auto t0 = begin_decode();
    c.pix = s_.jpeg.decode_region(in, num, s_.decoded, &ox, &oy);
    end_decode(t0);
    c.have_pixels = true;
    const double f = num / 8.0;
    box = {in.x * f - ox, in.y * f - oy, in.w * f, in.h * f, 0, 0, c.pix.width, c.pix.height};
  } else {
    ensure_pixels(c);
    if (past_edges) {
      pad(c);
      box = whole_box(c.pix);
    } else {
      box = {double(c.view.x), double(c.view.y), double(c.view.w),    double(c.view.h),
             c.view.x,         c.view.y,         c.view.x + c.view.w, c.view.y + c.view.h};
    }
  }
  c.pending = true;
  c.pend_src = c.pix;
  c.pend_box = box;
  c.src_w = out_w;
  c.src_h = out_h;
  c.view = {0, 0, out_w, out_h};
}

void CanvasOps::materialize(Canvas& c) {
  if (!c.pending) return;
  std::vector<uint8_t>& dst = s_.bufs[next_];  // never pend_src: that is the other one
  next_ ^= 1;
  const size_t stride = static_cast<size_t>(c.src_w) * 3;
  dst.resize(stride * c.src_h);
  const bool whole = c.whole_view();
  run_pending(c, dst.data(), whole && c.flip);
  if (whole) c.flip = false;
  c.pix = {dst.data(), c.src_w, c.src_h, stride};
}

bool CanvasOps::try_resize_into(Canvas& c, uint8_t* out, size_t stride) {
  if (!c.pending || !c.whole_view()) return false;
  run_pending(c, out, c.flip, stride);
  return true;
}

void CanvasOps::run_pending(Canvas& c, uint8_t* out, bool mirror, size_t stride) {
  resize_rgb(c.pend_src, c.pend_box, out, stride ? stride : static_cast<size_t>(c.src_w) * 3,
             c.src_w, c.src_h, mirror);
  c.pending = false;
}

void CanvasOps::ensure_pixels(Canvas& c) {
  materialize(c);
  if (c.have_pixels) return;
  PixelRect in = intersect(c.view, c.src_w, c.src_h);
  if (in.w == 0 || in.h == 0) in = {0, 0, c.src_w, c.src_h};  // all padding: still validate
  int ox = 0, oy = 0;
  const auto t0 = begin_decode();
  c.pix = s_.jpeg.decode_region(in, 8, s_.decoded, &ox, &oy);
  end_decode(t0);
  c.have_pixels = true;
  // The source is now the decoded region; view coordinates follow it.
  c.view.x -= ox;
  c.view.y -= oy;
  c.src_w = c.pix.width;
  c.src_h = c.pix.height;
}

bool CanvasOps::try_decode_into(Canvas& c, uint8_t* out) {
  if (c.have_pixels || c.flip || !c.whole_view()) return false;
  const auto t0 = begin_decode();
  s_.jpeg.decode_full(out, static_cast<size_t>(c.src_w) * 3);
  end_decode(t0);
  return true;
}

// Copies the view into a zero-filled buffer of its size (torchvision pads
// with zeros before resizing, so the zeros are averaged in at the edges).
void CanvasOps::pad(Canvas& c) {
  const PixelRect in = intersect(c.view, c.src_w, c.src_h);
  const size_t stride = static_cast<size_t>(c.view.w) * 3;
  s_.padded.assign(stride * c.view.h, 0);
  for (int y = 0; y < in.h; ++y)
    std::memcpy(&s_.padded[(y + in.y - c.view.y) * stride + (in.x - c.view.x) * 3],
                c.pix.data + (in.y + y) * c.pix.stride + in.x * 3, in.w * 3);
  c.pix = {s_.padded.data(), c.view.w, c.view.h, stride};
  c.src_w = c.view.w;
  c.src_h = c.view.h;
  c.view = {0, 0, c.view.w, c.view.h};
}

}  // namespace stoker
