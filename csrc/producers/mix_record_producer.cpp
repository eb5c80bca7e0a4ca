#include "producers/mix_record_producer.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "common/error.h"
#include "producers/batch_planner.h"
#include "producers/mix_epoch.h"

namespace stoker {

namespace {

// The key of the random draws of a source's c-th row (NOTE [ Random draws ]).
uint64_t sample_key(size_t source, int64_t c) {
  return hash_combine(0x6d69782d64726177ull + source, static_cast<uint64_t>(c));  // "mix-draw"
}

}  // namespace

MixRecordProducer::MixRecordProducer(std::vector<std::shared_ptr<const Dataset>> sets,
                                     MixSequence seq, int64_t epoch_rows,
                                     std::vector<uint64_t> keys, RecordOptions opts)
    : seq_(std::move(seq)), epoch_rows_(epoch_rows), opts_(std::move(opts)) {
  const size_t k = seq_.get().num_sources();
  STOKER_CHECK(!sets.empty() && sets.size() == k && keys.size() == k, UsageError, "a mixture of ",
               k, " sources got ", sets.size(), " datasets and ", keys.size(), " keys");
  STOKER_CHECK(sets.size() <= std::numeric_limits<uint16_t>::max(), UsageError, "too many sources");
  STOKER_CHECK(epoch_rows_ >= 1, UsageError, "a mixture's epoch needs rows, got ", epoch_rows_);
  const Schema& schema = sets[0]->schema();
  for (const FieldSpec& f : schema.fields)
    STOKER_CHECK(f.name != "source", UsageError,
                 "a mixture's batches have a \"source\" tensor of their own; its datasets "
                 "cannot have a field named \"source\"");
  for (size_t s = 0; s < sets.size(); ++s) {
    STOKER_CHECK(sets[s] != nullptr, UsageError, "source ", s, ": no dataset");
    STOKER_CHECK(sets[s]->schema().hash == schema.hash &&
                     sets[s]->schema().fields.size() == schema.fields.size(),
                 UsageError, "source ", s,
                 " has other fields than source 0: a mixture's datasets need the same fields");
    std::vector<int64_t> shard_records;
    for (size_t i = 0; i < sets[s]->num_shards(); ++i)
      shard_records.push_back(sets[s]->shard_info(i).num_records);
    streams_.emplace_back(std::move(shard_records), opts_.sampler.shuffle,
                          opts_.sampler.shard_window, keys[s]);
  }
  // Validates the split's options once, here, rather than at the first epoch.
  MixSplit(epoch_rows_, 0, 0, 1, opts_.sampler.batch_size, opts_.sampler.drop_last,
           opts_.sampler.even_batches);
  STOKER_CHECK(!opts_.cache, UsageError,
               "cache='decoded' keeps the images of one stoker.Dataset; a stoker.Mix reads "
               "several (give each its own loader, or leave the cache out)");
  source_ = make_record_source(sets[0], opts_);
  source_->sets = std::move(sets);
}

MixSplit MixRecordProducer::split(const EpochKey& key) const {
  return MixSplit(epoch_rows_, key.offset, key.rank, key.world_size, opts_.sampler.batch_size,
                  opts_.sampler.drop_last, opts_.sampler.even_batches, key.pad_from);
}

int64_t MixRecordProducer::num_batches(int64_t rank, int64_t world_size) const {
  return MixSplit(epoch_rows_, 0, rank, world_size, opts_.sampler.batch_size,
                  opts_.sampler.drop_last, opts_.sampler.even_batches)
      .batches;
}

int64_t MixRecordProducer::rank_samples(int64_t rank, int64_t world_size) const {
  const MixSplit s(epoch_rows_, 0, rank, world_size, opts_.sampler.batch_size,
                   opts_.sampler.drop_last, opts_.sampler.even_batches);
  return s.full * s.batch + s.batch_length(s.full);  // the last batch: this rank's part
}

int64_t MixRecordProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  return split(key).consumed_after(batches);
}

std::shared_ptr<const EpochPlan> MixRecordProducer::plan_epoch(const EpochKey& key) const {
  return std::make_shared<MixEpoch>(seq_.take(), split(key), key.epoch,
                                    hash_combine(opts_.sampler.seed, key.epoch));
}

std::unique_ptr<BatchWork> MixRecordProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const auto& plan = static_cast<const MixEpoch&>(epoch);
  STOKER_CHECK(k >= 0 && k < plan.split.batches, UsageError, "batch ", k, " out of range [0, ",
               plan.split.batches, ")");
  const int64_t n = plan.split.batch_length(k);
  std::vector<int32_t> src(static_cast<size_t>(n));
  std::vector<int64_t> pos(static_cast<size_t>(n));
  mix_batch_rows(plan.seq, plan.split, plan.epoch, epoch_rows_, k, src.data(), pos.data());
  // Samples grouped by source, each group in stream order (NOTE [ Mixtures ]).
  std::vector<size_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return src[a] < src[b]; });
  auto b = std::make_unique<RecordBatch>(source_, plan.sample_seed);
  b->mixture = true;
  b->sources.resize(static_cast<size_t>(n));
  b->sample_keys.resize(static_cast<size_t>(n));
  std::vector<int64_t> at(static_cast<size_t>(n)), indices(static_cast<size_t>(n));
  for (size_t j = 0; j < order.size(); ++j) {
    at[j] = pos[order[j]];
    b->sources[j] = static_cast<uint16_t>(src[order[j]]);
    b->sample_keys[j] = sample_key(b->sources[j], at[j]);
  }
  b->source_counts.assign(2 * streams_.size(), 0);
  for (size_t j = 0; j < order.size();) {
    const size_t s = b->sources[j];
    size_t e = j;
    while (e < order.size() && b->sources[e] == s) ++e;
    streams_[s].map(at.data() + j, indices.data() + j, e - j);
    // A URL's shards not local yet: the first batch's records are asked for by
    // range now, together (NOTE [ Records by range ] in format/record_ranges.h).
    if (k == 0) source_->dataset(s).want_records(indices.data() + j, e - j);
    b->source_counts[2 * s] += static_cast<int64_t>(e - j);
    j = e;
  }
  int64_t unit = opts_.unit_samples;
  if (unit <= 0) {
    const int64_t parts = 4 * std::max(1, opts_.threads_hint);
    unit = std::max<int64_t>(1, (opts_.sampler.batch_size + parts - 1) / parts);
  }
  unit = std::max<int64_t>(unit, (n + 65534) / 65535);  // at most 65535 units
  plan_record_batch(*source_, std::move(indices), unit, *b);
  b->handoff = opts_.handoff;  // batch_map= (the Python stage)
  return b;
}

int64_t MixRecordProducer::stream_position(size_t s, uint64_t epoch, int64_t position) const {
  STOKER_CHECK(s < streams_.size(), UsageError, "no source ", s);
  STOKER_CHECK(position >= 0 && position <= epoch_rows_, UsageError, "position ", position,
               " outside the epoch's ", epoch_rows_, " rows");
  STOKER_CHECK(epoch < static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / epoch_rows_),
               UsageError, "epoch ", epoch, " is past 2**63 rows");
  const int64_t row = static_cast<int64_t>(epoch) * epoch_rows_ + position;
  return sequence().counts(row)[s];  // samples of the source's stream before it
}

std::vector<size_t> MixRecordProducer::shard_schedule(size_t s, uint64_t epoch, int64_t position,
                                                      size_t max_shards) const {
  return streams_[s].shard_schedule(stream_position(s, epoch, position), max_shards);
}

ReadPosition MixRecordProducer::source_position(size_t s, uint64_t epoch, int64_t position) const {
  const int64_t c = stream_position(s, epoch, position);
  const int64_t n = streams_[s].size();
  return ReadPosition{static_cast<uint64_t>(c / n), c % n, 1};
}

EpochOrder MixRecordProducer::source_order(size_t s, uint64_t pass) const {
  STOKER_CHECK(s < streams_.size(), UsageError, "no source ", s);
  return streams_[s].pass_order(static_cast<int64_t>(pass));
}

MixSequence MixRecordProducer::sequence() const { return seq_.get(); }

void MixRecordProducer::set_sequence(MixSequence seq) { seq_.set(std::move(seq)); }

}  // namespace stoker
