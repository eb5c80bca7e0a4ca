#include "codecs/jpeg_decoder.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "common/error.h"

namespace stoker {

// NOTE [ libjpeg errors ]
// libjpeg reports a fatal error by calling error_exit, which must not return.
// It longjmps back to the setjmp in the same function that called into
// libjpeg; that function then resets the decompressor and throws. No C++
// exception ever unwinds through libjpeg's C frames, and no object with a
// destructor is created between a setjmp and the libjpeg calls it guards.
struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  struct Err {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    int code;
    char message[JMSG_LENGTH_MAX];
  } err;
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool cmyk = false;
  bool inverted = false;     // Adobe CMYK: the stored values are 255 - ink
  std::vector<uint8_t> row;  // one CMYK row, or a discarded row
};

namespace {

using Err = decltype(JpegDecoder::State::err);

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<Err*>(cinfo->err);
  err->code = err->pub.msg_code;
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (level -1) are mostly damaged entropy-coded data, which libjpeg
// papers over with grey or garbage pixels: a loader must not hand that on, so
// they are errors. A few leave the pixels intact and are common in real
// collections (stray bytes between markers, an unknown JFIF revision), so
// they pass, as Pillow lets them pass.
void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  switch (cinfo->err->msg_code) {
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_JFIF_MAJOR:
    case JWRN_ADOBE_XFORM:
    case JWRN_BOGUS_ICC:
      return;
    default:
      on_error(cinfo);
  }
}

[[noreturn]] void fail(JpegDecoder::State& s, bool header) {
  jpeg_abort_decompress(&s.cinfo);  // makes the decompressor reusable
  if (s.err.code == JWRN_JPEG_EOF)
    STOKER_THROW(DecodeError, header ? "truncated JPEG header" : "truncated JPEG data");
  // libjpeg's own text often starts with "Corrupt JPEG data: "; say it once.
  const char* msg = s.err.message;
  constexpr char kPrefix[] = "Corrupt JPEG data: ";
  if (std::strncmp(msg, kPrefix, sizeof kPrefix - 1) == 0) msg += sizeof kPrefix - 1;
  STOKER_THROW(DecodeError, header ? "corrupt JPEG header: " : "corrupt JPEG data: ", msg);
}

void check_size(JpegDecoder::State& s, int w, int h, int64_t max_pixels) {
  if (w <= 0 || h <= 0) {
    jpeg_abort_decompress(&s.cinfo);
    STOKER_THROW(DecodeError, "JPEG declares an empty image (", w, "x", h, ")");
  }
  const int64_t px = int64_t{w} * h;
  if (px > max_pixels) {
    jpeg_abort_decompress(&s.cinfo);
    STOKER_THROW(DecodeError, "image declares ", w, "x", h, " = ", px,
                 " pixels, above the limit of ", max_pixels);
  }
}

// Ink to RGB as Pillow's cmyk2rgb does (R = (255 - K) - C * (255 - K) / 255,
// with its rounding), so CMYK JPEGs match Pillow's decode exactly.
inline uint8_t ink(int c, int nk) {
  const int t = c * nk + 128;
  return static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
}

void cmyk_to_rgb(const uint8_t* src, uint8_t* dst, int w, bool inverted) {
  for (int x = 0; x < w; ++x, src += 4, dst += 3) {
    int c = src[0], m = src[1], y = src[2], k = src[3];
    if (inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    const int nk = 255 - k;
    dst[0] = ink(c, nk);
    dst[1] = ink(m, nk);
    dst[2] = ink(y, nk);
  }
}

// A JPEG whose last bytes are the EOI marker was not cut short. Only such a
// file may stop decoding below a crop without reading the rest; any other goes
// through to the end so that truncation is still caught.
bool ends_with_eoi(const uint8_t* data, size_t n) {
  return n >= 4 && data[n - 2] == 0xFF && data[n - 1] == 0xD9;
}

}  // namespace

bool is_jpeg(const uint8_t* data, size_t n) {
  return n >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

JpegDecoder::JpegDecoder() : s_(std::make_unique<State>()) {
  s_->cinfo.err = jpeg_std_error(&s_->err.pub);
  s_->err.pub.error_exit = on_error;
  s_->err.pub.emit_message = on_message;
  s_->err.code = 0;
  s_->err.message[0] = 0;
  jpeg_create_decompress(&s_->cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&s_->cinfo); }

ImageInfo JpegDecoder::open(const uint8_t* data, size_t n, int64_t max_pixels) {
  State& s = *s_;
  jpeg_abort_decompress(&s.cinfo);  // whatever the last image left
  s.data = data;
  s.size = n;
  s.err.code = 0;
  if (setjmp(s.err.jump)) fail(s, true);
  jpeg_mem_src(&s.cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&s.cinfo, TRUE);
  const int w = static_cast<int>(s.cinfo.image_width), h = static_cast<int>(s.cinfo.image_height);
  check_size(s, w, h, max_pixels);
  s.cmyk = s.cinfo.jpeg_color_space == JCS_CMYK || s.cinfo.jpeg_color_space == JCS_YCCK;
  s.inverted = s.cmyk && s.cinfo.saw_Adobe_marker;
  s.cinfo.out_color_space = s.cmyk ? JCS_CMYK : JCS_RGB;
  s.cinfo.dct_method = JDCT_ISLOW;  // the accurate IDCT (SIMD in libjpeg-turbo), as Pillow
  s.cinfo.do_fancy_upsampling = TRUE;
  if (s.cmyk) s.row.resize(static_cast<size_t>(w) * 4);
  return {w, h};
}

void JpegDecoder::decode_scaled(int scale_num, uint8_t* dst, size_t stride) {
  State& s = *s_;
  if (setjmp(s.err.jump)) fail(s, false);
  s.cinfo.scale_num = static_cast<unsigned>(scale_num);
  s.cinfo.scale_denom = 8;
  jpeg_start_decompress(&s.cinfo);
  const int w = static_cast<int>(s.cinfo.output_width);
  if (w != scaled_size(static_cast<int>(s.cinfo.image_width), scale_num) ||
      static_cast<int>(s.cinfo.output_height) !=
          scaled_size(static_cast<int>(s.cinfo.image_height), scale_num)) {
    jpeg_abort_decompress(&s.cinfo);
    STOKER_THROW(Error, "libjpeg scaled ", s.cinfo.image_width, "x", s.cinfo.image_height, " by ",
                 scale_num, "/8 to ", w, "x", s.cinfo.output_height, ", not as expected");
  }
  if (s.cmyk) s.row.resize(static_cast<size_t>(w) * 4);
  while (s.cinfo.output_scanline < s.cinfo.output_height) {
    uint8_t* out = dst + static_cast<size_t>(s.cinfo.output_scanline) * stride;
    JSAMPROW row = s.cmyk ? s.row.data() : out;
    jpeg_read_scanlines(&s.cinfo, &row, 1);
    if (s.cmyk) cmyk_to_rgb(row, out, w, s.inverted);
  }
  jpeg_finish_decompress(&s.cinfo);  // reads up to EOI: truncation shows here
}

int JpegDecoder::choose_scale(int w, int h, int target_w, int target_h) {
  // The scaled crop must stay 1.25x the target (scale * crop >= 1.25 * target),
  // not merely cover it: at a ratio near 1 the resize after the DCT barely
  // filters, and the 1/8 scale (block averages) then shows its grid. Measured
  // on the C++ test image, RandomResizedCrop's worst mean abs difference to a
  // full-resolution resize fell from 3.6 to 1.4 levels; 2x (Pillow's default
  // reducing_gap) gave 0.9 but leaves most crops of ImageNet-sized images unscaled.
  for (int num : {1, 2, 4})
    if (int64_t{w} * num * 4 >= int64_t{target_w} * 40 &&
        int64_t{h} * num * 4 >= int64_t{target_h} * 40)
      return num;
  return 8;
}

RgbView JpegDecoder::decode_region(const PixelRect& crop, int scale_num, std::vector<uint8_t>& buf,
                                   int* origin_x, int* origin_y) {
  State& s = *s_;
  if (setjmp(s.err.jump)) fail(s, false);
  s.cinfo.scale_num = static_cast<unsigned>(scale_num);
  s.cinfo.scale_denom = 8;
  jpeg_start_decompress(&s.cinfo);
  const int full_w = static_cast<int>(s.cinfo.output_width);
  const int full_h = static_cast<int>(s.cinfo.output_height);
  const int x0 = static_cast<int>(int64_t{crop.x} * scale_num / 8);
  const int y0 = static_cast<int>(int64_t{crop.y} * scale_num / 8);
  const int x1 = std::min(full_w, static_cast<int>((int64_t{crop.x + crop.w} * scale_num + 7) / 8));
  const int y1 = std::min(full_h, static_cast<int>((int64_t{crop.y + crop.h} * scale_num + 7) / 8));
  // Two columns of margin on each side: fancy upsampling of subsampled chroma
  // reads the neighbouring chroma column, and libjpeg replicates the edge one
  // at the borders of a cropped scanline, which would change the crop's edge
  // pixels. jpeg_crop_scanline then moves xoff left to an iMCU boundary.
  const int kMargin = 2;
  const int req0 = std::max(0, x0 - kMargin), req1 = std::min(full_w, x1 + kMargin);
  JDIMENSION xoff = static_cast<JDIMENSION>(req0), width = static_cast<JDIMENSION>(req1 - req0);
  if (req0 > 0 || req1 < full_w) jpeg_crop_scanline(&s.cinfo, &xoff, &width);
  const int row_w = static_cast<int>(s.cinfo.output_width);
  const size_t stride = static_cast<size_t>(row_w) * 3;
  buf.resize(stride * static_cast<size_t>(y1 - y0));
  if (s.cmyk) s.row.resize(static_cast<size_t>(row_w) * 4);
  if (y0 > 0) jpeg_skip_scanlines(&s.cinfo, static_cast<JDIMENSION>(y0));
  while (static_cast<int>(s.cinfo.output_scanline) < y1) {
    uint8_t* out = buf.data() + static_cast<size_t>(s.cinfo.output_scanline - y0) * stride;
    JSAMPROW row = s.cmyk ? s.row.data() : out;
    jpeg_read_scanlines(&s.cinfo, &row, 1);
    if (s.cmyk) cmyk_to_rgb(row, out, row_w, s.inverted);
  }
  if (y1 < full_h && ends_with_eoi(s.data, s.size)) {
    jpeg_abort_decompress(&s.cinfo);  // the rest is intact; no need to decode it
  } else {
    // Read to the end so that a truncated or corrupt tail is reported.
    if (!s.cmyk) s.row.resize(stride);
    while (s.cinfo.output_scanline < s.cinfo.output_height) {
      JSAMPROW row = s.row.data();
      jpeg_read_scanlines(&s.cinfo, &row, 1);
    }
    jpeg_finish_decompress(&s.cinfo);
  }
  *origin_x = x0;
  *origin_y = y0;
  return {buf.data() + static_cast<size_t>(x0 - static_cast<int>(xoff)) * 3, x1 - x0, y1 - y0,
          stride};
}

ImageInfo jpeg_probe(const uint8_t* data, size_t n) {
  thread_local JpegDecoder probe_decoder;
  ImageInfo info = probe_decoder.open(data, n, INT64_MAX);
  return info;
}

}  // namespace stoker
