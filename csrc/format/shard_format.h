// Shard file layout, version 1. All integers little-endian.
//
//   offset 0      Header (64 bytes): magic "STKSHARD", version, header size,
//                 schema hash, field count, header checksum
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
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::format {

constexpr char kShardMagic[8] = {'S', 'T', 'K', 'S', 'H', 'A', 'R', 'D'};
constexpr char kFooterMagic[8] = {'S', 'T', 'K', 'F', 'O', 'O', 'T', '1'};
constexpr uint32_t kFormatVersion = 1;

#pragma pack(push, 1)
struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint64_t schema_hash;
  uint32_t num_fields;
  uint32_t flags;
  uint8_t reserved[28];
  uint32_t header_sum;  // checksum32 of the 60 bytes before it
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
static_assert(sizeof(RecordEntry) == 16, "a record table entry is 16 bytes on disk");
static_assert(sizeof(ShardFooter) == 32, "the footer is 32 bytes on disk");

/// Largest record the format holds (lengths are u32).
constexpr uint64_t kMaxRecordBytes = 0xFFFFFFFFull;

}  // namespace stoker::format
