// The masks of a transform group (transform_group.h): decoded or read as
// arrays, and the parts of them a sample's valid region keeps. Shared by the
// group's one-sample path and the ops that read more samples (NOTE [ Mosaic ],
// NOTE [ DetectionMixUp ]).
#pragma once

#include <cstdint>
#include <vector>

#include "codecs/jpeg_decoder.h"
#include "codecs/pixels.h"
#include "geometry/convex_polygon.h"
#include "geometry/transform_group.h"

namespace stoker {

/// Per-thread buffers of masks (decoded, and the RGB a colour mask decodes to first).
struct MaskScratch {
  std::vector<uint8_t> gray[2];
  std::vector<uint8_t> rgb;
  JpegDecoder jpeg;
  std::vector<uint8_t> keep;
  std::vector<uint8_t> tmp;  // another sample's mask, before the part it shows is kept
};

/// This thread's mask buffers.
MaskScratch& mask_scratch();

/// A mask member's pixels (elements of elem_bytes as "channels"): an encoded
/// mask decoded to one channel into `buf` (png_decode_gray's rule; a JPEG or
/// an RGB raw record as PIL's convert("L")), an array mask as it is.
/// DecodeError, or DataError for an array of the wrong size.
Pixels mask_pixels(const GroupMember& m, const MemberIO& io, int64_t max_pixels,
                   std::vector<uint8_t>& buf, MaskScratch& s);

/// Paints `fill` (one element) over every pixel of `dst` whose centre lies
/// outside `region`: what a crop removed, that a later op brought back into the
/// canvas, is fill in the image, so it is fill in the mask.
void fill_outside(const Pixels& dst, const ConvexPolygon& region, const uint8_t* fill);

/// Copies the pixels of `src` whose centres lie inside `region` into `dst`
/// (same size and element).
void copy_inside(const Pixels& src, const Pixels& dst, const ConvexPolygon& region);

/// dst = max(dst, src) for the pixels whose centres lie inside `region` (same
/// size and element): elements are little-endian integers, signed or not.
void max_inside(const Pixels& src, const Pixels& dst, const ConvexPolygon& region,
                bool signed_elems);

}  // namespace stoker
