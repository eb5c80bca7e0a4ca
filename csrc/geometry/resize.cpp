#include "geometry/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/cpu.h"

namespace stoker {

namespace detail {
#if defined(__x86_64__)
// resize_avx2.cpp, built with -mavx2.
void resize_h_avx2(const uint8_t* row, const int32_t* start, const int16_t* wvec, int groups,
                   int precision, uint8_t* out, ptrdiff_t step, int out_w);
int resize_v_avx2(const int32_t* w, int n, const uint8_t* base, size_t stride, int precision,
                  uint8_t* out, int len);
#endif
}  // namespace detail

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
  // When the widest window still fits inside [lo, hi), windows are moved so
  // that all have its tap count (zero weights pad them): that count is `fixed`.
  int fixed = 0;
  int first = 0;  // [first, last): the input indices any window reads
  int last = 0;
  // For the AVX2 horizontal pass, when fixed: `groups` blocks of four taps
  // (see make_taps).
  int groups = 0;
  std::vector<int16_t> vec;
};

void finish_taps(Taps& t);

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
  // Windows hold at most `stride` taps (PIL's bound) but often fewer: about
  // twice the support, plus one.
  const int most = *std::max_element(t.count.begin(), t.count.end());
  if (hi - lo >= most) {
    for (int i = 0; i < out; ++i) {
      const int shift = std::max(0, t.start[i] + most - hi);
      if (shift > 0) {  // slide the window left; its weights move right
        int32_t* wi = &t.weights[static_cast<size_t>(i) * t.stride];
        std::copy_backward(wi, wi + t.count[i], wi + t.count[i] + shift);
        std::fill(wi, wi + shift, 0);
        t.start[i] -= shift;
      }
      t.count[i] = most;
    }
    t.fixed = most;
  } else {
    t.fixed = 0;
  }
  finish_taps(t);
}

// The range of input indices the windows read, and the AVX2 weights.
void finish_taps(Taps& t) {
  const int out = static_cast<int>(t.start.size());
  t.first = INT32_MAX;
  t.last = 0;
  for (int i = 0; i < out; ++i) {
    t.first = std::min(t.first, t.start[i]);
    t.last = std::max(t.last, t.start[i] + t.count[i]);
  }
  // The AVX2 horizontal pass's weights (resize_h_avx2), for outputs padded
  // to a multiple of four: per pair of outputs and block of four taps, two
  // vectors of 16 int16, [taps 0,1 of the first | of the second] and
  // [taps 2,3 of the first | of the second], each tap pair as
  // [w0 w1 w0 w1 w0 w1 0 0] to meet [R0 R1 G0 G1 B0 B1 0 0].
  t.groups = t.fixed > 0 ? (t.fixed + 3) / 4 : 0;
  const int padded = (out + 3) / 4 * 4;
  t.vec.assign(static_cast<size_t>(padded / 2) * t.groups * 32, 0);
  for (int i = 0; i < out && t.fixed > 0; ++i) {
    const int32_t* wi = &t.weights[static_cast<size_t>(i) * t.stride];
    int16_t* v = &t.vec[static_cast<size_t>(i / 2) * t.groups * 32 + (i % 2) * 8];
    for (int k = 0; k < t.fixed; ++k) {
      int16_t* h = v + (k / 4) * 32 + ((k % 4) / 2) * 16 + (k % 2);
      h[0] = h[2] = h[4] = static_cast<int16_t>(wi[k]);
    }
  }
}

// The taps of outputs [a, a + n) of `t`, as their own axis (same windows and
// weights, so the same output values).
void slice_taps(const Taps& t, int a, int n, Taps& out) {
  out.stride = t.stride;
  out.fixed = t.fixed;
  out.start.assign(t.start.begin() + a, t.start.begin() + a + n);
  out.count.assign(t.count.begin() + a, t.count.begin() + a + n);
  out.weights.assign(t.weights.begin() + static_cast<ptrdiff_t>(a) * t.stride,
                     t.weights.begin() + static_cast<ptrdiff_t>(a + n) * t.stride);
  finish_taps(out);
}

// The inner loops are compiled twice, for AVX2 and for the baseline, and the
// best is picked at load time (GCC/Clang function multi-versioning): the wheel
// stays portable, and the loops below stay fast where resize_avx2.cpp's are
// not used (no AVX2, the tails of rows).
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
// `row` holds input pixels from index `origin` on; output pixel i goes to
// out + i * step.
template <int N>
STOKER_MULTIVERSION void horizontal_row(const Taps& tx, const uint8_t* row, int origin,
                                        uint8_t* out, ptrdiff_t step, int out_w) {
  for (int i = 0; i < out_w; ++i) {
    const int32_t* wt = &tx.weights[static_cast<size_t>(i) * tx.stride];
    const uint8_t* p = row + static_cast<size_t>(tx.start[i] - origin) * 3;
    int32_t r = 0, g = 0, b = 0;
    const int n = N > 0 ? N : tx.count[i];
    for (int k = 0; k < n; ++k) {
      r += wt[k] * p[3 * k];
      g += wt[k] * p[3 * k + 1];
      b += wt[k] * p[3 * k + 2];
    }
    uint8_t* o = out + i * step;
    o[0] = to_u8(r);
    o[1] = to_u8(g);
    o[2] = to_u8(b);
  }
}

struct ResizeScratch {
  Taps tx, ty;
  std::vector<uint8_t> mid;
  std::vector<uint8_t> pad;      // a row copied with room for the vector loads' overreach
  std::vector<int32_t> shifted;  // tx.start less the mid buffer's origin
};

// tx.start less `origin`, padded to a multiple of four with its last value
// (for the AVX2 pass).
void shift_starts(const Taps& tx, int origin, std::vector<int32_t>& out) {
  const size_t n = tx.start.size();
  out.resize((n + 3) / 4 * 4);
  for (size_t i = 0; i < out.size(); ++i) out[i] = tx.start[std::min(i, n - 1)] - origin;
}

// One output row of the horizontal pass from `row`, which holds input pixels
// [origin, ...) and has `avail` readable bytes; mirrored if `mirror`.
void horizontal(const Taps& tx, const uint8_t* row, size_t avail, int origin, bool simd,
                ResizeScratch& s, uint8_t* out, int out_w, bool mirror) {
  const ptrdiff_t step = mirror ? -3 : 3;
  if (mirror) out += static_cast<size_t>(out_w - 1) * 3;
#if defined(__x86_64__)
  if (simd && tx.groups > 0) {
    // Block loads read 16 bytes from the start of each 12-byte block.
    const size_t need = static_cast<size_t>(tx.last - tx.fixed - origin) * 3 + 12 * tx.groups + 4;
    if (need > avail) {
      s.pad.assign(need, 0);
      std::memcpy(s.pad.data(), row, avail);
      row = s.pad.data();
    }
    detail::resize_h_avx2(row, s.shifted.data(), tx.vec.data(), tx.groups, kPrecision, out, step,
                          out_w);
    return;
  }
#endif
  switch (tx.fixed) {  // a fixed tap count unrolls the inner loop: 3x faster
    case 2:
      horizontal_row<2>(tx, row, origin, out, step, out_w);
      break;
    case 3:
      horizontal_row<3>(tx, row, origin, out, step, out_w);
      break;
    case 4:
      horizontal_row<4>(tx, row, origin, out, step, out_w);
      break;
    case 5:
      horizontal_row<5>(tx, row, origin, out, step, out_w);
      break;
    case 6:
      horizontal_row<6>(tx, row, origin, out, step, out_w);
      break;
    case 7:
      horizontal_row<7>(tx, row, origin, out, step, out_w);
      break;
    default:
      horizontal_row<0>(tx, row, origin, out, step, out_w);
      break;
  }
}

void vertical(const Taps& ty, int j, const uint8_t* base, size_t stride, bool simd, uint8_t* out,
              int len) {
  const int32_t* wt = &ty.weights[static_cast<size_t>(j) * ty.stride];
  int done = 0;
#if defined(__x86_64__)
  if (simd) done = detail::resize_v_avx2(wt, ty.count[j], base, stride, kPrecision, out, len);
#endif
  if (done < len) vertical_row(wt, ty.count[j], base + done, stride, out + done, len - done);
}

}  // namespace

ResizeBox whole_box(const RgbView& src) {
  return {0, 0, double(src.width), double(src.height), 0, 0, src.width, src.height};
}

namespace detail {

namespace {

// The cheaper pass order for these taps. Either order does one pass at each
// size in between: the horizontal pass over `rows` rows then the vertical at
// out_w, or the vertical over `cols` columns then the horizontal on out_h
// rows. Costs measured on the AVX2 loops: an output pixel of the horizontal
// pass costs about 7 units per block of four taps; a byte of the vertical pass
// 1 unit for its first pair of taps and half that for each further pair.
ResizeOrder choose_order(const Taps& tx, const Taps& ty) {
  const int out_w = static_cast<int>(tx.start.size()), out_h = static_cast<int>(ty.start.size());
  const int rows = ty.last - ty.first;  // input rows read
  const int cols = tx.last - tx.first;  // input columns read
  const double h = 7.0 * std::max(1, (std::max(tx.fixed, 1) + 3) / 4);
  const int ky = ty.fixed > 0 ? ty.fixed : ty.stride;
  const double v = 1.0 + 0.5 * ((ky + 1) / 2 - 1);
  const double hv = double(rows) * out_w * h + double(out_h) * out_w * 3 * v;
  const double vh = double(out_h) * cols * 3 * v + double(out_h) * out_w * h;
  return vh < hv ? ResizeOrder::kVerticalFirst : ResizeOrder::kHorizontalFirst;
}

// Both passes, in `order`, with the taps in s.tx and s.ty (their sizes the output's).
void run_passes(const RgbView& src, ResizeScratch& s, uint8_t* dst, size_t dst_stride, bool mirror,
                bool simd, ResizeOrder order) {
  const Taps& tx = s.tx;
  const Taps& ty = s.ty;
  const int out_w = static_cast<int>(tx.start.size()), out_h = static_cast<int>(ty.start.size());
  const int rows = ty.last - ty.first;
  const int cols = tx.last - tx.first;
  const uint8_t* src_end = src.data + static_cast<size_t>(src.height - 1) * src.stride +
                           static_cast<size_t>(src.width) * 3;
  if (order == ResizeOrder::kHorizontalFirst) {
    shift_starts(tx, 0, s.shifted);
    const size_t mid_stride = static_cast<size_t>(out_w) * 3;
    s.mid.resize(static_cast<size_t>(rows) * mid_stride);
    for (int y = ty.first; y < ty.last; ++y) {
      const uint8_t* row = src.data + static_cast<size_t>(y) * src.stride;
      horizontal(tx, row, static_cast<size_t>(src_end - row), 0, simd, s,
                 &s.mid[static_cast<size_t>(y - ty.first) * mid_stride], out_w, mirror);
    }
    for (int j = 0; j < out_h; ++j)
      vertical(ty, j, &s.mid[static_cast<size_t>(ty.start[j] - ty.first) * mid_stride], mid_stride,
               simd, dst + static_cast<size_t>(j) * dst_stride, static_cast<int>(mid_stride));
  } else {
    shift_starts(tx, tx.first, s.shifted);
    const size_t mid_stride = static_cast<size_t>(cols) * 3;
    s.mid.resize(static_cast<size_t>(out_h) * mid_stride);
    const uint8_t* col0 = src.data + static_cast<size_t>(tx.first) * 3;
    for (int j = 0; j < out_h; ++j)
      vertical(ty, j, col0 + static_cast<size_t>(ty.start[j]) * src.stride, src.stride, simd,
               &s.mid[static_cast<size_t>(j) * mid_stride], static_cast<int>(mid_stride));
    const uint8_t* mid_end = s.mid.data() + s.mid.size();
    for (int j = 0; j < out_h; ++j) {
      const uint8_t* row = &s.mid[static_cast<size_t>(j) * mid_stride];
      horizontal(tx, row, static_cast<size_t>(mid_end - row), tx.first, simd, s,
                 dst + static_cast<size_t>(j) * dst_stride, out_w, mirror);
    }
  }
}

ResizeScratch& resize_scratch() {
  thread_local ResizeScratch s;
  return s;
}

}  // namespace

void resize_rgb_impl(const RgbView& src, const ResizeBox& box, uint8_t* dst, size_t dst_stride,
                     int out_w, int out_h, bool mirror, bool simd, ResizeOrder order) {
  ResizeScratch& s = resize_scratch();
  make_taps(box.x, box.w, box.lo_x, box.hi_x, out_w, s.tx);
  make_taps(box.y, box.h, box.lo_y, box.hi_y, out_h, s.ty);
  if (order == ResizeOrder::kAuto) order = choose_order(s.tx, s.ty);
  run_passes(src, s, dst, dst_stride, mirror, simd, order);
}

}  // namespace detail

void resize_rgb_part(const RgbView& src, const ResizeBox& box, int out_w, int out_h,
                     const PixelRect& part, uint8_t* dst, size_t dst_stride) {
  if (part.w <= 0 || part.h <= 0) return;
  ResizeScratch& s = detail::resize_scratch();
  thread_local Taps full_x, full_y;
  make_taps(box.x, box.w, box.lo_x, box.hi_x, out_w, full_x);
  make_taps(box.y, box.h, box.lo_y, box.hi_y, out_h, full_y);
  // The whole resize's order: the other would round between the passes differently.
  const detail::ResizeOrder order = detail::choose_order(full_x, full_y);
  slice_taps(full_x, part.x, part.w, s.tx);
  slice_taps(full_y, part.y, part.h, s.ty);
  detail::run_passes(src, s, dst, dst_stride, false, cpu_has_avx2(), order);
}

void resize_rgb(const RgbView& src, const ResizeBox& box, uint8_t* dst, size_t dst_stride,
                int out_w, int out_h, bool mirror) {
  detail::resize_rgb_impl(src, box, dst, dst_stride, out_w, out_h, mirror, cpu_has_avx2(),
                          detail::ResizeOrder::kAuto);
}

}  // namespace stoker
