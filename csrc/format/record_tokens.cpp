#include "format/record_tokens.h"

#include <cstring>
#include <vector>

#include "common/error.h"
#include "format/field_lengths.h"

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
  const std::vector<int64_t> rows = variable_field_rows(*ds_, field_);
  starts_.reserve(rows.size() + 1);
  for (int64_t n : rows) starts_.push_back(starts_.back() + n);
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
  if (n != doc_length(d))
    STOKER_THROW(DataError, where(d), ": field '", field_name_, "' holds ", n,
                 " tokens, the record table said ", doc_length(d));
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
