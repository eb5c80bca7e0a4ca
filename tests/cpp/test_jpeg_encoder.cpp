// Unit tests of csrc/codecs/jpeg_encoder: what it writes decodes (by stoker's own decoder)
// to the pixels it was given, within JPEG's loss; a stride is honoured; bad arguments are
// UsageErrors before libjpeg is called.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "check.h"
#include "codecs/jpeg_decoder.h"
#include "codecs/jpeg_encoder.h"
#include "common/error.h"
#include "test_images.h"

using namespace stoker;
using namespace stoker::test;

namespace {

// Mean absolute difference between `src` (w x h x channels) and the RGB decode of `jpeg`.
double decoded_error(const std::vector<uint8_t>& jpeg, const Bytes& src, int w, int h,
                     int channels) {
  JpegDecoder dec;
  const ImageInfo info = dec.open(jpeg.data(), jpeg.size(), INT64_MAX);
  CHECK(info.width == w && info.height == h);
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  dec.decode_full(rgb.data(), static_cast<size_t>(w) * 3);
  double err = 0;
  for (size_t p = 0; p < static_cast<size_t>(w) * h; ++p)
    for (int c = 0; c < 3; ++c)
      err += std::abs(int(rgb[p * 3 + c]) - int(src[p * channels + (channels == 3 ? c : 0)]));
  return err / (static_cast<double>(w) * h * 3);
}

void test_rgb_and_gray_round_trip() {
  const int w = 97, h = 61;  // not multiples of the iMCU size
  const Bytes rgb = photo(w, h, 3);
  const std::vector<uint8_t> q95 = jpeg_encode(rgb.data(), w, h, 3, size_t(w) * 3, 95);
  CHECK(is_jpeg(q95.data(), q95.size()));
  CHECK(decoded_error(q95, rgb, w, h, 3) < 4.0);
  const std::vector<uint8_t> q20 = jpeg_encode(rgb.data(), w, h, 3, size_t(w) * 3, 20);
  CHECK(q20.size() < q95.size());  // the quality is applied
  const Bytes gray = photo(w, h, 1);
  const std::vector<uint8_t> g = jpeg_encode(gray.data(), w, h, 1, size_t(w), 100);
  CHECK(decoded_error(g, gray, w, h, 1) < 2.0);
}

void test_stride_is_honoured() {
  const int w = 33, h = 20;
  const Bytes rgb = photo(w, h, 3);
  const size_t stride = size_t(w) * 3 + 17;  // padded rows, the padding garbage
  Bytes padded(stride * h, 0xAB);
  for (int y = 0; y < h; ++y)
    std::copy(rgb.begin() + size_t(y) * w * 3, rgb.begin() + size_t(y + 1) * w * 3,
              padded.begin() + size_t(y) * stride);
  CHECK(jpeg_encode(padded.data(), w, h, 3, stride, 90) ==
        jpeg_encode(rgb.data(), w, h, 3, size_t(w) * 3, 90));
}

void test_bad_arguments_are_usage_errors() {
  const Bytes px(64 * 3, 0);
  CHECK_THROWS(UsageError, jpeg_encode(px.data(), 0, 1, 3, 3, 90));
  CHECK_THROWS(UsageError, jpeg_encode(px.data(), 70000, 1, 3, 210000, 90));
  CHECK_THROWS(UsageError, jpeg_encode(px.data(), 8, 8, 4, 32, 90));
  CHECK_THROWS(UsageError, jpeg_encode(px.data(), 8, 8, 3, 24, 0));
  CHECK_THROWS(UsageError, jpeg_encode(px.data(), 8, 8, 3, 24, 101));
  CHECK_THROWS(UsageError, jpeg_encode(px.data(), 8, 8, 3, 23, 90));
}

}  // namespace

TEST_MAIN(test_rgb_and_gray_round_trip(); test_stride_is_honoured();
          test_bad_arguments_are_usage_errors())
