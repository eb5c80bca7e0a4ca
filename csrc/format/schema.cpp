#include "format/schema.h"

#include <cstring>

#include "common/error.h"

namespace stoker {

namespace {

bool bytes_kind(FieldKind k) {
  return k == FieldKind::kBlob || k == FieldKind::kImage || k == FieldKind::kVideo ||
         k == FieldKind::kAudio;
}

}  // namespace

bool FieldSpec::variable() const {
  if (bytes_kind(kind)) return true;
  return !shape.empty() && shape[0] < 0;
}

size_t FieldSpec::row_bytes() const {
  if (bytes_kind(kind)) return 1;
  size_t n = dtype_size(dtype);
  for (size_t i = 1; i < shape.size(); ++i) n *= static_cast<size_t>(shape[i]);
  return n;
}

size_t FieldSpec::fixed_bytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

size_t Schema::index_of(const std::string& name) const {
  for (size_t i = 0; i < fields.size(); ++i)
    if (fields[i].name == name) return i;
  STOKER_THROW(UsageError, "no field named '", name, "' in the dataset");
}

void split_record(const Schema& schema, RecordView rec, RecordView* out) {
  const size_t nf = schema.fields.size();
  const size_t head = 4 * nf;
  if (rec.size < head) STOKER_THROW(DataError, "record shorter than its field table");
  const uint8_t* p = rec.data + head;
  size_t left = rec.size - head;
  for (size_t f = 0; f < nf; ++f) {
    uint32_t len;
    std::memcpy(&len, rec.data + 4 * f, 4);
    const FieldSpec& spec = schema.fields[f];
    if (len > left)
      STOKER_THROW(DataError, "field '", spec.name, "': length ", len, " runs past the record");
    if (!spec.variable()) {
      if (len != spec.fixed_bytes())
        STOKER_THROW(DataError, "field '", spec.name, "': ", len, " bytes, expected ",
                     spec.fixed_bytes());
    } else if (len % spec.row_bytes() != 0) {
      STOKER_THROW(DataError, "field '", spec.name, "': ", len,
                   " bytes is not a whole number of rows of ", spec.row_bytes());
    }
    out[f] = {p, len};
    p += len;
    left -= len;
  }
  if (left != 0) STOKER_THROW(DataError, "record has ", left, " trailing bytes");
}

}  // namespace stoker
