#include "format/shard_writer.h"

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/checksum.h"
#include "common/error.h"
#include "format/shard_format.h"

namespace stoker {

ShardWriter::ShardWriter(std::string path, uint64_t schema_hash, uint32_t num_fields)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), num_fields_(num_fields) {
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_) STOKER_THROW(DataError, tmp_path_, ": cannot create shard: ", std::strerror(errno));
  format::ShardHeader h{};
  std::memcpy(h.magic, format::kShardMagic, 8);
  h.version = format::kFormatVersion;
  h.header_size = sizeof h;
  h.schema_hash = schema_hash;
  h.num_fields = num_fields;
  h.header_sum = checksum32(&h, offsetof(format::ShardHeader, header_sum));
  write(&h, sizeof h);
}

ShardWriter::~ShardWriter() { abort(); }

void ShardWriter::write(const void* p, size_t n) {
  if (!file_) STOKER_THROW(UsageError, path_, ": shard writer is closed");
  if (std::fwrite(p, 1, n, file_) != n) {
    int err = errno;
    abort();
    STOKER_THROW(DataError, tmp_path_, ": write failed: ", std::strerror(err));
  }
  file_sum_.update(p, n);
  offset_ += n;
}

void ShardWriter::append(const uint8_t* data, size_t size) {
  if (size > format::kMaxRecordBytes)
    STOKER_THROW(UsageError, "record of ", size, " bytes is over the 4 GiB record limit");
  if (size < 4ull * num_fields_)
    STOKER_THROW(UsageError, "record of ", size, " bytes is shorter than its field table");
  format::RecordEntry e{offset_, static_cast<uint32_t>(size), checksum32(data, size)};
  write(data, size);
  table_.append(reinterpret_cast<const char*>(&e), sizeof e);
}

ShardSummary ShardWriter::finish() {
  format::ShardFooter f{};
  f.table_offset = offset_;
  f.num_records = table_.size() / sizeof(format::RecordEntry);
  write(table_.data(), table_.size());
  f.table_sum = checksum32(table_.data(), table_.size());
  std::memcpy(f.magic, format::kFooterMagic, 8);
  f.footer_sum = checksum32(&f, offsetof(format::ShardFooter, footer_sum));
  write(&f, sizeof f);
  int rc = std::fflush(file_);
  int err = errno;
  if (rc == 0) rc = ::fsync(fileno(file_));
  if (rc != 0) err = errno;
  if (std::fclose(file_) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  file_ = nullptr;
  if (rc != 0) {
    std::remove(tmp_path_.c_str());
    STOKER_THROW(DataError, tmp_path_, ": flush failed: ", std::strerror(err));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(tmp_path_.c_str());
    STOKER_THROW(DataError, path_, ": rename failed: ", std::strerror(err));
  }
  return {static_cast<int64_t>(f.num_records), offset_, file_sum_.digest()};
}

void ShardWriter::abort() noexcept {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_path_.c_str());
  }
}

}  // namespace stoker
