#include "format/detail/shard_checks.h"

#include <cstddef>
#include <cstring>

#include "common/checksum.h"
#include "common/error.h"

namespace stoker::detail {

using format::RecordEntry;
using format::ShardFooter;
using format::ShardHeader;

void check_shard_size(const std::string& path, uint64_t size, const ShardExpectation& expect) {
  if (expect.bytes >= 0 && size != static_cast<uint64_t>(expect.bytes))
    STOKER_THROW(DataError, path, ": shard is ", size, " bytes but index.json says ", expect.bytes,
                 " (truncated or replaced file)");
  if (size < sizeof(ShardHeader) + sizeof(ShardFooter))
    STOKER_THROW(DataError, path, ": file of ", size, " bytes is too short to be a shard");
}

void check_shard_header(const std::string& path, const ShardHeader& h,
                        const ShardExpectation& expect) {
  if (std::memcmp(h.magic, format::kShardMagic, 8) != 0)
    STOKER_THROW(DataError, path, ": not a stoker shard (bad magic)");
  if (checksum32(&h, offsetof(ShardHeader, header_sum)) != h.header_sum)
    STOKER_THROW(DataError, path, ": header checksum mismatch (corrupt header)");
  if (h.version < format::kMinFormatVersion || h.version > format::kFormatVersion)
    STOKER_THROW(DataError, path, ": shard format version ", h.version,
                 " is not supported (this stoker reads versions ", format::kMinFormatVersion,
                 " to ", format::kFormatVersion, ")");
  if (h.header_size != sizeof(ShardHeader))
    STOKER_THROW(DataError, path, ": unexpected header size ", h.header_size);
  if (h.flags != 0 || h.reserved != 0)
    STOKER_THROW(DataError, path, ": unknown header flags ", h.flags,
                 " (written by a newer stoker?)");
  if (h.schema_hash != expect.schema_hash)
    STOKER_THROW(DataError, path,
                 ": schema hash does not match index.json "
                 "(shard from another dataset?)");
  if (!expect.identity) return;
  const ShardIdentity& want = *expect.identity;
  if (h.version < 2)
    STOKER_THROW(DataError, path,
                 ": a version-1 shard (no dataset id) in a version-2 "
                 "dataset: it belongs to another dataset");
  DatasetId got;
  std::memcpy(got.bytes.data(), h.dataset_id, 16);
  if (got != want.dataset_id)
    STOKER_THROW(DataError, path,
                 ": belongs to another dataset or another write of this "
                 "one: its dataset id is ",
                 got.hex(), ", index.json's is ", want.dataset_id.hex(),
                 " (foreign or stale shard)");
  if (h.ordinal != want.ordinal)
    STOKER_THROW(DataError, path, ": is shard ", h.ordinal,
                 " of its dataset but index.json "
                 "lists it as shard ",
                 want.ordinal, " (shards swapped or reordered)");
  if (h.header_sum != want.header_sum)
    STOKER_THROW(DataError, path, ": header checksum ", h.header_sum, " differs from index.json's ",
                 want.header_sum);
}

void check_shard_footer(const std::string& path, const ShardFooter& f, uint64_t size,
                        const ShardExpectation& expect) {
  if (std::memcmp(f.magic, format::kFooterMagic, 8) != 0)
    STOKER_THROW(DataError, path, ": bad footer magic (truncated or unfinished shard)");
  if (checksum32(&f, offsetof(ShardFooter, footer_sum)) != f.footer_sum)
    STOKER_THROW(DataError, path, ": footer checksum mismatch (corrupt footer)");
  const uint64_t table_end = size - sizeof(ShardFooter);
  if (f.table_offset < sizeof(ShardHeader) || f.table_offset > table_end ||
      f.num_records > (table_end - f.table_offset) / sizeof(RecordEntry) ||
      f.table_offset + f.num_records * sizeof(RecordEntry) != table_end)
    STOKER_THROW(DataError, path, ": record table out of bounds (corrupt footer)");
  if (expect.num_records >= 0 && f.num_records != static_cast<uint64_t>(expect.num_records))
    STOKER_THROW(DataError, path, ": shard holds ", f.num_records, " records but index.json says ",
                 expect.num_records);
  if (expect.identity && f.table_sum != expect.identity->table_sum)
    STOKER_THROW(DataError, path, ": record table checksum ", f.table_sum,
                 " differs from index.json's ", expect.identity->table_sum,
                 " (stale or rewritten shard)");
}

bool table_sum_matches(const void* table, uint64_t num_records, uint32_t table_sum) {
  return checksum32(table, static_cast<size_t>(num_records) * sizeof(RecordEntry)) == table_sum;
}

void throw_table_sum_mismatch(const std::string& path) {
  STOKER_THROW(DataError, path, ": record table checksum mismatch (corrupt table)");
}

void check_table_entries(const std::string& path, const uint8_t* table, uint64_t num_records,
                         uint64_t table_offset, uint32_t num_fields) {
  // Records are back to back from the header to the table: check that exactly.
  uint64_t next = sizeof(ShardHeader);
  for (uint64_t i = 0; i < num_records; ++i) {
    RecordEntry e;
    std::memcpy(&e, table + i * sizeof(RecordEntry), sizeof e);
    if (e.offset != next || e.length > table_offset - e.offset || e.length < 4ull * num_fields)
      STOKER_THROW(DataError, path, ": record ", i, ": table entry out of bounds");
    next += e.length;
  }
  if (next != table_offset)
    STOKER_THROW(DataError, path, ": records do not fill the space before the table");
}

}  // namespace stoker::detail
