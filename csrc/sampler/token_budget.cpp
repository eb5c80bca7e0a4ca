#include "sampler/token_budget.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "sampler/permutation.h"
#include "sampler/token_keys.h"

namespace stoker {

int64_t BudgetPlan::used_length(int64_t n) const {
  return o_.max_length > 0 ? std::min(n, o_.max_length) : n;
}

BudgetPlan::BudgetPlan(const std::vector<int64_t>& starts, const BudgetOptions& o,
                       const std::function<std::string(int64_t)>& where)
    : o_(o) {
  STOKER_CHECK(o.max_tokens >= 1, UsageError, "max_tokens must be >= 1, got ", o.max_tokens);
  STOKER_CHECK(o.multiple >= 1, UsageError, "pad_to_multiple_of must be >= 1, got ", o.multiple);
  STOKER_CHECK(o.max_length >= 0 && o.max_rows >= 0, UsageError, "bad max_length / batch cap");
  const int64_t D = static_cast<int64_t>(starts.size()) - 1;
  auto width = [&](int64_t d) {
    const int64_t n = used_length(starts[d + 1] - starts[d]);
    return (n + o.multiple - 1) / o.multiple * o.multiple;
  };
  std::vector<int64_t> w;  // width per kept document, aligned with sorted_ after the sort
  sorted_.reserve(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    const int64_t n = starts[d + 1] - starts[d];
    if (n == 0) continue;  // an empty document is no sample
    const int64_t wd = width(d);
    if (wd > o.max_tokens)
      STOKER_THROW(DataError, where(d), ": document of ", n, " tokens",
                   wd != n ? detail::concat(" (", wd, " padded)") : std::string(),
                   " does not fit max_tokens=", o.max_tokens,
                   "; pass max_length to truncate long documents");
    sorted_.push_back(d);
    real_ += used_length(n);
    dropped_ += n - used_length(n);
  }
  // Widths sort as integers; a counting pass would do too, but the sort is
  // once per loader and stable by construction (ties by id).
  std::vector<int64_t> wid(sorted_.size());
  for (size_t i = 0; i < sorted_.size(); ++i) wid[i] = width(sorted_[i]);
  std::vector<size_t> idx(sorted_.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return wid[a] < wid[b]; });
  std::vector<int64_t> s(sorted_.size());
  w.resize(sorted_.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    s[i] = sorted_[idx[i]];
    w[i] = wid[idx[i]];
  }
  sorted_.swap(s);

  const int64_t n = num_docs();
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || w[i] != w[i - 1]) bucket_begin_.push_back(i);
  bucket_begin_.push_back(n);

  Batch cur;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rows = i - cur.begin + 1;
    const bool fits = rows * w[i] <= o.max_tokens && (o.max_rows == 0 || rows <= o.max_rows);
    if (!fits) {
      cur.end = i;
      batches_.push_back(cur);
      cur = Batch{i, i, 0};
    }
    cur.width = w[i];
  }
  if (n > 0) {
    cur.end = n;
    batches_.push_back(cur);
  }
  for (const Batch& b : batches_) pad_ += (b.end - b.begin) * b.width;
  pad_ -= real_;
}

int64_t BudgetPlan::doc_at(uint64_t epoch, int64_t i) const {
  if (!o_.shuffle) return sorted_[static_cast<size_t>(i)];
  auto it = std::upper_bound(bucket_begin_.begin(), bucket_begin_.end(), i);
  const size_t g = static_cast<size_t>(it - bucket_begin_.begin()) - 1;
  const int64_t b0 = bucket_begin_[g], size = bucket_begin_[g + 1] - b0;
  Permutation p(static_cast<uint64_t>(size), token_keys::bucket_order(o_.seed, epoch, g));
  return sorted_[static_cast<size_t>(b0 + static_cast<int64_t>(p(static_cast<uint64_t>(i - b0))))];
}

}  // namespace stoker
