#include "format/record_ranges.h"

#include <algorithm>
#include <chrono>

#include "common/activity.h"
#include "common/error.h"
#include "common/stop_flag.h"

namespace stoker {

RecordRanges::RecordRanges(size_t n, const ShardGate& gate) : gate_(gate), partial_(n) {}

void RecordRanges::want(const std::vector<std::pair<size_t, int64_t>>& records) {
  if (records.empty()) return;
  {
    std::lock_guard<std::mutex> lock(demand_mu_);
    demands_.insert(demands_.end(), records.begin(), records.end());
  }
  gate_.notify();
}

std::vector<std::pair<size_t, int64_t>> RecordRanges::take_demands() {
  std::vector<std::pair<size_t, int64_t>> out;
  {
    std::lock_guard<std::mutex> lock(demand_mu_);
    out.swap(demands_);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  // Shards that came meanwhile need no ranges.
  out.erase(
      std::remove_if(out.begin(), out.end(),
                     [&](const auto& d) { return gate_.state(d.first) == ShardGate::kReady; }),
      out.end());
  return out;
}

RecordRanges::Bytes RecordRanges::await(size_t s, int64_t r, const std::string& path) const {
  std::optional<std::chrono::steady_clock::time_point> t0;  // a wait, counted
  auto count = [&] {
    if (t0) gate_.count_wait(std::chrono::steady_clock::now() - *t0);
    t0.reset();
  };
  for (;;) {
    const ShardGate::State v = gate_.state(s);
    if (v == ShardGate::kReady || v == ShardGate::kFailed) break;  // the shard, or its error
    {
      std::lock_guard<std::mutex> lock(stripe(s));
      const Partial& p = partial_[s];
      if (p.declined) break;
      auto it = p.records.find(r);
      if (it != p.records.end()) {
        count();
        return it->second;
      }
    }
    if (!stop_bound()) break;  // not a loader worker: pinning the shard refuses it by name
    if (!t0) t0 = std::chrono::steady_clock::now();  // asked for by want(), if at all
    if (v == ShardGate::kPending) {  // demand the shard (again, if it was given back meanwhile)
      (void)gate_.demand(s);
      continue;
    }
    if (stop_requested()) {
      count();
      STOKER_THROW(Error, path, ": stopped while waiting for the download");
    }
    const ScopedActivity fetching(Activity::kFetching);
    // Short slices: provide_record() wakes the word, but may do so between our
    // look at the records and our sleep. (v: kDemanded or kReleasing.)
    gate_.sleep(s, v, std::chrono::milliseconds(5));
  }
  count();
  return nullptr;
}

void RecordRanges::provide_table(size_t s, ShardTable table) {
  std::lock_guard<std::mutex> lock(stripe(s));
  partial_[s].table = std::move(table);
}

void RecordRanges::provide_record(size_t s, int64_t r, const uint8_t* data, size_t len) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(data, data + len);
  {
    std::lock_guard<std::mutex> lock(stripe(s));
    Partial& p = partial_[s];
    STOKER_CHECK(p.table.has_value(), UsageError, "provide_record: shard ", s,
                 " has no table (provide_table first)");
    verify_record_bytes(*p.table, r, bytes->data(), bytes->size());
    if (gate_.state(s) == ShardGate::kReady) return;  // the shard came first
    auto [it, fresh] = p.records.emplace(r, std::move(bytes));
    if (fresh) p.bytes += static_cast<int64_t>(len);
  }
  gate_.wake(s);
}

void RecordRanges::no_ranges(size_t s) {
  {
    std::lock_guard<std::mutex> lock(stripe(s));
    Partial& p = partial_[s];
    p.declined = true;
    p.records.clear();
    p.bytes = 0;
  }
  gate_.wake(s);
}

void RecordRanges::drop(size_t s) {
  std::lock_guard<std::mutex> lock(stripe(s));
  partial_[s].records.clear();
  partial_[s].bytes = 0;
}

std::pair<int64_t, int64_t> RecordRanges::buffered() const {
  int64_t n = 0, bytes = 0;
  for (size_t s = 0; s < partial_.size(); ++s) {
    std::lock_guard<std::mutex> lock(stripe(s));
    n += static_cast<int64_t>(partial_[s].records.size());
    bytes += partial_[s].bytes;
  }
  return {n, bytes};
}

std::string RecordRanges::name(size_t s, const std::string& path) const {
  std::lock_guard<std::mutex> lock(stripe(s));
  const Partial& p = partial_[s];
  return p.table ? p.table->path() : path;
}

}  // namespace stoker
