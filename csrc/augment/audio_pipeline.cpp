#include "augment/audio_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codecs/audio_decoder.h"
#include "codecs/media.h"
#include "common/error.h"
#include "geometry/detail/rng.h"
#include "sampler/permutation.h"

namespace stoker {

namespace {

constexpr uint64_t kCropStream = 0x61756469ull;  // "audi"

}  // namespace

AudioPipeline::AudioPipeline(const AudioFieldSpec& spec) : spec_(spec) {
  require_media_codecs();
  STOKER_CHECK(spec_.sample_rate >= 0 && spec_.sample_rate <= 768000, UsageError,
               "audio sample_rate must be positive (at most 768000), got ", spec_.sample_rate);
  STOKER_CHECK(spec_.channels >= 0 && spec_.channels <= 64, UsageError,
               "audio channels must be in [1, 64], got ", spec_.channels);
  STOKER_CHECK(spec_.crop == 0 ||
                   (spec_.seconds > 0 && std::isfinite(spec_.seconds) && spec_.seconds <= 86400),
               UsageError, "an audio crop's seconds must be positive, got ", spec_.seconds);
}

int64_t AudioPipeline::crop_samples(int rate) const {
  if (spec_.crop == 0) return -1;
  return std::max<int64_t>(1, std::llround(spec_.seconds * rate));
}

AudioPipeline::Shape AudioPipeline::output_shape(const uint8_t* data, size_t n) const {
  const AudioRecord rec = parse_audio_record(data, n);
  Shape s;
  s.rate = spec_.sample_rate ? spec_.sample_rate : rec.sample_rate;
  s.channels = spec_.channels ? spec_.channels : rec.channels;
  s.samples = resampled_length(rec, s.rate);
  const int64_t crop = crop_samples(s.rate);
  if (crop >= 0) s.samples = std::min(s.samples, crop);
  return s;
}

int64_t AudioPipeline::run(const uint8_t* data, size_t n, uint64_t seed, float* out, int channels,
                           int64_t row, int64_t* decode_ns) const {
  const AudioRecord rec = parse_audio_record(data, n);
  const int rate = spec_.sample_rate ? spec_.sample_rate : rec.sample_rate;
  const int64_t total = resampled_length(rec, rate);
  int64_t start = 0, count = total;
  const int64_t crop = crop_samples(rate);
  if (crop >= 0 && crop < total) {
    count = crop;
    if (spec_.crop == 1) {
      detail::SplitMix64 rng(hash_combine(seed, kCropStream));
      start = rng.randint(0, total - crop);
    } else {
      start = (total - crop) / 2;
    }
  }
  STOKER_CHECK(count <= row, DecodeError, "audio of ", count,
               " samples does not fit the batch's rows of ", row);
  const int64_t got = decode_audio(rec, start, count, rate, channels, out, row, decode_ns);
  for (int c = 0; c < channels; ++c) std::fill(out + c * row + got, out + (c + 1) * row, 0.0f);
  return got;
}

}  // namespace stoker
