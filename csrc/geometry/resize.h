// Antialiased resampling of 8-bit RGB images.
//
// The filter is PIL's BILINEAR with antialiasing (torchvision's default for
// PIL images and for tensors with antialias=True): a triangle whose support
// grows with the downscale factor, separable, rounded to 8 bits between the
// passes as PIL does. PIL always filters rows first; here the order that does
// less work is chosen from the sizes alone (filtering columns first when the
// image shrinks more vertically), so results still depend only on the input.
// Weights are 14-bit fixed point (PIL: 22-bit). Either way results differ
// from PIL by at most a level or two on a few pixels. The inner loops have
// AVX2 versions (resize_avx2.cpp) chosen at load time; they give the same
// bytes as the baseline loops.
#pragma once

#include <cstdint>

#include "codecs/image_info.h"

namespace stoker {

/// Source box of a resize: a window of the source in floating-point pixel
/// coordinates (a crop mapped through a DCT scale is fractional), and the
/// integer pixel range the filter may read, [lo_x, hi_x) x [lo_y, hi_y): the
/// crop itself, so that pixels outside it never leak in (torchvision crops
/// first, then resizes).
struct ResizeBox {
  double x = 0, y = 0, w = 0, h = 0;
  int lo_x = 0, lo_y = 0, hi_x = 0, hi_y = 0;
};

/// Resizes `box` of `src` to (out_w x out_h) RGB at `dst` (rows `dst_stride`
/// bytes apart), mirrored left to right if `mirror` (at no extra cost). Uses
/// thread-local scratch: no allocation once warm.
void resize_rgb(const RgbView& src, const ResizeBox& box, uint8_t* dst, size_t dst_stride,
                int out_w, int out_h, bool mirror = false);

/// The part `part` (in output pixels) of resize_rgb(src, box, ..., out_w,
/// out_h) into `dst` (its top-left pixel; rows `dst_stride` bytes apart),
/// the same bytes the whole resize gives there, for the work of the part.
void resize_rgb_part(const RgbView& src, const ResizeBox& box, int out_w, int out_h,
                     const PixelRect& part, uint8_t* dst, size_t dst_stride);

/// The whole of `src` as a box.
ResizeBox whole_box(const RgbView& src);

namespace detail {

enum class ResizeOrder { kAuto, kHorizontalFirst, kVerticalFirst };

/// resize_rgb with the choices made explicit, for tests: `simd` false keeps to
/// the baseline loops; `order` forces the pass order.
void resize_rgb_impl(const RgbView& src, const ResizeBox& box, uint8_t* dst, size_t dst_stride,
                     int out_w, int out_h, bool mirror, bool simd, ResizeOrder order);

}  // namespace detail

}  // namespace stoker
