#include "format/dataset.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "common/activity.h"
#include "common/detail/futex.h"
#include "common/error.h"
#include "common/stop_flag.h"

namespace stoker {

namespace {

ShardExpectation expectation(const Schema& schema, const ShardInfo& info) {
  return ShardExpectation{schema.hash, info.num_records, info.bytes, info.identity};
}

void check_field_count(const Schema& schema, const std::string& path, uint32_t n) {
  if (n != schema.fields.size())
    STOKER_THROW(DataError, path, ": shard has ", n, " fields but the schema has ",
                 schema.fields.size());
}

}  // namespace

Dataset::Dataset(Schema schema, std::vector<ShardInfo> shards, Options opts)
    : schema_(std::move(schema)),
      infos_(std::move(shards)),
      readers_(new std::atomic<const ShardReader*>[infos_.size()]),
      owned_(infos_.size()) {
  for (size_t s = 0; s < infos_.size(); ++s) readers_[s].store(nullptr, std::memory_order_relaxed);
  // The same file listed twice (under two names, or linked) is refused even
  // where the format carries no ordinal to tell (version 1).
  std::map<std::pair<dev_t, ino_t>, size_t> seen;
  auto check_unique = [&](size_t s, const FileStamp& st) {
    auto [it, fresh] = seen.emplace(std::make_pair(st.dev, st.ino), s);
    if (!fresh)
      STOKER_THROW(DataError, infos_[s].path, ": is the same file as shard ", it->second, " (",
                   infos_[it->second].path, "): a shard listed twice");
  };
  if (opts.record_ranges) {
    opts.deferred = true;
    partial_.resize(infos_.size());
  }
  if (opts.releasable) {
    opts.deferred = true;
    pins_.reset(new std::atomic<int32_t>[infos_.size()]);
    for (size_t s = 0; s < infos_.size(); ++s) pins_[s].store(0, std::memory_order_relaxed);
  }
  if (opts.deferred) {
    gate_.reset(new std::atomic<uint32_t>[infos_.size()]);
    for (size_t s = 0; s < infos_.size(); ++s) gate_[s].store(kPending, std::memory_order_relaxed);
    fail_.resize(infos_.size());
    opts.map_on_open = opts.probe_on_open = false;
  }
  starts_.reserve(infos_.size());
  for (size_t s = 0; s < infos_.size(); ++s) {
    ShardInfo& info = infos_[s];
    if (opts.deferred && info.num_records < 0)
      STOKER_THROW(UsageError, info.path, ": a deferred shard needs its record count");
    if (opts.map_on_open) {
      const ShardReader& r = shard(s);
      check_unique(s, r.stamp());
      info.num_records = r.num_records();
    } else if (opts.probe_on_open || info.num_records < 0) {
      ShardProbe p = probe_shard(info.path, expectation(schema_, info));
      check_field_count(schema_, info.path, p.header.num_fields);
      check_unique(s, p.stamp);
      info.num_records = static_cast<int64_t>(p.footer.num_records);
    }
    if (info.num_records > std::numeric_limits<int64_t>::max() - total_)
      STOKER_THROW(DataError, info.path, ": record counts overflow a 64-bit total");
    starts_.push_back(total_);
    total_ += info.num_records;
  }
}

Dataset::~Dataset() {
  if (lease_fd_ >= 0) ::close(lease_fd_);
}

void Dataset::hold_lease(int fd) {
  if (lease_fd_ >= 0) ::close(lease_fd_);
  lease_fd_ = fd;
}

const ShardReader& Dataset::shard(size_t s) const {
  if (s >= infos_.size())
    STOKER_THROW(UsageError, "shard ", s, " out of range for a dataset of ", infos_.size());
  const ShardReader* r = readers_[s].load(std::memory_order_acquire);
  if (r) return *r;
  if (gate_) await_shard(s);
  const ScopedActivity opening(Activity::kOpening);  // a slow first batch says so
  std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
  r = readers_[s].load(std::memory_order_relaxed);
  if (r) return *r;
  auto reader = std::make_unique<ShardReader>(infos_[s].path, expectation(schema_, infos_[s]));
  check_field_count(schema_, infos_[s].path, reader->num_fields());
  r = reader.get();
  owned_[s] = std::move(reader);
  readers_[s].store(r, std::memory_order_release);
  return *r;
}

Dataset::ShardPin Dataset::pin(size_t s) const {
  if (s >= infos_.size())
    STOKER_THROW(UsageError, "shard ", s, " out of range for a dataset of ", infos_.size());
  ShardPin p;
  p.ds_ = this;
  p.s_ = s;
  if (!pins_) {
    p.r_ = &shard(s);
    return p;
  }
  // NOTE [ Released shards ]: count first, then look.
  for (;;) {
    pins_[s].fetch_add(1, std::memory_order_seq_cst);
    if (gate_[s].load(std::memory_order_seq_cst) == kReady) {
      p.counted_ = true;  // given back by p, also if mapping throws
      p.r_ = &shard(s);
      return p;
    }
    unpin(s);
    await_shard(s);  // until provided again (or it throws: failed, stopped)
  }
}

Dataset::ShardPin Dataset::pin_record(Location loc) const {
  const size_t s = loc.shard;
  if (partial_.empty() || s >= infos_.size()) return pin(s);
  std::optional<std::chrono::steady_clock::time_point> t0;  // a wait, counted
  auto count = [&] {
    if (t0)
      gate_wait_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - *t0)
                                  .count(),
                              std::memory_order_relaxed);
    t0.reset();
  };
  bool asked = false;
  for (;;) {
    const uint32_t v = gate_[s].load(std::memory_order_acquire);
    if (v == kReady || v == kFailed) break;  // the shard (or its error): pin() below
    {
      std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
      const Partial& p = partial_[s];
      if (p.declined) break;
      auto it = p.records.find(loc.record);
      if (it != p.records.end()) {
        count();
        ShardPin held;
        held.ds_ = this;
        held.s_ = s;
        held.record_ = it->second;
        return held;
      }
    }
    if (!stop_bound()) break;  // not a loader worker: pin() refuses it by name
    if (!asked) {              // the record was asked for by want_records(), if at all
      asked = true;
      t0 = std::chrono::steady_clock::now();
    }
    if (v == kPending) {  // demand the shard (again, if it was given back meanwhile)
      uint32_t pending = kPending;
      if (gate_[s].compare_exchange_strong(pending, kDemanded, std::memory_order_acq_rel))
        gate_event_.notify();
      continue;
    }
    if (stop_requested()) {
      count();
      STOKER_THROW(Error, infos_[s].path, ": stopped while waiting for the download");
    }
    const ScopedActivity fetching(Activity::kFetching);
    // Short slices: provide_record() wakes the word, but may do so between our
    // look at the records and our sleep. (v: kDemanded or kReleasing.)
    detail::futex_wait(gate_[s], v, std::chrono::milliseconds(5));
  }
  count();
  return pin(s);
}

void Dataset::read(const ShardPin& held, Location loc, RecordView* out, bool verify) const {
  const std::vector<uint8_t>* b = held.record_bytes();
  if (!b) return verify ? read(loc, out) : read_unverified(loc, out);
  try {
    split_record(schema_, RecordView{b->data(), b->size()}, out);
  } catch (const DataError& e) {
    std::string url;
    {
      std::lock_guard<std::mutex> lock(stripes_[loc.shard % kStripes]);
      const Partial& p = partial_[loc.shard];
      url = p.table ? p.table->path() : infos_[loc.shard].path;
    }
    STOKER_THROW(DataError, url, ": record ", loc.record, ": ", e.what());
  }
}

void Dataset::want_records(const int64_t* indices, size_t n) const {
  if (partial_.empty()) return;
  std::vector<std::pair<size_t, int64_t>> want;
  for (size_t k = 0; k < n; ++k) {
    if (indices[k] < 0 || indices[k] >= total_) continue;
    const Location loc = locate(indices[k]);
    const uint32_t v = gate_[loc.shard].load(std::memory_order_acquire);
    if (v == kReady || v == kFailed) continue;
    want.emplace_back(loc.shard, loc.record);
  }
  if (want.empty()) return;
  {
    std::lock_guard<std::mutex> lock(record_mu_);
    record_demands_.insert(record_demands_.end(), want.begin(), want.end());
  }
  gate_event_.notify();
}

std::vector<std::pair<size_t, int64_t>> Dataset::take_record_demands() {
  std::vector<std::pair<size_t, int64_t>> out;
  {
    std::lock_guard<std::mutex> lock(record_mu_);
    out.swap(record_demands_);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  // Shards that came meanwhile need no ranges.
  out.erase(std::remove_if(out.begin(), out.end(),
                           [&](const auto& d) {
                             return gate_[d.first].load(std::memory_order_acquire) == kReady;
                           }),
            out.end());
  return out;
}

void Dataset::provide_table(size_t s, const std::string& url, const uint8_t* head, size_t head_len,
                            const uint8_t* tail, size_t tail_len) {
  STOKER_CHECK(!partial_.empty() && s < infos_.size(), UsageError, "provide_table: shard ", s,
               " of a dataset without record ranges or out of range");
  const ShardInfo& info = infos_[s];
  STOKER_CHECK(info.bytes >= 0, UsageError, url, ": the shard's size is not known");
  ShardTable table =
      parse_shard_table(url, head, head_len, tail, tail_len, static_cast<uint64_t>(info.bytes),
                        expectation(schema_, info));
  check_field_count(schema_, url, table.num_fields());
  std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
  partial_[s].table = std::move(table);
}

void Dataset::provide_record(size_t s, int64_t r, const uint8_t* data, size_t len) {
  STOKER_CHECK(!partial_.empty() && s < infos_.size(), UsageError, "provide_record: shard ", s,
               " of a dataset without record ranges or out of range");
  auto bytes = std::make_shared<std::vector<uint8_t>>(data, data + len);
  {
    std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
    Partial& p = partial_[s];
    STOKER_CHECK(p.table.has_value(), UsageError, "provide_record: shard ", s,
                 " has no table (provide_table first)");
    verify_record_bytes(*p.table, r, bytes->data(), bytes->size());
    if (gate_[s].load(std::memory_order_acquire) == kReady) return;  // the shard came first
    auto [it, fresh] = p.records.emplace(r, std::move(bytes));
    if (fresh) p.bytes += static_cast<int64_t>(len);
  }
  detail::futex_wake(gate_[s]);
}

void Dataset::no_ranges(size_t s) {
  STOKER_CHECK(!partial_.empty() && s < infos_.size(), UsageError, "no_ranges: shard ", s,
               " of a dataset without record ranges or out of range");
  {
    std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
    Partial& p = partial_[s];
    p.declined = true;
    p.records.clear();
    p.bytes = 0;
  }
  detail::futex_wake(gate_[s]);
}

std::pair<int64_t, int64_t> Dataset::buffered_records() const {
  int64_t n = 0, bytes = 0;
  for (size_t s = 0; s < partial_.size(); ++s) {
    std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
    n += static_cast<int64_t>(partial_[s].records.size());
    bytes += partial_[s].bytes;
  }
  return {n, bytes};
}

void Dataset::unpin(size_t s) const noexcept { pins_[s].fetch_sub(1, std::memory_order_seq_cst); }

bool Dataset::try_release(size_t s) {
  STOKER_CHECK(pins_ && s < infos_.size(), UsageError, "try_release: shard ", s,
               " of a dataset that is not releasable or out of range");
  // Under the stripe: a reader mapping the shard (shard()) or a fail() waits.
  std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
  uint32_t v = kReady;
  if (!gate_[s].compare_exchange_strong(v, kReleasing, std::memory_order_seq_cst)) return false;
  const bool held = pins_[s].load(std::memory_order_seq_cst) != 0;
  if (!held) {
    readers_[s].store(nullptr, std::memory_order_release);
    owned_[s].reset();  // unmapped: the cache may now delete the file
  }
  gate_[s].store(held ? kReady : kPending, std::memory_order_seq_cst);
  detail::futex_wake(gate_[s]);
  return !held;
}

void Dataset::await_shard(size_t s) const {
  std::atomic<uint32_t>& g = gate_[s];
  uint32_t v = g.load(std::memory_order_acquire);
  if (v == kPending || v == kDemanded || v == kReleasing) {
    if (!stop_bound())
      STOKER_THROW(UsageError, infos_[s].path,
                   ": shard not downloaded yet (a loader's workers wait for it; "
                   "stoker.Dataset's own reads fetch it first)");
    const ScopedActivity fetching(Activity::kFetching);
    const auto t0 = std::chrono::steady_clock::now();
    struct Count {  // the wait counts however it ends
      std::atomic<int64_t>& ns;
      std::chrono::steady_clock::time_point t0;
      ~Count() {
        ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count(),
                     std::memory_order_relaxed);
      }
    } count{gate_wait_ns_, t0};
    for (;;) {
      v = g.load(std::memory_order_acquire);
      if (v == kPending) {
        if (g.compare_exchange_strong(v, kDemanded, std::memory_order_acq_rel)) {
          gate_event_.notify();  // the fetcher starts it now
          v = kDemanded;
        } else {
          continue;
        }
      }
      if (v != kDemanded && v != kReleasing) break;
      if (stop_requested())
        STOKER_THROW(Error, infos_[s].path, ": stopped while waiting for the download");
      // Slices, so that a stop is seen within one. (kReleasing lasts an unmap.)
      detail::futex_wait(g, v, std::chrono::milliseconds(50));
    }
  }
  if (v == kFailed) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
      why = fail_[s];
    }
    throw FetchError(why);
  }
}

void Dataset::provide(size_t s) {
  STOKER_CHECK(gate_ && s < infos_.size(), UsageError, "provide: shard ", s,
               " of a dataset that is not deferred or out of range");
  uint32_t v = gate_[s].load(std::memory_order_acquire);
  for (;;) {
    if (v == kReady || v == kFailed) break;
    if (v == kReleasing) {  // a try_release() under way ends in kPending: then provide
      detail::futex_wait(gate_[s], kReleasing, std::chrono::milliseconds(1));
      v = gate_[s].load(std::memory_order_acquire);
      continue;
    }
    if (gate_[s].compare_exchange_weak(v, kReady, std::memory_order_acq_rel)) break;
  }
  if (!partial_.empty()) {  // readers read the shard now (NOTE [ Records by range ])
    std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
    partial_[s].records.clear();
    partial_[s].bytes = 0;
  }
  detail::futex_wake(gate_[s]);
}

void Dataset::fail(size_t s, const std::string& why) {
  STOKER_CHECK(gate_ && s < infos_.size(), UsageError, "fail: shard ", s,
               " of a dataset that is not deferred or out of range");
  {
    std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);  // readers take fail_ under it
    uint32_t v = gate_[s].load(std::memory_order_acquire);
    if (v == kReady || v == kFailed) return;  // provided meanwhile, or failed already
    fail_[s] = why;
    // (kReleasing cannot be seen here: try_release() holds this stripe while in it.)
    while (v != kReady && v != kFailed &&
           !gate_[s].compare_exchange_weak(v, kFailed, std::memory_order_acq_rel)) {
    }
  }
  detail::futex_wake(gate_[s]);
}

std::vector<size_t> Dataset::demands() const {
  std::vector<size_t> out;
  if (!gate_) return out;
  for (size_t s = 0; s < infos_.size(); ++s)
    if (gate_[s].load(std::memory_order_acquire) == kDemanded) out.push_back(s);
  return out;
}

bool Dataset::is_mapped(size_t s) const {
  return s < infos_.size() && readers_[s].load(std::memory_order_acquire) != nullptr;
}

size_t Dataset::mapped_shards() const {
  size_t n = 0;
  for (size_t s = 0; s < infos_.size(); ++s) n += is_mapped(s);
  return n;
}

Dataset::Location Dataset::locate(int64_t i) const {
  if (i < 0 || i >= total_)
    STOKER_THROW(UsageError, "sample index ", i, " out of range for a dataset of ", total_);
  auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  size_t s = static_cast<size_t>(it - starts_.begin()) - 1;
  return {s, i - starts_[s]};
}

namespace {

void split_or_throw(const Schema& schema, const ShardReader& r, int64_t record, RecordView rec,
                    RecordView* out) {
  try {
    split_record(schema, rec, out);
  } catch (const DataError& e) {
    if (r.changed_on_disk()) r.throw_changed(record, e.what());
    STOKER_THROW(DataError, r.path(), ": record ", record, ": ", e.what());
  }
}

}  // namespace

void Dataset::read(Location loc, RecordView* out) const {
  const ShardReader& r = shard(loc.shard);
  // record() names file and record itself
  split_or_throw(schema_, r, loc.record, r.record(loc.record), out);
}

void Dataset::read_unverified(Location loc, RecordView* out) const {
  const ShardReader& r = shard(loc.shard);
  split_or_throw(schema_, r, loc.record, r.record_unchecked(loc.record), out);
}

void Dataset::check_intact(Location loc) const {
  if (MappedFile::total_faults() == 0) return;  // the normal path: one relaxed load
  const ShardReader* r = readers_[loc.shard].load(std::memory_order_acquire);
  if (r && r->faulted()) r->throw_changed(loc.record, "pages of it read as zeros");
}

}  // namespace stoker
