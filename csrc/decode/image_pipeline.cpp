#include "decode/image_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "common/error.h"
#include "decode/jpeg_decoder.h"
#include "decode/png_decoder.h"
#include "decode/resize.h"
#include "sampler/permutation.h"

namespace stoker {

namespace {

// Per-sample random stream: splitmix64 over the sample's seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  double uniform(double lo, double hi) {  // [lo, hi)
    state_ += 0x9E3779B97F4A7C15ull;
    return lo + (hi - lo) * static_cast<double>(mix64(state_) >> 11) * 0x1.0p-53;
  }
  int randint(int lo, int hi) {  // [lo, hi] inclusive
    return std::min(hi, lo + static_cast<int>(uniform(0, 1) * (hi - lo + 1)));
  }

 private:
  uint64_t state_;
};

// IEEE binary16 from float, round to nearest even.
uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFF;
  if (((x >> 23) & 0xFF) == 0xFF) return static_cast<uint16_t>(sign | 0x7C00 | (mant ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(sign | half);
}

// torchvision's rounding for the shorter-side resize and the crop offsets.
int round_half_even(double v) { return static_cast<int>(std::nearbyint(v)); }

struct Rect {
  int x, y, w, h;  // may extend past the image (center crop of a small image): zeros there
};

struct Scratch {
  std::vector<uint8_t> a, b;
  std::vector<float> f;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void check_args(const OpSpec& op, size_t n) {
  if (op.args.size() != n)
    STOKER_THROW(UsageError, "op '", op.kind, "' takes ", n, " arguments, got ", op.args.size());
}

// Output size after a shorter-side resize.
std::pair<int, int> shorter_side(int h, int w, int size) {
  if (w <= h) return {static_cast<int>(static_cast<int64_t>(size) * h / w), size};
  return {size, static_cast<int>(static_cast<int64_t>(size) * w / h)};
}

ImageInfo probe(const uint8_t* data, size_t n) {
  if (is_jpeg(data, n)) return jpeg_probe(data, n);
  if (is_png(data, n)) return png_probe(data, n);
  char head[32];
  std::snprintf(head, sizeof head, "%02x %02x %02x %02x", n > 0 ? data[0] : 0,
                n > 1 ? data[1] : 0, n > 2 ? data[2] : 0, n > 3 ? data[3] : 0);
  STOKER_THROW(DecodeError, "not a JPEG or PNG (", n, " bytes starting with ", head, ")");
}

}  // namespace

ImageInfo probe_image(const uint8_t* data, size_t n) { return probe(data, n); }

ImagePipeline::ImagePipeline(ImageFieldSpec spec) : spec_(std::move(spec)) {
  STOKER_CHECK(spec_.max_pixels > 0, UsageError, "max_image_pixels must be positive");
  for (size_t i = 0; i < spec_.ops.size(); ++i) {
    const OpSpec& op = spec_.ops[i];
    if (op.kind == "random_resized_crop") {
      check_args(op, 6);
      STOKER_CHECK(op.args[0] >= 1 && op.args[1] >= 1, UsageError, "crop size must be >= 1");
      fixed_ = std::make_pair(static_cast<int>(op.args[0]), static_cast<int>(op.args[1]));
    } else if (op.kind == "resize") {
      check_args(op, 2);
      if (op.args[1] < 0)
        fixed_.reset();
      else
        fixed_ = std::make_pair(static_cast<int>(op.args[0]), static_cast<int>(op.args[1]));
    } else if (op.kind == "center_crop") {
      check_args(op, 2);
      fixed_ = std::make_pair(static_cast<int>(op.args[0]), static_cast<int>(op.args[1]));
    } else if (op.kind == "random_horizontal_flip") {
      check_args(op, 1);
    } else if (op.kind == "normalize") {
      check_args(op, 7);
      STOKER_CHECK(i + 1 == spec_.ops.size(), UsageError, "Normalize must be the last op");
      out_dtype_ = op.args[6] == 1 ? DType::kFloat16 : DType::kFloat32;
    } else {
      STOKER_THROW(UsageError, "unknown image op '", op.kind, "'");
    }
  }
}

std::pair<int, int> ImagePipeline::output_size(const uint8_t* data, size_t n) const {
  ImageInfo info = probe(data, n);
  if (int64_t{info.width} * info.height > spec_.max_pixels)
    STOKER_THROW(DecodeError, "image declares ", info.width, "x", info.height, " = ",
                 int64_t{info.width} * info.height, " pixels, above the limit of ",
                 spec_.max_pixels);
  if (info.width <= 0 || info.height <= 0) STOKER_THROW(DecodeError, "empty image");
  int h = info.height, w = info.width;
  for (const OpSpec& op : spec_.ops) {
    if (op.kind == "resize") {
      std::tie(h, w) = op.args[1] < 0 ? shorter_side(h, w, static_cast<int>(op.args[0]))
                                      : std::make_pair(static_cast<int>(op.args[0]),
                                                       static_cast<int>(op.args[1]));
    } else if (op.kind == "random_resized_crop" || op.kind == "center_crop") {
      h = static_cast<int>(op.args[0]);
      w = static_cast<int>(op.args[1]);
    }
  }
  return {h, w};
}

void ImagePipeline::run(const uint8_t* data, size_t n, uint64_t seed, void* out, int out_h,
                        int out_w) const {
  Scratch& s = scratch();
  ImageInfo info;
  if (is_jpeg(data, n)) {
    info = jpeg_decode(data, n, spec_.max_pixels, s.a);
  } else if (is_png(data, n)) {
    info = png_decode(data, n, spec_.max_pixels, s.a);
  } else {
    probe(data, n);  // throws the "not a JPEG or PNG" error
  }
  Rng rng(seed);
  // The image is s.a (img_w x img_h); `r` is the region the next op sees.
  int img_w = info.width, img_h = info.height;
  Rect r{0, 0, img_w, img_h};
  bool flip = false;
  const OpSpec* norm = nullptr;
  auto materialize_resize = [&](int nh, int nw) {
    // Regions past the image (from a center crop of a small image) are cut
    // first; torchvision pads with zeros, which resize then averages in. Rare.
    s.b.resize(static_cast<size_t>(nw) * nh * 3);
    Rect c = r;
    c.x = std::max(c.x, 0);
    c.y = std::max(c.y, 0);
    c.w = std::min(r.x + r.w, img_w) - c.x;
    c.h = std::min(r.y + r.h, img_h) - c.y;
    resize_rgb(s.a.data(), img_w * 3, c.x, c.y, c.w, c.h, s.b.data(), nw, nh, s.f);
    std::swap(s.a, s.b);
    img_w = nw;
    img_h = nh;
    r = {0, 0, nw, nh};
  };
  for (const OpSpec& op : spec_.ops) {
    const auto& a = op.args;
    if (op.kind == "random_resized_crop") {
      const double area = double(r.w) * r.h;
      bool found = false;
      int cw = 0, ch = 0, cx = 0, cy = 0;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        const double target = area * rng.uniform(a[2], a[3]);
        const double aspect = std::exp(rng.uniform(a[4], a[5]));
        cw = round_half_even(std::sqrt(target * aspect));
        ch = round_half_even(std::sqrt(target / aspect));
        if (cw > 0 && ch > 0 && cw <= r.w && ch <= r.h) {
          cy = rng.randint(0, r.h - ch);
          cx = rng.randint(0, r.w - cw);
          found = true;
        }
      }
      if (!found) {  // torchvision's fallback: a central crop clamped to the ratio range
        const double in_ratio = double(r.w) / r.h;
        const double rlo = std::exp(a[4]), rhi = std::exp(a[5]);
        if (in_ratio < rlo) {
          cw = r.w;
          ch = round_half_even(cw / rlo);
        } else if (in_ratio > rhi) {
          ch = r.h;
          cw = round_half_even(ch * rhi);
        } else {
          cw = r.w;
          ch = r.h;
        }
        cy = (r.h - ch) / 2;
        cx = (r.w - cw) / 2;
      }
      r = {r.x + cx, r.y + cy, cw, ch};
      materialize_resize(static_cast<int>(a[0]), static_cast<int>(a[1]));
    } else if (op.kind == "resize") {
      auto [nh, nw] = a[1] < 0 ? shorter_side(r.h, r.w, static_cast<int>(a[0]))
                               : std::make_pair(static_cast<int>(a[0]), static_cast<int>(a[1]));
      if (nh != r.h || nw != r.w || r.x != 0 || r.y != 0 || r.w != img_w || r.h != img_h)
        materialize_resize(nh, nw);
    } else if (op.kind == "center_crop") {
      const int ch = static_cast<int>(a[0]), cw = static_cast<int>(a[1]);
      const int top = ch > r.h ? -((ch - r.h) / 2) : round_half_even((r.h - ch) / 2.0);
      const int left = cw > r.w ? -((cw - r.w) / 2) : round_half_even((r.w - cw) / 2.0);
      r = {r.x + left, r.y + top, cw, ch};
    } else if (op.kind == "random_horizontal_flip") {
      if (rng.uniform(0, 1) < a[0]) flip = !flip;
    } else if (op.kind == "normalize") {
      norm = &op;
    }
  }
  if (r.w != out_w || r.h != out_h)
    STOKER_THROW(DecodeError, "image comes out ", r.h, "x", r.w, " but the batch expects ",
                 out_h, "x", out_w);
  // Write the region into `out`: layout, flip, dtype. Pixels outside the image are 0.
  const bool chw = spec_.layout == ImageLayout::kCHW;
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  float scale[3] = {0, 0, 0}, shift[3] = {0, 0, 0};
  if (norm)
    for (int c = 0; c < 3; ++c) {
      scale[c] = static_cast<float>(1.0 / (255.0 * norm->args[3 + c]));
      shift[c] = static_cast<float>(-norm->args[c] / norm->args[3 + c]);
    }
  for (int y = 0; y < out_h; ++y) {
    const int sy = r.y + y;
    for (int x = 0; x < out_w; ++x) {
      const int sx = r.x + (flip ? out_w - 1 - x : x);
      const bool inside = sy >= 0 && sy < img_h && sx >= 0 && sx < img_w;
      const uint8_t* px = inside ? &s.a[(static_cast<size_t>(sy) * img_w + sx) * 3] : nullptr;
      for (int c = 0; c < 3; ++c) {
        const uint8_t v = px ? px[c] : 0;
        const size_t idx = chw ? c * plane + static_cast<size_t>(y) * out_w + x
                               : (static_cast<size_t>(y) * out_w + x) * 3 + c;
        if (out_dtype_ == DType::kUInt8) {
          static_cast<uint8_t*>(out)[idx] = v;
        } else {
          const float f = v * scale[c] + shift[c];
          if (out_dtype_ == DType::kFloat32)
            static_cast<float*>(out)[idx] = f;
          else
            static_cast<uint16_t*>(out)[idx] = to_half(f);
        }
      }
    }
  }
}

}  // namespace stoker
