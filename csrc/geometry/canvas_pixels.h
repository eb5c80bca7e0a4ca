// Making a lazy canvas (canvas.h) plain pixels, for the ops that need to read
// and write them (colour, blur, auto-augment, warps, padding with a fill).
#pragma once

#include "codecs/pixels.h"
#include "geometry/canvas.h"

namespace stoker {

/// Makes the canvas packed RGB pixels of its view (a pending resize run, the
/// flip applied, pixels past the source's edges from `fill`) and returns them,
/// writable. The pixels live in a thread-local buffer that the canvas does not
/// read from; a later call alternates with a second one.
Pixels canvas_pixels(CanvasOps& ops, Canvas& c, const Fill& fill = Fill{});

/// A second thread-local buffer of (w x h) RGB that the canvas does not read
/// from, as the target of a resampling; adopt() makes it the canvas.
Pixels canvas_spare(const Canvas& c, int w, int h);

/// The canvas becomes the packed pixels `p` (whole view, no flip, no pending resize).
void adopt_pixels(Canvas& c, const Pixels& p);

}  // namespace stoker
