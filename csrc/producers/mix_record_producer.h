// Batches of a mixture of record datasets with the same fields (NOTE
// [ Mixtures ] in sampler/mixture.h): each row from the source the mixture's
// rule gives it, each source read in its own keyed order (or shard-window
// order) pass after pass, written by the record producer's planner and
// sample writer with the samples of a batch grouped by source.
#pragma once

#include <memory>
#include <vector>

#include "format/dataset.h"
#include "pipeline/batch_producer.h"
#include "producers/record_producer.h"
#include "sampler/fetch_plan.h"
#include "sampler/mixture.h"
#include "sampler/source_stream.h"

namespace stoker {

class MixRecordProducer final : public BatchProducer {
 public:
  /// @param sets the sources' datasets, all with the same schema, none with a
  ///        field named "source" (the batch's own)
  /// @param seq which source each row of the stream comes from
  /// @param epoch_rows rows of the mixture per epoch (>= 1)
  /// @param keys each source's stream key (its passes' orders)
  /// @param opts as for one dataset (the sampler's seed keys the draws of
  ///        image ops; shard_window applies to every source)
  MixRecordProducer(std::vector<std::shared_ptr<const Dataset>> sets, MixSequence seq,
                    int64_t epoch_rows, std::vector<uint64_t> keys, RecordOptions opts);

  int64_t num_batches(int64_t rank, int64_t world_size) const override;
  int64_t rank_samples(int64_t rank, int64_t world_size) const override;
  int64_t epoch_samples() const override { return epoch_rows_; }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override;
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override;
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override;

  /// The sequence in force (set_sequence() may replace it before any epoch is planned).
  MixSequence sequence() const;
  /// Replaces the sequence: a resume that keeps the schedule's rows of the run
  /// that saved it. UsageError once an epoch has been planned, or for another
  /// number of sources.
  void set_sequence(MixSequence seq);
  /// The shards of source `s` the whole job reads from global position
  /// `position` of `epoch` on (its stream's schedule from where it stands
  /// there), at most `max_shards`: what a remote source's fetcher fetches next.
  std::vector<size_t> shard_schedule(size_t s, uint64_t epoch, int64_t position,
                                     size_t max_shards) const;
  /// Where source `s`'s stream stands at global position `position` of
  /// `epoch`, as a plain one-rank reader of that source would: (pass, samples
  /// of the pass consumed, 1). With source_order(), what a remote source's
  /// fetch plan follows (sampler/fetch_plan.h).
  ReadPosition source_position(size_t s, uint64_t epoch, int64_t position) const;
  /// Pass `pass` of source `s`'s stream, in its order.
  EpochOrder source_order(size_t s, uint64_t pass) const;

 private:
  MixSplit split(const EpochKey& key) const;
  /// Samples of source `s`'s stream before global position `position` of `epoch`.
  int64_t stream_position(size_t s, uint64_t epoch, int64_t position) const;

  std::shared_ptr<RecordSource> source_;
  std::vector<SourceStream> streams_;
  MixSequenceSlot seq_;
  int64_t epoch_rows_;
  RecordOptions opts_;
};

}  // namespace stoker
