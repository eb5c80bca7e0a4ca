// Batches of language-model data, written straight into batch memory: the
// BatchProducer (batch_producer.h) for token sources (format/token_source.h).
//
// Four modes; every row holds seq_len input positions and its labels (the
// token that follows each input position, as nanoGPT's get_batch gives x, y):
//
//   kWindows   row = seq_len + 1 consecutive tokens of the stream (documents
//              back to back) starting at i * stride; input_ids = the first
//              seq_len, labels = the last seq_len. Keys: input_ids, labels.
//   kConcat    the stream cut into rows of seq_len (concatenate and chunk),
//              with the document boundaries kept: position_ids restart at
//              each document (and at each row), a row's pieces are the
//              sequences of cu_seqlens, and a document's last token has no
//              label (ignore_index, loss_mask 0). The tail that does not fill
//              a row (< seq_len tokens) is not used.
//   kDocument  rows from PackPlan (sampler/pack_plan.h): whole documents per
//              row, the rest padding (pad_id, label ignore_index, loss_mask 0,
//              its own sequence in cu_seqlens).
//   kBudget    rows of different documents padded to the batch's width, as
//              many as max_tokens allows (sampler/token_budget.h). Keys:
//              input_ids, labels, loss_mask, attention_mask.
//
// Packed keys (kConcat, kDocument): input_ids, labels, position_ids [B, L]
// (token_dtype), cu_seqlens int32 [S + 1] over the batch flattened to B * L
// tokens (FlashAttention's varlen layout; S varies per batch), max_seqlen
// int32 [] (the longest sequence of the batch), loss_mask bool [B, L].
//
// Label rule, every mode: the label of a position is the next token of the
// same document when there is one (a document cut across rows, split or
// truncated keeps its real next token), else ignore_index. In kWindows the
// stream is one document.
//
// Label conventions (TokenOptions::unshifted):
//   shifted (the default; nanoGPT's x, y): labels[i] is the target of position
//     i, the next token as above.
//   unshifted (HuggingFace's: the model shifts): labels[i] = input_ids[i]
//     where token i is the target of position i - 1 of the same sequence, else
//     ignore_index: at every sequence start (a row's first position, each
//     document or piece in a packed row), on padding, and on prompt tokens.
//     A target across a row boundary or a split is dropped (the model shifts
//     within a sequence). Packed keys become the ones HF's
//     DataCollatorWithFlattening gives: position_ids, cu_seq_lens_q and
//     cu_seq_lens_k (one buffer, int32 [S + 1]) and "max_length", an empty
//     int32 tensor of shape [max sequence length, 0] (the loader hands its
//     first dimension out as the ints max_length_q and max_length_k, never
//     reading device memory); no loss_mask (kBudget: input_ids, labels,
//     attention_mask).
//
// Epoch order: the global samples are windows / rows (a batch of B rows per
// rank) or, for kBudget, whole batches; EpochKey::offset counts windows, rows,
// or documents (kBudget), and resuming anywhere is a few integer operations
// (plans never depend on the position; see epoch_split.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "format/token_source.h"
#include "pipeline/batch_producer.h"
#include "sampler/pack_plan.h"
#include "sampler/token_budget.h"

namespace stoker {

enum class TokenMode : uint8_t { kWindows, kConcat, kDocument, kBudget };

struct TokenOptions {
  TokenMode mode = TokenMode::kWindows;
  int64_t seq_len = 0;             ///< kWindows, kConcat, kDocument
  int64_t stride = 0;              ///< kWindows: start of window i is i * stride; 0 = seq_len
  int64_t batch_size = 1;          ///< rows per batch; kBudget: cap on rows (0 = none)
  int64_t max_tokens = 0;          ///< kBudget: rows x width per batch at most
  int64_t max_length = 0;          ///< kBudget: documents cut to this many tokens (0 = none)
  int64_t pad_to_multiple_of = 1;  ///< kBudget: widths rounded up to a multiple
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  /// false: no row repeated across ranks (a rank's last batches may be short or
  /// empty; not for kBudget, whose batches are whole)
  bool even_batches = true;
  DType token_dtype = DType::kInt64;  ///< input_ids, labels, position_ids: kInt64 or kInt32
  int64_t pad_id = 0;
  int64_t ignore_index = -100;
  PackFit fit = PackFit::kBest;          ///< kDocument
  int64_t pack_window = 64;              ///< kDocument: open rows at most
  Overlong overlong = Overlong::kSplit;  ///< kDocument
  int64_t vocab_size = 0;                ///< ids >= vocab_size are an error (0: the dtype's range)
  bool attention_mask = true;            ///< kBudget: emit attention_mask
  bool unshifted = false;                ///< HF's label convention (see above)
};

class TokenProducer : public BatchProducer {
 public:
  /// Validates the options against the source and builds the (epoch-independent) plan.
  /// UsageError for bad options, DataError for data that cannot be served
  /// (a stream shorter than seq_len + 1, a document refused by overlong='error').
  TokenProducer(std::shared_ptr<const TokenSource> source, TokenOptions opts);

  int64_t num_batches(int64_t rank, int64_t world_size) const override;
  int64_t rank_samples(int64_t rank, int64_t world_size) const override;
  int64_t epoch_samples() const override { return samples_; }
  int64_t consumed_after(const EpochKey& key, int64_t batches) const override;
  std::shared_ptr<const EpochPlan> plan_epoch(const EpochKey& key) const override;
  std::unique_ptr<BatchWork> plan_batch(const EpochPlan& epoch, int64_t k) const override;

  const TokenOptions& options() const { return o_; }
  const TokenSource& source() const { return *src_; }
  /// Input positions per epoch that are padding, over all positions (0 for windows and concat).
  double pad_fraction() const;
  /// Tokens of the source an epoch does not use: the stream's tail (windows,
  /// concat), what truncation cuts off (document, budget).
  int64_t unused_tokens() const { return unused_; }
  /// Rows of one epoch (windows, packed rows, or documents for budgets).
  int64_t epoch_rows() const { return rows_; }

  // -- mixtures (producers/mix_token_producer.h) ------------------------------
  /// The units a mixture draws from this source: windows, packed rows, or whole
  /// token-budget batches.
  int64_t num_samples() const;
  /// Real (non-pad) tokens of all of them: windows count seq_len inputs each.
  int64_t real_tokens() const;
  /// A batch of rows of several producers made with the same options but
  /// their own sources and seeds: row j is unit rows[j].second of
  /// *rows[j].first, with source[j] written to the int64 tensor "source", and
  /// each source's rows and real tokens to BatchWork::source_counts. Not for
  /// token budgets.
  std::unique_ptr<BatchWork> plan_rows(
      const std::vector<std::pair<const TokenProducer*, int64_t>>& rows,
      const std::vector<int64_t>& source, size_t num_sources) const;
  /// Token-budget batch `b` of this producer, its documents in the order of
  /// `epoch`; with source >= 0, every row's "source" is it (of num_sources).
  std::unique_ptr<BatchWork> plan_budget_batch(int64_t b, uint64_t epoch, int64_t source,
                                               size_t num_sources) const;

 private:
  struct Plan;
  struct Work;
  int64_t global_batch_samples(int64_t g) const;  // kBudget: rows of batch g
  void add_rows(Work& w, const TokenProducer& from, const int64_t* rows, int64_t n) const;
  void finish(Work& w, size_t num_sources) const;

  std::shared_ptr<const TokenSource> src_;
  TokenOptions o_;
  int64_t limit_ = 0;    // exclusive upper bound of valid ids
  int64_t samples_ = 0;  // global samples per epoch (EpochKey unit)
  int64_t rows_ = 0;
  int64_t windows_ = 0;  // kWindows
  int64_t pad_ = 0, unused_ = 0;
  std::optional<PackPlan> pack_;
  std::optional<BudgetPlan> budget_;
};

}  // namespace stoker
