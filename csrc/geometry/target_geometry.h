// Targets that follow their image: boxes and keypoints moved by the geometric
// ops of their group (crop, flip, resize, pad, letterbox, rotation, affine,
// perspective), clipped to the output canvas and filtered, with the per-box
// rows of the other fields dropped alongside.
//
// The ops of a group compose one map (Geometry, geometry.h), applied once per
// target after the image is done. Coordinates are continuous (transform2d.h):
// a box [x1, x2] covers the pixels whose centres lie inside it, and boxes
// follow torchvision: a box's four corners are transformed and their
// enclosing axis-aligned box is kept, as `_affine_bounding_boxes_with_expand`.
// Keypoints in pixels follow torchvision and albumentations, which treat a
// keypoint's x as a pixel index under flips: x -> w - 1 - x (boxes: w - x);
// normalised keypoints (YOLO-pose) flip as ultralytics does: x -> 1 - x.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "geometry/geometry.h"

namespace stoker {

enum class BoxFormat : uint8_t {
  kXYXY,    ///< x1, y1, x2, y2
  kXYWH,    ///< x1, y1, width, height (COCO)
  kCXCYWH,  ///< centre x, centre y, width, height (YOLO, normalised)
};

const char* box_format_name(BoxFormat f);
/// UsageError naming the formats for an unknown name.
BoxFormat box_format_from_name(const std::string& name);

/// What a box must keep to stay, measured on the clipped box in output pixels
/// (torchvision's SanitizeBoundingBoxes and albumentations' BboxParams). A box
/// with nothing left inside the output (no width or no height) is always
/// dropped; the defaults drop nothing else.
struct BoxFilter {
  double min_area = 0.0;        ///< area, pixels^2
  double min_visibility = 0.0;  ///< clipped area / area of the moved box before clipping
  double min_size = 0.0;        ///< both width and height, pixels
};

/// Moves `n` boxes (rows of 4 float32 in `fmt`; normalised by the canvas size
/// when `normalized`, in and out) through `g`, clips them to the output canvas
/// and writes them back; keep[i] is 1 when box i passes `filter`, else 0 (its
/// values are then unspecified). Non-finite boxes are dropped. @return the
/// number kept.
int64_t transform_boxes(float* boxes, int64_t n, BoxFormat fmt, bool normalized, const Geometry& g,
                        const BoxFilter& filter, uint8_t* keep);

/// Moves `n` instances of `k` keypoints (rows of k x (x, y, visibility)
/// float32, pixel coordinates, or normalised when `normalized`) through `g`.
/// A keypoint with visibility 0, or moved off the canvas, becomes (0, 0, 0).
/// When g.mirrored(), keypoint j of each instance becomes the moved keypoint
/// flip_perm[j] (the left/right swap of pose skeletons, as ultralytics'
/// flip_idx; null: none).
void transform_keypoints(float* points, int64_t n, int k, bool normalized, const Geometry& g,
                         const int32_t* flip_perm);

/// Moves the kept rows of an (n x row_bytes) array to its front, in order.
/// @return the number of rows kept.
int64_t compact_rows(uint8_t* data, int64_t n, size_t row_bytes, const uint8_t* keep);

}  // namespace stoker
