// A dataset: the schema and the shards listed in index.json, addressed by a
// global record index.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/schema.h"
#include "format/shard_reader.h"

namespace stoker {

struct ShardInfo {
  std::string path;
  int64_t num_records = 0;
  int64_t bytes = -1;
};

class Dataset {
 public:
  /// Opens and validates every shard (structure and table checksums).
  Dataset(Schema schema, const std::vector<ShardInfo>& shards);

  const Schema& schema() const { return schema_; }
  int64_t size() const { return total_; }
  size_t num_shards() const { return shards_.size(); }
  const ShardReader& shard(size_t s) const { return *shards_[s]; }

  struct Location {
    size_t shard;
    int64_t record;  ///< index within the shard
  };
  Location locate(int64_t i) const;

  /// Verified, split fields of sample `i` into `out` (one per field).
  /// DataError names the shard file, the record and the reason.
  void read(int64_t i, RecordView* out) const;

 private:
  Schema schema_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::vector<int64_t> starts_;  // first global index of each shard
  int64_t total_ = 0;
};

}  // namespace stoker
