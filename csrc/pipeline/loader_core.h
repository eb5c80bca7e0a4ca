// The loader core: one per stoker.Loader. It owns the stream of epochs, the
// worker pool, the block pool of batch slots, the delivery to the consumer
// (host, or a device copy) and the stats; Python only checks arguments and
// wraps batches.
//
// NOTE [ Epochs and iterators ]
// An iterator runs one epoch, fixed when it is first advanced (claimed):
//  * the epoch given by set_epoch(), else the one after the last epoch run;
//    an iterator that is never advanced uses no epoch;
//  * while another iterator is running an epoch, a new one runs that same
//    epoch from its start, on a stream of its own: zip(loader, loader) gets
//    every batch twice, and peeking with next(iter(loader)) inside a training
//    loop changes nothing for the loop;
//  * set_epoch(e) while an iterator runs epoch e confirms it (the next
//    iterator runs e + 1): a framework that calls set_epoch at the start of
//    its epoch never runs an epoch twice. set_epoch(e') for another epoch
//    applies to the next iterator.
// The resume state follows the main iterator (the one that claimed an epoch
// while no other ran): the epoch and the global samples consumed, the same
// numbers on every rank in lockstep.
//
// NOTE [ Next-epoch prefetch ]
// When the main iterator claims epoch e, its stream is told that e + 1 (or
// set_epoch's choice) follows (Stream::set_next): the workers plan it when
// they reach the end of e and assemble its first batches while e's last ones
// are handed out, in the same window. Once e's last batch is out the stream
// waits, held by the core, for the next iterator, which takes it over if it
// runs that epoch from its start; anything else (set_epoch to another epoch,
// load_state, another world size) drops it. iter() before the first advance
// already starts the epoch the iterator will most likely claim, the same way.
//
// NOTE [ Slow first batch ]
// No silent warm-up: while an iterator waits for its first batch, next()
// checks the time since iter(); past LoaderOptions::slow_first_batch it posts
// what the workers are doing (WorkerPool::activities(): opening shards,
// planning, reading, decoding, image ops) and how far the batch has come, at
// INFO, then at WARNING every 10 s after that while it still waits; once the
// batch arrives, its time. The bindings hand posted lines to the "stoker"
// logger between their waits, so the consumer's thread logs them.
//
// NOTE [ Parts ]
// A batch is a pure function of its segment's key and its number (batch_producer.h),
// so batches [first, first + count) of any loader's segment can be made by
// another core over the same producer (a service's actor: python/stoker/
// service/). run_part() makes them the next iterator's segment: the key with
// `offset` moved to where the first of them starts (consumed_after(key, first),
// the rule skip() and a resume at the same world size rely on: batch 0 there is
// batch `first` of the key) and the key's own pad_from (a resume at another
// world size restarts padding there, which no load_state() can say again), cut
// to `count` batches (detail/part_producer.h), so the workers plan nothing past
// the part; the next epoch never flows on after it.
//
// NOTE [ Loader shutdown ]
// The whole stop order, for each way a loader stops: an iterator left early
// (break, or dropped: Iterator::close), LoaderCore::close(), the core's end,
// and the process's (Python's atexit closes every live loader first).
//
//   1. Under the core's mutex, each run to stop is asked to, without waiting
//      (BatchReader::stop): its stream's stop flag is set and its ring closed
//      (waits on the ring return, units return between samples, a batch cut
//      short is never handed out: the reader checks the flag after its wait);
//      with device delivery the copy thread's flag is set and its output ring
//      closed too. The run leaves the core's lists and the worker pool's and
//      goes into a Retired list declared before the lock. An iterator whose
//      run stopped ends (kEnd) at its next next().
//   2. The mutex is released; then Retired joins each reader (BatchReader::
//      join): a copy thread first waits for the copies it queued, whose host
//      slots DMA may still read, and returns the slots; it never waits for the
//      consumer's stream. The run itself is freed by its last holder (the
//      Retired list, or an iterator that still holds it), also unlocked.
//   3. close() only, after that: the producer stops what it runs on its own
//      (BatchProducer::close: a thread mapping shards ahead), and
//      WorkerPool::stop ends and joins the workers, which drop stopped streams
//      at their next look anyway. Left early, the workers park and end after
//      `linger` with no stream open.
//   4. Nothing handed out is invalidated: a batch's memory is a lease that
//      holds its pool (NOTE [ Block lifetime ] in block_pool.h); device
//      buffers come back behind their consumer's event and are freed on a
//      copy thread once it completes, never in a tensor's deleter (NOTE
//      [ Deferred frees ]).
// A worker waiting for a remote shard gives up when its stream stops (NOTE
// [ Deferred shards ] in format/shard_gate.h), so nothing here waits for the
// network. In a forked child nothing is stopped or joined: the threads are the
// parent's (the core, streams, pools and iterators check their pid).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/batch_producer.h"
#include "pipeline/block_pool.h"
#include "pipeline/delivery.h"
#include "pipeline/detail/timed_mutex.h"
#include "pipeline/loader_options.h"
#include "pipeline/loader_stats.h"
#include "pipeline/loader_telemetry.h"
#include "pipeline/stream.h"
#include "pipeline/worker_pool.h"

namespace stoker {

/// Where a loader stands: the same on every rank in lockstep.
struct LoaderState {
  uint64_t epoch = 0;
  int64_t offset = 0;      ///< global samples of `epoch` consumed
  int64_t world_size = 0;  ///< of the job that consumed them (0: unknown)
};

class LoaderCore : public std::enable_shared_from_this<LoaderCore> {
 public:
  using Clock = std::chrono::steady_clock;
  class Iterator;

  static std::shared_ptr<LoaderCore> create(std::shared_ptr<const BatchProducer> producer,
                                            LoaderOptions opts);
  ~LoaderCore();
  LoaderCore(const LoaderCore&) = delete;
  LoaderCore& operator=(const LoaderCore&) = delete;

  const BatchProducer& producer() const { return *producer_; }
  /// Batches of a whole epoch for this rank.
  int64_t num_batches(int64_t rank, int64_t world_size) const;
  /// Batches the next main iterator of this rank would yield if it started now: the
  /// rest of a resumed (or skipped into) epoch, else a whole epoch.
  int64_t next_batches(int64_t rank, int64_t world_size) const;

  /// NOTE [ Epochs and iterators ].
  void set_epoch(uint64_t epoch);
  /// The epoch the next iterator runs.
  uint64_t epoch() const;

  /// A new iterator for this rank; it claims its epoch at its first next().
  std::shared_ptr<Iterator> iter(int64_t rank, int64_t world_size);

  LoaderState state() const;
  /// The next iterator resumes at `s`: the rest of that epoch, at whatever
  /// world size the iterator has.
  void load_state(const LoaderState& s);
  /// The next iterator starts at batch `batches` of its epoch (set_epoch's, else
  /// the next) on `rank` of `world_size`, reading none of the batches before it.
  /// A set_epoch(e) before that iterator moves the skip to epoch e; iter() takes
  /// it, load_state() drops it (accelerate's skip_first_batches calls it).
  void skip(int64_t batches, int64_t rank, int64_t world_size);
  /// The next iterator on (key.rank, key.world_size) runs batches [first, first
  /// + count) of segment `key` and ends: a part of another loader's epoch,
  /// batch for batch what that loader's iterator yields there (NOTE [ Parts ]).
  /// UsageError when the part is not inside the segment.
  void run_part(const EpochKey& key, int64_t first, int64_t count);

  /// Stops every stream and worker thread now; iterators end (kEnd). The
  /// loader stays usable: the next iterator starts them again.
  void close();

  /// Stops the stream kept or started for the next iterator (NOTE [ Next-epoch
  /// prefetch ]): the Python stage drops it when its earlier batches wait on
  /// work nobody will finish (NOTE [ Stuck workers ] in stoker/_stage/stuck.py).
  void drop_prefetch();

  LoaderStatsSnapshot stats() const;
  /// The counters themselves, for a BatchFinisher that adds its time to them.
  std::shared_ptr<LoaderStats> stats_handle() const { return stats_; }
  /// Workers taking work now (the tuner moves it; the Python stage follows it).
  int active_threads() const;
  const LoaderOptions& options() const { return opts_; }

  /// Log lines posted since the last call (tuning settled, a slow first
  /// batch, a stalled loop), oldest first. Any thread.
  std::vector<LogMessage> take_messages() { return telemetry_->take_messages(); }
  bool has_messages() const { return telemetry_->has_messages(); }

 private:
  struct Run;      // a stream and its reader
  struct Retired;  // runs stopped under mu_, joined after it (NOTE [ Loader shutdown ])
  struct Main {
    const Iterator* owner = nullptr;
    EpochKey key;
    int64_t yielded = 0;  // once the owner is gone (while it runs: owner->yielded_)
    bool finished = false;
    bool live = false;
    bool claimed = false;  // a main iterator claimed since the last load_state()
  };

  LoaderCore(std::shared_ptr<const BatchProducer> producer, LoaderOptions opts);
  bool forked() const;
  EpochKey prospective_key(int64_t rank, int64_t world) const;  // with mu_
  bool run_starts(const Run& run, const EpochKey& key) const;
  std::shared_ptr<Run> new_run(const EpochKey& key);       // with mu_
  void drop_spec(Retired& retired);                        // with mu_
  void resume_at(const LoaderState& s, Retired& retired);  // with mu_
  // With mu_: stops `run` without waiting and moves it to `retired`.
  void stop_run(std::shared_ptr<Run> run, Retired& retired);
  void claim(Iterator& it);
  void yielded(Iterator& it);
  // keep: the stream may be kept for the next iterator (no next() of `it` in flight)
  void release(Iterator& it, bool keep = true);
  void count_run(Iterator& it);  // with mu_
  void end_run(Iterator& it);
  // NOTE [ Autotuning ]: a window the tuner chose, for the streams and the pool.
  void apply_window(int window);

  const std::shared_ptr<const BatchProducer> producer_;
  const LoaderOptions opts_;
  const int pid_;
  std::shared_ptr<LoaderStats> stats_;
  std::shared_ptr<BlockPool> host_pool_;
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<LoaderTelemetry> telemetry_;  // stats, the tuner, log lines

  mutable std::mutex mu_;
  uint64_t next_epoch_ = 0;            // guarded by mu_
  std::optional<uint64_t> pending_;    // guarded by mu_: set_epoch's
  std::optional<LoaderState> resume_;  // guarded by mu_: load_state's
  struct Skip {
    uint64_t epoch;
    int64_t batches, rank, world_size;
  };
  std::optional<Skip> skip_;  // guarded by mu_: skip()'s, until an iterator takes it
  struct Part {
    EpochKey key;  // the part's first batch as a segment of its own
    int64_t batches;
  };
  std::optional<Part> part_;   // guarded by mu_: run_part()'s, until an iterator claims it
  Main main_;                  // guarded by mu_
  std::shared_ptr<Run> spec_;  // guarded by mu_: a stream waiting for its iterator
  std::vector<std::weak_ptr<Iterator>> iterators_;  // guarded by mu_
  std::vector<std::shared_ptr<Run>> runs_;          // guarded by mu_: every live run
};

class LoaderCore::Iterator {
 public:
  enum class Status { kBatch, kEnd, kTimeout };
  ~Iterator();
  Iterator(const Iterator&) = delete;
  Iterator& operator=(const Iterator&) = delete;

  /// The next batch, waiting up to `deadline` (kTimeout: call again). The
  /// first call claims the epoch (NOTE [ Epochs and iterators ]). A batch's
  /// error is thrown when its position is reached; the next call goes on with
  /// the batch after it (NOTE [ After a failed batch ] in stoker/_iterator.py).
  /// Calls from several threads are served one at a time. UsageError in a
  /// forked child.
  /// `side_stream`: BatchReader::next.
  Status next(DeliveredBatch& out, Clock::time_point deadline, uintptr_t consumer_stream = 0,
              uintptr_t side_stream = 0);
  /// Ends the iterator; batches handed out stay valid. Any thread. Its stream
  /// is kept for the next iterator when it already reached the next epoch and
  /// `keep` (NOTE [ Next-epoch prefetch ]), else stopped.
  void close(bool keep = true);
  /// Time the consumer spent in its next() outside next() here (making the batch's
  /// Python objects): data_stall counts it (the share of the loop spent in the
  /// loader's next()); the tuner and the verdict do not (more workers would not
  /// shorten it).
  void note_handoff(int64_t ns);

  /// Claims the iterator's epoch now, as its first next() would, without taking a
  /// batch (NOTE [ Placeholder batches ] in placeholder_producer.h). Idempotent.
  void claim();
  /// The segment it runs (claimed), else the one it would claim now.
  EpochKey key() const;
  /// Batches left: for an iterator not yet advanced, those of the epoch it would claim now.
  int64_t remaining() const;
  /// The epoch, once claimed (else the one it would claim now).
  uint64_t epoch() const;
  bool claimed() const { return claimed_; }
  /// Ended by close() (or its run stopped); an epoch that ran out is not closed.
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  /// Batches waiting for this iterator.
  int ready_batches() const;
  LoaderCore& core() const { return *core_; }

 private:
  friend class LoaderCore;
  Iterator(std::shared_ptr<LoaderCore> core, int64_t rank, int64_t world);

  const std::shared_ptr<LoaderCore> core_;
  const int64_t rank_, world_;
  const Clock::time_point opened_;
  mutable detail::TimedMutex mu_;  // one next() at a time
  std::atomic<bool> closed_{false};
  bool claimed_ = false;  // written with mu_ and core mu_
  bool main_ = false;
  bool counted_ = false;         // run time added to the stats (count_run(), with core mu_)
  Clock::time_point started_{};  // claimed (the first next()); with core mu_
  bool released_ = false;        // release() ran (with core mu_)
  int64_t drain_ = 0;            // batches of an earlier epoch to drop first
  int64_t seg_end_ = 0;          // ring position after this iterator's last batch
  std::shared_ptr<Run> run_;     // written with mu_ and core mu_
  EpochKey key_;
  int64_t batches_ = 0;
  // Batches handed out: written by next() (with mu_), read by the core's
  // state() from any thread, so the core needs no lock per batch.
  std::atomic<int64_t> yielded_{0};
  Clock::time_point next_report_{};  // NOTE [ Slow first batch ]
  bool reported_slow_ = false;
  bool asked_ = false;  // next() was called for the batch it waits for
};

}  // namespace stoker
