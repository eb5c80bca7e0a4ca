// An epoch order given from outside: a user's sampler or batch sampler
// (torch.utils.data.Sampler, BatchSampler, DistributedSampler...), iterated by
// Python once per epoch, before the epoch is planned (NOTE [ User samplers ] in
// python/stoker/_plan.py). For each epoch: the dataset indices in the order the
// sampler gave them, and where each batch ends. The sampler decides everything a
// rank takes (DistributedSampler shards by itself), so an order listed here is
// the same whatever the rank and world size the loader is told.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace stoker {

class ListedOrders {
 public:
  struct Epoch {
    std::vector<int64_t> indices;  ///< dataset index at each position of the epoch
    std::vector<int64_t> ends;     ///< ends[k]: the position after batch k (increasing)
  };

  /// The order of `epoch` (replacing one set before). UsageError if the ends do not
  /// increase to indices.size(), or an index is negative or >= `num_records`.
  void set(uint64_t epoch, std::vector<int64_t> indices, std::vector<int64_t> ends,
           int64_t num_records);
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
};

}  // namespace stoker
