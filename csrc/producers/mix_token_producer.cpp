#include "producers/mix_token_producer.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/error.h"
#include "producers/mix_epoch.h"

namespace stoker {

MixTokenProducer::MixTokenProducer(std::vector<std::shared_ptr<const TokenProducer>> sources,
                                   MixSequence seq, int64_t epoch_rows, std::vector<uint64_t> keys)
    : sources_(std::move(sources)), seq_(std::move(seq)), epoch_rows_(epoch_rows) {
  const size_t k = seq_.get().num_sources();
  STOKER_CHECK(!sources_.empty() && sources_.size() == k && keys.size() == k, UsageError,
               "a mixture of ", k, " sources got ", sources_.size(), " token producers and ",
               keys.size(), " keys");
  STOKER_CHECK(epoch_rows_ >= 1, UsageError, "a mixture's epoch needs rows, got ", epoch_rows_);
  const TokenOptions& o = sources_[0]->options();
  budget_ = o.mode == TokenMode::kBudget;
  batch_ = budget_ ? 1 : o.batch_size;
  drop_last_ = o.drop_last;
  even_batches_ = o.even_batches;
  for (size_t s = 0; s < sources_.size(); ++s) {
    const TokenOptions& os = sources_[s]->options();
    STOKER_CHECK(os.mode == o.mode && os.seq_len == o.seq_len && os.batch_size == o.batch_size &&
                     os.token_dtype == o.token_dtype && os.shuffle == o.shuffle &&
                     os.drop_last == o.drop_last && os.even_batches == o.even_batches,
                 UsageError, "a mixture's token sources must share their batch options");
    streams_.emplace_back(std::vector<int64_t>{sources_[s]->num_samples()}, o.shuffle, 0, keys[s]);
  }
}

MixSplit MixTokenProducer::split(const EpochKey& key) const {
  return MixSplit(epoch_rows_, key.offset, key.rank, key.world_size, batch_, drop_last_,
                  even_batches_, key.pad_from);
}

int64_t MixTokenProducer::num_batches(int64_t rank, int64_t world_size) const {
  return MixSplit(epoch_rows_, 0, rank, world_size, batch_, drop_last_).batches;
}

int64_t MixTokenProducer::rank_samples(int64_t rank, int64_t world_size) const {
  const MixSplit s(epoch_rows_, 0, rank, world_size, batch_, drop_last_, even_batches_);
  return s.full * s.batch + s.batch_length(s.full);
}

int64_t MixTokenProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return split(key).consumed_after(batches);
}

std::shared_ptr<const EpochPlan> MixTokenProducer::plan_epoch(const EpochKey& key) const {
  return std::make_shared<MixEpoch>(seq_.take(), split(key), key.epoch, 0);
}

std::unique_ptr<BatchWork> MixTokenProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const auto& plan = static_cast<const MixEpoch&>(epoch);
  STOKER_CHECK(k >= 0 && k < plan.split.batches, UsageError, "batch ", k, " out of range [0, ",
               plan.split.batches, ")");
  const int64_t n = plan.split.batch_length(k);
  std::vector<int32_t> src(static_cast<size_t>(n));
  std::vector<int64_t> pos(static_cast<size_t>(n));
  mix_batch_rows(plan.seq, plan.split, plan.epoch, epoch_rows_, k, src.data(), pos.data());
  const size_t k_src = sources_.size();
  if (budget_) {  // one whole budget batch of one source
    const size_t s = static_cast<size_t>(src[0]);
    const int64_t b = streams_[s].index(pos[0]);
    const uint64_t pass = static_cast<uint64_t>(pos[0] / streams_[s].size());
    return sources_[s]->plan_budget_batch(b, pass, static_cast<int64_t>(s), k_src);
  }
  // Rows grouped by source, each group in stream order (NOTE [ Mixtures ]).
  std::vector<size_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return src[a] < src[b]; });
  std::vector<int64_t> at(static_cast<size_t>(n)), unit(static_cast<size_t>(n));
  for (size_t j = 0; j < order.size(); ++j) at[j] = pos[order[j]];
  std::vector<std::pair<const TokenProducer*, int64_t>> rows(static_cast<size_t>(n));
  std::vector<int64_t> row_source(static_cast<size_t>(n));
  for (size_t j = 0; j < order.size();) {
    const size_t s = static_cast<size_t>(src[order[j]]);
    size_t e = j;
    while (e < order.size() && static_cast<size_t>(src[order[e]]) == s) ++e;
    streams_[s].map(at.data() + j, unit.data() + j, e - j);
    for (size_t i = j; i < e; ++i) {
      rows[i] = {sources_[s].get(), unit[i]};
      row_source[i] = static_cast<int64_t>(s);
    }
    j = e;
  }
  return sources_[0]->plan_rows(rows, row_source, k_src);
}

MixSequence MixTokenProducer::sequence() const { return seq_.get(); }

void MixTokenProducer::set_sequence(MixSequence seq) { seq_.set(std::move(seq)); }

}  // namespace stoker
