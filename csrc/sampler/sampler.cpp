#include "sampler/sampler.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace stoker {

namespace {

// ceil(a / b) without the overflow of (a + b - 1) / b.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

EpochOrder::EpochOrder(std::span<const int64_t> shard_records, const SamplerOptions& opts,
                       uint64_t epoch, int64_t rank, int64_t world_size, int64_t offset,
                       int64_t pad_from)
    : batch_size_(opts.batch_size) {
  if (opts.listed && !opts.listed->permutations()) {
    // A user sampler's order (listed_order.h): its batches, from the one at `offset`.
    listed_ = opts.listed->get(epoch);
    const auto& ends = listed_->ends;
    n_ = listed_->indices.size();
    rank_ = 0;
    world_ = 1;
    STOKER_CHECK(offset >= 0 && static_cast<uint64_t>(offset) <= n_, UsageError, "epoch offset ",
                 offset, " outside [0, ", n_, "]");
    offset_ = static_cast<uint64_t>(offset);
    pad_from_ = 0;
    auto it = std::lower_bound(ends.begin(), ends.end(), offset);
    first_ = offset == 0 ? 0 : static_cast<int64_t>(it - ends.begin()) + 1;
    STOKER_CHECK(offset == 0 || (it != ends.end() && *it == offset), UsageError, "epoch offset ",
                 offset, " is not where a batch of the sampler ends");
    batches_ = static_cast<int64_t>(ends.size()) - first_;
    share_ = rank_share_ = static_cast<int64_t>(n_) - offset;
    read_end_ = n_;
    int64_t shard_total = 0;
    shard_start_.push_back(0);
    for (int64_t r : shard_records) shard_start_.push_back(static_cast<uint64_t>(shard_total += r));
    return;
  }
  shard_start_.reserve(shard_records.size() + 1);
  uint64_t total = 0;
  for (int64_t r : shard_records) {
    STOKER_CHECK(r >= 0, UsageError, "negative record count ", r);
    STOKER_CHECK(static_cast<uint64_t>(r) <= std::numeric_limits<int64_t>::max() - total,
                 UsageError, "shard record counts overflow a 64-bit total");
    shard_start_.push_back(total);
    total += static_cast<uint64_t>(r);
  }
  shard_start_.push_back(total);
  n_ = total;
  const auto num_records = static_cast<int64_t>(total);
  STOKER_CHECK(opts.batch_size >= 1, UsageError, "batch_size must be >= 1, got ", opts.batch_size);
  STOKER_CHECK(world_size >= 1, UsageError, "world_size must be >= 1, got ", world_size);
  STOKER_CHECK(rank >= 0 && rank < world_size, UsageError, "rank ", rank,
               " is outside [0, world_size=", world_size, ")");
  STOKER_CHECK(offset >= 0 && offset <= num_records, UsageError, "epoch offset ", offset,
               " outside [0, ", num_records, "]");
  STOKER_CHECK(pad_from >= 0 && pad_from <= offset, UsageError, "epoch pad_from ", pad_from,
               " outside [0, offset=", offset, "]");
  STOKER_CHECK(opts.shard_window >= 0, UsageError, "shard_window must be >= 1, got ",
               opts.shard_window);
  STOKER_CHECK(opts.shard_window == 0 || opts.shuffle, UsageError,
               "shard_window needs shuffle=True");
  rank_ = static_cast<uint64_t>(rank);
  pad_from_ = static_cast<uint64_t>(pad_from == num_records ? 0 : pad_from);
  world_ = static_cast<uint64_t>(world_size);
  offset_ = static_cast<uint64_t>(offset);
  const int64_t left = num_records - offset;
  share_ = opts.drop_last ? left / world_size : ceil_div(left, world_size);
  batches_ = opts.drop_last ? share_ / batch_size_ : ceil_div(share_, batch_size_);
  rank_share_ = share_;
  // Without padding, rank r holds the positions r, r + w, ... below `left`.
  if (!opts.drop_last && !opts.even_batches)
    rank_share_ = left > rank ? ceil_div(left - rank, world_size) : 0;
  // Every rank reads its share (the longest one's with padding, all of them
  // exactly the rest without), or its full batches with drop_last.
  const int64_t per_rank = opts.drop_last ? batches_ * batch_size_ : share_;
  read_end_ = !opts.drop_last && !opts.even_batches
                  ? n_
                  : offset_ + static_cast<uint64_t>(per_rank) * world_;
  if (opts.listed) {  // a listed permutation (ListedOrders::set_permutation)
    listed_perm_ = opts.listed->get(epoch);
    STOKER_CHECK(listed_perm_->indices.size() == n_, UsageError, "the permutation of epoch ", epoch,
                 " has ", listed_perm_->indices.size(), " indices for ", n_, " records");
    return;
  }
  if (!opts.shuffle || num_records <= 1) return;
  const uint64_t key = hash_combine(opts.seed, epoch);
  if (opts.shard_window > 0)
    windows_.emplace(shard_records, opts.shard_window, key);
  else
    perm_.emplace(n_, key);
}

int64_t EpochOrder::batch_length(int64_t k) const {
  if (listed_)
    return k < 0 || k >= batches_ ? 0 : listed_start(first_ + k + 1) - listed_start(first_ + k);
  // k < batches_, so k * batch_size_ <= share_ cannot overflow.
  return std::max<int64_t>(0, std::min(batch_size_, rank_share_ - k * batch_size_));
}

uint64_t EpochOrder::position(int64_t k, int64_t pos) const {
  if (listed_) return static_cast<uint64_t>(listed_start(first_ + k) + pos);
  // p < share_ <= ceil(left / w), so p * w < left + w: no overflow in 64 unsigned bits.
  const uint64_t p = static_cast<uint64_t>(k * batch_size_ + pos);
  uint64_t q = offset_ + rank_ + p * world_;                 // position in the epoch order
  if (q >= n_) q = pad_from_ + (q - n_) % (n_ - pad_from_);  // wrap-around padding
  return q;
}

uint64_t EpochOrder::map(uint64_t q) const {
  if (listed_) return static_cast<uint64_t>(listed_->indices[q]);
  if (listed_perm_) return static_cast<uint64_t>(listed_perm_->indices[q]);
  if (perm_) return (*perm_)(q);
  if (windows_) return (*windows_)(q);
  return q;
}

int64_t EpochOrder::index(int64_t k, int64_t pos) const {
  return static_cast<int64_t>(map(position(k, pos)));
}

void EpochOrder::batch_indices(int64_t k, int64_t* out) const {
  const int64_t len = batch_length(k);
  if (listed_) {
    const int64_t* from = listed_->indices.data() + listed_start(first_ + k);
    std::copy(from, from + len, out);
    return;
  }
  static_assert(sizeof(int64_t) == sizeof(uint64_t));
  auto* q = reinterpret_cast<uint64_t*>(out);  // positions, then mapped in place
  for (int64_t p = 0; p < len; ++p) q[p] = position(k, p);
  if (perm_)
    perm_->map(q, q, static_cast<size_t>(len));
  else if (windows_)
    windows_->map(q, q, static_cast<size_t>(len));
  else if (listed_perm_)
    for (int64_t p = 0; p < len; ++p) q[p] = static_cast<uint64_t>(listed_perm_->indices[q[p]]);
}

int64_t EpochOrder::consumed_after(int64_t batches) const {
  if (listed_)
    return batches <= 0 ? static_cast<int64_t>(offset_)
                        : listed_start(first_ + std::min(batches, batches_));
  const __int128 per_rank =
      std::min<__int128>(static_cast<__int128>(batches) * batch_size_, share_);
  const __int128 done = static_cast<__int128>(offset_) + per_rank * world_;
  return static_cast<int64_t>(std::min<__int128>(done, n_));
}

size_t EpochOrder::shard_of(uint64_t i) const {
  // The last shard starting at or before i: empty shards start where the next does.
  auto it = std::upper_bound(shard_start_.begin(), shard_start_.end(), i);
  return static_cast<size_t>(it - shard_start_.begin()) - 1;
}

std::vector<size_t> EpochOrder::shard_schedule(int64_t from_position, size_t max_shards) const {
  STOKER_CHECK(from_position >= 0 && static_cast<uint64_t>(from_position) <= n_, UsageError,
               "schedule position ", from_position, " outside [0, ", n_, "]");
  std::vector<size_t> out;
  const uint64_t from = static_cast<uint64_t>(from_position);
  if (listed_) {  // the shards of the listed indices, in the order they come (a bounded look)
    constexpr uint64_t kLook = 1 << 16;
    for (uint64_t q = from; q < n_ && q < from + kLook && out.size() < max_shards; ++q) {
      const size_t s = shard_of(static_cast<uint64_t>(listed_->indices[q]));
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
    return out;
  }
  const uint64_t end = std::min(read_end_, n_);  // the positions read before any padding
  if (from < end) {
    if (windows_) {
      for (size_t w = windows_->window_of(from);
           w < windows_->num_windows() && windows_->window_start(w) < end &&
           out.size() < max_shards;
           ++w)
        windows_->append_shards(w, out);
    } else {
      // A global shuffle reads every shard from the first batch on; the identity
      // order one shard after the other.
      const bool global = perm_ || listed_perm_;
      const size_t first = global ? 0 : shard_of(from);
      const size_t last = global ? shard_start_.size() - 2 : shard_of(end - 1);
      for (size_t s = first; s <= last && out.size() < max_shards; ++s)
        if (shard_start_[s + 1] > shard_start_[s]) out.push_back(s);
    }
  }
  // Wrap-around padding: fewer samples than ranks, read at the very end.
  // A global shuffle's listed every shard already.
  const bool listed_all = (perm_ || listed_perm_) && from < end;
  std::vector<size_t> padding;
  for (uint64_t q = std::max(from, n_); q < read_end_ && !listed_all; ++q) {
    const size_t s = shard_of(map(pad_from_ + (q - n_) % (n_ - pad_from_)));
    if (std::find(padding.begin(), padding.end(), s) == padding.end()) padding.push_back(s);
  }
  out.insert(out.end(), padding.begin(), padding.end());
  if (out.size() > max_shards) out.resize(max_shards);
  return out;
}

}  // namespace stoker
