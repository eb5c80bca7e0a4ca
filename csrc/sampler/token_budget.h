// Token-budget batches (as fairseq's batch_by_size): documents bucketed by
// length and batched so that rows x padded length stays within max_tokens.
//
// A document of n tokens (cut to max_length when set) pads to
// w(n) = n rounded up to `multiple`; documents sorted by (w, index) form
// length buckets of equal w. Batches are cut greedily along that sorted
// order: a document joins the current batch while (rows + 1) * w <= max_tokens
// (and rows + 1 <= max_rows when set). The cut depends only on the sorted
// widths, so it is built once and is the same in every epoch; an epoch only
// permutes the documents within each bucket (keyed by seed, epoch, bucket) and
// the order of the batches (keyed by seed, epoch). So every epoch has the same
// batches of the same shapes, and the plan costs nothing per epoch: a lookup
// is a binary search for the bucket plus one permutation step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stoker {

struct BudgetOptions {
  int64_t max_tokens = 0;
  int64_t max_length = 0;  ///< 0: no truncation
  int64_t multiple = 1;    ///< pad_to_multiple_of
  int64_t max_rows = 0;    ///< 0: no cap on documents per batch
  bool shuffle = false;
  uint64_t seed = 0;
};

class BudgetPlan {
 public:
  struct Batch {
    int64_t begin = 0, end = 0;  ///< positions in the sorted order
    int64_t width = 0;           ///< padded length of every row
  };

  /// @param starts document d is tokens [starts[d], starts[d+1])
  /// @param where  names a document in errors (one too long for max_tokens)
  BudgetPlan(const std::vector<int64_t>& starts, const BudgetOptions& opts,
             const std::function<std::string(int64_t)>& where);

  int64_t num_batches() const { return static_cast<int64_t>(batches_.size()); }
  int64_t num_docs() const { return static_cast<int64_t>(sorted_.size()); }
  const Batch& batch(int64_t b) const { return batches_[static_cast<size_t>(b)]; }
  /// Tokens taken from document d (its length, cut to max_length).
  int64_t used_length(int64_t doc_length) const;
  /// The document at sorted position i in epoch `epoch`.
  int64_t doc_at(uint64_t epoch, int64_t i) const;
  int64_t pad_tokens() const { return pad_; }
  int64_t real_tokens() const { return real_; }
  int64_t dropped_tokens() const { return dropped_; }  ///< cut off by max_length

 private:
  BudgetOptions o_;
  std::vector<int64_t> sorted_;        // document ids by (width, id)
  std::vector<int64_t> bucket_begin_;  // sorted positions where a width starts (+ end)
  std::vector<Batch> batches_;
  int64_t pad_ = 0, real_ = 0, dropped_ = 0;
};

}  // namespace stoker
