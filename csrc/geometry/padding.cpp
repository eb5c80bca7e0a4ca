#include "geometry/padding.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "common/error.h"

namespace stoker {

const char* pad_mode_name(PadMode m) {
  switch (m) {
    case PadMode::kConstant:
      return "constant";
    case PadMode::kEdge:
      return "edge";
    case PadMode::kReflect:
      return "reflect";
    case PadMode::kSymmetric:
      return "symmetric";
  }
  return "?";
}

PadMode pad_mode_from_name(const char* name) {
  const std::string_view n(name);
  for (PadMode m : {PadMode::kConstant, PadMode::kEdge, PadMode::kReflect, PadMode::kSymmetric})
    if (n == pad_mode_name(m)) return m;
  STOKER_THROW(UsageError,
               "padding_mode must be 'constant', 'edge', 'reflect' or 'symmetric', got '", n, "'");
}

int pad_source_index(int i, int n, PadMode mode) {
  if (i >= 0 && i < n) return i;
  if (mode == PadMode::kEdge || n == 1) return std::clamp(i, 0, n - 1);
  // Reflect has period 2(n - 1) (edges not repeated), symmetric 2n.
  const bool sym = mode == PadMode::kSymmetric;
  const int period = sym ? 2 * n : 2 * (n - 1);
  int k = i % period;
  if (k < 0) k += period;
  if (k < n) return k;
  return sym ? period - 1 - k : period - k;
}

void copy_window(const Pixels& src, int x0, int y0, const Pixels& dst, PadMode mode,
                 const Fill& fill) {
  STOKER_CHECK(src.channels == dst.channels, UsageError, "copy_window: channel counts differ");
  const int ch = dst.channels;
  const int w = dst.width;
  // Columns [in_lo, in_hi) of the window read the source directly.
  const int in_lo = std::clamp(-x0, 0, w);
  const int in_hi = std::clamp(src.width - x0, in_lo, w);
  for (int i = 0; i < dst.height; ++i) {
    uint8_t* out = dst.row(i);
    const int sy = y0 + i;
    const bool row_inside = sy >= 0 && sy < src.height;
    if ((mode == PadMode::kConstant && !row_inside) || src.empty()) {
      for (int j = 0; j < w; ++j) std::memcpy(out + j * ch, fill.v, static_cast<size_t>(ch));
      continue;
    }
    const uint8_t* row = src.row(row_inside ? sy : pad_source_index(sy, src.height, mode));
    for (int j = 0; j < in_lo; ++j) {
      const uint8_t* p =
          mode == PadMode::kConstant
              ? fill.v
              : row + static_cast<size_t>(pad_source_index(x0 + j, src.width, mode)) * ch;
      std::memcpy(out + j * ch, p, static_cast<size_t>(ch));
    }
    if (in_hi > in_lo)
      std::memcpy(out + static_cast<size_t>(in_lo) * ch, row + static_cast<size_t>(x0 + in_lo) * ch,
                  static_cast<size_t>(in_hi - in_lo) * ch);
    for (int j = in_hi; j < w; ++j) {
      const uint8_t* p =
          mode == PadMode::kConstant
              ? fill.v
              : row + static_cast<size_t>(pad_source_index(x0 + j, src.width, mode)) * ch;
      std::memcpy(out + j * ch, p, static_cast<size_t>(ch));
    }
  }
}

}  // namespace stoker
