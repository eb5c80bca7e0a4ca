#include "geometry/canvas.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "codecs/png_decoder.h"
#include "codecs/raw_image.h"
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

// The cache's variant of a JPEG decoded at DCT scale num/8 (1, 2, 4, 8).
int scale_variant(int num) { return num == 1 ? 0 : num == 2 ? 1 : num == 4 ? 2 : 3; }

// Rows of `src` into packed rows at `dst`.
void copy_rows(const RgbView& src, uint8_t* dst, size_t stride) {
  for (int y = 0; y < src.height; ++y)
    std::memcpy(dst + static_cast<size_t>(y) * stride,
                src.data + static_cast<size_t>(y) * src.stride, static_cast<size_t>(src.width) * 3);
}

// The window of `img` (scaled by fx, fy from its original) that the original's
// `in` covers, and where `in` falls inside it, as the box of a resize.
RgbView window_of(const RgbView& img, double fx, double fy, const PixelRect& in, ResizeBox* box) {
  const int x0 = static_cast<int>(std::floor(in.x * fx));
  const int y0 = static_cast<int>(std::floor(in.y * fy));
  const int x1 = std::min(img.width, static_cast<int>(std::ceil((in.x + in.w) * fx)));
  const int y1 = std::min(img.height, static_cast<int>(std::ceil((in.y + in.h) * fy)));
  const RgbView v{img.data + static_cast<size_t>(y0) * img.stride + static_cast<size_t>(x0) * 3,
                  std::max(1, x1 - x0), std::max(1, y1 - y0), img.stride};
  *box = {in.x * fx - x0, in.y * fy - y0, in.w * fx, in.h * fy, 0, 0, v.width, v.height};
  return v;
}

// cache_max_side: the size of the reduced copy of a (w x h) image, its longer
// side `max_side` (the image's own size when it is no larger).
std::pair<int, int> reduced_size(int w, int h, int max_side) {
  const int longer = std::max(w, h);
  if (longer <= max_side) return {w, h};
  const double f = static_cast<double>(max_side) / longer;
  return {std::max(1, static_cast<int>(std::lround(w * f))),
          std::max(1, static_cast<int>(std::lround(h * f)))};
}

}  // namespace

// NOTE [ Exact pixels ]
// With cache="decoded" (no cache_max_side) a batch is bit-identical to the
// uncached loader's. The uncached path decodes a JPEG's crop alone, at the
// DCT scale num/8 that still covers the resize (decode_region), so the
// cache keeps one entry per scale an image was needed at: the whole image
// decoded at that scale (decode_scaled), of which every crop decode_region
// gives at the same scale is a window, value for value (libjpeg-turbo's
// region decode reads the same coefficients through the same IDCT and
// upsampling; tests/cpp/test_decode.cpp checks it on every sampling, on
// progressive, grayscale and CMYK files). A resize then reads that window
// with the same box. PNGs are always decoded whole, so theirs is one entry.
// Most images need one scale (8/8 for ImageNet-sized images at 224), some two.
//
// With cache_max_side the cache keeps one reduced copy of each image
// (reduced_size: DCT scaling to the smallest scale at least that large, then
// the antialiased resize), and the image's pixels always come from it, cached
// or made again when the cache is full: output is then the same whatever the
// cache holds, but not the uncached loader's. Crops and flips are drawn in
// the image's own coordinates as always (same draws, same geometry for boxes
// and masks, same output sizes); only the pixels are resampled from the copy.

bool CanvasOps::fits(const CachedImage& e, int variant, int full_w, int full_h) const {
  std::pair<int, int> want;
  if (reduced_mode())
    want = reduced_size(e.full_w, e.full_h, cache_.cache->options().max_side);
  else if (variant >= 0 && variant < 4)
    want = {JpegDecoder::scaled_size(e.full_w, 1 << variant),
            JpegDecoder::scaled_size(e.full_h, 1 << variant)};
  const bool ok = e.pix.width == want.first && e.pix.height == want.second &&
                  (full_w == 0 || (e.full_w == full_w && e.full_h == full_h));
  if (!ok) cache_.cache->reject(cache_.slot, variant, "has a size its image cannot have");
  return ok;
}

CanvasOps::~CanvasOps() {
  if (!cache_) return;
  if (decoded_)
    cache_.cache->count_miss();
  else if (served_)
    cache_.cache->count_hit();
}

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
  max_pixels_ = max_pixels;
  ImageInfo info;
  if (is_raw(data_, n_)) {
    const RawImage r = raw_image(data_, n_);
    info = {r.width, r.height};
    check_declared(info, max_pixels);
    if (r.channels == 3) {
      c.pix = r.rgb();
      c.borrowed = true;  // the record's own bytes, in the shard's mapping
    } else {              // one channel, as RGB
      const size_t n = static_cast<size_t>(r.width) * r.height;
      s_.decoded.resize(n * 3);
      for (size_t i = 0; i < n; ++i)
        s_.decoded[3 * i] = s_.decoded[3 * i + 1] = s_.decoded[3 * i + 2] = r.pixels[i];
      c.pix = {s_.decoded.data(), r.width, r.height, static_cast<size_t>(r.width) * 3};
    }
    c.have_pixels = true;
    cache_ = {};  // its pixels are at hand already: nothing to keep, nothing to count
  } else if (is_jpeg(data_, n_)) {
    CachedImage hit;
    int variant = 0;
    if (cache_ && cache_.cache->find_any(cache_.slot, &hit, &variant) && fits(hit, variant)) {
      info = {hit.full_w, hit.full_h};  // no header to read
      check_declared(info, max_pixels);
      if (reduced_mode()) reduced_ = hit;
    } else {
      info = s_.jpeg.open(data_, n_, max_pixels);
      decoder_ready_ = true;
    }
  } else if (is_png(data_, n_)) {
    png_ = true;
    CachedImage hit;
    const int variant = reduced_mode() ? 0 : scale_variant(8);
    if (cache_ && cache_.cache->find(cache_.slot, variant, &hit) && fits(hit, variant)) {
      info = {hit.full_w, hit.full_h};
      check_declared(info, max_pixels);
      if (reduced_mode()) {
        reduced_ = hit;
      } else {
        c.have_pixels = true;
        c.pix = hit.pix;
        c.borrowed = true;
        served_ = true;
      }
    } else {
      const auto t0 = begin_decode();
      info = png_decode(data_, n_, max_pixels, s_.decoded);
      end_decode(t0);
      decoded_ = true;
      const RgbView px{s_.decoded.data(), info.width, info.height,
                       static_cast<size_t>(info.width) * 3};
      full_w_ = info.width;
      full_h_ = info.height;
      if (reduced_mode()) {
        reduced_source();  // the pixels come from the reduced copy, as on a hit
      } else {
        c.have_pixels = true;
        c.pix = px;
        if (cache_)
          if (DecodedCache::Writer w = cache_.cache->begin(cache_.slot, variant, info.width,
                                                           info.height, info.width, info.height)) {
            copy_rows(px, w.pixels(), w.stride());
            w.publish();
          }
      }
    }
  } else {
    not_an_image(data_, n_);
  }
  full_w_ = info.width;
  full_h_ = info.height;
  c.src_w = info.width;
  c.src_h = info.height;
  c.view = {0, 0, info.width, info.height};
}

void CanvasOps::open_decoder() {
  if (decoder_ready_) return;
  const ImageInfo info = s_.jpeg.open(data_, n_, max_pixels_);
  STOKER_CHECK(info.width == full_w_ && info.height == full_h_, DataError,
               "the decoded cache holds this image as ", full_w_, "x", full_h_,
               " but its header says ", info.width, "x", info.height);
  decoder_ready_ = true;
}

RgbView CanvasOps::region(const PixelRect& in, int num, int* ox, int* oy, bool* borrowed) {
  if (cache_) {
    const int variant = scale_variant(num);
    CachedImage e;
    bool have = cache_.cache->find(cache_.slot, variant, &e) && fits(e, variant, full_w_, full_h_);
    if (have) {
      served_ = true;
    } else {
      open_decoder();
      const int sw = JpegDecoder::scaled_size(full_w_, num);
      const int sh = JpegDecoder::scaled_size(full_h_, num);
      if (DecodedCache::Writer w =
              cache_.cache->begin(cache_.slot, variant, sw, sh, full_w_, full_h_)) {
        const auto t0 = begin_decode();
        decoder_ready_ = false;
        s_.jpeg.decode_scaled(num, w.pixels(), w.stride());
        end_decode(t0);
        decoded_ = true;
        e = w.publish();
        have = true;
      }
    }
    if (have) {  // decode_region's window of the whole image (NOTE [ Exact pixels ])
      const int x0 = static_cast<int>(int64_t{in.x} * num / 8);
      const int y0 = static_cast<int>(int64_t{in.y} * num / 8);
      const int x1 = std::min(e.pix.width, static_cast<int>((int64_t{in.x + in.w} * num + 7) / 8));
      const int y1 = std::min(e.pix.height, static_cast<int>((int64_t{in.y + in.h} * num + 7) / 8));
      *ox = x0;
      *oy = y0;
      *borrowed = true;
      return {e.pix.data + static_cast<size_t>(y0) * e.pix.stride + static_cast<size_t>(x0) * 3,
              x1 - x0, y1 - y0, e.pix.stride};
    }
  }
  open_decoder();
  const auto t0 = begin_decode();
  decoder_ready_ = false;
  const RgbView v = s_.jpeg.decode_region(in, num, s_.decoded, ox, oy);
  end_decode(t0);
  decoded_ = true;
  *borrowed = false;
  return v;
}

const CachedImage& CanvasOps::reduced_source() {
  if (reduced_.pix.data) {
    if (!decoded_) served_ = true;
    return reduced_;
  }
  const auto [rw, rh] = reduced_size(full_w_, full_h_, cache_.cache->options().max_side);
  const auto t0 = begin_decode();
  RgbView src;
  if (png_) {  // decoded whole at open()
    src = {s_.decoded.data(), full_w_, full_h_, static_cast<size_t>(full_w_) * 3};
  } else {  // the smallest DCT scale that still covers the copy
    int num = 8;
    for (int k : {1, 2, 4})
      if (JpegDecoder::scaled_size(full_w_, k) >= rw &&
          JpegDecoder::scaled_size(full_h_, k) >= rh) {
        num = k;
        break;
      }
    const int sw = JpegDecoder::scaled_size(full_w_, num);
    const int sh = JpegDecoder::scaled_size(full_h_, num);
    open_decoder();
    s_.decoded.resize(static_cast<size_t>(sw) * sh * 3);
    decoder_ready_ = false;
    s_.jpeg.decode_scaled(num, s_.decoded.data(), static_cast<size_t>(sw) * 3);
    src = {s_.decoded.data(), sw, sh, static_cast<size_t>(sw) * 3};
  }
  DecodedCache::Writer w = cache_.cache->begin(cache_.slot, 0, rw, rh, full_w_, full_h_);
  const size_t stride = static_cast<size_t>(rw) * 3;
  uint8_t* dst = nullptr;
  if (w) {
    dst = w.pixels();
  } else {
    s_.reduced.resize(stride * rh);
    dst = s_.reduced.data();
  }
  if (src.width == rw && src.height == rh)
    copy_rows(src, dst, stride);
  else
    resize_rgb(src, whole_box(src), dst, stride, rw, rh);
  reduced_ = w ? w.publish() : CachedImage{{dst, rw, rh, stride}, full_w_, full_h_};
  end_decode(t0);
  decoded_ = true;
  return reduced_;
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
  if (!c.have_pixels && !past_edges && reduced_mode()) {
    // cache_max_side: the crop's window of the reduced copy (NOTE [ Exact pixels ]).
    const CachedImage& r = reduced_source();
    c.pix = window_of(r.pix, static_cast<double>(r.pix.width) / full_w_,
                      static_cast<double>(r.pix.height) / full_h_, in, &box);
    c.have_pixels = true;
    c.borrowed = true;
  } else if (!c.have_pixels && !past_edges) {
    // The common path of RandomResizedCrop: decode only the crop, scaled down
    // by the DCT while it still covers the target.
    const int num = JpegDecoder::choose_scale(in.w, in.h, out_w, out_h);
    int ox = 0, oy = 0;
    c.pix = region(in, num, &ox, &oy, &c.borrowed);
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
  c.borrowed = false;
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
  if (reduced_mode()) {
    // Full-resolution pixels of `in`, resampled from the reduced copy.
    const CachedImage& r = reduced_source();
    ResizeBox box;
    const RgbView win = window_of(r.pix, static_cast<double>(r.pix.width) / full_w_,
                                  static_cast<double>(r.pix.height) / full_h_, in, &box);
    if (r.pix.width == full_w_ && r.pix.height == full_h_) {
      c.pix = win;  // the copy is the image itself
      c.borrowed = true;
    } else {
      const size_t stride = static_cast<size_t>(in.w) * 3;
      s_.decoded.resize(stride * in.h);
      resize_rgb(win, box, s_.decoded.data(), stride, in.w, in.h);
      c.pix = {s_.decoded.data(), in.w, in.h, stride};
      c.borrowed = false;
    }
    ox = in.x;
    oy = in.y;
  } else {
    c.pix = region(in, 8, &ox, &oy, &c.borrowed);
  }
  c.have_pixels = true;
  // The source is now the decoded region; view coordinates follow it.
  c.view.x -= ox;
  c.view.y -= oy;
  c.src_w = c.pix.width;
  c.src_h = c.pix.height;
}

bool CanvasOps::try_decode_into(Canvas& c, uint8_t* out) {
  if (c.have_pixels || c.flip || !c.whole_view()) return false;
  const size_t stride = static_cast<size_t>(c.src_w) * 3;
  if (reduced_mode()) {
    const CachedImage& r = reduced_source();
    if (r.pix.width == c.src_w && r.pix.height == c.src_h)
      copy_rows(r.pix, out, stride);
    else
      resize_rgb(r.pix, whole_box(r.pix), out, stride, c.src_w, c.src_h);
    return true;
  }
  if (cache_) {
    int ox = 0, oy = 0;
    bool borrowed = false;
    const RgbView v = region({0, 0, c.src_w, c.src_h}, 8, &ox, &oy, &borrowed);
    copy_rows(v, out, stride);
    return true;
  }
  open_decoder();
  const auto t0 = begin_decode();
  decoder_ready_ = false;
  s_.jpeg.decode_full(out, stride);
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
  c.borrowed = false;
  c.src_w = c.view.w;
  c.src_h = c.view.h;
  c.view = {0, 0, c.view.w, c.view.h};
}

}  // namespace stoker
