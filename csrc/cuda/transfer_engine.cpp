#include "cuda/transfer_engine.h"

#include <pthread.h>

#include <algorithm>

#include "common/clock.h"
#include "common/error.h"
#include "pipeline/window.h"

namespace stoker {

namespace {

// Copies whose host slot the copy thread may hold before it waits for the
// oldest: the slot pool allocates rather than waits, so this bounds extra
// pinned memory, not progress.
constexpr size_t kMaxHostInFlight = 2;

// Every wait of the copy thread ends after this long to look at the stop flag.
constexpr auto kSlice = std::chrono::milliseconds(20);

}  // namespace

TransferEngine::TransferEngine(std::shared_ptr<DeviceApi> api, Source source, int prefetch,
                               std::shared_ptr<BlockPool> pool, std::shared_ptr<LoaderStats> stats)
    : api_(std::move(api)),
      source_(std::move(source)),
      pool_(std::move(pool)),
      stats_(std::move(stats)),
      out_(static_cast<size_t>(checked_prefetch(prefetch))) {
  STOKER_CHECK(api_ != nullptr, UsageError, "TransferEngine: no device API");
  STOKER_CHECK(static_cast<bool>(source_), UsageError, "TransferEngine: no source");
  STOKER_CHECK(pool_ != nullptr && pool_->kind() == MemoryKind::kDevice, UsageError,
               "TransferEngine: needs a pool of device buffers");
  timing_events_ = EventPool::create(api_, true);
  copy_stream_ = api_->create_stream();
  try {
    thread_ = std::thread([this] { copy_loop(); });
  } catch (...) {
    api_->destroy_stream(copy_stream_);
    throw;
  }
}

TransferEngine::~TransferEngine() { stop(); }

// ---- copy thread -----------------------------------------------------------

void TransferEngine::copy_loop() noexcept {
  pthread_setname_np(pthread_self(), "stoker-copy");
  std::vector<InFlight> in_flight;
  int64_t pos = 0;
  bool failed = false;
  try {
    while (!stop_.load(std::memory_order_acquire)) {
      HostBatch hb;
      pool_->collect();  // NOTE [ Deferred frees ]: this thread frees the pool's buffers
      const SourceStatus s = source_(hb, Clock::now() + kSlice);
      if (s == SourceStatus::kTimeout) {
        reap(in_flight, false);
        continue;
      }
      if (s == SourceStatus::kStopped) break;
      if (!wait_for_room(pos, in_flight)) break;
      Ready& r = out_.at(pos);
      if (s == SourceStatus::kEnd) {
        r = Ready{};
        r.end = true;
        r.index = hb.index;
        out_.publish(pos);
        break;  // the consumer ends here
      }
      if (hb.error) {
        // A batch's error travels at its position; the batches after it
        // follow (a stream goes on into the next epoch).
        r = Ready{};
        r.index = hb.index;
        r.error = hb.error;
        out_.publish(pos++);
        continue;
      }
      r = copy_one(std::move(hb), in_flight);
      out_.publish(pos++);
      reap(in_flight, false);
      while (in_flight.size() > kMaxHostInFlight && !stop_.load(std::memory_order_acquire)) {
        api_->wait_event(*in_flight.front().done, kSlice);
        reap(in_flight, false);
      }
    }
  } catch (...) {
    // A device error: the consumer gets it at the position it would read next,
    // like a source error.
    failed = true;
    std::exception_ptr e = std::current_exception();
    try {
      if (wait_for_room(pos, in_flight)) {
        out_.at(pos) = Ready{};
        out_.at(pos).error = e;
        out_.at(pos).end = true;  // nothing follows: the consumer keeps getting it
        out_.publish(pos);
      }
    } catch (...) {
    }
  }
  // Slots go back only once the DMA has read them (NOTE [ One copy thread per stream ]).
  try {
    if (failed) api_->synchronize_stream(copy_stream_);  // a copy may lack its event
    reap(in_flight, true);
  } catch (...) {
    // The device failed and nothing says whether DMA still reads these slots:
    // leak them rather than let the loader refill them.
    for (InFlight& f : in_flight) new std::shared_ptr<uint8_t>(std::move(f.host));
  }
}

bool TransferEngine::wait_for_room(int64_t pos, std::vector<InFlight>& in_flight) {
  // Copies finishing while the consumer is slow return their host slots here,
  // and buffers the consumer dropped are freed (NOTE [ Deferred frees ]).
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) return false;
    pool_->collect();
    if (!in_flight.empty() && !out_.is_free(pos)) {
      api_->wait_event(*in_flight.front().done, kSlice);
      reap(in_flight, false);
      continue;
    }
    switch (out_.wait_free(pos, Clock::now() + kSlice)) {
      case BatchRing<Ready>::Wait::kOk:
        if (!out_.try_claim(pos)) STOKER_THROW(Error, "internal: transfer slot taken twice");
        return true;
      case BatchRing<Ready>::Wait::kTimeout:
        break;
      case BatchRing<Ready>::Wait::kClosed:
        return false;
    }
  }
}

TransferEngine::Ready TransferEngine::copy_one(HostBatch hb, std::vector<InFlight>& in_flight) {
  std::shared_ptr<BlockPool::Lease> lease = pool_->lease(hb.bytes, copy_stream_);

  InFlight f;
  f.host = std::move(hb.memory);
  f.start = timing_events_->get();
  f.done = timing_events_->get();
  f.bytes = hb.bytes;
  api_->record_event(*f.start, copy_stream_);
  // One copy per batch: its tensors are laid out in one buffer.
  if (hb.bytes > 0) api_->copy_to_device_async(lease->data(), f.host.get(), hb.bytes, copy_stream_);
  api_->record_event(*f.done, copy_stream_);

  Ready r;
  r.index = hb.index;
  r.lease = std::move(lease);
  r.copied = f.done;
  r.tensors = std::move(hb.tensors);
  r.counters = hb.counters;
  r.ticket = hb.ticket;
  in_flight.push_back(std::move(f));
  return r;
}

void TransferEngine::reap(std::vector<InFlight>& in_flight, bool all) {
  // Copies complete in the order they were queued on the one copy stream.
  size_t n = 0;
  for (; n < in_flight.size(); ++n) {
    InFlight& f = in_flight[n];
    if (all) {
      while (!api_->wait_event(*f.done, std::chrono::milliseconds(100))) {
      }
    } else if (!api_->query_event(*f.done)) {
      break;
    }
    const double ms = api_->elapsed_ms(*f.start, *f.done);
    copy_ns_.fetch_add(static_cast<int64_t>(ms * 1e6), std::memory_order_relaxed);
    bytes_.fetch_add(static_cast<int64_t>(f.bytes), std::memory_order_relaxed);
    copies_.fetch_add(1, std::memory_order_relaxed);
    if (stats_) {
      stats_->copy_ns.fetch_add(static_cast<int64_t>(ms * 1e6), std::memory_order_relaxed);
      stats_->copy_bytes.fetch_add(static_cast<int64_t>(f.bytes), std::memory_order_relaxed);
      stats_->copies.fetch_add(1, std::memory_order_relaxed);
    }
    f.host.reset();  // the slot goes back to its pool
  }
  in_flight.erase(in_flight.begin(), in_flight.begin() + static_cast<std::ptrdiff_t>(n));
}

// ---- consumer --------------------------------------------------------------

std::optional<DeviceBatch> TransferEngine::next(StreamHandle consumer_stream) {
  std::optional<DeviceBatch> out;
  while (next_until(consumer_stream, Clock::now() + std::chrono::milliseconds(100), out) ==
         Status::kTimeout) {
  }
  return out;
}

TransferEngine::Status TransferEngine::next_until(StreamHandle consumer_stream,
                                                  Clock::time_point deadline,
                                                  std::optional<DeviceBatch>& out,
                                                  StreamHandle side_stream) {
  out.reset();
  std::lock_guard<std::mutex> lock(consumer_mu_);
  if (error_) std::rethrow_exception(error_);
  if (finished_) return Status::kEnd;
  const auto t0 = Clock::now();
  const auto w = out_.wait_ready(read_pos_, deadline);
  wait_ns_.fetch_add(ns_since(t0), std::memory_order_relaxed);
  if (w == BatchRing<Ready>::Wait::kTimeout) return Status::kTimeout;
  STOKER_CHECK(w == BatchRing<Ready>::Wait::kOk && !stop_.load(std::memory_order_acquire),
               UsageError, "the CUDA transfer was stopped");
  Ready r = std::move(out_.at(read_pos_));
  out_.release(read_pos_);
  ++read_pos_;
  read_pos_seen_.store(read_pos_, std::memory_order_relaxed);
  if (r.error) {
    if (r.end) error_ = r.error;  // the copy thread is gone: sticky
    std::rethrow_exception(r.error);
  }
  if (r.end) {
    finished_ = true;
    return Status::kEnd;
  }
  // NOTE [ Stream ordering ]: U waits for E_k on the device.
  api_->stream_wait_event(consumer_stream, *r.copied);
  if (side_stream != 0) api_->stream_wait_event(side_stream, *r.copied);
  r.lease->set_reader(consumer_stream);
  out = DeviceBatch{r.index,        BlockPool::Lease::bytes(std::move(r.lease)),
                    api_->device(), std::move(r.tensors),
                    r.counters,     r.ticket};
  return Status::kBatch;
}

// ---- shutdown and stats ------------------------------------------------------

void TransferEngine::request_stop() {
  stop_.store(true, std::memory_order_release);
  out_.close();
}

void TransferEngine::stop() {
  request_stop();
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) thread_.join();
  {
    // Batches copied but never taken: their buffers go back (the copies are
    // complete, the copy thread waited for them).
    std::lock_guard<std::mutex> consumer(consumer_mu_);
    for (size_t i = 0; i < out_.capacity(); ++i) out_.at(static_cast<int64_t>(i)) = Ready{};
  }
  api_->destroy_stream(copy_stream_);
}

int TransferEngine::ready(int max) const {
  const int64_t p0 = read_pos_seen_.load(std::memory_order_relaxed);
  const int n = std::min<int>(max, static_cast<int>(out_.capacity()));
  int k = 0;
  while (k < n && out_.is_ready(p0 + k)) ++k;
  return k;
}

TransferStats TransferEngine::stats() const {
  TransferStats s;
  s.copies = copies_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.copy_seconds = static_cast<double>(copy_ns_.load(std::memory_order_relaxed)) * 1e-9;
  s.wait_seconds = static_cast<double>(wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

}  // namespace stoker
