// Writes one shard file. The file is written under a temporary name and
// renamed into place by finish(), so a crash never leaves a file that looks
// complete.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/checksum.h"

namespace stoker {

struct ShardSummary {
  int64_t num_records = 0;
  uint64_t bytes = 0;
  uint32_t checksum = 0;  ///< checksum32 of the whole file
};

class ShardWriter {
 public:
  /// Creates `path`.tmp; throws DataError when it cannot (naming the path and errno).
  ShardWriter(std::string path, uint64_t schema_hash, uint32_t num_fields);
  ~ShardWriter();  ///< removes the temporary file if finish() was not reached
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends one encoded record (field lengths + payloads).
  void append(const uint8_t* data, size_t size);
  /// Bytes written so far (the file size if it were finished now, minus table/footer).
  uint64_t bytes_written() const { return offset_; }
  int64_t num_records() const { return static_cast<int64_t>(table_.size() / 16); }
  /// Writes table and footer, flushes, renames to `path`.
  ShardSummary finish();
  /// Drops the file.
  void abort() noexcept;

 private:
  void write(const void* p, size_t n);

  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  uint32_t num_fields_;
  uint64_t offset_ = 0;
  StreamingChecksum file_sum_;
  std::string table_;
};

}  // namespace stoker
