// RandomErasing (torchvision.transforms.v2.RandomErasing; timm's, on the
// normalised image, with value="random" as timm's mode="pixel"): a rectangle
// of the output tensor overwritten with a value or with N(0, 1) noise.
#pragma once

#include <cstdint>
#include <optional>

#include "codecs/image_info.h"
#include "common/dtype.h"
#include "geometry/detail/rng.h"

namespace stoker {

struct ErasingParams {
  double p = 0.5;
  double scale_lo = 0.02, scale_hi = 0.33;
  double log_ratio_lo = -1.2039728043259361;  ///< log(0.3)
  double log_ratio_hi = 1.1939224684724346;   ///< log(3.3)
};

/// torchvision's draw: with probability p, up to 10 tries of an area fraction
/// uniform in the scale and a log aspect ratio (h / w) uniform in the range,
/// h = round(sqrt(area * ratio)), w = round(sqrt(area / ratio)), kept when
/// h < height and w < width, at a uniform position. nullopt: nothing erased.
/// The p draw is always made, so later draws do not depend on its outcome.
std::optional<PixelRect> draw_erasing(const ErasingParams& p, int width, int height,
                                      detail::SplitMix64& rng);

/// Overwrites rectangle `r` of an image tensor at `out` (uint8, float32,
/// float16 or bfloat16; HWC, or CHW when `chw`) with `value` per channel, or
/// with standard normal noise per element drawn from `noise` when `value` is
/// null (float outputs only). uint8 values are rounded and clamped.
void erase_rect(void* out, DType dtype, bool chw, int height, int width, int channels,
                const PixelRect& r, const float* value, detail::SplitMix64* noise);

}  // namespace stoker
