// The loader engine: worker threads assemble whole batches straight into
// slots, and the consumer takes them strictly in order.
//
// NOTE [ Batch assembly ]
// One epoch (an Iteration) is a sequence of tasks t = 0, 1, 2, ...; task t is
// chunk t % C of batch first + t / C. Workers claim tasks with one atomic
// counter, so any number of threads cooperates on the same batch (the first
// batch is ready after 1/T of its work, not after a whole batch on one thread).
//
//   jobs_[k % P]  (P = prefetch)       consumer
//   +--------+--------+--------+
//   | k      | k+1    | k+2    |  <--  takes jobs_[consumed % P] when ready,
//   +--------+--------+--------+       resets it, bumps consumed_
//     ^ workers fill chunks; the last chunk to finish marks the job ready
//
// A worker may touch batch k only once k < consumed_ + P - held_: that bounds
// the batches in flight and makes job k % P free for reuse. held_ (0 unless
// start() was given some) lends part of the window to someone else: the loader
// starts the next epoch while the current one still has batches in flight, and
// hands the window over one batch at a time as those are consumed
// (NOTE [ Next-epoch prefetch ] in python/stoker/loader.py), so that the two
// together never hold more than P batches. The first worker on a
// job prepares it (sample indices, output layout, a slot from the pool). Each
// sample writes only its own rows of the slot, so the result does not depend
// on which thread did what.
//
// NOTE [ Shutdown ]
// stop() sets stop_, wakes every wait, and joins the workers. Every wait in
// here has a timeout and checks stop_, and workers check it between samples,
// so stop() returns within one sample's work. Tensors already handed out stay
// valid: they own their slot (NOTE [ Slot lifetime ]). In a child process after
// fork() the workers do not exist, so the Iteration neither uses nor joins them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "decode/image_pipeline.h"
#include "format/dataset.h"
#include "pipeline/batch.h"
#include "pipeline/slot_pool.h"
#include "sampler/sampler.h"

namespace stoker {

struct EngineOptions {
  SamplerOptions sampler;
  int num_threads = 1;
  int prefetch = 2;           ///< batches in flight (assembled or being assembled)
  bool skip_errors = false;   ///< replace a bad sample by the next valid one, counted
  std::shared_ptr<HostAllocator> allocator;       ///< null = pageable aligned memory
  std::map<std::string, ImageFieldSpec> images;   ///< spec for each image field
};

/// Counters shared by all iterations of an engine (monotonic).
struct EngineStats {
  std::atomic<int64_t> batches{0};     ///< delivered to the consumer
  std::atomic<int64_t> samples{0};     ///< in delivered batches (padding included)
  std::atomic<int64_t> bytes_read{0};  ///< record bytes read for delivered batches
  std::atomic<int64_t> skipped{0};     ///< samples replaced in delivered batches
  // Stage times: all work done, delivered or not.
  std::atomic<int64_t> read_ns{0};     ///< reading and verifying records
  std::atomic<int64_t> decode_ns{0};   ///< decoding and writing fields into slots
  std::atomic<int64_t> prepare_ns{0};  ///< planning batches, acquiring slots
  std::atomic<int64_t> wait_ns{0};     ///< consumer time blocked waiting for a batch
  std::atomic<int64_t> worker_idle_ns{0};  ///< workers blocked because prefetch is full
};

class Iteration;

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  static std::shared_ptr<Engine> create(std::shared_ptr<const Dataset> ds, EngineOptions opts);

  int64_t num_batches() const { return sampler_.num_batches(); }
  const Sampler& sampler() const { return sampler_; }
  const EngineOptions& options() const { return opts_; }
  EngineStats& stats() { return *stats_; }
  const SlotPool& pool() const { return *pool_; }

  /// Starts workers for `epoch`, yielding batches first_batch .. num_batches()-1.
  /// `held` of the prefetch window's batches are held back until release_held().
  std::unique_ptr<Iteration> start(uint64_t epoch, int64_t first_batch, int held = 0);

 private:
  friend class Iteration;
  Engine(std::shared_ptr<const Dataset> ds, EngineOptions opts);

  std::shared_ptr<const Dataset> ds_;
  EngineOptions opts_;
  Sampler sampler_;
  std::shared_ptr<SlotPool> pool_;
  std::shared_ptr<EngineStats> stats_;
  // Per field: image pipeline (null for other kinds).
  std::vector<std::unique_ptr<ImagePipeline>> pipelines_;
};

class Iteration {
 public:
  enum class Status { kBatch, kEnd, kTimeout };

  ~Iteration();
  Iteration(const Iteration&) = delete;
  Iteration& operator=(const Iteration&) = delete;

  /// The next batch in order. Waits up to `timeout`; rethrows the error of a
  /// batch when the consumer reaches that batch. Consumer thread only.
  Status next(HostBatch& out, std::chrono::milliseconds timeout);
  /// See NOTE [ Shutdown ]. Idempotent; any thread.
  void stop();
  /// Gives back `n` batches of the window held at start() (NOTE [ Batch assembly ]).
  void release_held(int n);
  int held() const { return held_.load(std::memory_order_acquire); }

  uint64_t epoch() const { return epoch_; }
  /// Index of the next batch next() returns.
  int64_t position() const { return consumed_.load(std::memory_order_acquire); }
  int64_t end() const { return end_; }
  /// Batches assembled and waiting for the consumer.
  int ready_batches() const;
  /// Worker threads still running (they exit once no task is left).
  int live_workers() const { return live_workers_.load(std::memory_order_acquire); }

 private:
  friend class Engine;
  Iteration(std::shared_ptr<Engine> engine, uint64_t epoch, int64_t first, int64_t end,
            int held);

  struct FieldPlan {
    size_t out = 0;                 // index into tensors
    size_t lengths = SIZE_MAX;      // index of "<name>_lengths", if variable
    size_t sample_bytes = 0;        // bytes per sample in the output tensor
    int64_t max_rows = 0;           // padded length of a variable field
    int img_h = 0, img_w = 0;       // output size of an image field
  };
  struct Job {
    std::mutex mu;
    int64_t batch = -1;  // guarded by mu; which batch this job holds
    std::atomic<bool> ready{false};
    std::atomic<int> chunks_left{0};
    std::vector<int64_t> indices;
    std::vector<FieldPlan> plans;
    HostBatch batch_out;
    std::exception_ptr error;  // guarded by mu; error of the lowest failing sample
    int64_t error_pos = INT64_MAX;
    std::atomic<int64_t> skipped{0};  // samples replaced (on_error="skip")
    std::atomic<int64_t> bytes{0};    // record bytes read
  };

  void worker_loop(int id);
  bool wait_for_space(int64_t k);
  void prepare(Job& job, int64_t k);
  void run_chunk(Job& job, int64_t k, int64_t chunk);
  struct LocalStats {  // summed per chunk: no shared cache line written per sample
    int64_t read_ns = 0, decode_ns = 0, bytes = 0;
  };
  void process_sample(Job& job, int64_t pos, int64_t index, std::vector<RecordView>& fields,
                      LocalStats& ls);
  bool fits(const Job& job, const std::vector<RecordView>& fields) const;
  void fail(Job& job, int64_t pos, std::exception_ptr e);
  void finish_chunk(Job& job);
  void reset(Job& job);

  std::shared_ptr<Engine> engine_;
  const Dataset& ds_;
  const Sampler::Epoch order_;
  const uint64_t epoch_;
  const uint64_t seed_;  // hash of (seed, epoch) for per-sample random draws
  const int64_t first_, end_;
  const int64_t chunk_size_, chunks_per_batch_, total_tasks_;
  const int prefetch_;
  const int pid_;

  std::vector<std::unique_ptr<Job>> jobs_;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int64_t> consumed_;
  std::atomic<int> held_;
  std::atomic<bool> stop_{false};
  std::atomic<int> live_workers_{0};

  std::mutex ready_mu_;
  std::condition_variable ready_cv_;
  std::mutex space_mu_;
  std::condition_variable space_cv_;
  std::vector<std::thread> workers_;
};

}  // namespace stoker
