// The canvas of a Mosaic (NOTE [ Mosaic ] in transform_group.cpp): which part
// of it the ops after the Mosaic read, and its fill around the tiles.
#pragma once

#include <cstdint>
#include <vector>

#include "codecs/image_info.h"
#include "geometry/detail/rng.h"
#include "geometry/image_ops.h"

namespace stoker {

/// The part of the (w x h) canvas that `ops` (the Mosaic first, then the ops
/// on its canvas, which draw from `rng` as it is now) read: all of it, unless
/// an affine warp (RandomAffine, RandomRotation without expand) comes right
/// after the Mosaic and a CenterCrop inside its output right after that, so
/// that the warp writes only the crop (NOTE [ Lazy warps ] in op_context.cpp):
/// then the source points of the crop's pixels, with the two pixels around
/// them that bilinear taps reach. `rng` is not advanced.
PixelRect mosaic_read_region(const std::vector<ImageOp>& ops, const detail::SplitMix64& rng, int w,
                             int h);

/// Paints `fill` on the part `region` of the (w x h) RGB canvas wherever none
/// of the `n` tiles (which do not overlap) will be copied.
void fill_around(uint8_t* canvas, int w, int h, const PixelRect& region,
                 const ops::Mosaic::Tile* tiles, int n, const Fill& fill);

}  // namespace stoker
