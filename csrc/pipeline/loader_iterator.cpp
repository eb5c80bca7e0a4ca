// LoaderCore's iterators: one epoch's batches for one consumer, claimed at
// the first next() (NOTE [ Epochs and iterators ] in loader_core.h).
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/clock.h"
#include "common/error.h"
#include "pipeline/detail/loader_run.h"
#include "pipeline/loader_core.h"

namespace stoker {

namespace {

// NOTE [ Slow first batch ]: reports after the first one.
constexpr auto kSlowReportEvery = std::chrono::seconds(10);

}  // namespace

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

void LoaderCore::Iterator::note_handoff(int64_t ns) {
  if (ns > 0) core_->stats_->handoff_ns.fetch_add(ns, std::memory_order_relaxed);
}

void LoaderCore::Iterator::close(bool keep) {
  if (core_->forked()) return;
  closed_.store(true, std::memory_order_release);
  // A next() in flight on another thread may still read from the stream: it
  // is stopped then, not kept for the next iterator (it would have two readers).
  std::unique_lock<detail::TimedMutex> lock(mu_, std::try_to_lock);
  core_->release(*this, keep && lock.owns_lock());
}

LoaderCore::Iterator::Status LoaderCore::Iterator::next(DeliveredBatch& out,
                                                        Clock::time_point deadline,
                                                        uintptr_t consumer_stream,
                                                        uintptr_t side_stream) {
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
  // Written only here, under mu_; the core reads it for state() (NOTE [ Epochs and iterators ]).
  const int64_t yielded = yielded_.load(std::memory_order_relaxed);
  if (yielded >= batches_) {
    core_->end_run(*this);
    return Status::kEnd;
  }
  LoaderStats& st = *core_->stats_;
  while (drain_ > 0) {  // the rest of an epoch left early, before this one (claim())
    DeliveredBatch dropped;
    const BatchReader::Status s = run_->reader->next(dropped, deadline, consumer_stream, 0);
    if (s == BatchReader::Status::kTimeout) return Status::kTimeout;
    if (s == BatchReader::Status::kStopped || s == BatchReader::Status::kEnd) {
      closed_.store(true, std::memory_order_release);
      core_->release(*this);
      return Status::kEnd;
    }
    run_->delivered.fetch_add(1, std::memory_order_acq_rel);
    --drain_;
  }
  LoaderTelemetry& tel = *core_->telemetry_;
  if (!asked_) {  // the queue the consumer finds, once per batch
    asked_ = true;
    if (main_) tel.note_depth(run_->reader->ready(LoaderTelemetry::kDepthMax));
  }
  const auto t0 = Clock::now();
  const BatchReader::Status s = run_->reader->next(out, deadline, consumer_stream, side_stream);
  const auto t1 = Clock::now();
  st.wait_ns.fetch_add(ns_between(t0, t1), std::memory_order_relaxed);
  if (s == BatchReader::Status::kTimeout) {
    if (yielded == 0 && t1 >= next_report_) {  // NOTE [ Slow first batch ]
      tel.report_slow_first(claimed_ ? std::optional<uint64_t>(key_.epoch) : std::nullopt,
                            seconds(ns_between(opened_, t1)), reported_slow_,
                            run_ ? run_->stream.get() : nullptr);
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
  if (s == BatchReader::Status::kEnd) {
    // NOTE [ Open-ended epochs ] in batch_producer.h: the source ended the epoch
    // here, which is where a counted one would have ended; its stream stops.
    batches_ = yielded;
    core_->yielded(*this);
    core_->end_run(*this);
    return Status::kEnd;
  }
  run_->delivered.fetch_add(1, std::memory_order_acq_rel);
  yielded_.store(yielded + 1, std::memory_order_release);
  asked_ = false;
  if (out.error) {
    // As DataLoader: the failed batch is consumed (the position moves past it)
    // and the next call goes on with the batch after it. An error that leaves
    // nothing behind it (a device error) comes again at every call (NOTE
    // [ After a failed batch ] in stoker/_iterator.py).
    std::exception_ptr e = out.error;
    core_->yielded(*this);
    std::rethrow_exception(e);
  }
  st.batches.fetch_add(1, std::memory_order_relaxed);
  st.samples.fetch_add(out.counters.samples, std::memory_order_relaxed);
  st.bytes_read.fetch_add(out.counters.bytes_read, std::memory_order_relaxed);
  st.skipped.fetch_add(out.counters.skipped, std::memory_order_relaxed);
  if (!out.counters.sources.empty()) st.add_sources(out.counters.sources);
  if (yielded == 0 && main_) {
    st.first_batch_ns.store(ns_between(opened_, t1), std::memory_order_relaxed);
    int64_t none = -1;
    st.warmup_ns.compare_exchange_strong(none, ns_between(started_, t1), std::memory_order_relaxed);
  }
  if (yielded == 0 && reported_slow_)
    tel.report_first_batch(key_.epoch, seconds(ns_between(opened_, t1)));
  if (main_) {
    if (std::optional<int> window = tel.tick(t1)) core_->apply_window(*window);
  }
  core_->yielded(*this);
  return Status::kBatch;
}

void LoaderCore::Iterator::claim() {
  if (core_->forked()) return;  // next() says why
  std::lock_guard<detail::TimedMutex> lock(mu_);
  if (!claimed_ && !closed_.load(std::memory_order_acquire)) core_->claim(*this);
}

EpochKey LoaderCore::Iterator::key() const {
  std::lock_guard<detail::TimedMutex> lock(mu_);
  if (claimed_) return key_;
  std::lock_guard<std::mutex> core_lock(core_->mu_);
  return core_->prospective_key(rank_, world_);
}

int64_t LoaderCore::Iterator::remaining() const {
  std::lock_guard<detail::TimedMutex> lock(mu_);
  if (claimed_) return batches_ - yielded_.load(std::memory_order_relaxed);
  return core_->next_batches(rank_, world_);
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
