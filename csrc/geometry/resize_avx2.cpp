// The resize's inner loops for AVX2; only called after a CPU check
// (resize.cpp). This file is built with -mavx2, so it uses nothing from the
// standard library: an inline function instantiated here could be the copy
// the linker keeps for the whole program, and run on a CPU without AVX2.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace stoker {
namespace detail {

// One row of the horizontal pass, four output pixels at a time: pixels i and
// i+1 share a register (one 128-bit lane each), as do i+2 and i+3. Output
// pixel i reads `groups` blocks of four source pixels from pixel start[i]; a
// block's 12 bytes are shuffled twice into int16s, [R0 R1 G0 G1 B0 B1 0 0]
// and [R2 R3 G2 G3 B2 B3 0 0], so that a madd with the weights laid out the
// same way sums each channel over two taps, and the two madds land their sums
// in the same lanes. wvec holds, per pixel pair and block, those two weight
// vectors (32 int16, see make_taps); start and wvec are padded to a multiple
// of four pixels. Reads 16 bytes at each block (4 past its 12): the caller
// guarantees them. Output pixel i goes to out + i * step (step -3 mirrors).
namespace {

// Sum of one output pixel pair (see resize_h_avx2) over G blocks (g < 0: `groups`).
template <int G>
inline __m256i pair_sum(const uint8_t* p0, const uint8_t* p1, const int16_t* w, int groups,
                        __m256i shuf_a, __m256i shuf_b) {
  const int n = G > 0 ? G : groups;
  __m256i a = _mm256_setzero_si256();
  for (int g = 0; g < n; ++g, w += 32) {
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 12 * g))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + 12 * g)), 1);
    const __m256i wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(v, shuf_a), wa));
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(v, shuf_b), wb));
  }
  return a;
}

template <int G>
void h_row(const uint8_t* row, const int32_t* start, const int16_t* wvec, int groups, int precision,
           uint8_t* out, ptrdiff_t step, int out_w) {
  const __m256i shuf_a = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i shuf_b =
      _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9, -1, 7,
                       -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
  // Four RGB0 pixels to twelve bytes, in order or reversed.
  const bool mirror = step < 0;
  const __m128i pack = mirror
                           ? _mm_setr_epi8(12, 13, 14, 8, 9, 10, 4, 5, 6, 0, 1, 2, -1, -1, -1, -1)
                           : _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i half = _mm256_set1_epi32(1 << (precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(precision);
  const ptrdiff_t wstep = static_cast<ptrdiff_t>(G > 0 ? G : groups) * 32;
  for (int i = 0; i < out_w; i += 4) {
    const int16_t* w = wvec + (i / 2) * wstep;
    __m256i a0 =
        pair_sum<G>(row + 3 * static_cast<ptrdiff_t>(start[i]),
                    row + 3 * static_cast<ptrdiff_t>(start[i + 1]), w, groups, shuf_a, shuf_b);
    __m256i a1 = pair_sum<G>(row + 3 * static_cast<ptrdiff_t>(start[i + 2]),
                             row + 3 * static_cast<ptrdiff_t>(start[i + 3]), w + wstep, groups,
                             shuf_a, shuf_b);
    a0 = _mm256_sra_epi32(_mm256_add_epi32(a0, half), shift);
    a1 = _mm256_sra_epi32(_mm256_add_epi32(a1, half), shift);
    // a0 = [i | i+1], a1 = [i+2 | i+3], each pixel R G B 0 in int32; packed,
    // lane 0 holds pixels i, i+2 and lane 1 pixels i+1, i+3 (four bytes each).
    const __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_setzero_si256());
    const __m128i q = _mm_shuffle_epi8(
        _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)), pack);
    const int n = out_w - i < 4 ? out_w - i : 4;
    if (n == 4) {
      uint8_t* o = mirror ? out + (i + 3) * step : out + i * step;
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o), q);
      const uint32_t tail = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(q, 8)));
      __builtin_memcpy(o + 8, &tail, 4);
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), q);
      // Reversed, the first valid pixel sits last among the four.
      const uint8_t* src = mirror ? tmp + 3 * (4 - n) : tmp;
      uint8_t* o = mirror ? out + (i + n - 1) * step : out + i * step;
      for (int k = 0; k < 3 * n; ++k) o[k] = src[k];
    }
  }
}

}  // namespace

void resize_h_avx2(const uint8_t* row, const int32_t* start, const int16_t* wvec, int groups,
                   int precision, uint8_t* out, ptrdiff_t step, int out_w) {
  switch (groups) {
    case 1:
      h_row<1>(row, start, wvec, groups, precision, out, step, out_w);
      break;
    case 2:
      h_row<2>(row, start, wvec, groups, precision, out, step, out_w);
      break;
    default:
      h_row<0>(row, start, wvec, groups, precision, out, step, out_w);
      break;
  }
}

// One row of the vertical pass: out[i] = sum_k w[k] * base[k * stride + i],
// rounded and clamped, for i < len. Taps go in pairs: the bytes of rows k and
// k+1 are interleaved and widened, so one madd applies both weights. Returns
// how many leading bytes it wrote (a multiple of 32); the caller does the rest.
int resize_v_avx2(const int32_t* w, int n, const uint8_t* base, size_t stride, int precision,
                  uint8_t* out, int len) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i half = _mm256_set1_epi32(1 << (precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(precision);
  int i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i acc0 = zero, acc1 = zero, acc2 = zero, acc3 = zero;
    for (int k = 0; k < n; k += 2) {
      const uint8_t* p = base + static_cast<size_t>(k) * stride + i;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const bool pair = k + 1 < n;
      const __m256i b =
          pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + stride)) : zero;
      const uint32_t w0 = static_cast<uint16_t>(w[k]);
      const uint32_t w1 = pair ? static_cast<uint16_t>(w[k + 1]) : 0u;
      const __m256i wp = _mm256_set1_epi32(static_cast<int>(w0 | (w1 << 16)));
      const __m256i lo = _mm256_unpacklo_epi8(a, b);  // a0 b0 a1 b1 ... per 128-bit lane
      const __m256i hi = _mm256_unpackhi_epi8(a, b);
      acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), wp));
      acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), wp));
      acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), wp));
      acc3 = _mm256_add_epi32(acc3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), wp));
    }
    acc0 = _mm256_sra_epi32(_mm256_add_epi32(acc0, half), shift);
    acc1 = _mm256_sra_epi32(_mm256_add_epi32(acc1, half), shift);
    acc2 = _mm256_sra_epi32(_mm256_add_epi32(acc2, half), shift);
    acc3 = _mm256_sra_epi32(_mm256_add_epi32(acc3, half), shift);
    // The unpacks and packs both work within 128-bit lanes, so the bytes come
    // back in their original order.
    const __m256i r =
        _mm256_packus_epi16(_mm256_packs_epi32(acc0, acc1), _mm256_packs_epi32(acc2, acc3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), r);
  }
  return i;
}

}  // namespace detail
}  // namespace stoker

#endif  // __x86_64__
