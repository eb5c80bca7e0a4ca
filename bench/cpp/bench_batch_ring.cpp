// BatchRing (csrc/pipeline/batch_ring.h) against a mutex + condition_variable
// ring of the same capacity and the same contract (positions claimed by any
// producer, published in any order, taken in order by one consumer), in one
// run, with the ratios. Two measurements:
//
//  * hand-off latency: the consumer waits for position p; one producer stamps
//    the time and publishes p; the consumer stamps the time it returns. The
//    producer starts p only after the consumer took p - 1, plus a gap: a
//    quarter of the measured spin window (the consumer is still spinning) or
//    200 us (it is asleep). Both rings
//    spin the same number of times before they sleep (the mutex ring spins
//    with try_lock), so what differs is how they hand off and wake.
//  * throughput: items per second through the ring, 1 and 2 producers.
//
// Ceilings in the same run: a BatchRing that never sleeps (spins forever: the
// cost of the cache-line hand-off itself) and, for a sleeping consumer, a
// bare futex wait/wake pair (the kernel's wake-up).
//
// Build: cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release
//          -DSTOKER_BUILD_PYTHON=OFF -DSTOKER_BUILD_BENCH=ON && cmake --build build/bench
// Run:   build/bench/bench_batch_ring [--quick]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/detail/futex.h"
#include "pipeline/batch_ring.h"

namespace {

using Clock = std::chrono::steady_clock;
using stoker::BatchRing;
namespace detail = stoker::detail;

constexpr int kSpins = 64;  // BatchRing's default
constexpr size_t kCapacity = 8;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void spin_until(int64_t t_ns) {
  while (now_ns() < t_ns) detail::cpu_relax();
}

/// The peer: the same contract with a mutex and two condition variables.
/// Waits spin `spins` times on try_lock before they block, like BatchRing's.
template <typename T>
class MutexRing {
 public:
  MutexRing(size_t capacity, int spins) : n_(capacity), spins_(spins), slots_(capacity) {
    for (size_t i = 0; i < n_; ++i) slots_[i].ready = -1;
  }
  T& at(int64_t p) { return slots_[static_cast<size_t>(p) % n_].value; }

  /// Waits until position p may be filled (p < consumed + capacity).
  void wait_free(int64_t p) {
    if (spin([&] { return p < consumed_ + static_cast<int64_t>(n_); })) return;
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return p < consumed_ + static_cast<int64_t>(n_); });
  }
  void publish(int64_t p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[static_cast<size_t>(p) % n_].ready = p;
    }
    ready_.notify_one();  // one consumer
  }
  void wait_ready(int64_t p) {
    if (spin([&] { return slots_[static_cast<size_t>(p) % n_].ready == p; })) return;
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return slots_[static_cast<size_t>(p) % n_].ready == p; });
  }
  void release(int64_t p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[static_cast<size_t>(p) % n_].ready = -1;
      consumed_ = p + 1;
    }
    not_full_.notify_all();  // the producer of p + N, whichever it is
  }

 private:
  struct Slot {
    int64_t ready;  // the position published here, or -1
    T value{};
  };
  template <typename Pred>
  bool spin(Pred pred) {
    for (int i = 0; i < spins_; ++i) {
      if (mu_.try_lock()) {
        const bool ok = pred();
        mu_.unlock();
        if (ok) return true;
      }
      detail::cpu_relax();
    }
    return false;
  }
  const size_t n_;
  const int spins_;
  std::mutex mu_;
  std::condition_variable ready_, not_full_;
  std::vector<Slot> slots_;  // guarded by mu_ (values: by the hand-off)
  int64_t consumed_ = 0;     // guarded by mu_
};

/// One interface over both rings, for the harness.
struct LockFree {
  BatchRing<int64_t> ring;
  explicit LockFree(int spins) : ring(kCapacity, spins) {}
  void produce(int64_t p, int64_t v) {
    const auto far = Clock::now() + std::chrono::hours(1);
    while (ring.wait_free(p, far) != BatchRing<int64_t>::Wait::kOk) {
    }
    if (!ring.try_claim(p)) std::abort();
    ring.at(p) = v;
    ring.publish(p);
  }
  int64_t consume(int64_t p) {
    const auto far = Clock::now() + std::chrono::hours(1);
    while (ring.wait_ready(p, far) != BatchRing<int64_t>::Wait::kOk) {
    }
    const int64_t v = ring.at(p);
    ring.release(p);
    return v;
  }
};

struct Locked {
  MutexRing<int64_t> ring;
  explicit Locked(int spins) : ring(kCapacity, spins) {}
  void produce(int64_t p, int64_t v) {
    ring.wait_free(p);
    ring.at(p) = v;
    ring.publish(p);
  }
  int64_t consume(int64_t p) {
    ring.wait_ready(p);
    const int64_t v = ring.at(p);
    ring.release(p);
    return v;
  }
};

/// The kernel's floor for waking a sleeper: a bare futex wait/wake.
struct BareFutex {
  std::atomic<uint32_t> word{0};
  std::atomic<int64_t> stamp{0};
  void produce(int64_t p, int64_t v) {
    stamp.store(v, std::memory_order_relaxed);
    word.store(static_cast<uint32_t>(p + 1), std::memory_order_seq_cst);
    detail::futex_wake(word);
  }
  int64_t consume(int64_t p) {
    const auto want = static_cast<uint32_t>(p + 1);
    for (uint32_t cur; (cur = word.load(std::memory_order_seq_cst)) != want;)
      detail::futex_wait(word, cur, std::chrono::milliseconds(100));
    return stamp.load(std::memory_order_relaxed);
  }
};

struct Latency {
  double median_ns = 0, p99_ns = 0;
};

/// The consumer waits for p; the producer publishes it `gap` after the
/// consumer took p - 1, stamping the time in the value.
template <typename Ring>
Latency hand_off_latency(Ring& ring, int samples, int64_t gap_ns) {
  std::atomic<int64_t> taken{-1};
  std::thread producer([&] {
    for (int64_t p = 0; p < samples; ++p) {
      while (taken.load(std::memory_order_acquire) < p - 1) detail::cpu_relax();
      spin_until(now_ns() + gap_ns);
      ring.produce(p, now_ns());
    }
  });
  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(samples));
  for (int64_t p = 0; p < samples; ++p) {
    const int64_t stamp = ring.consume(p);
    lat.push_back(static_cast<double>(now_ns() - stamp));
    taken.store(p, std::memory_order_release);
  }
  producer.join();
  const size_t warm = lat.size() / 20;  // the first few: threads still starting
  std::vector<double> v(lat.begin() + static_cast<std::ptrdiff_t>(warm), lat.end());
  std::sort(v.begin(), v.end());
  return Latency{v[v.size() / 2], v[v.size() * 99 / 100]};
}

/// Items per second, `producers` threads taking positions from a counter.
template <typename Ring>
double throughput(Ring& ring, int producers, int64_t items) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t)
    threads.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) detail::cpu_relax();
      for (;;) {
        const int64_t p = next.fetch_add(1, std::memory_order_relaxed);
        if (p >= items) return;
        ring.produce(p, p);
      }
    });
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  int64_t sum = 0;
  for (int64_t p = 0; p < items; ++p) sum += ring.consume(p);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : threads) t.join();
  if (sum != items * (items - 1) / 2) {
    std::fprintf(stderr, "wrong values through the ring\n");
    std::exit(1);
  }
  return static_cast<double>(items) / s;
}

/// How long a wait spins before it sleeps: kSpins looks at a word.
int64_t spin_window_ns() {
  std::atomic<uint32_t> w{0};
  const int reps = 20000;
  const int64_t t0 = now_ns();
  for (int r = 0; r < reps; ++r)
    for (int i = 0; i < kSpins; ++i) {
      if (w.load(std::memory_order_acquire) == 7) std::abort();
      detail::cpu_relax();
    }
  return (now_ns() - t0) / reps;
}

template <typename Make>
Latency best_latency(Make make, int samples, int64_t gap_ns, int rounds) {
  // Median over rounds of each statistic: one noisy round does not decide.
  std::vector<double> med, p99;
  for (int r = 0; r < rounds; ++r) {
    auto ring = make();
    const Latency l = hand_off_latency(*ring, samples, gap_ns);
    med.push_back(l.median_ns);
    p99.push_back(l.p99_ns);
  }
  std::sort(med.begin(), med.end());
  std::sort(p99.begin(), p99.end());
  return Latency{med[med.size() / 2], p99[p99.size() / 2]};
}

template <typename Make>
double median_throughput(Make make, int producers, int64_t items, int rounds) {
  std::vector<double> v;
  for (int r = 0; r < rounds; ++r) {
    auto ring = make();
    v.push_back(throughput(*ring, producers, items));
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int rounds = quick ? 1 : 3;
  const int64_t items = quick ? 200000 : 2000000;
  auto lock_free = [] { return std::make_unique<LockFree>(kSpins); };
  auto spin_only = [] { return std::make_unique<LockFree>(INT_MAX); };
  auto locked = [] { return std::make_unique<Locked>(kSpins); };
  auto futex = [] { return std::make_unique<BareFutex>(); };

  std::printf(
      "BatchRing vs a mutex+condition_variable ring: capacity %zu, %d spins (%lld ns) "
      "before sleeping, %u CPUs, median of %d rounds\n\n",
      kCapacity, kSpins, static_cast<long long>(spin_window_ns()),
      std::thread::hardware_concurrency(), rounds);
  std::printf("hand-off latency, ns (consumer waiting, 1 producer)  %10s %10s %8s  %s\n",
              "BatchRing", "mutex+cv", "cv/ring", "ceiling");
  struct Gap {
    std::string name;
    int64_t ns;
    int samples;
  };
  const int64_t window = spin_window_ns();
  const int64_t short_gap = std::max<int64_t>(window / 4, 50);
  for (const Gap& g :
       {Gap{"gap " + std::to_string(short_gap) + " ns (spinning)", short_gap, quick ? 5000 : 20000},
        Gap{"gap 200 us (consumer asleep)", 200000, quick ? 500 : 2000}}) {
    const Latency a = best_latency(lock_free, g.samples, g.ns, rounds);
    const Latency b = best_latency(locked, g.samples, g.ns, rounds);
    const bool asleep = g.ns > 100000;
    const Latency c = asleep ? best_latency(futex, g.samples, g.ns, rounds)
                             : best_latency(spin_only, g.samples, g.ns, rounds);
    const char* ceiling = asleep ? "bare futex" : "spin-only ring";
    std::printf("  %-30s median %10.0f %10.0f %7.2fx  %8.0f (%s)\n", g.name.c_str(), a.median_ns,
                b.median_ns, b.median_ns / a.median_ns, c.median_ns, ceiling);
    std::printf("  %-30s p99    %10.0f %10.0f %7.2fx  %8.0f\n", "", a.p99_ns, b.p99_ns,
                b.p99_ns / a.p99_ns, c.p99_ns);
  }
  std::printf("\nthroughput, items/s (%lld items)                    %10s %10s %8s  %s\n",
              static_cast<long long>(items), "BatchRing", "mutex+cv", "ring/cv",
              "ceiling (spin-only ring)");
  for (int producers : {1, 2}) {
    const double a = median_throughput(lock_free, producers, items, rounds);
    const double b = median_throughput(locked, producers, items, rounds);
    std::printf("  %d producer%s %36s %10.3g %10.3g %7.2fx", producers, producers > 1 ? "s" : " ",
                "", a, b, a / b);
    // Spinning threads only make sense with a CPU each.
    if (std::thread::hardware_concurrency() >= static_cast<unsigned>(producers) + 1) {
      const double c = median_throughput(spin_only, producers, items, rounds);
      std::printf("  %10.3g (ring at %.0f%%)\n", c, 100.0 * a / c);
    } else {
      std::printf("  n/a (%d threads, %u CPUs)\n", producers + 1,
                  std::thread::hardware_concurrency());
    }
  }
  return 0;
}
