#include "decode/image_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "decode/codecs.h"
#include "decode/crop_params.h"
#include "decode/detail/half.h"
#include "decode/detail/rng.h"
#include "decode/jpeg_decoder.h"
#include "decode/png_decoder.h"
#include "decode/resize.h"

namespace stoker {

namespace {

enum OpKind : uint8_t { kRandomResizedCrop, kResize, kCenterCrop, kFlip, kNormalize };

struct KindInfo {
  const char* name;
  size_t num_args;
};
constexpr KindInfo kKinds[] = {{"random_resized_crop", 6},
                               {"resize", 2},
                               {"center_crop", 2},
                               {"random_horizontal_flip", 1},
                               {"normalize", 7}};

bool is_size(double v) { return v >= 1 && v <= 1 << 20 && v == std::floor(v); }

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

PixelRect intersect(const PixelRect& r, int w, int h) {
  const int x0 = std::max(r.x, 0), y0 = std::max(r.y, 0);
  const int x1 = std::min(r.x + r.w, w), y1 = std::min(r.y + r.h, h);
  return {x0, y0, std::max(0, x1 - x0), std::max(0, y1 - y0)};
}

// Per-thread buffers, grown to the largest image seen and then reused.
struct Scratch {
  JpegDecoder jpeg;
  std::vector<uint8_t> decoded;  // decoder output
  std::vector<uint8_t> bufs[2];  // resize outputs, alternating
  std::vector<uint8_t> padded;   // a view reaching past its source, zero-filled
  std::vector<uint8_t> row;      // one output row before layout and dtype
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// The state the ops act on: a window (`view`, in the source's coordinates,
// possibly past its edges) of a pixel source, mirrored when `flip`. The
// source is the still-undecoded JPEG (its full-resolution size known from the
// header) until something needs pixels.
//
// A resize is also held back (`pending`) until something needs its pixels:
// when it is the last op but flips, it then runs straight into the output,
// mirrored there if the flip says so, instead of into a buffer that is copied
// (and mirrored pixel by pixel) afterwards.
struct Canvas {
  bool have_pixels = false;
  RgbView pix;    // valid once have_pixels and not pending
  int src_w = 0;  // source size: the image's, then pix's (or the pending resize's output)
  int src_h = 0;
  PixelRect view;
  bool flip = false;
  bool pending = false;  // pix is the resize's output-to-be: resize pend_box of pend_src
  RgbView pend_src;
  ResizeBox pend_box;
};

class Runner {
 public:
  Runner(Scratch& s, const uint8_t* data, size_t n) : s_(s), data_(data), n_(n) {}

  // Starts on an image; a PNG is decoded at once (libpng has no region decode).
  void open(int64_t max_pixels, Canvas& c) {
    ImageInfo info;
    if (is_jpeg(data_, n_)) {
      info = s_.jpeg.open(data_, n_, max_pixels);
    } else if (is_png(data_, n_)) {
      info = png_decode(data_, n_, max_pixels, s_.decoded);
      c.have_pixels = true;
      c.pix = {s_.decoded.data(), info.width, info.height, static_cast<size_t>(info.width) * 3};
    } else {
      not_an_image(data_, n_);
    }
    c.src_w = info.width;
    c.src_h = info.height;
    c.view = {0, 0, info.width, info.height};
  }

  // A crop given in view coordinates (before the mirror).
  static void crop(Canvas& c, const PixelRect& r) {
    const int x = c.flip ? c.view.x + c.view.w - r.x - r.w : c.view.x + r.x;
    c.view = {x, c.view.y + r.y, r.w, r.h};
  }

  // Resamples the view to (out_w x out_h); afterwards the view is all of the
  // new pixels. The resampling itself waits in c.pending (see Canvas).
  void resize(Canvas& c, int out_w, int out_h) {
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
      c.pix = s_.jpeg.decode_region(in, num, s_.decoded, &ox, &oy);
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

  // Runs a pending resize into a scratch buffer. When the view is the whole
  // output, a pending flip is applied by the resize (free) and cleared.
  void materialize(Canvas& c) {
    if (!c.pending) return;
    std::vector<uint8_t>& dst = s_.bufs[next_];  // never pend_src: that is the other one
    next_ ^= 1;
    const size_t stride = static_cast<size_t>(c.src_w) * 3;
    dst.resize(stride * c.src_h);
    const bool whole = whole_view(c);
    run_pending(c, dst.data(), whole && c.flip);
    if (whole) c.flip = false;
    c.pix = {dst.data(), c.src_w, c.src_h, stride};
  }

  // Runs a pending resize straight into `out` (packed HWC uint8 of the view's
  // size) if the view is all of its output; false if there is none to run so.
  bool try_resize_into(Canvas& c, uint8_t* out) {
    if (!c.pending || !whole_view(c)) return false;
    run_pending(c, out, c.flip);
    return true;
  }

  static bool whole_view(const Canvas& c) { return c.view == PixelRect{0, 0, c.src_w, c.src_h}; }

  // The pending resize into packed rows at `out`, mirrored if `mirror`.
  static void run_pending(Canvas& c, uint8_t* out, bool mirror) {
    resize_rgb(c.pend_src, c.pend_box, out, static_cast<size_t>(c.src_w) * 3, c.src_w, c.src_h,
               mirror);
    c.pending = false;
  }

  // Decodes (at full scale) what the view needs, if nothing has been decoded
  // yet, and runs a pending resize.
  void ensure_pixels(Canvas& c) {
    materialize(c);
    if (c.have_pixels) return;
    PixelRect in = intersect(c.view, c.src_w, c.src_h);
    if (in.w == 0 || in.h == 0) in = {0, 0, c.src_w, c.src_h};  // all padding: still validate
    int ox = 0, oy = 0;
    c.pix = s_.jpeg.decode_region(in, 8, s_.decoded, &ox, &oy);
    c.have_pixels = true;
    // The source is now the decoded region; view coordinates follow it.
    c.view.x -= ox;
    c.view.y -= oy;
    c.src_w = c.pix.width;
    c.src_h = c.pix.height;
  }

  // Decodes the whole image straight into `out` when nothing else is to be done.
  bool try_decode_into(Canvas& c, uint8_t* out) {
    if (c.have_pixels || c.flip || !(c.view == PixelRect{0, 0, c.src_w, c.src_h})) return false;
    s_.jpeg.decode_full(out, static_cast<size_t>(c.src_w) * 3);
    return true;
  }

 private:
  // Copies the view into a zero-filled buffer of its size (torchvision pads
  // with zeros before resizing, so the zeros are averaged in at the edges).
  void pad(Canvas& c) {
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

  Scratch& s_;
  const uint8_t* data_;
  size_t n_;
  int next_ = 0;
};

// The view's row `y` as packed RGB (mirrored, zeros past the edges) into `dst`.
void gather_row(const Canvas& c, int y, uint8_t* dst) {
  const int w = c.view.w;
  const int sy = c.view.y + y;
  if (sy < 0 || sy >= c.src_h) {
    std::memset(dst, 0, static_cast<size_t>(w) * 3);
    return;
  }
  const uint8_t* row = c.pix.data + static_cast<size_t>(sy) * c.pix.stride;
  if (!c.flip && c.view.x >= 0 && c.view.x + w <= c.src_w) {
    std::memcpy(dst, row + static_cast<size_t>(c.view.x) * 3, static_cast<size_t>(w) * 3);
    return;
  }
  for (int x = 0; x < w; ++x) {
    const int sx = c.view.x + (c.flip ? w - 1 - x : x);
    if (sx >= 0 && sx < c.src_w) {
      std::memcpy(dst + 3 * x, row + static_cast<size_t>(sx) * 3, 3);
    } else {
      dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = 0;
    }
  }
}

}  // namespace

ImageInfo probe_image(const uint8_t* data, size_t n) {
  if (is_jpeg(data, n)) return jpeg_probe(data, n);
  if (is_png(data, n)) return png_probe(data, n);
  not_an_image(data, n);
}

ImagePipeline::ImagePipeline(ImageFieldSpec spec) : spec_(std::move(spec)) {
  require_image_codecs();  // a build without codecs refuses image fields up front
  STOKER_CHECK(spec_.max_pixels > 0, UsageError, "max_pixels must be positive");
  for (size_t i = 0; i < spec_.ops.size(); ++i) {
    const OpSpec& op = spec_.ops[i];
    const auto* k = std::find_if(std::begin(kKinds), std::end(kKinds),
                                 [&](const KindInfo& ki) { return op.kind == ki.name; });
    if (k == std::end(kKinds)) STOKER_THROW(UsageError, "unknown image op '", op.kind, "'");
    const auto kind = static_cast<OpKind>(k - std::begin(kKinds));
    if (op.args.size() != k->num_args)
      STOKER_THROW(UsageError, "op '", op.kind, "' takes ", k->num_args, " arguments, got ",
                   op.args.size());
    const auto& a = op.args;
    switch (kind) {
      case kRandomResizedCrop:
        STOKER_CHECK(is_size(a[0]) && is_size(a[1]), UsageError,
                     "random_resized_crop: size must be whole numbers >= 1");
        STOKER_CHECK(0 < a[2] && a[2] <= a[3], UsageError,
                     "random_resized_crop: scale must satisfy 0 < lo <= hi");
        STOKER_CHECK(a[4] <= a[5], UsageError, "random_resized_crop: ratio must satisfy lo <= hi");
        fixed_ = std::make_pair(int(a[0]), int(a[1]));
        break;
      case kResize:
        if (a[1] == -1) {
          STOKER_CHECK(is_size(a[0]), UsageError, "resize: size must be a whole number >= 1");
          fixed_.reset();
        } else {
          STOKER_CHECK(is_size(a[0]) && is_size(a[1]), UsageError,
                       "resize: size must be whole numbers >= 1");
          fixed_ = std::make_pair(int(a[0]), int(a[1]));
        }
        break;
      case kCenterCrop:
        STOKER_CHECK(is_size(a[0]) && is_size(a[1]), UsageError,
                     "center_crop: size must be whole numbers >= 1");
        fixed_ = std::make_pair(int(a[0]), int(a[1]));
        break;
      case kFlip:
        STOKER_CHECK(a[0] >= 0 && a[0] <= 1, UsageError,
                     "random_horizontal_flip: p must be in [0, 1]");
        break;
      case kNormalize:
        STOKER_CHECK(i + 1 == spec_.ops.size(), UsageError, "Normalize must be the last op");
        STOKER_CHECK(a[3] != 0 && a[4] != 0 && a[5] != 0, UsageError,
                     "normalize: std must be non-zero");
        STOKER_CHECK(a[6] == 0 || a[6] == 1, UsageError,
                     "normalize: dtype must be 0 (float32) or 1 (float16)");
        out_dtype_ = a[6] == 1 ? DType::kFloat16 : DType::kFloat32;
        break;
    }
    kinds_.push_back(kind);
  }
}

std::pair<int, int> ImagePipeline::output_size(const uint8_t* data, size_t n) const {
  const ImageInfo info = probe_image(data, n);
  check_declared(info, spec_.max_pixels);
  int h = info.height, w = info.width;
  for (size_t i = 0; i < spec_.ops.size(); ++i) {
    const auto& a = spec_.ops[i].args;
    switch (kinds_[i]) {
      case kResize:
        if (a[1] == -1)
          shorter_side_size(h, w, int(a[0]), &h, &w);
        else
          h = int(a[0]), w = int(a[1]);
        break;
      case kRandomResizedCrop:
      case kCenterCrop:
        h = int(a[0]), w = int(a[1]);
        break;
      default:
        break;
    }
  }
  return {h, w};
}

void ImagePipeline::run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h,
                        int out_w) const {
  Scratch& s = scratch();
  Runner runner(s, data, n);
  Canvas c;
  runner.open(spec_.max_pixels, c);
  detail::SplitMix64 rng(seed);
  const OpSpec* norm = nullptr;
  for (size_t i = 0; i < spec_.ops.size(); ++i) {
    const auto& a = spec_.ops[i].args;
    switch (kinds_[i]) {
      case kRandomResizedCrop:
        Runner::crop(c, random_resized_crop_rect(c.view.w, c.view.h, a[2], a[3], a[4], a[5], rng));
        runner.resize(c, int(a[1]), int(a[0]));
        break;
      case kResize: {
        int h = int(a[0]), w = int(a[1]);
        if (a[1] == -1) shorter_side_size(c.view.h, c.view.w, int(a[0]), &h, &w);
        runner.resize(c, w, h);
        break;
      }
      case kCenterCrop:
        Runner::crop(c, center_crop_rect(c.view.w, c.view.h, int(a[1]), int(a[0])));
        break;
      case kFlip:
        // Always draw, so later draws do not depend on this one's outcome.
        if (rng.uniform(0, 1) < a[0]) c.flip = !c.flip;
        break;
      case kNormalize:
        norm = &spec_.ops[i];
        break;
    }
  }
  if (c.view.w != out_w || c.view.h != out_h)
    STOKER_THROW(DecodeError, "image comes out ", c.view.h, "x", c.view.w,
                 " but the batch expects ", out_h, "x", out_w);
  const bool chw = spec_.layout == ImageLayout::kCHW;
  const bool u8 = out_dtype_ == DType::kUInt8;
  if (u8 && !chw &&
      (runner.try_resize_into(c, static_cast<uint8_t*>(out)) ||
       runner.try_decode_into(c, static_cast<uint8_t*>(out))))
    return;
  runner.ensure_pixels(c);

  const size_t plane = static_cast<size_t>(out_h) * out_w;
  const size_t row_bytes = static_cast<size_t>(out_w) * 3;
  float scale[3] = {1, 1, 1}, shift[3] = {0, 0, 0};
  if (norm)
    for (int ch = 0; ch < 3; ++ch) {
      scale[ch] = static_cast<float>(1.0 / (255.0 * norm->args[3 + ch]));
      shift[ch] = static_cast<float>(-norm->args[ch] / norm->args[3 + ch]);
    }
  s.row.resize(row_bytes);
  for (int y = 0; y < out_h; ++y) {
    uint8_t* row = u8 && !chw ? static_cast<uint8_t*>(out) + y * row_bytes : s.row.data();
    gather_row(c, y, row);
    if (u8 && !chw) continue;
    const size_t base = static_cast<size_t>(y) * out_w;
    for (int ch = 0; ch < 3; ++ch) {
      for (int x = 0; x < out_w; ++x) {
        const uint8_t v = row[3 * x + ch];
        const size_t idx = chw ? ch * plane + base + x : (base + x) * 3 + ch;
        if (u8) {
          static_cast<uint8_t*>(out)[idx] = v;
        } else {
          const float f = v * scale[ch] + shift[ch];
          if (out_dtype_ == DType::kFloat32)
            static_cast<float*>(out)[idx] = f;
          else
            static_cast<uint16_t*>(out)[idx] = detail::float_to_half(f);
        }
      }
    }
  }
}

}  // namespace stoker
