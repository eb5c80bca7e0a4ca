// Whether each shard of a deferred dataset may be read yet: a state word per
// shard, readers' pins, the readers' waits, and the fetcher's side (provide,
// fail, release, demands). The Dataset owns one when it is deferred.
//
// NOTE [ Deferred shards ]
// A remote dataset's shards download into a local cache while it is in use.
// Its Dataset is opened `deferred`: every shard starts pending, and a read
// (mapping it on first use) waits until the fetcher calls provide(s), or
// raises FetchError after fail(s). A reader that waits marks the shard
// demanded and fires the gate event, so the fetcher (one thread of the Python
// layer, blocked in wait()) starts the shards that readers wait for ahead of
// its background order: the loader's workers plan and read `prefetch` batches
// ahead, so its demands are the sampler's own future order. The wait is in
// slices: a worker gives up as soon as its stream stops (stop_flag.h), and a
// thread that is not a loader worker is refused at once rather than left to
// block (the Python layer fetches for it first: Dataset.__getitem__).
// Prefetch hints never wait (a shard is not mapped until a read maps it).
//
// NOTE [ Released shards ]
// A releasable dataset (a remote one whose cache is smaller than it) also
// gives shards back: try_release(s) unmaps a provided shard that no reader
// holds and makes it pending again, so the cache may evict its file; a later
// read waits for it and demands it, as for a shard never provided. Readers
// hold a pin (a count per shard) across their use of a shard's bytes. The
// pin and the release meet as a Dekker pair, both sides seq_cst:
//
//   reader:  pins[s] += 1;  then reads gate[s]:  kReady     -> use the mapping
//                                                otherwise  -> pins[s] -= 1, wait, retry
//   release: gate[s]: kReady -> kReleasing;  then reads pins[s]:  0  -> unmap, kPending
//                                                                 >0 -> back to kReady
//
// so either the reader sees kReleasing and keeps off, or the release sees the
// pin and keeps the mapping. A reader that finds kReleasing waits on the word
// like any pending shard.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/detail/event_count.h"

namespace stoker {

class ShardGate {
 public:
  enum State : uint32_t { kPending, kDemanded, kReady, kFailed, kReleasing };

  /// `n` shards, all pending; with `releasable`, readers pin what they read.
  ShardGate(size_t n, bool releasable);
  ShardGate(const ShardGate&) = delete;
  ShardGate& operator=(const ShardGate&) = delete;

  State state(size_t s) const {
    return static_cast<State>(words_[s].load(std::memory_order_acquire));
  }
  bool releasable() const { return pins_ != nullptr; }

  // ---- readers ----
  /// Returns once shard `s` is provided. FetchError after fail(s); Error when
  /// this thread's stream stops meanwhile; UsageError at once for a thread
  /// that is not a loader worker. `path` names the shard in errors.
  void await(size_t s, const std::string& path) const;
  /// Releasable: counts a pin of `s`, then looks (NOTE [ Released shards ]).
  /// True: provided, and the pin is held (give it back with unpin()). False:
  /// not provided, no pin held (await() it, then try again).
  bool try_pin(size_t s) const;
  void unpin(size_t s) const noexcept { pins_[s].fetch_sub(1, std::memory_order_seq_cst); }
  /// Readers' pins of shard `s` now (0 unless releasable).
  int pins(size_t s) const { return pins_ ? pins_[s].load(std::memory_order_acquire) : 0; }
  /// Marks a pending shard demanded and wakes the fetcher; false if it was not pending.
  bool demand(size_t s) const;
  /// Sleeps on shard `s`'s word while it is `v`, at most `slice`.
  void sleep(size_t s, State v, std::chrono::milliseconds slice) const;
  /// Wakes the readers sleeping on shard `s`'s word.
  void wake(size_t s) const;
  /// Adds a reader's wait to wait_seconds().
  void count_wait(std::chrono::steady_clock::duration d) const;

  // ---- the fetcher ----
  /// Shard `s` is local: its readers may map it. Idempotent.
  void provide(size_t s);
  /// Shard `s` cannot be fetched: its readers raise FetchError(`why`).
  void fail(size_t s, const std::string& why);
  /// Releasable: unless a reader holds shard `s` (or it is not provided),
  /// calls `unmap` and makes the shard pending again; else false, nothing changes.
  bool try_release(size_t s, const std::function<void()>& unmap);
  /// Shards that readers are waiting for and that are neither provided nor failed.
  std::vector<size_t> demands() const;
  /// The gate event: a count to pass to wait(), read before demands().
  uint32_t prepare() const { return event_.prepare(); }
  /// Sleeps until a reader demands a shard or notify() is called after
  /// prepare() returned `seen`, or `deadline`.
  void wait(uint32_t seen, std::chrono::steady_clock::time_point deadline) const {
    event_.wait(seen, deadline);
  }
  /// Wakes wait() (the fetcher's own downloads finishing, records asked for).
  void notify() const { event_.notify(); }
  /// Seconds readers have spent waiting for shards.
  double wait_seconds() const {
    return static_cast<double>(wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  }

 private:
  const size_t n_;
  std::unique_ptr<std::atomic<uint32_t>[]> words_;
  std::unique_ptr<std::atomic<int32_t>[]> pins_;  // null unless releasable
  mutable std::mutex mu_;                         // fail_, and try_release() against fail()
  std::vector<std::string> fail_;
  mutable detail::EventCount event_;
  mutable std::atomic<int64_t> wait_ns_{0};
};

}  // namespace stoker
