// Windows of an image that may reach past its edges, filled by a padding mode:
// Pad, RandomCrop(padding=..., pad_if_needed=...), Letterbox, and a CenterCrop
// larger than the image. The modes are torchvision's (F.pad): "constant" (the
// fill), "edge" (the nearest edge pixel), "reflect" (mirrored without the edge
// pixel: [1 2 3 4] padded by 2 is 3 2 [1 2 3 4] 3 2), "symmetric" (with it:
// 2 1 [1 2 3 4] 4 3).
#pragma once

#include <cstdint>

#include "codecs/pixels.h"

namespace stoker {

enum class PadMode : uint8_t { kConstant, kEdge, kReflect, kSymmetric };

/// The name of a mode ("constant", ...), and the mode of a name (UsageError
/// naming the modes for an unknown one).
const char* pad_mode_name(PadMode m);
PadMode pad_mode_from_name(const char* name);

/// Copies the window of `src` whose top-left corner is (x0, y0) (negative or
/// past the edges as needed) into `dst`, of the window's size. Pixels outside
/// the source come from `mode`; a reflection longer than the image bounces
/// again (torchvision refuses those sizes). Thread-safe; no allocation.
void copy_window(const Pixels& src, int x0, int y0, const Pixels& dst, PadMode mode,
                 const Fill& fill);

/// The source index of position `i` (any integer) along an axis of `n` pixels
/// under `mode` (not kConstant): edge clamps, reflect/symmetric bounce.
int pad_source_index(int i, int n, PadMode mode);

}  // namespace stoker
