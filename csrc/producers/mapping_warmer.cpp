#include "producers/mapping_warmer.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace stoker {

MappingWarmer::MappingWarmer(std::shared_ptr<const Dataset> ds, std::vector<size_t> shards,
                             size_t budget)
    : pid_(static_cast<int>(::getpid())) {
  if (!ds || ds->deferred() || shards.empty() || budget == 0) {
    done_.store(true, std::memory_order_release);
    return;
  }
  thread_ = std::thread([this, ds = std::move(ds), shards = std::move(shards), budget]() mutable {
    run(std::move(ds), std::move(shards), budget);
  });
}

MappingWarmer::~MappingWarmer() {
  if (static_cast<int>(::getpid()) != pid_) {
    // A forked child: the thread is the parent's. Leave the handle be.
    if (thread_.joinable()) new std::thread(std::move(thread_));
    return;
  }
  stop();
}

void MappingWarmer::stop() {
  stop_.store(true, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

size_t MappingWarmer::default_budget() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return size_t{1} << 30;
  return static_cast<size_t>(pages) * static_cast<size_t>(page) / 8;
}

void MappingWarmer::run(std::shared_ptr<const Dataset> ds, std::vector<size_t> shards,
                        size_t budget) noexcept {
  pthread_setname_np(pthread_self(), "stoker-warm");
#ifdef SCHED_BATCH
  // A throughput thread, like the workers (NOTE [ Worker scheduling ] in pipeline/worker_pool.h).
  sched_param sp{};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
  size_t left = budget;
  for (size_t s : shards) {
    if (stop_.load(std::memory_order_relaxed)) break;
    if (s >= ds->num_shards()) continue;
    const int64_t size = ds->shard_info(s).bytes;
    if (size >= 0 && static_cast<size_t>(size) > left) continue;
    try {
      const ShardReader& r = ds->shard(s);  // maps it and checks its table, as a reader would
      if (r.file_size() > left) continue;
      left -= r.file_size();
      bytes_.fetch_add(r.mapping().populate(0, r.file_size(), &stop_), std::memory_order_relaxed);
      shards_.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      // The reader that needs this shard maps it again and reports the error.
    }
  }
  done_.store(true, std::memory_order_release);
}

}  // namespace stoker
