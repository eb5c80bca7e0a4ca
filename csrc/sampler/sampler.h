// Which samples make batch k of an epoch, for one rank.
//
// The epoch order is a permutation of [0, n) keyed by (seed, epoch), or the
// identity without shuffle. Rank r of w takes positions r, r+w, r+2w, ... of
// that order (as DistributedSampler does); without drop_last the order wraps
// around so every rank gets ceil(n/w) samples, with drop_last each gets
// floor(n/w). Batch k is positions [k*B, min((k+1)*B, share)) of the rank's
// sequence. Nothing here depends on the number of threads.
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
  int64_t rank = 0;
  int64_t world_size = 1;
};

class Sampler {
 public:
  /// Validates the options (UsageError).
  Sampler(int64_t num_records, SamplerOptions opts);

  int64_t num_records() const { return n_; }
  int64_t num_samples() const { return share_; }  ///< this rank's samples per epoch
  int64_t num_batches() const { return batches_; }
  int64_t batch_length(int64_t k) const;
  const SamplerOptions& options() const { return opts_; }

  /// The order of one epoch.
  class Epoch {
   public:
    /// Dataset index of sample `pos` of batch `k`.
    int64_t index(int64_t k, int64_t pos) const;

   private:
    friend class Sampler;
    Epoch(const Sampler& s, uint64_t epoch);
    const Sampler* s_;
    std::optional<Permutation> perm_;
  };
  Epoch epoch(uint64_t e) const { return Epoch(*this, e); }

 private:
  int64_t n_;
  SamplerOptions opts_;
  int64_t share_ = 0;
  int64_t batches_ = 0;
};

}  // namespace stoker
