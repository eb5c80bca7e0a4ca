#include "augment/color_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/detail/multiversion.h"
#include "common/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace stoker {

// NOTE [ Fused colour passes ]
//
// torchvision applies each colour op to the whole image in turn: a ColorJitter
// reads and writes every pixel four times, RandAugment's colour ops once each.
// Here a list of steps is cut into passes; each pass reads a row, runs its
// kernels on the row while it is in L1 (a composed 256-entry table per
// channel, or a cross-channel kernel: saturation, hue, grayscale), writes it
// back, and accumulates what the first step of the next pass needs:
//
//   brightness, saturation | contrast, hue          (ColorJitter, one order)
//   [------ pass 1 ------]   [---- pass 2 ----]
//                 gathers: mean of the gray  ^ uses it to build its table
//
// A step needing a statistic of its own input (contrast: mean of the gray;
// equalize: histograms; autocontrast: min/max, read from the histograms) starts
// a pass; so does sharpness, a 3x3 stencil, which keeps the two original rows
// it still needs in a ring while it writes in place. A list that starts with
// a statistic step gets a read-only pass first. The results are the same as
// applying the steps one by one, since every kernel computes what the step
// alone would.

namespace {

constexpr float kGrayR = 0.2989f, kGrayG = 0.587f, kGrayB = 0.114f;

bool needs_stats(ColorKind k) {
  return k == ColorKind::kContrast || k == ColorKind::kEqualize || k == ColorKind::kAutocontrast;
}

bool is_table(ColorKind k) {
  switch (k) {
    case ColorKind::kBrightness:
    case ColorKind::kContrast:
    case ColorKind::kPosterize:
    case ColorKind::kSolarize:
    case ColorKind::kInvert:
    case ColorKind::kEqualize:
    case ColorKind::kAutocontrast:
      return true;
    default:
      return false;
  }
}

// What a pass gathers over its output for the next pass.
struct Stats {
  bool want_gray = false;
  bool want_hist = false;
  int64_t gray_sum = 0;
  uint32_t hist[3][256];
  uint32_t hist_odd[3][256];  // odd pixels' counts while gathering; added to hist after
  int64_t pixels = 0;
};

struct Pass {
  size_t begin = 0, end = 0;  // steps [begin, end); a stats-only pass has none
  bool read_only = false;
  bool sharpen = false;
  double sharp_factor = 1;
  bool gather_gray = false;  // for the next pass
  bool gather_hist = false;
};

// Cuts steps into passes (NOTE [ Fused colour passes ]).
void plan_passes(const ColorStep* steps, size_t n, int channels, int width, int height,
                 std::vector<Pass>& passes) {
  passes.clear();
  auto gather_for = [&](Pass& p, ColorKind next) {
    if (next == ColorKind::kContrast) p.gather_gray = true;
    if (next == ColorKind::kEqualize || next == ColorKind::kAutocontrast) p.gather_hist = true;
  };
  for (size_t i = 0; i < n; ++i) {
    const ColorKind k = steps[i].kind;
    if (channels == 1 &&
        (k == ColorKind::kSaturation || k == ColorKind::kHue || k == ColorKind::kGrayscale))
      continue;  // no-ops on one channel, as in torchvision
    const bool sharpen = k == ColorKind::kSharpness;
    if (sharpen && (width <= 2 || height <= 2)) continue;  // torchvision returns such images as is
    const bool open = !passes.empty() && !passes.back().read_only;
    const bool pass_empty =
        open && passes.back().begin == passes.back().end && !passes.back().sharpen;
    if (sharpen || needs_stats(k)) {
      if (!open) {
        if (needs_stats(k)) {  // a statistic of the untouched input
          Pass stats;
          stats.read_only = true;
          gather_for(stats, k);
          passes.push_back(stats);
        }
      } else if (!pass_empty) {
        if (needs_stats(k)) gather_for(passes.back(), k);
      }
      if (!open || !pass_empty) {
        Pass p;
        p.begin = p.end = i;
        passes.push_back(p);
      }
      if (sharpen) {
        passes.back().sharpen = true;
        passes.back().sharp_factor = steps[i].value;
        passes.back().begin = passes.back().end = i + 1;
        continue;
      }
    } else if (!open) {
      Pass p;
      p.begin = p.end = i;
      passes.push_back(p);
    }
    passes.back().end = i + 1;
  }
}

// Thread-local buffers of the passes.
struct ColorScratch {
  std::vector<Pass> passes;
  std::vector<uint8_t> ring[2];  // sharpness: the original rows y-1 and y
  std::vector<uint8_t> out_row;  // sharpness: the output row before the kernels
  std::vector<float> f[3];       // cross-channel kernels: planar floats of a row
  std::vector<uint8_t> bytes;    // and their planar bytes
  Stats stats;
};

ColorScratch& color_scratch() {
  thread_local ColorScratch s;
  return s;
}

// One kernel of a pass: a table per channel, or a cross-channel step.
struct Kernel {
  ColorKind kind;  // kBrightness stands for "table"
  double value = 0;
  uint8_t lut[3][256];
  bool same = false;  // the three tables are equal
};

// x * f, clamped and truncated as `.to(torch.uint8)`.
inline uint8_t trunc_u8(float v) {
  v = v < 0.f ? 0.f : v > 255.f ? 255.f : v;
  return static_cast<uint8_t>(v);
}

// The table of one step for channel c, given the statistics of its input.
void step_table(const ColorStep& s, const Stats& st, int c, uint8_t* lut) {
  const float f = static_cast<float>(s.value);
  const float keep = static_cast<float>(1.0 - s.value);  // torch: alpha = 1.0 - ratio, in double
  switch (s.kind) {
    case ColorKind::kBrightness:
      for (int x = 0; x < 256; ++x) lut[x] = trunc_u8(static_cast<float>(x) * f);
      return;
    case ColorKind::kContrast: {
      const float mean =
          static_cast<float>(static_cast<double>(st.gray_sum) / static_cast<double>(st.pixels));
      const float g = keep * mean;
      for (int x = 0; x < 256; ++x) lut[x] = trunc_u8(static_cast<float>(x) * f + g);
      return;
    }
    case ColorKind::kPosterize: {
      const int bits = static_cast<int>(s.value);
      const int mask = bits >= 8 ? 0xFF : ((1 << bits) - 1) << (8 - bits);
      for (int x = 0; x < 256; ++x) lut[x] = static_cast<uint8_t>(x & mask);
      return;
    }
    case ColorKind::kSolarize:
      for (int x = 0; x < 256; ++x)
        lut[x] =
            static_cast<float>(x) >= f ? static_cast<uint8_t>(255 - x) : static_cast<uint8_t>(x);
      return;
    case ColorKind::kInvert:
      for (int x = 0; x < 256; ++x) lut[x] = static_cast<uint8_t>(255 - x);
      return;
    case ColorKind::kEqualize: {
      // PIL's table, as torchvision's equalize_image: step = (pixels not in
      // the last non-empty bin) // 255; lut[k] = (cdf[k-1] + step // 2) // step.
      const uint32_t* h = st.hist[c];
      int last = 255;
      while (last > 0 && h[last] == 0) --last;
      const int64_t step = (st.pixels - h[last]) / 255;
      if (step == 0) {
        for (int x = 0; x < 256; ++x) lut[x] = static_cast<uint8_t>(x);
        return;
      }
      int64_t cdf = 0;
      lut[0] = 0;
      for (int x = 1; x < 256; ++x) {
        cdf += h[x - 1];
        lut[x] = static_cast<uint8_t>(std::min<int64_t>((cdf + step / 2) / step, 255));
      }
      return;
    }
    case ColorKind::kAutocontrast: {
      const uint32_t* h = st.hist[c];
      int lo = 0, hi = 255;
      while (lo < 255 && h[lo] == 0) ++lo;
      while (hi > 0 && h[hi] == 0) --hi;
      if (hi <= lo) {  // a flat channel is left as is
        for (int x = 0; x < 256; ++x) lut[x] = static_cast<uint8_t>(x);
        return;
      }
      const float inv_scale = static_cast<float>(hi - lo) * (1.0f / 255.0f);
      for (int x = 0; x < 256; ++x)
        lut[x] = trunc_u8((static_cast<float>(x) - static_cast<float>(lo)) / inv_scale);
      return;
    }
    default:
      STOKER_THROW(UsageError, "colour step '", color_kind_name(s.kind), "' is not a table");
  }
}

// Builds the kernels of pass p from the statistics of its input.
void build_kernels(const Pass& p, const ColorStep* steps, int channels, const Stats& st,
                   std::vector<Kernel>& ks) {
  ks.clear();
  for (size_t i = p.begin; i < p.end; ++i) {
    const ColorStep& s = steps[i];
    if (channels == 1 && (s.kind == ColorKind::kSaturation || s.kind == ColorKind::kHue ||
                          s.kind == ColorKind::kGrayscale))
      continue;
    if (!is_table(s.kind)) {
      Kernel k;
      k.kind = s.kind;
      k.value = s.value;
      ks.push_back(k);
      continue;
    }
    const bool compose = !ks.empty() && ks.back().kind == ColorKind::kBrightness;
    if (!compose) {
      ks.emplace_back();
      ks.back().kind = ColorKind::kBrightness;
    }
    Kernel& k = ks.back();
    uint8_t t[256];
    for (int c = 0; c < channels; ++c) {
      step_table(s, st, c, t);
      if (compose) {
        for (int x = 0; x < 256; ++x) k.lut[c][x] = t[k.lut[c][x]];
      } else {
        std::memcpy(k.lut[c], t, 256);
      }
    }
  }
  for (Kernel& k : ks)
    if (k.kind == ColorKind::kBrightness && channels == 3)
      k.same =
          std::memcmp(k.lut[0], k.lut[1], 256) == 0 && std::memcmp(k.lut[0], k.lut[2], 256) == 0;
}

void run_table(const Kernel& k, uint8_t* row, int w, int channels) {
  const uint8_t* luts[3] = {k.lut[0], k.lut[1], k.lut[2]};
  detail::lookup_bytes(luts, channels == 1 || k.same ? 1 : 3, row,
                       static_cast<size_t>(w) * channels);
}

// floor() of |x| < 2^31 in instructions SSE2 has (truncating conversions
// and a compare): std::floor is a library call below SSE4.1, which stops the
// loops below from vectorising in the baseline build.
inline float floor_f(float x) {
  const float t = static_cast<float>(static_cast<int32_t>(x));
  return t > x ? t - 1.0f : t;
}

// Planar float copies of an RGB row (the cross-channel kernels vectorise on
// these): the bytes are de-interleaved first, then widened in contiguous
// loops (a stride-3 load straight into floats does not vectorise well).
STOKER_MULTIVERSION
void split_row(const uint8_t* row, int w, float* r, float* g, float* b, uint8_t* tmp) {
  uint8_t* t0 = tmp;
  uint8_t* t1 = tmp + w;
  uint8_t* t2 = tmp + 2 * w;
  for (int x = 0; x < w; ++x) {
    t0[x] = row[3 * x];
    t1[x] = row[3 * x + 1];
    t2[x] = row[3 * x + 2];
  }
  for (int x = 0; x < w; ++x) r[x] = t0[x];
  for (int x = 0; x < w; ++x) g[x] = t1[x];
  for (int x = 0; x < w; ++x) b[x] = t2[x];
}

// The planar rows back, each value truncated to [0, 255] as .to(torch.uint8):
// narrowed in contiguous loops, then interleaved.
STOKER_MULTIVERSION
void merge_row(const float* r, const float* g, const float* b, int w, uint8_t* row, uint8_t* tmp) {
  uint8_t* t0 = tmp;
  uint8_t* t1 = tmp + w;
  uint8_t* t2 = tmp + 2 * w;
  for (int x = 0; x < w; ++x) t0[x] = trunc_u8(r[x]);
  for (int x = 0; x < w; ++x) t1[x] = trunc_u8(g[x]);
  for (int x = 0; x < w; ++x) t2[x] = trunc_u8(b[x]);
  for (int x = 0; x < w; ++x) {
    row[3 * x] = t0[x];
    row[3 * x + 1] = t1[x];
    row[3 * x + 2] = t2[x];
  }
}

STOKER_MULTIVERSION
void saturation_planar(float* r, float* g, float* b, int w, float f, float keep) {
  for (int x = 0; x < w; ++x) {
    // _blend(image, floor(gray), f): image * f + gray * (1 - f); gray >= 0
    const float gray = floor_f(r[x] * kGrayR + g[x] * kGrayG + b[x] * kGrayB);
    const float gk = gray * keep;
    r[x] = r[x] * f + gk;
    g[x] = g[x] * f + gk;
    b[x] = b[x] * f + gk;
  }
}

void run_saturation(uint8_t* row, int w, double factor, ColorScratch& s) {
  float* r = s.f[0].data();
  float* g = s.f[1].data();
  float* b = s.f[2].data();
  split_row(row, w, r, g, b, s.bytes.data());
  saturation_planar(r, g, b, w, static_cast<float>(factor), static_cast<float>(1.0 - factor));
  merge_row(r, g, b, w, row, s.bytes.data());
}

STOKER_MULTIVERSION
void run_grayscale(uint8_t* row, int w) {
  for (int x = 0; x < w; ++x) {
    uint8_t* p = row + 3 * x;
    const float gray = static_cast<float>(p[0]) * kGrayR + static_cast<float>(p[1]) * kGrayG +
                       static_cast<float>(p[2]) * kGrayB;
    const uint8_t v = static_cast<uint8_t>(static_cast<int32_t>(gray));  // .to(uint8) truncates
    p[0] = p[1] = p[2] = v;
  }
}

// adjust_hue_image: RGB -> HSV (Pillow's formulas as torchvision writes
// them), h += shift mod 1, HSV -> RGB, in float32, branch-free so that the
// loop vectorises.
STOKER_MULTIVERSION
void hue_planar(float* r, float* g, float* b, int w, float shift) {
  constexpr float kInv255 = 1.0f / 255.0f;
  constexpr float kScale = 255.0f + 1.0f - 1e-3f;  // to_dtype(float -> uint8, scale=True)
  for (int x = 0; x < w; ++x) {
    const float rf = r[x] * kInv255, gf = g[x] * kInv255, bf = b[x] * kInv255;
    const float maxc = std::max(std::max(rf, gf), bf);
    const float minc = std::min(std::min(rf, gf), bf);
    const bool eqc = maxc == minc;
    const float range = maxc - minc;
    const float sat = range / (eqc ? 1.0f : maxc);
    const float div = eqc ? 1.0f : range;
    const float rc = (maxc - rf) / div, gc = (maxc - gf) / div, bc = (maxc - bf) / div;
    const bool max_r = maxc == rf;
    const bool max_g = maxc == gf;
    float h = max_r ? bc - gc : (max_g ? (rc + 2.0f) - bc : (gc + 4.0f) - rc);
    h = h * (1.0f / 6.0f) + 1.0f;
    h = h - floor_f(h);  // fmod(h, 1) for h > 0, exactly
    h = h + shift;
    h = h - floor_f(h);  // remainder(h, 1)
    // HSV -> RGB: the sector picks (r, g, b) among (v, p, q, t)
    const float h6 = h * 6.0f;
    float sector = floor_f(h6);
    const float fr = h6 - sector;
    sector = sector >= 6.0f ? sector - 6.0f : sector;
    const float v = maxc;
    const float sxf = sat * fr;
    const float one_minus_s = 1.0f - sat;
    const float q = std::min(std::max((1.0f - sxf) * v, 0.0f), 1.0f);
    const float t = std::min(std::max((sxf + one_minus_s) * v, 0.0f), 1.0f);
    const float p = std::min(std::max(one_minus_s * v, 0.0f), 1.0f);
    // Bitwise | (not ||): no branches, so the loop if-converts and vectorises.
    const bool s0 = sector == 0.0f, s1 = sector == 1.0f, s2 = sector == 2.0f;
    const bool s3 = sector == 3.0f, s4 = sector == 4.0f, s5 = sector == 5.0f;
    float ro = s4 ? t : p;  // one select a statement: chained ?: stays a branch
    ro = s1 ? q : ro;
    ro = (s0 | s5) ? v : ro;
    float go = s3 ? q : p;
    go = s0 ? t : go;
    go = (s1 | s2) ? v : go;
    float bo = s5 ? q : p;
    bo = s2 ? t : bo;
    bo = (s3 | s4) ? v : bo;
    r[x] = ro * kScale;
    g[x] = go * kScale;
    b[x] = bo * kScale;
  }
}

void run_hue(uint8_t* row, int w, double hue_shift, ColorScratch& s) {
  float* r = s.f[0].data();
  float* g = s.f[1].data();
  float* b = s.f[2].data();
  split_row(row, w, r, g, b, s.bytes.data());
  hue_planar(r, g, b, w, static_cast<float>(hue_shift));
  merge_row(r, g, b, w, row, s.bytes.data());
}

// adjust_sharpness_image on one interior row: blend of the pixel with the
// 3x3 [1 1 1; 1 5 1; 1 1 1] / 13 smoothing rounded to an integer (exact here:
// S / 13 is never a tie), weight 1 - factor on the smoothing.
STOKER_MULTIVERSION
void sharpen_row(const uint8_t* above, const uint8_t* mid, const uint8_t* below, int w, int ch,
                 double factor, uint8_t* out) {
  const int n = w * ch;
  std::memcpy(out, mid, static_cast<size_t>(ch));  // the first and last columns are kept
  std::memcpy(out + n - ch, mid + n - ch, static_cast<size_t>(ch));
  const float alpha = static_cast<float>(1.0 - factor);
  for (int i = ch; i < n - ch; ++i) {
    const int col = above[i] + mid[i] + below[i];
    const int col_l = above[i - ch] + mid[i - ch] + below[i - ch];
    const int col_r = above[i + ch] + mid[i + ch] + below[i + ch];
    const int sum = col_l + col + col_r + 4 * mid[i];
    // round(sum / 13) without a division: sum <= 13 * 255, (2 sum + 13) / 26
    // equals (sum * 2 + 13) * 20165 >> 19 over that range.
    const int blur = ((2 * sum + 13) * 20165) >> 19;
    const float c = mid[i];
    out[i] = trunc_u8(c + alpha * (static_cast<float>(blur) - c));
  }
}

STOKER_MULTIVERSION
int32_t gray_sum_row(const uint8_t* row, int w) {
  int32_t sum = 0;  // w * 255 fits
  for (int x = 0; x < w; ++x) {
    const uint8_t* p = row + 3 * x;
    const float gray = static_cast<float>(p[0]) * kGrayR + static_cast<float>(p[1]) * kGrayG +
                       static_cast<float>(p[2]) * kGrayB;
    sum += static_cast<int32_t>(gray);  // floor: gray >= 0
  }
  return sum;
}

void gather(const uint8_t* row, int w, int ch, Stats& st) {
  if (st.want_gray) {
    if (ch == 1) {
      int64_t sum = 0;
      for (int x = 0; x < w; ++x) sum += row[x];
      st.gray_sum += sum;
    } else {
      st.gray_sum += gray_sum_row(row, w);
    }
  }
  if (st.want_hist) {
    if (ch == 1) {
      for (int x = 0; x < w; ++x) ++st.hist[0][row[x]];
    } else {
      // Neighbouring pixels often have equal values: counting even and odd pixels
      // in separate tables keeps each increment from waiting on the one before
      // (a store forwarded to the next load of the same counter).
      uint32_t(*a)[256] = st.hist;
      uint32_t(*b)[256] = st.hist_odd;
      int x = 0;
      for (; x + 2 <= w; x += 2) {
        const uint8_t* p = row + 3 * x;
        ++a[0][p[0]];
        ++a[1][p[1]];
        ++a[2][p[2]];
        ++b[0][p[3]];
        ++b[1][p[4]];
        ++b[2][p[5]];
      }
      for (; x < w; ++x) {
        ++a[0][row[3 * x]];
        ++a[1][row[3 * x + 1]];
        ++a[2][row[3 * x + 2]];
      }
    }
  }
}

void run_kernels(const std::vector<Kernel>& ks, uint8_t* row, int w, int ch, ColorScratch& s) {
  for (const Kernel& k : ks) {
    switch (k.kind) {
      case ColorKind::kBrightness:
        run_table(k, row, w, ch);
        break;
      case ColorKind::kSaturation:
        run_saturation(row, w, k.value, s);
        break;
      case ColorKind::kHue:
        run_hue(row, w, k.value, s);
        break;
      case ColorKind::kGrayscale:
        run_grayscale(row, w);
        break;
      default:
        break;
    }
  }
}

}  // namespace

const char* color_kind_name(ColorKind k) {
  switch (k) {
    case ColorKind::kBrightness:
      return "brightness";
    case ColorKind::kContrast:
      return "contrast";
    case ColorKind::kSaturation:
      return "saturation";
    case ColorKind::kHue:
      return "hue";
    case ColorKind::kGrayscale:
      return "grayscale";
    case ColorKind::kPosterize:
      return "posterize";
    case ColorKind::kSolarize:
      return "solarize";
    case ColorKind::kInvert:
      return "invert";
    case ColorKind::kEqualize:
      return "equalize";
    case ColorKind::kAutocontrast:
      return "autocontrast";
    case ColorKind::kSharpness:
      return "sharpness";
  }
  return "?";
}

void apply_color_steps(Pixels img, const ColorStep* steps, size_t n) {
  STOKER_CHECK(img.channels == 1 || img.channels == 3, UsageError,
               "colour ops need 1 or 3 channels, got ", img.channels);
  if (img.empty() || n == 0) return;
  ColorScratch& s = color_scratch();
  const int w = img.width, h = img.height, ch = img.channels;
  plan_passes(steps, n, ch, w, h, s.passes);
  const size_t row_bytes = img.row_bytes();
  for (auto& f : s.f)
    if (f.size() < static_cast<size_t>(w)) f.resize(w);
  if (s.bytes.size() < static_cast<size_t>(w) * 3) s.bytes.resize(static_cast<size_t>(w) * 3);
  thread_local std::vector<Kernel> kernels;
  Stats& st = s.stats;
  Stats prev;  // the statistics gathered by the previous pass
  for (const Pass& p : s.passes) {
    build_kernels(p, steps, ch, prev, kernels);
    st.want_gray = p.gather_gray;
    st.want_hist = p.gather_hist;
    st.gray_sum = 0;
    st.pixels = static_cast<int64_t>(w) * h;
    if (st.want_hist) {
      std::memset(st.hist, 0, sizeof st.hist);
      std::memset(st.hist_odd, 0, sizeof st.hist_odd);
    }
    if (p.read_only) {
      for (int y = 0; y < h; ++y) gather(img.row(y), w, ch, st);
    } else if (!p.sharpen) {
      for (int y = 0; y < h; ++y) {
        uint8_t* row = img.row(y);
        run_kernels(kernels, row, w, ch, s);
        gather(row, w, ch, st);
      }
    } else {
      for (auto& r : s.ring) r.resize(row_bytes);
      s.out_row.resize(row_bytes);
      for (int y = 0; y < h; ++y) {
        uint8_t* row = img.row(y);
        std::swap(s.ring[0], s.ring[1]);                // ring[0]: the original row y - 1
        std::memcpy(s.ring[1].data(), row, row_bytes);  // ring[1]: the original row y
        if (y == 0 || y == h - 1) {
          // torchvision only sharpens the interior; the border keeps its values
        } else {
          sharpen_row(s.ring[0].data(), s.ring[1].data(), img.row(y + 1), w, ch, p.sharp_factor,
                      s.out_row.data());
          std::memcpy(row, s.out_row.data(), row_bytes);
        }
        run_kernels(kernels, row, w, ch, s);
        gather(row, w, ch, st);
      }
    }
    if (st.want_hist)
      for (int c = 0; c < 3; ++c)
        for (int v = 0; v < 256; ++v) st.hist[c][v] += st.hist_odd[c][v];
    prev.gray_sum = st.gray_sum;
    prev.pixels = st.pixels;
    if (st.want_hist) std::memcpy(prev.hist, st.hist, sizeof st.hist);
  }
}

namespace detail {

namespace {

void lookup_bytes_scalar(const uint8_t* const* luts, int tables, uint8_t* p, size_t n) {
  if (tables == 1) {
    const uint8_t* l = luts[0];
    for (size_t i = 0; i < n; ++i) p[i] = l[p[i]];
    return;
  }
  const uint8_t* l0 = luts[0];
  const uint8_t* l1 = luts[1];
  const uint8_t* l2 = luts[2];
  for (size_t i = 0; i + 3 <= n; i += 3) {
    p[i] = l0[p[i]];
    p[i + 1] = l1[p[i + 1]];
    p[i + 2] = l2[p[i + 2]];
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(STOKER_NO_MULTIVERSION)
#define STOKER_LOOKUP_VBMI 1

// NOTE [ Byte tables with VBMI ]
// A table pass (brightness, contrast, posterize, solarize, equalize, ... and their
// compositions) is one load a byte done one byte at a time: 45 us on a 224x224 RGB
// crop, most of a RandAugment colour op's cost; 5.4 us this way. AVX-512 VBMI's
// vpermi2b looks 64 bytes up in a 128-byte table at once (index bits 0-6); the
// 256-entry table is two such halves, picked by each byte's top bit. Three
// interleaved channels (a table each) take three lookups and two blends, by the
// channel of each byte: a 64-byte block starts one channel later than the one
// before it (64 = 1 mod 3). The same bytes as the scalar loop; picked at run time.
#define STOKER_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

STOKER_VBMI inline __m512i lookup64(const __m512i* t, __m512i x) {
  const __m512i lo = _mm512_permutex2var_epi8(t[0], x, t[1]);
  const __m512i hi = _mm512_permutex2var_epi8(t[2], x, t[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

STOKER_VBMI void lookup_bytes_vbmi(const uint8_t* const* luts, int tables, uint8_t* p, size_t n) {
  __m512i t[3][4];
  for (int c = 0; c < tables; ++c)
    for (int q = 0; q < 4; ++q) t[c][q] = _mm512_loadu_si512(luts[c] + 64 * q);
  // every[r]: bits j of a block with j % 3 == r; the bytes of channel c in a block whose
  // first byte is channel `phase` are every[(c - phase) mod 3]
  constexpr __mmask64 every[3] = {0x9249249249249249ull, 0x2492492492492492ull,
                                  0x4924924924924924ull};
  int phase = 0;
  for (size_t i = 0; i < n; i += 64) {
    const size_t left = n - i;
    const __mmask64 k = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    const __m512i x = _mm512_maskz_loadu_epi8(k, p + i);
    __m512i r = lookup64(t[0], x);
    if (tables == 3) {
      r = _mm512_mask_blend_epi8(every[(4 - phase) % 3], r, lookup64(t[1], x));
      r = _mm512_mask_blend_epi8(every[(5 - phase) % 3], r, lookup64(t[2], x));
      phase = phase == 2 ? 0 : phase + 1;
    }
    _mm512_mask_storeu_epi8(p + i, k, r);
  }
}

bool has_vbmi() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vbmi");
  return yes;
}
#endif

}  // namespace

void lookup_bytes(const uint8_t* const* luts, int tables, uint8_t* p, size_t n, bool simd) {
#ifdef STOKER_LOOKUP_VBMI
  if (simd && has_vbmi()) return lookup_bytes_vbmi(luts, tables, p, n);
#endif
  lookup_bytes_scalar(luts, tables, p, n);
}

bool lookup_bytes_has_simd() {
#ifdef STOKER_LOOKUP_VBMI
  return has_vbmi();
#else
  return false;
#endif
}

int color_pass_count(const ColorStep* steps, size_t n, int channels) {
  std::vector<Pass> passes;
  plan_passes(steps, n, channels, 64, 64, passes);
  return static_cast<int>(passes.size());
}

}  // namespace detail

}  // namespace stoker
