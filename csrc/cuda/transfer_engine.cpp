#include "cuda/transfer_engine.h"

#include <pthread.h>

#include "common/error.h"

namespace stoker {

namespace {

using Clock = std::chrono::steady_clock;

// Copies whose host slot the copy thread may hold before it waits for the
// oldest: the engine's slot pool allocates rather than waits, so this bounds
// extra pinned memory, not progress.
constexpr size_t kMaxHostInFlight = 2;

// Waits that poll: spin briefly (a batch is often a few microseconds away),
// then yield, then sleep in short slices so stop_ is seen promptly.
void backoff(int spins) {
  if (spins < 32) return;
  if (spins < 128) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(spins < 512 ? 20 : 100));
}

size_t checked_prefetch(size_t prefetch) {
  STOKER_CHECK(prefetch >= 1, UsageError, "prefetch must be >= 1, got ", prefetch);
  return prefetch;
}

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

}  // namespace

TransferEngine::TransferEngine(std::shared_ptr<DeviceApi> api, Source source, size_t prefetch,
                               std::shared_ptr<DeviceBufferPool> pool)
    : api_(std::move(api)),
      source_(std::move(source)),
      prefetch_(checked_prefetch(prefetch)),
      pool_(std::move(pool)),
      owns_pool_(pool_ == nullptr),
      queue_(prefetch_) {
  STOKER_CHECK(api_ != nullptr, UsageError, "TransferEngine: no device API");
  STOKER_CHECK(static_cast<bool>(source_), UsageError, "TransferEngine: no source");
  STOKER_CHECK(owns_pool_ || &pool_->api() == api_.get(), UsageError,
               "TransferEngine: the buffer pool belongs to another device");
  // Idle buffers kept: the ones in flight plus a couple the user just freed.
  if (owns_pool_) pool_ = DeviceBufferPool::create(api_, prefetch_ + 2);
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
  bool failed = false;
  try {
    while (wait_for_room(in_flight)) {
      std::optional<HostBatch> hb;
      try {
        hb = source_();
      } catch (...) {
        // A stopped source throws to unblock us: that is shutdown, not an error.
        if (!stop_.load(std::memory_order_acquire)) {
          Ready r;
          r.error = std::current_exception();
          push(std::move(r));
        }
        break;
      }
      if (!hb) {
        Ready r;
        r.end = true;
        push(std::move(r));
        break;
      }
      if (stop_.load(std::memory_order_acquire)) break;
      copy_one(std::move(*hb), in_flight);
    }
  } catch (...) {
    // A device error: the consumer gets it at the position it would have
    // read next, like a source error.
    failed = true;
    Ready r;
    r.error = std::current_exception();
    push(std::move(r));
  }
  // NOTE [ Transfer shutdown ]: slots go back only once the DMA has read them.
  try {
    if (failed) api_->synchronize_stream(copy_stream_);  // a copy may lack its event
    reap(in_flight, true);
  } catch (...) {
    // The device failed and nothing says whether DMA still reads these slots:
    // leak them rather than let the loader refill them.
    for (InFlight& f : in_flight) new std::shared_ptr<uint8_t>(std::move(f.host));
  }
}

bool TransferEngine::wait_for_room(std::vector<InFlight>& in_flight) {
  // The producer is the only one who adds, so room seen here is still there
  // at push time: at most prefetch_ batches wait for the consumer.
  for (int spins = 0;; ++spins) {
    if (stop_.load(std::memory_order_acquire)) return false;
    if (queue_.size() < prefetch_) return true;
    reap(in_flight, false);
    backoff(spins);
  }
}

void TransferEngine::copy_one(HostBatch hb, std::vector<InFlight>& in_flight) {
  DeviceBufferPool::Buffer buffer = pool_->acquire(hb.bytes, copy_stream_);
  std::unique_ptr<Lease> lease(new Lease{pool_, buffer, std::nullopt});

  InFlight f;
  f.host = std::move(hb.memory);
  f.start = timing_events_->get();
  f.done = timing_events_->get();
  f.bytes = hb.bytes;
  api_->record_event(*f.start, copy_stream_);
  // One copy per batch: its tensors are laid out in one buffer.
  if (hb.bytes > 0)
    api_->copy_to_device_async(buffer.data, f.host.get(), hb.bytes, copy_stream_);
  api_->record_event(*f.done, copy_stream_);

  Ready r;
  r.index = hb.index;
  r.lease = std::move(lease);
  r.copied = f.done;
  r.tensors = std::move(hb.tensors);
  in_flight.push_back(std::move(f));
  push(std::move(r));

  reap(in_flight, false);
  while (in_flight.size() > kMaxHostInFlight && !stop_.load(std::memory_order_acquire)) {
    api_->wait_event(*in_flight.front().done, std::chrono::milliseconds(10));
    reap(in_flight, false);
  }
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
    f.host.reset();  // the slot goes back to its pool
  }
  in_flight.erase(in_flight.begin(), in_flight.begin() + static_cast<std::ptrdiff_t>(n));
}

void TransferEngine::push(Ready r) {
  for (int spins = 0;; ++spins) {
    if (queue_.try_push(std::move(r))) return;  // moves only on success
    if (stop_.load(std::memory_order_acquire)) return;
    backoff(spins);
  }
}

// ---- consumer --------------------------------------------------------------

std::optional<DeviceBatch> TransferEngine::next(StreamHandle consumer_stream) {
  std::optional<DeviceBatch> out;
  while (next_for(consumer_stream, std::chrono::milliseconds(100), out) == Status::kTimeout) {
  }
  return out;
}

TransferEngine::Status TransferEngine::next_for(StreamHandle consumer_stream,
                                                std::chrono::milliseconds timeout,
                                                std::optional<DeviceBatch>& out) {
  out.reset();
  std::lock_guard<std::mutex> lock(consumer_mu_);
  if (error_) std::rethrow_exception(error_);
  if (finished_) return Status::kEnd;
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  Ready r;
  for (int spins = 0; !queue_.try_pop(r); ++spins) {
    STOKER_CHECK(!stop_.load(std::memory_order_acquire), UsageError,
                 "the CUDA transfer was stopped");
    if (Clock::now() >= deadline) {
      wait_ns_.fetch_add(ns_since(t0), std::memory_order_relaxed);
      return Status::kTimeout;
    }
    backoff(spins);
  }
  wait_ns_.fetch_add(ns_since(t0), std::memory_order_relaxed);
  if (r.error) {
    error_ = r.error;
    std::rethrow_exception(error_);
  }
  if (r.end) {
    finished_ = true;
    return Status::kEnd;
  }
  // NOTE [ Stream ordering ]: U waits for E_k on the device.
  api_->stream_wait_event(consumer_stream, *r.copied);
  r.lease->reader = consumer_stream;
  std::shared_ptr<Lease> lease(std::move(r.lease));
  auto* data = static_cast<uint8_t*>(lease->buffer.data);
  out = DeviceBatch{r.index, std::shared_ptr<uint8_t>(std::move(lease), data), api_->device(),
                    std::move(r.tensors)};
  return Status::kBatch;
}

// ---- shutdown and stats ------------------------------------------------------

void TransferEngine::stop() {
  stop_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) thread_.join();
  {
    // Batches copied but never taken: their buffers go back (the copies are
    // complete, the copy thread waited for them).
    std::lock_guard<std::mutex> consumer(consumer_mu_);
    Ready r;
    while (queue_.try_pop(r)) r = Ready();
  }
  api_->destroy_stream(copy_stream_);
  // NOTE [ Pool across epochs ]: a pool of our own gives its idle memory back
  // now, not when the user's last batch does; a shared one stays for the next epoch.
  if (owns_pool_) pool_->close();
}

TransferStats TransferEngine::stats() const {
  TransferStats s;
  s.copies = copies_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.copy_seconds = static_cast<double>(copy_ns_.load(std::memory_order_relaxed)) * 1e-9;
  s.wait_seconds = static_cast<double>(wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  s.pool_buffers = pool_->buffers();
  s.pool_bytes = pool_->bytes();
  return s;
}

}  // namespace stoker
