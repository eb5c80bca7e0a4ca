#include "geometry/pixel_writer.h"

#include <cstring>

#include "common/detail/half.h"
#include "common/detail/multiversion.h"
#include "common/error.h"

namespace stoker {

namespace {

// The view's row `y` as packed RGB (mirrored, zeros past the edges) into `dst`.
void gather_row(const Canvas& c, int y, uint8_t* dst) {
  const int w = c.view.w;
  const int sy = c.view.y + y;
  if (sy < 0 || sy >= c.src_h) {
    std::memset(dst, 0, static_cast<size_t>(w) * 3);
    return;
  }
  const uint8_t* row = c.pix.data + static_cast<size_t>(sy) * c.pix.stride;
  if (!c.flip && c.view.x >= 0 && c.view.x + w <= c.src_w) {
    std::memcpy(dst, row + static_cast<size_t>(c.view.x) * 3, static_cast<size_t>(w) * 3);
    return;
  }
  for (int x = 0; x < w; ++x) {
    const int sx = c.view.x + (c.flip ? w - 1 - x : x);
    if (sx >= 0 && sx < c.src_w) {
      std::memcpy(dst + 3 * x, row + static_cast<size_t>(sx) * 3, 3);
    } else {
      dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = 0;
    }
  }
}

}  // namespace

namespace {

// One gathered RGB row into the output, normalised: a loop per layout and
// dtype, so that each vectorises (a test of the dtype per element kept the
// compiler from it).
template <typename T, typename Conv>
STOKER_MULTIVERSION void store_row(const uint8_t* row, int w, bool chw, size_t plane, T* base,
                                   const float* scale, const float* shift, Conv conv) {
  if (chw) {
    for (int ch = 0; ch < 3; ++ch) {
      T* dst = base + ch * plane;
      const float a = scale[ch], b = shift[ch];
      for (int x = 0; x < w; ++x) dst[x] = conv(static_cast<float>(row[3 * x + ch]) * a + b);
    }
  } else {
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < 3; ++ch)
        base[3 * x + ch] = conv(static_cast<float>(row[3 * x + ch]) * scale[ch] + shift[ch]);
  }
}

// Conversions as function objects: a function pointer would be an indirect
// call per element, which does not vectorise.
struct ToFloat {
  float operator()(float f) const { return f; }
};
struct ToHalf {
  uint16_t operator()(float f) const { return detail::float_to_half(f); }
};
struct ToBFloat16 {
  uint16_t operator()(float f) const { return detail::float_to_bfloat16(f); }
};

}  // namespace

const char* image_layout_name(ImageLayout layout) {
  return layout == ImageLayout::kCHW ? "CHW" : "HWC";
}

ImageLayout image_layout_from_name(const std::string& name) {
  if (name == "HWC") return ImageLayout::kHWC;
  if (name == "CHW") return ImageLayout::kCHW;
  STOKER_THROW(UsageError, "image layout must be 'HWC' or 'CHW', got '", name, "'");
}

void write_pixels(const Canvas& c, void* out, int out_h, int out_w, ImageLayout layout, DType dtype,
                  const ops::Normalize* norm, Scratch& s) {
  const bool chw = layout == ImageLayout::kCHW;
  const bool u8 = dtype == DType::kUInt8;
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  const size_t row_bytes = static_cast<size_t>(out_w) * 3;
  float scale[3] = {1, 1, 1}, shift[3] = {0, 0, 0};
  if (norm)
    for (int ch = 0; ch < 3; ++ch) {
      scale[ch] = static_cast<float>(1.0 / (255.0 * norm->stddev[ch]));
      shift[ch] = static_cast<float>(-norm->mean[ch] / norm->stddev[ch]);
    }
  s.row.resize(row_bytes);
  for (int y = 0; y < out_h; ++y) {
    uint8_t* row = u8 && !chw ? static_cast<uint8_t*>(out) + y * row_bytes : s.row.data();
    gather_row(c, y, row);
    if (u8 && !chw) continue;
    const size_t base = static_cast<size_t>(y) * out_w;  // pixel index of the row
    const size_t at = chw ? base : base * 3;             // element index of its first value
    if (u8) {
      uint8_t* dst = static_cast<uint8_t*>(out) + at;
      for (int ch = 0; ch < 3; ++ch)
        for (int x = 0; x < out_w; ++x) dst[ch * plane + x] = row[3 * x + ch];
    } else if (dtype == DType::kFloat32) {
      store_row(row, out_w, chw, plane, static_cast<float*>(out) + at, scale, shift, ToFloat{});
    } else if (dtype == DType::kBFloat16) {
      store_row(row, out_w, chw, plane, static_cast<uint16_t*>(out) + at, scale, shift,
                ToBFloat16{});
    } else {
      store_row(row, out_w, chw, plane, static_cast<uint16_t*>(out) + at, scale, shift, ToHalf{});
    }
  }
}

}  // namespace stoker
