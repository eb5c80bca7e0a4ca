#include "sampler/sampler.h"

#include <algorithm>

#include "common/error.h"

namespace stoker {

Sampler::Sampler(int64_t num_records, SamplerOptions opts) : n_(num_records), opts_(opts) {
  STOKER_CHECK(n_ >= 0, UsageError, "negative dataset size");
  STOKER_CHECK(opts_.batch_size >= 1, UsageError, "batch_size must be >= 1, got ",
               opts_.batch_size);
  STOKER_CHECK(opts_.world_size >= 1, UsageError, "world_size must be >= 1, got ",
               opts_.world_size);
  STOKER_CHECK(opts_.rank >= 0 && opts_.rank < opts_.world_size, UsageError, "rank ",
               opts_.rank, " is outside [0, world_size=", opts_.world_size, ")");
  const int64_t w = opts_.world_size;
  share_ = opts_.drop_last ? n_ / w : (n_ + w - 1) / w;
  const int64_t b = opts_.batch_size;
  batches_ = opts_.drop_last ? share_ / b : (share_ + b - 1) / b;
}

int64_t Sampler::batch_length(int64_t k) const {
  return std::min(opts_.batch_size, share_ - k * opts_.batch_size);
}

Sampler::Epoch::Epoch(const Sampler& s, uint64_t epoch) : s_(&s) {
  if (s.opts_.shuffle && s.n_ > 1)
    perm_.emplace(static_cast<uint64_t>(s.n_), hash_combine(s.opts_.seed, epoch));
}

int64_t Sampler::Epoch::index(int64_t k, int64_t pos) const {
  const auto& o = s_->opts_;
  const int64_t p = k * o.batch_size + pos;            // position in this rank's sequence
  const int64_t q = (o.rank + p * o.world_size) % s_->n_;  // position in the epoch order (wrapped)
  return perm_ ? static_cast<int64_t>((*perm_)(static_cast<uint64_t>(q))) : q;
}

}  // namespace stoker
