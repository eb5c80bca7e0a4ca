#include "format/record_tokens.h"

#include <cstring>
#include <vector>

#include "common/error.h"
#include "format/field_lengths.h"

namespace stoker {

namespace {

int64_t token_value(const uint8_t* p, DType t) {
  switch (t) {
#define STOKER_LOAD(code, T)        \
  case code: {                      \
    T v;                            \
    std::memcpy(&v, p, sizeof v);   \
    return static_cast<int64_t>(v); \
  }
    STOKER_LOAD(DType::kUInt8, uint8_t)
    STOKER_LOAD(DType::kInt8, int8_t)
    STOKER_LOAD(DType::kUInt16, uint16_t)
    STOKER_LOAD(DType::kInt16, int16_t)
    STOKER_LOAD(DType::kUInt32, uint32_t)
    STOKER_LOAD(DType::kInt32, int32_t)
    STOKER_LOAD(DType::kUInt64, uint64_t)
    STOKER_LOAD(DType::kInt64, int64_t)
#undef STOKER_LOAD
    default:
      STOKER_THROW(UsageError, "not an integer type: ", dtype_name(t));
  }
}

}  // namespace

RecordTokenSource::RecordTokenSource(std::shared_ptr<const Dataset> ds, const std::string& field,
                                     const std::string& prompt_field)
    : ds_(std::move(ds)), field_name_(field) {
  const Schema& schema = ds_->schema();
  field_ = schema.index_of(field);
  const FieldSpec& spec = schema.fields[field_];
  STOKER_CHECK(spec.kind == FieldKind::kNDArray && spec.shape.size() == 1 && spec.shape[0] < 0 &&
                   is_token_dtype(spec.dtype),
               UsageError, "field '", field,
               "' does not hold token documents (a 1-D variable-length integer array)");
  dtype_ = spec.dtype;
  if (!prompt_field.empty()) {
    prompt_ = schema.index_of(prompt_field);
    const FieldSpec& p = schema.fields[prompt_];
    STOKER_CHECK(p.kind == FieldKind::kScalar && is_token_dtype(p.dtype), UsageError, "field '",
                 prompt_field, "' is not an integer scalar (a prompt length)");
  }
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
  // (Not releasable: a token dataset over a URL keeps every shard; token_dataset.py.)
  ds_->read(d, views);  // verifies the checksum; the error names shard and record
  const RecordView& v = views[field_];
  const int64_t n = static_cast<int64_t>(v.size / dtype_size(dtype_));
  if (n != doc_length(d))
    STOKER_THROW(DataError, where(d), ": field '", field_name_, "' holds ", n,
                 " tokens, the record table said ", doc_length(d));
  int64_t prefix = 0;
  if (prompt_ != SIZE_MAX) {
    const FieldSpec& p = ds_->schema().fields[prompt_];
    prefix = token_value(views[prompt_].data, p.dtype);
    if (prefix < 0 || prefix > n)
      STOKER_THROW(DataError, where(d), ": prompt length ", prefix, " is outside [0, ", n,
                   "] (the document has ", n, " tokens)");
  }
  return {v.data, n, prefix};
}

std::string RecordTokenSource::where(int64_t d) const {
  Dataset::Location loc = ds_->locate(d);
  return detail::concat(ds_->shard_path(loc.shard), ": record ", loc.record);
}

std::string RecordTokenSource::describe() const {
  return detail::concat("field '", field_name_, "' of a dataset of ", ds_->size(), " records (",
                        dtype_name(dtype_), ")");
}

}  // namespace stoker
