#include "pipeline/loader_core.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <utility>

#include "common/activity.h"
#include "common/error.h"
#include "pipeline/autotuner.h"

namespace stoker {

namespace {

int64_t ns_between(LoaderCore::Clock::time_point a, LoaderCore::Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// At most this many batches in flight per stream: the ring's slots are
// allocated up front, and `prefetch` bounds memory (prefetch x batch bytes).
constexpr int kMaxPrefetch = 1024;

// NOTE [ Autotuning ]: the window an automatic prefetch starts with, and when
// the main iterator's next() ticks the tuner.
constexpr int kAutoInitialWindow = 4;
constexpr int64_t kTickBatches = 4;
constexpr auto kTickMin = std::chrono::milliseconds(250);
constexpr auto kTickSettled = std::chrono::seconds(1);
constexpr int kStallWarnTicks = 3;  // ticks after the first batch before a stall warning
constexpr int kDepthMax = 64;       // queue depth is counted up to this
// NOTE [ Slow first batch ]: reports after the first one.
constexpr auto kSlowReportEvery = std::chrono::seconds(10);

double seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

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

}  // namespace

// The tuner and the counters at the start of its interval (NOTE [ Autotuning ]).
struct LoaderCore::Tuning {
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

struct LoaderCore::Run {
  std::shared_ptr<Stream> stream;
  std::unique_ptr<BatchReader> reader;
  std::atomic<int64_t> delivered{0};  // positions handed to an iterator
  int64_t skip_to = -1;  // positions before this belong to an epoch left early (with mu_)

  int64_t start() const { return skip_to >= 0 ? skip_to : delivered.load(); }
};

// ---- the core ---------------------------------------------------------------------

std::shared_ptr<LoaderCore> LoaderCore::create(std::shared_ptr<const BatchProducer> producer,
                                               LoaderOptions opts) {
  return std::shared_ptr<LoaderCore>(new LoaderCore(std::move(producer), std::move(opts)));
}

LoaderCore::LoaderCore(std::shared_ptr<const BatchProducer> producer, LoaderOptions opts)
    : producer_(std::move(producer)),
      opts_(std::move(opts)),
      pid_(static_cast<int>(::getpid())),
      stats_(std::make_shared<LoaderStats>()) {
  STOKER_CHECK(producer_ != nullptr, UsageError, "LoaderCore: no producer");
  STOKER_CHECK(opts_.num_threads >= 1, UsageError, "num_threads must be >= 1, got ",
               opts_.num_threads);
  STOKER_CHECK(opts_.prefetch >= 1 && opts_.prefetch <= kMaxPrefetch, UsageError,
               "prefetch must be in [1, ", kMaxPrefetch, "] batches, got ", opts_.prefetch);
  STOKER_CHECK(opts_.stall_warning >= 0 && opts_.stall_warning <= 1, UsageError,
               "stall_warning must be in [0, 1], got ", opts_.stall_warning);
  const int window =
      opts_.auto_prefetch ? std::min(kAutoInitialWindow, opts_.prefetch) : opts_.prefetch;
  window_.store(window, std::memory_order_relaxed);
  auto alloc = opts_.host_allocator ? opts_.host_allocator : pageable_allocator();
  // Slots in flight are at most the window per stream; keep a few more idle for
  // the batches the consumer holds while the next ones are assembled.
  host_pool_ = BlockPool::create(std::move(alloc), nullptr, static_cast<size_t>(window) + 2);
  workers_ = std::make_unique<WorkerPool>(opts_.num_threads, stats_, opts_.linger);
  Autotuner::Config tc;
  tc.tune_threads = opts_.auto_threads;
  tc.tune_window = opts_.auto_prefetch;
  tc.max_threads = opts_.num_threads;
  tuning_ = std::make_unique<Tuning>(tc, opts_.num_threads, window);
}

LoaderCore::~LoaderCore() {
  if (forked()) {
    // The streams, copy threads and workers live in the parent: destroying
    // them here would join threads that do not exist. Leave them be.
    new std::vector<std::shared_ptr<Run>>(std::move(runs_));
    new std::shared_ptr<Run>(std::move(spec_));
    (void)workers_.release();
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& run : runs_) run->reader->stop();
  runs_.clear();
  spec_.reset();
}

bool LoaderCore::forked() const { return static_cast<int>(::getpid()) != pid_; }

int64_t LoaderCore::num_batches(int64_t rank, int64_t world_size) const {
  return producer_->num_batches(rank, world_size);
}

EpochKey LoaderCore::prospective_key(int64_t rank, int64_t world) const {
  if (resume_) {
    // At the world size that saved it, the rest is exactly what the
    // uninterrupted epoch would have given; at another, padding repeats only
    // samples the job has not consumed.
    const bool same_world = resume_->world_size == world || resume_->offset == 0;
    return EpochKey{resume_->epoch, rank, world, resume_->offset, same_world ? 0 : resume_->offset};
  }
  return EpochKey{pending_.value_or(next_epoch_), rank, world, 0, 0};
}

bool LoaderCore::run_starts(const Run& run, const EpochKey& key) const {
  if (run.stream->stopped()) return false;
  std::optional<EpochKey> k = run.stream->key_at(run.start());
  return k && *k == key;
}

std::shared_ptr<LoaderCore::Run> LoaderCore::new_run(const EpochKey& key) {
  auto run = std::make_shared<Run>();
  run->stream =
      std::make_shared<Stream>(producer_, host_pool_, workers_->signal(), stats_, opts_.prefetch,
                               window_.load(std::memory_order_relaxed), key, opts_.finisher);
  if (opts_.auto_prefetch && opts_.max_memory > 0)  // NOTE [ Window and memory ]
    run->stream->set_memory_limit(
        opts_.max_memory,
        static_cast<size_t>(stats_->max_batch_bytes.load(std::memory_order_relaxed)));
  if (opts_.delivery)
    run->reader = opts_.delivery->open(run->stream, stats_);
  else
    run->reader = std::make_unique<HostReader>(run->stream);
  runs_.push_back(run);
  workers_->add(run->stream);
  stats_->streams.fetch_add(1, std::memory_order_relaxed);
  return run;
}

void LoaderCore::stop_run(const std::shared_ptr<Run>& run) {
  if (!run) return;
  run->reader->stop();
  workers_->remove(run->stream.get());
  runs_.erase(std::remove(runs_.begin(), runs_.end(), run), runs_.end());
}

void LoaderCore::drop_spec() {
  stop_run(spec_);
  spec_.reset();
}

void LoaderCore::set_epoch(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (main_.live && !main_.finished && main_.key.epoch == epoch) {
    pending_.reset();  // the running epoch: the next iterator runs the one after
    next_epoch_ = epoch + 1;
  } else {
    pending_ = epoch;
    if (resume_ && resume_->epoch != epoch) resume_.reset();
    if (!main_.live || main_.finished) main_.claimed = false;  // the state moves on to `epoch`
  }
  // The epoch that flows on after the running one, or the one waiting.
  if (main_.live && !main_.finished && main_.owner && main_.owner->run_) {
    const EpochKey& k = main_.key;
    main_.owner->run_->stream->set_next(
        EpochKey{pending_.value_or(next_epoch_), k.rank, k.world_size, 0});
  }
  if (spec_) {
    std::optional<EpochKey> k = spec_->stream->key_at(spec_->start());
    if (!k || k->epoch != pending_.value_or(next_epoch_) || k->offset != 0) drop_spec();
  }
}

uint64_t LoaderCore::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resume_ ? resume_->epoch : pending_.value_or(next_epoch_);
}

std::shared_ptr<LoaderCore::Iterator> LoaderCore::iter(int64_t rank, int64_t world_size) {
  STOKER_CHECK(!forked(), UsageError,
               "this Loader was created in another process (before os.fork()); create a new "
               "Loader in this process");
  std::shared_ptr<Iterator> it(new Iterator(shared_from_this(), rank, world_size));
  std::lock_guard<std::mutex> lock(mu_);
  iterators_.erase(std::remove_if(iterators_.begin(), iterators_.end(),
                                  [](const std::weak_ptr<Iterator>& w) { return w.expired(); }),
                   iterators_.end());
  iterators_.push_back(it);
  // Start the epoch this iterator will most likely claim, so its first batch
  // is on its way before the first next() (NOTE [ Next-epoch prefetch ]).
  if (!(main_.live && !main_.finished)) {
    const EpochKey key = prospective_key(rank, world_size);
    if (!spec_ || !run_starts(*spec_, key)) {
      drop_spec();
      try {
        spec_ = new_run(key);
      } catch (...) {
        spec_.reset();  // only a head start: the claim plans it again and reports the error
      }
    }
  }
  return it;
}

void LoaderCore::claim(Iterator& it) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool concurrent = main_.live && !main_.finished && main_.owner != &it;
  EpochKey key;
  std::shared_ptr<Run> run;
  if (concurrent) {
    key = EpochKey{main_.key.epoch, it.rank_, it.world_, 0};
    run = new_run(key);
  } else {
    key = prospective_key(it.rank_, it.world_);
    if (spec_ && run_starts(*spec_, key)) {
      run = std::move(spec_);
    } else {
      drop_spec();
      run = new_run(key);
    }
  }
  std::optional<Segment> seg;
  try {
    seg = run->stream->segment_from(run->start());
    STOKER_CHECK(seg.has_value(), Error, "internal: the stream has no segment to read");
  } catch (...) {
    stop_run(run);
    throw;
  }
  if (!concurrent) {
    {
      // Between epochs the loop does something else: that time is not the
      // loop's time with the loader (order: mu_, then the tuner's).
      std::lock_guard<std::mutex> tl(tuning_->mu);
      const auto now = Clock::now();
      if (tuning_->warm && now > tuning_->last)
        tuning_->outside_ns += ns_between(tuning_->last, now);
    }
    pending_.reset();
    resume_.reset();
    next_epoch_ = key.epoch + 1;
    main_ = Main{&it, key, 0, false, true, true};
    if (opts_.prefetch_next_epoch && seg->batches > 0)
      run->stream->set_next(EpochKey{next_epoch_, it.rank_, it.world_, 0});
    workers_->wake();
  }
  it.started_ = Clock::now();
  it.next_report_ = it.opened_ + opts_.slow_first_batch;
  it.drain_ = run->skip_to >= 0 ? run->skip_to - run->delivered.load() : 0;
  run->skip_to = -1;
  it.key_ = key;
  it.batches_ = seg->batches;
  it.seg_end_ = seg->begin + seg->batches;
  it.run_ = std::move(run);
  it.main_ = !concurrent;
  it.claimed_ = true;
}

void LoaderCore::yielded(Iterator& it) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool last = it.yielded_ >= it.batches_;
  if (it.main_ && main_.owner == &it) {
    main_.yielded = it.yielded_;
    main_.finished = last;
  }
  if (!last) return;
  // The epoch is out: its stream flows on into the next epoch, held here for
  // the next iterator (NOTE [ Next-epoch prefetch ]), or stops.
  std::shared_ptr<Run> run = std::move(it.run_);
  if (it.main_ && opts_.prefetch_next_epoch && !run->stream->stopped() &&
      run->stream->key_at(run->delivered.load(std::memory_order_acquire))) {
    drop_spec();
    spec_ = std::move(run);
  } else {
    stop_run(run);
  }
}

void LoaderCore::count_run(Iterator& it) {
  // From the first next() to the one that ended the epoch (or to close()):
  // the loop's time with this iterator, its last step included.
  if (!it.claimed_ || it.counted_) return;
  stats_->run_ns.fetch_add(ns_between(it.started_, Clock::now()), std::memory_order_relaxed);
  it.counted_ = true;
}

void LoaderCore::end_run(Iterator& it) {
  std::lock_guard<std::mutex> lock(mu_);
  count_run(it);
}

void LoaderCore::release(Iterator& it, bool keep) {
  std::lock_guard<std::mutex> lock(mu_);
  count_run(it);
  if (it.run_ && !it.released_) {
    it.released_ = true;
    // Left early (break): when the workers already reached the next epoch, the
    // rest of this one is at most a window, so the stream is kept for the next
    // iterator, which drops those batches first (NOTE [ Next-epoch prefetch ]).
    std::shared_ptr<Run> run = it.run_;
    if (keep && it.main_ && main_.owner == &it && opts_.prefetch_next_epoch &&
        !run->stream->stopped() && run->stream->planned(it.seg_end_)) {
      drop_spec();
      run->skip_to = it.seg_end_;
      spec_ = run;
    } else {
      stop_run(run);
    }
  }
  if (main_.owner == &it) {
    main_.live = false;
    main_.owner = nullptr;
  }
}

LoaderState LoaderCore::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (resume_) return *resume_;
  if (main_.claimed && !main_.finished)
    return LoaderState{main_.key.epoch, producer_->consumed_after(main_.key, main_.yielded),
                       main_.key.world_size};
  return LoaderState{pending_.value_or(next_epoch_), 0, 0};
}

void LoaderCore::load_state(const LoaderState& s) {
  std::lock_guard<std::mutex> lock(mu_);
  STOKER_CHECK(s.offset >= 0 && s.offset <= producer_->epoch_samples(), UsageError,
               "cannot resume: position ", s.offset, " outside [0, ", producer_->epoch_samples(),
               "]");
  LoaderState r = s;
  if (r.offset == producer_->epoch_samples()) r = LoaderState{s.epoch + 1, 0, 0};
  resume_ = r;
  pending_.reset();
  next_epoch_ = r.epoch;
  main_ = Main{};
  if (spec_) {
    std::optional<EpochKey> k = spec_->stream->key_at(spec_->start());
    if (!k || k->epoch != r.epoch || k->offset != r.offset) drop_spec();
  }
}

void LoaderCore::close() {
  if (forked()) return;
  std::vector<std::shared_ptr<Iterator>> its;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop_spec();
    for (const auto& w : iterators_)
      if (auto it = w.lock()) its.push_back(std::move(it));
  }
  for (const auto& it : its) it->close();
  workers_->stop();
}

int LoaderCore::active_threads() const { return workers_->active(); }

LoaderStatsSnapshot LoaderCore::stats() const {
  LoaderStatsSnapshot s;
  const LoaderStats& st = *stats_;
  auto sec = [](const std::atomic<int64_t>& ns) {
    return static_cast<double>(ns.load(std::memory_order_relaxed)) * 1e-9;
  };
  s.batches = st.batches.load(std::memory_order_relaxed);
  s.samples = st.samples.load(std::memory_order_relaxed);
  s.bytes_read = st.bytes_read.load(std::memory_order_relaxed);
  s.skipped = st.skipped.load(std::memory_order_relaxed);
  s.read_seconds = sec(st.read_ns);
  s.decode_seconds = sec(st.decode_ns);
  s.ops_seconds = sec(st.ops_ns);
  s.plan_seconds = sec(st.plan_ns);
  s.python_seconds = sec(st.python_ns);
  s.python_cpu_seconds = sec(st.python_cpu_ns);
  s.python_wait_seconds = sec(st.python_wait_ns);
  s.worker_busy_seconds = sec(st.worker_busy_ns);
  s.worker_idle_seconds = sec(st.worker_idle_ns);
  s.wait_seconds = sec(st.wait_ns);
  s.run_seconds = sec(st.run_ns);
  const int64_t first = st.first_batch_ns.load(std::memory_order_relaxed);
  s.first_batch_seconds = first < 0 ? -1.0 : static_cast<double>(first) * 1e-9;
  const int64_t warmup = st.warmup_ns.load(std::memory_order_relaxed);
  s.warmup_seconds = warmup < 0 ? -1.0 : seconds(warmup);
  s.copies = st.copies.load(std::memory_order_relaxed);
  s.copy_bytes = st.copy_bytes.load(std::memory_order_relaxed);
  s.copy_seconds = sec(st.copy_ns);
  s.streams = st.streams.load(std::memory_order_relaxed);
  s.num_threads = workers_->active();
  s.prefetch = window_in_force();
  s.live_workers = workers_->live();
  s.max_threads = workers_->threads();
  s.auto_threads = opts_.auto_threads;
  s.auto_prefetch = opts_.auto_prefetch;
  s.max_memory = opts_.max_memory;
  s.batch_bytes = st.max_batch_bytes.load(std::memory_order_relaxed);
  int64_t depth_n = 0;
  for (const auto& b : st.depth_hist) {
    s.depth_hist.push_back(b.load(std::memory_order_relaxed));
    depth_n += s.depth_hist.back();
  }
  s.depth_mean = depth_n > 0 ? static_cast<double>(st.depth_sum.load(std::memory_order_relaxed)) /
                                   static_cast<double>(depth_n)
                             : 0.0;
  {
    std::lock_guard<std::mutex> tl(tuning_->mu);
    s.settled = tuning_->tuner.settled();
  }
  s.host_blocks = host_pool_->blocks();
  s.host_bytes = host_pool_->bytes();
  if (opts_.delivery) {
    s.device_buffers = opts_.delivery->buffers();
    s.device_bytes = opts_.delivery->buffer_bytes();
  }
  // Declared before the lock, so freed after it: an iterator whose last
  // reference this is must not be destroyed (and released) with mu_ held.
  std::vector<std::shared_ptr<Iterator>> alive;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& w : iterators_) {
    auto it = w.lock();
    if (!it) continue;
    alive.push_back(it);
    if (!it->claimed_ || it->counted_) continue;
    s.run_seconds += static_cast<double>(ns_between(it->started_, now)) * 1e-9;
    if (it->main_ && it->run_) s.queue_depth = it->run_->stream->ready_batches();
  }
  // Where the time went, the loader's first batch (its warm-up) left out.
  TuneInterval iv;
  const double warm_s = std::max(0.0, s.warmup_seconds);
  iv.wall = std::max(0.0, s.run_seconds - warm_s);
  iv.wait = std::max(0.0, s.wait_seconds - warm_s);
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

// ---- tuning and telemetry -----------------------------------------------------------

void LoaderCore::post(int level, std::string text) {
  std::lock_guard<std::mutex> lock(log_mu_);
  log_.push_back(LogMessage{level, std::move(text)});
  has_messages_.store(true, std::memory_order_release);
}

std::vector<LogMessage> LoaderCore::take_messages() {
  std::lock_guard<std::mutex> lock(log_mu_);
  has_messages_.store(false, std::memory_order_relaxed);
  return std::exchange(log_, {});
}

int LoaderCore::window_in_force() const {
  int w = window_.load(std::memory_order_relaxed);
  if (opts_.auto_prefetch && opts_.max_memory > 0) {
    const int64_t b = stats_->max_batch_bytes.load(std::memory_order_relaxed);
    if (b > 0)
      w = static_cast<int>(
          std::min<int64_t>(w, std::max<int64_t>(1, static_cast<int64_t>(opts_.max_memory) / b)));
  }
  return w;
}

void LoaderCore::apply_window(int window) {
  window_.store(window, std::memory_order_relaxed);
  host_pool_->set_max_idle(static_cast<size_t>(window) + 2);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& run : runs_) run->stream->set_window(window);
}

void LoaderCore::note_depth(int depth) {
  stats_->add_depth(depth);
  std::atomic<int>& m = tuning_->min_depth;
  int seen = m.load(std::memory_order_relaxed);
  while (depth < seen && !m.compare_exchange_weak(seen, depth, std::memory_order_relaxed)) {
  }
}

void LoaderCore::tick(Clock::time_point now) {
  Tuning& t = *tuning_;
  TuneInterval iv;
  Autotuner::Step step;
  bool warn = false;
  {
    std::unique_lock<std::mutex> lock(t.mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    if (!t.warm) {  // the first batch: its wait is the warm-up, not a stall
      t.warm = true;
      t.restart(*stats_, now);
      return;
    }
    ++t.batches;
    t.last = now;
    if (t.batches < kTickBatches ||
        now - t.since <
            (t.tuner.settled() ? Clock::duration(kTickSettled) : Clock::duration(kTickMin)))
      return;
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
    iv.threads = workers_->active();
    iv.max_threads = opts_.auto_threads ? workers_->threads() : iv.threads;
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
  if (step.changed) {
    if (opts_.auto_threads) workers_->set_active(step.threads);
    if (opts_.auto_prefetch && step.window != window_.load(std::memory_order_relaxed))
      apply_window(step.window);
    post(10, "stoker: autotuning: " + step.reason);
  }
  if (step.settled) {
    char head[256];
    std::string threads = opts_.auto_threads
                              ? "num_threads=" + std::to_string(step.threads) + " (of " +
                                    std::to_string(workers_->threads()) + " cores for this rank)"
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
  if (warn) {
    char head[160];
    std::snprintf(head, sizeof head,
                  "stoker: the training loop waited for data %.0f%% of the last %.1f s "
                  "(stall_warning=%.2g): ",
                  100.0 * iv.stall(), iv.wall, opts_.stall_warning);
    post(30, head + diagnose(iv, std::min(opts_.stall_warning, Autotuner::kStallHigh)).text);
  }
}

void LoaderCore::report_slow_first(const Iterator& it, Clock::time_point now) {
  const auto acts = workers_->activities();
  std::string doing;
  int working = 0;
  for (size_t a = 0; a < acts.size(); ++a) {
    if (acts[a] == 0 || a == static_cast<size_t>(Activity::kIdle)) continue;
    if (!doing.empty()) doing += ", ";
    doing += std::to_string(acts[a]) + " " + activity_name(static_cast<Activity>(a));
    working += acts[a];
  }
  std::string text = "stoker: the first batch";
  if (it.claimed_) text += " of epoch " + std::to_string(it.key_.epoch);
  char when[64];
  std::snprintf(when, sizeof when,
                " is %snot ready after %.1f s: ", it.reported_slow_ ? "still " : "",
                seconds(ns_between(it.opened_, now)));
  text += when;
  if (working == 0) {
    text += "no worker is busy (" + std::to_string(workers_->live()) + " of " +
            std::to_string(workers_->threads()) + " threads started)";
  } else {
    text += "workers " + doing + " (" + std::to_string(workers_->active()) + " threads)";
  }
  if (it.run_) {
    const Stream& stream = *it.run_->stream;
    const auto [done, units] = stream.progress(stream.read_position());
    if (units > 0)
      text +=
          "; " + std::to_string(done) + " of " + std::to_string(units) + " parts of the batch done";
    else
      text += "; the batch is not planned yet";
  }
  post(it.reported_slow_ ? 30 : 20, std::move(text));
}

// ---- iterators ----------------------------------------------------------------------

LoaderCore::Iterator::Iterator(std::shared_ptr<LoaderCore> core, int64_t rank, int64_t world)
    : core_(std::move(core)), rank_(rank), world_(world), opened_(Clock::now()) {}

LoaderCore::Iterator::~Iterator() {
  if (core_->forked()) {
    // The stream and its threads live in the parent: keep everything they
    // might wait on alive (never freed) rather than touch it.
    new std::shared_ptr<Run>(std::move(run_));
    return;
  }
  close();
}

void LoaderCore::Iterator::close() {
  if (core_->forked()) return;
  closed_.store(true, std::memory_order_release);
  // A next() in flight on another thread may still read from the stream: it
  // is stopped then, not kept for the next iterator (it would have two readers).
  std::unique_lock<detail::TimedMutex> lock(mu_, std::try_to_lock);
  core_->release(*this, lock.owns_lock());
}

LoaderCore::Iterator::Status LoaderCore::Iterator::next(DeliveredBatch& out,
                                                        Clock::time_point deadline,
                                                        uintptr_t consumer_stream) {
  STOKER_CHECK(!core_->forked(), UsageError,
               "this loader iterator was started in another process (before os.fork()); "
               "create a new Loader in this process");
  // Several threads on one iterator are served one at a time; a waiting one
  // returns at its deadline (to check for signals) and calls again.
  std::unique_lock<detail::TimedMutex> lock(mu_, deadline);
  if (!lock.owns_lock()) return Status::kTimeout;
  if (closed_.load(std::memory_order_acquire)) {
    if (run_) core_->release(*this);
    return Status::kEnd;
  }
  if (!claimed_) core_->claim(*this);
  if (yielded_ >= batches_) {
    core_->end_run(*this);
    return Status::kEnd;
  }
  LoaderStats& st = *core_->stats_;
  while (drain_ > 0) {  // the rest of an epoch left early, before this one (claim())
    DeliveredBatch dropped;
    const BatchReader::Status s = run_->reader->next(dropped, deadline, consumer_stream);
    if (s == BatchReader::Status::kTimeout) return Status::kTimeout;
    if (s == BatchReader::Status::kStopped) {
      closed_.store(true, std::memory_order_release);
      core_->release(*this);
      return Status::kEnd;
    }
    run_->delivered.fetch_add(1, std::memory_order_acq_rel);
    --drain_;
  }
  if (!asked_) {  // the queue the consumer finds, once per batch
    asked_ = true;
    if (main_) core_->note_depth(run_->reader->ready(kDepthMax));
  }
  const auto t0 = Clock::now();
  const BatchReader::Status s = run_->reader->next(out, deadline, consumer_stream);
  const auto t1 = Clock::now();
  st.wait_ns.fetch_add(ns_between(t0, t1), std::memory_order_relaxed);
  if (s == BatchReader::Status::kTimeout) {
    if (yielded_ == 0 && t1 >= next_report_) {  // NOTE [ Slow first batch ]
      core_->report_slow_first(*this, t1);
      reported_slow_ = true;
      next_report_ = t1 + kSlowReportEvery;
    }
    return Status::kTimeout;
  }
  if (s == BatchReader::Status::kStopped) {
    closed_.store(true, std::memory_order_release);
    core_->release(*this);
    return Status::kEnd;
  }
  run_->delivered.fetch_add(1, std::memory_order_acq_rel);
  if (out.error) {
    // An iterator ends at its first error; a new one starts cleanly.
    std::exception_ptr e = out.error;
    closed_.store(true, std::memory_order_release);
    core_->release(*this);
    std::rethrow_exception(e);
  }
  ++yielded_;
  asked_ = false;
  st.batches.fetch_add(1, std::memory_order_relaxed);
  st.samples.fetch_add(out.counters.samples, std::memory_order_relaxed);
  st.bytes_read.fetch_add(out.counters.bytes_read, std::memory_order_relaxed);
  st.skipped.fetch_add(out.counters.skipped, std::memory_order_relaxed);
  if (yielded_ == 1 && main_) {
    st.first_batch_ns.store(ns_between(opened_, t1), std::memory_order_relaxed);
    int64_t none = -1;
    st.warmup_ns.compare_exchange_strong(none, ns_between(started_, t1), std::memory_order_relaxed);
  }
  if (yielded_ == 1 && reported_slow_) {
    char text[96];
    std::snprintf(text, sizeof text, "stoker: the first batch of epoch %llu came after %.1f s",
                  static_cast<unsigned long long>(key_.epoch), seconds(ns_between(opened_, t1)));
    core_->post(20, text);
  }
  if (main_) core_->tick(t1);
  core_->yielded(*this);
  return Status::kBatch;
}

int64_t LoaderCore::Iterator::remaining() const {
  std::lock_guard<detail::TimedMutex> lock(mu_);
  if (claimed_) return batches_ - yielded_;
  EpochKey key;
  {
    std::lock_guard<std::mutex> core_lock(core_->mu_);
    key = core_->prospective_key(rank_, world_);
  }
  return core_->producer_->plan_epoch(key)->num_batches();
}

uint64_t LoaderCore::Iterator::epoch() const {
  std::lock_guard<detail::TimedMutex> lock(mu_);
  if (claimed_) return key_.epoch;
  std::lock_guard<std::mutex> core_lock(core_->mu_);
  return core_->prospective_key(rank_, world_).epoch;
}

int LoaderCore::Iterator::ready_batches() const {
  std::lock_guard<std::mutex> core_lock(core_->mu_);
  return run_ ? run_->stream->ready_batches() : 0;
}

}  // namespace stoker
