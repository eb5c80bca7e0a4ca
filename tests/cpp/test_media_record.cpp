// Unit tests of the media records' parsing (codecs/media_record.h: a record cut short or
// inconsistent is a DecodeError, never a read past its end) and of the clip choice
// (geometry/video_pipeline.h, NOTE [ Clip sampling ]) on hand-made indexes. Frame-exact
// decoding is tested against PyAV in tests/test_video.py.
#include <cstring>
#include <vector>

#include "check.h"
#include "codecs/media_record.h"
#include "common/error.h"
#include "geometry/video_pipeline.h"

using namespace stoker;
using Bytes = std::vector<uint8_t>;

namespace {

template <typename T>
void put(Bytes& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

// A video record of frames at `pts` (time base 1/1000), a key frame every `gop`.
Bytes video_record(const std::vector<int64_t>& pts, int gop) {
  const uint32_t n = static_cast<uint32_t>(pts.size());
  const uint32_t keys = (n + gop - 1) / gop;
  const size_t head = kMediaHeaderBytes + n * sizeof(VideoFrameEntry) + keys * 16;
  Bytes b(head + 4, 0);
  std::memcpy(b.data(), kVideoMagic, 4);
  b[4] = kMediaVersion;
  put<uint32_t>(b, 8, static_cast<uint32_t>(head));
  put<uint32_t>(b, 12, n);
  put<uint32_t>(b, 16, keys);
  put<int32_t>(b, 24, 1);
  put<int32_t>(b, 28, 1000);
  put<int32_t>(b, 32, 64);
  put<int32_t>(b, 36, 48);
  for (uint32_t i = 0; i < n; ++i)
    put(b, kMediaHeaderBytes + i * 16, VideoFrameEntry{pts[i], i / gop, 0});
  for (uint32_t k = 0; k < keys; ++k)
    put(b, kMediaHeaderBytes + n * 16 + k * 16, VideoKeyEntry{pts[k * gop], pts[k * gop]});
  return b;
}

void test_parse_and_refuse() {
  std::vector<int64_t> pts;
  for (int i = 0; i < 30; ++i) pts.push_back(i * 40);
  Bytes rec = video_record(pts, 8);
  const VideoRecord r = parse_video_record(rec.data(), rec.size());
  CHECK_EQ(r.num_frames, 30);
  CHECK_EQ(r.num_keys, 4);
  CHECK_EQ(r.frame(17).key, 2u);
  CHECK(r.seconds(25) == 1.0);
  CHECK_EQ(r.file_size, 4u);
  // every cut of the index is refused
  for (size_t n = 0; n + 4 < rec.size(); n += 7)
    CHECK_THROWS(DecodeError, parse_video_record(rec.data(), n));
  Bytes bad = rec;
  put(bad, kMediaHeaderBytes + 5 * 16, VideoFrameEntry{0, 0, 0});  // times not ascending
  CHECK_THROWS(DecodeError, parse_video_record(bad.data(), bad.size()));
  bad = rec;
  put(bad, kMediaHeaderBytes + 5 * 16, VideoFrameEntry{200, 9, 0});  // no such key frame
  CHECK_THROWS(DecodeError, parse_video_record(bad.data(), bad.size()));
  bad = rec;
  put<uint32_t>(bad, 12, 1u << 31);  // a frame count the record cannot hold
  CHECK_THROWS(DecodeError, parse_video_record(bad.data(), bad.size()));
  bad = rec;
  put<int32_t>(bad, 40, kVideoProbeStreams | kVideoStoredProbe);
  put<int32_t>(bad, 44, 3);  // the stream probe's reorder delay
  CHECK_EQ(parse_video_record(bad.data(), bad.size()).reorder_delay, 3);
  put<int32_t>(bad, 44, kMaxReorderDelay + 1);  // more than any decoder holds back
  CHECK_THROWS(DecodeError, parse_video_record(bad.data(), bad.size()));
  bad = rec;
  bad[1] = 'X';
  CHECK_THROWS(DecodeError, parse_video_record(bad.data(), bad.size()));
  CHECK(!is_audio_record(rec.data(), rec.size()));
  CHECK_THROWS(DecodeError, parse_audio_record(rec.data(), rec.size()));
}

void test_audio_header() {
  Bytes b(kMediaHeaderBytes + 10, 0);
  std::memcpy(b.data(), kAudioMagic, 4);
  b[4] = kMediaVersion;
  put<uint32_t>(b, 8, kMediaHeaderBytes);
  put<int32_t>(b, 16, 44100);
  put<int32_t>(b, 20, 2);
  put<int64_t>(b, 24, 441000);
  const AudioRecord r = parse_audio_record(b.data(), b.size());
  CHECK_EQ(r.samples, 441000);
  CHECK_EQ(resampled_length(r, 16000), 160000);
  CHECK_EQ(resampled_length(r, 44100), 441000);
  put<int32_t>(b, 20, 0);  // no channels
  CHECK_THROWS(DecodeError, parse_audio_record(b.data(), b.size()));
}

void test_clips() {
  // a variable frame rate: 40 ms frames, then 100 ms ones
  std::vector<int64_t> pts;
  for (int i = 0; i < 20; ++i) pts.push_back(i * 40);
  for (int i = 0; i < 20; ++i) pts.push_back(800 + i * 100);
  Bytes rec = video_record(pts, 10);
  const VideoRecord r = parse_video_record(rec.data(), rec.size());
  ClipSpec by_frames{true, 6, 3, 0};
  std::vector<int> starts(40, 0);
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const std::vector<int32_t> ids = choose_clip(by_frames, r, seed);
    CHECK_EQ(ids.size(), 6u);
    for (size_t i = 1; i < ids.size(); ++i) CHECK_EQ(ids[i], ids[i - 1] + 3);
    CHECK(ids.back() < 40);
    ++starts[ids[0]];
    CHECK(choose_clip(by_frames, r, seed) == ids);  // a function of the seed
  }
  for (int s = 0; s <= 40 - 16; ++s) CHECK(starts[s] > 0);  // every start that fits
  // by time: 5 frames a second, each the frame shown then
  ClipSpec by_time{true, 4, 1, 5.0};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::vector<int32_t> ids = choose_clip(by_time, r, seed);
    const double t0 = r.seconds(ids[0]);
    for (int i = 0; i < 4; ++i) {
      const double at = t0 + i / 5.0;
      CHECK(r.seconds(ids[i]) <= at + 1e-9);
      CHECK(ids[i] + 1 == r.num_frames || r.seconds(ids[i] + 1) > at + 1e-9);
    }
  }
  // a clip longer than the video repeats its last frame
  ClipSpec long_clip{false, 30, 2, 0};
  const std::vector<int32_t> ids = choose_clip(long_clip, r, 0);
  CHECK_EQ(ids[0], 0);
  CHECK_EQ(ids[29], 39);
  CHECK_EQ(ids[25], 39);
}

}  // namespace

TEST_MAIN(test_parse_and_refuse(); test_audio_header(); test_clips();)
