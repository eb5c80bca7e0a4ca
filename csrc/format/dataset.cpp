#include "format/dataset.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "common/activity.h"
#include "common/blocking.h"
#include "common/error.h"
#include "common/stop_flag.h"

namespace stoker {

namespace {

ShardExpectation expectation(const Schema& schema, const ShardInfo& info) {
  return ShardExpectation{schema.hash, info.num_records, info.bytes, info.identity};
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
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
  if (opts.record_ranges || opts.releasable) opts.deferred = true;
  STOKER_CHECK(!(opts.preload && opts.deferred), UsageError,
               "a dataset cannot be both preloaded and deferred");
  if (opts.preload) {
    in_memory_ = true;
    opts.map_on_open = true;
  }
  if (opts.deferred) {
    std::vector<std::string> names;
    names.reserve(infos_.size());
    for (const ShardInfo& info : infos_) names.push_back(info.path);
    gate_ = std::make_unique<ShardGate>(std::move(names), opts.releasable, stripes_);
    if (opts.record_ranges) ranges_ = std::make_unique<RecordRanges>(infos_.size(), stripes_);
    opts.map_on_open = opts.probe_on_open = false;
  }
  if (in_memory_) load_all();
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

void Dataset::load_all() {
  // NOTE [ Preloaded shards ] in shard_reader.h: several files read at once, as
  // a disk (or a network filesystem) serves parallel reads faster than one
  // stream; the first error in shard order is the one reported.
  const size_t n = infos_.size();
  const size_t threads =
      std::min<size_t>(n, std::clamp<size_t>(std::thread::hardware_concurrency(), 2, 8));
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(n);
  auto work = [&] {
    for (size_t s; (s = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        (void)shard(s);
      } catch (...) {
        errors[s] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
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
  if (gate_) gate_->await(s);
  const ScopedActivity opening(Activity::kOpening);  // a slow first batch says so
  std::lock_guard<std::mutex> lock(stripes_[s]);
  r = readers_[s].load(std::memory_order_relaxed);
  if (r) return *r;
  auto reader =
      std::make_unique<ShardReader>(infos_[s].path, expectation(schema_, infos_[s]),
                                    in_memory_ ? ShardReader::kInMemory : ShardReader::kMapped);
  if (in_memory_ && infos_[s].checksum && reader->load_checksum() != *infos_[s].checksum)
    STOKER_THROW(DataError, infos_[s].path, ": file checksum ", hex32(reader->load_checksum()),
                 " differs from index.json's ", hex32(*infos_[s].checksum));
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
  if (!releasable()) {
    p.r_ = &shard(s);
    return p;
  }
  // NOTE [ Released shards ]: count first, then look.
  for (;;) {
    if (gate_->try_enter(s)) {
      p.counted_ = true;  // given back by p, also if mapping throws
      p.r_ = &shard(s);
      return p;
    }
    gate_->await(s);  // until provided again (or it throws: failed, stopped)
  }
}

Dataset::ShardPin Dataset::pin_record(Location loc) const {
  const size_t s = loc.shard;
  if (!ranges_ || s >= infos_.size()) return pin(s);
  std::optional<std::chrono::steady_clock::time_point> t0;  // a wait, counted
  auto count = [&] {
    if (t0) gate_->count_wait(std::chrono::steady_clock::now() - *t0);
    t0.reset();
  };
  const uint32_t failed_before = gate_->failures(s);
  for (;;) {
    const uint32_t v = gate_->state(s);
    if (v == ShardGate::kReady || v == ShardGate::kFailed) break;  // the shard (or its error)
    if (gate_->failures(s) != failed_before) {  // failed and reset while we waited
      count();
      gate_->throw_failure(s);
    }
    const RecordRanges::Found f = ranges_->find(s, loc.record);
    if (f.declined) break;
    if (f.record) {
      count();
      ShardPin held;
      held.ds_ = this;
      held.s_ = s;
      held.record_ = f.record;
      return held;
    }
    if (!stop_bound()) break;  // not a loader worker: pin() refuses it by name
    if (!t0) t0 = std::chrono::steady_clock::now();
    if (v == ShardGate::kPending) {  // demand the shard (again, if it was given back meanwhile)
      gate_->demand(s);
      continue;
    }
    if (stop_requested()) {
      count();
      STOKER_THROW(Error, infos_[s].path, ": stopped while waiting for the download");
    }
    const ScopedActivity fetching(Activity::kFetching);
    const ScopedBlocked blocked;
    // Short slices: provide_record() wakes the word, but may do so between our
    // look at the records and our sleep. (v: kDemanded or kReleasing.)
    gate_->wait_word(s, v, std::chrono::milliseconds(5));
  }
  count();
  return pin(s);
}

void Dataset::read(const ShardPin& held, Location loc, RecordView* out, Verify verify) const {
  const std::vector<uint8_t>* b = held.record_bytes();
  if (!b) return read(loc, out, verify);
  try {
    split_record(schema_, RecordView{b->data(), b->size()}, out);
  } catch (const DataError& e) {
    STOKER_THROW(DataError, ranges_->url(loc.shard, infos_[loc.shard].path), ": record ",
                 loc.record, ": ", e.what());
  }
}

void Dataset::want_records(const int64_t* indices, size_t n) const {
  if (!ranges_) return;
  std::vector<std::pair<size_t, int64_t>> want;
  for (size_t k = 0; k < n; ++k) {
    if (indices[k] < 0 || indices[k] >= total_) continue;
    const Location loc = locate(indices[k]);
    const uint32_t v = gate_->state(loc.shard);
    if (v == ShardGate::kReady || v == ShardGate::kFailed) continue;
    want.emplace_back(loc.shard, loc.record);
  }
  if (want.empty()) return;
  ranges_->want(want);
  gate_->notify();
}

std::vector<std::pair<size_t, int64_t>> Dataset::take_record_demands() {
  if (!ranges_) return {};
  return ranges_->take_demands([&](size_t s) { return gate_->state(s) == ShardGate::kReady; });
}

void Dataset::provide_table(size_t s, const std::string& url, const uint8_t* head, size_t head_len,
                            const uint8_t* tail, size_t tail_len) {
  STOKER_CHECK(ranges_ && s < infos_.size(), UsageError, "provide_table: shard ", s,
               " of a dataset without record ranges or out of range");
  const ShardInfo& info = infos_[s];
  STOKER_CHECK(info.bytes >= 0, UsageError, url, ": the shard's size is not known");
  ShardTable table =
      parse_shard_table(url, head, head_len, tail, tail_len, static_cast<uint64_t>(info.bytes),
                        expectation(schema_, info));
  check_field_count(schema_, url, table.num_fields());
  ranges_->provide_table(s, std::move(table));
}

void Dataset::provide_record(size_t s, int64_t r, const uint8_t* data, size_t len) {
  STOKER_CHECK(ranges_ && s < infos_.size(), UsageError, "provide_record: shard ", s,
               " of a dataset without record ranges or out of range");
  if (ranges_->provide_record(s, r, data, len,
                              [&] { return gate_->state(s) == ShardGate::kReady; }))
    gate_->wake(s);
}

void Dataset::no_ranges(size_t s) {
  STOKER_CHECK(ranges_ && s < infos_.size(), UsageError, "no_ranges: shard ", s,
               " of a dataset without record ranges or out of range");
  ranges_->decline(s);
  gate_->wake(s);
}

std::pair<int64_t, int64_t> Dataset::buffered_records() const {
  return ranges_ ? ranges_->buffered() : std::pair<int64_t, int64_t>{0, 0};
}

bool Dataset::try_release(size_t s) {
  STOKER_CHECK(releasable() && s < infos_.size(), UsageError, "try_release: shard ", s,
               " of a dataset that is not releasable or out of range");
  // Called under the shard's stripe: a reader mapping it waits.
  return gate_->try_release(s, [&] {
    readers_[s].store(nullptr, std::memory_order_release);
    owned_[s].reset();  // unmapped: the cache may now delete the file
  });
}

void Dataset::provide(size_t s) {
  checked_gate(s, "provide").provide(s);
  if (ranges_) ranges_->drop(s);  // readers read the shard now (NOTE [ Records by range ])
}

ShardGate& Dataset::checked_gate(size_t s, const char* what) const {
  STOKER_CHECK(gate_ && s < infos_.size(), UsageError, what, ": shard ", s,
               " of a dataset that is not deferred or out of range");
  return *gate_;
}

int64_t Dataset::memory_bytes() const {
  if (!in_memory_) return 0;
  int64_t n = 0;
  for (size_t s = 0; s < infos_.size(); ++s)
    if (const ShardReader* r = readers_[s].load(std::memory_order_acquire))
      n += static_cast<int64_t>(r->file_size());
  return n;
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

void Dataset::read(Location loc, RecordView* out, Verify verify) const {
  const ShardReader& r = shard(loc.shard);
  // record() names file and record itself
  split_or_throw(schema_, r, loc.record, r.record(loc.record, verify), out);
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
