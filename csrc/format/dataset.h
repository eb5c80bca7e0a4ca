// A dataset: the schema and the shards listed in index.json, addressed by a
// global record index. Shards are checked against the index when the dataset
// is opened (header and footer, O(1) each) and mapped on first use, so opening
// costs no mapping and a process maps only the shards it reads.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "format/schema.h"
#include "format/shard_identity.h"
#include "format/shard_reader.h"

namespace stoker {

struct ShardInfo {
  std::string path;
  int64_t num_records = 0;  ///< from index.json; -1: read it from the shard at open
  int64_t bytes = -1;       ///< file size from index.json, -1: any
  /// Format v2: what the shard's header and footer must say. Unset for version 1.
  std::optional<ShardIdentity> identity;
};

class Dataset {
 public:
  struct Options {
    /// Check every shard against the index when the dataset is opened (regular
    /// file, size, header, footer, identity; no mapping). Off, each shard is
    /// checked when first used instead, so that a caller can report every bad
    /// shard rather than the first (`stoker inspect --verify`).
    bool probe_on_open = true;
    /// Map and validate every shard now rather than on first use.
    bool map_on_open = false;
  };

  /// Throws DataError naming the first shard that cannot be opened or does not
  /// match the index (foreign, swapped, stale, truncated, not a regular file).
  Dataset(Schema schema, std::vector<ShardInfo> shards, Options opts);
  Dataset(Schema schema, std::vector<ShardInfo> shards)
      : Dataset(std::move(schema), std::move(shards), Options{}) {}
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const Schema& schema() const { return schema_; }
  int64_t size() const { return total_; }
  size_t num_shards() const { return infos_.size(); }
  const ShardInfo& shard_info(size_t s) const { return infos_[s]; }
  const std::string& shard_path(size_t s) const { return infos_[s].path; }

  /// The reader of shard `s`, mapped and validated on first use (thread-safe;
  /// a failed open is retried by the next call). Throws DataError naming the file.
  const ShardReader& shard(size_t s) const;
  /// Whether shard `s` is mapped (without mapping it).
  bool is_mapped(size_t s) const;
  size_t mapped_shards() const;

  struct Location {
    size_t shard;
    int64_t record;  ///< index within the shard
  };
  Location locate(int64_t i) const;

  /// Verified, split fields of sample `i` into `out` (one per field).
  /// DataError names the shard file, the record and the reason.
  void read(int64_t i, RecordView* out) const;

  /// Throws DataError "<file>: changed on disk while in use" if the shard of
  /// sample `i` was cut short under its mapping (NOTE [ Shards changed under a
  /// reader ] in format/mapped_file.h), so that bytes copied out of it after
  /// their checksum was checked are not trusted. One relaxed load while no
  /// mapping ever faulted: readers call it after using a sample's bytes. (A
  /// shard overwritten in place without being cut short is caught by the next
  /// read of it: read() compares the header.)
  void check_intact(int64_t i) const;

  /// Keeps `fd` open until the dataset is destroyed: the reader lease on the
  /// dataset's generation (python/stoker/writer.py), which stops a later write
  /// from removing the files this dataset maps on first use.
  void hold_lease(int fd);

 private:
  static constexpr size_t kStripes = 64;

  Schema schema_;
  std::vector<ShardInfo> infos_;
  std::vector<int64_t> starts_;  // first global index of each shard
  int64_t total_ = 0;
  std::unique_ptr<std::atomic<const ShardReader*>[]> readers_;
  mutable std::vector<std::unique_ptr<ShardReader>>
      owned_;  // slot s guarded by stripes_[s % kStripes]
  mutable std::mutex stripes_[kStripes];
  int lease_fd_ = -1;
};

}  // namespace stoker
