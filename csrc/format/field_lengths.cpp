#include "format/field_lengths.h"

#include <cstring>

#include "common/error.h"

namespace stoker {

std::vector<int64_t> variable_field_rows(const Dataset& ds, size_t field) {
  const Schema& schema = ds.schema();
  STOKER_CHECK(field < schema.fields.size(), UsageError, "field index ", field, " out of range");
  const FieldSpec& spec = schema.fields[field];
  STOKER_CHECK(spec.variable(), UsageError, "field '", spec.name, "' has a fixed length");
  const size_t nf = schema.fields.size();
  const size_t row = spec.row_bytes();
  size_t fixed = 4 * nf;
  bool only_variable = true;
  for (size_t f = 0; f < nf; ++f) {
    if (f == field) continue;
    if (schema.fields[f].variable())
      only_variable = false;
    else
      fixed += schema.fields[f].fixed_bytes();
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(ds.size()));
  for (size_t s = 0; s < ds.num_shards(); ++s) {
    const Dataset::ShardPin held = ds.pin(s);
    const ShardReader& r = held.reader();
    for (int64_t i = 0; i < r.num_records(); ++i) {
      const RecordView rec = r.record_unchecked(i);
      uint64_t bytes;
      if (only_variable) {
        if (rec.size < fixed)
          STOKER_THROW(DataError, r.path(), ": record ", i, ": ", rec.size,
                       " bytes, shorter than its fixed fields");
        bytes = rec.size - fixed;
      } else {
        uint32_t len;
        std::memcpy(&len, rec.data + 4 * field, 4);
        bytes = len;
      }
      if (bytes % row != 0)
        STOKER_THROW(DataError, r.path(), ": record ", i, ": field '", spec.name, "' has ", bytes,
                     " bytes, not a whole number of rows of ", row);
      out.push_back(static_cast<int64_t>(bytes / row));
    }
  }
  return out;
}

}  // namespace stoker
