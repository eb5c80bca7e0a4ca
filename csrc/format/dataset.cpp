#include "format/dataset.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include <thread>

#include "common/activity.h"
#include "common/error.h"

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
  if (opts.record_ranges || opts.releasable || opts.deferred) {
    gate_ = std::make_unique<ShardGate>(infos_.size(), opts.releasable);
    if (opts.record_ranges) ranges_ = std::make_unique<RecordRanges>(infos_.size(), *gate_);
    opts.deferred = true;
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
  if (gate_) gate_->await(s, infos_[s].path);
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
  if (!releasable()) {
    p.r_ = &shard(s);
    return p;
  }
  for (;;) {  // NOTE [ Released shards ] in format/shard_gate.h
    if (gate_->try_pin(s)) {
      p.counted_ = true;  // given back by p, also if mapping throws
      p.r_ = &shard(s);
      return p;
    }
    gate_->await(s, infos_[s].path);  // until provided again (or it throws: failed, stopped)
  }
}

Dataset::ShardPin Dataset::pin_record(Location loc) const {
  const size_t s = loc.shard;
  if (!ranges_ || s >= infos_.size()) return pin(s);
  // NOTE [ Records by range ] in format/record_ranges.h
  RecordRanges::Bytes bytes = ranges_->await(s, loc.record, infos_[s].path);
  if (!bytes) return pin(s);
  ShardPin held;
  held.ds_ = this;
  held.s_ = s;
  held.record_ = std::move(bytes);
  return held;
}

void Dataset::read(const ShardPin& held, Location loc, RecordView* out, bool verify) const {
  const std::vector<uint8_t>* b = held.record_bytes();
  if (!b) return verify ? read(loc, out) : read_unverified(loc, out);
  try {
    split_record(schema_, RecordView{b->data(), b->size()}, out);
  } catch (const DataError& e) {
    STOKER_THROW(DataError, ranges_->name(loc.shard, infos_[loc.shard].path), ": record ",
                 loc.record, ": ", e.what());
  }
}

ShardGate& Dataset::gate(const char* what, size_t s) const {
  STOKER_CHECK(gate_ && s < infos_.size(), UsageError, what, ": shard ", s,
               " of a dataset that is not deferred or out of range");
  return *gate_;
}

RecordRanges& Dataset::ranges(const char* what, size_t s) const {
  STOKER_CHECK(ranges_ && s < infos_.size(), UsageError, what, ": shard ", s,
               " of a dataset without record ranges or out of range");
  return *ranges_;
}

void Dataset::want_records(const int64_t* indices, size_t n) const {
  if (!ranges_) return;
  std::vector<std::pair<size_t, int64_t>> want;
  for (size_t k = 0; k < n; ++k) {
    if (indices[k] < 0 || indices[k] >= total_) continue;
    const Location loc = locate(indices[k]);
    const ShardGate::State v = gate_->state(loc.shard);
    if (v == ShardGate::kReady || v == ShardGate::kFailed) continue;
    want.emplace_back(loc.shard, loc.record);
  }
  ranges_->want(want);
}

std::vector<std::pair<size_t, int64_t>> Dataset::take_record_demands() {
  if (!ranges_) return {};
  return ranges_->take_demands();
}

void Dataset::provide_table(size_t s, const std::string& url, const uint8_t* head, size_t head_len,
                            const uint8_t* tail, size_t tail_len) {
  RecordRanges& r = ranges("provide_table", s);
  const ShardInfo& info = infos_[s];
  STOKER_CHECK(info.bytes >= 0, UsageError, url, ": the shard's size is not known");
  ShardTable table =
      parse_shard_table(url, head, head_len, tail, tail_len, static_cast<uint64_t>(info.bytes),
                        expectation(schema_, info));
  check_field_count(schema_, url, table.num_fields());
  r.provide_table(s, std::move(table));
}

void Dataset::provide_record(size_t s, int64_t r, const uint8_t* data, size_t len) {
  ranges("provide_record", s).provide_record(s, r, data, len);
}

void Dataset::no_ranges(size_t s) { ranges("no_ranges", s).no_ranges(s); }

std::pair<int64_t, int64_t> Dataset::buffered_records() const {
  return ranges_ ? ranges_->buffered() : std::pair<int64_t, int64_t>{0, 0};
}

bool Dataset::try_release(size_t s) {
  STOKER_CHECK(releasable() && s < infos_.size(), UsageError, "try_release: shard ", s,
               " of a dataset that is not releasable or out of range");
  return gate_->try_release(s, [&] {
    // Under the stripe: a reader mapping the shard (shard()) waits.
    std::lock_guard<std::mutex> lock(stripes_[s % kStripes]);
    readers_[s].store(nullptr, std::memory_order_release);
    owned_[s].reset();  // unmapped: the cache may now delete the file
  });
}

void Dataset::provide(size_t s) {
  gate("provide", s).provide(s);
  if (ranges_) ranges_->drop(s);  // readers read the shard now (NOTE [ Records by range ])
}

void Dataset::fail(size_t s, const std::string& why) { gate("fail", s).fail(s, why); }

std::vector<size_t> Dataset::demands() const {
  return gate_ ? gate_->demands() : std::vector<size_t>{};
}

void Dataset::gate_wait(uint32_t seen, std::chrono::steady_clock::time_point deadline) const {
  if (gate_)
    gate_->wait(seen, deadline);
  else
    std::this_thread::sleep_until(deadline);  // nothing is ever demanded
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
