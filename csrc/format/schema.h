// Field types of a dataset and how a record splits into field payloads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "format/shard_reader.h"

namespace stoker {

/// kVideo and kAudio hold a media record (codecs/media_record.h): bytes, like a blob.
enum class FieldKind : uint8_t { kScalar, kNDArray, kBlob, kImage, kVideo, kAudio };

struct FieldSpec {
  std::string name;
  FieldKind kind = FieldKind::kBlob;
  DType dtype = DType::kUInt8;
  /// Element shape of one sample; for kNDArray the first dimension may be -1
  /// (variable length). Empty for scalars, blobs, images, videos and audio.
  std::vector<int64_t> shape;

  bool variable() const;       ///< payload length varies per sample
  size_t fixed_bytes() const;  ///< payload bytes when !variable()
  size_t row_bytes() const;    ///< bytes per step of the variable dimension (1 for blobs/images)
};

struct Schema {
  std::vector<FieldSpec> fields;
  uint64_t hash = 0;
  /// Index of the field named `name`; UsageError if absent.
  size_t index_of(const std::string& name) const;
};

/// Splits `rec` into one view per field; checks lengths against the schema.
/// Throws DataError (without file context: the caller adds it).
void split_record(const Schema& schema, RecordView rec, RecordView* out);

}  // namespace stoker
