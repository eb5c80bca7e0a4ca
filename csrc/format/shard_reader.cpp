#include "format/shard_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/checksum.h"
#include "common/error.h"

namespace stoker {

using format::RecordEntry;
using format::ShardFooter;
using format::ShardHeader;

ShardReader::ShardReader(std::string path, uint64_t expected_schema_hash, int64_t expected_records,
                         int64_t expected_bytes)
    : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) STOKER_THROW(DataError, path_, ": cannot open shard: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    STOKER_THROW(DataError, path_, ": cannot stat shard: ", std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (expected_bytes >= 0 && static_cast<int64_t>(size_) != expected_bytes) {
    ::close(fd);
    STOKER_THROW(DataError, path_, ": shard is ", size_, " bytes but index.json says ",
                 expected_bytes, " (truncated or replaced file)");
  }
  if (size_ < sizeof(ShardHeader) + sizeof(ShardFooter)) {
    ::close(fd);
    STOKER_THROW(DataError, path_, ": file of ", size_, " bytes is too short to be a shard");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) STOKER_THROW(DataError, path_, ": mmap failed: ", std::strerror(errno));
  base_ = static_cast<const uint8_t*>(p);

  try {
    ShardHeader h;
    std::memcpy(&h, base_, sizeof h);
    if (std::memcmp(h.magic, format::kShardMagic, 8) != 0)
      STOKER_THROW(DataError, path_, ": not a stoker shard (bad magic)");
    if (checksum32(base_, offsetof(ShardHeader, header_sum)) != h.header_sum)
      STOKER_THROW(DataError, path_, ": header checksum mismatch (corrupt header)");
    if (h.version != format::kFormatVersion)
      STOKER_THROW(DataError, path_, ": shard format version ", h.version,
                   " is not supported (this stoker reads version ", format::kFormatVersion, ")");
    if (h.header_size != sizeof(ShardHeader))
      STOKER_THROW(DataError, path_, ": unexpected header size ", h.header_size);
    if (h.schema_hash != expected_schema_hash)
      STOKER_THROW(DataError, path_,
                   ": schema hash does not match index.json "
                   "(shard from another dataset?)");
    num_fields_ = h.num_fields;

    ShardFooter f;
    std::memcpy(&f, base_ + size_ - sizeof f, sizeof f);
    if (std::memcmp(f.magic, format::kFooterMagic, 8) != 0)
      STOKER_THROW(DataError, path_, ": bad footer magic (truncated or unfinished shard)");
    if (checksum32(&f, offsetof(ShardFooter, footer_sum)) != f.footer_sum)
      STOKER_THROW(DataError, path_, ": footer checksum mismatch (corrupt footer)");
    const uint64_t table_end = size_ - sizeof(ShardFooter);
    if (f.table_offset < sizeof(ShardHeader) || f.table_offset > table_end ||
        f.num_records > (table_end - f.table_offset) / sizeof(RecordEntry) ||
        f.table_offset + f.num_records * sizeof(RecordEntry) != table_end)
      STOKER_THROW(DataError, path_, ": record table out of bounds (corrupt footer)");
    if (expected_records >= 0 && static_cast<int64_t>(f.num_records) != expected_records)
      STOKER_THROW(DataError, path_, ": shard holds ", f.num_records,
                   " records but index.json says ", expected_records);
    table_ = reinterpret_cast<const RecordEntry*>(base_ + f.table_offset);
    if (checksum32(table_, f.num_records * sizeof(RecordEntry)) != f.table_sum)
      STOKER_THROW(DataError, path_, ": record table checksum mismatch (corrupt table)");
    num_records_ = static_cast<int64_t>(f.num_records);
    // Records are back to back from the header to the table: check that exactly.
    uint64_t expect = sizeof(ShardHeader);
    for (int64_t i = 0; i < num_records_; ++i) {
      RecordEntry e;
      std::memcpy(&e, table_ + i, sizeof e);
      if (e.offset != expect || e.length > f.table_offset - e.offset ||
          e.length < 4ull * num_fields_)
        STOKER_THROW(DataError, path_, ": record ", i, ": table entry out of bounds");
      expect += e.length;
    }
    if (expect != f.table_offset)
      STOKER_THROW(DataError, path_, ": records do not fill the space before the table");
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

ShardReader::~ShardReader() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

RecordView ShardReader::record_unchecked(int64_t i) const {
  if (i < 0 || i >= num_records_)
    STOKER_THROW(UsageError, path_, ": record ", i, " out of range [0, ", num_records_, ")");
  RecordEntry e;
  std::memcpy(&e, table_ + i, sizeof e);
  return {base_ + e.offset, e.length};
}

RecordView ShardReader::record(int64_t i) const {
  RecordView v = record_unchecked(i);
  uint32_t want;
  std::memcpy(&want, &table_[i].sum, sizeof want);
  if (checksum32(v.data, v.size) != want)
    STOKER_THROW(DataError, path_, ": record ", i, ": checksum mismatch (corrupt data)");
  return v;
}

uint32_t ShardReader::file_checksum() const { return checksum32(base_, size_); }

}  // namespace stoker
