// An epoch order given from outside: a user's sampler or batch sampler
// (torch.utils.data.Sampler, BatchSampler, DistributedSampler...), iterated by
// Python once per epoch, before the epoch is planned (NOTE [ User samplers ] in
// python/stoker/_plan.py). For each epoch: the dataset indices in the order the
// sampler gave them, and where each batch ends. The sampler decides everything a
// rank takes (DistributedSampler shards by itself), so an order listed here is
// the same whatever the rank and world size the loader is told.
//
// Or, set with set_permutation, each epoch's permutation of the dataset (shuffle
// with a torch.Generator: RandomSampler's draws, NOTE [ Seeds as DataLoader draws
// them ] in python/stoker/_dropin.py): it stands in for the (seed, epoch)
// permutation only, and batches, the rank split, padding and resume are the
// loader's own (sampler.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace stoker {

class ListedOrders {
 public:
  /// `permutations`: the epochs are set with set_permutation (the loader batches
  /// and splits them), else with set (a sampler's own batches).
  explicit ListedOrders(bool permutations = false) : permutations_(permutations) {}

  struct Epoch {
    std::vector<int64_t> indices;  ///< dataset index at each position of the epoch
    std::vector<int64_t> ends;     ///< ends[k]: the position after batch k (increasing)
  };

  /// The order of `epoch` (replacing one set before). UsageError if the ends do not
  /// increase to indices.size(), or an index is negative or >= `num_records`.
  void set(uint64_t epoch, std::vector<int64_t> indices, std::vector<int64_t> ends,
           int64_t num_records);
  /// The permutation of the dataset's `num_records` records for `epoch` (every
  /// index once), for an object made with `permutations`. UsageError unless it
  /// has num_records indices, each in [0, num_records) once.
  void set_permutation(uint64_t epoch, std::vector<int64_t> indices, int64_t num_records);
  /// Whether the epochs are permutations (set_permutation): the loader's own
  /// batch count and rank split apply, not num_batches()/num_samples().
  bool permutations() const { return permutations_; }
  /// The order of `epoch`; UsageError if none was set.
  std::shared_ptr<const Epoch> get(uint64_t epoch) const;
  /// The latest order set, for len(): its batches and samples; before any, the
  /// hint (the sampler's len()).
  int64_t num_batches() const;
  int64_t num_samples() const;
  void set_hint(int64_t batches, int64_t samples);

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const Epoch>> epochs_;  // the last few set
  std::shared_ptr<const Epoch> latest_;
  int64_t hint_batches_ = 0, hint_samples_ = 0;
  const bool permutations_;
};

}  // namespace stoker
