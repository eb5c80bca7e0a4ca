// A stream: one run of consecutive epoch segments, produced by the worker
// pool into one batch ring and read in order by one reader (the iterating
// thread, or the copy thread in front of it).
//
// NOTE [ Streams and segments ]
// Ring positions count the stream's batches: 0, 1, 2, ... A segment is one
// epoch (or the rest of one, after a resume) and covers the positions
// [begin, begin + batches). When the workers reach the end of the last
// segment, the stream flows on into the next one if the loader has said which
// (set_next): that is how the next epoch starts loading while this one's last
// batches are handed out, inside the same window of `window` positions, so
// the two epochs together never hold more batches than one would.
//
// NOTE [ Batch assembly ]
// Position p is claimed by the first worker that finds its ring slot free;
// that worker plans it (producer's plan_batch: the layout, a slot from the
// block pool, the number of units) and publishes the units in the job's unit
// word: (p mod 2^32, next unit, unit count) in one 64-bit atomic. Workers take
// units with a CAS on that word, from the lowest position with units left, so
// all threads cooperate on the oldest batch first and the first batch is
// ready after 1/T of its work. The position in the word makes a stale CAS
// (the slot already reused for p + N) fail. The last unit to finish publishes
// the position to the reader. A worker never waits on another: a position
// being planned is skipped, and one that is out of the window (p >= consumed
// + window) means there is nothing to do on this stream now.
//
// NOTE [ Window and memory ]
// The ring has `capacity` slots, allocated up front (they hold no batch
// memory); the window, at most the capacity, is how many of them may be in
// flight. With an automatic prefetch the loader core moves the window
// (pipeline/autotuner.h) and sets a memory limit: every batch planned updates
// the largest batch size seen, and the window in force is cut to
// limit / largest (at least 1), so the batches in flight stay within the
// limit from the first batch whose size is known. Before any batch of a
// stream is planned, the workers that start at once may each plan one.
//
// Stopping: stop() sets the stop flag and closes the ring, so every wait on it
// returns, units return between samples, and a batch cut short is never
// handed out (the reader checks the flag after a successful wait). Workers drop
// the stream at their next look; it is freed when the last holder lets go, and
// batches already handed out stay valid (they own their slot). The loader's
// whole stop order: NOTE [ Loader shutdown ] in loader_core.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "common/cache_line.h"
#include "common/detail/event_count.h"
#include "pipeline/batch.h"
#include "pipeline/batch_handoff.h"
#include "pipeline/batch_producer.h"
#include "pipeline/batch_ring.h"
#include "pipeline/block_pool.h"
#include "pipeline/loader_stats.h"

namespace stoker {

/// One epoch (or its rest) on a stream.
struct Segment {
  EpochKey key;
  int64_t begin = 0;    ///< ring position of the segment's batch 0
  int64_t batches = 0;  ///< positions [begin, begin + batches)
  std::shared_ptr<const EpochPlan> plan;
};

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  using Clock = std::chrono::steady_clock;
  /// kEnd: the finisher ended an open-ended epoch at the position (NOTE [ Open-ended
  /// epochs ] in batch_producer.h); the reader stays there.
  enum class Read { kBatch, kTimeout, kStopped, kEnd };

  /// Plans `first` at once (plan_epoch): its error is thrown here.
  /// @param capacity ring slots, the largest window
  /// @param window positions in flight (planned, assembled or waiting), <= capacity
  /// @param finisher finishes batches planned with BatchWork::handoff (batch_handoff.h)
  Stream(std::shared_ptr<const BatchProducer> producer, std::shared_ptr<BlockPool> pool,
         std::shared_ptr<detail::EventCount> work_signal, std::shared_ptr<LoaderStats> stats,
         int capacity, int window, const EpochKey& first,
         std::shared_ptr<BatchFinisher> finisher = nullptr);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // -- workers (any threads) --------------------------------------------------

  struct Unit {
    int64_t pos = -1;
    int index = 0;
  };
  /// Claims a unit of work (planning its position first if this worker is the
  /// first there). False when there is nothing to do now.
  bool claim(Unit& out, WorkerContext& ctx);
  /// Unique in the process (HandedOffBatch::stream_id).
  uint64_t id() const { return id_; }
  /// Set once the stream stops (what a worker binds while it runs the stream's units).
  const std::atomic<bool>* stop_flag() const { return &stop_; }
  /// Runs a claimed unit and completes its position when it is the last.
  void run(const Unit& u, WorkerContext& ctx);

  // -- the reader (one thread at a time) --------------------------------------

  /// The batch at read_position(), waiting up to `deadline`. kStopped once the
  /// stream is stopped. A failed batch comes as kBatch with `out.error` set.
  Read read(HostBatch& out, Clock::time_point deadline);
  /// The position the next read() returns.
  int64_t read_position() const { return read_pos_.load(std::memory_order_acquire); }
  /// Whether every position before `pos` left the workers: handed off to the
  /// finisher, or published (NOTE [ Hand-off order ]). Any thread.
  bool passed_before(int64_t pos) const;
  /// Positions assembled and waiting for the reader.
  int ready_batches() const;
  /// Positions the reader can take now without waiting (consecutive ready
  /// ones from read_position()), counted up to `max`.
  int ready_run(int max) const;
  /// Units done and units in all of position `pos` ({0, 0} while it is not
  /// planned yet): how far a slow batch has come.
  std::pair<int, int> progress(int64_t pos) const;

  // -- segments ---------------------------------------------------------------

  /// The segment holding position `pos`, if it is planned. Any thread.
  std::optional<Segment> segment_at(int64_t pos) const;
  /// The key of the segment starting at `pos`: a planned one, or the next
  /// one set_next() named if `pos` is the end of the last.
  std::optional<EpochKey> key_at(int64_t pos) const;
  /// Whether a planned segment starts at `pos` (the workers reached it).
  bool planned(int64_t pos) const;
  /// The segment starting at `pos`, planning the one set_next() named if the
  /// workers have not reached it yet (its error is thrown here).
  std::optional<Segment> segment_from(int64_t pos);
  /// Which segment follows the last one (the next epoch), or none. Workers
  /// plan it when they reach the end; until then it may be changed.
  void set_next(std::optional<EpochKey> key);

  /// Stops the stream (above; NOTE [ Loader shutdown ]). Idempotent, any thread.
  void stop();
  bool stopped() const { return stop_.load(std::memory_order_acquire); }

  /// NOTE [ Window and memory ].
  void set_window(int window);
  /// The window in force: the one set, or less under the memory limit.
  int window() const {
    return std::min(window_.load(std::memory_order_relaxed),
                    mem_window_.load(std::memory_order_relaxed));
  }
  int capacity() const { return static_cast<int>(ring_.capacity()); }
  /// Bytes of batches in flight at most (0: no limit), for the window's
  /// automatic setting; explicit windows are given with no limit.
  /// @param batch_bytes the largest batch known so far (another stream's)
  void set_memory_limit(size_t bytes, size_t batch_bytes = 0);
  /// The largest batch planned so far (bytes; 0 before the first).
  size_t max_batch_bytes() const { return max_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    std::atomic<uint64_t> units{~0ull};  // (pos mod 2^32) << 32 | next << 16 | count
    std::atomic<int> done{0};
    std::atomic<bool> cut_short{false};
    // The position whose batch left the workers (handed off, or published):
    // NOTE [ Hand-off order ]. Another position's value: not yet.
    std::atomic<int64_t> passed{-1};
    bool end = false;  // the finisher ended the epoch here (NOTE [ Open-ended epochs ])
    std::unique_ptr<BatchWork> work;
    std::shared_ptr<uint8_t> memory;
    int64_t index = -1;   // batch number within its epoch
    uint64_t ticket = 0;  // the finisher's (batch_handoff.h)
    std::mutex error_mu;  // the error path only
    std::exception_ptr error;
    int error_unit = INT_MAX;
  };

  class Handle;  // a handed-off batch (batch_handoff.h)
  bool extend(int64_t pos);
  void plan(int64_t pos, Job& job);
  void note_bytes(size_t bytes);
  void finish(int64_t pos, Job& job, WorkerContext& ctx);

  const std::shared_ptr<const BatchProducer> producer_;
  const std::shared_ptr<BlockPool> pool_;
  const std::shared_ptr<detail::EventCount> signal_;
  const std::shared_ptr<LoaderStats> stats_;
  const std::shared_ptr<BatchFinisher> finisher_;
  const uint64_t id_;
  BatchRing<Job> ring_;

  alignas(kCacheLineSize) std::atomic<int64_t> claim_pos_{0};  // lowest position with units left
  alignas(kCacheLineSize) std::atomic<int64_t> consumed_{0};   // positions released by the reader
  std::atomic<int64_t> read_pos_{0};
  alignas(kCacheLineSize) std::atomic<int64_t> limit_{0};  // end of the last segment
  std::atomic<int> window_;
  std::atomic<int> mem_window_{INT_MAX};  // positions the memory limit allows
  std::atomic<size_t> memory_limit_{0};
  std::atomic<size_t> max_bytes_{0};
  std::atomic<bool> stop_{false};

  mutable std::mutex seg_mu_;
  std::deque<Segment> segments_;  // guarded by seg_mu_; old ones are dropped once read
  std::optional<EpochKey> next_;  // guarded by seg_mu_
  bool next_failed_ = false;      // guarded by seg_mu_: planning `next_` threw
};

}  // namespace stoker
