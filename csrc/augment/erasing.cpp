#include "augment/erasing.h"

#include <cmath>

#include "common/detail/half.h"
#include "common/detail/rounding.h"
#include "common/error.h"
#include "geometry/detail/random_draws.h"

namespace stoker {

std::optional<PixelRect> draw_erasing(const ErasingParams& p, int width, int height,
                                      detail::SplitMix64& rng) {
  if (!(rng.uniform(0, 1) < p.p)) return std::nullopt;
  const double area = static_cast<double>(width) * height;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase = area * rng.uniform(p.scale_lo, p.scale_hi);
    const double ratio = std::exp(rng.uniform(p.log_ratio_lo, p.log_ratio_hi));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(erase * ratio)));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(erase / ratio)));
    if (!(h < height && w < width)) continue;
    const int top = static_cast<int>(rng.randint(0, height - h));
    const int left = static_cast<int>(rng.randint(0, width - w));
    return PixelRect{left, top, w, h};
  }
  return std::nullopt;
}

namespace {

template <typename T, typename Conv>
void fill_rect(T* out, bool chw, int height, int width, int channels, const PixelRect& r,
               const float* value, detail::SplitMix64* noise, Conv conv) {
  const size_t plane = static_cast<size_t>(height) * width;
  const detail::NormalZiggurat& normal = detail::normal_ziggurat();
  // The rectangle as contiguous runs of the tensor: a row of one channel
  // (CHW) or a row of interleaved pixels (HWC). Noise is drawn in memory order.
  const int runs_per_row = chw ? channels : 1;
  const int run = chw ? r.w : r.w * channels;
  for (int c = 0; c < runs_per_row; ++c)
    for (int y = r.y; y < r.y + r.h; ++y) {
      T* dst = chw ? out + c * plane + static_cast<size_t>(y) * width + r.x
                   : out + (static_cast<size_t>(y) * width + r.x) * channels;
      if (!value) {
        for (int i = 0; i < run; ++i) dst[i] = conv(static_cast<float>(normal(*noise)));
      } else if (chw) {
        const T v = conv(value[c]);
        for (int i = 0; i < run; ++i) dst[i] = v;
      } else {
        T v[3];
        for (int k = 0; k < channels; ++k) v[k] = conv(value[k]);
        for (int i = 0; i < run; i += channels)
          for (int k = 0; k < channels; ++k) dst[i + k] = v[k];
      }
    }
}

}  // namespace

void erase_rect(void* out, DType dtype, bool chw, int height, int width, int channels,
                const PixelRect& r, const float* value, detail::SplitMix64* noise) {
  STOKER_CHECK(r.x >= 0 && r.y >= 0 && r.x + r.w <= width && r.y + r.h <= height, UsageError,
               "erase_rect: the rectangle is outside the image");
  STOKER_CHECK(value || noise, UsageError, "erase_rect: a value or a noise stream is needed");
  switch (dtype) {
    case DType::kUInt8:
      STOKER_CHECK(value, UsageError, "RandomErasing(value='random') needs a float output");
      fill_rect(static_cast<uint8_t*>(out), chw, height, width, channels, r, value, noise,
                detail::round_u8);
      return;
    case DType::kFloat32:
      fill_rect(static_cast<float*>(out), chw, height, width, channels, r, value, noise,
                [](float v) { return v; });
      return;
    case DType::kFloat16:
      fill_rect(static_cast<uint16_t*>(out), chw, height, width, channels, r, value, noise,
                [](float v) { return detail::float_to_half(v); });
      return;
    case DType::kBFloat16:
      fill_rect(static_cast<uint16_t*>(out), chw, height, width, channels, r, value, noise,
                [](float v) { return detail::float_to_bfloat16(v); });
      return;
    default:
      STOKER_THROW(UsageError, "RandomErasing: unsupported output dtype ", dtype_name(dtype));
  }
}

}  // namespace stoker
