// One source's stream of samples in a mixture (NOTE [ Mixtures ] in
// mixture.h): its samples pass after pass, each pass in its own order, so a
// source the mixture reads more often than its size repeats, each time in a
// fresh order, and no sample comes twice before every sample of the source
// has come once.
//
// Pass p is ordered exactly as an epoch p of a plain loader over the source
// with seed `key` (sampler.h: the keyed permutation, the shard-window order,
// or the identity without shuffle), so a remote source's shard_window keeps
// any stretch of its stream within a few shards, and its shard schedule is
// that of its current pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "sampler/sampler.h"

namespace stoker {

class SourceStream {
 public:
  /// @param shard_records the records of each shard (one entry for a source
  ///        without shards: token windows, packed rows); their sum >= 1
  /// @param key the stream's seed: pass p is ordered by (key, p)
  /// @param shard_window shards per window (0 = a global shuffle); needs shuffle
  SourceStream(std::vector<int64_t> shard_records, bool shuffle, int64_t shard_window,
               uint64_t key);

  /// Samples per pass.
  int64_t size() const { return n_; }
  /// The dataset index of sample `c` of the stream (c >= 0): sample c mod n of
  /// pass c div n.
  int64_t index(int64_t c) const;
  /// out[i] = index(c[i]) for i < n (positions of one pass share its order).
  void map(const int64_t* c, int64_t* out, size_t n) const;
  /// The shards the stream reads from sample `from` on, in the order it
  /// starts reading them, at most `max_shards`, continuing into the next pass
  /// (EpochOrder::shard_schedule; a shard already named is not named again).
  std::vector<size_t> shard_schedule(int64_t from, size_t max_shards) const;
  /// Pass p's order: epoch p of a plain one-rank loader over the source with
  /// seed `key` (what a remote source's fetch plan follows).
  EpochOrder pass_order(int64_t p) const { return *pass(p); }

 private:
  std::shared_ptr<const EpochOrder> pass(int64_t p) const;

  std::vector<int64_t> shard_records_;
  SamplerOptions opts_;
  int64_t n_ = 0;
  bool cached_ = false;  // orders worth keeping (several shards: O(shards) to make)
  struct Cache {
    std::mutex mu;
    std::vector<std::pair<int64_t, std::shared_ptr<const EpochOrder>>> passes;  // by mu
  };
  std::unique_ptr<Cache> cache_ = std::make_unique<Cache>();  // movable
};

}  // namespace stoker
