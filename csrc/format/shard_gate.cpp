#include "format/shard_gate.h"

#include <algorithm>
#include <utility>

#include "common/activity.h"
#include "common/blocking.h"
#include "common/detail/futex.h"
#include "common/error.h"
#include "common/stop_flag.h"

namespace stoker {

ShardGate::ShardGate(std::vector<std::string> names, bool releasable, detail::StripedMutex& stripes)
    : names_(std::move(names)),
      stripes_(stripes),
      word_(new std::atomic<uint32_t>[names_.size()]),
      fails_(new std::atomic<uint32_t>[names_.size()]),
      fail_(names_.size()),
      provided_at_(names_.size(), -1) {
  for (size_t s = 0; s < names_.size(); ++s) {
    word_[s].store(kPending, std::memory_order_relaxed);
    fails_[s].store(0, std::memory_order_relaxed);
  }
  if (releasable) {
    pins_.reset(new std::atomic<int32_t>[names_.size()]);
    for (size_t s = 0; s < names_.size(); ++s) pins_[s].store(0, std::memory_order_relaxed);
  }
  detail::add_fork_client(this);
}

ShardGate::~ShardGate() { detail::remove_fork_client(this); }

bool ShardGate::demand(size_t s) const {
  uint32_t v = kPending;
  if (!word_[s].compare_exchange_strong(v, kDemanded, std::memory_order_acq_rel)) return false;
  {
    std::lock_guard<std::mutex> lock(list_mu_);
    demand_order_.push_back(s);
  }
  event_.notify();  // the fetcher starts it now
  return true;
}

void ShardGate::await(size_t s) const {
  std::atomic<uint32_t>& g = word_[s];
  uint32_t v = g.load(std::memory_order_acquire);
  if (v == kPending || v == kDemanded || v == kReleasing) {
    if (!stop_bound())
      STOKER_THROW(UsageError, names_[s],
                   ": shard not downloaded yet (a loader's workers wait for it; "
                   "stoker.Dataset's own reads fetch it first)");
    const uint32_t failed_before = fails_[s].load(std::memory_order_acquire);
    const ScopedActivity fetching(Activity::kFetching);
    const ScopedBlocked blocked;  // the worker waits: another may take its turn
    const auto t0 = std::chrono::steady_clock::now();
    begin_wait(t0);
    struct Count {  // the wait counts however it ends
      const ShardGate& gate;
      std::chrono::steady_clock::time_point t0;
      ~Count() { gate.end_wait(t0); }
    } count{*this, t0};
    for (;;) {
      v = g.load(std::memory_order_acquire);
      if (v == kReady) break;
      if (fails_[s].load(std::memory_order_acquire) != failed_before) throw_failure(s);
      if (v == kPending) {
        if (!demand(s)) continue;
        v = kDemanded;
      }
      if (v != kDemanded && v != kReleasing) break;
      if (stop_requested())
        STOKER_THROW(Error, names_[s], ": stopped while waiting for the download");
      // Slices, so that a stop is seen within one. (kReleasing lasts an unmap.)
      detail::futex_wait(g, v, std::chrono::milliseconds(50));
    }
  }
  if (v == kFailed) throw_failure(s);
}

void ShardGate::throw_failure(size_t s) const {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(stripes_[s]);
    why = fail_[s];
  }
  if (why.empty()) why = names_[s] + ": the download failed";
  throw FetchError(why);
}

bool ShardGate::try_enter(size_t s) const {
  pins_[s].fetch_add(1, std::memory_order_seq_cst);
  if (word_[s].load(std::memory_order_seq_cst) == kReady) return true;
  leave(s);
  return false;
}

void ShardGate::wait_word(size_t s, uint32_t v, std::chrono::milliseconds slice) const {
  detail::futex_wait(word_[s], v, slice);
}

void ShardGate::wake(size_t s) const { detail::futex_wake(word_[s]); }

void ShardGate::provide(size_t s) {
  STOKER_CHECK(s < size(), UsageError, "provide: shard ", s, " out of range");
  {
    // Under the stripe: a try_release() is never half done here, and the
    // provided list changes with the state.
    std::lock_guard<std::mutex> lock(stripes_[s]);
    const uint32_t v = word_[s].load(std::memory_order_acquire);
    if (v == kReady || v == kFailed) return;
    word_[s].store(kReady, std::memory_order_seq_cst);
    std::lock_guard<std::mutex> list(list_mu_);
    add_provided_locked(s);
  }
  wake(s);
}

void ShardGate::fail(size_t s, const std::string& why) {
  STOKER_CHECK(s < size(), UsageError, "fail: shard ", s, " out of range");
  {
    std::lock_guard<std::mutex> lock(stripes_[s]);  // readers take fail_ under it
    const uint32_t v = word_[s].load(std::memory_order_acquire);
    if (v == kReady) return;  // provided meanwhile
    fail_[s] = why;
    fails_[s].fetch_add(1, std::memory_order_acq_rel);
    word_[s].store(kFailed, std::memory_order_release);
  }
  wake(s);
}

bool ShardGate::reset(size_t s) {
  STOKER_CHECK(s < size(), UsageError, "reset: shard ", s, " out of range");
  std::lock_guard<std::mutex> lock(stripes_[s]);
  if (word_[s].load(std::memory_order_acquire) != kFailed) return false;
  // fail_[s] stays: a reader that waited through the failure still reports it.
  word_[s].store(kPending, std::memory_order_release);
  return true;
}

bool ShardGate::try_release(size_t s, const std::function<void()>& unmap) {
  STOKER_CHECK(pins_ && s < size(), UsageError, "try_release: shard ", s,
               " of a dataset that is not releasable or out of range");
  bool released;
  {
    // Under the stripe: a reader mapping the shard, or a provide()/fail(), waits.
    std::lock_guard<std::mutex> lock(stripes_[s]);
    uint32_t v = kReady;
    if (!word_[s].compare_exchange_strong(v, kReleasing, std::memory_order_seq_cst)) return false;
    released = pins_[s].load(std::memory_order_seq_cst) == 0;
    if (released) {
      try {
        unmap();
      } catch (...) {
        word_[s].store(kReady, std::memory_order_seq_cst);
        wake(s);
        throw;
      }
      std::lock_guard<std::mutex> list(list_mu_);
      remove_provided_locked(s);
    }
    word_[s].store(released ? kPending : kReady, std::memory_order_seq_cst);
  }
  wake(s);
  return released;
}

std::vector<size_t> ShardGate::demands() const {
  std::lock_guard<std::mutex> lock(list_mu_);
  // Entries whose shard is no longer demanded (provided, failed) go now.
  auto stale = [&](size_t s) { return word_[s].load(std::memory_order_acquire) != kDemanded; };
  demand_order_.erase(std::remove_if(demand_order_.begin(), demand_order_.end(), stale),
                      demand_order_.end());
  // A shard demanded, released and demanded again is listed once, where it first was.
  std::vector<size_t> out;
  out.reserve(demand_order_.size());
  for (size_t s : demand_order_)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

std::vector<size_t> ShardGate::provided() const {
  std::lock_guard<std::mutex> lock(list_mu_);
  return provided_;
}

size_t ShardGate::provided_count() const {
  std::lock_guard<std::mutex> lock(list_mu_);
  return provided_.size();
}

void ShardGate::add_provided_locked(size_t s) {
  if (provided_at_[s] >= 0) return;
  provided_at_[s] = static_cast<int64_t>(provided_.size());
  provided_.push_back(s);
}

void ShardGate::remove_provided_locked(size_t s) {
  const int64_t at = provided_at_[s];
  if (at < 0) return;
  const size_t last = provided_.back();
  provided_[static_cast<size_t>(at)] = last;
  provided_at_[last] = at;
  provided_.pop_back();
  provided_at_[s] = -1;
}

void ShardGate::before_fork() { list_mu_.lock(); }

void ShardGate::after_fork(bool child) {
  if (child) {
    // NOTE [ Gate across fork ]: the child's only thread holds no pin and
    // waits for nothing.
    for (size_t s = 0; s < size(); ++s) {
      if (pins_) pins_[s].store(0, std::memory_order_relaxed);
      uint32_t v = kDemanded;
      word_[s].compare_exchange_strong(v, kPending, std::memory_order_relaxed);
    }
    demand_order_.clear();
    waiting_.store(0, std::memory_order_relaxed);  // the waiting threads are not here
    waiting_since_ns_.store(0, std::memory_order_relaxed);
  }
  list_mu_.unlock();
}

}  // namespace stoker
