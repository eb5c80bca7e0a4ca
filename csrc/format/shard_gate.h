// The gate between a remote dataset's readers and the fetcher that downloads
// its shards: one state word per shard, readers' pins, waits, and what the
// fetcher does to it (provide, fail, reset, release), with the shards readers
// demand in the order they asked.
//
// NOTE [ Deferred shards ]
// A remote dataset's shards download into a local cache while it is in use.
// Its Dataset is opened `deferred`: every shard starts pending, and a read
// (mapping it on first use) waits until the fetcher calls provide(s), or
// raises FetchError after fail(s). A reader that waits marks the shard
// demanded (demand(): the shard joins the demand order) and fires the gate
// event, so the fetcher (one thread of the Python layer, blocked in wait())
// starts the shards that readers wait for ahead of its background order: the
// loader's workers plan and read `prefetch` batches ahead, so its demands are
// the sampler's own future order. The wait is in slices: a worker gives up as
// soon as its stream stops (stop_flag.h), and a thread that is not a loader
// worker is refused at once rather than left to block (the Python layer
// fetches for it first: Dataset.__getitem__). Prefetch hints never wait
// (is_mapped is false until the read maps it).
//
//   state:  kPending --demand()--> kDemanded --provide()--> kReady
//              ^                       |                      |
//              |                     fail()         try_release() (no pin)
//              +----reset()------- kFailed                    |
//              +----------------------------------------------+ (via kReleasing)
//
// A failure is retryable: reset(s) makes a failed shard pending again, so the
// next read demands it and the fetcher downloads it anew (with its own
// backoff, python/stoker/remote/fetcher.py). Every fail() also bumps the
// shard's failure count, and a reader that was waiting when it happened
// raises it even if a reset() came before it woke up: a failure reaches every
// reader that waited for that download.
//
// NOTE [ Released shards ]
// A releasable dataset (a remote one read through a cache with a byte budget)
// also gives shards back: try_release(s) unmaps a provided shard that no
// reader holds and makes it pending again, so the cache may evict its file; a
// later read waits for it and demands it, as for a shard never provided.
// Readers hold a pin (a count per shard) across their use of a shard's bytes.
// The pin and the release meet as a Dekker pair, both sides seq_cst:
//
//   reader:  pins[s] += 1;  then reads word[s]:  kReady     -> use the mapping
//                                                otherwise  -> pins[s] -= 1, wait, retry
//   release: word[s]: kReady -> kReleasing;  then reads pins[s]:  0  -> unmap, kPending
//                                                                 >0 -> back to kReady
//
// so either the reader sees kReleasing and keeps off, or the release sees the
// pin and keeps the mapping. A reader that finds kReleasing waits on the word
// like any pending shard. State changes of the fetcher (provide, fail, reset,
// release) happen under the shard's stripe, which the Dataset also holds while
// it maps the shard, so a mapping and a release never interleave.
//
// NOTE [ Gate across fork ]
// The gate is a ForkClient (NOTE [ Locks across fork ] in
// detail/fork_locks.h): its list mutex is never inherited held, and in the
// child, where no thread reads or waits, every pin count is zero and every
// demand is dropped (demanded shards are pending again), so that the child's
// own fetcher gives back and fetches only for the child's readers.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/detail/event_count.h"
#include "format/detail/fork_locks.h"

namespace stoker {

class ShardGate final : public detail::ForkClient {
 public:
  enum State : uint32_t { kPending, kDemanded, kReady, kFailed, kReleasing };

  /// @param names   each shard's name in messages (its local path)
  /// @param stripes the dataset's per-shard locks (held while mapping a shard)
  ShardGate(std::vector<std::string> names, bool releasable, detail::StripedMutex& stripes);
  ~ShardGate();
  ShardGate(const ShardGate&) = delete;
  ShardGate& operator=(const ShardGate&) = delete;

  size_t size() const { return names_.size(); }
  bool releasable() const { return pins_ != nullptr; }
  State state(size_t s) const {
    return static_cast<State>(word_[s].load(std::memory_order_acquire));
  }

  // -- readers ----------------------------------------------------------------

  /// Blocks until shard `s` is provided (NOTE [ Deferred shards ]), demanding
  /// it. Throws FetchError with the fetcher's reason if it fails meanwhile (or
  /// failed already), Error if the calling worker's stream stops, UsageError
  /// if the caller is not a loader worker (no stop flag to give up on).
  void await(size_t s) const;
  /// kPending -> kDemanded: the shard joins the demand order and the fetcher
  /// is woken. Whether this call made the change.
  bool demand(size_t s) const;
  /// Releasable gates: counts a pin of `s`, then looks (NOTE [ Released
  /// shards ]): true if it is ready (the caller now holds the pin and gives it
  /// back with leave()), false with the count given back.
  bool try_enter(size_t s) const;
  void leave(size_t s) const noexcept { pins_[s].fetch_sub(1, std::memory_order_seq_cst); }
  /// Releasable gates: a pin taken before the shard is here (a read outside a
  /// loader, which first makes the shard local, then reads it): try_release()
  /// passes the shard over from now on. Given back with leave().
  void hold(size_t s) const {
    if (pins_) pins_[s].fetch_add(1, std::memory_order_seq_cst);
  }
  /// Sleeps at most `slice` while shard `s`'s word is `v`.
  void wait_word(size_t s, uint32_t v, std::chrono::milliseconds slice) const;
  /// Wakes readers sleeping on shard `s`'s word (something they wait for came).
  void wake(size_t s) const;
  /// The failure count of `s` (bumped by every fail()).
  uint32_t failures(size_t s) const { return fails_[s].load(std::memory_order_acquire); }
  /// Throws the FetchError of the last fail() of `s`.
  [[noreturn]] void throw_failure(size_t s) const;
  /// Adds a reader's wait to wait_seconds().
  void count_wait(std::chrono::steady_clock::duration d) const {
    wait_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(),
                       std::memory_order_relaxed);
  }
  /// A reader's wait that began at `t0` counts in wait_seconds() while it
  /// lasts (a stall shows in the stats as it happens), until end_wait(t0).
  void begin_wait(std::chrono::steady_clock::time_point t0) const {
    waiting_since_ns_.fetch_add(ns_of(t0), std::memory_order_relaxed);
    waiting_.fetch_add(1, std::memory_order_relaxed);
  }
  void end_wait(std::chrono::steady_clock::time_point t0) const {
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    waiting_since_ns_.fetch_sub(ns_of(t0), std::memory_order_relaxed);
    count_wait(std::chrono::steady_clock::now() - t0);
  }

  // -- the fetcher ------------------------------------------------------------

  /// Shard `s` is local at its path: readers may map it. Idempotent.
  void provide(size_t s);
  /// Shard `s` could not be fetched: its waiting readers, and readers until
  /// reset(s), raise FetchError(`why`). No-op on a provided shard.
  void fail(size_t s, const std::string& why);
  /// A failed shard is pending again: its next read demands it. Whether it
  /// was failed.
  bool reset(size_t s);
  /// Releasable gates: gives shard `s` back unless a reader holds it, calling
  /// `unmap` (under the shard's stripe) before it becomes pending. Whether it
  /// did; false, changing nothing, for a shard not provided or pinned.
  bool try_release(size_t s, const std::function<void()>& unmap);
  /// Readers' pins of shard `s` now (0 unless releasable).
  int pins(size_t s) const { return pins_ ? pins_[s].load(std::memory_order_acquire) : 0; }
  /// Shards readers wait for, in the order they first asked.
  std::vector<size_t> demands() const;
  /// Shards provided now, in no particular order. O(provided).
  std::vector<size_t> provided() const;
  size_t provided_count() const;

  /// The gate event: a count to pass to wait(), read before looking.
  uint32_t prepare() const { return event_.prepare(); }
  /// Sleeps until a reader demands a shard or notify() is called after
  /// prepare() returned `seen`, or `deadline`.
  void wait(uint32_t seen, std::chrono::steady_clock::time_point deadline) const {
    event_.wait(seen, deadline);
  }
  void notify() const { event_.notify(); }
  /// Seconds readers have spent waiting for shards to be provided, the waits
  /// in progress included (a statistic: the two counters are read apart).
  double wait_seconds() const {
    const int64_t n = waiting_.load(std::memory_order_relaxed);
    const int64_t since = waiting_since_ns_.load(std::memory_order_relaxed);
    const int64_t live = n > 0 ? n * ns_of(std::chrono::steady_clock::now()) - since : 0;
    return static_cast<double>(wait_ns_.load(std::memory_order_relaxed) +
                               std::max<int64_t>(live, 0)) *
           1e-9;
  }

  int fork_level() const override { return 1; }  // its lists are updated under a stripe
  void before_fork() override;
  void after_fork(bool child) override;

 private:
  void add_provided_locked(size_t s);
  void remove_provided_locked(size_t s);

  std::vector<std::string> names_;
  detail::StripedMutex& stripes_;  // fail_ and the fetcher's state changes
  std::unique_ptr<std::atomic<uint32_t>[]> word_;
  std::unique_ptr<std::atomic<uint32_t>[]> fails_;
  std::unique_ptr<std::atomic<int32_t>[]> pins_;  // null unless releasable
  std::vector<std::string> fail_;                 // guarded by stripes_[s]
  mutable std::mutex list_mu_;
  mutable std::vector<size_t> demand_order_;  // guarded by list_mu_; stale entries dropped lazily
  std::vector<size_t> provided_;              // guarded by list_mu_
  std::vector<int64_t> provided_at_;          // index in provided_, or -1; guarded by list_mu_
  mutable detail::EventCount event_;
  mutable std::atomic<int64_t> wait_ns_{0};
  mutable std::atomic<int64_t> waiting_{0};           // waits in progress
  mutable std::atomic<int64_t> waiting_since_ns_{0};  // the sum of their starts
  static int64_t ns_of(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
};

}  // namespace stoker
