// The loader's worker threads: started when a stream needs them, parked on an
// event count while there is nothing to do, and ended when the loader has no
// open stream for a short while (or at once by stop()).
//
// NOTE [ Worker scheduling ]
// Workers are throughput threads; the thread that consumes batches (a training
// loop launching GPU work) is the one whose latency counts. Under SCHED_BATCH a
// worker gets the same CPU share as under SCHED_OTHER at the same nice value,
// but never preempts the thread that wakes it: next() wakes parked workers,
// and on a machine whose cores all run workers the woken one used to preempt
// the consumer for a scheduler slice, right inside next() (measured 2-5 ms at
// most epochs' first batch on a 2-core VM, bench_stall.py). Best effort: where
// the policy is refused the worker runs as before.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/activity.h"
#include "common/blocking.h"
#include "common/detail/event_count.h"
#include "pipeline/loader_stats.h"
#include "pipeline/stream.h"

namespace stoker {

class WorkerPool final : private BlockingListener {
 public:
  /// @param threads worker threads at most
  /// @param linger how long workers stay parked once no stream is open
  WorkerPool(int threads, std::shared_ptr<LoaderStats> stats,
             std::chrono::milliseconds linger = std::chrono::milliseconds(100));
  /// Stops and joins the workers (not in a forked child: they are not there).
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// The event count streams notify when work may have appeared.
  const std::shared_ptr<detail::EventCount>& signal() const { return signal_; }

  /// Serves `s` from now on, starting workers if none run.
  void add(std::shared_ptr<Stream> s);
  /// Stops serving `s` (workers drop it at their next look).
  void remove(const Stream* s);
  /// Starts the workers again if they ended (a stream got new work).
  void wake();
  /// Ends every worker now and joins them; add() starts them again, and so
  /// does stop() itself for a stream that was added meanwhile. Any thread.
  void stop();

  int threads() const { return threads_; }
  /// Workers allowed to take work (<= threads()); the others stay parked,
  /// woken only by the next set_active() or stop().
  void set_active(int n);
  int active() const { return active_.load(std::memory_order_relaxed); }
  /// Worker threads alive now.
  int live() const { return live_.load(std::memory_order_acquire); }
  /// How many live workers are in each Activity now (a racy snapshot, for
  /// progress reports).
  std::array<int, static_cast<size_t>(Activity::kCount)> activities() const;

 private:
  // A worker waits for a download (common/blocking.h): a parked worker may
  // take its turn meanwhile, so a tuner that parked every worker but one
  // never leaves a stream waiting on the network with nobody reading.
  void blocked() noexcept override;
  void unblocked() noexcept override;
  void ensure_running();  // with mu_
  void join_all();        // ends and joins the workers; with stop_mu_ or in the destructor
  void worker_loop(int id);

  const int threads_;
  const std::shared_ptr<LoaderStats> stats_;
  const std::chrono::milliseconds linger_;
  const int pid_;
  std::shared_ptr<detail::EventCount> signal_;
  detail::EventCount parked_;  // wakes workers beyond active_ (set_active, stop)
  std::atomic<int> active_;
  std::atomic<int> blocked_{0};  // workers waiting for downloads (they lend their turn)
  std::atomic<int> live_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> version_{0};  // bumped when streams_ changes
  // Per worker id: its Activity while it runs (common/activity.h); kCount when
  // the thread is not running.
  std::unique_ptr<std::atomic<uint8_t>[]> activity_;

  std::mutex mu_;  // streams_, workers_, running_; never held while running a unit
  std::vector<std::shared_ptr<Stream>> streams_;
  std::vector<std::thread> workers_;
  std::vector<bool> running_;  // per worker id: its thread has not decided to end
  std::mutex stop_mu_;         // serializes stop() callers
};

}  // namespace stoker
