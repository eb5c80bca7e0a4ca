// Which shards a remote dataset keeps and which it fetches next: the plan its
// fetcher (python/stoker/remote/fetcher.py) asks for at every turn, so that
// the Python side only runs transfers.
//
// NOTE [ Fetch plan ]
// Each turn walks, in this order, until the byte budget (the dataset's share
// of its cache directory: NOTE [ Cache budget ] in python/stoker/remote/space.py)
// is spent:
//
//   1. shards in use: demanded by a waiting reader (in the order they asked:
//      ShardGate::demands), held for reads outside loaders, or pinned by a
//      reader now. Kept whatever the budget says.
//   2. each followed reader's schedule (a loader's live iterator: the shards
//      the rest of its epoch reads, then the start of the next one, from
//      EpochOrder::shard_schedule), merged turn by turn: each one's next shard,
//      then each one's second...
//   3. without a budget, the rest in shard order (a dataset that fits is
//      downloaded whole, ahead of need).
//
// Shards walked and not local are the ones to fetch (those in step 1 first:
// they start beyond the fetcher's in-flight limit). While the shards provided
// and in flight take more than the budget, provided shards not walked are
// given back (ShardGate::try_release); under it, nothing is (a dataset that
// fits keeps every shard it has, and one that shares a directory gives back
// as its share shrinks). A turn costs
// O(shards within the budget + demands + provided): the epoch order of each
// follower is built once per epoch (O(shards), at the epoch's first turn) and
// then only read from the follower's position on; without a budget the walk
// stops once it has `max_fetch` shards to fetch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "format/dataset.h"
#include "sampler/sampler.h"

namespace stoker {

/// Where a reader of a dataset stands: `offset` global samples of `epoch`
/// consumed by a job of `world_size` ranks (0: unknown).
struct ReadPosition {
  uint64_t epoch = 0;
  int64_t offset = 0;
  int64_t world_size = 0;
};

class FetchPlan {
 public:
  struct Follower {
    /// Where the reader stands now; nullopt once it is gone.
    std::function<std::optional<ReadPosition>()> position;
    /// The whole job's order of `epoch` for `world_size` ranks.
    std::function<EpochOrder(uint64_t epoch, int64_t world_size)> order;
    /// The world size to assume while position() does not know it.
    int64_t world_size = 1;
  };

  struct Options {
    /// Bytes the dataset may keep; < 0: no budget (nothing is given back).
    int64_t budget = -1;
    /// Shards held for reads outside loaders (kept, and fetched first).
    std::vector<size_t> holds;
    /// Shards being downloaded now (not fetched again; they count against the budget).
    std::vector<size_t> inflight;
    /// Without a budget, stop once this many shards are to be fetched.
    size_t max_fetch = 8;
  };

  struct Turn {
    /// Shards to download now, most urgent first; the first `urgent` are in use.
    std::vector<size_t> fetch;
    size_t urgent = 0;
    /// Shards given back this turn (unmapped; the caller unpins them in its cache).
    std::vector<size_t> released;
    int64_t must_bytes = 0;    ///< shards in use (step 1)
    int64_t wanted_bytes = 0;  ///< everything walked
    int64_t held_bytes = 0;    ///< provided after the releases, plus in flight
    bool following = false;    ///< some followed reader is alive
  };

  /// `ds` must be deferred; `shard_bytes` gives each shard's size.
  FetchPlan(std::shared_ptr<Dataset> ds, std::vector<int64_t> shard_bytes);

  /// Follows a reader; a follower with the same `key` is replaced.
  void follow(uint64_t key, Follower f);
  size_t followers() const;

  /// One turn (NOTE [ Fetch plan ]). Thread-safe; turns are serialized.
  Turn turn(const Options& opts);

 private:
  struct Followed {
    uint64_t key;
    Follower f;
    // The epoch orders in use, built once per epoch.
    std::optional<EpochOrder> now, next;
    uint64_t now_epoch = 0, next_epoch = 0;
    int64_t now_world = 0, next_world = 0;
  };
  // The shards `f` reads next (at most `max`), or nullopt if it is gone.
  std::optional<std::vector<size_t>> schedule(Followed& f, size_t max);
  static const EpochOrder& order_of(Followed& f, std::optional<EpochOrder>& slot,
                                    uint64_t& epoch_slot, int64_t& world_slot, uint64_t epoch,
                                    int64_t world);

  std::shared_ptr<Dataset> ds_;
  std::vector<int64_t> bytes_;
  int64_t min_bytes_ = 1;
  mutable std::mutex mu_;            // the followers, and turns
  std::vector<Followed> followers_;  // guarded by mu_
  std::vector<uint8_t> mark_;        // per shard, during a turn: 1 walked, 2 in flight
  std::vector<size_t> touched_;      // shards marked this turn
  size_t background_ = 0;            // step 3 resumes here
};

}  // namespace stoker
