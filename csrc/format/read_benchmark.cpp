#include "format/read_benchmark.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/stream_copy.h"
#include "format/record_prefetch.h"

namespace stoker {

double random_read_rate(const Dataset& ds, int threads, bool verify, int rounds) {
  STOKER_CHECK(threads >= 1 && rounds >= 1, UsageError, "threads and rounds must be >= 1");
  const int64_t n = ds.size();
  if (n == 0) return 0;
  std::vector<Dataset::ShardPin> held;  // mapped (and held) first
  for (size_t s = 0; s < ds.num_shards(); ++s) held.push_back(ds.pin(s));
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(7);
  std::vector<double> rates;
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    std::exception_ptr error;
    std::mutex error_mu;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        // Records are copied into batch-sized buffers that rotate as a loader's
        // slots do (kSlots batches of kBatch records), with the loader's copy
        // (stream_copy), so the writes cost what a loader's writes cost.
        constexpr size_t kBatch = 256, kSlots = 6;
        std::vector<uint8_t> out;
        size_t slot_record = 0, at = 0;
        try {
          for (size_t i = static_cast<size_t>(t); i < order.size();
               i += static_cast<size_t>(threads)) {
            // The sample writer's prefetches: pages two records ahead, lines of
            // the next record while copying this one.
            const size_t step = static_cast<size_t>(threads);
            if (i + 2 * step < order.size()) prefetch_record(ds, order[i + 2 * step]);
            RecordView next;
            if (i + step < order.size()) {
              const Dataset::Location l = ds.locate(order[i + step]);
              next = ds.shard(l.shard).record_unchecked_or_empty(l.record);
            }
            const Dataset::Location loc = ds.locate(order[i]);
            const RecordView rec = verify ? ds.shard(loc.shard).record(loc.record)
                                          : ds.shard(loc.shard).record_unchecked(loc.record);
            if (out.empty()) out.resize(kBatch * kSlots * (rec.size + 64));
            if (at + rec.size > out.size() || slot_record == kBatch * kSlots) at = slot_record = 0;
            stream_copy(out.data() + at, rec.data, rec.size, next.data, next.size);
            at += rec.size;
            ++slot_record;
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!error) error = std::current_exception();
        }
      });
    for (auto& th : pool) th.join();
    if (error) std::rethrow_exception(error);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(n) / sec);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace stoker
