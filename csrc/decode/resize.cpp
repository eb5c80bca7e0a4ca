#include "decode/resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace stoker {

namespace {

// Filter taps of one axis: for each output index the first input index, the
// tap count, and `stride` normalised weights.
// Weights are fixed point with kPrecision fraction bits (PIL uses 22 in int32;
// 14 keeps products of 8-bit pixels and sums of taps well inside int32 and
// lets the compiler use 16x16->32-bit multiplies).
constexpr int kPrecision = 14;
constexpr int32_t kHalf = 1 << (kPrecision - 1);

inline uint8_t to_u8(int32_t acc) {
  // Round half up, then clamp (negative lobes cannot occur with the triangle,
  // but rounding of the weights may overshoot 255 by a hair).
  const int32_t v = (acc + kHalf) >> kPrecision;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

struct Taps {
  std::vector<int> start;
  std::vector<int> count;
  std::vector<int32_t> weights;
  int stride = 0;
  // When every window fits `stride` taps inside [lo, hi), windows are moved so
  // that all have exactly `stride` taps (zero weights pad them): fixed == stride.
  int fixed = 0;
};

// PIL's precompute_coeffs with the triangle filter, limited to [lo, hi).
void make_taps(double in0, double in_size, int lo, int hi, int out, Taps& t) {
  const double scale = in_size / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support is 1
  t.stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.start.resize(out);
  t.count.resize(out);
  t.weights.assign(static_cast<size_t>(out) * t.stride, 0);
  thread_local std::vector<double> w;
  w.resize(t.stride);
  const double inv = 1.0 / filter_scale;
  for (int i = 0; i < out; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int x0 = std::max(static_cast<int>(std::floor(center - support + 0.5)), lo);
    int x1 = std::min(static_cast<int>(std::floor(center + support + 0.5)), hi);
    x1 = std::min(x1, x0 + t.stride);
    if (x1 <= x0) {  // a window squeezed against the range's edge: take the nearest pixel
      x0 = std::clamp(static_cast<int>(center), lo, hi - 1);
      x1 = x0 + 1;
    }
    double sum = 0;
    for (int x = x0; x < x1; ++x) {
      const double d = std::abs((x - center + 0.5) * inv);
      const double v = d < 1.0 ? 1.0 - d : 0.0;
      w[x - x0] = v;
      sum += v;
    }
    int32_t* wi = &t.weights[static_cast<size_t>(i) * t.stride];
    if (sum > 0) {
      for (int x = x0; x < x1; ++x)
        wi[x - x0] = static_cast<int32_t>(std::lround(w[x - x0] / sum * (1 << kPrecision)));
    } else {
      wi[0] = 1 << kPrecision;
    }
    t.start[i] = x0;
    t.count[i] = x1 - x0;
  }
  if (hi - lo >= t.stride) {
    for (int i = 0; i < out; ++i) {
      const int shift = std::max(0, t.start[i] + t.stride - hi);
      if (shift > 0) {  // slide the window left; its weights move right
        int32_t* wi = &t.weights[static_cast<size_t>(i) * t.stride];
        std::copy_backward(wi, wi + t.count[i], wi + t.count[i] + shift);
        std::fill(wi, wi + shift, 0);
        t.start[i] -= shift;
      }
      t.count[i] = t.stride;
    }
    t.fixed = t.stride;
  } else {
    t.fixed = 0;
  }
}

// The inner loops are compiled twice, for AVX2 and for the baseline, and the
// best is picked at load time (GCC/Clang function multi-versioning): the wheel
// stays portable and AVX2 machines get 8-wide integer multiplies.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(STOKER_NO_MULTIVERSION)
#define STOKER_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define STOKER_MULTIVERSION
#endif

// One output row of the vertical pass: `n` taps over rows `stride` apart.
STOKER_MULTIVERSION
void vertical_row(const int32_t* wt, int n, const uint8_t* base, size_t stride, uint8_t* out,
                  int len) {
  // Row-major over the taps so that the inner loop is contiguous (vectorises).
  for (int i0 = 0; i0 < len; i0 += 512) {
    const int m = std::min(512, len - i0);
    int32_t acc[512];
    std::fill(acc, acc + m, 0);
    for (int k = 0; k < n; ++k) {
      const uint8_t* p = base + static_cast<size_t>(k) * stride + i0;
      const int32_t wk = wt[k];
      for (int i = 0; i < m; ++i) acc[i] += wk * p[i];
    }
    for (int i = 0; i < m; ++i) out[i0 + i] = to_u8(acc[i]);
  }
}

// One row of the horizontal pass; N > 0: every window has exactly N taps.
template <int N>
STOKER_MULTIVERSION void horizontal_row(const Taps& tx, const uint8_t* row, uint8_t* out, int out_w) {
  for (int i = 0; i < out_w; ++i) {
    const int32_t* wt = &tx.weights[static_cast<size_t>(i) * tx.stride];
    const uint8_t* p = row + static_cast<size_t>(tx.start[i]) * 3;
    int32_t r = 0, g = 0, b = 0;
    const int n = N > 0 ? N : tx.count[i];
    for (int k = 0; k < n; ++k) {
      r += wt[k] * p[3 * k];
      g += wt[k] * p[3 * k + 1];
      b += wt[k] * p[3 * k + 2];
    }
    out[3 * i] = to_u8(r);
    out[3 * i + 1] = to_u8(g);
    out[3 * i + 2] = to_u8(b);
  }
}


struct ResizeScratch {
  Taps tx, ty;
  std::vector<uint8_t> mid;
};

}  // namespace

ResizeBox whole_box(const RgbView& src) {
  return {0, 0, double(src.width), double(src.height), 0, 0, src.width, src.height};
}

void resize_rgb(const RgbView& src, const ResizeBox& box, uint8_t* dst, size_t dst_stride,
                int out_w, int out_h) {
  thread_local ResizeScratch s;
  make_taps(box.x, box.w, box.lo_x, box.hi_x, out_w, s.tx);
  make_taps(box.y, box.h, box.lo_y, box.hi_y, out_h, s.ty);
  // The horizontal pass covers only the rows the vertical taps read.
  const int row0 = s.ty.start.front();
  const int row1 = s.ty.start.back() + s.ty.count.back();
  const size_t mid_stride = static_cast<size_t>(out_w) * 3;
  s.mid.resize(static_cast<size_t>(row1 - row0) * mid_stride);
  const Taps& tx = s.tx;
  for (int y = row0; y < row1; ++y) {
    const uint8_t* row = src.data + static_cast<size_t>(y) * src.stride;
    uint8_t* out = &s.mid[static_cast<size_t>(y - row0) * mid_stride];
    switch (tx.fixed) {  // a fixed tap count unrolls the inner loop: 3x faster
      case 3: horizontal_row<3>(tx, row, out, out_w); break;
      case 5: horizontal_row<5>(tx, row, out, out_w); break;
      case 7: horizontal_row<7>(tx, row, out, out_w); break;
      case 9: horizontal_row<9>(tx, row, out, out_w); break;
      default: horizontal_row<0>(tx, row, out, out_w); break;
    }
  }
  const Taps& ty = s.ty;
  const int n_row = static_cast<int>(mid_stride);
  for (int j = 0; j < out_h; ++j) {
    const int32_t* wt = &ty.weights[static_cast<size_t>(j) * ty.stride];
    const uint8_t* base = &s.mid[static_cast<size_t>(ty.start[j] - row0) * mid_stride];
    uint8_t* out = dst + static_cast<size_t>(j) * dst_stride;
    vertical_row(wt, ty.count[j], base, mid_stride, out, n_row);
  }
}

}  // namespace stoker
