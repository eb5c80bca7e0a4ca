#include "geometry/mosaic_canvas.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <variant>

#include "geometry/op_context.h"

namespace stoker {

PixelRect mosaic_read_region(const std::vector<ImageOp>& ops, const detail::SplitMix64& rng, int w,
                             int h) {
  const PixelRect all{0, 0, w, h};
  if (ops.size() < 3) return all;
  const auto* rotation = std::get_if<ops::RandomRotation>(&ops[1]);
  const bool affine =
      std::holds_alternative<ops::RandomAffine>(ops[1]) || (rotation && !rotation->expand);
  const auto* crop = std::get_if<ops::CenterCrop>(&ops[2]);
  // A crop larger than the warp's output is not inside it: the warp then runs whole.
  if (!affine || !crop || crop->w > w || crop->h > h) return all;
  detail::SplitMix64 draws = rng;  // the draws the two ops will get
  OpContext ctx(w, h, draws);
  std::visit([&](const auto& o) { o.apply(ctx); }, ops[1]);
  std::visit([&](const auto& o) { o.apply(ctx); }, ops[2]);
  const Transform2D inv = ctx.geometry().box_map().inverse();
  double x0 = HUGE_VAL, y0 = HUGE_VAL, x1 = -HUGE_VAL, y1 = -HUGE_VAL;
  for (const Point2 corner : {Point2{0, 0}, Point2{double(crop->w), 0}, Point2{0, double(crop->h)},
                              Point2{double(crop->w), double(crop->h)}}) {
    const Point2 p = inv.apply(corner);
    x0 = std::min(x0, p.x);
    y0 = std::min(y0, p.y);
    x1 = std::max(x1, p.x);
    y1 = std::max(y1, p.y);
  }
  if (!(std::isfinite(x0) && std::isfinite(y0) && std::isfinite(x1) && std::isfinite(y1)))
    return all;
  // Clamped before the conversions, so that far points cannot overflow them.
  const auto at = [](double v, int n) { return static_cast<int>(std::clamp(v, 0.0, double(n))); };
  const int a = at(std::floor(x0) - 2, w), b = at(std::ceil(x1) + 2, w);
  const int c = at(std::floor(y0) - 2, h), d = at(std::ceil(y1) + 2, h);
  return {a, c, b - a, d - c};
}

void fill_around(uint8_t* canvas, int w, int h, const PixelRect& region,
                 const ops::Mosaic::Tile* tiles, int n, const Fill& fill) {
  thread_local std::vector<uint8_t> pattern_buf;
  std::vector<uint8_t>& pattern = pattern_buf;  // one thread-local lookup
  pattern.resize(static_cast<size_t>(w) * 3);
  for (int x = 0; x < w; ++x) std::memcpy(&pattern[static_cast<size_t>(x) * 3], fill.v, 3);
  const int left = std::max(0, region.x), right = std::min(w, region.x + region.w);
  const int top = std::max(0, region.y), bottom = std::min(h, region.y + region.h);
  std::pair<int, int> spans[8];
  for (int y = top; y < bottom; ++y) {
    int k = 0;
    for (int i = 0; i < n && k < 8; ++i) {
      const ops::Mosaic::Tile& t = tiles[i];
      if (t.cw > 0 && t.ch > 0 && y >= t.y && y < t.y + t.ch) spans[k++] = {t.x, t.x + t.cw};
    }
    std::sort(spans, spans + k);
    uint8_t* row = canvas + static_cast<size_t>(y) * w * 3;
    int x = left;
    for (int i = 0; i <= k; ++i) {
      const int end = i < k ? std::min(spans[i].first, right) : right;
      if (end > x) std::memcpy(row + static_cast<size_t>(x) * 3, pattern.data(), (end - x) * 3u);
      if (i < k) x = std::max(x, spans[i].second);
    }
  }
}

}  // namespace stoker
