// libFuzzer target: arbitrary bytes through the media fields' index and
// container parsing. The first byte chooses the path, the rest is the input:
//   0: a video field's record (its frame index, then the file): parsed, then a
//      few of its frames decoded as a loader worker decodes a clip;
//   1: a video file: indexed as stoker.video() writes it, then the record
//      parsed back and its first, middle and last frames decoded;
//   2: an audio field's record: parsed, then a crop decoded at its own rate
//      and resampled to mono 8 kHz;
//   3: an audio file: indexed as stoker.audio() writes it, then decoded whole.
// Every path must succeed or throw stoker::Error (DecodeError naming the
// reason): no crash, no read outside the input (ASan), no UB (UBSan), no leak.
// Frames over kMaxPixels are not decoded (the loader refuses them before
// decoding, as max_image_pixels).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codecs/audio_decoder.h"
#include "codecs/media_record.h"
#include "codecs/video_decoder.h"
#include "common/error.h"

using namespace stoker;

namespace {

constexpr int64_t kMaxPixels = 1 << 20;
constexpr int64_t kMaxSamples = 1 << 16;  // decoded per crop

void decode_some_frames(const uint8_t* data, size_t n) {
  const VideoRecord rec = parse_video_record(data, n);
  if (int64_t{rec.width} * rec.height > kMaxPixels) return;
  std::vector<int32_t> ids = {0, rec.num_frames / 2, rec.num_frames - 1};
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const size_t frame = static_cast<size_t>(rec.width) * rec.height * 3;
  size_t seen = 0;
  decode_video_frames(rec, ids.data(), ids.size(), 16, [&](size_t i, uint8_t* rgb) {
    if (i != seen++) std::abort();  // in order, each once
    volatile uint8_t sum = 0;       // every byte of the frame is readable
    for (size_t k = 0; k < frame; k += 4096) sum = static_cast<uint8_t>(sum + rgb[k]);
    sum = static_cast<uint8_t>(sum + rgb[frame - 1] + rgb[-16]);
  });
  if (seen != ids.size()) std::abort();  // all frames or an exception
}

void decode_a_crop(const uint8_t* data, size_t n) {
  const AudioRecord rec = parse_audio_record(data, n);
  const int64_t count = std::min<int64_t>(rec.samples, kMaxSamples);
  const int64_t start = (rec.samples - count) / 2;
  if (rec.channels > 64) return;
  std::vector<float> own(static_cast<size_t>(count * rec.channels));
  const int64_t got =
      decode_audio(rec, start, count, rec.sample_rate, rec.channels, own.data(), count);
  if (got < 0 || got > count) std::abort();
  const int64_t mono = std::min<int64_t>(resampled_length(rec, 8000), kMaxSamples);
  std::vector<float> low(static_cast<size_t>(mono));
  const int64_t got8 = decode_audio(rec, 0, mono, 8000, 1, low.data(), mono);
  if (got8 < 0 || got8 > mono) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* in = data + 1;
  const size_t n = size - 1;
  try {
    switch (data[0] % 4) {
      case 0:
        decode_some_frames(in, n);
        break;
      case 1: {
        const std::vector<uint8_t> rec = make_video_record(in, n);
        decode_some_frames(rec.data(), rec.size());
        break;
      }
      case 2:
        decode_a_crop(in, n);
        break;
      default: {
        const std::vector<uint8_t> rec = make_audio_record(in, n);
        decode_a_crop(rec.data(), rec.size());
        break;
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
