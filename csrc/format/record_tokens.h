// The token documents of a stoker dataset: one field of integer tokens (a
// `stoker.tokens` field, stored as a variable-length array), one document per
// record. Every read verifies the record's checksum, as for any record.
//
// Document lengths come from the record table without reading payloads
// (format/field_lengths.h), so planning reads no token data.
#pragma once

#include <memory>
#include <string>

#include "format/dataset.h"
#include "format/token_source.h"

namespace stoker {

class RecordTokenSource : public TokenSource {
 public:
  /// @param field name of a variable-length integer array field of `ds`.
  /// @param prompt_field name of an integer scalar field holding how many leading
  ///        tokens of each document are a prompt (no training target), or "".
  RecordTokenSource(std::shared_ptr<const Dataset> ds, const std::string& field,
                    const std::string& prompt_field = "");

  TokenSpan doc(int64_t d) const override;
  std::string where(int64_t d) const override;
  std::string describe() const override;

  const Dataset& dataset() const { return *ds_; }

 private:
  std::shared_ptr<const Dataset> ds_;
  size_t field_ = 0;
  std::string field_name_;
  size_t prompt_ = SIZE_MAX;  // scalar field with the prompt length, if any
};

}  // namespace stoker
