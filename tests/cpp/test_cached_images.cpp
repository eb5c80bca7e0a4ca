// Images through the decoded cache and from raw pixel records: what the ops
// write is the same with and without the cache (NOTE [ Exact pixels ] in
// geometry/canvas.cpp), on a miss and on a hit; cache_max_side gives the same
// pixels whatever the cache holds; raw records are their own pixels; and no op
// ever writes into a cached image or a record.
#include <png.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>

#include "cache/decoded_cache.h"
#include "check.h"
#include "codecs/jpeg_decoder.h"
#include "codecs/raw_image.h"
#include "common/error.h"
#include "geometry/image_pipeline.h"
#include "test_images.h"

using namespace stoker;
using namespace stoker::test;

namespace {

const double kR0 = 3.0 / 4, kR1 = 4.0 / 3;

ImagePipeline pipeline(std::vector<ImageOp> ops) { return ImagePipeline({}, std::move(ops)); }

Bytes run(const ImagePipeline& p, const Bytes& data, uint64_t seed, CacheSlot slot = {}) {
  auto [h, w] = p.output_size(data.data(), data.size());
  Bytes out(static_cast<size_t>(h) * w * 3);
  p.run(data.data(), data.size(), seed, out.data(), h, w, nullptr, nullptr, slot);
  return out;
}

std::shared_ptr<DecodedCache> cache(int64_t slots, int max_side = 0, int64_t budget = 64 << 20) {
  DecodedCacheOptions o;
  o.budget = budget;
  o.slots = slots;
  o.variants = max_side ? 1 : 4;
  o.max_side = max_side;
  o.dir = "";  // private memory: the sharing is test_decoded_cache's
  return DecodedCache::open(o);
}

Bytes raw_record(const Bytes& px, int w, int h, int channels) {
  Bytes r(kRawHeaderBytes + px.size());
  write_raw_header(r.data(), w, h, channels);
  std::memcpy(r.data() + kRawHeaderBytes, px.data(), px.size());
  return r;
}

Bytes full_decode(const Bytes& jpeg, int* w, int* h) {
  JpegDecoder d;
  const ImageInfo info = d.open(jpeg.data(), jpeg.size(), INT64_MAX);
  Bytes out(static_cast<size_t>(info.width) * info.height * 3);
  d.decode_full(out.data(), static_cast<size_t>(info.width) * 3);
  *w = info.width;
  *h = info.height;
  return out;
}

// The JPEGs of every kind the decoder handles differently: chroma subsampled or
// not, progressive, grayscale, CMYK (Adobe YCCK), at odd sizes.
std::vector<Bytes> jpegs() {
  std::vector<Bytes> out;
  out.push_back(encode_jpeg(photo(203, 150, 3, 1), 203, 150, JCS_RGB, 90, true));
  out.push_back(encode_jpeg(photo(317, 481, 3, 2), 317, 481, JCS_RGB, 90, false));
  out.push_back(encode_jpeg(photo(640, 417, 3, 3), 640, 417, JCS_RGB, 60, true, true));
  out.push_back(encode_jpeg(photo(211, 333, 1, 4), 211, 333, JCS_GRAYSCALE, 90));
  out.push_back(encode_jpeg(photo(190, 145, 4, 5), 190, 145, JCS_CMYK, 90));
  return out;
}

// What the cache relies on: at every DCT scale, a region decode is a window of
// the whole image decoded at that scale, value for value.
void test_scaled_regions_are_windows_of_scaled_decodes() {
  int checked = 0;
  for (const Bytes& jpeg : jpegs()) {
    JpegDecoder probe;
    const ImageInfo info = probe.open(jpeg.data(), jpeg.size(), INT64_MAX);
    const int w = info.width, h = info.height;
    for (int num : {1, 2, 4, 8}) {
      const int sw = JpegDecoder::scaled_size(w, num), sh = JpegDecoder::scaled_size(h, num);
      Bytes whole(static_cast<size_t>(sw) * sh * 3);
      JpegDecoder d;
      d.open(jpeg.data(), jpeg.size(), INT64_MAX);
      d.decode_scaled(num, whole.data(), static_cast<size_t>(sw) * 3);
      uint32_t r = static_cast<uint32_t>(w * 31 + num);
      auto next = [&](int mod) {
        r = r * 1664525u + 1013904223u;
        return static_cast<int>((r >> 8) % static_cast<uint32_t>(mod));
      };
      for (int t = 0; t < 40; ++t) {
        const int x = next(w), y = next(h);
        const PixelRect rect{x, y, 1 + next(w - x), 1 + next(h - y)};
        JpegDecoder e;
        e.open(jpeg.data(), jpeg.size(), INT64_MAX);
        Bytes buf;
        int ox = 0, oy = 0;
        const RgbView v = e.decode_region(rect, num, buf, &ox, &oy);
        int bad = 0;
        for (int yy = 0; yy < v.height; ++yy)
          bad += std::memcmp(v.data + static_cast<size_t>(yy) * v.stride,
                             whole.data() + (static_cast<size_t>(yy + oy) * sw + ox) * 3,
                             static_cast<size_t>(v.width) * 3) != 0;
        if (bad)
          std::printf("%dx%d at %d/8, rect %d %d %d %d: %d rows differ\n", w, h, num, rect.x,
                      rect.y, rect.w, rect.h, bad);
        CHECK_EQ(bad, 0);
        ++checked;
      }
    }
  }
  std::printf("%d scaled regions checked\n", checked);
}

// The ops of every path the canvas takes: a region decode at DCT scales 8, 4, 2
// and 1 (RandomResizedCrop to a small size), padding past the edges, a crop
// without a resize (a full-scale region), no op at all (a whole decode), colour
// ops that write the pixels in place.
std::vector<ImagePipeline> pipelines() {
  std::vector<ImagePipeline> out;
  out.push_back(pipeline(
      {ops::RandomResizedCrop{64, 64, 0.08, 1, kR0, kR1}, ops::RandomHorizontalFlip{0.5}}));
  out.push_back(pipeline({ops::RandomResizedCrop{8, 8, 0.3, 1, kR0, kR1}}));  // DCT 1/8, 2/8
  out.push_back(pipeline({ops::Resize{0, 0, 40, 0}, ops::CenterCrop{40, 40}}));
  out.push_back(pipeline({ops::CenterCrop{160, 230}}));  // past the edges of the small ones
  out.push_back(pipeline({ops::CenterCrop{50, 70}, ops::ColorJitter{{0.5, 1.5}, {0.5, 1.5}}}));
  out.push_back(pipeline({ops::GaussianBlur{3, 3, {0.5, 1.5}}}));  // in place on the whole image
  out.push_back(pipeline({}));
  return out;
}

void test_cached_batches_are_bit_identical() {
  std::vector<Bytes> images = jpegs();
  images.push_back(encode_png(photo(120, 90, 3, 9), 120, 90, PNG_COLOR_TYPE_RGB));
  const std::vector<ImagePipeline> pipes = pipelines();
  auto c = cache(static_cast<int64_t>(images.size()));
  int runs = 0;
  for (int round = 0; round < 3; ++round)  // misses, then hits (and the other scales' misses)
    for (size_t i = 0; i < images.size(); ++i)
      for (size_t p = 0; p < pipes.size(); ++p)
        for (uint64_t seed = 0; seed < 6; ++seed) {
          const uint64_t s = seed * 1000 + static_cast<uint64_t>(round);
          const Bytes want = run(pipes[p], images[i], s);
          const Bytes got = run(pipes[p], images[i], s, {c.get(), static_cast<int64_t>(i)});
          if (want != got)
            std::printf("image %zu, pipeline %zu, seed %llu differs\n", i, p,
                        static_cast<unsigned long long>(s));
          CHECK(want == got);
          ++runs;
        }
  const DecodedCacheStats st = c->stats();
  std::printf("%d runs: %lld hits, %lld misses, %lld entries\n", runs,
              static_cast<long long>(st.hits), static_cast<long long>(st.misses),
              static_cast<long long>(st.entries));
  CHECK(st.hits > st.misses);
  CHECK(st.entries > static_cast<int64_t>(images.size()));  // some images at several scales
  CHECK_EQ(st.images, static_cast<int64_t>(images.size()));
  // No op wrote into an entry: each is still the image decoded at its scale.
  for (size_t i = 0; i + 1 < images.size(); ++i) {
    CachedImage e;
    if (!c->find(static_cast<int64_t>(i), 3, &e)) continue;
    int w, h;
    const Bytes full = full_decode(images[i], &w, &h);
    for (int y = 0; y < h; ++y)
      CHECK(std::memcmp(e.pix.data + static_cast<size_t>(y) * e.pix.stride,
                        full.data() + static_cast<size_t>(y) * w * 3,
                        static_cast<size_t>(w) * 3) == 0);
  }
}

// A cache with no room: images decode as without one, and nothing changes.
void test_a_full_cache_changes_nothing() {
  const std::vector<Bytes> images = jpegs();
  auto c = cache(static_cast<int64_t>(images.size()), 0,
                 DecodedCache::index_bytes(static_cast<int64_t>(images.size()), 4) + 4096);
  const ImagePipeline p = pipelines()[0];
  for (size_t i = 0; i < images.size(); ++i)
    for (uint64_t seed = 0; seed < 4; ++seed)
      CHECK(run(p, images[i], seed) == run(p, images[i], seed, {c.get(), int64_t(i)}));
  CHECK_EQ(c->stats().entries, 0);
  CHECK(c->stats().declined > 0);
}

// cache_max_side: the pixels come from the reduced copy on a miss, on a hit and
// when the cache has no room for it, so they are the same whatever it holds.
void test_max_side_gives_the_same_pixels_whatever_the_cache_holds() {
  std::vector<Bytes> images = jpegs();
  images.push_back(encode_png(photo(300, 200, 3, 9), 300, 200, PNG_COLOR_TYPE_RGB));
  const int64_t n = static_cast<int64_t>(images.size());
  auto roomy = cache(n, 96);
  auto full = cache(n, 96, DecodedCache::index_bytes(n, 1) + 4096);
  for (const ImagePipeline& p : pipelines())
    for (int64_t i = 0; i < n; ++i)
      for (uint64_t seed = 0; seed < 3; ++seed) {
        const Bytes& img = images[static_cast<size_t>(i)];
        const Bytes miss = run(p, img, seed, {roomy.get(), i});
        const Bytes hit = run(p, img, seed, {roomy.get(), i});
        const Bytes none = run(p, img, seed, {full.get(), i});
        CHECK(miss == hit && hit == none);
        CHECK(miss.size() == run(p, img, seed).size());  // the same output size
      }
  CHECK_EQ(roomy->stats().images, n);
  CHECK_EQ(full->stats().entries, 0);
  CachedImage e;
  CHECK(roomy->find(2, 0, &e) && e.pix.width == 96 && e.full_w == 640 && e.full_h == 417);
  CHECK(e.pix.height == 63);  // 417 * 96 / 640, rounded
  // A max_side above the image: the copy is the image itself, decoded whole.
  auto big = cache(n, 4096);
  const ImagePipeline crop = pipeline({ops::CenterCrop{50, 70}});
  for (int64_t i = 0; i < n; ++i)
    CHECK(run(crop, images[static_cast<size_t>(i)], 0, {big.get(), i}) ==
          run(crop, images[static_cast<size_t>(i)], 0));
}

// Raw records: the pixels as stored, through the same ops; no op writes into them.
void test_raw_records_are_their_own_pixels() {
  const int w = 320, h = 240;
  const Bytes jpeg = encode_jpeg(photo(w, h, 3, 7), w, h, JCS_RGB, 90);
  int dw, dh;
  const Bytes px = full_decode(jpeg, &dw, &dh);
  Bytes raw = raw_record(px, w, h, 3);
  const Bytes kept = raw;
  const ImageInfo info = probe_image(raw.data(), raw.size());
  CHECK(info.width == w && info.height == h);
  // Paths that decode at full scale from a JPEG give exactly the raw record's output.
  const std::vector<ImagePipeline> same = {
      pipeline(
          {ops::RandomResizedCrop{224, 224, 0.08, 1, kR0, kR1}, ops::RandomHorizontalFlip{0.5}}),
      pipeline({ops::CenterCrop{50, 70}, ops::ColorJitter{{0.5, 1.5}, {0.5, 1.5}}}),
      pipeline({ops::GaussianBlur{3, 3, {0.5, 1.5}}}), pipeline({})};
  for (const ImagePipeline& p : same)
    for (uint64_t seed = 0; seed < 8; ++seed) CHECK(run(p, raw, seed) == run(p, jpeg, seed));
  CHECK(raw == kept);  // nothing wrote into the record
  // A cache passes raw records by: nothing to keep.
  auto c = cache(1);
  CHECK(run(same[0], raw, 3, {c.get(), 0}) == run(same[0], raw, 3));
  CHECK_EQ(c->stats().entries + c->stats().hits + c->stats().misses, 0);
  // One channel comes out as RGB, as a grayscale JPEG or PNG does.
  const Bytes gray = photo(31, 17, 1, 3);
  const Bytes one = run(pipeline({}), raw_record(gray, 31, 17, 1), 0);
  for (size_t i = 0; i < gray.size(); ++i)
    CHECK(one[3 * i] == gray[i] && one[3 * i + 1] == gray[i] && one[3 * i + 2] == gray[i]);
  // Bad records are DecodeErrors, never reads past the record.
  Bytes cut(raw.begin(), raw.end() - 1);
  CHECK_THROWS(DecodeError, run(pipeline({}), cut, 0));
  Bytes two = raw;
  two[5] = 2;
  CHECK_THROWS(DecodeError, run(pipeline({}), two, 0));
  Bytes v2 = raw;
  v2[4] = 2;
  CHECK_THROWS(DecodeError, probe_image(v2.data(), v2.size()));
  Bytes huge = raw;
  write_raw_header(huge.data(), 1 << 20, 1 << 20, 3);
  CHECK_THROWS(DecodeError, run(pipeline({}), huge, 0));
}

}  // namespace

TEST_MAIN(test_scaled_regions_are_windows_of_scaled_decodes();
          test_cached_batches_are_bit_identical(); test_a_full_cache_changes_nothing();
          test_max_side_gives_the_same_pixels_whatever_the_cache_holds();
          test_raw_records_are_their_own_pixels())
