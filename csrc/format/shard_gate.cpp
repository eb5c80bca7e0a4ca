#include "format/shard_gate.h"

#include "common/activity.h"
#include "common/detail/futex.h"
#include "common/error.h"
#include "common/stop_flag.h"

namespace stoker {

ShardGate::ShardGate(size_t n, bool releasable)
    : n_(n), words_(new std::atomic<uint32_t>[n]), fail_(n) {
  for (size_t s = 0; s < n; ++s) words_[s].store(kPending, std::memory_order_relaxed);
  if (releasable) {
    pins_.reset(new std::atomic<int32_t>[n]);
    for (size_t s = 0; s < n; ++s) pins_[s].store(0, std::memory_order_relaxed);
  }
}

void ShardGate::count_wait(std::chrono::steady_clock::duration d) const {
  wait_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(),
                     std::memory_order_relaxed);
}

bool ShardGate::demand(size_t s) const {
  uint32_t pending = kPending;
  if (!words_[s].compare_exchange_strong(pending, kDemanded, std::memory_order_acq_rel))
    return false;
  event_.notify();  // the fetcher starts it now
  return true;
}

void ShardGate::sleep(size_t s, State v, std::chrono::milliseconds slice) const {
  detail::futex_wait(words_[s], v, slice);
}

void ShardGate::wake(size_t s) const { detail::futex_wake(words_[s]); }

void ShardGate::await(size_t s, const std::string& path) const {
  std::atomic<uint32_t>& g = words_[s];
  uint32_t v = g.load(std::memory_order_acquire);
  if (v == kPending || v == kDemanded || v == kReleasing) {
    if (!stop_bound())
      STOKER_THROW(UsageError, path,
                   ": shard not downloaded yet (a loader's workers wait for it; "
                   "stoker.Dataset's own reads fetch it first)");
    const ScopedActivity fetching(Activity::kFetching);
    struct Count {  // the wait counts however it ends
      const ShardGate& gate;
      std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
      ~Count() { gate.count_wait(std::chrono::steady_clock::now() - t0); }
    } count{*this};
    for (;;) {
      v = g.load(std::memory_order_acquire);
      if (v == kPending) {
        if (!demand(s)) continue;
        v = kDemanded;
      }
      if (v != kDemanded && v != kReleasing) break;
      if (stop_requested()) STOKER_THROW(Error, path, ": stopped while waiting for the download");
      // Slices, so that a stop is seen within one. (kReleasing lasts an unmap.)
      detail::futex_wait(g, v, std::chrono::milliseconds(50));
    }
  }
  if (v == kFailed) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = fail_[s];
    }
    throw FetchError(why);
  }
}

bool ShardGate::try_pin(size_t s) const {
  // NOTE [ Released shards ]: count first, then look.
  pins_[s].fetch_add(1, std::memory_order_seq_cst);
  if (words_[s].load(std::memory_order_seq_cst) == kReady) return true;
  unpin(s);
  return false;
}

void ShardGate::provide(size_t s) {
  STOKER_CHECK(s < n_, UsageError, "provide: shard ", s, " out of range");
  uint32_t v = words_[s].load(std::memory_order_acquire);
  for (;;) {
    if (v == kReady || v == kFailed) break;
    if (v == kReleasing) {  // a try_release() under way ends in kPending: then provide
      detail::futex_wait(words_[s], kReleasing, std::chrono::milliseconds(1));
      v = words_[s].load(std::memory_order_acquire);
      continue;
    }
    if (words_[s].compare_exchange_weak(v, kReady, std::memory_order_acq_rel)) break;
  }
  detail::futex_wake(words_[s]);
}

void ShardGate::fail(size_t s, const std::string& why) {
  STOKER_CHECK(s < n_, UsageError, "fail: shard ", s, " out of range");
  {
    std::lock_guard<std::mutex> lock(mu_);  // readers take fail_ under it
    uint32_t v = words_[s].load(std::memory_order_acquire);
    if (v == kReady || v == kFailed) return;  // provided meanwhile, or failed already
    fail_[s] = why;
    // (kReleasing cannot be seen here: try_release() holds mu_ while in it.)
    while (v != kReady && v != kFailed &&
           !words_[s].compare_exchange_weak(v, kFailed, std::memory_order_acq_rel)) {
    }
  }
  detail::futex_wake(words_[s]);
}

bool ShardGate::try_release(size_t s, const std::function<void()>& unmap) {
  STOKER_CHECK(pins_ && s < n_, UsageError, "try_release: shard ", s,
               " of a dataset that is not releasable or out of range");
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t v = kReady;
  if (!words_[s].compare_exchange_strong(v, kReleasing, std::memory_order_seq_cst)) return false;
  const bool held = pins_[s].load(std::memory_order_seq_cst) != 0;
  if (!held) unmap();  // the cache may now delete the file
  words_[s].store(held ? kReady : kPending, std::memory_order_seq_cst);
  detail::futex_wake(words_[s]);
  return !held;
}

std::vector<size_t> ShardGate::demands() const {
  std::vector<size_t> out;
  for (size_t s = 0; s < n_; ++s)
    if (words_[s].load(std::memory_order_acquire) == kDemanded) out.push_back(s);
  return out;
}

}  // namespace stoker
