#include "geometry/crop_params.h"

#include <algorithm>
#include <cmath>

namespace stoker {

namespace {
// Python's round() on the values torchvision rounds: half to even.
int round_half_even(double v) { return static_cast<int>(std::nearbyint(v)); }
}  // namespace

PixelRect random_resized_crop_rect(int w, int h, double scale_lo, double scale_hi,
                                   double log_ratio_lo, double log_ratio_hi,
                                   detail::SplitMix64& rng) {
  const double area = static_cast<double>(w) * h;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale_lo, scale_hi);
    const double aspect = std::exp(rng.uniform(log_ratio_lo, log_ratio_hi));
    const int cw = round_half_even(std::sqrt(target * aspect));
    const int ch = round_half_even(std::sqrt(target / aspect));
    if (cw > 0 && ch > 0 && cw <= w && ch <= h) {
      const int top = static_cast<int>(rng.randint(0, h - ch));
      const int left = static_cast<int>(rng.randint(0, w - cw));
      return {left, top, cw, ch};
    }
  }
  const double in_ratio = static_cast<double>(w) / h;
  const double rlo = std::exp(log_ratio_lo), rhi = std::exp(log_ratio_hi);
  int cw = w, ch = h;
  if (in_ratio < rlo) {
    ch = std::clamp(round_half_even(cw / rlo), 1, h);
  } else if (in_ratio > rhi) {
    cw = std::clamp(round_half_even(ch * rhi), 1, w);
  }
  return {(w - cw) / 2, (h - ch) / 2, cw, ch};
}

PixelRect center_crop_rect(int w, int h, int crop_w, int crop_h) {
  auto offset = [](int size, int crop) {
    return crop > size ? -((crop - size) / 2) : round_half_even((size - crop) / 2.0);
  };
  return {offset(w, crop_w), offset(h, crop_h), crop_w, crop_h};
}

void shorter_side_size(int h, int w, int size, int* out_h, int* out_w) {
  if (w <= h) {
    *out_w = size;
    *out_h = static_cast<int>(static_cast<int64_t>(size) * h / w);
  } else {
    *out_h = size;
    *out_w = static_cast<int>(static_cast<int64_t>(size) * w / h);
  }
}

}  // namespace stoker
