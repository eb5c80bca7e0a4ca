#include "sampler/sampler.h"

#include <algorithm>

#include "common/error.h"

namespace stoker {

namespace {

// ceil(a / b) without the overflow of (a + b - 1) / b.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

EpochOrder::EpochOrder(int64_t num_records, const SamplerOptions& opts, uint64_t epoch,
                       int64_t rank, int64_t world_size, int64_t offset, int64_t pad_from)
    : n_(static_cast<uint64_t>(num_records)), batch_size_(opts.batch_size) {
  STOKER_CHECK(num_records >= 0, UsageError, "negative dataset size");
  STOKER_CHECK(opts.batch_size >= 1, UsageError, "batch_size must be >= 1, got ", opts.batch_size);
  STOKER_CHECK(world_size >= 1, UsageError, "world_size must be >= 1, got ", world_size);
  STOKER_CHECK(rank >= 0 && rank < world_size, UsageError, "rank ", rank,
               " is outside [0, world_size=", world_size, ")");
  STOKER_CHECK(offset >= 0 && offset <= num_records, UsageError, "epoch offset ", offset,
               " outside [0, ", num_records, "]");
  STOKER_CHECK(pad_from >= 0 && pad_from <= offset, UsageError, "epoch pad_from ", pad_from,
               " outside [0, offset=", offset, "]");
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
  if (opts.shuffle && num_records > 1) perm_.emplace(n_, hash_combine(opts.seed, epoch));
}

int64_t EpochOrder::batch_length(int64_t k) const {
  // k < batches_, so k * batch_size_ <= share_ cannot overflow.
  return std::max<int64_t>(0, std::min(batch_size_, rank_share_ - k * batch_size_));
}

uint64_t EpochOrder::position(int64_t k, int64_t pos) const {
  // p < share_ <= ceil(left / w), so p * w < left + w: no overflow in 64 unsigned bits.
  const uint64_t p = static_cast<uint64_t>(k * batch_size_ + pos);
  uint64_t q = offset_ + rank_ + p * world_;                 // position in the epoch order
  if (q >= n_) q = pad_from_ + (q - n_) % (n_ - pad_from_);  // wrap-around padding
  return q;
}

int64_t EpochOrder::index(int64_t k, int64_t pos) const {
  const uint64_t q = position(k, pos);
  return static_cast<int64_t>(perm_ ? (*perm_)(q) : q);
}

void EpochOrder::batch_indices(int64_t k, int64_t* out) const {
  const int64_t len = batch_length(k);
  static_assert(sizeof(int64_t) == sizeof(uint64_t));
  auto* q = reinterpret_cast<uint64_t*>(out);  // positions, then mapped in place
  for (int64_t p = 0; p < len; ++p) q[p] = position(k, p);
  if (perm_) perm_->map(q, q, static_cast<size_t>(len));
}

int64_t EpochOrder::consumed_after(int64_t batches) const {
  const __int128 per_rank =
      std::min<__int128>(static_cast<__int128>(batches) * batch_size_, share_);
  const __int128 done = static_cast<__int128>(offset_) + per_rank * world_;
  return static_cast<int64_t>(std::min<__int128>(done, n_));
}

}  // namespace stoker
