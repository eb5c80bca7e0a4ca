// Mixtures: several sources in one stream of rows, each source's share exact
// at every row, in O(1) per lookup.
//
// NOTE [ Mixtures ]
// A mixture is one stream of rows R = 0, 1, 2, ... (epoch e is the rows
// [e*E, (e+1)*E), so a source's order continues across epochs). Row R is the
// c-th row of source s = src(R), where c = C_s(R), the rows of s before R; and
// the c-th row of s is sample c mod n_s of pass c div n_s of its own stream
// (source_stream.h: a fresh keyed permutation each pass). So every batch, every
// resume and every rank follow from the counts vector C(R), and the question is
// how to get C(R) without replaying R rows while keeping |C_s(R) - R*w_s| below
// one row at every R (then after n batches of B rows, every source is within
// one row of n*B*w_s, for any B and any world size: the job's rows are always
// a prefix of the stream).
//
// Rules that do not do it: Megatron's (give the row to the source lagging its
// target most) is sequential and drifts past one row for k >= 4 sources
// (RedPajama's seven weights, 67/15/4.5/4.5/2.5/4.5/2 %: 1.31 rows after 193
// rows); Sainte-Lague's below reaches 1.6 rows there; closed forms by floors of the
// cumulative weights W_s = w_1 + ... + w_s either drift (Grain's nested
// ceilings) or, like C_s(R) = floor(R*W_s + 1/2) - floor(R*W_{s-1} + 1/2),
// keep the bound but are not monotone in R (a count that goes down is no
// stream) unless every source but the first and last gets a row per step.
//
// Constant weights w_s = m_s / P (integers m_s >= 1, sum P <= 2^20; the Python
// layer makes 0.7 exactly 7/10 and rounds only weights that need a finer
// denominator, by at most 2^-21). Tijdeman's rule (the chairman assignment
// problem, 1980), with d = 1 / (2k - 2): row t (t = 1, 2, ...) goes, among the
// sources whose next row j = C_s + 1 is released (t >= (j - 1 + d) / w_s), to
// the one whose deadline (j - d) / w_s is earliest (ties: the lower index).
// His theorem: a released source always exists, and
//
//     |C_s(t) - t * w_s| <= 1 - d < 1        for every s and t.
//
// At t = P every target t * w_s = m_s is an integer, so C_s(P) = m_s exactly:
// the state is where it started and the rule repeats itself. The sequence is
// periodic, one period is computed once (O(P log k), with exact integer
// comparisons), and
//
//     C_s(R) = floor(R / P) * m_s + C_s(R mod P)
//
// with the period's prefix counts kept every 64 rows: O(k + 64) per lookup.
//
// Schedules: weights given at breakpoints (rows), constant or linear between
// them; the target is the integral T_s(R) = integral of w_s over [0, R). There
// is no period, so the rule is Sainte-Lague's (Webster's) in continuous time:
// source s's j-th row (j >= 0) is due at tau_s(j) = T_s^-1(j + 1/2), and the
// rows are the due times of all sources merged in order (ties: the lower
// index). Since sum_s floor(T_s(x) + 1/2) is within k/2 of x, the R-th due
// time lies within k/2 + 2 of R: C(R) is the count of each source's due times
// below a point there plus a merge of the few near it, O(k log k). Bound: with
// the weight w_s in force,
//
//     |C_s(R) - T_s(R)| < 1/2 + (k - 2) * w_s / 2,
//
// within one row for up to three sources or when no weight exceeds
// 1 / (k - 2); never more than (k - 1) / 2 rows, and it never drifts. (A
// schedule with one weight vector is constant weights, and takes the rule above.)
//
// Ranks (MixSplit): a step of the job is B*W consecutive rows of the epoch;
// rank r takes rows [r*B, (r+1)*B) of it, so each rank's batch is a run of the
// stream, and after n steps the job has read exactly its first n*B*W rows. The
// last, partial step is split evenly (ceil), wrap-around padding as for
// records (sampler.h). The resume state is the epoch and the rows the job has
// consumed (the same on every rank), from which C follows at any world size:
// nothing is replayed, and the rest of the epoch at W' ranks is exactly the
// rows the job had not read.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace stoker {

/// Which source each row of a mixture's stream comes from (NOTE [ Mixtures ]).
/// Immutable and thread-safe once made; copies share their tables.
class MixSequence {
 public:
  /// Largest period of constant weights.
  static constexpr int64_t kMaxPeriod = int64_t{1} << 20;
  /// Most sources of one mixture.
  static constexpr size_t kMaxSources = 4096;

  /// Constant weights: counts[s] rows of source s in every sum(counts) rows.
  /// UsageError unless every count is >= 1 and the sum is at most kMaxPeriod.
  static MixSequence constant(const std::vector<int64_t>& counts);

  /// A schedule: weights[i] (>= 0 each, a positive sum; normalised here) in
  /// force from row starts[i] (starts[0] == 0, increasing); with `linear`,
  /// interpolated between breakpoints, the last holding on. Every source needs
  /// a positive weight at some breakpoint. A schedule whose breakpoints all
  /// have the same weights is refused: pass constant weights instead.
  static MixSequence schedule(const std::vector<int64_t>& starts,
                              const std::vector<std::vector<double>>& weights, bool linear);

  size_t num_sources() const;
  bool is_constant() const;
  /// Constant weights: the period P and each source's rows in it.
  int64_t period() const;
  const std::vector<int64_t>& period_counts() const;

  /// Rows of each source among rows [0, rows): out[0, num_sources()).
  void counts(int64_t rows, int64_t* out) const;
  std::vector<int64_t> counts(int64_t rows) const;
  /// Rows [first, first + n): the source of each, and its position in that
  /// source's stream (the rows of that source before it).
  void rows(int64_t first, int64_t n, int32_t* source, int64_t* index) const;
  /// The weights in force at row r (normalised).
  std::vector<double> weights_at(int64_t r) const;
  /// The rows after which source `s` has had `count` rows (>= 1): one past
  /// the row of its count-th row.
  int64_t rows_until(size_t s, int64_t count) const;

  class Rule;  // the two rules (mixture.cpp)

 private:
  explicit MixSequence(std::shared_ptr<const Rule> rule) : rule_(std::move(rule)) {}
  std::shared_ptr<const Rule> rule_;
};

/// A producer's sequence: replaceable until an epoch is planned with it (a
/// resume that keeps a schedule's rows per step), fixed after. Thread-safe.
class MixSequenceSlot {
 public:
  explicit MixSequenceSlot(MixSequence seq) : seq_(std::move(seq)) {}
  /// The sequence now.
  MixSequence get() const;
  /// The sequence for an epoch's plan: set() is refused from now on.
  MixSequence take() const;
  /// UsageError once taken, or for another number of sources.
  void set(MixSequence seq);

 private:
  mutable std::mutex mu_;
  MixSequence seq_;             // guarded by mu_
  mutable bool taken_ = false;  // guarded by mu_
};

/// One rank's batches of (the rest of) an epoch of a mixture: steps of
/// batch * world consecutive rows, rank r taking rows [r*batch, (r+1)*batch)
/// of each (NOTE [ Mixtures ]). Counts match sampler.h's for the same
/// arguments: ceil(left / world) rows per rank (floor with drop_last), in
/// ceil / floor of that over `batch` batches; without even_batches no row is
/// repeated and a rank's last batch may be shorter or empty.
struct MixSplit {
  int64_t n = 0, offset = 0, rank = 0, world = 1, batch = 1, pad_from = 0;
  bool drop_last = false, even_batches = true;
  int64_t full = 0;     ///< steps of batch * world rows
  int64_t rem = 0;      ///< rows of the last, partial step
  int64_t last = 0;     ///< rows per rank in the partial step (ceil(rem / world))
  int64_t batches = 0;  ///< this rank's batches

  MixSplit() = default;
  /// UsageError for arguments outside their ranges.
  MixSplit(int64_t n, int64_t offset, int64_t rank, int64_t world, int64_t batch, bool drop_last,
           bool even_batches = true, int64_t pad_from = 0);

  /// Rows of this rank's batch k.
  int64_t batch_length(int64_t k) const;
  /// Epoch position (in [0, n)) of row j of this rank's batch k: the first
  /// is first_position(k), the others follow it, wrapping around to pad_from.
  int64_t position(int64_t k, int64_t j) const;
  int64_t first_position(int64_t k) const;
  /// Rows the job has consumed once every rank has taken k batches.
  int64_t consumed_after(int64_t k) const;
  /// Rows every rank holds (the longest rank's, with padding).
  int64_t share() const;
};

/// This rank's batch k of epoch `epoch` of a mixture of `epoch_rows` rows per
/// epoch (epoch e is the stream's rows [e * epoch_rows, (e + 1) * epoch_rows)):
/// the source of each row and its position in that source's stream, into
/// source[0, n) and index[0, n), n = split.batch_length(k). UsageError when the
/// stream's rows overflow 63 bits.
void mix_batch_rows(const MixSequence& seq, const MixSplit& split, uint64_t epoch,
                    int64_t epoch_rows, int64_t k, int32_t* source, int64_t* index);

}  // namespace stoker
