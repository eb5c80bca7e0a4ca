#include "format/record_tokens.h"

#include <cstring>
#include <vector>

#include "common/error.h"

namespace stoker {

RecordTokenSource::RecordTokenSource(std::shared_ptr<const Dataset> ds, const std::string& field)
    : ds_(std::move(ds)), field_name_(field) {
  const Schema& schema = ds_->schema();
  field_ = schema.index_of(field);
  const FieldSpec& spec = schema.fields[field_];
  STOKER_CHECK(spec.kind == FieldKind::kNDArray && spec.shape.size() == 1 && spec.shape[0] < 0 &&
                   is_token_dtype(spec.dtype),
               UsageError, "field '", field,
               "' does not hold token documents (a 1-D variable-length integer array)");
  dtype_ = spec.dtype;
  const size_t nf = schema.fields.size();
  const size_t item = dtype_size(dtype_);
  size_t fixed = 4 * nf;
  bool only_variable = true;
  for (size_t f = 0; f < nf; ++f) {
    if (f == field_) continue;
    if (schema.fields[f].variable()) only_variable = false;
    else fixed += schema.fields[f].fixed_bytes();
  }
  starts_.reserve(static_cast<size_t>(ds_->size()) + 1);
  for (size_t s = 0; s < ds_->num_shards(); ++s) {
    const ShardReader& r = ds_->shard(s);
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
        std::memcpy(&len, rec.data + 4 * field_, 4);
        bytes = len;
      }
      if (bytes % item != 0)
        STOKER_THROW(DataError, r.path(), ": record ", i, ": field '", field, "' has ", bytes,
                     " bytes, not a whole number of ", dtype_name(dtype_), " tokens");
      starts_.push_back(starts_.back() + static_cast<int64_t>(bytes / item));
    }
  }
}

TokenSpan RecordTokenSource::doc(int64_t d) const {
  const size_t nf = ds_->schema().fields.size();
  RecordView small[8];
  std::vector<RecordView> big;
  RecordView* views = small;
  if (nf > 8) {
    big.resize(nf);
    views = big.data();
  }
  ds_->read(d, views);  // verifies the checksum; the error names shard and record
  const RecordView& v = views[field_];
  const int64_t n = static_cast<int64_t>(v.size / dtype_size(dtype_));
  if (n != doc_length(d)) STOKER_THROW(DataError, where(d), ": field '", field_name_, "' holds ",
                                       n, " tokens, the record table said ", doc_length(d));
  return {v.data, n};
}

std::string RecordTokenSource::where(int64_t d) const {
  Dataset::Location loc = ds_->locate(d);
  return detail::concat(ds_->shard(loc.shard).path(), ": record ", loc.record);
}

std::string RecordTokenSource::describe() const {
  return detail::concat("field '", field_name_, "' of a dataset of ", ds_->size(), " records (",
                        dtype_name(dtype_), ")");
}

}  // namespace stoker
