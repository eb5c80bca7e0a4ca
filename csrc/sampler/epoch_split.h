// How one rank takes its share of what is left of an epoch.
//
// An epoch is one global sequence of n samples (windows, packed rows, or whole
// batches for token budgets). A segment starts `offset` samples in (0 for a
// fresh epoch; more after a resume, possibly at another world size). Rank r of
// w takes positions offset + r, offset + r + w, ... as DistributedSampler does:
// without drop_last every rank gets ceil((n - offset) / w) samples, the order
// wrapping around to the start of the epoch to pad; with drop_last each gets
// floor((n - offset) / w). Its batch k is its samples [k*B, (k+1)*B).
// Without `even` (even_batches=False, for evaluation) nothing wraps: a rank
// takes only its real positions, but every rank still has the padded count
// of batches, so its last ones may be shorter, or empty.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace stoker {

struct EpochSplit {
  int64_t n = 0, offset = 0, rank = 0, world = 1, batch = 1;
  bool drop_last = false, even = true;
  int64_t share = 0;     ///< this rank's samples in the segment
  int64_t batches = 0;   ///< this rank's batches in the segment (the same on every rank)
  int64_t per_rank = 0;  ///< samples per rank with padding (share, when even)

  EpochSplit() = default;
  EpochSplit(int64_t n_, int64_t offset_, int64_t rank_, int64_t world_, int64_t batch_,
             bool drop_last_, bool even_ = true)
      : n(n_),
        offset(offset_),
        rank(rank_),
        world(world_),
        batch(batch_),
        drop_last(drop_last_),
        even(even_ || drop_last_) {
    STOKER_CHECK(world >= 1, UsageError, "world_size must be >= 1, got ", world);
    STOKER_CHECK(rank >= 0 && rank < world, UsageError, "rank ", rank,
                 " is outside [0, world_size=", world, ")");
    STOKER_CHECK(batch >= 1, UsageError, "batch size must be >= 1, got ", batch);
    STOKER_CHECK(offset >= 0 && offset <= n, UsageError, "resume offset ", offset,
                 " is outside the epoch's ", n, " samples");
    const int64_t left = n - offset;
    per_rank = drop_last ? left / world : (left + world - 1) / world;
    share = even ? per_rank : std::max<int64_t>(0, (left - rank + world - 1) / world);
    batches = drop_last ? per_rank / batch : (per_rank + batch - 1) / batch;
  }

  /// Samples in this rank's batch k (0 for a rank's last ones without `even`).
  int64_t batch_length(int64_t k) const { return std::clamp<int64_t>(share - k * batch, 0, batch); }

  /// Global position (in [0, n)) of sample j of this rank's batch k.
  int64_t global(int64_t k, int64_t j) const {
    const int64_t q = offset + rank + (k * batch + j) * world;
    return q < n ? q : q % n;  // wrap-around padding
  }

  /// Global samples consumed once every rank has taken `k` batches of the segment.
  int64_t consumed_after(int64_t k) const {
    const int64_t taken = std::min(per_rank, std::max<int64_t>(0, k) * batch);
    return std::min(n, offset + taken * world);
  }
};

}  // namespace stoker
