// The one clock of every stage time, wait and deadline in the core, and its
// conversions: counters hold nanoseconds (int64, summed by relaxed adds),
// reports hold seconds.
#pragma once

#include <chrono>
#include <cstdint>

namespace stoker {

using SteadyClock = std::chrono::steady_clock;

/// Nanoseconds from `a` to `b` (negative if `b` is earlier).
inline int64_t ns_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

/// Nanoseconds from `t0` to now.
inline int64_t ns_since(SteadyClock::time_point t0) { return ns_between(t0, SteadyClock::now()); }

/// A nanosecond count in seconds.
inline double seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

/// Adds the nanoseconds of its scope to `*to` (when `to` is not null) on every
/// exit, errors included: a stage's share of a worker's time.
class ScopedNs {
 public:
  explicit ScopedNs(int64_t* to)
      : to_(to), t0_(to ? SteadyClock::now() : SteadyClock::time_point{}) {}
  ~ScopedNs() {
    if (to_) *to_ += ns_since(t0_);
  }
  ScopedNs(const ScopedNs&) = delete;
  ScopedNs& operator=(const ScopedNs&) = delete;

 private:
  int64_t* to_;
  SteadyClock::time_point t0_;
};

}  // namespace stoker
