// Read-only view of one shard file through mmap. Opening checks the whole
// structure (header, footer, table and its checksum, every entry's bounds), so
// later reads only need the per-record checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/shard_format.h"

namespace stoker {

/// Bytes of one record inside the mapping.
struct RecordView {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

class ShardReader {
 public:
  /// Maps `path` and validates its structure.
  /// @param expected_schema_hash the index's schema hash; a different one is an error
  /// @param expected_records record count from the index, or -1 to accept any
  /// @param expected_bytes file size from the index, or -1 to accept any
  /// Throws DataError naming the file and the reason.
  ShardReader(std::string path, uint64_t expected_schema_hash, int64_t expected_records,
              int64_t expected_bytes);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_records() const { return num_records_; }
  size_t file_size() const { return size_; }
  uint32_t num_fields() const { return num_fields_; }

  /// Record `i` after checking its checksum; DataError naming file and record on mismatch.
  RecordView record(int64_t i) const;
  /// Record `i` without the checksum check (structure is still bounds-checked at open).
  RecordView record_unchecked(int64_t i) const;
  /// checksum32 of the whole file (reads every byte).
  uint32_t file_checksum() const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  int64_t num_records_ = 0;
  uint32_t num_fields_ = 0;
  const format::RecordEntry* table_ = nullptr;
};

}  // namespace stoker
