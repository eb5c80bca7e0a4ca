// What index.json says about a shard, checked whenever the shard is opened:
// from its file (probe_shard, ShardReader) or from bytes fetched by range
// (parse_shard_table).
#pragma once

#include <cstdint>
#include <optional>

#include "format/shard_identity.h"

namespace stoker {

/// What index.json says about a shard; each part that is set must match.
struct ShardExpectation {
  uint64_t schema_hash = 0;
  int64_t num_records = -1;  ///< -1: any
  int64_t bytes = -1;        ///< file size, -1: any
  /// Format v2: dataset id, ordinal, header and table checksums. Unset for
  /// version-1 datasets, whose shards carry no identity.
  std::optional<ShardIdentity> identity;
};

}  // namespace stoker
