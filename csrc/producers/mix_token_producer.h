// Batches of a mixture of token sources (NOTE [ Mixtures ] in
// sampler/mixture.h): windows, concat or packed rows, or token-budget batches,
// each source with its own plan (its packing, its budget batches), drawn by
// the mixture's rule and written by the token producer's code.
//
// A row of the mixture is a unit of one source: a window or a packed row (a
// batch holds `batch` of them per rank, grouped by source), or a whole
// token-budget batch (one per rank per step). Source s's c-th unit is unit
// SourceStream(c) of its producer: pass c div n_s in its own keyed order, and
// for budgets the documents of a batch in the order of that pass.
#pragma once

#include <memory>
#include <vector>

#include "pipeline/batch_producer.h"
#include "producers/token_producer.h"
#include "sampler/mixture.h"
#include "sampler/source_stream.h"

namespace stoker {

class MixTokenProducer final : public BatchProducer {
 public:
  /// @param sources one producer per source, made with the same options (each
  ///        with its own seed: the order of its packing)
  /// @param seq which source each row of the stream comes from
  /// @param epoch_rows rows of the mixture per epoch (>= 1)
  /// @param keys each source's stream key (its passes' orders)
  /// UsageError for options that differ between sources.
  MixTokenProducer(std::vector<std::shared_ptr<const TokenProducer>> sources, MixSequence seq,
                   int64_t epoch_rows, std::vector<uint64_t> keys);

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
  const TokenProducer& source(size_t s) const { return *sources_[s]; }
  size_t num_sources() const { return sources_.size(); }

 private:
  MixSplit split(const EpochKey& key) const;

  std::vector<std::shared_ptr<const TokenProducer>> sources_;
  std::vector<SourceStream> streams_;
  MixSequenceSlot seq_;
  int64_t epoch_rows_;
  int64_t batch_;  // rows per rank per step (1: token-budget batches)
  bool budget_, drop_last_, even_batches_;
};

}  // namespace stoker
