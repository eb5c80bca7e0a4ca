#include "sampler/shard_windows.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace stoker {

ShardWindows::ShardWindows(std::span<const int64_t> shard_records, int64_t window,
                           uint64_t epoch_key)
    : epoch_key_(epoch_key) {
  STOKER_CHECK(window >= 1, UsageError, "shard_window must be >= 1, got ", window);
  const size_t shards = shard_records.size();
  window_ = static_cast<size_t>(
      std::min<uint64_t>(static_cast<uint64_t>(window), std::max<size_t>(shards, 1)));
  std::vector<uint64_t> first(shards);  // dataset index of each shard's first record
  uint64_t total = 0;
  for (size_t s = 0; s < shards; ++s) {
    const int64_t r = shard_records[s];
    STOKER_CHECK(r >= 0, UsageError, "shard ", s, " has a negative record count ", r);
    STOKER_CHECK(static_cast<uint64_t>(r) <= std::numeric_limits<int64_t>::max() - total,
                 UsageError, "shard record counts overflow a 64-bit total");
    first[s] = total;
    total += static_cast<uint64_t>(r);
  }
  const Permutation order(shards, shard_window_keys::shard_order(epoch_key));
  slot_shard_.resize(shards);
  slot_base_.resize(shards);
  slot_start_.resize(shards + 1);
  uint64_t at = 0;
  for (size_t j = 0; j < shards; ++j) {
    const size_t s = static_cast<size_t>(order(j));
    slot_shard_[j] = s;
    slot_base_[j] = first[s];
    slot_start_[j] = at;
    at += static_cast<uint64_t>(shard_records[s]);
  }
  slot_start_[shards] = at;
  const size_t windows = (shards + window_ - 1) / window_;
  window_start_.resize(windows + 1);
  for (size_t w = 0; w <= windows; ++w)
    window_start_[w] = slot_start_[std::min(w * window_, shards)];
}

size_t ShardWindows::window_of(uint64_t q) const {
  // The last window starting at or before q: empty windows start where the next does.
  auto it = std::upper_bound(window_start_.begin(), window_start_.end(), q);
  return static_cast<size_t>(it - window_start_.begin()) - 1;
}

Permutation ShardWindows::window_permutation(size_t w) const {
  return Permutation(window_start_[w + 1] - window_start_[w],
                     shard_window_keys::window(epoch_key_, w));
}

uint64_t ShardWindows::locate(size_t w, uint64_t g) const {
  // The last slot of the window starting at or before g (empty slots start
  // where the next does; the first starts at or before g). Branch-free halving:
  // g is random within the window, so a branchy search mispredicts.
  const size_t first = w * window_;
  const uint64_t* at = slot_start_.data() + first;
  for (size_t len = std::min(window_, slot_shard_.size() - first); len > 1;) {
    const size_t half = len / 2;
    at = at[half] <= g ? at + half : at;
    len -= half;
  }
  const size_t j = static_cast<size_t>(at - slot_start_.data());
  return slot_base_[j] + (g - slot_start_[j]);
}

uint64_t ShardWindows::operator()(uint64_t q) const {
  const size_t w = window_of(q);
  const uint64_t start = window_start_[w];
  return locate(w, start + window_permutation(w)(q - start));
}

void ShardWindows::map(const uint64_t* in, uint64_t* out, size_t n) const {
  size_t i = 0;
  while (i < n) {
    // A run of positions in one window: a rank's positions in a batch follow
    // each other (w apart), so a batch is one or two runs.
    const size_t w = window_of(in[i]);
    const uint64_t lo = window_start_[w], hi = window_start_[w + 1];
    size_t end = i;
    for (; end < n && in[end] >= lo && in[end] < hi; ++end) out[end] = in[end] - lo;
    window_permutation(w).map(out + i, out + i, end - i);
    for (size_t j = i; j < end; ++j) out[j] = locate(w, lo + out[j]);
    i = end;
  }
}

void ShardWindows::append_shards(size_t w, std::vector<size_t>& out) const {
  const size_t end = std::min((w + 1) * window_, slot_shard_.size());
  for (size_t j = w * window_; j < end; ++j)
    if (slot_start_[j + 1] > slot_start_[j]) out.push_back(slot_shard_[j]);
}

}  // namespace stoker
