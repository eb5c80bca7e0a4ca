#include "sampler/pack_plan.h"

#include <optional>

#include "common/error.h"
#include "sampler/permutation.h"
#include "sampler/token_keys.h"

namespace stoker {

namespace {

struct OpenRow {
  int64_t free;
  std::vector<PackPiece> pieces;
};

}  // namespace

PackPlan::PackPlan(const std::vector<int64_t>& starts, const PackOptions& o,
                   const std::function<std::string(int64_t)>& where) {
  const int64_t L = o.seq_len;
  STOKER_CHECK(L >= 1 && L <= INT32_MAX, UsageError, "seq_len must be in [1, 2**31), got ", L);
  STOKER_CHECK(o.window >= 1, UsageError, "pack window must be >= 1, got ", o.window);
  const int64_t D = static_cast<int64_t>(starts.size()) - 1;
  std::optional<Permutation> order;
  if (o.shuffle && D > 1) order.emplace(static_cast<uint64_t>(D), token_keys::pack_order(o.seed));

  std::vector<OpenRow> open;  // in opening order
  auto close = [&](size_t i) {
    OpenRow& r = open[i];
    for (const PackPiece& p : r.pieces) pieces_.push_back(p);
    row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
    row_used_.push_back(static_cast<int32_t>(L - r.free));
    pad_ += r.free;
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
  };
  auto place = [&](const PackPiece& p) {
    if (p.length == L) {  // a full row: no open row can take it, and it evicts none
      pieces_.push_back(p);
      row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
      row_used_.push_back(static_cast<int32_t>(L));
      return;
    }
    size_t best = open.size();
    for (size_t i = 0; i < open.size(); ++i) {
      if (open[i].free < p.length) continue;
      if (o.fit == PackFit::kFirst) {
        best = i;
        break;
      }
      if (best == open.size() || open[i].free < open[best].free) best = i;
    }
    if (best == open.size()) {
      if (static_cast<int64_t>(open.size()) >= o.window) close(0);
      open.push_back({L, {}});
      best = open.size() - 1;
    }
    open[best].pieces.push_back(p);
    open[best].free -= p.length;
    if (open[best].free == 0) close(best);
  };

  for (int64_t i = 0; i < D; ++i) {
    const int64_t d = order ? static_cast<int64_t>((*order)(static_cast<uint64_t>(i))) : i;
    const int64_t len = starts[d + 1] - starts[d];
    if (len == 0) continue;
    if (len <= L) {
      place({d, 0, len});
      continue;
    }
    switch (o.overlong) {
      case Overlong::kError:
        STOKER_THROW(DataError, where(d), ": document of ", len,
                     " tokens is longer than seq_len=", L,
                     " (overlong='error'; use 'split' or 'truncate')");
      case Overlong::kTruncate:
        dropped_ += len - L;
        place({d, 0, L});
        break;
      case Overlong::kSplit: {
        int64_t off = 0;
        for (; off + L <= len; off += L) place({d, off, L});  // full rows, closed at once
        if (off < len) place({d, off, len - off});
        break;
      }
    }
  }
  while (!open.empty()) close(0);
}

}  // namespace stoker
