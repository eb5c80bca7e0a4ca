// Shard file layout, version 2 (version 1 is still read). All integers little-endian.
//
//   offset 0      Header (64 bytes): magic "STKSHARD", version, header size,
//                 schema hash, field count, flags, dataset id, ordinal, header checksum
//   offset 64     records, back to back, no padding. A record is
//                   u32 length of each field (field count of them)
//                   the field payloads in schema order
//   table_offset  record table: num_records x {u64 offset, u32 length, u32 checksum}
//   end - 32      Footer (32 bytes): table offset, record count, table checksum,
//                 footer checksum, magic "STKFOOT1"
//
// Checksums are checksum32 (common/checksum.h). Every byte is covered: header
// and footer by their own checksum, the table by the footer's table checksum,
// each record by its entry's checksum (checked on every read).
// There is no padding anywhere, so no byte can change unnoticed.
//
// Identity (version 2). Every write of a dataset draws a random 128-bit dataset
// id; each shard's header carries it and the shard's ordinal (its position in
// index.json's list), and index.json carries the id and, per shard, the header
// checksum and the table checksum. Opening compares them from the header and
// the footer alone (O(1) per shard), so a shard of another dataset, of another
// write of the same dataset, or in the wrong place is refused by name even when
// its schema, size and record count happen to match. Version 1 had the id and
// ordinal bytes reserved (zero): a version-1 header parses as a version-2 one
// without identity.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::format {

constexpr char kShardMagic[8] = {'S', 'T', 'K', 'S', 'H', 'A', 'R', 'D'};
constexpr char kFooterMagic[8] = {'S', 'T', 'K', 'F', 'O', 'O', 'T', '1'};
/// What the writer writes.
constexpr uint32_t kFormatVersion = 2;
/// The oldest version the reader opens (without identity checks).
constexpr uint32_t kMinFormatVersion = 1;

#pragma pack(push, 1)
struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint64_t schema_hash;
  uint32_t num_fields;
  uint32_t flags;          // no flag is defined: must be 0
  uint8_t dataset_id[16];  // v2: the write's random id (zero in v1)
  uint64_t ordinal;        // v2: position of the shard in index.json (zero in v1)
  uint32_t reserved;       // must be 0
  uint32_t header_sum;     // checksum32 of the 60 bytes before it
};

struct RecordEntry {
  uint64_t offset;
  uint32_t length;
  uint32_t sum;  // checksum32 of the record's bytes
};

struct ShardFooter {
  uint64_t table_offset;
  uint64_t num_records;
  uint32_t table_sum;   // checksum32 of the record table
  uint32_t footer_sum;  // checksum32 of the 20 bytes before it
  char magic[8];
};
#pragma pack(pop)

static_assert(sizeof(ShardHeader) == 64, "the header is 64 bytes on disk");
static_assert(offsetof(ShardHeader, dataset_id) == 32,
              "the dataset id occupies what version 1 reserved");
static_assert(offsetof(ShardHeader, header_sum) == 60, "the header checksum ends the header");
static_assert(sizeof(RecordEntry) == 16, "a record table entry is 16 bytes on disk");
static_assert(sizeof(ShardFooter) == 32, "the footer is 32 bytes on disk");

/// Largest record the format holds (lengths are u32).
constexpr uint64_t kMaxRecordBytes = 0xFFFFFFFFull;

}  // namespace stoker::format
