// Token documents as the loader sees them: a sequence of documents, each a run
// of token ids of one integer type, addressed by a global token offset (the
// stream is the documents back to back). Three readers provide them:
//
//   token_file.h      flat token files (nanoGPT .bin): one document per file,
//                     or split after each end-of-document token
//   megatron_index.h  Megatron-LM indexed datasets (.bin + .idx): one document
//                     per sequence of the index
//   record_tokens.h   a `tokens` field of a stoker dataset: one document per
//                     record, checksum verified on every read
//
// Document lengths are known up front (from the index, the scan or the record
// table), so plans (windows, packing, token budgets) never read token data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "format/detail/mapped_file.h"

namespace stoker {

/// The tokens of one document inside a mapping (element type: the source's dtype).
struct TokenSpan {
  const uint8_t* data = nullptr;
  int64_t length = 0;  ///< tokens
  /// Leading tokens that are no training target (a fine-tuning example's prompt):
  /// a position whose next token lies in this prefix gets no label.
  int64_t no_loss_prefix = 0;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  /// Element type of the stored tokens (an integer type).
  DType dtype() const { return dtype_; }
  int64_t num_docs() const { return static_cast<int64_t>(starts_.size()) - 1; }
  int64_t num_tokens() const { return starts_.back(); }
  /// Global offset of document d's first token; doc_start(num_docs()) == num_tokens().
  int64_t doc_start(int64_t d) const { return starts_[static_cast<size_t>(d)]; }
  int64_t doc_length(int64_t d) const { return doc_start(d + 1) - doc_start(d); }
  /// The document holding global token t (0 <= t < num_tokens()); empty documents are never
  /// returned.
  int64_t doc_of(int64_t t) const;

  /// Tokens of document d, verified where the format has checksums. Throws
  /// DataError naming the file and the document or record.
  virtual TokenSpan doc(int64_t d) const = 0;
  /// Where document d lives, for messages ("train.bin: tokens 0..1023", "x.stk: record 4").
  virtual std::string where(int64_t d) const = 0;
  /// Throws DataError "<file>: changed on disk while in use" if a file was cut
  /// short under its mapping since it was opened, so that tokens copied out of
  /// it (zeros where pages vanished) are not trusted. One relaxed load while no
  /// mapping ever faulted: readers call it after copying tokens.
  virtual void check_intact() const {}
  /// Short description for repr and errors.
  virtual std::string describe() const = 0;

 protected:
  DType dtype_ = DType::kUInt16;
  std::vector<int64_t> starts_{0};  ///< num_docs + 1 entries
};

/// Documents stored back to back in mapped files (flat token files, Megatron .bin).
class MappedTokenSource : public TokenSource {
 public:
  TokenSpan doc(int64_t d) const override;
  std::string where(int64_t d) const override;
  std::string describe() const override { return description_; }
  void check_intact() const override {
    if (MappedFile::total_faults() != 0) check_files();
  }

 protected:
  /// Adds a file whose tokens (all of them, dtype_) form documents of the given lengths.
  void add_file(detail::MappedFile file, const std::vector<int64_t>& doc_lengths);
  std::string description_;

 private:
  size_t file_of(int64_t d) const;
  void check_files() const;
  std::vector<detail::MappedFile> files_;
  std::vector<int64_t> file_first_doc_;    ///< first document of each file
  std::vector<int64_t> file_first_token_;  ///< global offset of each file's first token
};

/// Integer token dtypes a source may hold (uint8..int64, not floats or bool).
bool is_token_dtype(DType t);

}  // namespace stoker
