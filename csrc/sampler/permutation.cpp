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

void Permutation::map(const uint64_t* in, uint64_t* out, size_t n) const {
  if (n_ <= 1) {
    for (size_t j = 0; j < n; ++j) out[j] = in[j];
    return;
  }
  // kLanes images in flight; a lane whose value lands in [0, n) writes it out
  // and takes the next input, so cycle walks of different lengths do not wait
  // for each other.
  constexpr size_t kLanes = 8;
  uint64_t x[kLanes];
  size_t dst[kLanes];
  bool live[kLanes];
  size_t next = 0, live_count = 0;
  for (size_t l = 0; l < kLanes; ++l) {
    live[l] = next < n;
    if (live[l]) {
      x[l] = in[next];
      dst[l] = next++;
      ++live_count;
    } else {
      x[l] = 0;
    }
  }
  while (live_count > 0) {
    uint64_t left[kLanes], right[kLanes];
    for (size_t l = 0; l < kLanes; ++l) {
      left[l] = x[l] >> half_bits_;
      right[l] = x[l] & half_mask_;
    }
    for (uint64_t rk : keys_) {
      for (size_t l = 0; l < kLanes; ++l) {
        const uint64_t nx = left[l] ^ (mix64(right[l] ^ rk) & half_mask_);
        left[l] = right[l];
        right[l] = nx;
      }
    }
    for (size_t l = 0; l < kLanes; ++l) {
      if (!live[l]) continue;
      x[l] = (left[l] << half_bits_) | right[l];
      if (x[l] >= n_) continue;  // cycle walking: encrypt again
      out[dst[l]] = x[l];
      if (next < n) {
        x[l] = in[next];
        dst[l] = next++;
      } else {
        live[l] = false;
        --live_count;
      }
    }
  }
}

}  // namespace stoker
