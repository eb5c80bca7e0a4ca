// Checks and conversions shared by the kernels of image_ops.h.
#pragma once

#include <array>

#include "codecs/pixels.h"

namespace stoker::ops {

/// UsageError naming `op` unless `fill` is 3 values in [0, 255] and
/// `mask_fill` a whole number in [0, 255].
void check_fill(const char* op, const std::array<double, 3>& fill, int mask_fill);

/// The fill colour, rounded half to even.
Fill fill_of(const std::array<double, 3>& f);

}  // namespace stoker::ops
