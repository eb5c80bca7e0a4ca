#include "format/record_ranges.h"

#include <algorithm>

#include "common/error.h"

namespace stoker {

RecordRanges::RecordRanges(size_t num_shards, detail::StripedMutex& stripes)
    : stripes_(stripes), partial_(num_shards) {
  detail::add_fork_client(this);
}

RecordRanges::~RecordRanges() { detail::remove_fork_client(this); }

void RecordRanges::want(const std::vector<std::pair<size_t, int64_t>>& records) {
  if (records.empty()) return;
  std::lock_guard<std::mutex> lock(demand_mu_);
  demands_.insert(demands_.end(), records.begin(), records.end());
}

std::vector<std::pair<size_t, int64_t>> RecordRanges::take_demands(
    const std::function<bool(size_t)>& local) {
  std::vector<std::pair<size_t, int64_t>> out;
  {
    std::lock_guard<std::mutex> lock(demand_mu_);
    out.swap(demands_);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  // Shards that came meanwhile need no ranges.
  out.erase(std::remove_if(out.begin(), out.end(), [&](const auto& d) { return local(d.first); }),
            out.end());
  return out;
}

void RecordRanges::provide_table(size_t s, ShardTable table) {
  STOKER_CHECK(s < partial_.size(), UsageError, "provide_table: shard ", s, " out of range");
  std::lock_guard<std::mutex> lock(stripes_[s]);
  partial_[s].table = std::move(table);
}

bool RecordRanges::provide_record(size_t s, int64_t r, const uint8_t* data, size_t len,
                                  const std::function<bool()>& shard_ready) {
  STOKER_CHECK(s < partial_.size(), UsageError, "provide_record: shard ", s, " out of range");
  auto bytes = std::make_shared<std::vector<uint8_t>>(data, data + len);
  std::lock_guard<std::mutex> lock(stripes_[s]);
  Partial& p = partial_[s];
  STOKER_CHECK(p.table.has_value(), UsageError, "provide_record: shard ", s,
               " has no table (provide_table first)");
  verify_record_bytes(*p.table, r, bytes->data(), bytes->size());
  if (shard_ready()) return false;  // the shard came first
  auto [it, fresh] = p.records.emplace(r, std::move(bytes));
  if (fresh) p.bytes += static_cast<int64_t>(len);
  return true;
}

void RecordRanges::decline(size_t s) {
  STOKER_CHECK(s < partial_.size(), UsageError, "no_ranges: shard ", s, " out of range");
  std::lock_guard<std::mutex> lock(stripes_[s]);
  Partial& p = partial_[s];
  p.declined = true;
  p.records.clear();
  p.bytes = 0;
}

void RecordRanges::drop(size_t s) {
  std::lock_guard<std::mutex> lock(stripes_[s]);
  partial_[s].records.clear();
  partial_[s].bytes = 0;
}

RecordRanges::Found RecordRanges::find(size_t s, int64_t r) const {
  std::lock_guard<std::mutex> lock(stripes_[s]);
  const Partial& p = partial_[s];
  Found f;
  f.declined = p.declined;
  if (!p.declined) {
    auto it = p.records.find(r);
    if (it != p.records.end()) f.record = it->second;
  }
  return f;
}

std::string RecordRanges::url(size_t s, const std::string& fallback) const {
  std::lock_guard<std::mutex> lock(stripes_[s]);
  return partial_[s].table ? partial_[s].table->path() : fallback;
}

std::pair<int64_t, int64_t> RecordRanges::buffered() const {
  int64_t n = 0, bytes = 0;
  for (size_t s = 0; s < partial_.size(); ++s) {
    std::lock_guard<std::mutex> lock(stripes_[s]);
    n += static_cast<int64_t>(partial_[s].records.size());
    bytes += partial_[s].bytes;
  }
  return {n, bytes};
}

}  // namespace stoker
