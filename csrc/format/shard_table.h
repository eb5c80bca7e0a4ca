// A shard's record table from bytes fetched by range: the first 64 bytes (the
// header) and the last ones (the record table and the footer), validated as
// opening the shard file validates them (the same checks, in
// format/detail/shard_checks.h). Records fetched by range are then verified
// against it one by one, as ShardReader::record verifies a mapped one.
//
// The table always ends where the footer starts: the writer writes it last,
// right before the footer, and opening refuses a shard whose footer says
// otherwise. So the last shard_tail_bytes(n) bytes of a shard of n records hold
// its table and footer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/shard_expectation.h"
#include "format/shard_format.h"

namespace stoker {

/// The validated header and record table of one shard that is not read from a
/// local file (a URL's shard, fetched by range).
class ShardTable {
 public:
  /// The name used in messages (the shard's URL).
  const std::string& path() const { return path_; }
  int64_t num_records() const { return static_cast<int64_t>(entries_.size()); }
  uint32_t num_fields() const { return header_.num_fields; }
  uint32_t version() const { return header_.version; }
  uint64_t file_size() const { return file_size_; }
  /// Where the records end and the table starts.
  uint64_t table_offset() const { return table_offset_; }
  uint32_t table_sum() const { return table_sum_; }
  const format::ShardHeader& header() const { return header_; }
  /// Record `i`'s entry (offset, length, checksum). UsageError when out of range.
  const format::RecordEntry& entry(int64_t i) const;

 private:
  friend ShardTable parse_shard_table(const std::string&, const uint8_t*, size_t, const uint8_t*,
                                      size_t, uint64_t, const ShardExpectation&);
  std::string path_;
  format::ShardHeader header_{};
  uint64_t file_size_ = 0;
  uint64_t table_offset_ = 0;
  uint32_t table_sum_ = 0;
  std::vector<format::RecordEntry> entries_;
};

/// Bytes at the end of a shard of `num_records` records that hold its record
/// table and footer: 32 + 16 per record. UsageError when negative.
size_t shard_tail_bytes(int64_t num_records);

/// Validates a shard from its first and last bytes and returns its record table.
/// The checks and the DataError messages are those of opening the file
/// (probe_shard and the ShardReader constructor): size, magic, versions 1 and 2,
/// header checksum, schema hash, flags, the version-2 identity against `expect`,
/// footer checksum and magic, record count, table checksum and every entry.
/// @param path_for_messages names the shard in errors (its URL).
/// @param head the shard's first `head_len` bytes, at least the 64-byte header.
/// @param tail the shard's last `tail_len` bytes: the footer and, before it, the
///   record table (shard_tail_bytes of the record count). A tail that holds a
///   valid footer but does not reach back to the table is a UsageError saying
///   how many bytes are needed.
/// @param file_size the shard's size (also checked against `expect.bytes`).
ShardTable parse_shard_table(const std::string& path_for_messages, const uint8_t* head,
                             size_t head_len, const uint8_t* tail, size_t tail_len,
                             uint64_t file_size, const ShardExpectation& expect);

/// Checks the bytes of record `record` fetched on their own against the table:
/// their length and checksum. DataError naming the shard (its URL) and the
/// record on a mismatch; UsageError when `record` is out of range.
void verify_record_bytes(const ShardTable& table, int64_t record, const uint8_t* data, size_t len);

}  // namespace stoker
