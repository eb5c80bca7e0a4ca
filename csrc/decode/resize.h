// Antialiased resampling of 8-bit RGB images.
#pragma once

#include <cstdint>
#include <vector>

namespace stoker {

/// Resizes the (w x h) region at (x0, y0) of an RGB image with row stride
/// `stride` to (out_w x out_h), with a triangle filter whose support grows
/// with the downscale factor (antialiasing, the rule of PIL's BILINEAR).
void resize_rgb(const uint8_t* src, int stride, int x0, int y0, int w, int h,
                uint8_t* dst, int out_w, int out_h, std::vector<float>& scratch);

}  // namespace stoker
