#include "pipeline/worker_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/clock.h"
#include "common/error.h"
#include "common/stop_flag.h"

namespace stoker {

namespace {

using Clock = std::chrono::steady_clock;

void use_batch_scheduling() {  // NOTE [ Worker scheduling ]
#ifdef SCHED_BATCH
  sched_param sp{};
  sp.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
}

}  // namespace

WorkerPool::WorkerPool(int threads, std::shared_ptr<LoaderStats> stats,
                       std::chrono::milliseconds linger)
    : threads_(threads),
      stats_(std::move(stats)),
      linger_(linger),
      pid_(static_cast<int>(::getpid())),
      signal_(std::make_shared<detail::EventCount>()),
      active_(threads) {
  STOKER_CHECK(threads >= 1, UsageError, "num_threads must be >= 1, got ", threads);
  workers_.resize(static_cast<size_t>(threads));
  running_.assign(static_cast<size_t>(threads), false);
  activity_.reset(new std::atomic<uint8_t>[static_cast<size_t>(threads)]);
  for (int i = 0; i < threads; ++i)
    activity_[static_cast<size_t>(i)].store(static_cast<uint8_t>(Activity::kCount),
                                            std::memory_order_relaxed);
}

std::array<int, static_cast<size_t>(Activity::kCount)> WorkerPool::activities() const {
  std::array<int, static_cast<size_t>(Activity::kCount)> n{};
  for (int i = 0; i < threads_; ++i) {
    const uint8_t a = activity_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
    if (a < n.size()) ++n[a];
  }
  return n;
}

WorkerPool::~WorkerPool() {
  if (static_cast<int>(::getpid()) != pid_) {
    // Forked child: these threads do not exist here; joining would wait forever
    // and destroying a joinable std::thread would abort. Leave them be.
    for (auto& t : workers_)
      if (t.joinable()) new std::thread(std::move(t));
    return;
  }
  join_all();
}

void WorkerPool::add(std::shared_ptr<Stream> s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(std::move(s));
    version_.fetch_add(1, std::memory_order_acq_rel);
    ensure_running();
  }
  signal_->notify();
}

void WorkerPool::remove(const Stream* s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const std::shared_ptr<Stream>& p) { return p.get() == s; });
  if (it == streams_.end()) return;
  streams_.erase(it);
  version_.fetch_add(1, std::memory_order_acq_rel);
  // Parked workers re-read the list (and may end if it is empty).
  signal_->notify();
}

void WorkerPool::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!streams_.empty()) ensure_running();
  }
  signal_->notify();
}

void WorkerPool::ensure_running() {
  if (stop_.load(std::memory_order_acquire)) return;
  for (int i = 0; i < threads_; ++i) {
    if (running_[static_cast<size_t>(i)]) continue;
    std::thread& t = workers_[static_cast<size_t>(i)];
    if (t.joinable()) t.join();  // it decided to end and is on its way out
    running_[static_cast<size_t>(i)] = true;
    live_.fetch_add(1, std::memory_order_acq_rel);
    try {
      t = std::thread([this, i] { worker_loop(i); });
    } catch (...) {
      running_[static_cast<size_t>(i)] = false;
      live_.fetch_sub(1, std::memory_order_acq_rel);
      if (i == 0) throw;  // no worker at all
      return;             // fewer workers than asked: still correct
    }
  }
}

void WorkerPool::stop() {
  std::lock_guard<std::mutex> serial(stop_mu_);
  join_all();
  // A stream added while the workers were being joined found stop_ set and
  // started none; it would wait forever. Start them for it now.
  std::lock_guard<std::mutex> lock(mu_);
  const bool live = std::any_of(streams_.begin(), streams_.end(),
                                [](const std::shared_ptr<Stream>& s) { return !s->stopped(); });
  if (live) ensure_running();
}

void WorkerPool::join_all() {
  std::vector<std::thread> joining;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
    for (auto& t : workers_) joining.push_back(std::move(t));
    workers_.clear();
    workers_.resize(static_cast<size_t>(threads_));
  }
  signal_->notify();
  parked_.notify();
  for (auto& t : joining)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  running_.assign(static_cast<size_t>(threads_), false);
  stop_.store(false, std::memory_order_release);  // add() may start them again
}

void WorkerPool::set_active(int n) {
  active_.store(std::clamp(n, 1, threads_), std::memory_order_seq_cst);
  signal_->notify();
  parked_.notify();
}

void WorkerPool::worker_loop(int id) {
  use_batch_scheduling();  // before the name: a named worker is already SCHED_BATCH
  char name[16];
  std::snprintf(name, sizeof name, "stoker-worker-%d", id);
  pthread_setname_np(pthread_self(), name);

  std::atomic<uint8_t>& activity = activity_[static_cast<size_t>(id)];
  bind_activity(&activity);
  set_activity(Activity::kIdle);
  struct Unbind {  // on every way out of the loop
    std::atomic<uint8_t>& a;
    ~Unbind() {
      bind_activity(nullptr);
      a.store(static_cast<uint8_t>(Activity::kCount), std::memory_order_relaxed);
    }
  } unbind{activity};

  std::vector<std::shared_ptr<Stream>> streams;  // this worker's copy of streams_
  uint32_t version = ~0u;
  WorkerContext ctx;
  auto idle_since = Clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    const uint32_t seen = signal_->prepare();
    const uint32_t seen_parked = parked_.prepare();  // before reading active_
    if (version_.load(std::memory_order_acquire) != version) {
      std::lock_guard<std::mutex> lock(mu_);
      streams = streams_;
      version = version_.load(std::memory_order_acquire);
      if (streams.empty()) idle_since = Clock::now();  // the linger starts now
    }
    bool worked = false;
    const bool active = id < active_.load(std::memory_order_seq_cst);
    if (active) {
      for (const auto& s : streams) {  // the oldest stream first: usually the training loop's
        Stream::Unit u;
        const auto t0 = Clock::now();
        const ScopedStop stop(s->stop_flag());  // waits below give up when it stops
        if (!s->claim(u, ctx)) continue;
        s->run(u, ctx);
        stats_->add(ctx.times);
        ctx.times = StageTimes{};
        const auto t1 = Clock::now();
        stats_->worker_busy_ns.fetch_add(ns_between(t0, t1), std::memory_order_relaxed);
        worked = true;
        break;
      }
    }
    const auto now = Clock::now();
    if (worked) {
      idle_since = now;
      continue;
    }
    set_activity(Activity::kIdle);
    if (streams.empty() && now - idle_since >= linger_) {
      // Nothing open for a while: end, unless a stream arrived meanwhile.
      std::lock_guard<std::mutex> lock(mu_);
      if (streams_.empty()) {
        running_[static_cast<size_t>(id)] = false;
        live_.fetch_sub(1, std::memory_order_acq_rel);
        return;
      }
      continue;
    }
    if (!active) {
      // Parked by set_active() (NOTE [ Autotuning ] in autotuner.h): wakes for set_active()
      // and stop(), not at every batch.
      parked_.wait(seen_parked, now + linger_);
      continue;
    }
    signal_->wait(seen, now + linger_);
    if (!streams.empty())
      stats_->worker_idle_ns.fetch_add(ns_between(now, Clock::now()), std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace stoker
