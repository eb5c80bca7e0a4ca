#include "pipeline/stream.h"

#include <algorithm>

#include "common/activity.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/file_checks.h"

namespace stoker {

namespace {

uint64_t pack_units(int64_t pos, int next, int count) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) |
         (static_cast<uint64_t>(next) << 16) | static_cast<uint64_t>(count);
}
uint32_t units_pos(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
int units_next(uint64_t w) { return static_cast<int>((w >> 16) & 0xFFFF); }
int units_count(uint64_t w) { return static_cast<int>(w & 0xFFFF); }

std::atomic<uint64_t> g_stream_ids{0};

}  // namespace

Stream::Stream(std::shared_ptr<const BatchProducer> producer, std::shared_ptr<BlockPool> pool,
               std::shared_ptr<detail::EventCount> work_signal, std::shared_ptr<LoaderStats> stats,
               int capacity, int window, const EpochKey& first,
               std::shared_ptr<BatchFinisher> finisher)
    : producer_(std::move(producer)),
      pool_(std::move(pool)),
      signal_(std::move(work_signal)),
      stats_(std::move(stats)),
      finisher_(std::move(finisher)),
      id_(g_stream_ids.fetch_add(1, std::memory_order_relaxed) + 1),
      ring_(static_cast<size_t>(std::max(1, capacity))),
      window_(std::clamp(window, 1, std::max(1, capacity))) {
  const int64_t n = static_cast<int64_t>(ring_.capacity());
  for (int64_t i = 0; i < n; ++i)  // a unit word that names no position yet
    ring_.at(i).units.store(pack_units(i - n, 0, 0), std::memory_order_relaxed);
  Segment s;
  s.key = first;
  s.plan = producer_->plan_epoch(first);
  s.batches = s.plan->num_batches();
  segments_.push_back(s);
  limit_.store(s.batches, std::memory_order_release);
}

Stream::~Stream() { stop(); }

void Stream::stop() {
  if (stop_.exchange(true, std::memory_order_acq_rel)) return;
  ring_.close();
  signal_->notify();
}

void Stream::set_window(int window) {
  window_.store(std::clamp(window, 1, capacity()), std::memory_order_relaxed);
  signal_->notify();
}

void Stream::set_memory_limit(size_t bytes, size_t batch_bytes) {
  memory_limit_.store(bytes, std::memory_order_relaxed);
  note_bytes(batch_bytes);
  signal_->notify();
}

void Stream::note_bytes(size_t bytes) {
  if (bytes > 0) stats_->note_batch_bytes(static_cast<int64_t>(bytes));
  size_t seen = max_bytes_.load(std::memory_order_relaxed);
  while (bytes > seen &&
         !max_bytes_.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
  }
  const size_t largest = std::max(seen, bytes);
  const size_t limit = memory_limit_.load(std::memory_order_relaxed);
  int w = INT_MAX;
  if (limit > 0 && largest > 0)
    w = static_cast<int>(std::clamp<size_t>(limit / largest, 1, static_cast<size_t>(INT_MAX)));
  mem_window_.store(w, std::memory_order_relaxed);
}

// ---- workers ------------------------------------------------------------------

bool Stream::claim(Unit& out, WorkerContext& ctx) {
  (void)ctx;
  int64_t p = claim_pos_.load(std::memory_order_acquire);
  while (!stop_.load(std::memory_order_relaxed)) {
    if (p >= limit_.load(std::memory_order_acquire) && !extend(p)) return false;
    if (p >= consumed_.load(std::memory_order_acquire) + window())
      return false;  // the window is full: the reader has to take a batch first
    Job& job = ring_.at(p);
    if (ring_.try_claim(p)) plan(p, job);
    uint64_t w = job.units.load(std::memory_order_acquire);
    if (units_pos(w) != static_cast<uint32_t>(p)) {
      ++p;  // another worker is planning p: look further
      continue;
    }
    if (units_next(w) < units_count(w)) {
      if (job.units.compare_exchange_weak(w, w + (1u << 16), std::memory_order_acq_rel,
                                          std::memory_order_relaxed)) {
        out = Unit{p, units_next(w)};
        return true;
      }
      continue;  // lost the race for that unit: try p again
    }
    int64_t expect = p;  // every unit of p is taken: move the frontier past it
    claim_pos_.compare_exchange_strong(expect, p + 1, std::memory_order_acq_rel);
    ++p;
  }
  return false;
}

void Stream::plan(int64_t pos, Job& job) {
  set_activity(Activity::kPlanning);
  const auto t0 = Clock::now();
  job.done.store(0, std::memory_order_relaxed);
  job.cut_short.store(false, std::memory_order_relaxed);
  job.error = nullptr;
  job.error_unit = INT_MAX;
  job.ticket = 0;
  job.end = false;
  int count = 0;
  try {
    std::optional<Segment> seg = segment_at(pos);
    STOKER_CHECK(seg.has_value(), Error, "internal: no segment for batch position ", pos);
    job.index = pos - seg->begin;
    file_check_tick();  // shards are checked against their files once a second at least
    job.work = producer_->plan_batch(*seg->plan, job.index);
    job.work->key = seg->key;
    job.work->index = job.index;
    count = std::clamp(job.work->units, 1, 0xFFFF);
    STOKER_CHECK(!job.work->handoff || finisher_, Error,
                 "internal: a batch to hand off on a stream without a finisher");
    note_bytes(job.work->bytes);  // NOTE [ Window and memory ]
    // A batch handed off with nothing to write before takes its memory then.
    if (!(job.work->handoff && job.work->bytes == 0))
      job.memory = BlockPool::Lease::bytes(pool_->lease(job.work->bytes));
  } catch (...) {
    job.error = std::current_exception();
    count = 0;
  }
  stats_->plan_ns.fetch_add(ns_since(t0), std::memory_order_relaxed);
  job.units.store(pack_units(pos, 0, count), std::memory_order_release);
  if (count == 0) {
    job.passed.store(pos, std::memory_order_release);
    if (finisher_) finisher_->passed();  // NOTE [ Hand-off order ]
    ring_.publish(pos);                  // the error is the batch
  } else if (count > 1) {
    signal_->notify();  // parked workers can help with this batch
  }
}

void Stream::run(const Unit& u, WorkerContext& ctx) {
  Job& job = ring_.at(u.pos);
  ctx.stop = &stop_;
  set_activity(Activity::kReading);  // the producer refines it
  try {
    job.work->run(u.index, job.memory.get(), ctx);
    if (ctx.stopped()) job.cut_short.store(true, std::memory_order_relaxed);
  } catch (...) {
    std::lock_guard<std::mutex> lock(job.error_mu);
    if (u.index < job.error_unit) {  // the lowest unit's error, whatever the timing
      job.error_unit = u.index;
      job.error = std::current_exception();
    }
  }
  finish(u.pos, job, ctx);
}

// A handed-off batch (batch_handoff.h). It names its position in a stream it
// holds weakly; until it completes, nobody else touches that job (the slot is
// claimed, so it is neither read nor reused).
class Stream::Handle final : public HandedOffBatch {
 public:
  Handle(Stream& stream, int64_t pos, Job& job)
      : stream_(stream.weak_from_this()),
        pos_(pos),
        job_(job),
        work_(*job.work),
        stream_id_(stream.id()) {}
  ~Handle() override {
    // A finisher that dropped its batch unfinished would leave the reader
    // waiting forever: the batch fails instead.
    if (!done_.load(std::memory_order_acquire)) {
      // (the temporary gone before fail() publishes: PythonTask::fail says why)
      std::exception_ptr error = std::make_exception_ptr(
          Error("internal: a batch handed off to the Python stage was dropped unfinished"));
      fail(std::move(error));
    }
  }

  const BatchWork& work() const override { return work_; }
  std::shared_ptr<uint8_t> memory() const override { return job_.memory; }
  bool stopped() const override {
    std::shared_ptr<Stream> s = stream_.lock();
    return !s || s->stopped();
  }
  std::shared_ptr<uint8_t> allocate(size_t bytes) override {
    std::shared_ptr<Stream> s = stream_.lock();
    STOKER_CHECK(s != nullptr, UsageError, "the loader's stream of this batch is gone");
    s->note_bytes(bytes);  // NOTE [ Window and memory ]
    std::shared_ptr<uint8_t> m = BlockPool::Lease::bytes(s->pool_->lease(bytes));
    std::lock_guard<std::mutex> lock(mu_);
    memory_ = m;
    return m;
  }
  void complete(std::vector<TensorDesc> tensors, size_t bytes, uint64_t ticket, int64_t skipped,
                int64_t bytes_read) override {
    std::shared_ptr<Stream> s = lock_once();
    if (!s) return;
    bool inside = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (memory_) job_.memory = std::move(memory_);  // else the units' memory stays
      for (const TensorDesc& t : tensors)
        inside = inside && t.offset + t.nbytes <= bytes && (t.nbytes == 0 || job_.memory);
    }
    if (!inside) {  // a bug of the finisher: the batch fails rather than read stray memory
      job_.error = std::make_exception_ptr(
          Error("internal: a tensor of a handed-off batch lies outside its memory"));
      job_.memory.reset();
      s->ring_.publish(pos_);
      return;
    }
    job_.work->tensors = std::move(tensors);
    job_.work->bytes = bytes;
    job_.work->skipped.fetch_add(skipped, std::memory_order_relaxed);
    job_.work->bytes_read.fetch_add(bytes_read, std::memory_order_relaxed);
    job_.ticket = ticket;
    s->ring_.publish(pos_);
  }
  void fail(std::exception_ptr error) override {
    std::shared_ptr<Stream> s = lock_once();
    if (!s) return;
    job_.error = std::move(error);
    job_.memory.reset();
    s->ring_.publish(pos_);
  }
  void set_samples(int64_t samples) override {
    std::shared_ptr<Stream> s = stream_.lock();  // job_ lives while its stream does
    if (s && !done_.load(std::memory_order_acquire)) job_.work->samples = samples;
  }
  void end() override {
    std::shared_ptr<Stream> s = lock_once();
    if (!s) return;
    job_.end = true;
    job_.memory.reset();
    s->ring_.publish(pos_);
  }
  uint64_t stream_id() const override { return stream_id_; }
  bool earlier_passed() const override {
    std::shared_ptr<Stream> s = stream_.lock();
    return !s || s->passed_before(pos_);
  }

 private:
  // The stream, the first time only, and only while it runs.
  std::shared_ptr<Stream> lock_once() {
    if (done_.exchange(true, std::memory_order_acq_rel)) return nullptr;
    std::shared_ptr<Stream> s = stream_.lock();
    return s && !s->stopped() ? s : nullptr;
  }

  const std::weak_ptr<Stream> stream_;
  const int64_t pos_;
  Job& job_;  // valid while the stream lives (checked by lock_once)
  const BatchWork& work_;
  const uint64_t stream_id_;
  std::mutex mu_;
  std::shared_ptr<uint8_t> memory_;  // guarded by mu_: allocate()'s
  std::atomic<bool> done_{false};
};

// NOTE [ Hand-off order ]
// Workers finish positions out of order: the one planning position p may be
// descheduled while another plans, runs and hands off p + 1, p + 2. A
// finisher that served p + 2 at once would put its samples at a worker
// process before p's, and a sample that hangs there (a map stuck until its
// timeout) would then hold up the batch the reader needs first. So a job
// records the position it passed (handed off or published) and the finisher
// serves a handed-off batch only once every earlier position of its stream
// passed (HandedOffBatch::earlier_passed): the stage takes batches in the
// reader's order, as DataLoader's workers get their indices. A batch that
// passes without a hand-off (an error) tells the finisher, which may then
// serve those held back for it.

void Stream::finish(int64_t pos, Job& job, WorkerContext& ctx) {
  const int count = units_count(job.units.load(std::memory_order_relaxed));
  if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 != count) return;
  // The whole batch's work (BatchWork::finish: batch_transforms), after every
  // unit (the acq_rel above saw the other units' bytes and errors), before a
  // handoff to the Python stage, so that batch_map sees the mixed batch.
  if (job.work && !job.error && !job.cut_short.load(std::memory_order_relaxed)) {
    try {
      job.work->finish(job.memory.get(), ctx);
      if (ctx.stopped()) job.cut_short.store(true, std::memory_order_relaxed);
    } catch (...) {
      job.error = std::current_exception();
    }
  }
  job.passed.store(pos, std::memory_order_release);  // NOTE [ Hand-off order ]
  if (job.work && job.work->handoff && !job.error &&
      !job.cut_short.load(std::memory_order_relaxed) && !stopped()) {
    finisher_->hand_off(std::make_shared<Handle>(*this, pos, job));
    return;
  }
  if (finisher_) finisher_->passed();
  ring_.publish(pos);
}

bool Stream::passed_before(int64_t pos) const {
  for (int64_t q = read_pos_.load(std::memory_order_acquire); q < pos; ++q) {
    if (ring_.at(q).passed.load(std::memory_order_acquire) == q) continue;
    // The slot may hold a later position already: q was read meanwhile.
    if (q < read_pos_.load(std::memory_order_acquire)) continue;
    return false;
  }
  return true;
}

// ---- segments ---------------------------------------------------------------------

bool Stream::extend(int64_t pos) {
  std::lock_guard<std::mutex> lock(seg_mu_);
  const int64_t limit = limit_.load(std::memory_order_relaxed);
  if (limit > pos) return true;
  if (!next_ || next_failed_) return false;
  Segment s;
  s.key = *next_;
  s.begin = limit;
  new_file_check_round();  // the next epoch begins (NOTE [ Verified once ] in format/)
  try {
    s.plan = producer_->plan_epoch(s.key);
  } catch (...) {
    next_failed_ = true;  // the next iterator plans it again and reports the error
    return false;
  }
  s.batches = s.plan->num_batches();
  if (s.batches == 0) {
    next_failed_ = true;  // nothing to assemble ahead; segment_from() plans it when asked
    return false;
  }
  next_.reset();
  // Segments wholly behind the reader are not needed any more.
  const int64_t consumed = consumed_.load(std::memory_order_acquire);
  while (segments_.size() > 1 && segments_.front().begin + segments_.front().batches <= consumed)
    segments_.pop_front();
  segments_.push_back(s);
  limit_.store(s.begin + s.batches, std::memory_order_release);
  return true;
}

void Stream::set_next(std::optional<EpochKey> key) {
  {
    std::lock_guard<std::mutex> lock(seg_mu_);
    next_ = key;
    next_failed_ = false;
  }
  if (key) signal_->notify();
}

std::optional<Segment> Stream::segment_at(int64_t pos) const {
  std::lock_guard<std::mutex> lock(seg_mu_);
  for (const Segment& s : segments_)
    if (pos >= s.begin && pos < s.begin + s.batches) return s;
  return std::nullopt;
}

std::optional<EpochKey> Stream::key_at(int64_t pos) const {
  std::lock_guard<std::mutex> lock(seg_mu_);
  for (auto s = segments_.rbegin(); s != segments_.rend(); ++s)
    if (s->begin == pos) return s->key;
  if (pos == limit_.load(std::memory_order_acquire) && next_ && !next_failed_) return next_;
  return std::nullopt;
}

bool Stream::planned(int64_t pos) const {
  std::lock_guard<std::mutex> lock(seg_mu_);
  for (const Segment& s : segments_)
    if (s.begin == pos && s.batches > 0) return true;
  return false;
}

std::optional<Segment> Stream::segment_from(int64_t pos) {
  {
    std::lock_guard<std::mutex> lock(seg_mu_);
    for (auto s = segments_.rbegin(); s != segments_.rend(); ++s)
      if (s->begin == pos) return *s;
    if (pos != limit_.load(std::memory_order_acquire) || !next_) return std::nullopt;
    // The workers have not reached it yet: plan it here, reporting its error.
    next_failed_ = false;
    Segment s;
    s.key = *next_;
    s.begin = pos;
    new_file_check_round();
    s.plan = producer_->plan_epoch(s.key);
    s.batches = s.plan->num_batches();
    next_.reset();
    segments_.push_back(s);
    limit_.store(s.begin + s.batches, std::memory_order_release);
  }
  signal_->notify();
  return segment_from(pos);
}

// ---- the reader -------------------------------------------------------------------

Stream::Read Stream::read(HostBatch& out, Clock::time_point deadline) {
  const int64_t p = read_pos_.load(std::memory_order_relaxed);
  switch (ring_.wait_ready(p, deadline)) {
    case BatchRing<Job>::Wait::kOk:
      break;
    case BatchRing<Job>::Wait::kTimeout:
      return Read::kTimeout;
    case BatchRing<Job>::Wait::kClosed:
      return Read::kStopped;
  }
  Job& job = ring_.at(p);
  // A unit cut short by stop() may still have completed its position.
  if (stop_.load(std::memory_order_acquire) || job.cut_short.load(std::memory_order_acquire))
    return Read::kStopped;
  // NOTE [ Open-ended epochs ]: nothing here, nor after it; the slot stays
  // claimed (the stream ends with its epoch), so a second read says so again.
  if (job.end) return Read::kEnd;
  out = HostBatch{};
  out.index = job.index;
  if (job.error) {
    out.error = job.error;
  } else {
    BatchWork& w = *job.work;
    out.memory = std::move(job.memory);
    out.bytes = w.bytes;
    out.pinned = pool_->kind() == MemoryKind::kPinned;
    out.tensors = std::move(w.tensors);
    out.counters = {w.samples, w.skipped.load(std::memory_order_relaxed),
                    w.bytes_read.load(std::memory_order_relaxed), std::move(w.source_counts)};
    out.ticket = job.ticket;
  }
  job.work.reset();
  job.memory.reset();
  job.error = nullptr;
  ring_.release(p);
  consumed_.store(p + 1, std::memory_order_release);
  read_pos_.store(p + 1, std::memory_order_release);
  signal_->notify();  // a parked worker may start position p + window
  return Read::kBatch;
}

int Stream::ready_run(int max) const {
  const int64_t p0 = read_pos_.load(std::memory_order_acquire);
  int n = 0;
  while (n < max && n < window() && ring_.is_ready(p0 + n)) ++n;
  return n;
}

std::pair<int, int> Stream::progress(int64_t pos) const {
  // Racy by nature (a snapshot for a progress report): the unit word names
  // the position once it is planned; `done` counts finished units.
  const Job& job = ring_.at(pos);
  const uint64_t w = job.units.load(std::memory_order_acquire);
  if (units_pos(w) != static_cast<uint32_t>(pos)) return {0, 0};
  if (ring_.is_ready(pos)) return {units_count(w), units_count(w)};
  return {std::min(job.done.load(std::memory_order_acquire), units_count(w)), units_count(w)};
}

int Stream::ready_batches() const {
  const int64_t p0 = read_pos_.load(std::memory_order_acquire);
  int n = 0;
  for (int64_t p = p0; p < p0 + window_.load(std::memory_order_relaxed); ++p)
    n += ring_.is_ready(p) ? 1 : 0;
  return n;
}

}  // namespace stoker
