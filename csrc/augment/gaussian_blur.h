// GaussianBlur as torchvision's gaussian_blur_image on uint8: kernel weights
// exp(-x^2 / (2 sigma^2)) normalised, reflect padding, float32 arithmetic,
// rounded half to even. Separable here (two 1-D passes, torchvision runs the
// 2-D outer-product kernel), so sums round differently: outputs differ by at
// most one level.
#pragma once

#include "codecs/pixels.h"

namespace stoker {

/// Blurs `img` (1 or 3 channels) in place with kernel sizes kx, ky (odd,
/// >= 1) and standard deviations sx, sy (> 0). Thread-local scratch: no
/// allocation once warm.
void gaussian_blur(Pixels img, int kx, int ky, float sx, float sy);

/// The normalised 1-D kernel of `size` taps (float32 as torchvision computes it).
void gaussian_kernel(int size, float sigma, float* out);

}  // namespace stoker
