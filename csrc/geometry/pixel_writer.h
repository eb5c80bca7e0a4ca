// Writing a canvas's view into the batch slot: in the output layout (HWC or
// CHW) and dtype (uint8, or float32/float16 after Normalize).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/dtype.h"
#include "geometry/canvas.h"
#include "geometry/image_ops.h"

namespace stoker {

enum class ImageLayout { kHWC, kCHW };

/// "HWC" or "CHW".
const char* image_layout_name(ImageLayout layout);
/// From "HWC" or "CHW"; UsageError for anything else.
ImageLayout image_layout_from_name(const std::string& name);

/// Writes the view of `c` (out_h x out_w; pixels present, no resize pending)
/// to `out`, normalised by `norm` if given.
void write_pixels(const Canvas& c, void* out, int out_h, int out_w, ImageLayout layout, DType dtype,
                  const ops::Normalize* norm, Scratch& s);

}  // namespace stoker
