#include "producers/token_producer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "codecs/token_copy.h"
#include "common/clock.h"
#include "common/error.h"
#include "sampler/epoch_split.h"
#include "sampler/permutation.h"
#include "sampler/token_keys.h"

namespace stoker {

namespace {

constexpr size_t kAlign = 64;
constexpr int64_t kTokensPerUnit = 4096;  // enough work per unit to amortise claiming it
constexpr int kMaxUnits = 65535;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void fill(void* row, DType t, int64_t begin, int64_t end, int64_t v) {
  if (t == DType::kInt64)
    std::fill(static_cast<int64_t*>(row) + begin, static_cast<int64_t*>(row) + end, v);
  else
    std::fill(static_cast<int32_t*>(row) + begin, static_cast<int32_t*>(row) + end,
              static_cast<int32_t>(v));
}

void iota(void* row, DType t, int64_t begin, int64_t end) {
  if (t == DType::kInt64) {
    int64_t* p = static_cast<int64_t*>(row);
    for (int64_t i = begin; i < end; ++i) p[i] = i - begin;
  } else {
    int32_t* p = static_cast<int32_t*>(row);
    for (int64_t i = begin; i < end; ++i) p[i] = static_cast<int32_t>(i - begin);
  }
}

bool fits_dtype(int64_t v, DType t) {
  return t == DType::kInt64 || (v >= INT32_MIN && v <= INT32_MAX);
}

}  // namespace

// ---------------------------------------------------------------------------
// Plans

struct TokenProducer::Plan : EpochPlan {
  EpochKey key;
  EpochSplit split;
  std::optional<Permutation> order;  // epoch order of rows / budget batches
  int64_t num_batches() const override { return split.batches; }
  int64_t at(int64_t q) const {
    return order ? static_cast<int64_t>((*order)(static_cast<uint64_t>(q))) : q;
  }
};

struct TokenProducer::Work : BatchWork {
  const TokenProducer* p = nullptr;  // the options (a mixture's sources share them)
  // A mixture's rows come from several producers: row r's (empty: p's), and the
  // index of its source for the "source" tensor.
  std::vector<const TokenProducer*> row_p;
  std::vector<int64_t> row_source;
  int64_t rows = 0, width = 0;
  int rows_per_unit = 1;
  std::vector<int64_t> row_start;        // kWindows: first token of each window
  std::vector<PackPiece> pieces;         // other modes: the row's pieces, in order
  std::vector<int64_t> row_piece_begin;  // rows + 1 entries
  std::vector<int64_t> row_seg_begin;    // packed: the row's first sequence in cu_seqlens
  int32_t max_seqlen = 0;
  size_t off_input = 0, off_labels = 0, off_pos = 0, off_cu = 0, off_max = 0, off_loss = 0,
         off_attn = 0, off_source = 0;
  bool packed = false, budget = false, has_attn = false;

  size_t add(const std::string& name, DType t, std::vector<int64_t> shape) {
    size_t n = dtype_size(t);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    const size_t off = align_up(bytes);
    tensors.push_back({name, t, std::move(shape), off, n});
    bytes = off + n;
    return off;
  }

  const TokenProducer& of(int64_t r) const {
    return row_p.empty() ? *p : *row_p[static_cast<size_t>(r)];
  }
  void run(int u, uint8_t* base, WorkerContext& ctx) override;
  void run_window(int64_t r, uint8_t* base, int64_t& read) const;
  void run_pieces(int64_t r, uint8_t* base, int64_t& read) const;
  [[noreturn]] void bad_token(const TokenProducer& from, int64_t d, const TokenSpan& span,
                              int64_t i) const;
};

void TokenProducer::Work::bad_token(const TokenProducer& from, int64_t d, const TokenSpan& span,
                                    int64_t i) const {
  const TokenSource& src = *from.src_;
  const int64_t v = token_at(span.data, src.dtype(), i);
  const TokenOptions& o = from.o_;
  std::string why = o.vocab_size > 0 && from.limit_ == o.vocab_size
                        ? detail::concat("vocab_size=", o.vocab_size)
                        : detail::concat("what token_dtype=", dtype_name(o.token_dtype), " holds");
  STOKER_THROW(DataError, src.where(d), ": token ", i, " of the document is ", v, ", outside [0, ",
               from.limit_, ") (", why, ")");
}

void TokenProducer::Work::run(int u, uint8_t* base, WorkerContext& ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t r0 = static_cast<int64_t>(u) * rows_per_unit;
  const int64_t r1 = std::min(rows, r0 + rows_per_unit);
  int64_t read = 0;
  for (int64_t r = r0; r < r1; ++r) {
    if (ctx.stopped()) return;
    if (!row_start.empty())
      run_window(r, base, read);
    else
      run_pieces(r, base, read);
  }
  if (!row_source.empty() && r1 > r0)
    std::memcpy(base + off_source + static_cast<size_t>(r0) * sizeof(int64_t),
                row_source.data() + r0, static_cast<size_t>(r1 - r0) * sizeof(int64_t));
  // The tokens copied came from a file that may have been cut short under its
  // mapping meanwhile (NOTE [ Shards changed under a reader ]): then zeros.
  p->src_->check_intact();
  if (u == 0 && packed) {
    if (!p->o_.unshifted) std::memcpy(base + off_max, &max_seqlen, sizeof max_seqlen);
    const int32_t zero = 0;
    std::memcpy(base + off_cu, &zero, sizeof zero);
  }
  bytes_read.fetch_add(read, std::memory_order_relaxed);
  ctx.times.bytes += read;
  ctx.times.decode_ns += ns_since(t0);
}

void TokenProducer::Work::run_window(int64_t r, uint8_t* base, int64_t& read) const {
  const TokenProducer& from = of(r);
  const TokenSource& src = *from.src_;
  const DType out = p->o_.token_dtype;
  const size_t item = dtype_size(src.dtype()), oitem = dtype_size(out);
  const int64_t L = width, s = row_start[static_cast<size_t>(r)], end = s + L + 1;
  uint8_t* input = base + off_input + static_cast<size_t>(r * L) * oitem;
  uint8_t* labels = base + off_labels + static_cast<size_t>(r * L) * oitem;
  const bool shifted = !p->o_.unshifted;
  int64_t d = src.doc_of(s);
  for (int64_t t = s; t < end; ++d) {
    const int64_t off = t - src.doc_start(d);
    const int64_t take = std::min(src.doc_length(d) - off, end - t);
    if (take <= 0) continue;
    const TokenSpan span = src.doc(d);
    const uint8_t* at = span.data + static_cast<size_t>(off) * item;
    const int64_t j0 = t - s;  // window index of this run's first token
    // input_ids: window indices [0, L); labels: [1, L + 1) shifted down by one
    if (j0 < L) {
      const int64_t n = std::min(take, L - j0);
      const int64_t bad = copy_tokens(at, src.dtype(), n, input + j0 * oitem, out, from.limit_);
      if (bad >= 0) bad_token(from, d, span, off + bad);
    }
    const int64_t a = std::max<int64_t>(j0, 1), b = j0 + take;
    if (shifted && b > a) {
      const int64_t bad = copy_tokens(at + static_cast<size_t>(a - j0) * item, src.dtype(), b - a,
                                      labels + (a - 1) * oitem, out, from.limit_);
      if (bad >= 0) bad_token(from, d, span, off + (a - j0) + bad);
    }
    read += take * static_cast<int64_t>(item);
    t += take;
  }
  if (!shifted) {  // the window is one sequence: every token but the first is a target
    std::memcpy(labels, input, static_cast<size_t>(L) * oitem);
    fill(labels, out, 0, 1, p->o_.ignore_index);
  }
}

void TokenProducer::Work::run_pieces(int64_t r, uint8_t* base, int64_t& read) const {
  const TokenProducer& from = of(r);
  const TokenSource& src = *from.src_;
  const TokenOptions& o = p->o_;
  const DType out = o.token_dtype;
  const size_t item = dtype_size(src.dtype()), oitem = dtype_size(out);
  const int64_t W = width;
  uint8_t* input = base + off_input + static_cast<size_t>(r * W) * oitem;
  uint8_t* labels = base + off_labels + static_cast<size_t>(r * W) * oitem;
  uint8_t* pos = packed ? base + off_pos + static_cast<size_t>(r * W) * oitem : nullptr;
  uint8_t* loss = o.unshifted ? nullptr : base + off_loss + static_cast<size_t>(r * W);
  uint8_t* attn = has_attn ? base + off_attn + static_cast<size_t>(r * W) * oitem : nullptr;
  int32_t* cu = packed ? reinterpret_cast<int32_t*>(base + off_cu) : nullptr;
  int64_t seg = packed ? row_seg_begin[static_cast<size_t>(r)] : 0;
  int64_t c = 0;  // row position
  for (int64_t i = row_piece_begin[static_cast<size_t>(r)];
       i < row_piece_begin[static_cast<size_t>(r) + 1]; ++i) {
    const PackPiece& pc = pieces[static_cast<size_t>(i)];
    const TokenSpan span = src.doc(pc.doc);
    const uint8_t* at = span.data + static_cast<size_t>(pc.offset) * item;
    int64_t bad = copy_tokens(at, src.dtype(), pc.length, input + c * oitem, out, from.limit_);
    if (bad >= 0) bad_token(from, pc.doc, span, pc.offset + bad);
    if (o.unshifted) {
      // the tokens themselves, bar the sequence's first (nothing before it in the
      // sequence predicts it) and the prompt's
      std::memcpy(labels + c * oitem, input + c * oitem, static_cast<size_t>(pc.length) * oitem);
      const int64_t quiet =
          std::min(pc.length, std::max<int64_t>(1, span.no_loss_prefix - pc.offset));
      fill(labels, out, c, c + quiet, o.ignore_index);
      read += pc.length * static_cast<int64_t>(item);
    } else {
      // labels: the next token of the same document, where there is one
      const int64_t have = std::min(pc.length, span.length - pc.offset - 1);
      bad = copy_tokens(at + item, src.dtype(), have, labels + c * oitem, out, from.limit_);
      if (bad >= 0) bad_token(from, pc.doc, span, pc.offset + 1 + bad);
      fill(labels, out, c + have, c + pc.length, o.ignore_index);
      std::memset(loss + c, 1, static_cast<size_t>(have));
      std::memset(loss + c + have, 0, static_cast<size_t>(pc.length - have));
      // a prompt: positions whose next token is still in it are no target
      const int64_t quiet = std::min(have, span.no_loss_prefix - pc.offset - 1);
      if (quiet > 0) {
        fill(labels, out, c, c + quiet, o.ignore_index);
        std::memset(loss + c, 0, static_cast<size_t>(quiet));
      }
      read += (pc.length + (have == pc.length ? 1 : 0)) * static_cast<int64_t>(item);
    }
    if (pos) iota(pos, out, c, c + pc.length);
    if (attn) fill(attn, out, c, c + pc.length, 1);
    c += pc.length;
    if (cu) {
      const int32_t end = static_cast<int32_t>(r * W + c);
      std::memcpy(cu + ++seg, &end, sizeof end);
    }
  }
  if (c < W) {  // padding: its own sequence in cu_seqlens
    fill(input, out, c, W, o.pad_id);
    fill(labels, out, c, W, o.ignore_index);
    if (loss) std::memset(loss + c, 0, static_cast<size_t>(W - c));
    if (pos) iota(pos, out, c, W);
    if (attn) fill(attn, out, c, W, 0);
    if (cu) {
      const int32_t end = static_cast<int32_t>((r + 1) * W);
      std::memcpy(cu + ++seg, &end, sizeof end);
    }
  }
}

// ---------------------------------------------------------------------------
// The producer

TokenProducer::TokenProducer(std::shared_ptr<const TokenSource> source, TokenOptions opts)
    : src_(std::move(source)), o_(opts) {
  STOKER_CHECK(src_ != nullptr, UsageError, "no token source");
  limit_ = token_limit(o_.token_dtype, o_.vocab_size);
  STOKER_CHECK(o_.vocab_size >= 0, UsageError, "vocab_size must be >= 0, got ", o_.vocab_size);
  STOKER_CHECK(fits_dtype(o_.pad_id, o_.token_dtype), UsageError, "pad_id ", o_.pad_id,
               " does not fit token_dtype ", dtype_name(o_.token_dtype));
  STOKER_CHECK(fits_dtype(o_.ignore_index, o_.token_dtype), UsageError, "ignore_index ",
               o_.ignore_index, " does not fit token_dtype ", dtype_name(o_.token_dtype));
  const int64_t N = src_->num_tokens();
  const int64_t L = o_.seq_len;
  auto where = [this](int64_t d) { return src_->where(d); };
  STOKER_CHECK(o_.mode != TokenMode::kBudget || o_.even_batches || o_.drop_last, UsageError,
               "even_batches=False does not apply to max_tokens batches: they are whole, and a "
               "rank with none left would need an empty one (keep even_batches, or drop_last)");
  if (o_.mode != TokenMode::kBudget) {
    STOKER_CHECK(L >= 1, UsageError, "seq_len must be >= 1, got ", L);
    STOKER_CHECK(o_.batch_size >= 1, UsageError, "batch_size must be >= 1, got ", o_.batch_size);
    STOKER_CHECK(o_.batch_size <= INT32_MAX / L, UsageError,
                 "batch_size * seq_len = ", o_.batch_size, " * ", L,
                 " must stay below 2**31 (cu_seqlens are int32)");
  }
  switch (o_.mode) {
    case TokenMode::kWindows: {
      if (o_.stride == 0) o_.stride = L;
      STOKER_CHECK(o_.stride >= 1, UsageError, "stride must be >= 1, got ", o_.stride);
      if (N < L + 1)
        STOKER_THROW(DataError, src_->describe(), ": ", N, " tokens, but a window of seq_len=", L,
                     " needs ", L + 1, " (seq_len tokens and the label after the last)");
      windows_ = (N - L - 1) / o_.stride + 1;
      rows_ = samples_ = windows_;
      unused_ = N - ((windows_ - 1) * o_.stride + L + 1);
      break;
    }
    case TokenMode::kConcat:
      if (N < L)
        STOKER_THROW(DataError, src_->describe(), ": ", N,
                     " tokens, fewer than one row of seq_len=", L);
      rows_ = samples_ = N / L;
      unused_ = N - rows_ * L;
      break;
    case TokenMode::kDocument: {
      PackOptions po;
      po.seq_len = L;
      po.fit = o_.fit;
      po.window = o_.pack_window;
      po.overlong = o_.overlong;
      po.shuffle = o_.shuffle;
      po.seed = o_.seed;
      std::vector<int64_t> starts(static_cast<size_t>(src_->num_docs()) + 1);
      for (int64_t d = 0; d <= src_->num_docs(); ++d)
        starts[static_cast<size_t>(d)] = src_->doc_start(d);
      pack_.emplace(starts, po, where);
      if (pack_->num_rows() == 0) STOKER_THROW(DataError, src_->describe(), ": no tokens to pack");
      rows_ = samples_ = pack_->num_rows();
      pad_ = pack_->pad_tokens();
      unused_ = pack_->dropped_tokens();
      break;
    }
    case TokenMode::kBudget: {
      STOKER_CHECK(o_.batch_size >= 0, UsageError, "batch cap must be >= 0");
      STOKER_CHECK(o_.max_tokens <= INT32_MAX, UsageError, "max_tokens must be below 2**31");
      BudgetOptions bo;
      bo.max_tokens = o_.max_tokens;
      bo.max_length = o_.max_length;
      bo.multiple = o_.pad_to_multiple_of;
      bo.max_rows = o_.batch_size;
      bo.shuffle = o_.shuffle;
      bo.seed = o_.seed;
      std::vector<int64_t> starts(static_cast<size_t>(src_->num_docs()) + 1);
      for (int64_t d = 0; d <= src_->num_docs(); ++d)
        starts[static_cast<size_t>(d)] = src_->doc_start(d);
      budget_.emplace(starts, bo, where);
      if (budget_->num_docs() == 0)
        STOKER_THROW(DataError, src_->describe(), ": no non-empty documents");
      rows_ = samples_ = budget_->num_docs();
      pad_ = budget_->pad_tokens();
      unused_ = budget_->dropped_tokens();
      break;
    }
  }
}

double TokenProducer::pad_fraction() const {
  int64_t positions = 0;
  switch (o_.mode) {
    case TokenMode::kWindows:
    case TokenMode::kConcat:
      return 0.0;
    case TokenMode::kDocument:
      positions = rows_ * o_.seq_len;
      break;
    case TokenMode::kBudget:
      positions = budget_->real_tokens() + budget_->pad_tokens();
      break;
  }
  return positions ? static_cast<double>(pad_) / static_cast<double>(positions) : 0.0;
}

int64_t TokenProducer::global_batch_samples(int64_t b) const {
  const BudgetPlan::Batch& bb = budget_->batch(b);
  return bb.end - bb.begin;
}

int64_t TokenProducer::num_batches(int64_t rank, int64_t world_size) const {
  if (o_.mode == TokenMode::kBudget)
    return EpochSplit(budget_->num_batches(), 0, rank, world_size, 1, o_.drop_last).batches;
  return EpochSplit(samples_, 0, rank, world_size, o_.batch_size, o_.drop_last, o_.even_batches)
      .batches;
}

int64_t TokenProducer::rank_samples(int64_t rank, int64_t world_size) const {
  if (o_.mode == TokenMode::kBudget)
    return EpochSplit(budget_->num_batches(), 0, rank, world_size, 1, o_.drop_last).share;
  return EpochSplit(samples_, 0, rank, world_size, o_.batch_size, o_.drop_last, o_.even_batches)
      .share;
}

std::shared_ptr<const EpochPlan> TokenProducer::plan_epoch(const EpochKey& key) const {
  auto plan = std::make_shared<Plan>();
  plan->key = key;
  if (o_.mode != TokenMode::kBudget) {
    if (o_.shuffle && samples_ > 1)
      plan->order.emplace(static_cast<uint64_t>(samples_),
                          token_keys::epoch_order(o_.seed, key.epoch));
    plan->split = EpochSplit(samples_, key.offset, key.rank, key.world_size, o_.batch_size,
                             o_.drop_last, o_.even_batches);
    return plan;
  }
  const int64_t nb = budget_->num_batches();
  if (o_.shuffle && nb > 1)
    plan->order.emplace(static_cast<uint64_t>(nb), token_keys::epoch_order(o_.seed, key.epoch));
  STOKER_CHECK(key.offset >= 0 && key.offset <= samples_, UsageError, "resume offset ", key.offset,
               " is outside the epoch's ", samples_, " documents");
  // The offset counts documents; find the global batch it starts (O(batches), no data read).
  int64_t g = 0, seen = 0;
  while (seen < key.offset && g < nb) seen += global_batch_samples(plan->at(g++));
  STOKER_CHECK(seen == key.offset, UsageError, "resume offset ", key.offset,
               " is not at a batch boundary of epoch ", key.epoch);
  plan->split = EpochSplit(nb, g, key.rank, key.world_size, 1, o_.drop_last);
  return plan;
}

int64_t TokenProducer::consumed_after(const EpochKey& key, int64_t batches) const {
  if (o_.mode != TokenMode::kBudget)
    return EpochSplit(samples_, key.offset, key.rank, key.world_size, o_.batch_size, o_.drop_last,
                      o_.even_batches)
        .consumed_after(batches);
  auto plan = std::static_pointer_cast<const Plan>(plan_epoch(key));
  const EpochSplit& s = plan->split;
  const int64_t end = s.consumed_after(batches);  // in global batches
  int64_t out = key.offset;
  for (int64_t g = s.offset; g < end; ++g) out += global_batch_samples(plan->at(g));
  return std::min(out, samples_);
}

std::unique_ptr<BatchWork> TokenProducer::plan_batch(const EpochPlan& epoch, int64_t k) const {
  const Plan& plan = static_cast<const Plan&>(epoch);
  STOKER_CHECK(k >= 0 && k < plan.split.batches, UsageError, "batch ", k, " out of range [0, ",
               plan.split.batches, ")");
  if (o_.mode == TokenMode::kBudget)
    return plan_budget_batch(plan.at(plan.split.global(k, 0)), plan.key.epoch, -1, 0);
  const int64_t R = plan.split.batch_length(k);
  std::vector<int64_t> rows(static_cast<size_t>(R));
  for (int64_t j = 0; j < R; ++j) rows[static_cast<size_t>(j)] = plan.at(plan.split.global(k, j));
  auto w = std::make_unique<Work>();
  w->p = this;
  add_rows(*w, *this, rows.data(), R);
  finish(*w, 0);
  return w;
}

std::unique_ptr<BatchWork> TokenProducer::plan_rows(
    const std::vector<std::pair<const TokenProducer*, int64_t>>& rows,
    const std::vector<int64_t>& source, size_t num_sources) const {
  STOKER_CHECK(o_.mode != TokenMode::kBudget, UsageError, "token-budget batches are whole");
  STOKER_CHECK(source.size() == rows.size(), UsageError, "a source for every row");
  auto w = std::make_unique<Work>();
  w->p = this;
  w->row_p.reserve(rows.size());
  std::vector<int64_t> run;
  for (size_t j = 0; j < rows.size();) {  // runs of rows of one producer at a time
    const TokenProducer* from = rows[j].first;
    STOKER_CHECK(from->o_.mode == o_.mode && from->o_.seq_len == o_.seq_len &&
                     from->o_.token_dtype == o_.token_dtype,
                 UsageError, "a mixture's token sources must share their batch options");
    run.clear();
    for (; j < rows.size() && rows[j].first == from; ++j) {
      run.push_back(rows[j].second);
      w->row_p.push_back(from);
    }
    add_rows(*w, *from, run.data(), static_cast<int64_t>(run.size()));
  }
  w->row_source = source;
  finish(*w, num_sources);
  return w;
}

std::unique_ptr<BatchWork> TokenProducer::plan_budget_batch(int64_t b, uint64_t epoch,
                                                            int64_t source,
                                                            size_t num_sources) const {
  STOKER_CHECK(o_.mode == TokenMode::kBudget && b >= 0 && b < budget_->num_batches(), UsageError,
               "no token-budget batch ", b);
  auto w = std::make_unique<Work>();
  w->p = this;
  const BudgetPlan::Batch& bb = budget_->batch(b);
  w->budget = true;
  w->rows = bb.end - bb.begin;
  w->width = bb.width;
  w->row_piece_begin.reserve(static_cast<size_t>(w->rows) + 1);
  w->row_piece_begin.push_back(0);
  for (int64_t i = bb.begin; i < bb.end; ++i) {
    const int64_t d = budget_->doc_at(epoch, i);
    w->pieces.push_back({d, 0, budget_->used_length(src_->doc_length(d))});
    w->row_piece_begin.push_back(static_cast<int64_t>(w->pieces.size()));
  }
  if (source >= 0) w->row_source.assign(static_cast<size_t>(w->rows), source);
  finish(*w, num_sources);
  return w;
}

// Appends rows `rows[0, n)` of `from` (windows, concat or packed rows) to `w`.
void TokenProducer::add_rows(Work& w, const TokenProducer& from, const int64_t* rows,
                             int64_t n) const {
  const TokenSource& src = *from.src_;
  const int64_t L = o_.seq_len;
  w.width = L;
  if (o_.mode == TokenMode::kWindows) {
    for (int64_t j = 0; j < n; ++j) w.row_start.push_back(rows[j] * from.o_.stride);
    w.rows += n;
    return;
  }
  w.packed = true;
  if (w.row_piece_begin.empty()) {
    w.row_piece_begin.push_back(0);
    w.row_seg_begin.push_back(0);
  }
  int64_t longest = w.max_seqlen;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = rows[j];
    int64_t used = 0;
    if (o_.mode == TokenMode::kConcat) {
      const int64_t t0 = row * L;
      for (int64_t d = src.doc_of(t0); used < L; ++d) {
        const int64_t off = t0 + used - src.doc_start(d);
        const int64_t take = std::min(src.doc_length(d) - off, L - used);
        if (take <= 0) continue;
        w.pieces.push_back({d, off, take});
        used += take;
      }
    } else {
      const PackPiece* pp = from.pack_->row_pieces(row);
      for (int64_t i = 0; i < from.pack_->row_num_pieces(row); ++i) {
        w.pieces.push_back(pp[i]);
        used += pp[i].length;
      }
    }
    for (size_t i = static_cast<size_t>(w.row_piece_begin.back()); i < w.pieces.size(); ++i)
      longest = std::max(longest, w.pieces[i].length);
    const int64_t segs = w.row_seg_begin.back() + static_cast<int64_t>(w.pieces.size()) -
                         w.row_piece_begin.back() + (used < L ? 1 : 0);
    if (used < L) longest = std::max(longest, L - used);
    w.row_piece_begin.push_back(static_cast<int64_t>(w.pieces.size()));
    w.row_seg_begin.push_back(segs);
    ++w.rows;
  }
  w.max_seqlen = static_cast<int32_t>(longest);
}

// The layout of a planned batch and its units; with `num_sources`, the
// "source" tensor and each source's rows and real tokens (BatchWork::source_counts).
void TokenProducer::finish(Work& w, size_t num_sources) const {
  const DType out = o_.token_dtype;
  const int64_t R = w.rows, W = w.width;
  w.samples = R;
  w.off_input = w.add("input_ids", out, {R, W});
  w.off_labels = w.add("labels", out, {R, W});
  if (w.packed && o_.unshifted) {
    // HF's names (DataCollatorWithFlattening): cu_seq_lens_q and _k are one buffer;
    // the longest sequence travels as a shape (see the header)
    w.off_pos = w.add("position_ids", out, {R, W});
    const int64_t segs = w.row_seg_begin.back() + 1;
    w.off_cu = w.add("cu_seq_lens_q", DType::kInt32, {segs});
    w.tensors.push_back({"cu_seq_lens_k",
                         DType::kInt32,
                         {segs},
                         w.off_cu,
                         static_cast<size_t>(segs) * sizeof(int32_t)});
    w.add("max_length", DType::kInt32, {w.max_seqlen, 0});
  } else if (w.packed) {
    w.off_pos = w.add("position_ids", out, {R, W});
    w.off_cu = w.add("cu_seqlens", DType::kInt32, {w.row_seg_begin.back() + 1});
    w.off_max = w.add("max_seqlen", DType::kInt32, {});
  }
  if ((w.packed || w.budget) && !o_.unshifted)
    w.off_loss = w.add("loss_mask", DType::kBool, {R, W});
  if (w.budget && o_.attention_mask) {
    w.has_attn = true;
    w.off_attn = w.add("attention_mask", out, {R, W});
  }
  if (num_sources > 0) {
    w.off_source = w.add("source", DType::kInt64, {R});
    w.source_counts.assign(2 * num_sources, 0);
    for (int64_t r = 0; r < R; ++r) {
      int64_t tokens = W;  // a window's input positions
      if (!w.row_piece_begin.empty()) {
        tokens = 0;
        for (int64_t i = w.row_piece_begin[static_cast<size_t>(r)];
             i < w.row_piece_begin[static_cast<size_t>(r) + 1]; ++i)
          tokens += w.pieces[static_cast<size_t>(i)].length;
      }
      const size_t s = static_cast<size_t>(w.row_source[static_cast<size_t>(r)]);
      w.source_counts[2 * s] += 1;
      w.source_counts[2 * s + 1] += tokens;
    }
  }
  int64_t rpu = std::max<int64_t>(1, (kTokensPerUnit + W - 1) / std::max<int64_t>(W, 1));
  rpu = std::max(rpu, (R + kMaxUnits - 1) / kMaxUnits);
  w.rows_per_unit = static_cast<int>(rpu);
  w.units = static_cast<int>(std::max<int64_t>(1, (R + rpu - 1) / rpu));
}

int64_t TokenProducer::num_samples() const {
  return o_.mode == TokenMode::kBudget ? budget_->num_batches() : samples_;
}

int64_t TokenProducer::real_tokens() const {
  switch (o_.mode) {
    case TokenMode::kWindows:
    case TokenMode::kConcat:
      return rows_ * o_.seq_len;
    case TokenMode::kDocument:
      return rows_ * o_.seq_len - pad_;
    case TokenMode::kBudget:
      return budget_->real_tokens();
  }
  return 0;
}

}  // namespace stoker
