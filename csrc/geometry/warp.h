// Resampling an image through a plane transform: RandomRotation, RandomAffine,
// RandomPerspective and RandAugment's shears, translations and rotations.
// The definitions are torchvision's tensor kernels (grid_sample with
// align_corners=False and zero padding): output pixel (j, i) samples the
// source at the continuous point inv(j + 0.5, i + 0.5), i.e. at pixel index
// that point minus 0.5.
#pragma once

#include <cstdint>

#include "codecs/pixels.h"
#include "geometry/transform2d.h"

namespace stoker {

enum class Interpolation : uint8_t {
  kNearest,   ///< round half to even (torch's nearbyint); masks always use it
  kBilinear,  ///< the four neighbours; taps outside the source count as 0
};

/// Fills `dst` (same channel count as `src`) by sampling `src` through `inv`,
/// the map from output to source coordinates.
///
/// Outside the source: without `fill` (torchvision's fill=None) the sample is
/// the zero-padded interpolation; with it, torchvision's mask blend: nearest
/// takes `fill` where the point is outside, bilinear gives
/// m * sample + (1 - m) * fill, m the weight of the taps inside. Results are
/// rounded half to even. Thread-safe; no allocation.
void warp_pixels(const Pixels& src, const Pixels& dst, const Transform2D& inv, Interpolation interp,
                 const Fill* fill);

/// Nearest-neighbour sampling of elements of `src.channels` bytes (1, 2, 4 or
/// 8: a mask of uint8 to int64 class ids), copied whole; `fill` (one element)
/// outside the source. For masks, which are never interpolated.
void warp_nearest_elements(const Pixels& src, const Pixels& dst, const Transform2D& inv,
                           const uint8_t* fill);

}  // namespace stoker
