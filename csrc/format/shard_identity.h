// Identity of a shard (format version 2): which write it belongs to and where
// in that write's index it sits. See the note in format/shard_format.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace stoker {

/// A write's random id, 16 bytes.
struct DatasetId {
  std::array<uint8_t, 16> bytes{};

  /// 32 lowercase hex digits, as index.json stores it.
  std::string hex() const;
  /// Parses 32 hex digits; UsageError otherwise.
  static DatasetId from_hex(const std::string& hex);
  /// 16 random bytes from the operating system (getrandom); DataError if it has none.
  static DatasetId random();
  bool operator==(const DatasetId& o) const { return bytes == o.bytes; }
  bool operator!=(const DatasetId& o) const { return bytes != o.bytes; }
};

/// What index.json says a version-2 shard is; checked against the shard's
/// header and footer whenever the shard is opened.
struct ShardIdentity {
  DatasetId dataset_id;
  uint64_t ordinal = 0;
  uint32_t header_sum = 0;  ///< the header's own checksum
  uint32_t table_sum = 0;   ///< the footer's record-table checksum
};

}  // namespace stoker
