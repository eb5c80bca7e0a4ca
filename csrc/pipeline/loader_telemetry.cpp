#include "pipeline/loader_telemetry.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <utility>

#include "common/activity.h"
#include "common/error.h"
#include "pipeline/stream.h"

namespace stoker {

namespace {

// NOTE [ Autotuning ]: the window an automatic prefetch starts with, and when
// the main iterator's next() ticks the tuner.
constexpr int kAutoInitialWindow = 4;
constexpr int64_t kTickBatches = 4;
constexpr auto kTickMin = std::chrono::milliseconds(250);
constexpr auto kTickSettled = std::chrono::seconds(1);
constexpr int kStallWarnTicks = 3;  // ticks after the first batch before a stall warning

std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.3g GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3g MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.3g kB", b / 1e3);
  return buf;
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

}  // namespace

// The tuner and the counters at the start of its interval (NOTE [ Autotuning ]).
struct LoaderTelemetry::Tuning {
  Tuning(const Autotuner::Config& c, int threads, int window) : tuner(c, threads, window) {}

  std::mutex mu;
  Autotuner tuner;           // guarded by mu
  bool warm = false;         // guarded by mu: the loader's first batch is out
  int ticks = 0;             // guarded by mu: since warm
  bool warned = false;       // guarded by mu: the stall warning was posted
  Clock::time_point since;   // guarded by mu: start of the interval
  Clock::time_point last{};  // guarded by mu: the last main-iterator batch
  int64_t outside_ns = 0;    // guarded by mu: time in the interval with no epoch running
  int64_t batches = 0;       // guarded by mu: main-iterator batches in the interval
  int64_t wait_ns = 0, busy_ns = 0, read_ns = 0, decode_ns = 0, ops_ns = 0, plan_ns = 0,
          python_ns = 0, python_cpu_ns = 0, python_wait_ns = 0, copy_ns = 0,
          copies = 0;  // guarded by mu: the counters at `since`
  std::atomic<int> min_depth{INT_MAX};

  void restart(const LoaderStats& st, Clock::time_point now) {
    since = now;
    last = now;
    outside_ns = 0;
    batches = 0;
    wait_ns = st.wait_ns.load(std::memory_order_relaxed);
    busy_ns = st.worker_busy_ns.load(std::memory_order_relaxed);
    read_ns = st.read_ns.load(std::memory_order_relaxed);
    decode_ns = st.decode_ns.load(std::memory_order_relaxed);
    ops_ns = st.ops_ns.load(std::memory_order_relaxed);
    plan_ns = st.plan_ns.load(std::memory_order_relaxed);
    python_ns = st.python_ns.load(std::memory_order_relaxed);
    python_cpu_ns = st.python_cpu_ns.load(std::memory_order_relaxed);
    python_wait_ns = st.python_wait_ns.load(std::memory_order_relaxed);
    copy_ns = st.copy_ns.load(std::memory_order_relaxed);
    copies = st.copies.load(std::memory_order_relaxed);
    min_depth.store(INT_MAX, std::memory_order_relaxed);
  }
};

LoaderTelemetry::LoaderTelemetry(const LoaderOptions& opts, std::shared_ptr<LoaderStats> stats,
                                 WorkerPool& workers)
    : opts_(opts),
      stats_(std::move(stats)),
      workers_(workers),
      window_(opts.auto_prefetch ? std::min(kAutoInitialWindow, opts.prefetch) : opts.prefetch) {
  STOKER_CHECK(opts_.stall_warning >= 0 && opts_.stall_warning <= 1, UsageError,
               "stall_warning must be in [0, 1], got ", opts_.stall_warning);
  Autotuner::Config tc;
  tc.tune_threads = opts_.auto_threads;
  tc.tune_window = opts_.auto_prefetch;
  tc.max_threads = opts_.num_threads;
  tuning_ = std::make_unique<Tuning>(tc, opts_.num_threads, window());
}

LoaderTelemetry::~LoaderTelemetry() = default;

int LoaderTelemetry::window_in_force() const {
  int w = window();
  if (opts_.auto_prefetch && opts_.max_memory > 0) {
    const int64_t b = stats_->max_batch_bytes.load(std::memory_order_relaxed);
    if (b > 0)
      w = static_cast<int>(
          std::min<int64_t>(w, std::max<int64_t>(1, static_cast<int64_t>(opts_.max_memory) / b)));
  }
  return w;
}

// ---- the tuner ------------------------------------------------------------------------

void LoaderTelemetry::note_depth(int depth) {
  stats_->add_depth(depth);
  std::atomic<int>& m = tuning_->min_depth;
  int seen = m.load(std::memory_order_relaxed);
  while (depth < seen && !m.compare_exchange_weak(seen, depth, std::memory_order_relaxed)) {
  }
}

void LoaderTelemetry::note_between_epochs(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(tuning_->mu);
  if (tuning_->warm && now > tuning_->last) tuning_->outside_ns += ns_between(tuning_->last, now);
}

std::optional<int> LoaderTelemetry::tick(Clock::time_point now) {
  Tuning& t = *tuning_;
  TuneInterval iv;
  Autotuner::Step step;
  bool warn = false;
  {
    std::unique_lock<std::mutex> lock(t.mu, std::try_to_lock);
    if (!lock.owns_lock()) return std::nullopt;
    if (!t.warm) {  // the first batch: its wait is the warm-up, not a stall
      t.warm = true;
      t.restart(*stats_, now);
      return std::nullopt;
    }
    ++t.batches;
    t.last = now;
    if (t.batches < kTickBatches ||
        now - t.since <
            (t.tuner.settled() ? Clock::duration(kTickSettled) : Clock::duration(kTickMin)))
      return std::nullopt;
    const LoaderStats& st = *stats_;
    auto delta = [](const std::atomic<int64_t>& c, int64_t base) {
      return seconds(c.load(std::memory_order_relaxed) - base);
    };
    iv.wall = seconds(std::max<int64_t>(1, ns_between(t.since, now) - t.outside_ns));
    iv.wait = delta(st.wait_ns, t.wait_ns);
    iv.busy = delta(st.worker_busy_ns, t.busy_ns);
    iv.read = delta(st.read_ns, t.read_ns);
    iv.decode = delta(st.decode_ns, t.decode_ns);
    iv.ops = delta(st.ops_ns, t.ops_ns);
    iv.plan = delta(st.plan_ns, t.plan_ns);
    iv.python = delta(st.python_ns, t.python_ns);
    iv.python_cpu = delta(st.python_cpu_ns, t.python_cpu_ns);
    iv.python_wait = delta(st.python_wait_ns, t.python_wait_ns);
    iv.copy = delta(st.copy_ns, t.copy_ns);
    iv.copies = st.copies.load(std::memory_order_relaxed) - t.copies;
    iv.batches = t.batches;
    iv.threads = workers_.active();
    iv.max_threads = opts_.auto_threads ? workers_.threads() : iv.threads;
    iv.window = window_in_force();
    iv.max_window = iv.window;
    if (opts_.auto_prefetch) {
      iv.max_window = opts_.prefetch;
      const int64_t b = st.max_batch_bytes.load(std::memory_order_relaxed);
      if (opts_.max_memory > 0 && b > 0)
        iv.max_window = static_cast<int>(std::min<int64_t>(
            iv.max_window, std::max<int64_t>(1, static_cast<int64_t>(opts_.max_memory) / b)));
    }
    const int md = t.min_depth.load(std::memory_order_relaxed);
    iv.min_depth = md == INT_MAX ? 0 : md;
    iv.device = opts_.delivery != nullptr;
    t.restart(st, now);
    ++t.ticks;
    step = t.tuner.step(iv);
    if (opts_.stall_warning > 0 && !t.warned && t.ticks >= kStallWarnTicks &&
        (t.tuner.settled() || !t.tuner.tuning()) && iv.stall() > opts_.stall_warning) {
      t.warned = true;
      warn = true;
    }
  }
  std::optional<int> new_window;
  if (step.changed) {
    if (opts_.auto_threads) workers_.set_active(step.threads);
    if (opts_.auto_prefetch && step.window != window()) new_window = step.window;
    post(10, "stoker: autotuning: " + step.reason);
  }
  if (step.settled) settle_message(step, iv);
  if (warn) {
    char head[160];
    std::snprintf(head, sizeof head,
                  "stoker: the training loop waited for data %.0f%% of the last %.1f s "
                  "(stall_warning=%.2g): ",
                  100.0 * iv.stall(), iv.wall, opts_.stall_warning);
    post(30, head + diagnose(iv, std::min(opts_.stall_warning, Autotuner::kStallHigh)).text);
  }
  return new_window;
}

void LoaderTelemetry::settle_message(const Autotuner::Step& step, const TuneInterval& iv) {
  char head[256];
  std::string threads = opts_.auto_threads
                            ? "num_threads=" + std::to_string(step.threads) + " (of " +
                                  std::to_string(workers_.threads()) + " cores for this rank)"
                            : "num_threads=" + std::to_string(iv.threads) + " (as given)";
  std::string prefetch;
  if (opts_.auto_prefetch) {
    prefetch = "prefetch=" + std::to_string(std::min(step.window, iv.max_window));
    const int64_t b = stats_->max_batch_bytes.load(std::memory_order_relaxed);
    if (opts_.max_memory > 0 && b > 0)
      prefetch += " (max_memory=" + format_bytes(static_cast<double>(opts_.max_memory)) +
                  " holds " + std::to_string(opts_.max_memory / static_cast<size_t>(b)) +
                  " batches of " + format_bytes(static_cast<double>(b)) + ")";
  } else {
    prefetch = "prefetch=" + std::to_string(iv.window) + " (as given)";
  }
  std::snprintf(head, sizeof head, "stoker: autotuning settled on %s, %s: ", threads.c_str(),
                prefetch.c_str());
  post(20, head + diagnose(iv, Autotuner::kStallHigh).text);
}

// ---- NOTE [ Slow first batch ] ----------------------------------------------------------

void LoaderTelemetry::report_slow_first(std::optional<uint64_t> epoch, double waited_s, bool again,
                                        const Stream* stream) {
  const auto acts = workers_.activities();
  std::string doing;
  int working = 0;
  for (size_t a = 0; a < acts.size(); ++a) {
    if (acts[a] == 0 || a == static_cast<size_t>(Activity::kIdle)) continue;
    if (!doing.empty()) doing += ", ";
    doing += std::to_string(acts[a]) + " " + activity_name(static_cast<Activity>(a));
    working += acts[a];
  }
  std::string text = "stoker: the first batch";
  if (epoch) text += " of epoch " + std::to_string(*epoch);
  char when[64];
  std::snprintf(when, sizeof when, " is %snot ready after %.1f s: ", again ? "still " : "",
                waited_s);
  text += when;
  if (working == 0) {
    text += "no worker is busy (" + std::to_string(workers_.live()) + " of " +
            std::to_string(workers_.threads()) + " threads started)";
  } else {
    text += "workers " + doing + " (" + std::to_string(workers_.active()) + " threads)";
  }
  if (stream) {
    const auto [done, units] = stream->progress(stream->read_position());
    if (units > 0)
      text +=
          "; " + std::to_string(done) + " of " + std::to_string(units) + " parts of the batch done";
    else
      text += "; the batch is not planned yet";
  }
  post(again ? 30 : 20, std::move(text));
}

void LoaderTelemetry::report_first_batch(uint64_t epoch, double waited_s) {
  char text[96];
  std::snprintf(text, sizeof text, "stoker: the first batch of epoch %llu came after %.1f s",
                static_cast<unsigned long long>(epoch), waited_s);
  post(20, text);
}

// ---- the snapshot -------------------------------------------------------------------------

LoaderStatsSnapshot LoaderTelemetry::snapshot(const Live& live) const {
  LoaderStatsSnapshot s;
  const LoaderStats& st = *stats_;
  auto sec = [](const std::atomic<int64_t>& ns) {
    return seconds(ns.load(std::memory_order_relaxed));
  };
  auto optional_sec = [](const std::atomic<int64_t>& ns) {  // -1: not yet
    const int64_t v = ns.load(std::memory_order_relaxed);
    return v < 0 ? -1.0 : seconds(v);
  };
  s.batches = st.batches.load(std::memory_order_relaxed);
  s.samples = st.samples.load(std::memory_order_relaxed);
  s.bytes_read = st.bytes_read.load(std::memory_order_relaxed);
  s.skipped = st.skipped.load(std::memory_order_relaxed);
  s.sources = st.sources();
  s.read_seconds = sec(st.read_ns);
  s.decode_seconds = sec(st.decode_ns);
  s.ops_seconds = sec(st.ops_ns);
  s.plan_seconds = sec(st.plan_ns);
  s.python_seconds = sec(st.python_ns);
  s.python_cpu_seconds = sec(st.python_cpu_ns);
  s.python_wait_seconds = sec(st.python_wait_ns);
  s.worker_busy_seconds = sec(st.worker_busy_ns);
  s.worker_idle_seconds = sec(st.worker_idle_ns);
  s.wait_seconds = sec(st.wait_ns) + sec(st.handoff_ns);
  s.run_seconds = sec(st.run_ns) + live.run_seconds;
  s.first_batch_seconds = optional_sec(st.first_batch_ns);
  s.warmup_seconds = optional_sec(st.warmup_ns);
  s.copies = st.copies.load(std::memory_order_relaxed);
  s.copy_bytes = st.copy_bytes.load(std::memory_order_relaxed);
  s.copy_seconds = sec(st.copy_ns);
  s.streams = st.streams.load(std::memory_order_relaxed);
  s.num_threads = workers_.active();
  s.prefetch = window_in_force();
  s.live_workers = workers_.live();
  s.max_threads = workers_.threads();
  s.auto_threads = opts_.auto_threads;
  s.auto_prefetch = opts_.auto_prefetch;
  s.max_memory = opts_.max_memory;
  s.batch_bytes = st.max_batch_bytes.load(std::memory_order_relaxed);
  int64_t depth_n = 0;
  for (const auto& b : st.depth_hist) {
    s.depth_hist.push_back(b.load(std::memory_order_relaxed));
    depth_n += s.depth_hist.back();
  }
  s.depth_mean = ratio(static_cast<double>(st.depth_sum.load(std::memory_order_relaxed)),
                       static_cast<double>(depth_n));
  {
    std::lock_guard<std::mutex> tl(tuning_->mu);
    s.settled = tuning_->tuner.settled();
  }
  s.queue_depth = live.queue_depth;
  s.host_blocks = live.host_blocks;
  s.host_bytes = live.host_bytes;
  s.device_buffers = live.device_buffers;
  s.device_bytes = live.device_bytes;

  s.samples_per_second = ratio(static_cast<double>(s.samples), s.run_seconds);
  s.data_stall = std::min(1.0, ratio(s.wait_seconds, s.run_seconds));
  s.copy_gbps = ratio(static_cast<double>(s.copy_bytes), s.copy_seconds) * 1e-9;
  const double n = static_cast<double>(s.batches);
  s.stage_seconds_per_batch = {ratio(s.read_seconds, n),
                               ratio(s.decode_seconds, n),
                               ratio(s.ops_seconds, n),
                               ratio(s.plan_seconds, n),
                               ratio(s.copy_seconds, static_cast<double>(s.copies)),
                               ratio(s.python_seconds, n)};

  // Where the time went, the loader's first batch (its warm-up) left out.
  TuneInterval iv;
  const double warm_s = std::max(0.0, s.warmup_seconds);
  iv.wall = std::max(0.0, s.run_seconds - warm_s);
  iv.wait = std::max(0.0, sec(st.wait_ns) - warm_s);  // waiting for workers only
  iv.handoff = sec(st.handoff_ns);
  iv.busy = s.worker_busy_seconds;
  iv.read = s.read_seconds;
  iv.decode = s.decode_seconds;
  iv.ops = s.ops_seconds;
  iv.plan = s.plan_seconds;
  iv.python = s.python_seconds;
  iv.python_cpu = s.python_cpu_seconds;
  iv.python_wait = s.python_wait_seconds;
  iv.copy = s.copy_seconds;
  iv.batches = s.batches > 1 ? s.batches - 1 : 0;
  iv.copies = s.copies;
  iv.threads = s.num_threads;
  iv.max_threads = opts_.auto_threads ? s.max_threads : s.num_threads;
  iv.window = s.prefetch;
  iv.max_window = s.prefetch;
  iv.device = opts_.delivery != nullptr;
  const Diagnosis d = diagnose(iv, Autotuner::kStallHigh);
  s.bottleneck = bottleneck_name(d.kind);
  s.bottleneck_stage = d.stage;
  s.verdict = d.text;
  return s;
}

// ---- log lines ------------------------------------------------------------------------------

void LoaderTelemetry::post(int level, std::string text) {
  std::lock_guard<std::mutex> lock(log_mu_);
  log_.push_back(LogMessage{level, std::move(text)});
  has_messages_.store(true, std::memory_order_release);
}

std::vector<LogMessage> LoaderTelemetry::take_messages() {
  std::lock_guard<std::mutex> lock(log_mu_);
  has_messages_.store(false, std::memory_order_relaxed);
  return std::exchange(log_, {});
}

}  // namespace stoker
