#include "pipeline/loader_engine.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "sampler/permutation.h"

namespace stoker {

namespace {

// NOTE [ Worker scheduling ]
// Workers are throughput threads; the thread that consumes batches (a training
// loop launching GPU work) is the one whose latency counts. Under SCHED_BATCH a
// worker gets the same CPU share as under SCHED_OTHER at the same nice value,
// but never preempts the thread that wakes it: next() wakes the workers waiting
// for window space, and on a machine whose cores all run workers the woken one
// used to preempt the consumer for a scheduler slice, right inside next()
// (measured 2-5 ms at most epochs' first batch on a 2-core VM, bench_stall.py).
// Best effort: where the policy is refused the worker runs as before.
void use_batch_scheduling() {
#ifdef SCHED_BATCH
  sched_param sp{};
  sp.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
}

using Clock = std::chrono::steady_clock;

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

constexpr size_t kTensorAlign = 64;
size_t align_up(size_t n) { return (n + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

// Adds "<file>: record <r> (sample <i>)" to an error from reading or decoding.
[[noreturn]] void rethrow_with_context(const Dataset& ds, int64_t index, const std::string& field) {
  Dataset::Location loc = ds.locate(index);
  const std::string& path = ds.shard(loc.shard).path();
  std::string where = field.empty() ? std::string() : ", field '" + field + "'";
  try {
    throw;
  } catch (const DecodeError& e) {
    STOKER_THROW(DecodeError, path, ": record ", loc.record, " (sample ", index, where, "): ",
                 e.what());
  } catch (const DataError& e) {
    std::string msg = e.what();
    if (msg.rfind(path, 0) == 0) throw;  // already names the file and record
    STOKER_THROW(DataError, path, ": record ", loc.record, " (sample ", index, where, "): ", msg);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    STOKER_THROW(DataError, path, ": record ", loc.record, " (sample ", index, where, "): ",
                 e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Engine

std::shared_ptr<Engine> Engine::create(std::shared_ptr<const Dataset> ds, EngineOptions opts) {
  return std::shared_ptr<Engine>(new Engine(std::move(ds), std::move(opts)));
}

Engine::Engine(std::shared_ptr<const Dataset> ds, EngineOptions opts)
    : ds_(std::move(ds)),
      opts_(std::move(opts)),
      sampler_(ds_->size(), opts_.sampler),
      stats_(std::make_shared<EngineStats>()) {
  STOKER_CHECK(opts_.num_threads >= 1, UsageError, "num_threads must be >= 1, got ",
               opts_.num_threads);
  STOKER_CHECK(opts_.prefetch >= 1, UsageError, "prefetch must be >= 1, got ", opts_.prefetch);
  if (!opts_.allocator) opts_.allocator = default_host_allocator();
  // Slots in flight are at most `prefetch`; keep a few more free for the
  // batches the consumer holds while the next ones are assembled.
  pool_ = SlotPool::create(opts_.allocator, static_cast<size_t>(opts_.prefetch) + 2);
  const Schema& schema = ds_->schema();
  for (const auto& [name, spec] : opts_.images) {
    size_t f = schema.index_of(name);
    STOKER_CHECK(schema.fields[f].kind == FieldKind::kImage, UsageError, "field '", name,
                 "' is not an image field; image ops apply to stoker.image() fields only");
  }
  for (const FieldSpec& f : schema.fields) {
    if (f.kind != FieldKind::kImage) {
      pipelines_.emplace_back();
      continue;
    }
    auto it = opts_.images.find(f.name);
    pipelines_.push_back(
        std::make_unique<ImagePipeline>(it != opts_.images.end() ? it->second : ImageFieldSpec{}));
  }
}

std::unique_ptr<Iteration> Engine::start(uint64_t epoch, int64_t first_batch, int held) {
  STOKER_CHECK(first_batch >= 0 && first_batch <= num_batches(), UsageError, "start batch ",
               first_batch, " outside [0, ", num_batches(), "]");
  STOKER_CHECK(held >= 0 && held <= opts_.prefetch, UsageError, "held ", held,
               " outside [0, prefetch=", opts_.prefetch, "]");
  return std::unique_ptr<Iteration>(
      new Iteration(shared_from_this(), epoch, first_batch, num_batches(), held));
}

// ---------------------------------------------------------------------------
// Iteration

Iteration::Iteration(std::shared_ptr<Engine> engine, uint64_t epoch, int64_t first, int64_t end,
                     int held)
    : engine_(std::move(engine)),
      ds_(*engine_->ds_),
      order_(engine_->sampler_.epoch(epoch)),
      epoch_(epoch),
      seed_(hash_combine(engine_->opts_.sampler.seed, epoch)),
      first_(first),
      end_(end),
      chunk_size_(std::max<int64_t>(
          1, (engine_->opts_.sampler.batch_size + 4 * engine_->opts_.num_threads - 1) /
                 (4 * engine_->opts_.num_threads))),
      chunks_per_batch_((engine_->opts_.sampler.batch_size + chunk_size_ - 1) / chunk_size_),
      total_tasks_((end - first) * chunks_per_batch_),
      prefetch_(engine_->opts_.prefetch),
      pid_(static_cast<int>(::getpid())),
      consumed_(first),
      held_(held) {
  for (int i = 0; i < prefetch_; ++i) jobs_.push_back(std::make_unique<Job>());
  const int threads = static_cast<int>(
      std::min<int64_t>(engine_->opts_.num_threads, std::max<int64_t>(total_tasks_, 1)));
  if (total_tasks_ == 0) return;
  live_workers_.store(threads, std::memory_order_release);
  try {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (...) {
    live_workers_.fetch_sub(threads - static_cast<int>(workers_.size()),
                            std::memory_order_acq_rel);
    stop();
    throw;
  }
}

Iteration::~Iteration() { stop(); }

void Iteration::stop() {
  stop_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> l1(space_mu_);
    space_cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> l2(ready_mu_);
    ready_cv_.notify_all();
  }
  if (static_cast<int>(::getpid()) != pid_) {
    // Forked child: these threads do not exist here; joining would wait forever
    // and destroying a joinable std::thread would abort. Leave them be.
    for (auto& t : workers_) new std::thread(std::move(t));
    workers_.clear();
    return;
  }
  for (auto& t : workers_)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  workers_.clear();
}

int Iteration::ready_batches() const {
  int n = 0;
  for (const auto& j : jobs_) n += j->ready.load(std::memory_order_acquire) ? 1 : 0;
  return n;
}

void Iteration::worker_loop(int id) {
  use_batch_scheduling();  // before the name: a named worker is already SCHED_BATCH
  char name[16];
  std::snprintf(name, sizeof name, "stoker-worker-%d", id);
  pthread_setname_np(pthread_self(), name);
  EngineStats& stats = *engine_->stats_;
  while (!stop_.load(std::memory_order_acquire)) {
    const int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= total_tasks_) break;
    const int64_t k = first_ + t / chunks_per_batch_;
    const int64_t chunk = t % chunks_per_batch_;
    auto t0 = Clock::now();
    if (!wait_for_space(k)) break;
    stats.worker_idle_ns.fetch_add(ns_since(t0), std::memory_order_relaxed);
    Job& job = *jobs_[static_cast<size_t>(k % prefetch_)];
    bool ok;
    {
      std::lock_guard<std::mutex> lock(job.mu);
      if (job.batch != k) {
        auto tp = Clock::now();
        job.batch = k;
        try {
          prepare(job, k);
        } catch (...) {
          job.error = std::current_exception();
          job.error_pos = -1;
        }
        stats.prepare_ns.fetch_add(ns_since(tp), std::memory_order_relaxed);
      }
      ok = !job.error;
    }
    if (ok) run_chunk(job, k, chunk);
    finish_chunk(job);
  }
  live_workers_.fetch_sub(1, std::memory_order_acq_rel);
}

bool Iteration::wait_for_space(int64_t k) {
  auto has_space = [&] {
    return k < consumed_.load(std::memory_order_acquire) + prefetch_ -
                   held_.load(std::memory_order_acquire);
  };
  if (has_space()) return true;
  std::unique_lock<std::mutex> lock(space_mu_);
  while (!stop_.load(std::memory_order_acquire)) {
    if (has_space()) return true;
    space_cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  return false;
}

void Iteration::release_held(int n) {
  STOKER_CHECK(n >= 0, UsageError, "release_held: n must be >= 0, got ", n);
  int cur = held_.load(std::memory_order_acquire);
  while (!held_.compare_exchange_weak(cur, std::max(0, cur - n), std::memory_order_acq_rel)) {
  }
  std::lock_guard<std::mutex> lock(space_mu_);
  space_cv_.notify_all();
}

void Iteration::prepare(Job& job, int64_t k) {
  const Sampler& sampler = engine_->sampler_;
  const Schema& schema = ds_.schema();
  const int64_t len = sampler.batch_length(k);
  job.indices.resize(static_cast<size_t>(len));
  for (int64_t p = 0; p < len; ++p) job.indices[static_cast<size_t>(p)] = order_.index(k, p);
  job.error = nullptr;
  job.error_pos = INT64_MAX;
  job.skipped.store(0, std::memory_order_relaxed);
  job.bytes.store(0, std::memory_order_relaxed);
  job.chunks_left.store(static_cast<int>(chunks_per_batch_), std::memory_order_relaxed);

  HostBatch& hb = job.batch_out;
  hb = HostBatch{};
  hb.index = k;
  job.plans.assign(schema.fields.size(), FieldPlan{});
  size_t offset = 0;
  auto add_tensor = [&](std::string name, DType dt, std::vector<int64_t> shape) {
    size_t n = dtype_size(dt);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    hb.tensors.push_back(TensorDesc{std::move(name), dt, std::move(shape), offset, n});
    offset = align_up(offset + n);
    return hb.tensors.size() - 1;
  };
  for (size_t f = 0; f < schema.fields.size(); ++f) {
    const FieldSpec& spec = schema.fields[f];
    FieldPlan& plan = job.plans[f];
    if (spec.kind == FieldKind::kImage) {
      const ImagePipeline& pipe = *engine_->pipelines_[f];
      std::pair<int, int> hw;
      if (auto fixed = pipe.fixed_size()) {
        hw = *fixed;
      } else {
        // No op fixes the size: every image of the batch must come out the same.
        // Only headers are needed here; the checksum is verified when the chunk
        // reads the record. Under on_error="skip" an unreadable sample is left to
        // the chunk, which replaces it with the next one of the planned size.
        std::vector<RecordView> views(schema.fields.size());
        std::exception_ptr first_error;
        bool have = false;
        for (int64_t p = 0; p < len; ++p) {
          const int64_t idx = job.indices[static_cast<size_t>(p)];
          std::pair<int, int> s;
          try {
            try {
              Dataset::Location loc = ds_.locate(idx);
              split_record(schema, ds_.shard(loc.shard).record_unchecked(loc.record),
                           views.data());
              s = pipe.output_size(views[f].data, views[f].size);
            } catch (...) {
              rethrow_with_context(ds_, idx, spec.name);
            }
          } catch (...) {
            if (!engine_->opts_.skip_errors) throw;
            if (!first_error) first_error = std::current_exception();
            continue;
          }
          if (!have) {
            hw = s;
            have = true;
          } else if (s != hw) {
            STOKER_THROW(UsageError, "batch ", k, ": images of field '", spec.name,
                         "' have different sizes (", hw.first, "x", hw.second, " and ", s.first,
                         "x", s.second, " at sample ", idx,
                         "); add a crop to its transforms, e.g. stoker.ops.CenterCrop(224), "
                         "to batch them");
          }
        }
        if (!have) std::rethrow_exception(first_error);
      }
      plan.img_h = hw.first;
      plan.img_w = hw.second;
      plan.sample_bytes = static_cast<size_t>(hw.first) * hw.second * 3 * dtype_size(pipe.out_dtype());
      std::vector<int64_t> shape =
          pipe.layout() == ImageLayout::kCHW
              ? std::vector<int64_t>{len, 3, hw.first, hw.second}
              : std::vector<int64_t>{len, hw.first, hw.second, 3};
      plan.out = add_tensor(spec.name, pipe.out_dtype(), shape);
    } else if (!spec.variable()) {
      std::vector<int64_t> shape{len};
      shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
      plan.sample_bytes = spec.fixed_bytes();
      plan.out = add_tensor(spec.name, spec.dtype, shape);
    } else {
      // Pad to the longest sample of the batch: read only the field tables here.
      int64_t max_rows = 0;
      const size_t row = spec.row_bytes();
      for (int64_t p = 0; p < len; ++p) {
        Dataset::Location loc = ds_.locate(job.indices[static_cast<size_t>(p)]);
        RecordView rec = ds_.shard(loc.shard).record_unchecked(loc.record);
        uint32_t bytes;
        std::memcpy(&bytes, rec.data + 4 * f, 4);
        max_rows = std::max<int64_t>(max_rows, std::min<size_t>(bytes, rec.size) / row);
      }
      plan.max_rows = max_rows;
      plan.sample_bytes = static_cast<size_t>(max_rows) * row;
      std::vector<int64_t> shape{len, max_rows};
      if (spec.kind == FieldKind::kNDArray)
        shape.insert(shape.end(), spec.shape.begin() + 1, spec.shape.end());
      plan.out = add_tensor(spec.name, spec.kind == FieldKind::kBlob ? DType::kUInt8 : spec.dtype,
                            shape);
      plan.lengths = add_tensor(spec.name + "_lengths", DType::kInt64, {len});
    }
  }
  hb.bytes = offset;
  hb.memory = engine_->pool_->acquire(offset);
  hb.pinned = engine_->pool_->pinned();
}

bool Iteration::fits(const Job& job, const std::vector<RecordView>& fields) const {
  const Schema& schema = ds_.schema();
  for (size_t f = 0; f < schema.fields.size(); ++f) {
    const FieldSpec& spec = schema.fields[f];
    if (spec.kind != FieldKind::kImage && spec.variable() &&
        static_cast<int64_t>(fields[f].size / spec.row_bytes()) > job.plans[f].max_rows)
      return false;
    if (spec.kind == FieldKind::kImage && !engine_->pipelines_[f]->fixed_size()) {
      auto s = engine_->pipelines_[f]->output_size(fields[f].data, fields[f].size);
      if (s.first != job.plans[f].img_h || s.second != job.plans[f].img_w) return false;
    }
  }
  return true;
}

void Iteration::process_sample(Job& job, int64_t pos, int64_t index,
                               std::vector<RecordView>& fields, LocalStats& ls) {
  const Schema& schema = ds_.schema();
  uint8_t* base = job.batch_out.memory.get();
  auto t0 = Clock::now();
  ds_.read(index, fields.data());
  auto t1 = Clock::now();
  ls.read_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  size_t f = 0;
  try {
    for (f = 0; f < schema.fields.size(); ++f) {
      const FieldSpec& spec = schema.fields[f];
      const FieldPlan& plan = job.plans[f];
      const TensorDesc& out = job.batch_out.tensors[plan.out];
      uint8_t* dst = base + out.offset + static_cast<size_t>(pos) * plan.sample_bytes;
      const RecordView& v = fields[f];
      if (spec.kind == FieldKind::kImage) {
        const uint64_t seed = hash_combine(seed_, static_cast<uint64_t>(index) * 64 + f);
        engine_->pipelines_[f]->run(v.data, v.size, seed, dst, plan.img_h, plan.img_w);
      } else if (!spec.variable()) {
        std::memcpy(dst, v.data, v.size);
      } else {
        const int64_t rows = static_cast<int64_t>(v.size / spec.row_bytes());
        if (rows > plan.max_rows)
          STOKER_THROW(DataError, "length changed while reading (", rows, " > ", plan.max_rows,
                       " rows)");
        std::memcpy(dst, v.data, v.size);
        std::memset(dst + v.size, 0, plan.sample_bytes - v.size);
        const TensorDesc& lt = job.batch_out.tensors[plan.lengths];
        std::memcpy(base + lt.offset + static_cast<size_t>(pos) * 8, &rows, 8);
      }
    }
  } catch (...) {
    rethrow_with_context(ds_, index, schema.fields[f].name);
  }
  ls.decode_ns += ns_since(t1);
  for (const auto& v : fields) ls.bytes += static_cast<int64_t>(v.size);
  ds_.check_intact(index);  // a shard cut short under us reads as zeros: refuse what was copied
}

void Iteration::run_chunk(Job& job, int64_t k, int64_t chunk) {
  const int64_t len = static_cast<int64_t>(job.indices.size());
  const int64_t lo = chunk * chunk_size_;
  const int64_t hi = std::min(len, lo + chunk_size_);
  const int64_t n = ds_.size();
  std::vector<RecordView> fields(ds_.schema().fields.size());
  LocalStats ls;
  struct Flush {  // publish the chunk's counters however the loop ends
    EngineStats& s;
    Job& job;
    LocalStats& l;
    ~Flush() {
      s.read_ns.fetch_add(l.read_ns, std::memory_order_relaxed);
      s.decode_ns.fetch_add(l.decode_ns, std::memory_order_relaxed);
      job.bytes.fetch_add(l.bytes, std::memory_order_relaxed);  // counted when delivered
    }
  } flush{*engine_->stats_, job, ls};
  for (int64_t pos = lo; pos < hi; ++pos) {
    if (stop_.load(std::memory_order_relaxed)) return;
    const int64_t index = job.indices[static_cast<size_t>(pos)];
    try {
      process_sample(job, pos, index, fields, ls);
    } catch (...) {
      if (!engine_->opts_.skip_errors) {
        fail(job, pos, std::current_exception());
        return;
      }
      // on_error="skip": the next valid sample in dataset order takes its place,
      // so the replacement is the same whatever thread does it.
      std::exception_ptr first = std::current_exception();
      bool replaced = false;
      for (int64_t step = 1; step < n && !replaced; ++step) {
        if (stop_.load(std::memory_order_relaxed)) return;
        const int64_t alt = (index + step) % n;
        try {
          ds_.read(alt, fields.data());
          if (!fits(job, fields)) continue;
          process_sample(job, pos, alt, fields, ls);
          replaced = true;
        } catch (...) {
        }
      }
      if (!replaced) {
        fail(job, pos, first);
        return;
      }
      job.skipped.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void Iteration::fail(Job& job, int64_t pos, std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(job.mu);
  if (pos < job.error_pos) {  // report the first bad sample of the batch, deterministically
    job.error_pos = pos;
    job.error = std::move(e);
  }
}

void Iteration::finish_chunk(Job& job) {
  if (job.chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    job.ready.store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_cv_.notify_all();
  }
}

void Iteration::reset(Job& job) {
  std::lock_guard<std::mutex> lock(job.mu);
  job.batch_out = HostBatch{};
  job.error = nullptr;
  job.error_pos = INT64_MAX;
  job.ready.store(false, std::memory_order_relaxed);
}

Iteration::Status Iteration::next(HostBatch& out, std::chrono::milliseconds timeout) {
  if (static_cast<int>(::getpid()) != pid_)
    STOKER_THROW(UsageError,
                 "this loader iterator was started in another process (before os.fork()); "
                 "create a new iterator or loader in the child");
  const int64_t k = consumed_.load(std::memory_order_relaxed);
  if (k >= end_) return Status::kEnd;
  STOKER_CHECK(!stop_.load(std::memory_order_acquire), UsageError, "iterator was stopped");
  Job& job = *jobs_[static_cast<size_t>(k % prefetch_)];
  if (!job.ready.load(std::memory_order_acquire)) {
    auto t0 = Clock::now();
    // Spin briefly: at high batch rates the batch is often microseconds away.
    for (int i = 0; i < 200 && !job.ready.load(std::memory_order_acquire); ++i)
      std::this_thread::yield();
    if (!job.ready.load(std::memory_order_acquire)) {
      std::unique_lock<std::mutex> lock(ready_mu_);
      ready_cv_.wait_for(lock, timeout, [&] {
        return job.ready.load(std::memory_order_acquire) || stop_.load(std::memory_order_acquire);
      });
    }
    engine_->stats_->wait_ns.fetch_add(ns_since(t0), std::memory_order_relaxed);
    if (!job.ready.load(std::memory_order_acquire)) {
      STOKER_CHECK(!stop_.load(std::memory_order_acquire), UsageError, "iterator was stopped");
      return Status::kTimeout;
    }
  }
  std::exception_ptr err;
  const int64_t samples = static_cast<int64_t>(job.indices.size());
  const int64_t skipped = job.skipped.load(std::memory_order_relaxed);
  const int64_t bytes = job.bytes.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(job.mu);
    err = job.error;
    if (!err) out = std::move(job.batch_out);
  }
  reset(job);
  consumed_.store(k + 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(space_mu_);
    space_cv_.notify_all();
  }
  if (err) {
    stop();  // an iterator ends at its first error; a new one starts cleanly
    std::rethrow_exception(err);
  }
  // Counted as delivered, not as assembled: the batches that a stopped iteration
  // (or a dropped next-epoch prefetch) assembled never count. Stage times count
  // all work done.
  EngineStats& st = *engine_->stats_;
  st.batches.fetch_add(1, std::memory_order_relaxed);
  st.samples.fetch_add(samples, std::memory_order_relaxed);
  st.bytes_read.fetch_add(bytes, std::memory_order_relaxed);
  st.skipped.fetch_add(skipped, std::memory_order_relaxed);
  return Status::kBatch;
}

}  // namespace stoker
