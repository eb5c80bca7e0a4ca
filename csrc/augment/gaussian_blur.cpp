#include "augment/gaussian_blur.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/detail/multiversion.h"
#include "common/detail/rounding.h"
#include "common/error.h"
#include "geometry/padding.h"

namespace stoker {

namespace {

struct BlurScratch {
  std::vector<float> padded;  // one source row, reflect-padded, as floats
  std::vector<float> ring;    // ky horizontally blurred rows
  std::vector<int> ring_row;  // which source row each ring slot holds
  std::vector<float> acc;
};

BlurScratch& blur_scratch() {
  thread_local BlurScratch s;
  return s;
}

STOKER_MULTIVERSION
void horizontal(const float* padded, int n, int ch, const float* k, int size, float* out) {
  for (int i = 0; i < n; ++i) out[i] = 0;
  for (int t = 0; t < size; ++t) {
    const float wt = k[t];
    const float* p = padded + t * ch;
    for (int i = 0; i < n; ++i) out[i] += wt * p[i];
  }
}

STOKER_MULTIVERSION
void vertical_add(const float* row, float wt, int n, float* acc) {
  for (int i = 0; i < n; ++i) acc[i] += wt * row[i];
}

// Rounded half to even; the weights sum to 1, so values stay in [0, 255].
STOKER_MULTIVERSION
void store_row(const float* acc, int n, uint8_t* out) {
  for (int i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(detail::round_even(acc[i]));
}

}  // namespace

void gaussian_kernel(int size, float sigma, float* out) {
  // torchvision: softmax(-(x / sigma)^2) over x = linspace(-lim, lim, size),
  // lim = (size - 1) / (2 sqrt 2): exp(-d^2 / (2 sigma^2)) for offsets d.
  const double lim = (size - 1) / (2.0 * std::sqrt(2.0));
  auto term = [&](int i) {
    const double x = size == 1 ? 0.0 : -lim + 2.0 * lim * i / (size - 1);
    const double v = x / sigma;
    return std::exp(-v * v);
  };
  double sum = 0;
  for (int i = 0; i < size; ++i) sum += term(i);
  for (int i = 0; i < size; ++i) out[i] = static_cast<float>(term(i) / sum);
}

void gaussian_blur(Pixels img, int kx, int ky, float sx, float sy) {
  STOKER_CHECK(kx >= 1 && ky >= 1 && kx % 2 == 1 && ky % 2 == 1, UsageError,
               "gaussian_blur: kernel sizes must be odd and positive, got ", kx, "x", ky);
  STOKER_CHECK(sx > 0 && sy > 0, UsageError, "gaussian_blur: sigma must be positive");
  STOKER_CHECK(img.channels == 1 || img.channels == 3, UsageError,
               "gaussian_blur: 1 or 3 channels");
  if (img.empty()) return;
  BlurScratch& s = blur_scratch();
  const int w = img.width, h = img.height, ch = img.channels;
  const int rx = kx / 2, ry = ky / 2;
  const int n = w * ch;
  float kxw[64], kyw[64];
  std::vector<float> kx_big, ky_big;
  float* kxp = kxw;
  float* kyp = kyw;
  if (kx > 64) {
    kx_big.resize(kx);
    kxp = kx_big.data();
  }
  if (ky > 64) {
    ky_big.resize(ky);
    kyp = ky_big.data();
  }
  gaussian_kernel(kx, sx, kxp);
  gaussian_kernel(ky, sy, kyp);
  s.padded.resize(static_cast<size_t>(w + 2 * rx) * ch);
  s.ring.resize(static_cast<size_t>(ky) * n);
  s.ring_row.assign(ky, -1);
  s.acc.resize(n);
  // Source row r, blurred horizontally, lands in ring slot r mod ky. Output
  // row y needs rows y - ry .. y + ry (reflected back into the image, so
  // still within that window when ry < h); each is blurred from the original
  // pixels before any output row at or below it is written.
  auto load = [&](int r) {
    const int slot = r % ky;
    if (s.ring_row[slot] == r) return;
    const uint8_t* src = img.row(r);
    float* pad = s.padded.data();
    for (int j = -rx; j < w + rx; ++j) {
      const int sj = pad_source_index(j, w, PadMode::kReflect);
      for (int c = 0; c < ch; ++c) pad[(j + rx) * ch + c] = src[sj * ch + c];
    }
    horizontal(pad, n, ch, kxp, kx, s.ring.data() + static_cast<size_t>(slot) * n);
    s.ring_row[slot] = r;
  };
  const bool ring_ok = ry < h;  // every reflected row stays within y +- ry
  std::vector<float> all;       // tiny images: every row blurred first
  if (!ring_ok) {
    all.resize(static_cast<size_t>(h) * n);
    for (int r = 0; r < h; ++r) {
      s.ring_row.assign(ky, -1);
      load(r);
      std::copy_n(s.ring.data() + static_cast<size_t>(r % ky) * n, n,
                  all.data() + static_cast<size_t>(r) * n);
    }
  } else {
    for (int r = 0; r <= std::min(ry, h - 1); ++r) load(r);
  }
  for (int y = 0; y < h; ++y) {
    if (ring_ok && y + ry < h) load(y + ry);
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    for (int t = 0; t < ky; ++t) {
      const int r = pad_source_index(y - ry + t, h, PadMode::kReflect);
      const float* row = ring_ok ? s.ring.data() + static_cast<size_t>(r % ky) * n
                                 : all.data() + static_cast<size_t>(r) * n;
      vertical_add(row, kyp[t], n, s.acc.data());
    }
    store_row(s.acc.data(), n, img.row(y));
  }
}

}  // namespace stoker
