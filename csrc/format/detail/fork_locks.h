// Locks of the format layer that a fork() must not catch half-held.
//
// NOTE [ Locks across fork ]
// fork() copies one thread into the child with every mutex as it was: a lock
// that another thread held at that instant stays held forever in the child,
// whose first read (or exit) then hangs on it. So every mutex a format-layer
// reader or the fetcher may hold is registered here, and one pthread_atfork
// handler takes them all before the fork and gives them back on both sides:
//
//   fork() in thread T                    clients (registration order)
//   ------------------                    ---------------------------
//   prepare: lock the registry            each client's before_fork(): lock
//            before_fork() of each        its mutexes (a stripe set: all 64)
//            lock the mapping registry    (mapped_file.cpp), taken last
//   fork
//   parent:  after_fork(false), unlock    the same locks released
//   child:   after_fork(true),  unlock    released, then the child's own
//                                         cleanup (ShardGate: no thread of the
//                                         child holds a pin or waits)
//
// Lock order: clients are locked by level, lowest first, and the registry of
// mappings last. A thread may hold a stripe (level 0) while it takes a level-1
// client's mutex (the gate's lists, updated with a shard's state) or the
// registry of mappings (a shard mapped under its stripe); never the reverse.
// A fork waits at most for the longest such critical section (mapping and
// validating one shard).
#pragma once

#include <array>
#include <cstddef>
#include <mutex>

namespace stoker::detail {

class ForkClient {
 public:
  /// Clients of a lower level are locked first (see the lock order above).
  virtual int fork_level() const { return 0; }
  /// Takes every lock of this client (called with the registry locked).
  virtual void before_fork() = 0;
  /// Releases them; `child` is true in the new process.
  virtual void after_fork(bool child) = 0;

 protected:
  ForkClient() = default;
  ~ForkClient() = default;
  ForkClient(const ForkClient&) = delete;
  ForkClient& operator=(const ForkClient&) = delete;
};

/// Adds a client (installs the atfork handler on first use); remove it before
/// it is destroyed.
void add_fork_client(ForkClient* c);
void remove_fork_client(ForkClient* c);

/// A fixed set of mutexes, one per stripe of shards (shard s uses s % kStripes),
/// that fork() leaves unheld.
class StripedMutex final : public ForkClient {
 public:
  static constexpr size_t kStripes = 64;
  StripedMutex() { add_fork_client(this); }
  ~StripedMutex() { remove_fork_client(this); }

  std::mutex& operator[](size_t s) { return mu_[s % kStripes]; }

  void before_fork() override {
    for (auto& m : mu_) m.lock();
  }
  void after_fork(bool) override {
    for (auto& m : mu_) m.unlock();
  }

 private:
  std::array<std::mutex, kStripes> mu_;
};

}  // namespace stoker::detail
