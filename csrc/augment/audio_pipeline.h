// The path of one audio field: choose the crop from the sample's draws,
// decode and resample just those samples (codecs/audio_decoder.h), written
// straight into the batch slot as float32 rows, one per channel.
//
// NOTE [ Audio crops ]
// Crops are in the output rate's samples: RandomAudioCrop(seconds) takes
// round(seconds * rate) samples starting at a position drawn uniformly among
// those that fit; CenterAudioCrop the middle ones. A file shorter than its
// crop is taken whole: the rest of its row is zeros, and "<name>_lengths"
// says how many samples are real. Without a crop, the whole file, padded to
// the batch's longest. The draw comes from the sample's seed on its own
// stream (NOTE [ Random draws ] in producers/record_producer.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/media_record.h"

namespace stoker {

struct AudioFieldSpec {
  int sample_rate = 0;  ///< 0: the file's own
  int channels = 0;     ///< 0: the file's own
  /// The crop: 0 none, 1 random, 2 centre, of `seconds`.
  int crop = 0;
  double seconds = 0;
};

class AudioPipeline {
 public:
  /// UsageError for a rate, channel count or crop length out of range.
  explicit AudioPipeline(const AudioFieldSpec& spec);

  const AudioFieldSpec& spec() const { return spec_; }
  /// The crop's length in samples at `rate`, or -1 without one.
  int64_t crop_samples(int rate) const;
  /// This record's output: (rate, channels, samples per channel). DecodeError.
  struct Shape {
    int rate = 0;
    int channels = 0;
    int64_t samples = 0;
  };
  Shape output_shape(const uint8_t* data, size_t n) const;

  /// Decodes this record's crop for `seed` into `out` (`channels` rows of
  /// `row` floats; the samples past its length are zeros). Thread-safe.
  /// @return the samples per channel written
  int64_t run(const uint8_t* data, size_t n, uint64_t seed, float* out, int channels, int64_t row,
              int64_t* decode_ns = nullptr) const;

 private:
  AudioFieldSpec spec_;
};

}  // namespace stoker
