// The Python stage's hand-off (NOTE [ Python stage ] in
// python/stoker/_stage/__init__.py): the loader's BatchFinisher when it has
// `map=`, `collate_fn=` or a map-style dataset. A worker hands it each planned
// batch (stage/python_producer.h: its sample indices); the stage's Python
// threads take the batches in chunks of a few samples, earliest batch first (by
// epoch and number, whatever order the workers finished them in), and a batch
// only once every earlier one of its stream was handed off or published (NOTE
// [ Hand-off order ] in pipeline/stream.cpp), so that all threads work on the
// batch the consumer needs next; the thread that
// finishes a batch's last chunk assembles it and completes it, which
// publishes it to the stream's reader in order.
//
//   worker thread            hand_off(b) -> queue: [task p, task p+1, ...]
//   Python thread (GIL off)  take() -> (task p, samples [lo, hi))   (waits on an event count)
//   Python thread (GIL on)   map the samples; chunk_done() -> the last one:
//                            allocate(), write the batch, complete() / fail()
//
// Nothing here calls Python: the threads that call take() are Python's, and
// they release the GIL to wait (bindings/register_python_stage.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/detail/event_count.h"
#include "common/error.h"
#include "pipeline/batch_handoff.h"
#include "pipeline/loader_stats.h"

namespace stoker {

/// A batch of the Python stage failed: the Python exception is kept by the
/// stage under `ticket`, and the consumer's binding raises that object.
class PythonStageError : public Error {
 public:
  PythonStageError(uint64_t ticket, const std::string& message) : Error(message), ticket_(ticket) {}
  uint64_t ticket() const { return ticket_; }

 private:
  uint64_t ticket_;
};

/// Time the Python stage spent on a chunk or a batch, for the loader's stats.
struct PythonTimes {
  int64_t python_ns = 0;  ///< wall time in Python (the native fetch left out)
  int64_t cpu_ns = 0;     ///< the thread's CPU time in it (GIL-bound threads take turns)
  int64_t read_ns = 0, decode_ns = 0, ops_ns = 0;  ///< the C++ fetch of stoker samples
  int64_t bytes = 0;                               ///< source bytes read
  int64_t wait_ns = 0;  ///< runnable but waiting for a CPU (the machine's cores were busy)
};

/// One handed-off batch, as the stage's threads see it.
class PythonTask {
 public:
  /// @param batch_size the loader's, to number a resumed segment's batches
  PythonTask(uint64_t id, std::shared_ptr<HandedOffBatch> batch, int64_t chunk_samples,
             int64_t batch_size, std::shared_ptr<LoaderStats> stats);

  const uint64_t id;
  std::vector<int64_t> indices;  ///< dataset index of each sample, in batch order
  uint64_t epoch = 0;
  int64_t rank = 0, world_size = 1;
  /// The stream the batch belongs to (HandedOffBatch::stream_id): a source read in
  /// order keeps one reading per stream.
  uint64_t stream = 0;
  /// Global samples consumed before its segment (EpochKey::offset): a resumed
  /// open-ended epoch reads that many rows again before its batch 0.
  int64_t offset = 0;
  /// Batch number counted from the start of the epoch: a resumed segment's
  /// batch k is offset / (batch_size * world_size) + k (exact at the world size
  /// that saved the state). It keys batch_map's generator.
  int64_t number = 0;
  /// What the C++ units wrote (a record batch handed off for batch_map): its
  /// tensors in `memory`. Empty for batches of sample indices.
  std::vector<TensorDesc> tensors;
  std::shared_ptr<uint8_t> memory;
  size_t bytes = 0;
  int64_t samples() const { return static_cast<int64_t>(indices.size()); }
  int64_t chunk_samples() const { return chunk_samples_; }

  /// Nobody will read the batch (its stream stopped): drop the work.
  bool stopped() const { return batch_->stopped(); }
  /// Every earlier batch of its stream was handed off or published (NOTE [ Hand-off
  /// order ] in pipeline/stream.cpp): take() serves it only then.
  bool earlier_passed() const { return batch_->earlier_passed(); }
  /// Claims the next chunk: [lo, hi) of the samples. False when all are taken.
  bool claim(int64_t& lo, int64_t& hi);
  bool fully_claimed() const { return next_ >= chunks_; }
  /// No chunk claimed yet (guarded by the hand-off's mutex, as claim()).
  bool fresh() const { return next_ == 0; }
  /// Marks a claimed chunk done; true for the last of the batch (its thread
  /// assembles and completes the batch).
  bool chunk_done();
  void add_times(const PythonTimes& t);

  /// HandedOffBatch's: memory from the loader's pool, publication.
  std::shared_ptr<uint8_t> allocate(size_t bytes) { return batch_->allocate(bytes); }
  void complete(std::vector<TensorDesc> tensors, size_t bytes, uint64_t ticket, int64_t skipped);
  /// Publishes what the C++ units wrote (`tensors`, `memory`) as it is, with `ticket`.
  void keep(uint64_t ticket) { complete(tensors, bytes, ticket, 0); }
  /// The batch fails with PythonStageError(ticket, message).
  void fail(uint64_t ticket, const std::string& message);
  /// An open-ended epoch (an IterableDataset: stage/iterable_producer.h) ends before
  /// this batch, which had no row left (NOTE [ Open-ended epochs ] in
  /// pipeline/batch_producer.h).
  void end() { batch_->end(); }
  /// The batch holds `n` samples, fewer than planned (an open-ended epoch's last).
  void set_samples(int64_t n) { batch_->set_samples(n); }

 private:
  std::shared_ptr<HandedOffBatch> batch_;
  std::shared_ptr<LoaderStats> stats_;
  int64_t chunk_samples_ = 1;
  int chunks_ = 1;
  int next_ = 0;  // guarded by the hand-off's mutex
  std::atomic<int> done_{0};
  std::atomic<int64_t> bytes_read_{0};
};

class PythonHandoff final : public BatchFinisher {
 public:
  using Clock = std::chrono::steady_clock;

  /// @param chunk_samples samples per chunk (>= 1)
  /// @param batch_size the loader's (PythonTask::number)
  PythonHandoff(int64_t chunk_samples, int64_t batch_size);
  /// The loader's stats, where the stage's times go (set before the first batch).
  void set_stats(std::shared_ptr<LoaderStats> stats);

  void hand_off(std::shared_ptr<HandedOffBatch> batch) override;
  void passed() override { ready_.notify(); }

  struct Chunk {
    std::shared_ptr<PythonTask> task;
    int64_t lo = 0, hi = 0;
  };
  /// A chunk of the earliest batch (epoch, number) with chunks left, waiting until `deadline`.
  /// False at the deadline or once closed. Batches whose stream stopped are
  /// dropped here.
  bool take(Chunk& out, Clock::time_point deadline);
  /// Wakes every take(); later ones return false at once. Batches waiting are
  /// dropped (their streams fail nothing: a stopped stream reads nothing).
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  /// Drops the batches waiting whose stream stopped (the loader's close(): until the
  /// next take(), they would hold their batch memory). Returns how many.
  size_t drop_stopped();
  /// Batches handed off and not fully claimed.
  size_t waiting() const;
  int64_t chunk_samples() const { return chunk_samples_.load(std::memory_order_relaxed); }
  /// Samples per chunk of the batches handed off from now on (the stage moved from
  /// threads to worker processes: as many chunks in a batch as workers).
  void set_chunk_samples(int64_t n) {
    chunk_samples_.store(std::max<int64_t>(1, n), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> chunk_samples_;
  const int64_t batch_size_;
  mutable std::mutex mu_;
  std::shared_ptr<LoaderStats> stats_;             // guarded by mu_
  std::deque<std::shared_ptr<PythonTask>> queue_;  // guarded by mu_
  uint64_t next_id_ = 1;                           // guarded by mu_
  detail::EventCount ready_;
  std::atomic<bool> closed_{false};
};

}  // namespace stoker
