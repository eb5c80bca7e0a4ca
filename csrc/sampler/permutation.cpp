#include "sampler/permutation.h"

namespace stoker {

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = key;
  for (auto& rk : keys_) {
    k = mix64(k);
    rk = k;
  }
}

uint64_t Permutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (uint64_t rk : keys_) {
    uint64_t next = left ^ (mix64(right ^ rk) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  if (n_ <= 1) return i;
  uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);  // cycle walking: stays a bijection on [0, n)
  return x;
}

}  // namespace stoker
