#include "format/token_source.h"

#include <algorithm>

#include "common/error.h"

namespace stoker {

bool is_token_dtype(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kUInt32:
    case DType::kInt32:
    case DType::kUInt64:
    case DType::kInt64:
      return true;
    default:
      return false;
  }
}

int64_t TokenSource::doc_of(int64_t t) const {
  // Last document starting at or before t; skipping back over empty documents
  // is implicit: upper_bound lands after all documents that start at t.
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, t);
  return static_cast<int64_t>(it - starts_.begin()) - 1;
}

void MappedTokenSource::add_file(detail::MappedFile file, const std::vector<int64_t>& doc_lengths) {
  file_first_doc_.push_back(num_docs());
  file_first_token_.push_back(num_tokens());
  for (int64_t n : doc_lengths) starts_.push_back(starts_.back() + n);
  files_.push_back(std::move(file));
}

size_t MappedTokenSource::file_of(int64_t d) const {
  auto it = std::upper_bound(file_first_doc_.begin(), file_first_doc_.end(), d);
  return static_cast<size_t>(it - file_first_doc_.begin()) - 1;
}

TokenSpan MappedTokenSource::doc(int64_t d) const {
  if (d < 0 || d >= num_docs())
    STOKER_THROW(UsageError, "document ", d, " out of range [0, ", num_docs(), ")");
  const size_t f = file_of(d);
  const int64_t first = doc_start(d) - file_first_token_[f];
  return {files_[f].data() + static_cast<size_t>(first) * dtype_size(dtype_), doc_length(d)};
}

void MappedTokenSource::check_files() const {
  for (const detail::MappedFile& f : files_)
    if (f.faulted())
      STOKER_THROW(DataError, f.path(),
                   ": changed on disk while in use (the file was cut short under the reader: "
                   "pages of it read as zeros). Token files must be replaced by writing a new "
                   "file and renaming it over, never rewritten in place");
}

std::string MappedTokenSource::where(int64_t d) const {
  const size_t f = file_of(d);
  const int64_t first = doc_start(d) - file_first_token_[f];
  return detail::concat(files_[f].path(), ": document ", d - file_first_doc_[f], " (tokens ", first,
                        "..", first + doc_length(d), ")");
}

}  // namespace stoker
