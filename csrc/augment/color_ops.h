// Colour ops on 8-bit images, with the meanings torchvision.transforms.v2
// gives them on uint8 tensors (functional/_color.py): arithmetic in float32,
// results truncated to uint8 as `.to(torch.uint8)` does, grayscale weights
// 0.2989/0.587/0.114.
//
// A list of steps runs fused (NOTE [ Fused colour passes ] in color_ops.cpp):
// every step that maps each channel value on its own (brightness, contrast
// once its mean is known, posterize, solarize, invert, equalize, autocontrast)
// is a 256-entry table per channel, consecutive tables compose into one, and
// the steps between two points where a statistic of the whole image is needed
// (contrast's mean, equalize's histogram, autocontrast's range) or a
// neighbourhood is read (sharpness) run row by row in one pass over the
// pixels, gathering the next statistic as they go.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/pixels.h"

namespace stoker {

enum class ColorKind : uint8_t {
  kBrightness,    ///< value: factor >= 0 (x * factor)
  kContrast,      ///< value: factor >= 0 (blend with the mean of the grayscale image)
  kSaturation,    ///< value: factor >= 0 (blend with the pixel's gray; none on 1 channel)
  kHue,           ///< value: shift in [-0.5, 0.5] of the HSV hue (none on 1 channel)
  kGrayscale,     ///< the pixel's gray in every channel (RandomGrayscale's outcome)
  kPosterize,     ///< value: bits kept, 0..8
  kSolarize,      ///< value: threshold; x >= threshold becomes 255 - x
  kInvert,        ///< 255 - x
  kEqualize,      ///< histogram equalisation per channel (PIL's table, as torchvision)
  kAutocontrast,  ///< per channel, [min, max] stretched to [0, 255]
  kSharpness,     ///< value: factor >= 0 (blend with a 3x3 smoothing; the border is kept)
};

/// One colour step with its (already drawn) parameter. A double, as the
/// Python float torchvision receives: 1 - factor is formed in double and only
/// then rounded to float32, as torch does with a Python scalar.
struct ColorStep {
  ColorKind kind = ColorKind::kInvert;
  double value = 0;
};

/// Applies `steps` in order to `img` (1 or 3 channels) in place. Uses
/// thread-local scratch: no allocation once warm. Thread-safe.
void apply_color_steps(Pixels img, const ColorStep* steps, size_t n);

/// The name of a kind, for messages ("brightness", ...).
const char* color_kind_name(ColorKind k);

namespace detail {

/// The pass plan apply_color_steps would run: number of passes over the
/// pixels (a read-only statistics pass counts as one). For tests of the fusion.
int color_pass_count(const ColorStep* steps, size_t n, int channels);

/// p[i] = luts[c][p[i]] over n bytes: one table (tables == 1) or three for
/// interleaved channels (tables == 3; n a multiple of 3, p[0] of channel 0).
/// AVX-512 VBMI where the CPU has it and `simd` (NOTE [ Byte tables with VBMI ]),
/// else one byte at a time: the same bytes either way.
void lookup_bytes(const uint8_t* const* luts, int tables, uint8_t* p, size_t n, bool simd = true);
/// Whether lookup_bytes has its SIMD path on this CPU.
bool lookup_bytes_has_simd();

}  // namespace detail

}  // namespace stoker
