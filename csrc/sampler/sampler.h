// Which samples make batch k of an epoch, for one rank.
//
// The epoch order is a permutation of [0, n) keyed by (seed, epoch), or the
// identity without shuffle: one global sequence. Rank r of w takes positions
// offset + r, offset + r + w, ... of it (as DistributedSampler does, from the
// `offset` global samples already consumed: a resumed epoch, at any world
// size). Without drop_last the sequence wraps around so every rank gets
// ceil((n - offset) / w) samples; with drop_last each gets floor. Batch k is
// positions [k*B, min((k+1)*B, share)) of the rank's sequence. Nothing here
// depends on the number of threads, and every rank computes the same counts,
// so ranks never disagree on the number of batches.
#pragma once

#include <cstdint>
#include <optional>

#include "sampler/permutation.h"

namespace stoker {

struct SamplerOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
};

/// One rank's share of one epoch (or of the rest of it, from an offset).
class EpochOrder {
 public:
  /// Validates the arguments (UsageError).
  EpochOrder(int64_t num_records, const SamplerOptions& opts, uint64_t epoch, int64_t rank,
             int64_t world_size, int64_t offset);

  int64_t num_samples() const { return share_; }  ///< this rank's samples (padding included)
  int64_t num_batches() const { return batches_; }
  int64_t batch_length(int64_t k) const;
  /// Dataset index of sample `pos` of batch `k`.
  int64_t index(int64_t k, int64_t pos) const;
  /// Global samples consumed once every rank has taken `batches` batches.
  int64_t consumed_after(int64_t batches) const;

 private:
  uint64_t n_;
  int64_t batch_size_;
  uint64_t rank_, world_, offset_;
  int64_t share_ = 0;
  int64_t batches_ = 0;
  std::optional<Permutation> perm_;
};

}  // namespace stoker
