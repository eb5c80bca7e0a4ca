#include "geometry/target_geometry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "geometry/convex_polygon.h"

namespace stoker {

const char* box_format_name(BoxFormat f) {
  switch (f) {
    case BoxFormat::kXYXY:
      return "xyxy";
    case BoxFormat::kXYWH:
      return "xywh";
    case BoxFormat::kCXCYWH:
      return "cxcywh";
  }
  return "?";
}

BoxFormat box_format_from_name(const std::string& name) {
  for (BoxFormat f : {BoxFormat::kXYXY, BoxFormat::kXYWH, BoxFormat::kCXCYWH})
    if (name == box_format_name(f)) return f;
  STOKER_THROW(UsageError, "box format must be 'xyxy', 'xywh' or 'cxcywh', got '", name, "'");
}

int64_t transform_boxes(float* boxes, int64_t n, BoxFormat fmt, bool normalized, const Geometry& g,
                        const BoxFilter& filter, uint8_t* keep) {
  const double in_sx = normalized ? g.in_width() : 1.0, in_sy = normalized ? g.in_height() : 1.0;
  const double W = g.width(), H = g.height();
  const Transform2D& t = g.box_map();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    float* b = boxes + 4 * i;
    double x1, y1, x2, y2;
    switch (fmt) {
      case BoxFormat::kXYXY:
        x1 = b[0], y1 = b[1], x2 = b[2], y2 = b[3];
        break;
      case BoxFormat::kXYWH:
        x1 = b[0], y1 = b[1], x2 = double{b[0]} + b[2], y2 = double{b[1]} + b[3];
        break;
      default:
        x1 = b[0] - 0.5 * b[2], y1 = b[1] - 0.5 * b[3];
        x2 = b[0] + 0.5 * b[2], y2 = b[1] + 0.5 * b[3];
        break;
    }
    x1 *= in_sx, x2 *= in_sx, y1 *= in_sy, y2 *= in_sy;
    // The moved box before clipping (min_visibility's reference): the enclosing
    // box of its moved corners, as torchvision.
    double lx = x1, ly = y1, hx = x2, hy = y2;
    if (g.moved()) {
      lx = ly = INFINITY;
      hx = hy = -INFINITY;
      for (const Point2 c : {Point2{x1, y1}, Point2{x2, y1}, Point2{x2, y2}, Point2{x1, y2}}) {
        const Point2 p = t.apply(c);
        lx = std::min(lx, p.x), hx = std::max(hx, p.x);
        ly = std::min(ly, p.y), hy = std::max(hy, p.y);
      }
    }
    const double moved_area = std::max(0.0, hx - lx) * std::max(0.0, hy - ly);
    // What is left of it: the box clipped stage by stage (what every crop and
    // canvas left), and the enclosing box of that.
    const ConvexPolygon left = g.follow(ConvexPolygon::rect(x1, y1, x2, y2));
    left.bounds(&lx, &ly, &hx, &hy);
    lx = std::clamp(lx, 0.0, W), hx = std::clamp(hx, 0.0, W);
    ly = std::clamp(ly, 0.0, H), hy = std::clamp(hy, 0.0, H);
    const double bw = hx - lx, bh = hy - ly, area = bw * bh;
    // Nothing left: no area, a width or height under a thousandth of a pixel
    // (no image shows that), or one float32 cannot tell from 0.
    constexpr double kNothing = 1e-3;
    const bool something = !left.empty() && bw >= kNothing && bh >= kNothing &&
                           static_cast<float>(hx) > static_cast<float>(lx) &&
                           static_cast<float>(hy) > static_cast<float>(ly);
    const bool ok = something && std::isfinite(area) && bw >= filter.min_size &&
                    bh >= filter.min_size && area >= filter.min_area &&
                    (filter.min_visibility <= 0 || area >= filter.min_visibility * moved_area);
    keep[i] = ok ? 1 : 0;
    if (!ok) continue;
    ++kept;
    const double sx = normalized ? 1.0 / W : 1.0, sy = normalized ? 1.0 / H : 1.0;
    switch (fmt) {
      case BoxFormat::kXYXY:
        b[0] = static_cast<float>(lx * sx), b[1] = static_cast<float>(ly * sy);
        b[2] = static_cast<float>(hx * sx), b[3] = static_cast<float>(hy * sy);
        break;
      case BoxFormat::kXYWH:
        b[0] = static_cast<float>(lx * sx), b[1] = static_cast<float>(ly * sy);
        b[2] = static_cast<float>(bw * sx), b[3] = static_cast<float>(bh * sy);
        break;
      default:
        b[0] = static_cast<float>((lx + 0.5 * bw) * sx),
        b[1] = static_cast<float>((ly + 0.5 * bh) * sy);
        b[2] = static_cast<float>(bw * sx), b[3] = static_cast<float>(bh * sy);
        break;
    }
  }
  return kept;
}

void transform_keypoints(float* points, int64_t n, int k, bool normalized, const Geometry& g,
                         const int32_t* flip_perm) {
  const double in_sx = normalized ? g.in_width() : 1.0, in_sy = normalized ? g.in_height() : 1.0;
  const double W = g.width(), H = g.height();
  const double out_sx = normalized ? 1.0 / W : 1.0, out_sy = normalized ? 1.0 / H : 1.0;
  // Normalised keypoints (YOLO-pose) flip as continuous coordinates, 1 - x,
  // as ultralytics does; pixel ones as pixel indices, w - 1 - x.
  const Transform2D& t = normalized ? g.box_map() : g.point_map();
  const bool swap = g.mirrored() && flip_perm != nullptr;
  thread_local std::vector<float> moved;
  if (swap) moved.resize(static_cast<size_t>(k) * 3);
  for (int64_t i = 0; i < n; ++i) {
    float* inst = points + static_cast<size_t>(i) * k * 3;
    float* dst = swap ? moved.data() : inst;
    for (int j = 0; j < k; ++j) {
      const float* p = inst + 3 * j;
      float* q = dst + 3 * j;
      const float vis = p[2];
      const Point2 m = t.apply({p[0] * in_sx, p[1] * in_sy});
      // Pixel-index coordinates: on the canvas when inside [0, w) x [0, h),
      // and shown: inside every stage's canvas on the way (a pixel index x is
      // the continuous x + 0.5).
      const Point2 c =
          normalized ? Point2{p[0] * in_sx, p[1] * in_sy} : Point2{p[0] + 0.5, p[1] + 0.5};
      const bool on = vis != 0 && std::isfinite(vis) && m.x >= 0 && m.x < W && m.y >= 0 &&
                      m.y < H && g.follows(c);
      q[0] = on ? static_cast<float>(m.x * out_sx) : 0.0f;
      q[1] = on ? static_cast<float>(m.y * out_sy) : 0.0f;
      q[2] = on ? vis : 0.0f;
    }
    if (swap)
      for (int j = 0; j < k; ++j) {
        const int32_t from = flip_perm[j];
        std::memcpy(inst + 3 * j, moved.data() + 3 * static_cast<size_t>(from), 3 * sizeof(float));
      }
  }
}

int64_t compact_rows(uint8_t* data, int64_t n, size_t row_bytes, const uint8_t* keep) {
  int64_t out = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    if (out != i)
      std::memmove(data + static_cast<size_t>(out) * row_bytes,
                   data + static_cast<size_t>(i) * row_bytes, row_bytes);
    ++out;
  }
  return out;
}

}  // namespace stoker
