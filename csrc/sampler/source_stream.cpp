#include "sampler/source_stream.h"

#include <algorithm>

#include "common/error.h"

namespace stoker {

namespace {
constexpr size_t kCachedPasses = 4;  // a batch spans at most two passes of a source
// Permutation::map keeps 8 lanes busy: for fewer positions than this, one by one is faster.
constexpr size_t kLanesWorthIt = 32;
}  // namespace

SourceStream::SourceStream(std::vector<int64_t> shard_records, bool shuffle, int64_t shard_window,
                           uint64_t key)
    : shard_records_(std::move(shard_records)) {
  opts_.batch_size = 1;
  opts_.shuffle = shuffle;
  opts_.seed = key;
  opts_.shard_window = shard_window;
  if (shard_records_.empty()) shard_records_.push_back(0);
  // Validates the records and options once (EpochOrder throws UsageError).
  n_ = EpochOrder(shard_records_, opts_, 0, 0, 1, 0).num_samples();
  STOKER_CHECK(n_ >= 1, UsageError, "a mixture's source has no samples");
  cached_ = shard_records_.size() > 1 || shard_window > 0;
}

std::shared_ptr<const EpochOrder> SourceStream::pass(int64_t p) const {
  if (!cached_)
    return std::make_shared<const EpochOrder>(shard_records_, opts_, static_cast<uint64_t>(p), 0, 1,
                                              0);
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    for (const auto& [q, order] : cache_->passes)
      if (q == p) return order;
  }
  // Made outside the lock (O(shards)); two threads may both make it: the same order.
  auto order =
      std::make_shared<const EpochOrder>(shard_records_, opts_, static_cast<uint64_t>(p), 0, 1, 0);
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto& passes = cache_->passes;
  for (const auto& [q, o] : passes)
    if (q == p) return o;
  if (passes.size() == kCachedPasses) passes.erase(passes.begin());
  passes.emplace_back(p, order);
  return order;
}

int64_t SourceStream::index(int64_t c) const {
  int64_t out;
  map(&c, &out, 1);
  return out;
}

void SourceStream::map(const int64_t* c, int64_t* out, size_t n) const {
  size_t i = 0;
  while (i < n) {
    STOKER_CHECK(c[i] >= 0, UsageError, "negative stream position ", c[i]);
    const int64_t p = c[i] / n_;
    size_t e = i;
    for (; e < n && c[e] >= 0 && c[e] / n_ == p; ++e) out[e] = c[e] % n_;
    if (!cached_) {
      // One shard (token windows, packed rows): EpochOrder's global shuffle,
      // without making one: the keyed permutation of pass p.
      if (opts_.shuffle) {
        const Permutation perm(static_cast<uint64_t>(n_),
                               hash_combine(opts_.seed, static_cast<uint64_t>(p)));
        static_assert(sizeof(int64_t) == sizeof(uint64_t));
        auto* q = reinterpret_cast<uint64_t*>(out + i);
        if (e - i >= kLanesWorthIt) {
          perm.map(q, q, e - i);
        } else {  // a few positions (a source's rows of one batch): one by one
          for (size_t j = 0; j < e - i; ++j) q[j] = perm(q[j]);
        }
      }
    } else {
      const auto order = pass(p);
      for (size_t j = i; j < e; ++j) out[j] = order->index(out[j], 0);
    }
    i = e;
  }
}

std::vector<size_t> SourceStream::shard_schedule(int64_t from, size_t max_shards) const {
  STOKER_CHECK(from >= 0, UsageError, "negative stream position ", from);
  std::vector<size_t> out;
  for (int64_t p = from / n_, at = from % n_; out.size() < max_shards; ++p, at = 0) {
    const std::vector<size_t> more = pass(p)->shard_schedule(at, max_shards);
    const size_t before = out.size();
    for (size_t s : more)
      if (out.size() < max_shards && std::find(out.begin(), out.end(), s) == out.end())
        out.push_back(s);
    // A pass names every shard with records once it is read whole: the next
    // one names nothing new.
    if (at == 0 && out.size() == before) break;
  }
  return out;
}

}  // namespace stoker
