// Writes one shard file. The file is written under a temporary name and
// renamed into place by finish(), so a crash never leaves a file that looks
// complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/checksum.h"
#include "format/shard_identity.h"

namespace stoker {

class ShardReader;

struct ShardSummary {
  int64_t num_records = 0;
  uint64_t bytes = 0;
  uint32_t checksum = 0;    ///< checksum32 of the whole file
  uint32_t header_sum = 0;  ///< the header's checksum (index.json's "header_checksum")
  uint32_t table_sum = 0;   ///< the record table's checksum (index.json's "table_checksum")
};

class ShardWriter {
 public:
  /// Creates `path`.tmp with a version-2 header carrying `dataset_id` and
  /// `ordinal` (the shard's position in index.json); throws DataError when it
  /// cannot (naming the path and errno).
  ShardWriter(std::string path, uint64_t schema_hash, uint32_t num_fields,
              const DatasetId& dataset_id = {}, uint64_t ordinal = 0);
  ~ShardWriter();  ///< removes the temporary file if finish() was not reached
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends one encoded record (field lengths + payloads).
  void append(const uint8_t* data, size_t size);
  /// Appends every record of another shard with the same schema, copying the
  /// bytes and checksums as they are (no decoding) after verifying each
  /// record's checksum. This is how a version-1 dataset is upgraded and how
  /// datasets written in parts can be merged: the records move under this
  /// shard's header, so they take this write's identity.
  void append_shard(const ShardReader& src);
  /// Bytes written so far (the file size if it were finished now, minus table/footer).
  uint64_t bytes_written() const { return offset_; }
  int64_t num_records() const { return static_cast<int64_t>(table_.size() / 16); }
  /// Writes table and footer, flushes and fsyncs, renames to `path`.
  ShardSummary finish();
  /// Drops the file.
  void abort() noexcept;

 private:
  void write(const void* p, size_t n);

  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  uint32_t num_fields_;
  uint64_t schema_hash_;
  uint32_t header_sum_ = 0;
  uint64_t offset_ = 0;
  StreamingChecksum file_sum_;
  std::string table_;
};

}  // namespace stoker
