#include "geometry/group_masks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codecs/codecs.h"
#include "codecs/png_decoder.h"
#include "codecs/raw_image.h"
#include "common/error.h"
#include "geometry/canvas.h"

namespace stoker {

MaskScratch& mask_scratch() {
  thread_local MaskScratch s;
  return s;
}

namespace {

// An encoded mask as one channel.
Pixels decode_mask(const MemberIO& io, int64_t max_pixels, std::vector<uint8_t>& out,
                   MaskScratch& s) {
  ImageInfo info;
  if (is_raw(io.data, io.size)) {  // pixels stored decoded: one channel as is, RGB as PIL's "L"
    const RawImage r = raw_image(io.data, io.size);
    info = {r.width, r.height};
    check_declared(info, max_pixels);
    const size_t n = static_cast<size_t>(r.width) * r.height;
    if (r.channels == 1) {
      out.assign(r.pixels, r.pixels + n);
    } else {
      out.resize(n);
      const uint8_t* p = r.pixels;
      for (size_t i = 0; i < n; ++i, p += 3)
        out[i] =
            static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    }
  } else if (is_png(io.data, io.size)) {
    info = png_decode_gray(io.data, io.size, max_pixels, out, s.rgb);
  } else if (is_jpeg(io.data, io.size)) {
    info = s.jpeg.open(io.data, io.size, max_pixels);
    s.rgb.resize(static_cast<size_t>(info.width) * info.height * 3);
    s.jpeg.decode_full(s.rgb.data(), static_cast<size_t>(info.width) * 3);
    const size_t n = static_cast<size_t>(info.width) * info.height;
    out.resize(n);
    const uint8_t* p = s.rgb.data();
    for (size_t i = 0; i < n; ++i, p += 3)
      out[i] = static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
  } else {
    not_an_image(io.data, io.size);
  }
  return packed_pixels(out.data(), info.width, info.height, 1);
}

}  // namespace

Pixels mask_pixels(const GroupMember& m, const MemberIO& io, int64_t max_pixels,
                   std::vector<uint8_t>& buf, MaskScratch& s) {
  if (m.encoded) return decode_mask(io, max_pixels, buf, s);
  const size_t want = static_cast<size_t>(m.array_h) * m.array_w * m.elem_bytes;
  STOKER_CHECK(io.size == want, DataError, "mask '", m.name, "': ", io.size, " bytes, expected ",
               want);
  return packed_pixels(const_cast<uint8_t*>(io.data), m.array_w, m.array_h, m.elem_bytes);
}

void fill_outside(const Pixels& dst, const ConvexPolygon& region, const uint8_t* fill) {
  const size_t e = static_cast<size_t>(dst.channels);
  for (int i = 0; i < dst.height; ++i) {
    uint8_t* row = dst.row(i);
    double lo = 0, hi = -1;
    int j0 = dst.width, j1 = dst.width;  // pixels [j0, j1) keep their label
    if (region.span_at(i + 0.5, &lo, &hi)) {
      // centres j + 0.5 in [lo, hi]
      j0 = static_cast<int>(std::clamp(std::ceil(lo - 0.5), 0.0, double(dst.width)));
      j1 = static_cast<int>(std::clamp(std::floor(hi - 0.5) + 1, double(j0), double(dst.width)));
    }
    for (int j = 0; j < j0; ++j) std::memcpy(row + j * e, fill, e);
    for (int j = j1; j < dst.width; ++j) std::memcpy(row + j * e, fill, e);
  }
}

void copy_inside(const Pixels& src, const Pixels& dst, const ConvexPolygon& region) {
  const size_t e = static_cast<size_t>(dst.channels);
  for (int i = 0; i < dst.height; ++i) {
    double lo = 0, hi = -1;
    if (!region.span_at(i + 0.5, &lo, &hi)) continue;
    const int j0 = static_cast<int>(std::clamp(std::ceil(lo - 0.5), 0.0, double(dst.width)));
    const int j1 =
        static_cast<int>(std::clamp(std::floor(hi - 0.5) + 1, double(j0), double(dst.width)));
    if (j1 > j0)
      std::memcpy(dst.row(i) + j0 * e, src.row(i) + j0 * e, static_cast<size_t>(j1 - j0) * e);
  }
}

namespace {

// The columns [j0, j1) of row i whose centres lie inside `region` (j1 <= j0: none).
bool span_of(const ConvexPolygon& region, int i, int width, int* j0, int* j1) {
  double lo = 0, hi = -1;
  if (!region.span_at(i + 0.5, &lo, &hi)) return false;
  *j0 = static_cast<int>(std::clamp(std::ceil(lo - 0.5), 0.0, double(width)));
  *j1 = static_cast<int>(std::clamp(std::floor(hi - 0.5) + 1, double(*j0), double(width)));
  return *j1 > *j0;
}

// Whether element a > element b (e bytes, little-endian).
bool greater(const uint8_t* a, const uint8_t* b, size_t e, bool signed_elems) {
  for (size_t k = e; k-- > 0;) {
    uint8_t x = a[k], y = b[k];
    if (signed_elems && k + 1 == e) x ^= 0x80, y ^= 0x80;  // the sign bit orders the top byte
    if (x != y) return x > y;
  }
  return false;
}

}  // namespace

void max_inside(const Pixels& src, const Pixels& dst, const ConvexPolygon& region,
                bool signed_elems) {
  const size_t e = static_cast<size_t>(dst.channels);
  for (int i = 0; i < dst.height; ++i) {
    int j0 = 0, j1 = 0;
    if (!span_of(region, i, dst.width, &j0, &j1)) continue;
    const uint8_t* s = src.row(i);
    uint8_t* d = dst.row(i);
    if (e == 1 && !signed_elems) {
      for (int j = j0; j < j1; ++j) d[j] = std::max(d[j], s[j]);
      continue;
    }
    for (int j = j0; j < j1; ++j)
      if (greater(s + j * e, d + j * e, e, signed_elems)) std::memcpy(d + j * e, s + j * e, e);
  }
}

}  // namespace stoker
