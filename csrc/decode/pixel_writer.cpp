#include "decode/pixel_writer.h"

#include <cstring>

#include "common/error.h"
#include "decode/detail/half.h"

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
    const size_t base = static_cast<size_t>(y) * out_w;
    for (int ch = 0; ch < 3; ++ch) {
      for (int x = 0; x < out_w; ++x) {
        const uint8_t v = row[3 * x + ch];
        const size_t idx = chw ? ch * plane + base + x : (base + x) * 3 + ch;
        if (u8) {
          static_cast<uint8_t*>(out)[idx] = v;
        } else {
          const float f = v * scale[ch] + shift[ch];
          if (dtype == DType::kFloat32)
            static_cast<float*>(out)[idx] = f;
          else
            static_cast<uint16_t*>(out)[idx] = detail::float_to_half(f);
        }
      }
    }
  }
}

}  // namespace stoker
