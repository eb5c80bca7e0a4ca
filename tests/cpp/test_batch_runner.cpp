// Running a producer's batches without the core (pipeline/batch_runner.h):
// the same bytes on any number of threads, the lowest failing unit's error,
// and run_batches' counts.
#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "pipeline/batch_runner.h"

using namespace stoker;

namespace {

// Batch k has `units` units of 1000 bytes; unit u writes k * 31 + u + i into byte i.
// Units in `failing` throw, naming themselves.
class Work final : public BatchWork {
 public:
  Work(int64_t k, int units, std::vector<int> failing) : k_(k), failing_(std::move(failing)) {
    this->units = units;
    bytes = static_cast<size_t>(units) * 1000;
  }
  void run(int u, uint8_t* base, WorkerContext&) override {
    for (int f : failing_)
      if (f == u) throw DataError("unit " + std::to_string(u));
    for (int i = 0; i < 1000; ++i) base[u * 1000 + i] = static_cast<uint8_t>(k_ * 31 + u + i);
    ran.fetch_add(1, std::memory_order_relaxed);
  }
  static inline std::atomic<int> ran{0};

 private:
  int64_t k_;
  std::vector<int> failing_;
};

class Plan final : public EpochPlan {
 public:
  int64_t num_batches() const override { return 9; }
};

class Producer final : public BatchProducer {
 public:
  int64_t fail_batch = -1;
  int64_t num_batches(int64_t, int64_t) const override { return 9; }
  int64_t rank_samples(int64_t, int64_t) const override { return 9; }
  int64_t epoch_samples() const override { return 9; }
  int64_t consumed_after(const EpochKey&, int64_t b) const override { return b; }
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey&) const override {
    return std::make_shared<Plan>();
  }
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan&, int64_t k) const override {
    return std::make_unique<Work>(k, 5, k == fail_batch ? std::vector<int>{2} : std::vector<int>{});
  }
};

std::string error_of(Work& w, int threads) {
  BatchBuffer buf(w.bytes);
  try {
    run_units(w, buf.data(), threads);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

void units_on_any_threads() {
  std::vector<std::vector<uint8_t>> outs;
  for (int threads : {1, 2, 7}) {
    Work w(3, 37, {});
    BatchBuffer buf(w.bytes);
    CHECK(reinterpret_cast<uintptr_t>(buf.data()) % 64 == 0);
    Work::ran = 0;
    run_units(w, buf.data(), threads);
    CHECK_EQ(Work::ran.load(), 37);
    outs.emplace_back(buf.data(), buf.data() + w.bytes);
  }
  CHECK(outs[0] == outs[1] && outs[0] == outs[2]);
  CHECK_EQ(outs[0][5 * 1000 + 7], static_cast<uint8_t>(3 * 31 + 5 + 7));
  // The lowest failing unit's error, whatever the threads; every other unit still runs.
  for (int threads : {1, 3, 8}) {
    Work w(0, 20, {17, 4, 11});
    Work::ran = 0;
    CHECK_EQ(error_of(w, threads), std::string("unit 4"));
    CHECK_EQ(Work::ran.load(), 17);
  }
  Work w(0, 2, {});
  BatchBuffer buf(w.bytes);
  CHECK_THROWS(UsageError, run_units(w, buf.data(), 0));
}

void whole_batches() {
  Producer p;
  auto plan = p.plan_epoch(EpochKey{});
  for (int threads : {1, 3}) {
    const RunBatchesResult r = run_batches(p, *plan, 2, 5, threads);
    CHECK_EQ(r.batches, 5);
    CHECK_EQ(r.bytes, 5 * 5000);
    CHECK(r.seconds > 0);
  }
  const RunBatchesResult tail = run_batches(p, *plan, 7, 10, 2);  // only 7 and 8 exist
  CHECK_EQ(tail.batches, 2);
  CHECK_EQ(tail.bytes, 2 * 5000);
  CHECK_EQ(run_batches(p, *plan, 9, 3, 2).batches, 0);
  p.fail_batch = 4;
  CHECK_THROWS(DataError, run_batches(p, *plan, 0, 9, 3));
  CHECK_EQ(run_batches(p, *plan, 5, 4, 2).batches, 4);  // batch 4 not among them
  CHECK_THROWS(UsageError, run_batches(p, *plan, 0, 1, 0));
}

}  // namespace

TEST_MAIN(units_on_any_threads(); whole_batches())
