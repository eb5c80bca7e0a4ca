// Per-record lengths of a variable-length field, known without reading any
// payload: what length-based plans (token packing, token-budget batches,
// length bucketing of any variable field) need up front.
//
// When the field is the schema's only variable-length field, its length is the
// record length (from the shard's record table, checksummed and validated at
// open) minus the field table and the fixed fields: no record page is touched.
// Otherwise each record's 4-byte field table is read (not yet verified: a
// record whose table lies fails its checksum when it is read).
#pragma once

#include <cstdint>
#include <vector>

#include "format/dataset.h"

namespace stoker {

/// Rows (steps of the variable first dimension; bytes for blobs and images) of
/// field `field` in every record of `ds`, in global record order. DataError
/// naming shard and record for a length that is not a whole number of rows.
std::vector<int64_t> variable_field_rows(const Dataset& ds, size_t field);

}  // namespace stoker
