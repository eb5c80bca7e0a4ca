#include "stage/python_handoff.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "producers/batch_planner.h"
#include "stage/python_producer.h"

namespace stoker {

PythonTask::PythonTask(uint64_t id, std::shared_ptr<HandedOffBatch> batch, int64_t chunk_samples,
                       int64_t batch_size, std::shared_ptr<LoaderStats> stats)
    : id(id), batch_(std::move(batch)), stats_(std::move(stats)) {
  // The planned batch is freed with its stream: copy what the stage needs.
  const BatchWork& w = batch_->work();
  if (const auto* b = dynamic_cast<const PythonBatch*>(&w)) {
    indices = b->indices;
  } else if (const auto* r = dynamic_cast<const RecordBatch*>(&w)) {
    indices = r->indices;  // a whole record batch, for batch_map: one chunk
    tensors = w.tensors;
    memory = batch_->memory();
    bytes = w.bytes;
    chunk_samples = std::max<int64_t>(1, static_cast<int64_t>(indices.size()));
  } else {
    STOKER_THROW(Error, "internal: the Python stage got a batch it cannot read");
  }
  epoch = w.key.epoch;
  rank = w.key.rank;
  world_size = w.key.world_size;
  stream = batch_->stream_id();
  offset = w.key.offset;
  number =
      w.key.offset / (std::max<int64_t>(1, batch_size) * std::max<int64_t>(1, w.key.world_size)) +
      w.index;
  chunk_samples_ = std::max<int64_t>(1, chunk_samples);
  // An empty batch is one empty chunk: its thread still assembles it.
  chunks_ =
      static_cast<int>(std::max<int64_t>(1, (samples() + chunk_samples_ - 1) / chunk_samples_));
}

bool PythonTask::claim(int64_t& lo, int64_t& hi) {
  if (next_ >= chunks_) return false;
  lo = std::min(samples(), static_cast<int64_t>(next_) * chunk_samples_);
  hi = std::min(samples(), lo + chunk_samples_);
  ++next_;
  return true;
}

bool PythonTask::chunk_done() {
  return done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks_;
}

void PythonTask::add_times(const PythonTimes& t) {
  bytes_read_.fetch_add(t.bytes, std::memory_order_relaxed);
  if (!stats_) return;
  LoaderStats& s = *stats_;
  s.python_ns.fetch_add(t.python_ns, std::memory_order_relaxed);
  s.python_cpu_ns.fetch_add(t.cpu_ns, std::memory_order_relaxed);
  s.python_wait_ns.fetch_add(t.wait_ns, std::memory_order_relaxed);
  // The stage's threads are the loader's workers for this batch.
  s.worker_busy_ns.fetch_add(t.python_ns + t.read_ns + t.decode_ns + t.ops_ns,
                             std::memory_order_relaxed);
  s.add(StageTimes{t.read_ns, t.decode_ns, t.ops_ns, t.bytes});
}

void PythonTask::complete(std::vector<TensorDesc> tensors, size_t bytes, uint64_t ticket,
                          int64_t skipped) {
  batch_->complete(std::move(tensors), bytes, ticket, skipped,
                   bytes_read_.load(std::memory_order_relaxed));
}

void PythonTask::fail(uint64_t ticket, const std::string& message) {
  // Made in a statement of its own: the temporary the exception is copied from shares its
  // message (libstdc++'s exception strings are reference-counted) and must be gone before
  // fail() publishes the batch, not released by this thread while the reader handles it.
  std::exception_ptr error = std::make_exception_ptr(PythonStageError(ticket, message));
  batch_->fail(std::move(error));
}

PythonHandoff::PythonHandoff(int64_t chunk_samples, int64_t batch_size)
    : chunk_samples_(std::max<int64_t>(1, chunk_samples)), batch_size_(batch_size) {}

void PythonHandoff::set_stats(std::shared_ptr<LoaderStats> stats) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = std::move(stats);
}

void PythonHandoff::hand_off(std::shared_ptr<HandedOffBatch> batch) {
  if (closed()) return;  // dropped: its handle fails nothing on a stopped stream
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto task = std::make_shared<PythonTask>(next_id_++, std::move(batch), chunk_samples(),
                                             batch_size_, stats_);
    // In the order the consumer reads them: the pool's workers may finish
    // batch p + 1 before batch p, and take() serves the front first.
    auto before = [&task](const std::shared_ptr<PythonTask>& q) {
      return task->epoch < q->epoch || (task->epoch == q->epoch && task->number < q->number);
    };
    auto at = queue_.end();
    while (at != queue_.begin() && before(*std::prev(at))) --at;
    queue_.insert(at, std::move(task));
  }
  ready_.notify();
}

bool PythonHandoff::take(Chunk& out, Clock::time_point deadline) {
  for (;;) {
    const uint32_t seen = ready_.prepare();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed()) return false;
      // Oldest first: every thread helps with the batch the consumer needs next;
      // a batch whose stream has an earlier one still with the workers waits for
      // it (NOTE [ Hand-off order ] in pipeline/stream.cpp), and so do the later
      // batches of that stream.
      while (!queue_.empty() && queue_.front()->stopped()) queue_.pop_front();
      uint64_t held = 0;  // the stream found waiting (ids start at 1)
      for (auto it = queue_.begin(); it != queue_.end();) {
        PythonTask& t = **it;
        if (t.stopped()) {
          it = queue_.erase(it);
          continue;
        }
        if (t.stream == held || (t.fresh() && !t.earlier_passed())) {
          held = t.stream;
          ++it;
          continue;
        }
        if (t.claim(out.lo, out.hi)) {
          out.task = *it;
          if (t.fully_claimed()) queue_.erase(it);  // its last chunk is taken
          return true;
        }
        ++it;
      }
    }
    if (Clock::now() >= deadline) return false;
    ready_.wait(seen, deadline);
  }
}

void PythonHandoff::close() {
  std::deque<std::shared_ptr<PythonTask>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.store(true, std::memory_order_release);
    dropped.swap(queue_);
  }
  ready_.notify();
}

size_t PythonHandoff::drop_stopped() {
  std::vector<std::shared_ptr<PythonTask>> dropped;  // freed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->stopped()) {
      dropped.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped.size();
}

size_t PythonHandoff::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace stoker
