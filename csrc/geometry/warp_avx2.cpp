// The bilinear warp's inner loop for AVX2; only called after a CPU check
// (warp.cpp). Built with -mavx2 and no FMA, so every product and sum rounds
// as the portable loop's do; like resize_avx2.cpp it uses nothing from the
// standard library (an inline function instantiated here could be the copy
// the linker keeps, and run on a CPU without AVX2).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace stoker {
namespace detail {

namespace {

// The source point of 4 output pixels from column j: x0 + dx * j - 0.5, as
// Row::at computes it (a product, a sum, a difference, each rounded).
inline __m256d coords(double a0, double da, __m256d j) {
  return _mm256_sub_pd(_mm256_add_pd(_mm256_set1_pd(a0), _mm256_mul_pd(_mm256_set1_pd(da), j)),
                       _mm256_set1_pd(0.5));
}

// 8 int32 floor indices and 8 float fractions from two halves of 4 doubles
// (all >= 0: truncation is the floor).
inline void split(__m256d lo, __m256d hi, __m256i* idx, __m256* frac) {
  const __m128i il = _mm256_cvttpd_epi32(lo), ih = _mm256_cvttpd_epi32(hi);
  const __m128 fl = _mm256_cvtpd_ps(_mm256_sub_pd(lo, _mm256_cvtepi32_pd(il)));
  const __m128 fh = _mm256_cvtpd_ps(_mm256_sub_pd(hi, _mm256_cvtepi32_pd(ih)));
  *idx = _mm256_inserti128_si256(_mm256_castsi128_si256(il), ih, 1);
  *frac = _mm256_insertf128_ps(_mm256_castps128_ps256(fl), fh, 1);
}

inline __m256 channel(__m256i px, int shift) {
  return _mm256_cvtepi32_ps(
      _mm256_and_si256(_mm256_srli_epi32(px, shift), _mm256_set1_epi32(0xff)));
}

}  // namespace

// Output pixels [j0, j1) of one row of warp_bilinear<3> (warp.cpp), 8 at a
// time, where all four taps of every pixel are inside the source and the
// right-hand taps leave a byte to spare on their row (each tap is read as 4
// bytes). Same float operations in the same order as the portable loop, so
// the same bytes. Returns how many pixels it wrote (a multiple of 8).
int warp_bilinear_row_avx2(const uint8_t* src, size_t stride, double x0, double dx, double y0,
                           double dy, int j0, int j1, const float* fill, uint8_t* out) {
  const __m256d step4 = _mm256_set_pd(3, 2, 1, 0);
  const __m256i stride_v = _mm256_set1_epi32(static_cast<int>(stride));
  const __m256i three = _mm256_set1_epi32(3);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 lo = _mm256_set1_ps(-1.0f), hi = _mm256_set1_ps(256.0f);
  const int* base = reinterpret_cast<const int*>(src);
  const __m256 fv[3] = {_mm256_set1_ps(fill ? fill[0] : 0.0f),
                        _mm256_set1_ps(fill ? fill[1] : 0.0f),
                        _mm256_set1_ps(fill ? fill[2] : 0.0f)};
  int j = j0;
  for (; j + 8 <= j1; j += 8) {
    const __m256d ja = _mm256_add_pd(_mm256_set1_pd(static_cast<double>(j)), step4);
    const __m256d jb = _mm256_add_pd(ja, _mm256_set1_pd(4.0));
    __m256i xi, yi;
    __m256 ax, ay;
    split(coords(x0, dx, ja), coords(x0, dx, jb), &xi, &ax);
    split(coords(y0, dy, ja), coords(y0, dy, jb), &yi, &ay);
    const __m256 bx = _mm256_sub_ps(one, ax), by = _mm256_sub_ps(one, ay);
    const __m256 w00 = _mm256_mul_ps(bx, by), w01 = _mm256_mul_ps(ax, by);
    const __m256 w10 = _mm256_mul_ps(bx, ay), w11 = _mm256_mul_ps(ax, ay);
    const __m256 m = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(w00, w01), w10), w11);
    const __m256i off =
        _mm256_add_epi32(_mm256_mullo_epi32(yi, stride_v), _mm256_mullo_epi32(xi, three));
    const __m256i p00 = _mm256_i32gather_epi32(base, off, 1);
    const __m256i p01 = _mm256_i32gather_epi32(base, _mm256_add_epi32(off, three), 1);
    const __m256i off1 = _mm256_add_epi32(off, stride_v);
    const __m256i p10 = _mm256_i32gather_epi32(base, off1, 1);
    const __m256i p11 = _mm256_i32gather_epi32(base, _mm256_add_epi32(off1, three), 1);
    __m256i q[3];
    for (int c = 0; c < 3; ++c) {
      const int s = 8 * c;
      __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(w00, channel(p00, s)),
                                                           _mm256_mul_ps(w01, channel(p01, s))),
                                             _mm256_mul_ps(w10, channel(p10, s))),
                               _mm256_mul_ps(w11, channel(p11, s)));
      if (fill) v = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, fv[c]), m), fv[c]);
      v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
      // Rounded half to even (the default mode), clamped to [0, 255].
      const __m256i r = _mm256_cvtps_epi32(v);
      q[c] = _mm256_min_epi32(_mm256_max_epi32(r, _mm256_setzero_si256()), _mm256_set1_epi32(255));
    }
    const __m256i rgb = _mm256_or_si256(
        q[0], _mm256_or_si256(_mm256_slli_epi32(q[1], 8), _mm256_slli_epi32(q[2], 16)));
    // Each pixel's 4 bytes at 3-byte steps, the next one overwriting the
    // spare byte; the last one's 3 bytes alone.
    alignas(32) uint32_t px[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(px), rgb);
    uint8_t* o = out + static_cast<size_t>(j) * 3;
    for (int k = 0; k < 7; ++k) __builtin_memcpy(o + 3 * k, &px[k], 4);
    __builtin_memcpy(o + 21, &px[7], 3);
  }
  return j - j0;
}

}  // namespace detail
}  // namespace stoker

#endif  // __x86_64__
