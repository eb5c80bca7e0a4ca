// The geometry rules of torchvision's crops, separate from pixels so they can
// be tested on their own.
#pragma once

#include "codecs/image_info.h"
#include "geometry/detail/rng.h"

namespace stoker {

/// torchvision's RandomResizedCrop.get_params: up to 10 tries of a crop with
/// area fraction uniform in [scale_lo, scale_hi] and log aspect ratio uniform
/// in [log_ratio_lo, log_ratio_hi] that fits the (w x h) image; otherwise the
/// central crop with the aspect ratio clamped to the range.
/// @return a rectangle inside the image, never empty for a non-empty image.
PixelRect random_resized_crop_rect(int w, int h, double scale_lo, double scale_hi,
                                   double log_ratio_lo, double log_ratio_hi,
                                   detail::SplitMix64& rng);

/// torchvision's CenterCrop: offset round((size - crop) / 2) (half to even, as
/// Python's round); a crop larger than the image starts at -((crop - size) / 2),
/// the zero padding torchvision adds on that side.
PixelRect center_crop_rect(int w, int h, int crop_w, int crop_h);

/// torchvision's Resize(int): the shorter side becomes `size`, the longer
/// int(size * long / short). @return (h, w).
void shorter_side_size(int h, int w, int size, int* out_h, int* out_w);

}  // namespace stoker
