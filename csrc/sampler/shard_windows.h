// The shard-window shuffle: an epoch order that reads a few shards at a time.
//
// NOTE [ Shard windows ]
// A global shuffle reads from every shard in every batch, so a local cache
// smaller than the dataset cannot serve it. The shard-window order
// (SamplerOptions::shard_window = N) keeps every stretch of the epoch within N
// shards (Mosaic Streaming's and LitData's answer). For S shards, with
// key = hash_combine(seed, epoch):
//
//   1. slots: slot j holds shard order(j), order = Permutation(S, shard_order_key(key));
//   2. windows: window w is the slots [w*N, min((w+1)*N, S));
//   3. window w's samples: the records of its slots' shards, concatenated in
//      slot order (m_w of them); its local position l is the sample
//      Permutation(m_w, window_key(key, w))(l) of that list;
//   4. position q of the epoch: windows one after the other, so q is in the
//      window w with start_w <= q < start_w + m_w, start_w = the records of
//      the slots before window w.
//
//      shards  0 1 2 3 4 5 6        (records of each, some empty)
//      slots   5 2 | 0 6 | 3 1 | 4  (N = 2: four windows, the last shorter)
//      epoch   [ samples of 5,2 mixed ][ of 0,6 mixed ][ of 3,1 mixed ][ of 4 ]
//
// The rank partition, padding, batches and resume are defined on positions q,
// exactly as for the global shuffle (sampler.h): only the map from position to
// dataset index differs. An epoch precomputes prefix sums of the records in
// slot order (O(S)); a lookup is a binary search for the window, the window's
// permutation, and a binary search for the slot within the window: O(log S).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sampler/permutation.h"

namespace stoker {

namespace shard_window_keys {

/// Order of the shards in the epoch with key `epoch_key` (= hash_combine(seed, epoch)).
inline uint64_t shard_order(uint64_t epoch_key) {
  return hash_combine(epoch_key, 0x7368617264ull);  // "shard"
}
/// Order of the samples of window `w`.
inline uint64_t window(uint64_t epoch_key, uint64_t w) {
  return hash_combine(hash_combine(epoch_key, 0x77696e646f77ull), w);  // "window"
}

}  // namespace shard_window_keys

class ShardWindows {
 public:
  /// @param shard_records the records of each shard, in dataset order (>= 0 each)
  /// @param window shards per window (>= 1; >= the shard count: one window)
  /// @param epoch_key hash_combine(seed, epoch)
  ShardWindows(std::span<const int64_t> shard_records, int64_t window, uint64_t epoch_key);

  /// Samples in the epoch (the dataset's records).
  uint64_t size() const { return window_start_.back(); }
  size_t num_windows() const { return window_start_.size() - 1; }
  /// First position of window `w` (w <= num_windows(): the end).
  uint64_t window_start(size_t w) const { return window_start_[w]; }
  /// The window holding position q (q < size()).
  size_t window_of(uint64_t q) const;

  /// Dataset index at position q (q < size()).
  uint64_t operator()(uint64_t q) const;
  /// out[j] = (*this)(in[j]) for j < n; positions of one window that follow
  /// each other share one permutation and go through Permutation::map.
  /// `in` and `out` may be the same array.
  void map(const uint64_t* in, uint64_t* out, size_t n) const;

  /// Appends the shards of window `w` that hold records, in slot order.
  void append_shards(size_t w, std::vector<size_t>& out) const;

 private:
  // Dataset index of sample `g` of the concatenated slots (g inside window w).
  uint64_t locate(size_t w, uint64_t g) const;
  Permutation window_permutation(size_t w) const;

  size_t window_;  // shards per window (at most the shard count)
  uint64_t epoch_key_;
  std::vector<size_t> slot_shard_;      // slot -> shard
  std::vector<uint64_t> slot_start_;    // slot -> records of the slots before it; then the total
  std::vector<uint64_t> slot_base_;     // slot -> dataset index of its shard's first record
  std::vector<uint64_t> window_start_;  // window -> slot_start_ of its first slot; then the total
};

}  // namespace stoker
