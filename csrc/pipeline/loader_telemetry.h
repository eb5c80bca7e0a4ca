// What a loader says about itself: the stats snapshot with the numbers
// derived from it (throughput, stall, time per batch, copy bandwidth), the
// verdict on where the time goes, the tuner's tick (NOTE [ Autotuning ] in
// autotuner.h) and the log lines for the "stoker" logger. The loader core
// (loader_core.h) runs epochs and iterators and calls in here at its events;
// everything Python reports is computed here, where the C++ tests reach it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "pipeline/autotuner.h"
#include "pipeline/loader_options.h"
#include "pipeline/loader_stats.h"
#include "pipeline/worker_pool.h"

namespace stoker {

/// A line for the "stoker" Python logger (the bindings emit them).
struct LogMessage {
  int level = 20;  ///< Python's logging levels: 10 DEBUG, 20 INFO, 30 WARNING
  std::string text;
};

/// Seconds per delivered batch of each stage (summed over threads), and of the
/// device copy per copy.
struct StageSecondsPerBatch {
  double read = 0, decode = 0, ops = 0, plan = 0, copy = 0;
  double python = 0;  ///< the Python stage (user code; NOTE [ Python stage ])
};

struct LoaderStatsSnapshot {
  int64_t batches = 0, samples = 0, bytes_read = 0, skipped = 0;
  std::vector<int64_t> sources;  ///< a mixture's: per source, rows then real tokens
  double read_seconds = 0, decode_seconds = 0, ops_seconds = 0, plan_seconds = 0;
  double python_seconds = 0, python_cpu_seconds = 0, python_wait_seconds = 0;  ///< Python stage
  double worker_busy_seconds = 0, worker_idle_seconds = 0;
  double wait_seconds = 0, run_seconds = 0, first_batch_seconds = -1;
  double warmup_seconds = -1;  ///< the loader's first batch, from its first next()
  int64_t copies = 0, copy_bytes = 0;
  double copy_seconds = 0;
  int num_threads = 0, prefetch = 0, live_workers = 0, queue_depth = 0;
  int64_t streams = 0;
  size_t host_blocks = 0, host_bytes = 0, device_buffers = 0, device_bytes = 0;
  // Tuning (NOTE [ Autotuning ]).
  int max_threads = 0;
  bool auto_threads = false, auto_prefetch = false, settled = false;
  size_t max_memory = 0;
  int64_t batch_bytes = 0;  ///< the largest batch planned
  // Batches ready when the main iterator asked: counts of 0, 1, ..., and the
  // last bucket for that many or more; and the mean.
  std::vector<int64_t> depth_hist;
  double depth_mean = 0;
  // Derived: samples / run_seconds; wait_seconds / run_seconds (at most 1);
  // copy_bytes / copy_seconds in GB/s; stage times per batch.
  double samples_per_second = 0, data_stall = 0, copy_gbps = 0;
  StageSecondsPerBatch stage_seconds_per_batch;
  // Where the time went since the loader was made (diagnose()).
  std::string bottleneck, bottleneck_stage, verdict;
};

class LoaderTelemetry {
 public:
  using Clock = SteadyClock;

  /// Batches ready are counted up to this many (the queue depth the main
  /// iterator finds).
  static constexpr int kDepthMax = 64;

  /// @param workers the loader's pool: the tuner sets how many take work
  LoaderTelemetry(const LoaderOptions& opts, std::shared_ptr<LoaderStats> stats,
                  WorkerPool& workers);
  ~LoaderTelemetry();
  LoaderTelemetry(const LoaderTelemetry&) = delete;
  LoaderTelemetry& operator=(const LoaderTelemetry&) = delete;

  const std::shared_ptr<LoaderStats>& counters() const { return stats_; }

  /// The window the tuner set (the explicit prefetch when it is not tuned).
  int window() const { return window_.load(std::memory_order_relaxed); }
  void set_window(int window) { window_.store(window, std::memory_order_relaxed); }
  /// The window in force: window(), cut by the memory limit (NOTE [ Window and
  /// memory ] in stream.h) once a batch size is known.
  int window_in_force() const;

  // -- events of the main iterator (NOTE [ Autotuning ]) ----------------------

  /// Batches ready when it asked for one.
  void note_depth(int depth);
  /// It got a batch at `now`. @return the window to apply when the tuner moved
  /// it (the core applies it to its streams and pool).
  std::optional<int> tick(Clock::time_point now);
  /// It claimed an epoch at `now`: the time since its last batch was spent
  /// between epochs, outside the loop's time with the loader.
  void note_between_epochs(Clock::time_point now);

  // -- NOTE [ Slow first batch ] in loader_core.h -----------------------------

  /// The first batch of an iterator is not ready after `waited_s`.
  /// @param epoch the iterator's epoch, once claimed
  /// @param again whether this was reported before
  /// @param stream where it is assembled, once claimed
  void report_slow_first(std::optional<uint64_t> epoch, double waited_s, bool again,
                         const Stream* stream);
  /// The first batch of `epoch`, reported slow, came after `waited_s`.
  void report_first_batch(uint64_t epoch, double waited_s);

  // -- the snapshot -----------------------------------------------------------

  /// What only the core knows: its open iterators and its memory.
  struct Live {
    double run_seconds = 0;  ///< of iterators still running (closed ones are counted)
    int queue_depth = 0;     ///< batches ready for the main iterator now
    size_t host_blocks = 0, host_bytes = 0, device_buffers = 0, device_bytes = 0;
  };
  LoaderStatsSnapshot snapshot(const Live& live) const;

  // -- log lines ---------------------------------------------------------------

  void post(int level, std::string text);
  /// Lines posted since the last call, oldest first. Any thread.
  std::vector<LogMessage> take_messages();
  bool has_messages() const { return has_messages_.load(std::memory_order_acquire); }

 private:
  struct Tuning;  // the tuner and its last reading of the counters (loader_telemetry.cpp)
  void settle_message(const Autotuner::Step& step, const TuneInterval& iv);

  const LoaderOptions opts_;  // the knobs only: no allocator or delivery is used here
  const std::shared_ptr<LoaderStats> stats_;
  WorkerPool& workers_;
  std::atomic<int> window_;
  std::unique_ptr<Tuning> tuning_;

  std::mutex log_mu_;
  std::vector<LogMessage> log_;  // guarded by log_mu_
  std::atomic<bool> has_messages_{false};
};

}  // namespace stoker
