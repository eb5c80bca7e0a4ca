#include "pipeline/batch_runner.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/error.h"

namespace stoker {

BatchBuffer::BatchBuffer(size_t bytes) : size_(bytes) {
  data_ = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64));
  if (!data_) throw std::bad_alloc();
}

BatchBuffer::~BatchBuffer() { std::free(data_); }

void run_units(BatchWork& w, uint8_t* base, int threads) {
  STOKER_CHECK(threads >= 1, UsageError, "threads must be >= 1, got ", threads);
  std::atomic<int> next{0};
  std::exception_ptr error;
  int error_unit = INT_MAX;
  std::mutex mu;
  auto loop = [&] {
    WorkerContext ctx;
    for (int u; (u = next.fetch_add(1, std::memory_order_relaxed)) < w.units;) {
      try {
        w.run(u, base, ctx);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (u < error_unit) error_unit = u, error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, w.units); ++t) pool.emplace_back(loop);
  loop();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  WorkerContext ctx;
  w.finish(base, ctx);
}

RunBatchesResult run_batches(const BatchProducer& producer, const EpochPlan& plan, int64_t first,
                             int64_t count, int threads) {
  STOKER_CHECK(threads >= 1, UsageError, "threads must be >= 1, got ", threads);
  const int64_t end = std::min(plan.num_batches(), first + count);
  std::atomic<int64_t> next{first}, out_bytes{0};
  std::exception_ptr error;
  std::mutex mu;
  const auto t0 = SteadyClock::now();
  auto loop = [&] {
    std::unique_ptr<BatchBuffer> buf;
    WorkerContext ctx;
    try {
      for (int64_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < end;) {
        auto w = producer.plan_batch(plan, k);
        if (!buf || buf->size() < w->bytes) buf = std::make_unique<BatchBuffer>(w->bytes);
        for (int u = 0; u < w->units; ++u) w->run(u, buf->data(), ctx);
        w->finish(buf->data(), ctx);
        out_bytes.fetch_add(static_cast<int64_t>(w->bytes), std::memory_order_relaxed);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      next.store(end, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(loop);
  loop();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return {std::max<int64_t>(0, end - first), out_bytes.load(std::memory_order_relaxed),
          seconds(ns_since(t0))};
}

}  // namespace stoker
