#include "pipeline/loader_core.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/clock.h"
#include "common/error.h"
#include "common/file_checks.h"
#include "pipeline/detail/loader_run.h"
#include "pipeline/detail/part_producer.h"
#include "pipeline/window.h"

namespace stoker {

// ---- the core ---------------------------------------------------------------------

std::shared_ptr<LoaderCore> LoaderCore::create(std::shared_ptr<const BatchProducer> producer,
                                               LoaderOptions opts) {
  return std::shared_ptr<LoaderCore>(new LoaderCore(std::move(producer), std::move(opts)));
}

LoaderCore::LoaderCore(std::shared_ptr<const BatchProducer> producer, LoaderOptions opts)
    : producer_(std::move(producer)),
      opts_(std::move(opts)),
      pid_(static_cast<int>(::getpid())),
      stats_(std::make_shared<LoaderStats>()) {
  STOKER_CHECK(producer_ != nullptr, UsageError, "LoaderCore: no producer");
  STOKER_CHECK(opts_.num_threads >= 1, UsageError, "num_threads must be >= 1, got ",
               opts_.num_threads);
  checked_prefetch(opts_.prefetch);
  workers_ = std::make_unique<WorkerPool>(opts_.num_threads, stats_, opts_.linger);
  telemetry_ = std::make_unique<LoaderTelemetry>(opts_, stats_, *workers_);
  auto alloc = opts_.host_allocator ? opts_.host_allocator : pageable_allocator();
  host_pool_ = BlockPool::create(std::move(alloc), nullptr, idle_blocks(telemetry_->window()));
}

LoaderCore::~LoaderCore() {
  if (forked()) {
    // The streams, copy threads and workers live in the parent: destroying
    // them here would join threads that do not exist. Leave them be.
    new std::vector<std::shared_ptr<Run>>(std::move(runs_));
    new std::shared_ptr<Run>(std::move(spec_));
    (void)workers_.release();
    return;
  }
  // NOTE [ Loader shutdown ]: asked to stop under the mutex, joined after it.
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& run : runs_) run->reader->stop();
  retired.runs = std::move(runs_);
  retired.runs.push_back(std::move(spec_));
}

bool LoaderCore::forked() const { return static_cast<int>(::getpid()) != pid_; }

int64_t LoaderCore::num_batches(int64_t rank, int64_t world_size) const {
  return producer_->num_batches(rank, world_size);
}

int64_t LoaderCore::next_batches(int64_t rank, int64_t world_size) const {
  EpochKey key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    key = prospective_key(rank, world_size);
    if (part_ && part_->key == key) return part_->batches;  // NOTE [ Parts ]
  }
  return producer_->plan_epoch(key)->num_batches();
}

EpochKey LoaderCore::prospective_key(int64_t rank, int64_t world) const {
  if (part_ && part_->key.rank == rank && part_->key.world_size == world) return part_->key;
  if (resume_) {
    // At the world size that saved it, the rest is exactly what the
    // uninterrupted epoch would have given; at another, padding repeats only
    // samples the job has not consumed.
    const bool same_world = resume_->world_size == world || resume_->offset == 0;
    return EpochKey{resume_->epoch, rank, world, resume_->offset, same_world ? 0 : resume_->offset};
  }
  return EpochKey{pending_.value_or(next_epoch_), rank, world, 0, 0};
}

bool LoaderCore::run_starts(const Run& run, const EpochKey& key) const {
  if (run.stream->stopped()) return false;
  std::optional<EpochKey> k = run.stream->key_at(run.start());
  return k && *k == key;
}

std::shared_ptr<LoaderCore::Run> LoaderCore::new_run(const EpochKey& key) {
  auto run = std::make_shared<Run>();
  run->part = part_ && part_->key == key;  // NOTE [ Parts ]: its stream ends with the part
  run->stream = std::make_shared<Stream>(
      run->part ? std::make_shared<const detail::PartProducer>(producer_, part_->batches)
                : std::shared_ptr<const BatchProducer>(producer_),
      host_pool_, workers_->signal(), stats_, opts_.prefetch, telemetry_->window(), key,
      opts_.finisher);
  if (opts_.auto_prefetch && opts_.max_memory > 0)  // NOTE [ Window and memory ]
    run->stream->set_memory_limit(
        opts_.max_memory,
        static_cast<size_t>(stats_->max_batch_bytes.load(std::memory_order_relaxed)));
  if (opts_.delivery)
    run->reader = opts_.delivery->open(run->stream, stats_);
  else
    run->reader = std::make_unique<HostReader>(run->stream);
  runs_.push_back(run);
  workers_->add(run->stream);
  stats_->streams.fetch_add(1, std::memory_order_relaxed);
  return run;
}

void LoaderCore::stop_run(std::shared_ptr<Run> run, Retired& retired) {
  if (!run) return;
  run->reader->stop();  // never waits (NOTE [ Loader shutdown ])
  workers_->remove(run->stream.get());
  runs_.erase(std::remove(runs_.begin(), runs_.end(), run), runs_.end());
  retired.runs.push_back(std::move(run));
}

void LoaderCore::drop_spec(Retired& retired) { stop_run(std::move(spec_), retired); }

void LoaderCore::set_epoch(uint64_t epoch) {
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  if (main_.live && !main_.finished && main_.key.epoch == epoch) {
    pending_.reset();  // the running epoch: the next iterator runs the one after
    next_epoch_ = epoch + 1;
  } else {
    pending_ = epoch;
    if (resume_ && resume_->epoch != epoch) resume_.reset();
    if (part_ && part_->key.epoch != epoch) part_.reset();
    if (!main_.live || main_.finished) main_.claimed = false;  // the state moves on to `epoch`
  }
  // transformers' Trainer skips first and sets the epoch after, as a DataLoader's
  // SkipBatchSampler allows: a skip not yet taken moves to the epoch set.
  if (skip_ && skip_->epoch != epoch) {
    Skip s = *skip_;
    s.epoch = epoch;
    resume_at(
        LoaderState{epoch,
                    producer_->consumed_after(EpochKey{epoch, s.rank, s.world_size, 0}, s.batches),
                    s.world_size},
        retired);
    skip_ = s;
  }
  // The epoch that flows on after the running one, or the one waiting.
  if (main_.live && !main_.finished && main_.owner && main_.owner->run_) {
    const EpochKey& k = main_.key;
    main_.owner->run_->stream->set_next(
        EpochKey{pending_.value_or(next_epoch_), k.rank, k.world_size, 0});
  }
  if (spec_) {
    std::optional<EpochKey> k = spec_->stream->key_at(spec_->start());
    if (!k || k->epoch != pending_.value_or(next_epoch_) || k->offset != 0) drop_spec(retired);
  }
}

uint64_t LoaderCore::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resume_ ? resume_->epoch : pending_.value_or(next_epoch_);
}

std::shared_ptr<LoaderCore::Iterator> LoaderCore::iter(int64_t rank, int64_t world_size) {
  STOKER_CHECK(!forked(), UsageError,
               "this Loader was created in another process (before os.fork()); create a new "
               "Loader in this process");
  // An epoch begins: the shards are checked against their files again before a
  // read skips a record's hash (NOTE [ Verified once ] in format/shard_reader.h).
  new_file_check_round();
  std::shared_ptr<Iterator> it(new Iterator(shared_from_this(), rank, world_size));
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  iterators_.erase(std::remove_if(iterators_.begin(), iterators_.end(),
                                  [](const std::weak_ptr<Iterator>& w) { return w.expired(); }),
                   iterators_.end());
  iterators_.push_back(it);
  skip_.reset();  // the iterator takes a pending skip from here
  // Start the epoch this iterator will most likely claim, so its first batch
  // is on its way before the first next() (NOTE [ Next-epoch prefetch ]).
  if (!(main_.live && !main_.finished)) {
    const EpochKey key = prospective_key(rank, world_size);
    if (!spec_ || !run_starts(*spec_, key)) {
      drop_spec(retired);
      try {
        spec_ = new_run(key);
      } catch (...) {
        spec_.reset();  // only a head start: the claim plans it again and reports the error
      }
    }
  }
  return it;
}

void LoaderCore::claim(Iterator& it) {
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  const bool concurrent = main_.live && !main_.finished && main_.owner != &it;
  EpochKey key;
  std::shared_ptr<Run> run;
  if (concurrent) {
    key = EpochKey{main_.key.epoch, it.rank_, it.world_, 0};
    run = new_run(key);
  } else {
    key = prospective_key(it.rank_, it.world_);
    if (spec_ && run_starts(*spec_, key)) {
      run = std::move(spec_);
    } else {
      drop_spec(retired);
      run = new_run(key);
    }
  }
  std::optional<Segment> seg;
  try {
    seg = run->stream->segment_from(run->start());
    STOKER_CHECK(seg.has_value(), Error, "internal: the stream has no segment to read");
  } catch (...) {
    stop_run(std::move(run), retired);
    throw;
  }
  if (!concurrent) {
    // Between epochs the loop does something else: that time is not the
    // loop's time with the loader (order: mu_, then the tuner's).
    telemetry_->note_between_epochs(Clock::now());
    pending_.reset();
    resume_.reset();
    part_.reset();
    next_epoch_ = key.epoch + 1;
    main_ = Main{&it, key, 0, false, true, true};
    if (opts_.prefetch_next_epoch && seg->batches > 0 && !run->part)
      run->stream->set_next(EpochKey{next_epoch_, it.rank_, it.world_, 0});
    workers_->wake();
  }
  it.started_ = Clock::now();
  it.next_report_ = it.opened_ + opts_.slow_first_batch;
  it.drain_ = run->skip_to >= 0 ? run->skip_to - run->delivered.load(std::memory_order_acquire) : 0;
  run->skip_to = -1;
  it.key_ = key;
  it.batches_ = seg->batches;
  it.seg_end_ = seg->begin + seg->batches;
  it.run_ = std::move(run);
  it.main_ = !concurrent;
  it.claimed_ = true;
}

void LoaderCore::yielded(Iterator& it) {
  // Every batch but the last needs nothing here: state() reads the main
  // iterator's count itself, so the core's mutex stays off the per-batch path.
  if (it.yielded_.load(std::memory_order_relaxed) < it.batches_) return;
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  if (it.main_ && main_.owner == &it) {
    main_.yielded = it.batches_;
    main_.finished = true;
  }
  // The epoch is out: its stream flows on into the next epoch, held here for
  // the next iterator (NOTE [ Next-epoch prefetch ]), or stops.
  std::shared_ptr<Run> run = std::move(it.run_);
  if (it.main_ && opts_.prefetch_next_epoch && !run->stream->stopped() &&
      run->stream->key_at(run->delivered.load(std::memory_order_acquire))) {
    drop_spec(retired);
    spec_ = std::move(run);
  } else {
    stop_run(std::move(run), retired);
  }
}

void LoaderCore::count_run(Iterator& it) {
  // From the first next() to the one that ended the epoch (or to close()):
  // the loop's time with this iterator, its last step included.
  if (!it.claimed_ || it.counted_) return;
  stats_->run_ns.fetch_add(ns_between(it.started_, Clock::now()), std::memory_order_relaxed);
  it.counted_ = true;
}

void LoaderCore::end_run(Iterator& it) {
  std::lock_guard<std::mutex> lock(mu_);
  count_run(it);
}

void LoaderCore::release(Iterator& it, bool keep) {
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  count_run(it);
  if (it.run_ && !it.released_) {
    it.released_ = true;
    // Left early (break): when the workers already reached the next epoch, the
    // rest of this one is at most a window, so the stream is kept for the next
    // iterator, which drops those batches first (NOTE [ Next-epoch prefetch ]).
    std::shared_ptr<Run> run = it.run_;
    if (keep && it.main_ && main_.owner == &it && opts_.prefetch_next_epoch &&
        !run->stream->stopped() && run->stream->planned(it.seg_end_)) {
      drop_spec(retired);
      run->skip_to = it.seg_end_;
      spec_ = run;
    } else {
      stop_run(run, retired);
    }
  }
  if (main_.owner == &it) {
    main_.yielded = it.yielded_.load(std::memory_order_relaxed);
    main_.live = false;
    main_.owner = nullptr;
  }
}

LoaderState LoaderCore::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (resume_) return *resume_;
  if (main_.claimed && !main_.finished) {
    // While its owner runs, the count is the owner's (written by its next()).
    const int64_t yielded =
        main_.owner ? main_.owner->yielded_.load(std::memory_order_acquire) : main_.yielded;
    return LoaderState{main_.key.epoch, producer_->consumed_after(main_.key, yielded),
                       main_.key.world_size};
  }
  return LoaderState{pending_.value_or(next_epoch_), 0, 0};
}

void LoaderCore::load_state(const LoaderState& s) {
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  skip_.reset();
  resume_at(s, retired);
}

void LoaderCore::skip(int64_t batches, int64_t rank, int64_t world_size) {
  STOKER_CHECK(batches >= 0, UsageError, "num_batches must be >= 0, got ", batches);
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t epoch = resume_ ? resume_->epoch : pending_.value_or(next_epoch_);
  skip_ = Skip{epoch, batches, rank, world_size};
  resume_at(
      LoaderState{epoch, producer_->consumed_after(EpochKey{epoch, rank, world_size, 0}, batches),
                  world_size},
      retired);
}

void LoaderCore::run_part(const EpochKey& key, int64_t first, int64_t count) {
  STOKER_CHECK(key.world_size >= 1 && key.rank >= 0 && key.rank < key.world_size, UsageError,
               "part: rank ", key.rank, " outside [0, world_size=", key.world_size, ")");
  const int64_t batches = producer_->plan_epoch(key)->num_batches();  // without mu_: may be slow
  STOKER_CHECK(first >= 0 && count >= 1 && first <= batches && count <= batches - first, UsageError,
               "part: batches [", first, ", ", first + count, ") outside the segment's ", batches);
  EpochKey start = key;
  start.offset = producer_->consumed_after(key, first);
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  skip_.reset();
  resume_at(LoaderState{key.epoch, start.offset, key.world_size}, retired);
  drop_spec(retired);  // a stream of the same key would not end with the part
  part_ = Part{start, count};
}

void LoaderCore::resume_at(const LoaderState& s, Retired& retired) {
  part_.reset();
  STOKER_CHECK(s.offset >= 0 && s.offset <= producer_->epoch_samples(), UsageError,
               "cannot resume: position ", s.offset, " outside [0, ", producer_->epoch_samples(),
               "]");
  LoaderState r = s;
  if (r.offset == producer_->epoch_samples()) r = LoaderState{s.epoch + 1, 0, 0};
  resume_ = r;
  pending_.reset();
  next_epoch_ = r.epoch;
  main_ = Main{};
  if (spec_) {
    std::optional<EpochKey> k = spec_->stream->key_at(spec_->start());
    if (!k || k->epoch != r.epoch || k->offset != r.offset) drop_spec(retired);
  }
}

void LoaderCore::drop_prefetch() {
  if (forked()) return;
  Retired retired;
  std::lock_guard<std::mutex> lock(mu_);
  drop_spec(retired);
}

void LoaderCore::close() {
  if (forked()) return;
  std::vector<std::shared_ptr<Iterator>> its;
  {
    Retired retired;
    std::lock_guard<std::mutex> lock(mu_);
    drop_spec(retired);
    for (const auto& w : iterators_)
      if (auto it = w.lock()) its.push_back(std::move(it));
  }
  // Every stream stops: an open iterator's is not kept for the next one (the
  // Python stage drops the work of every batch at close(); a kept stream
  // would wait for batches nobody finishes, or get rows of two batches).
  for (const auto& it : its) it->close(/*keep=*/false);
  producer_->close();
  workers_->stop();
  // The idle batch memory goes now, and the rest as the batches the user kept
  // are dropped: not when the loader object is collected, perhaps much later
  // (a shared block would also be inherited by every process forked until then).
  host_pool_->set_max_idle(0);
}

int LoaderCore::active_threads() const { return workers_->active(); }

LoaderStatsSnapshot LoaderCore::stats() const {
  LoaderTelemetry::Live live;
  live.host_blocks = host_pool_->blocks();
  live.host_bytes = host_pool_->bytes();
  if (opts_.delivery) {
    live.device_buffers = opts_.delivery->buffers();
    live.device_bytes = opts_.delivery->buffer_bytes();
  }
  {
    // Declared before the lock, so freed after it: an iterator whose last
    // reference this is must not be destroyed (and released) with mu_ held.
    std::vector<std::shared_ptr<Iterator>> alive;
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    for (const auto& w : iterators_) {
      auto it = w.lock();
      if (!it) continue;
      alive.push_back(it);
      if (!it->claimed_ || it->counted_) continue;
      live.run_seconds += seconds(ns_between(it->started_, now));
      if (it->main_ && it->run_) live.queue_depth = it->run_->stream->ready_batches();
    }
  }
  return telemetry_->snapshot(live);
}

void LoaderCore::apply_window(int window) {
  telemetry_->set_window(window);
  host_pool_->set_max_idle(idle_blocks(window));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& run : runs_) run->stream->set_window(window);
}

}  // namespace stoker
