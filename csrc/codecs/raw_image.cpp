#include "codecs/raw_image.h"

#include <cstring>

#include "common/error.h"

namespace stoker {

namespace {

uint32_t load_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

bool is_raw(const uint8_t* data, size_t n) {
  return n >= 4 && std::memcmp(data, kRawMagic, 4) == 0;
}

RawImage raw_image(const uint8_t* data, size_t n) {
  STOKER_CHECK(n >= kRawHeaderBytes && is_raw(data, n), DecodeError, "raw pixel record cut short (",
               n, " bytes, the header alone is ", kRawHeaderBytes, ")");
  STOKER_CHECK(data[4] == kRawVersion, DecodeError, "raw pixel record of version ", int(data[4]),
               " (this stoker reads version ", int(kRawVersion), ")");
  const int channels = data[5];
  STOKER_CHECK(channels == 1 || channels == 3, DecodeError, "raw pixel record with ", channels,
               " channels (1 or 3)");
  const uint32_t w = load_u32(data + 8), h = load_u32(data + 12);
  STOKER_CHECK(w > 0 && h > 0 && w <= 0x7fffffffu && h <= 0x7fffffffu, DecodeError,
               "raw pixel record declares an empty or impossible size (", w, "x", h, ")");
  const uint64_t want = uint64_t{w} * h * static_cast<uint64_t>(channels);
  STOKER_CHECK(n - kRawHeaderBytes == want, DecodeError, "raw pixel record of ", w, "x", h, "x",
               channels, " holds ", n - kRawHeaderBytes, " bytes of pixels, expected ", want);
  RawImage r;
  r.pixels = data + kRawHeaderBytes;
  r.width = static_cast<int>(w);
  r.height = static_cast<int>(h);
  r.channels = channels;
  return r;
}

ImageInfo raw_probe(const uint8_t* data, size_t n) {
  const RawImage r = raw_image(data, n);
  return {r.width, r.height};
}

void write_raw_header(uint8_t* out, int width, int height, int channels) {
  std::memcpy(out, kRawMagic, 4);
  out[4] = kRawVersion;
  out[5] = static_cast<uint8_t>(channels);
  out[6] = out[7] = 0;
  store_u32(out + 8, static_cast<uint32_t>(width));
  store_u32(out + 12, static_cast<uint32_t>(height));
}

}  // namespace stoker
