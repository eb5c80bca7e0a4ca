// What goes into a batch. The loader core (loader_core.h) owns the threads,
// the order of batches, their memory and stopping; a producer only says what
// batch k of an epoch holds and how to write it. The producers live in
// csrc/producers/ and see of the engine only this header: records of a sharded
// dataset (producers/record_producer.h: fields, images, padded arrays) and
// token streams (producers/token_producer.h: language-model windows, packing,
// token budgets).
//
//   core                         producer
//   ----                         --------
//   epoch segment starts   ->    plan_epoch(key)          once, by one worker
//   batch k is due         ->    plan_batch(epoch, k)     once, by one worker: layout + units
//   memory for layout.bytes      (the core allocates a slot from its block pool)
//   units 0..U-1 (any threads) -> BatchWork::run(u, base, ctx)
//   all units done         ->    BatchWork::finish(base, ctx)  by the thread that ran the last
//                                batch handed to the consumer in order
//
// A batch must be a pure function of (key, k): whatever thread runs which
// unit, the bytes are the same. Units must write disjoint bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "pipeline/batch.h"

namespace stoker {

/// Which share of which epoch is produced. Samples are counted globally: the
/// epoch order is one sequence that ranks take in turn (rank r of w takes
/// positions r, r+w, ...), so `offset` global samples already consumed (a
/// resumed epoch, possibly at another world size) is the same on every rank.
struct EpochKey {
  uint64_t epoch = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t offset = 0;  ///< global samples of the epoch consumed before this segment
  /// Where wrap-around padding (equal batch counts) restarts: 0, as in an
  /// uninterrupted epoch (also for a resume at the same world size, which must
  /// repeat it exactly), or `offset` for a resume at another world size, so
  /// that padding repeats only samples not yet consumed by the job.
  int64_t pad_from = 0;

  bool operator==(const EpochKey& o) const {
    return epoch == o.epoch && rank == o.rank && world_size == o.world_size && offset == o.offset &&
           pad_from == o.pad_from;
  }
  bool operator!=(const EpochKey& o) const { return !(*this == o); }
};

/// Time per stage, summed by a worker and flushed to the loader's stats. The
/// stages are the ones `stats()` reports.
struct StageTimes {
  int64_t read_ns = 0;    ///< reading records and verifying checksums
  int64_t decode_ns = 0;  ///< decoding payloads (images, arrays, tokens)
  int64_t ops_ns = 0;     ///< image ops after decoding (resize, flip, normalize, layout)
  int64_t bytes = 0;      ///< source bytes read
};

/// What a worker passes to the unit it runs.
struct WorkerContext {
  /// Set when the batch's stream is stopped: a unit checks it between items
  /// and returns early (the core then never hands the batch out).
  const std::atomic<bool>* stop = nullptr;
  StageTimes times;
  bool stopped() const { return stop && stop->load(std::memory_order_relaxed); }
};

/// One planned batch: its layout and the work to fill it.
class BatchWork {
 public:
  virtual ~BatchWork() = default;

  /// Output tensors, laid out in one buffer of `bytes` bytes (64-byte aligned offsets).
  std::vector<TensorDesc> tensors;
  size_t bytes = 0;
  /// Independent pieces of work, 1..65535; the core runs them on any threads.
  int units = 1;
  /// Samples in the batch (stats; for tokens: rows).
  int64_t samples = 0;
  /// Finished outside the pool after its units: the stream hands it to the
  /// loader's BatchFinisher (batch_handoff.h) instead of publishing it.
  bool handoff = false;
  /// Set by the stream when it plans the batch: its segment and its number there.
  EpochKey key;
  int64_t index = 0;

  /// Writes unit `u` into `base` (`bytes` bytes). Throws the error of the
  /// unit's first bad item; the core keeps the error of the lowest unit, so
  /// the error a batch reports does not depend on scheduling.
  virtual void run(int u, uint8_t* base, WorkerContext& ctx) = 0;

  /// Work on the whole batch once every unit is written (a batch transform:
  /// MixUp, CutMix), run by the thread that finished the last unit; not run
  /// when a unit failed or the stream stopped. Throws: the batch's error.
  virtual void finish(uint8_t* /*base*/, WorkerContext& /*ctx*/) {}

  /// Items replaced under on_error="skip", and source bytes read, counted when
  /// the batch is delivered (units add to them).
  std::atomic<int64_t> skipped{0};
  std::atomic<int64_t> bytes_read{0};
  /// A mixture's batch: per source, its rows then its real tokens (empty otherwise).
  std::vector<int64_t> source_counts;
};

/// NOTE [ Open-ended epochs ]
/// A source whose length is known only when it ends (an IterableDataset: a
/// generator, a stream of files) plans an epoch with kUnknownBatches batches:
/// the workers plan batch k as for any source (which rows it holds: k * batch_size
/// onwards) and the finisher that fills it from the source ends the epoch:
///
///   batch k                      finisher (batch_handoff.h)
///   its rows all there      ->   complete()                 a full batch
///   the source ends inside  ->   complete()                 the last, partial batch
///   no row left for it      ->   end()                      the epoch ends before k
///
/// The reader stops at the first position ended (Stream::Read::kEnd), and the
/// core's iterator ends its epoch there as if it had counted that many batches
/// from the start (NOTE [ Epochs and iterators ] in loader_core.h): set_epoch,
/// several iterators, skip, the resume state (consumed_after) and the stats are
/// the core's, the same as for every other source. Only what needs the count
/// ahead differs: len() is unknown to the core (the Loader asks the dataset), and
/// the stream never flows on into the next epoch (a segment's end is not known
/// before it is read), so each epoch starts a stream of its own.
inline constexpr int64_t kUnknownBatches = int64_t{1} << 60;

/// Per-epoch state a producer computes once (a permutation, a packing plan),
/// shared read-only by every worker of that epoch segment.
class EpochPlan {
 public:
  virtual ~EpochPlan() = default;
  /// Batches in this segment of the epoch, for this rank; kUnknownBatches when the
  /// source says where the epoch ends (NOTE [ Open-ended epochs ]).
  virtual int64_t num_batches() const = 0;
};

class BatchProducer {
 public:
  virtual ~BatchProducer() = default;
  /// Batches of a whole epoch (offset 0) for this rank: len(loader). Cheap.
  virtual int64_t num_batches(int64_t rank, int64_t world_size) const = 0;
  /// This rank's samples in a whole epoch (wrap-around padding included; rows of
  /// a mixture, windows or packed rows of tokens): what a DataLoader's sampler's
  /// len() is. Cheap.
  virtual int64_t rank_samples(int64_t rank, int64_t world_size) const = 0;
  /// Global samples in one epoch (the unit of EpochKey::offset), before rank padding.
  virtual int64_t epoch_samples() const = 0;
  /// Global samples consumed once every rank has taken `batches` batches of the
  /// segment `key` (for resume state). Never more than epoch_samples().
  virtual int64_t consumed_after(const EpochKey& key, int64_t batches) const = 0;
  /// The state of one epoch segment. May throw (the segment's first batch then
  /// reports it). Called from a worker thread.
  virtual std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const = 0;
  /// Plans batch `k` (0-based within the segment). May throw: the batch then
  /// carries the error. Called from a worker thread.
  virtual std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const = 0;
  /// Stops what the producer runs on its own, if anything (the record producer
  /// maps shards ahead: NOTE [ Warm mappings ] in producers/mapping_warmer.h).
  /// LoaderCore::close() calls it (NOTE [ Loader shutdown ]). Prompt; any thread.
  virtual void close() const {}
};

}  // namespace stoker
