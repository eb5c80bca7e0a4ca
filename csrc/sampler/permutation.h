// A pseudo-random bijection of [0, n) that needs O(1) memory: a balanced
// Feistel network over the smallest power-of-four domain that covers n, with
// cycle walking to stay inside [0, n). The domain is < 4n, so a lookup walks
// fewer than 4 steps on average.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace stoker {

/// splitmix64's finaliser: a strong 64-bit mixer, used to derive keys and seeds.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Combines values into one seed; order matters.
inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

class Permutation {
 public:
  static constexpr int kRounds = 6;

  /// A permutation of [0, n) determined by `key`.
  Permutation(uint64_t n, uint64_t key);

  uint64_t size() const { return n_; }
  /// The image of i (i < n).
  uint64_t operator()(uint64_t i) const;
  /// out[j] = (*this)(in[j]) for j < n. The same values, several computed at
  /// once: one image is a chain of dependent multiplies (rounds, then cycle
  /// walks), so interleaving independent ones keeps the multiplier busy.
  /// `in` and `out` may be the same array.
  void map(const uint64_t* in, uint64_t* out, size_t n) const;

 private:
  uint64_t encrypt(uint64_t x) const;

  uint64_t n_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  std::array<uint64_t, kRounds> keys_{};
};

}  // namespace stoker
