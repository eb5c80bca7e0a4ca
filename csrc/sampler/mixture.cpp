#include "sampler/mixture.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

#include "common/error.h"

namespace stoker {

class MixSequence::Rule {
 public:
  virtual ~Rule() = default;
  virtual size_t num_sources() const = 0;
  virtual bool is_constant() const = 0;
  virtual void counts(int64_t rows, int64_t* out) const = 0;
  virtual void rows(int64_t first, int64_t n, int32_t* source, int64_t* index) const = 0;
  virtual std::vector<double> weights_at(int64_t r) const = 0;
};

namespace {

// ---------------------------------------------------------------------------
// Constant weights: one period of Tijdeman's rule (NOTE [ Mixtures ]).

class PeriodicRule final : public MixSequence::Rule {
 public:
  static constexpr int kBlockShift = 6;  // prefix counts every 64 rows

  explicit PeriodicRule(std::vector<int64_t> m) : m_(std::move(m)) {
    const size_t k = m_.size();
    STOKER_CHECK(k >= 1 && k <= MixSequence::kMaxSources, UsageError, "a mixture needs 1 to ",
                 MixSequence::kMaxSources, " sources, got ", k);
    for (size_t s = 0; s < k; ++s) {
      STOKER_CHECK(m_[s] >= 1 && m_[s] <= MixSequence::kMaxPeriod, UsageError, "source ", s,
                   " has ", m_[s], " rows per period; each needs 1 to ", MixSequence::kMaxPeriod);
      period_ += m_[s];
    }
    STOKER_CHECK(period_ <= MixSequence::kMaxPeriod, UsageError, "a period of ", period_,
                 " rows is longer than ", MixSequence::kMaxPeriod);
    build();
  }

  size_t num_sources() const override { return m_.size(); }
  bool is_constant() const override { return true; }
  int64_t period() const { return period_; }
  const std::vector<int64_t>& period_counts() const { return m_; }

  void counts(int64_t rows, int64_t* out) const override {
    STOKER_CHECK(rows >= 0, UsageError, "row ", rows, " is negative");
    const size_t k = m_.size();
    const int64_t turns = rows / period_, at = rows % period_;
    const int64_t block = at >> kBlockShift;
    const int32_t* pre = prefix_.data() + static_cast<size_t>(block) * k;
    for (size_t s = 0; s < k; ++s) out[s] = turns * m_[s] + pre[s];
    for (int64_t t = block << kBlockShift; t < at; ++t) ++out[seq_[static_cast<size_t>(t)]];
  }

  void rows(int64_t first, int64_t n, int32_t* source, int64_t* index) const override {
    std::vector<int64_t> c(m_.size());
    counts(first, c.data());
    int64_t at = first % period_;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t s = seq_[static_cast<size_t>(at)];
      source[i] = s;
      index[i] = c[s]++;
      if (++at == period_) at = 0;
    }
  }

  std::vector<double> weights_at(int64_t) const override {
    std::vector<double> w(m_.size());
    for (size_t s = 0; s < m_.size(); ++s)
      w[s] = static_cast<double>(m_[s]) / static_cast<double>(period_);
    return w;
  }

 private:
  // Row t (1-based) of the period goes to the released source with the
  // earliest deadline. Job j (1-based) of source s, with D = 2k - 2 and
  // w_s = m_s / P: released at t >= ((j - 1) D + 1) P / (D m_s), due at
  // (j D - 1) P / (D m_s). Every quantity fits 63 bits (P, m <= 2^20, D <= 2^13).
  void build() {
    const size_t k = m_.size();
    const int64_t P = period_;
    seq_.assign(static_cast<size_t>(P), 0);
    const size_t blocks = static_cast<size_t>(P >> kBlockShift) + 1;
    prefix_.assign(blocks * k, 0);
    std::vector<int64_t> c(k, 0);
    if (k > 1) {
      const int64_t D = 2 * static_cast<int64_t>(k) - 2;
      auto release = [&](size_t s, int64_t j) {  // the first row t at which job j is released
        const int64_t num = ((j - 1) * D + 1) * P, den = D * m_[s];
        return (num + den - 1) / den;
      };
      // (deadline, source) of a released job: a is due before b.
      struct Job {
        int64_t j;
        size_t s;
      };
      auto later = [&](const Job& a, const Job& b) {
        const int64_t x = (a.j * D - 1) * m_[b.s], y = (b.j * D - 1) * m_[a.s];
        return x != y ? x > y : a.s > b.s;
      };
      std::priority_queue<Job, std::vector<Job>, decltype(later)> ready(later);
      using Pending = std::pair<int64_t, size_t>;  // (release row, source)
      std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending;
      for (size_t s = 0; s < k; ++s) pending.emplace(release(s, 1), s);
      for (int64_t t = 1; t <= P; ++t) {
        while (!pending.empty() && pending.top().first <= t) {
          const size_t s = pending.top().second;
          pending.pop();
          ready.push({c[s] + 1, s});
        }
        // Tijdeman's theorem: some source is always released.
        STOKER_CHECK(!ready.empty(), Error, "mixture rule: no source released at row ", t);
        const size_t s = ready.top().s;
        ready.pop();
        seq_[static_cast<size_t>(t - 1)] = static_cast<uint16_t>(s);
        // A source's job m_s + 1 is released after row P: it belongs to the next period.
        if (++c[s] < m_[s]) pending.emplace(release(s, c[s] + 1), s);
      }
    } else {
      c[0] = P;
    }
    for (size_t s = 0; s < k; ++s)
      STOKER_CHECK(c[s] == m_[s], Error, "mixture rule: source ", s, " has ", c[s], " rows of ",
                   m_[s], " in its period");
    std::vector<int32_t> run(k, 0);
    for (int64_t t = 0; t < P; ++t) {
      if ((t & ((int64_t{1} << kBlockShift) - 1)) == 0)
        std::copy(run.begin(), run.end(),
                  prefix_.begin() + static_cast<std::ptrdiff_t>((t >> kBlockShift) * k));
      ++run[seq_[static_cast<size_t>(t)]];
    }
    if ((P & ((int64_t{1} << kBlockShift) - 1)) == 0)
      std::copy(run.begin(), run.end(),
                prefix_.begin() + static_cast<std::ptrdiff_t>((P >> kBlockShift) * k));
  }

  std::vector<int64_t> m_;
  int64_t period_ = 0;
  std::vector<uint16_t> seq_;    // the source of each row of the period
  std::vector<int32_t> prefix_;  // per 64-row block and source: rows before the block
};

// ---------------------------------------------------------------------------
// Schedules: Sainte-Lague's rule over the integrated weights (NOTE [ Mixtures ]).

class ScheduleRule final : public MixSequence::Rule {
 public:
  ScheduleRule(const std::vector<int64_t>& starts, const std::vector<std::vector<double>>& weights,
               bool linear) {
    const size_t m = starts.size();
    STOKER_CHECK(m >= 1 && weights.size() == m, UsageError,
                 "a schedule needs as many weight vectors as breakpoints (", m, " and ",
                 weights.size(), ")");
    STOKER_CHECK(starts[0] == 0, UsageError, "a schedule starts at row 0, got ", starts[0]);
    k_ = weights[0].size();
    STOKER_CHECK(k_ >= 1 && k_ <= MixSequence::kMaxSources, UsageError, "a mixture needs 1 to ",
                 MixSequence::kMaxSources, " sources, got ", k_);
    std::vector<std::vector<double>> w(m);
    for (size_t i = 0; i < m; ++i) {
      if (i > 0)
        STOKER_CHECK(starts[i] > starts[i - 1], UsageError,
                     "schedule breakpoints must increase: row ", starts[i], " after row ",
                     starts[i - 1]);
      STOKER_CHECK(weights[i].size() == k_, UsageError, "breakpoint ", i, " has ",
                   weights[i].size(), " weights for ", k_, " sources");
      double sum = 0;
      for (double x : weights[i]) {
        STOKER_CHECK(std::isfinite(x) && x >= 0, UsageError, "breakpoint ", i,
                     " has a weight that is negative or not finite: ", x);
        sum += x;
      }
      STOKER_CHECK(sum > 0, UsageError, "breakpoint ", i, " has no positive weight");
      w[i].resize(k_);
      for (size_t s = 0; s < k_; ++s) w[i][s] = weights[i][s] / sum;
    }
    for (size_t s = 0; s < k_; ++s) {
      bool any = false;
      for (size_t i = 0; i < m; ++i) any = any || w[i][s] > 0;
      STOKER_CHECK(any, UsageError, "source ", s, " has weight 0 at every breakpoint");
    }
    bool varies = false;
    for (size_t i = 1; i < m; ++i) varies = varies || w[i] != w[0];
    STOKER_CHECK(varies, UsageError,
                 "a schedule whose breakpoints all have the same weights is constant weights");
    x_.assign(starts.begin(), starts.end());
    a_.assign(m * k_, 0);
    b_.assign(m * k_, 0);
    t_.assign(m * k_, 0);
    for (size_t i = 0; i < m; ++i)
      for (size_t s = 0; s < k_; ++s) {
        a_[i * k_ + s] = w[i][s];
        if (linear && i + 1 < m)
          b_[i * k_ + s] = (w[i + 1][s] - w[i][s]) / static_cast<double>(x_[i + 1] - x_[i]);
        if (i + 1 < m) {
          const double len = static_cast<double>(x_[i + 1] - x_[i]);
          t_[(i + 1) * k_ + s] =
              t_[i * k_ + s] + a_[i * k_ + s] * len + b_[i * k_ + s] * len * len / 2;
        }
      }
  }

  size_t num_sources() const override { return k_; }
  bool is_constant() const override { return false; }

  void counts(int64_t rows, int64_t* out) const override {
    STOKER_CHECK(rows >= 0, UsageError, "row ", rows, " is negative");
    Merge mg(*this, rows);
    for (int64_t i = 0; i < rows - mg.below; ++i) mg.pop();
    for (size_t s = 0; s < k_; ++s) out[s] = mg.next[s];
  }

  void rows(int64_t first, int64_t n, int32_t* source, int64_t* index) const override {
    STOKER_CHECK(first >= 0, UsageError, "row ", first, " is negative");
    Merge mg(*this, first);
    for (int64_t i = 0; i < first - mg.below; ++i) mg.pop();
    for (int64_t i = 0; i < n; ++i) {
      const size_t s = mg.pop();
      source[i] = static_cast<int32_t>(s);
      index[i] = mg.next[s] - 1;
    }
  }

  std::vector<double> weights_at(int64_t r) const override {
    const size_t i = segment_of(static_cast<double>(r));
    std::vector<double> w(k_);
    for (size_t s = 0; s < k_; ++s)
      w[s] = a_[i * k_ + s] + b_[i * k_ + s] * static_cast<double>(r - x_[i]);
    return w;
  }

 private:
  static constexpr double kNever = std::numeric_limits<double>::infinity();

  size_t segment_of(double x) const {
    auto it = std::upper_bound(x_.begin(), x_.end(), x,
                               [](double v, int64_t e) { return v < static_cast<double>(e); });
    return static_cast<size_t>(it - x_.begin()) - 1;
  }

  // T_s(x): the rows source s is due by x.
  double target(size_t s, double x) const {
    if (x <= 0) return 0;
    const size_t i = segment_of(x);
    const double u = x - static_cast<double>(x_[i]);
    return t_[i * k_ + s] + a_[i * k_ + s] * u + b_[i * k_ + s] * u * u / 2;
  }

  // tau_s(j) = T_s^-1(j + 1/2): when source s's row j is due. Consecutive due
  // times of a source are at least one row apart (w <= 1), far above rounding.
  double due(size_t s, int64_t j) const {
    const double y = static_cast<double>(j) + 0.5;
    const size_t m = x_.size();
    // The first segment whose end is past y (the last never ends).
    size_t i = 0;
    {
      size_t lo = 0, hi = m - 1;  // segments [lo, hi]
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (t_[(mid + 1) * k_ + s] > y)
          hi = mid;
        else
          lo = mid + 1;
      }
      i = lo;
    }
    const double a = a_[i * k_ + s], b = b_[i * k_ + s], d = y - t_[i * k_ + s];
    if (i + 1 == m && a <= 0) return kNever;  // weight 0 for ever after
    // a u + b u^2 / 2 = d, in the form that is stable for small b and b < 0.
    const double root = std::sqrt(std::max(0.0, a * a + 2 * b * d));
    const double u = a + root > 0 ? 2 * d / (a + root) : 0;
    return static_cast<double>(x_[i]) + u;
  }

  // The due times of all sources merged, from a point below row `rows`'s.
  struct Merge {
    using Item = std::pair<double, size_t>;  // (due time, source): ties to the lower source
    const ScheduleRule& r;
    std::vector<int64_t> next;  // per source: its next row (rows of it merged so far)
    int64_t below = 0;          // rows merged before the heap's
    std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;

    Merge(const ScheduleRule& rule, int64_t rows) : r(rule), next(rule.k_) {
      // sum_s floor(T_s(x) + 1/2) is within k/2 of x: start below that.
      double lo = static_cast<double>(rows) - static_cast<double>(r.k_) / 2 - 2;
      for (;;) {
        below = 0;
        for (size_t s = 0; s < r.k_; ++s) {
          int64_t j = lo <= 0 ? 0 : static_cast<int64_t>(std::floor(r.target(s, lo) + 0.5));
          while (j > 0 && r.due(s, j - 1) >= lo) --j;
          while (r.due(s, j) < lo) ++j;
          next[s] = j;
          below += j;
        }
        if (below <= rows) break;
        lo -= static_cast<double>(r.k_) + 2;
      }
      for (size_t s = 0; s < r.k_; ++s) heap.emplace(r.due(s, next[s]), s);
    }

    size_t pop() {
      const size_t s = heap.top().second;
      STOKER_CHECK(heap.top().first < kNever, Error, "mixture schedule: no source has rows left");
      heap.pop();
      heap.emplace(r.due(s, ++next[s]), s);
      return s;
    }
  };

  size_t k_ = 0;
  std::vector<int64_t> x_;  // breakpoints (rows)
  // Per breakpoint i and source s ([i * k + s]): the weight at x_i, its slope
  // over segment i, and T_s(x_i).
  std::vector<double> a_, b_, t_;
};

}  // namespace

MixSequence MixSequence::constant(const std::vector<int64_t>& counts) {
  return MixSequence(std::make_shared<PeriodicRule>(counts));
}

MixSequence MixSequence::schedule(const std::vector<int64_t>& starts,
                                  const std::vector<std::vector<double>>& weights, bool linear) {
  return MixSequence(std::make_shared<ScheduleRule>(starts, weights, linear));
}

size_t MixSequence::num_sources() const { return rule_->num_sources(); }
bool MixSequence::is_constant() const { return rule_->is_constant(); }

int64_t MixSequence::period() const {
  STOKER_CHECK(is_constant(), UsageError, "a schedule has no period");
  return static_cast<const PeriodicRule&>(*rule_).period();
}

const std::vector<int64_t>& MixSequence::period_counts() const {
  STOKER_CHECK(is_constant(), UsageError, "a schedule has no period");
  return static_cast<const PeriodicRule&>(*rule_).period_counts();
}

void MixSequence::counts(int64_t rows, int64_t* out) const { rule_->counts(rows, out); }

std::vector<int64_t> MixSequence::counts(int64_t rows) const {
  std::vector<int64_t> out(num_sources());
  rule_->counts(rows, out.data());
  return out;
}

void MixSequence::rows(int64_t first, int64_t n, int32_t* source, int64_t* index) const {
  STOKER_CHECK(n >= 0, UsageError, "negative row count ", n);
  rule_->rows(first, n, source, index);
}

std::vector<double> MixSequence::weights_at(int64_t r) const {
  STOKER_CHECK(r >= 0, UsageError, "row ", r, " is negative");
  return rule_->weights_at(r);
}

int64_t MixSequence::rows_until(size_t s, int64_t count) const {
  STOKER_CHECK(s < num_sources(), UsageError, "no source ", s);
  STOKER_CHECK(count >= 1, UsageError, "count must be >= 1, got ", count);
  std::vector<int64_t> c(num_sources());
  auto reached = [&](int64_t rows) {
    rule_->counts(rows, c.data());
    return c[s] >= count;
  };
  // The smallest `rows` with count rows of s: double a bound, then halve.
  int64_t hi = count;
  while (!reached(hi)) {
    STOKER_CHECK(hi <= std::numeric_limits<int64_t>::max() / 2, UsageError, "source ", s,
                 " does not reach ", count, " rows");
    hi *= 2;
  }
  int64_t lo = count - 1;  // not reached: fewer rows than count
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (reached(mid))
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

MixSequence MixSequenceSlot::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

MixSequence MixSequenceSlot::take() const {
  std::lock_guard<std::mutex> lock(mu_);
  taken_ = true;
  return seq_;
}

void MixSequenceSlot::set(MixSequence seq) {
  std::lock_guard<std::mutex> lock(mu_);
  STOKER_CHECK(seq.num_sources() == seq_.num_sources(), UsageError, "a mixture of ",
               seq_.num_sources(), " sources cannot take a sequence of ", seq.num_sources());
  STOKER_CHECK(!taken_, UsageError,
               "the mixture's sequence is in use: resume a loader before iterating it");
  seq_ = std::move(seq);
}

// ---------------------------------------------------------------------------

MixSplit::MixSplit(int64_t n_, int64_t offset_, int64_t rank_, int64_t world_, int64_t batch_,
                   bool drop_last_, bool even_batches_, int64_t pad_from_)
    : n(n_),
      offset(offset_),
      rank(rank_),
      world(world_),
      batch(batch_),
      pad_from(pad_from_),
      drop_last(drop_last_),
      even_batches(even_batches_) {
  STOKER_CHECK(n >= 0, UsageError, "an epoch of ", n, " rows");
  STOKER_CHECK(world >= 1, UsageError, "world_size must be >= 1, got ", world);
  STOKER_CHECK(rank >= 0 && rank < world, UsageError, "rank ", rank,
               " is outside [0, world_size=", world, ")");
  STOKER_CHECK(batch >= 1, UsageError, "batch size must be >= 1, got ", batch);
  STOKER_CHECK(batch <= std::numeric_limits<int64_t>::max() / world, UsageError,
               "batch size x world size overflows");
  STOKER_CHECK(offset >= 0 && offset <= n, UsageError, "resume offset ", offset,
               " is outside the epoch's ", n, " rows");
  STOKER_CHECK(pad_from >= 0 && pad_from <= offset, UsageError, "epoch pad_from ", pad_from,
               " outside [0, offset=", offset, "]");
  if (pad_from == n) pad_from = 0;
  const int64_t left = n - offset, step = batch * world;
  full = left / step;
  rem = left % step;
  last = rem / world + (rem % world != 0 ? 1 : 0);
  batches = full + (!drop_last && rem > 0 ? 1 : 0);
}

int64_t MixSplit::batch_length(int64_t k) const {
  if (k < full) return batch;
  if (k > full || drop_last) return 0;
  if (even_batches) return last;
  return std::clamp<int64_t>(rem - rank * last, 0, last);
}

int64_t MixSplit::first_position(int64_t k) const {
  return k < full ? offset + k * batch * world + rank * batch
                  : offset + full * batch * world + rank * last;
}

int64_t MixSplit::position(int64_t k, int64_t j) const {
  const int64_t q = first_position(k) + j;
  return q < n ? q : pad_from + (q - n) % (n - pad_from);  // wrap-around padding
}

int64_t MixSplit::consumed_after(int64_t k) const {
  if (k <= 0) return offset;
  if (k <= full) return offset + k * batch * world;
  return n;
}

int64_t MixSplit::share() const { return full * batch + (drop_last ? 0 : last); }

void mix_batch_rows(const MixSequence& seq, const MixSplit& split, uint64_t epoch,
                    int64_t epoch_rows, int64_t k, int32_t* source, int64_t* index) {
  STOKER_CHECK(epoch_rows == split.n, UsageError, "the split is of ", split.n,
               " rows, the epoch of ", epoch_rows);
  STOKER_CHECK(epoch_rows == 0 ||
                   epoch < static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / epoch_rows),
               UsageError, "epoch ", epoch, " of ", epoch_rows, " rows is past 2**63 rows");
  const int64_t base = static_cast<int64_t>(epoch) * epoch_rows;
  const int64_t n = split.batch_length(k);
  // The batch's positions run on from first_position(k), but for wrap-around
  // padding: consecutive runs of rows, each one call.
  int64_t j = 0;
  while (j < n) {
    const int64_t q = split.position(k, j);
    int64_t run = 1;
    while (j + run < n && split.position(k, j + run) == q + run) ++run;
    seq.rows(base + q, run, source + j, index + j);
    j += run;
  }
}

}  // namespace stoker
