#include "sampler/listed_order.h"

#include <utility>

#include "common/error.h"

namespace stoker {

namespace {
constexpr size_t kKeptEpochs = 4;  // an epoch running, the next, a resumed one
}

void ListedOrders::set(uint64_t epoch, std::vector<int64_t> indices, std::vector<int64_t> ends,
                       int64_t num_records) {
  STOKER_CHECK(!permutations_, UsageError,
               "these orders are permutations, not a sampler's batches");
  int64_t prev = 0;
  for (int64_t e : ends) {
    STOKER_CHECK(e > prev, UsageError, "a batch sampler gave an empty batch");
    prev = e;
  }
  STOKER_CHECK(prev == static_cast<int64_t>(indices.size()), UsageError,
               "a sampler's batches cover ", prev, " of its ", indices.size(), " indices");
  for (int64_t i : indices)
    STOKER_CHECK(i >= 0 && i < num_records, UsageError, "the sampler gave index ", i,
                 ", outside the dataset's [0, ", num_records, ")");
  auto e = std::make_shared<Epoch>();
  e->indices = std::move(indices);
  e->ends = std::move(ends);
  std::lock_guard<std::mutex> lock(mu_);
  epochs_[epoch] = e;
  latest_ = e;
  while (epochs_.size() > kKeptEpochs) epochs_.erase(epochs_.begin());
}

void ListedOrders::set_permutation(uint64_t epoch, std::vector<int64_t> indices,
                                   int64_t num_records) {
  STOKER_CHECK(permutations_, UsageError, "these orders are a sampler's batches, not permutations");
  STOKER_CHECK(static_cast<int64_t>(indices.size()) == num_records, UsageError, "a permutation of ",
               num_records, " records has ", indices.size(), " indices");
  std::vector<bool> seen(indices.size(), false);
  for (int64_t i : indices) {
    STOKER_CHECK(i >= 0 && i < num_records, UsageError, "the permutation gave index ", i,
                 ", outside the dataset's [0, ", num_records, ")");
    STOKER_CHECK(!seen[static_cast<size_t>(i)], UsageError, "the permutation gave index ", i,
                 " twice");
    seen[static_cast<size_t>(i)] = true;
  }
  auto e = std::make_shared<Epoch>();
  e->indices = std::move(indices);
  std::lock_guard<std::mutex> lock(mu_);
  epochs_[epoch] = e;
  latest_ = e;
  while (epochs_.size() > kKeptEpochs) epochs_.erase(epochs_.begin());
}

std::shared_ptr<const ListedOrders::Epoch> ListedOrders::get(uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = epochs_.find(epoch);
  STOKER_CHECK(it != epochs_.end(), UsageError, "no sampler order for epoch ", epoch,
               " (the loader lists it at iter())");
  return it->second;
}

int64_t ListedOrders::num_batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_ ? static_cast<int64_t>(latest_->ends.size()) : hint_batches_;
}

int64_t ListedOrders::num_samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_ ? static_cast<int64_t>(latest_->indices.size()) : hint_samples_;
}

void ListedOrders::set_hint(int64_t batches, int64_t samples) {
  std::lock_guard<std::mutex> lock(mu_);
  hint_batches_ = batches;
  hint_samples_ = samples;
}

}  // namespace stoker
