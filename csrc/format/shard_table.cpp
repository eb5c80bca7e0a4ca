#include "format/shard_table.h"

#include <cstring>
#include <limits>

#include "common/checksum.h"
#include "common/error.h"
#include "format/detail/shard_checks.h"

namespace stoker {

using format::RecordEntry;
using format::ShardFooter;
using format::ShardHeader;

const RecordEntry& ShardTable::entry(int64_t i) const {
  if (i < 0 || i >= num_records())
    STOKER_THROW(UsageError, path_, ": record ", i, " out of range [0, ", num_records(), ")");
  return entries_[static_cast<size_t>(i)];
}

size_t shard_tail_bytes(int64_t num_records) {
  constexpr auto kMax =
      (std::numeric_limits<size_t>::max() - sizeof(ShardFooter)) / sizeof(RecordEntry);
  if (num_records < 0 || static_cast<uint64_t>(num_records) > kMax)
    STOKER_THROW(UsageError, "record count ", num_records, " out of range");
  return sizeof(ShardFooter) + static_cast<size_t>(num_records) * sizeof(RecordEntry);
}

ShardTable parse_shard_table(const std::string& path, const uint8_t* head, size_t head_len,
                             const uint8_t* tail, size_t tail_len, uint64_t file_size,
                             const ShardExpectation& expect) {
  // The order of probe_shard and the ShardReader constructor, so that a shard
  // is refused for the same first reason either way.
  detail::check_shard_size(path, file_size, expect);
  if (head_len < sizeof(ShardHeader))
    STOKER_THROW(UsageError, path, ": ", head_len, " head bytes given, the header needs ",
                 sizeof(ShardHeader));
  if (tail_len < sizeof(ShardFooter) || tail_len > file_size)
    STOKER_THROW(UsageError, path, ": ", tail_len, " tail bytes given for a file of ", file_size,
                 " bytes; the footer needs ", sizeof(ShardFooter));
  ShardTable t;
  t.path_ = path;
  t.file_size_ = file_size;
  ShardFooter f;
  std::memcpy(&t.header_, head, sizeof(ShardHeader));
  std::memcpy(&f, tail + tail_len - sizeof f, sizeof f);
  detail::check_shard_header(path, t.header_, expect);
  detail::check_shard_footer(path, f, file_size, expect);
  // The footer is intact and its table ends where it starts (checked above).
  const uint64_t needed = file_size - f.table_offset;
  if (tail_len < needed)
    STOKER_THROW(UsageError, path, ": the last ", tail_len,
                 " bytes do not reach the record table at offset ", f.table_offset, ": the last ",
                 needed, " bytes are needed (", f.num_records, " records)");
  const uint8_t* table = tail + (tail_len - needed);
  if (!detail::table_sum_matches(table, f.num_records, f.table_sum))
    detail::throw_table_sum_mismatch(path);
  detail::check_table_entries(path, table, f.num_records, f.table_offset, t.header_.num_fields);
  t.table_offset_ = f.table_offset;
  t.table_sum_ = f.table_sum;
  t.entries_.resize(static_cast<size_t>(f.num_records));
  if (f.num_records > 0)
    std::memcpy(t.entries_.data(), table, static_cast<size_t>(f.num_records) * sizeof(RecordEntry));
  return t;
}

void verify_record_bytes(const ShardTable& table, int64_t record, const uint8_t* data, size_t len) {
  const RecordEntry& e = table.entry(record);
  if (len != e.length)
    STOKER_THROW(DataError, table.path(), ": record ", record, ": ", len,
                 " bytes, the record table gives ", e.length);
  if (checksum32(data, len) != e.sum)
    STOKER_THROW(DataError, table.path(), ": record ", record,
                 ": checksum mismatch (corrupt data)");
}

}  // namespace stoker
