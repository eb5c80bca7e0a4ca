// A worker that waits for something other than a core (a shard that is still
// downloading) says so, for the pool it belongs to: the pool lets a parked
// worker take its turn meanwhile, and counts the time as waiting, not as work
// (NOTE [ Autotuning ] in pipeline/autotuner.h). Like the stop flag and the
// activity slot, the listener is bound per thread, so a wait deep in the
// format layer reaches it without knowing the pipeline.
#pragma once

#include <chrono>
#include <cstdint>

namespace stoker {

class BlockingListener {
 public:
  /// The calling thread starts waiting.
  virtual void blocked() noexcept = 0;
  /// ... and is done waiting.
  virtual void unblocked() noexcept = 0;

 protected:
  ~BlockingListener() = default;
};

namespace detail {
inline thread_local BlockingListener* t_blocking = nullptr;
inline thread_local int64_t t_blocked_ns = 0;
}  // namespace detail

/// Binds `l` (null: none) as this thread's listener.
inline void bind_blocking(BlockingListener* l) noexcept { detail::t_blocking = l; }

/// Nanoseconds this thread has spent in ScopedBlocked waits; taken (reset to 0).
inline int64_t take_blocked_ns() noexcept {
  const int64_t ns = detail::t_blocked_ns;
  detail::t_blocked_ns = 0;
  return ns;
}

/// Marks a wait for a scope (nothing happens on a thread without a listener).
class ScopedBlocked {
 public:
  ScopedBlocked() noexcept : l_(detail::t_blocking) {
    if (l_) {
      t0_ = std::chrono::steady_clock::now();
      l_->blocked();
    }
  }
  ~ScopedBlocked() {
    if (!l_) return;
    l_->unblocked();
    detail::t_blocked_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
            .count();
  }
  ScopedBlocked(const ScopedBlocked&) = delete;
  ScopedBlocked& operator=(const ScopedBlocked&) = delete;

 private:
  BlockingListener* l_;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace stoker
