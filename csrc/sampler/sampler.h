// Which samples make batch k of an epoch, for one rank.
//
// The epoch order is a permutation of [0, n) keyed by (seed, epoch) (with a
// shard window, the shard-window order: NOTE [ Shard windows ] in
// shard_windows.h), or the identity without shuffle: one global sequence.
// Rank r of w takes positions offset + r, offset + r + w, ... of it (as
// DistributedSampler does, from the `offset` global samples already consumed:
// a resumed epoch, at any world size). Without drop_last the sequence wraps
// around so every rank gets ceil((n - offset) / w) samples (padding restarts
// at `pad_from`: the epoch's start, or for a resume at another world size the
// first unconsumed sample); with drop_last each gets floor. Batch k is
// positions [k*B, min((k+1)*B, share)) of the rank's sequence (see
// SamplerOptions::even_batches for the variant without padding). Nothing here
// depends on the number of threads, and every rank computes the same counts,
// so ranks never disagree on the number of batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "sampler/listed_order.h"
#include "sampler/permutation.h"
#include "sampler/shard_windows.h"

namespace stoker {

struct SamplerOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  /// Without drop_last: pad every rank to the same number of samples by
  /// wrapping around (DistributedSampler's rule). When false, no sample is
  /// repeated: ranks hold ceil or floor of their share, still in the same
  /// number of batches, so a rank's last batch may be shorter or empty (an
  /// evaluation set gathered across ranks comes out exact).
  bool even_batches = true;
  /// With shuffle: shards per window of the shard-window order (NOTE [ Shard
  /// windows ]); 0 = the global shuffle. Needs shuffle.
  int64_t shard_window = 0;
  /// The order a user's sampler gives, listed per epoch (listed_order.h): it
  /// replaces the permutation, the rank split and padding; batch_size and
  /// drop_last were the sampler's to apply. Listed permutations
  /// (ListedOrders::permutations()) replace the (seed, epoch) permutation only.
  std::shared_ptr<const ListedOrders> listed;
};

/// `opts` for counting batches and samples, which do not depend on the order: a
/// listed permutation (which may not be listed yet for the epoch asked) left out.
inline SamplerOptions counting_options(const SamplerOptions& opts) {
  SamplerOptions o = opts;
  if (o.listed && o.listed->permutations()) o.listed = nullptr;
  return o;
}

/// Whether `opts` lists a sampler's own batches (a user sampler or batch sampler),
/// which decide the batch count.
inline bool sampler_batches(const SamplerOptions& opts) {
  return opts.listed && !opts.listed->permutations();
}

/// One rank's share of one epoch (or of the rest of it, from an offset).
class EpochOrder {
 public:
  /// Validates the arguments (UsageError).
  /// @param shard_records the records of each shard, in dataset order
  /// @param pad_from where wrap-around padding restarts (EpochKey::pad_from)
  EpochOrder(std::span<const int64_t> shard_records, const SamplerOptions& opts, uint64_t epoch,
             int64_t rank, int64_t world_size, int64_t offset, int64_t pad_from = 0);
  /// The same for `num_records` records in one shard (for counts, and for
  /// sources without shards: a shard window is then the whole epoch).
  EpochOrder(int64_t num_records, const SamplerOptions& opts, uint64_t epoch, int64_t rank,
             int64_t world_size, int64_t offset, int64_t pad_from = 0)
      : EpochOrder(std::span<const int64_t>(&num_records, 1), opts, epoch, rank, world_size, offset,
                   pad_from) {}

  int64_t num_samples() const { return rank_share_; }  ///< this rank's samples (padding included)
  int64_t num_batches() const { return batches_; }
  int64_t batch_length(int64_t k) const;
  /// Dataset index of sample `pos` of batch `k`.
  int64_t index(int64_t k, int64_t pos) const;
  /// index(k, pos) for every pos of batch `k`, into out[0, batch_length(k)).
  void batch_indices(int64_t k, int64_t* out) const;
  /// Global samples consumed once every rank has taken `batches` batches.
  int64_t consumed_after(int64_t batches) const;

  /// The shards that the whole job (every rank) reads in this epoch from global
  /// position `from_position` on, in the order it starts reading them, at most
  /// `max_shards` of them; shards without records are never named. For a cache
  /// that holds a few shards: a shard-window order names each window's shards
  /// (in slot order: a window's samples are mixed, so all its shards are in use
  /// from its start to near its end), window after window; without shuffle,
  /// the shards in dataset order from the one holding the position; a global
  /// shuffle reads every shard in every batch, so all of them, in dataset
  /// order. Wrap-around padding (the end of the epoch reading its start again)
  /// comes last, naming again the shards it reads; positions a drop_last
  /// leaves unread name nothing. UsageError unless 0 <= from_position <= n.
  std::vector<size_t> shard_schedule(int64_t from_position, size_t max_shards) const;

 private:
  // Position of sample `pos` of batch `k` in the epoch order (before the permutation).
  uint64_t position(int64_t k, int64_t pos) const;
  // Dataset index at position q (< n).
  uint64_t map(uint64_t q) const;
  // The shard holding dataset index i (< n).
  size_t shard_of(uint64_t i) const;

  uint64_t n_;
  int64_t batch_size_;
  uint64_t rank_, world_, offset_, pad_from_;
  int64_t share_ = 0;       // the longest rank's share: fixes the batch count
  int64_t rank_share_ = 0;  // this rank's (share_, or less without even_batches)
  int64_t batches_ = 0;
  uint64_t read_end_ = 0;                // positions [0, read_end_) are read (>= n_: padding wraps)
  std::vector<uint64_t> shard_start_;    // dataset index of each shard's first record; then n
  std::optional<Permutation> perm_;      // the global shuffle
  std::optional<ShardWindows> windows_;  // the shard-window order
  std::shared_ptr<const ListedOrders::Epoch> listed_;       // a user sampler's order
  std::shared_ptr<const ListedOrders::Epoch> listed_perm_;  // a listed permutation
  int64_t first_ = 0;                                       // listed: the segment's first batch
  int64_t listed_start(int64_t batch) const {               // listed: batch's first position
    return batch == 0 ? 0 : listed_->ends[static_cast<size_t>(batch - 1)];
  }
};

}  // namespace stoker
