// Document-aware packing: documents placed whole into rows of exactly seq_len
// tokens, each starting at a row position where it fits, so attention never
// has to cross a document (varlen attention uses the boundaries).
//
// Documents are taken in one order (the source's, or a permutation keyed by
// the seed when shuffling) and placed online into at most `window` open rows:
//   best fit   the open row with the least free space that still fits
//   first fit  the earliest opened row that fits
// (ties: the earliest opened). A document that fits no open row opens a new
// one; with `window` rows open, the oldest is closed first (its free space is
// padding). A row that is exactly full closes at once; a document of exactly
// seq_len tokens is a row of its own without touching the open rows. Closed rows are the
// plan's rows, in closing order. The window bounds both the planning cost
// (O(documents x window)) and how far a document moves from its place in the
// order. A document longer than seq_len is split into seq_len pieces (the
// last, shorter piece is placed like a document), truncated to its first
// seq_len tokens, or refused, per `overlong`. Empty documents take no place.
//
// The plan depends only on (lengths, options, seed): it is built once, and an
// epoch is an order of its rows, so every epoch has the same number of rows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stoker {

/// Tokens [offset, offset + length) of document `doc`.
struct PackPiece {
  int64_t doc = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

enum class PackFit : uint8_t { kBest, kFirst };
enum class Overlong : uint8_t { kSplit, kTruncate, kError };

struct PackOptions {
  int64_t seq_len = 0;
  PackFit fit = PackFit::kBest;
  int64_t window = 64;  ///< open rows at most
  Overlong overlong = Overlong::kSplit;
  bool shuffle = false;  ///< documents in a seeded order rather than the source's
  uint64_t seed = 0;
};

class PackPlan {
 public:
  /// @param starts document d is tokens [starts[d], starts[d+1]) (num_docs + 1 entries)
  /// @param where  names a document in the error for Overlong::kError
  PackPlan(const std::vector<int64_t>& starts, const PackOptions& opts,
           const std::function<std::string(int64_t)>& where);

  int64_t num_rows() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  const PackPiece* row_pieces(int64_t r) const { return pieces_.data() + row_begin_[r]; }
  int64_t row_num_pieces(int64_t r) const { return row_begin_[r + 1] - row_begin_[r]; }
  /// Tokens placed in row r (the rest of its seq_len is padding).
  int64_t row_tokens(int64_t r) const { return row_used_[static_cast<size_t>(r)]; }
  int64_t pad_tokens() const { return pad_; }
  int64_t dropped_tokens() const { return dropped_; }  ///< cut off by Overlong::kTruncate

 private:
  std::vector<PackPiece> pieces_;
  std::vector<int64_t> row_begin_{0};
  std::vector<int32_t> row_used_;
  int64_t pad_ = 0, dropped_ = 0;
};

}  // namespace stoker
