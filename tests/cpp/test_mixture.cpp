// Mixtures (NOTE [ Mixtures ] in sampler/mixture.h): every source's count within
// one row of its share at every row, counts in O(1) that agree with the rows,
// per-source streams that are permutations pass after pass, and rank splits that
// resume exactly at any step and world size.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "sampler/mixture.h"
#include "sampler/source_stream.h"

using namespace stoker;

namespace {

std::vector<int32_t> sources_of(const MixSequence& m, int64_t first, int64_t n) {
  std::vector<int32_t> src(static_cast<size_t>(n));
  std::vector<int64_t> idx(static_cast<size_t>(n));
  m.rows(first, n, src.data(), idx.data());
  return src;
}

// Max over rows t in [1, rows] and sources of |C_s(t) * P - t * m_s|, in units of 1/P rows.
int64_t max_error_scaled(const std::vector<int32_t>& seq, const std::vector<int64_t>& m) {
  const int64_t P = std::accumulate(m.begin(), m.end(), int64_t{0});
  std::vector<int64_t> c(m.size(), 0);
  int64_t worst = 0;
  for (size_t t = 0; t < seq.size(); ++t) {
    ++c[static_cast<size_t>(seq[t])];
    for (size_t s = 0; s < m.size(); ++s)
      worst = std::max(worst, std::abs(c[s] * P - static_cast<int64_t>(t + 1) * m[s]));
  }
  return worst;
}

}  // namespace

// Tijdeman's bound, exactly: |C_s(t) - t w_s| <= 1 - 1/(2k - 2) at every row,
// over two periods, for random weights (and the ones where Megatron's rule
// drifts past a row).
static void constant_weights_bound() {
  std::mt19937_64 rng(7);
  std::vector<std::vector<int64_t>> cases = {
      {7, 3}, {5, 3, 2}, {75, 15, 5, 5}, {670, 150, 45, 45, 25, 45, 20}, {1, 1}, {1}, {1, 999}};
  for (int i = 0; i < 60; ++i) {
    const size_t k = 1 + rng() % 9;
    std::vector<int64_t> m(k);
    for (auto& v : m) v = 1 + static_cast<int64_t>(rng() % (rng() % 2 ? 7 : 400));
    cases.push_back(m);
  }
  for (const auto& m : cases) {
    const MixSequence seq = MixSequence::constant(m);
    const int64_t P = seq.period();
    CHECK_EQ(P, std::accumulate(m.begin(), m.end(), int64_t{0}));
    const auto rows = sources_of(seq, 0, 2 * P);
    const int64_t k = static_cast<int64_t>(m.size());
    // |C P - t m| <= (1 - 1/(2k - 2)) P  <=>  |C P - t m| (2k - 2) <= (2k - 3) P
    if (k >= 2) CHECK(max_error_scaled(rows, m) * (2 * k - 2) <= (2 * k - 3) * P);
    // Periodic, and counts(t) are the sequence's prefix counts.
    for (int64_t t = 0; t < P; ++t) CHECK_EQ(rows[static_cast<size_t>(t)], rows[t + P]);
    std::vector<int64_t> c(m.size(), 0);
    for (int64_t t = 0; t <= 2 * P; ++t) {
      if (t % 7 == 0 || t == P || t == 2 * P) CHECK(seq.counts(t) == c);
      if (t < 2 * P) ++c[static_cast<size_t>(rows[static_cast<size_t>(t)])];
    }
    CHECK(seq.counts(P) == m);
  }
}

// The promise in its own words: after n batches of B rows, every
// source within one row of n * B * w (any B).
static void per_batch_ratio() {
  for (const auto& m : std::vector<std::vector<int64_t>>{{7, 3}, {5, 3, 2}, {75, 15, 5, 5}}) {
    const MixSequence seq = MixSequence::constant(m);
    const double P = static_cast<double>(seq.period());
    for (int64_t B : {1, 3, 8, 32, 100}) {
      for (int64_t n = 1; n <= 300; ++n) {
        const auto c = seq.counts(n * B);
        for (size_t s = 0; s < m.size(); ++s)
          CHECK(std::abs(static_cast<double>(c[s]) - static_cast<double>(n * B * m[s]) / P) < 1.0);
      }
    }
  }
}

// rows(first, n) is the slice of the whole sequence, and counts() agree with
// it, also far out (a resume at a late step reads no earlier row).
static void rows_are_slices() {
  std::mt19937_64 rng(11);
  const MixSequence seq = MixSequence::constant({670, 150, 45, 45, 25, 45, 20});
  const int64_t P = seq.period();
  const auto whole = sources_of(seq, 0, 3 * P);
  for (int i = 0; i < 200; ++i) {
    const int64_t first = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * P));
    const int64_t n = static_cast<int64_t>(rng() % 300);
    std::vector<int32_t> src(static_cast<size_t>(n));
    std::vector<int64_t> idx(static_cast<size_t>(n));
    seq.rows(first, n, src.data(), idx.data());
    auto c = seq.counts(first);
    for (int64_t j = 0; j < n; ++j) {
      CHECK_EQ(src[static_cast<size_t>(j)], whole[static_cast<size_t>(first + j)]);
      CHECK_EQ(idx[static_cast<size_t>(j)], c[static_cast<size_t>(src[static_cast<size_t>(j)])]++);
    }
  }
  // A late row: counts shift by the period's counts, turn after turn.
  const int64_t late = int64_t{1} << 50;
  const int64_t at = late % P;
  const auto base = seq.counts(late), next = seq.counts(late + P + 17);
  const auto near0 = seq.counts(at), near1 = seq.counts(at + 17);
  for (size_t s = 0; s < base.size(); ++s)
    CHECK_EQ(next[s] - base[s], seq.period_counts()[s] + near1[s] - near0[s]);
}

// Schedules: rows are slices, counts are monotone and follow the integrated
// weights within the bound (one row for three sources), weights_at reads the
// schedule.
static void schedules() {
  const std::vector<int64_t> starts = {0, 500, 1200};
  const std::vector<std::vector<double>> w = {{0.7, 0.2, 0.1}, {0.2, 0.2, 0.6}, {0.5, 0.5, 0.0}};
  for (bool linear : {false, true}) {
    const MixSequence seq = MixSequence::schedule(starts, w, linear);
    CHECK(!seq.is_constant());
    const int64_t N = 3000;
    const auto whole = sources_of(seq, 0, N);
    // The integrated target, independently (per row, long double).
    std::vector<long double> T(3, 0);
    std::vector<int64_t> c(3, 0);
    for (int64_t r = 0; r < N; ++r) {
      const auto wr = seq.weights_at(r);
      size_t i = r < 500 ? 0 : r < 1200 ? 1 : 2;
      for (size_t s = 0; s < 3; ++s) {
        double expect = w[i][s];
        if (linear && i + 1 < starts.size())
          expect += (w[i + 1][s] - w[i][s]) * static_cast<double>(r - starts[i]) /
                    static_cast<double>(starts[i + 1] - starts[i]);
        CHECK(std::abs(wr[s] - expect) < 1e-12);
      }
      // T over [r, r + 1): exact for piecewise-linear weights (trapezoid).
      const auto w1 = seq.weights_at(r + 1);
      const bool kink = r + 1 == 500 || r + 1 == 1200;
      for (size_t s = 0; s < 3; ++s)
        T[s] += kink && !linear ? wr[s] : (static_cast<long double>(wr[s]) + w1[s]) / 2;
      ++c[static_cast<size_t>(whole[static_cast<size_t>(r)])];
      for (size_t s = 0; s < 3; ++s) CHECK(std::fabs(static_cast<long double>(c[s]) - T[s]) < 1.0L);
      if (r % 13 == 0) CHECK(seq.counts(r + 1) == c);
    }
    // Source 2 has weight 0 after row 1200 (constant) or ramps to it: it stops.
    CHECK_EQ(seq.counts(2000)[2], seq.counts(N)[2]);
    // Slices from anywhere, across the breakpoints.
    for (int64_t first : {0, 1, 499, 500, 777, 1199, 1200, 2500}) {
      const auto part = sources_of(seq, first, 300);
      for (int64_t j = 0; j < 300; ++j)
        CHECK_EQ(part[static_cast<size_t>(j)], whole[static_cast<size_t>(first + j)]);
    }
  }
  // Weights that stay the same are constant weights; bad schedules are refused.
  CHECK_THROWS(UsageError, MixSequence::schedule({0, 10}, {{1, 1}, {2, 2}}, false));
  CHECK_THROWS(UsageError, MixSequence::schedule({0, 10}, {{1, 0}, {1, 0}}, false));
  CHECK_THROWS(UsageError, MixSequence::schedule({5, 10}, {{1, 1}, {2, 1}}, false));
  CHECK_THROWS(UsageError, MixSequence::schedule({0, 10, 10}, {{1, 1}, {2, 1}, {1, 2}}, false));
  CHECK_THROWS(UsageError, MixSequence::schedule({0, 10}, {{1, -1}, {2, 1}}, false));
  CHECK_THROWS(UsageError, MixSequence::constant({3, 0}));
  CHECK_THROWS(UsageError, MixSequence::constant({MixSequence::kMaxPeriod, 1}));
}

// rows_until: one past the row of a source's count-th row.
static void rows_until() {
  const MixSequence seq = MixSequence::constant({5, 3, 2});
  const auto rows = sources_of(seq, 0, 100);
  for (size_t s = 0; s < 3; ++s) {
    int64_t seen = 0;
    for (int64_t r = 0; r < 100; ++r)
      if (rows[static_cast<size_t>(r)] == static_cast<int32_t>(s))
        CHECK_EQ(seq.rows_until(s, ++seen), r + 1);
  }
}

// Every pass of a source's stream is a permutation of its samples; passes are
// in fresh orders; with a shard window a pass reads window after window.
static void source_streams() {
  for (bool shuffle : {false, true}) {
    SourceStream st({7, 0, 5, 9}, shuffle, 0, 99);
    const int64_t n = st.size();
    CHECK_EQ(n, 21);
    std::vector<int64_t> c(static_cast<size_t>(4 * n)), out(c.size());
    std::iota(c.begin(), c.end(), 0);
    st.map(c.data(), out.data(), c.size());
    for (int64_t p = 0; p < 4; ++p) {
      std::set<int64_t> seen(out.begin() + p * n, out.begin() + (p + 1) * n);
      CHECK_EQ(static_cast<int64_t>(seen.size()), n);
      CHECK(*seen.begin() == 0 && *seen.rbegin() == n - 1);
    }
    for (size_t i = 0; i < c.size(); ++i) CHECK_EQ(out[i], st.index(c[i]));
    const bool same = std::equal(out.begin(), out.begin() + n, out.begin() + n);
    CHECK(same == !shuffle);
  }
  // Shard windows of 2 shards: any pass's first samples come from 2 shards.
  std::vector<int64_t> shards(10, 100);
  SourceStream st(shards, true, 2, 5);
  for (int64_t p = 0; p < 3; ++p) {
    std::set<int64_t> first_window;
    for (int64_t j = 0; j < 200; ++j) first_window.insert(st.index(p * 1000 + j) / 100);
    CHECK_EQ(first_window.size(), 2u);
    const auto sched = st.shard_schedule(p * 1000, 2);
    CHECK(std::set<int64_t>(sched.begin(), sched.end()) == first_window);
  }
  // The schedule goes on into the next pass, each shard named once.
  const auto all = st.shard_schedule(900, 100);
  CHECK_EQ(all.size(), 10u);
  CHECK_THROWS(UsageError, SourceStream({0, 0}, true, 0, 1));
}

// MixSplit: ranks take disjoint rows, the same number of batches as the
// record sampler's, and a resume at another world size reads exactly the rows
// the job had not read (padding repeats only those).
static void splits() {
  for (int64_t n : {0, 1, 7, 64, 100, 1001}) {
    for (int64_t W : {1, 2, 3, 8}) {
      for (int64_t B : {1, 4, 16}) {
        for (bool drop : {false, true}) {
          for (bool even : {true, false}) {
            std::multiset<int64_t> real;
            int64_t batches = -1;
            for (int64_t r = 0; r < W; ++r) {
              MixSplit sp(n, 0, r, W, B, drop, even);
              if (batches >= 0) CHECK_EQ(sp.batches, batches);
              batches = sp.batches;
              const int64_t share = drop ? n / W : (n + W - 1) / W;
              CHECK_EQ(sp.batches, drop ? share / B : (share + B - 1) / B);
              for (int64_t k = 0; k < sp.batches; ++k)
                for (int64_t j = 0; j < sp.batch_length(k); ++j) {
                  const int64_t q = sp.first_position(k) + j;
                  if (q < n) real.insert(q);
                  CHECK(sp.position(k, j) >= 0 && sp.position(k, j) < n);
                }
            }
            // Disjoint, and everything unless drop_last.
            CHECK_EQ(std::set<int64_t>(real.begin(), real.end()).size(), real.size());
            if (!drop) CHECK_EQ(static_cast<int64_t>(real.size()), n);
          }
        }
      }
    }
  }
  // Elastic: 2 ranks take k steps, 3 ranks take the rest from there.
  const int64_t n = 1000, B = 8;
  for (int64_t k : {0, 1, 17, 62}) {
    MixSplit two(n, 0, 0, 2, B, false);
    const int64_t at = two.consumed_after(k);
    CHECK_EQ(at, std::min<int64_t>(n, k * B * 2));
    std::multiset<int64_t> rest;
    for (int64_t r = 0; r < 3; ++r) {
      MixSplit three(n, at, r, 3, B, false, true, at);
      for (int64_t b = 0; b < three.batches; ++b)
        for (int64_t j = 0; j < three.batch_length(b); ++j) {
          const int64_t q = three.position(b, j);
          CHECK(q >= at);  // padding repeats only rows the job had not read
          if (three.first_position(b) + j < n) rest.insert(q);
        }
    }
    std::multiset<int64_t> expect;
    for (int64_t q = at; q < n; ++q) expect.insert(q);
    CHECK(rest == expect);
  }
  CHECK_THROWS(UsageError, MixSplit(10, 11, 0, 1, 1, false));
  CHECK_THROWS(UsageError, MixSplit(10, 0, 2, 2, 1, false));
}

// End to end on the sampler: a schedule with a breakpoint inside the epoch, an
// uninterrupted run against a resume at random steps (same world size, and
// 2 -> 3 ranks), in (source, sample) pairs.
static void resume_across_breakpoint() {
  const int64_t E = 601, B = 8;  // epoch rows (the last step pads by wrapping around)
  const MixSequence seq =
      MixSequence::schedule({0, 1000}, {{0.6, 0.3, 0.1}, {0.2, 0.3, 0.5}}, true);
  std::vector<SourceStream> streams;
  streams.emplace_back(std::vector<int64_t>{40, 60}, true, 0, 1);
  streams.emplace_back(std::vector<int64_t>{25}, true, 0, 2);
  streams.emplace_back(std::vector<int64_t>{10, 10, 10}, true, 2, 3);
  // The (source, sample) of each row of rank r's batch k of a segment of epoch e, by
  // mix_batch_rows, and row by row from the definition.
  auto batch = [&](uint64_t e, const MixSplit& sp, int64_t k) {
    std::vector<std::pair<int32_t, int64_t>> out;
    const int64_t len = sp.batch_length(k);
    std::vector<int32_t> src(static_cast<size_t>(len));
    std::vector<int64_t> pos(static_cast<size_t>(len));
    mix_batch_rows(seq, sp, e, E, k, src.data(), pos.data());
    for (int64_t j = 0; j < len; ++j) {
      const int64_t R = static_cast<int64_t>(e) * E + sp.position(k, j);
      int32_t s;
      int64_t c;
      seq.rows(R, 1, &s, &c);
      CHECK(s == src[static_cast<size_t>(j)] && c == pos[static_cast<size_t>(j)]);
      out.emplace_back(s, streams[static_cast<size_t>(s)].index(c));
    }
    return out;
  };
  std::mt19937_64 rng(3);
  for (uint64_t e : {0u, 1u, 2u}) {  // epoch 1 holds the breakpoint (row 1000)
    for (int64_t W : {1, 2}) {
      for (int64_t r = 0; r < W; ++r) {
        MixSplit whole(E, 0, r, W, B, false);
        for (int trial = 0; trial < 5; ++trial) {
          const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(whole.batches));
          MixSplit rest(E, whole.consumed_after(k), r, W, B, false);
          CHECK_EQ(rest.batches, whole.batches - k);
          for (int64_t b = 0; b < rest.batches; ++b)
            CHECK(batch(e, rest, b) == batch(e, whole, k + b));
        }
      }
    }
    // 2 -> 3 ranks: the multiset of the rows left is exactly the 2-rank job's rest.
    const int64_t k = 20;
    std::multiset<std::pair<int32_t, int64_t>> two_rest, three_rest;
    for (int64_t r = 0; r < 2; ++r) {
      MixSplit sp(E, 0, r, 2, B, false, false);  // no padding either
      for (int64_t b = k; b < sp.batches; ++b)
        for (auto& x : batch(e, sp, b)) two_rest.insert(x);
    }
    const int64_t at = MixSplit(E, 0, 0, 2, B, false).consumed_after(k);
    for (int64_t r = 0; r < 3; ++r) {
      MixSplit sp(E, at, r, 3, B, false, false, at);  // no padding: every row once
      for (int64_t b = 0; b < sp.batches; ++b)
        for (auto& x : batch(e, sp, b)) three_rest.insert(x);
    }
    CHECK(two_rest == three_rest);
  }
}

// A producer's sequence may be replaced until an epoch takes it.
static void sequence_slot() {
  MixSequenceSlot slot(MixSequence::constant({1, 1}));
  slot.set(MixSequence::schedule({0, 10}, {{1, 0}, {1, 1}}, false));
  CHECK(!slot.get().is_constant());
  CHECK_THROWS(UsageError, slot.set(MixSequence::constant({1, 2, 3})));
  CHECK(!slot.take().is_constant());
  CHECK_THROWS(UsageError, slot.set(MixSequence::constant({1, 1})));
}

TEST_MAIN(sequence_slot(); constant_weights_bound(); per_batch_ratio(); rows_are_slices();
          schedules(); rows_until(); source_streams(); splits(); resume_across_breakpoint())
