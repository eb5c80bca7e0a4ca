// Settings that choose themselves, and what the loader says about where the
// time goes. The loader core (loader_core.h) measures, the functions here
// decide; nothing here reads a clock or touches a thread, so the decisions are
// tested on made-up measurements (tests/cpp/test_autotuner.cpp).
//
// NOTE [ Autotuning ]
// With num_threads=None the worker pool is created with every core this rank
// may use and the tuner moves how many of them take work (WorkerPool::
// set_active); with prefetch=None the ring gets its largest capacity and the
// tuner moves each stream's window, which the memory limit caps on its own
// (NOTE [ Window and memory ] in stream.h). The main iterator's next() ticks
// the tuner once at least kMinBatches batches and kMinSeconds have passed
// (no thread of its own); each tick sees one Interval of the loader's
// counters and steps:
//
//   the loop waits (stall > kStallHigh)  and workers saturated -> more workers
//                                        and workers idle (below
//                                        kTargetUtilization), queue ran dry
//                                                              -> larger window
//   the loop never waits (< kStallLow)   and workers idle      -> fewer workers
//                                        (to what the busy time needs at
//                                        kTargetUtilization)
//                                        and the queue never fell below d >= 2
//                                                              -> window - (d-1)
//
// A move needs the same proposal on two ticks in a row (one noisy interval
// moves nothing), and a move up sets a floor under it (the loop waited with
// less), so the tuner cannot oscillate. Three ticks
// without a move settle it: the core logs the settings and the reason once.
// A floor holds while the work per batch stays what it was when it was set:
// once a batch takes less than kCheaperWork of that worker time (a cached
// epoch after the one that decoded every image: Loader(cache="decoded")), the
// floors go and the tuner tunes again, down to what the cheaper batches need.
// Explicit settings are never moved. Batches are functions of (seed, epoch,
// batch) whatever the thread count or window, so tuning never changes data.
#pragma once

#include <cstdint>
#include <string>

namespace stoker {

/// What the loader measured over one stretch of the consumer's time.
struct TuneInterval {
  double wall = 0;     ///< seconds of the stretch
  double wait = 0;     ///< seconds the consumer waited in next()
  double handoff = 0;  ///< seconds in next() making the batch (LoaderStats::handoff_ns)
  double busy = 0;     ///< worker-seconds spent on units and planning
  double read = 0, decode = 0, ops = 0, plan = 0;  ///< worker-seconds per stage
  double python = 0;       ///< thread-seconds in the Python stage (user code)
  double python_cpu = 0;   ///< CPU seconds of those threads meanwhile (NOTE [ Python stage ])
  double python_wait = 0;  ///< seconds they were runnable but had no CPU
  double copy = 0;         ///< device time of the copies
  int64_t batches = 0;     ///< delivered
  int64_t copies = 0;
  int threads = 1;      ///< active workers
  int max_threads = 1;  ///< the most this rank may use
  int window = 1;       ///< prefetch window in force
  int max_window = 1;   ///< the most the ring and the memory limit allow
  int min_depth = 0;    ///< fewest batches ready when the consumer asked
  bool device = false;  ///< batches are copied to a device

  double stall() const;
  /// Busy share of the active workers' time.
  double utilization() const;
};

enum class Bottleneck { kUnknown, kConsumer, kLoader, kCopy };
const char* bottleneck_name(Bottleneck b);  ///< "unknown", "consumer", "loader", "copy"

/// Where the time goes, in one line.
struct Diagnosis {
  Bottleneck kind = Bottleneck::kUnknown;
  /// The stage to fix: "read", "decode", "ops", "plan", "python", "prefetch", "copy";
  /// empty when the loader is not the bottleneck.
  std::string stage;
  std::string text;
};

/// @param stall_threshold a stall above it makes the loader (or the copy) the bottleneck
Diagnosis diagnose(const TuneInterval& iv, double stall_threshold);

/// Whether the Python stage's threads took turns on the GIL: with two or more
/// threads, they spent more than kGilBlockedShare of their time in user code
/// neither on a CPU nor waiting for one (blocked: on the GIL, for pure-Python
/// code), and ran about one core's worth between them (0.6 to 1.5: threads
/// blocked on I/O or sleeps use far less). Threads starved of CPU by other
/// work wait runnable instead, which is not the GIL.
bool gil_bound(const TuneInterval& iv);
constexpr double kGilBlockedShare = 0.3;
/// A consumer-bound verdict names next()'s own time (TuneInterval::handoff) from this
/// share of the loop.
constexpr double kHandoffShown = 0.1;

class Autotuner {
 public:
  static constexpr double kStallHigh = 0.05;  ///< the loop waits: act
  static constexpr double kStallLow = 0.02;   ///< the loop (almost) never waits
  static constexpr double kSaturated = 0.80;  ///< worker utilization that counts as all busy
  static constexpr double kIdle = 0.50;       ///< below it workers are mostly idle
  static constexpr double kTargetUtilization = 0.70;
  static constexpr int kSettleTicks = 3;
  static constexpr int kMinWindow = 2;
  /// Work per batch below this share of what it was when a floor was set
  /// lifts the floors (NOTE [ Autotuning ]).
  static constexpr double kCheaperWork = 0.5;

  struct Config {
    bool tune_threads = false;
    bool tune_window = false;
    int max_threads = 1;
  };
  struct Step {
    int threads = 1;
    int window = 1;
    bool changed = false;
    bool settled = false;  ///< true at the one step where it settles
    std::string reason;    ///< why it moved (empty when it did not)
  };

  Autotuner(const Config& c, int threads, int window);

  /// One tick. `iv.threads` and `iv.window` are what was in force.
  Step step(const TuneInterval& iv);

  bool tuning() const { return cfg_.tune_threads || cfg_.tune_window; }
  bool settled() const { return settled_; }
  int threads() const { return threads_; }
  int window() const { return window_; }

 private:
  enum class Move { kNone, kUp, kDown };
  Config cfg_;
  int threads_, window_;
  int thread_floor_ = 1, window_floor_ = kMinWindow;
  double floor_work_ = 0;  // worker-seconds per batch when a floor was last raised
  Move thread_vote_ = Move::kNone, window_vote_ = Move::kNone;
  int quiet_ticks_ = 0;
  bool settled_ = false;
};

}  // namespace stoker
