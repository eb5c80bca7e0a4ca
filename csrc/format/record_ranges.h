// Records of a deferred shard that readers may have before the shard itself:
// the bytes the fetcher fetched by range, checked against the shard's record
// table, held for the readers that wait for them.
//
// NOTE [ Records by range ]
// Before a deferred shard is local, a reader may have single records of it.
// The first batch of an epoch asks for its records when it is planned
// (Dataset::want_records(), then take_demands()), and its readers wait in
// Dataset::pin_record() for the record or the shard; the fetcher (a record
// that its whole shard did not bring within a moment: python/stoker/remote)
// fetches the shard's header and record table by range once (provide_table():
// validated as opening the file validates it), then the records' bytes
// (provide_record(): each checked against its table entry), and the reader
// reads them from a buffer it holds by a shared_ptr. Whichever comes first
// serves the reader: the record, or the whole shard (then the shard's
// buffered records are dropped). The fetcher may decline (decline(): a server
// without ranges, a bad table): the shard's readers then wait for the whole
// shard. So the first batch of a cold epoch needs its records, not its
// shards. (Only the first: later batches would fetch their records twice, by
// range and in their shards.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/detail/fork_locks.h"
#include "format/shard_table.h"

namespace stoker {

class RecordRanges final : public detail::ForkClient {
 public:
  /// @param stripes the dataset's per-shard locks; a shard's records are kept under its stripe
  RecordRanges(size_t num_shards, detail::StripedMutex& stripes);
  ~RecordRanges();
  RecordRanges(const RecordRanges&) = delete;
  RecordRanges& operator=(const RecordRanges&) = delete;

  /// Records (shard, record) that readers will ask for; never waits.
  void want(const std::vector<std::pair<size_t, int64_t>>& records);
  /// The records asked for, each once, in (shard, record) order, without
  /// those of shards `local(shard)` says are here already; taken (cleared).
  std::vector<std::pair<size_t, int64_t>> take_demands(const std::function<bool(size_t)>& local);
  /// Shard `s`'s record table, validated by the caller (parse_shard_table).
  void provide_table(size_t s, ShardTable table);
  /// Bytes of record `r` of shard `s` (after provide_table): checked against
  /// the table (DataError naming the URL and record) and kept for the readers,
  /// unless `shard_ready()` (asked under the shard's lock) says the shard came
  /// first. Whether they were kept.
  bool provide_record(size_t s, int64_t r, const uint8_t* data, size_t len,
                      const std::function<bool()>& shard_ready);
  /// Shard `s` is not served by range: its readers wait for the whole shard.
  void decline(size_t s);
  /// The whole shard is here: its buffered records go.
  void drop(size_t s);

  struct Found {
    bool declined = false;
    std::shared_ptr<const std::vector<uint8_t>> record;  ///< null: not (yet) here
  };
  Found find(size_t s, int64_t r) const;
  /// The URL that names shard `s` (its table's path), or `fallback`.
  std::string url(size_t s, const std::string& fallback) const;
  /// Records held now, and their bytes.
  std::pair<int64_t, int64_t> buffered() const;

  int fork_level() const override { return 1; }
  void before_fork() override { demand_mu_.lock(); }
  void after_fork(bool) override { demand_mu_.unlock(); }

 private:
  struct Partial {  // one shard's, guarded by stripes_[s]
    std::optional<ShardTable> table;
    bool declined = false;
    std::unordered_map<int64_t, std::shared_ptr<const std::vector<uint8_t>>> records;
    int64_t bytes = 0;
  };
  detail::StripedMutex& stripes_;
  std::vector<Partial> partial_;
  std::mutex demand_mu_;
  std::vector<std::pair<size_t, int64_t>> demands_;  // guarded by demand_mu_
};

}  // namespace stoker
