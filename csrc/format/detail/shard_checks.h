// The checks a shard passes when it is opened, over its header, footer and
// record table as bytes in memory: shared by the reader of a mapped file
// (shard_reader.cpp) and the parser of bytes fetched by range
// (shard_table.cpp), so that both refuse the same shards with the same
// messages. Every check throws DataError "<path>: <reason>".
#pragma once

#include <cstdint>
#include <string>

#include "format/shard_expectation.h"
#include "format/shard_format.h"

namespace stoker::detail {

/// The file's size against index.json's, and at least a header and a footer.
void check_shard_size(const std::string& path, uint64_t size, const ShardExpectation& expect);

/// Magic, header checksum, version, header size, flags, schema hash and, when
/// `expect` has one, the version-2 identity (dataset id, ordinal, header checksum).
void check_shard_header(const std::string& path, const format::ShardHeader& h,
                        const ShardExpectation& expect);

/// Magic, footer checksum, the record table ending exactly where the footer
/// starts in a file of `size` bytes, the record count and, when `expect` has an
/// identity, the table checksum.
void check_shard_footer(const std::string& path, const format::ShardFooter& f, uint64_t size,
                        const ShardExpectation& expect);

/// Whether `num_records` entries at `table` (any alignment) have checksum `table_sum`.
bool table_sum_matches(const void* table, uint64_t num_records, uint32_t table_sum);

/// Throws "<path>: record table checksum mismatch (corrupt table)".
[[noreturn]] void throw_table_sum_mismatch(const std::string& path);

/// Every entry of a table whose footer passed check_shard_footer: records back
/// to back from the end of the header to `table_offset`, each at least its
/// field table (4 bytes per field) long. `table` may have any alignment.
void check_table_entries(const std::string& path, const uint8_t* table, uint64_t num_records,
                         uint64_t table_offset, uint32_t num_fields);

}  // namespace stoker::detail
