// The stop flag of the work a thread is doing, for code far below the loop that
// checks it. A loader worker binds its stream's flag while it runs a unit; a
// wait deep in the format layer (a shard still downloading) checks it between
// slices, so that stopping a stream never waits for the network.
#pragma once

#include <atomic>

namespace stoker {

namespace detail {
inline thread_local const std::atomic<bool>* t_stop = nullptr;
}  // namespace detail

/// Whether this thread has a stop flag (it is a loader worker running a unit).
inline bool stop_bound() noexcept { return detail::t_stop != nullptr; }

/// Whether this thread's bound stop flag is set.
inline bool stop_requested() noexcept {
  const std::atomic<bool>* f = detail::t_stop;
  return f && f->load(std::memory_order_acquire);
}

/// Binds a flag for a scope, restoring the previous one after.
class ScopedStop {
 public:
  explicit ScopedStop(const std::atomic<bool>* flag) noexcept : prev_(detail::t_stop) {
    detail::t_stop = flag;
  }
  ~ScopedStop() { detail::t_stop = prev_; }
  ScopedStop(const ScopedStop&) = delete;
  ScopedStop& operator=(const ScopedStop&) = delete;

 private:
  const std::atomic<bool>* prev_;
};

}  // namespace stoker
