// Single records of deferred shards, fetched by range before their shards are
// local: what readers ask for, the tables and bytes the fetcher hands over, and
// the readers' waits for them. The Dataset owns one when opened with
// record_ranges.
//
// NOTE [ Records by range ]
// Before a deferred shard is local, a reader may have single records of it.
// The first batch of an epoch asks for its records when it is planned
// (Dataset::want_records(), then take_demands()), and its readers wait in
// await() for the record or the shard; the fetcher (a record that its whole
// shard did not bring within a moment: python/stoker/remote) fetches the
// shard's header and record table by range once (provide_table(): validated as
// opening the file validates it), then the records' bytes (provide_record():
// each checked against its table entry), and the reader reads them from a
// buffer it holds by a shared_ptr. Whichever comes first serves the reader:
// the record, or the whole shard (then the shard's buffered records are
// dropped). The fetcher may decline (no_ranges(): a server without ranges, a
// bad table): the shard's readers then wait for the whole shard. So the first
// batch of a cold epoch needs its records, not its shards. (Only the first:
// later batches would fetch their records twice, by range and in their shards.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/shard_gate.h"
#include "format/shard_table.h"

namespace stoker {

class RecordRanges {
 public:
  using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

  /// For the `n` shards behind `gate` (which must outlive this).
  RecordRanges(size_t n, const ShardGate& gate);
  RecordRanges(const RecordRanges&) = delete;
  RecordRanges& operator=(const RecordRanges&) = delete;

  /// Asks for the records (shard, record) and wakes the fetcher. Never waits.
  void want(const std::vector<std::pair<size_t, int64_t>>& records);
  /// Records asked for, each once, bar those whose shards are provided; taken (cleared).
  std::vector<std::pair<size_t, int64_t>> take_demands();
  /// Record `r` of shard `s`, or null: the shard is provided or failed (read
  /// it), declined, or this thread is not a loader worker (pin it, which
  /// refuses it by name). Waits for the record or the shard, demanding the
  /// shard; Error naming `path` when this thread's stream stops meanwhile.
  Bytes await(size_t s, int64_t r, const std::string& path) const;

  /// Shard `s`'s table, fetched by range and parsed (and checked) by the caller.
  void provide_table(size_t s, ShardTable table);
  /// Bytes of record `r` of shard `s` (after provide_table): checked against the
  /// table (DataError naming the URL and record), kept until the shard is
  /// provided, and handed to the readers waiting for it.
  void provide_record(size_t s, int64_t r, const uint8_t* data, size_t len);
  /// Shard `s` is not served by range: its readers wait for the whole shard.
  void no_ranges(size_t s);
  /// Shard `s` is local now: its buffered records go.
  void drop(size_t s);
  /// Records held for readers now, and their bytes.
  std::pair<int64_t, int64_t> buffered() const;
  /// The name of shard `s` in messages: its URL once its table came, else `path`.
  std::string name(size_t s, const std::string& path) const;

 private:
  static constexpr size_t kStripes = 64;
  struct Partial {  // per shard, guarded by stripes_[s % kStripes]
    std::optional<ShardTable> table;
    bool declined = false;  // no_ranges(): wait for the whole shard
    std::unordered_map<int64_t, Bytes> records;
    int64_t bytes = 0;
  };
  std::mutex& stripe(size_t s) const { return stripes_[s % kStripes]; }

  const ShardGate& gate_;
  std::vector<Partial> partial_;
  mutable std::mutex stripes_[kStripes];
  std::mutex demand_mu_;
  std::vector<std::pair<size_t, int64_t>> demands_;  // guarded by demand_mu_
};

}  // namespace stoker
