// The per-image random stream of the ops. Seeded only by the sample's seed, so
// an image's crop and flip are the same on any thread and in any run.
#pragma once

#include <cstdint>

namespace stoker::detail {

/// splitmix64 (Steele, Lea, Flood 2014): one add and a strong finaliser per
/// draw; well mixed even for consecutive seeds, which is what the engine
/// hands out (derived from loader seed, epoch, sample index, field).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  /// Uniform double in [lo, hi).
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }

  /// Uniform integer in [lo, hi] (inclusive, as torch.randint(lo, hi + 1)).
  /// Lemire's multiply-shift: the bias is below 2^-32 for any image size.
  int64_t randint(int64_t lo, int64_t hi) {
    const uint64_t range = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(
                    static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * range) >> 64));
  }

 private:
  uint64_t state_;
};

}  // namespace stoker::detail
