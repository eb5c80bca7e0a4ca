// The permutation is a bijection; rank shares and batch counts follow the contract.
#include <algorithm>
#include <climits>
#include <set>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "sampler/sampler.h"

using namespace stoker;

static void permutation_is_bijective() {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 1000ull, 4097ull, 65536ull}) {
    Permutation p(n, 42);
    std::vector<char> seen(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t v = p(i);
      CHECK(v < n);
      CHECK(!seen[v]);
      seen[v] = 1;
    }
  }
  // Different keys give different orders; the same key the same order.
  Permutation a(1000, 1), b(1000, 2), c(1000, 1);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    CHECK_EQ(a(i), c(i));
  }
  CHECK(same < 20);
}

SamplerOptions opts(int64_t batch, bool shuffle, uint64_t seed, bool drop_last) {
  SamplerOptions o;
  o.batch_size = batch;
  o.shuffle = shuffle;
  o.seed = seed;
  o.drop_last = drop_last;
  return o;
}

static void rank_shares() {
  const int64_t n = 103;
  for (bool drop : {false, true}) {
    std::multiset<int64_t> all;
    for (int64_t r = 0; r < 4; ++r) {
      EpochOrder e(n, opts(8, true, 7, drop), 3, r, 4, 0);
      CHECK_EQ(e.num_samples(), drop ? 25 : 26);
      CHECK_EQ(e.num_batches(), drop ? 3 : 4);
      for (int64_t k = 0; k < e.num_batches(); ++k)
        for (int64_t p = 0; p < e.batch_length(k); ++p) all.insert(e.index(k, p));
    }
    std::set<int64_t> uniq(all.begin(), all.end());
    if (!drop) {
      CHECK_EQ(uniq.size(), 103u);  // everything covered
      CHECK_EQ(all.size(), 104u);   // one wrapped sample of padding
    } else {
      CHECK_EQ(all.size(), uniq.size());  // disjoint
    }
  }
  CHECK_THROWS(UsageError, EpochOrder(10, opts(0, false, 0, false), 0, 0, 1, 0));
  CHECK_THROWS(UsageError, EpochOrder(10, opts(1, false, 0, false), 0, 2, 2, 0));
  CHECK_THROWS(UsageError, EpochOrder(10, opts(1, false, 0, false), 0, 0, 0, 0));
  CHECK_THROWS(UsageError, EpochOrder(10, opts(1, false, 0, false), 0, 0, 1, 11));
  CHECK_THROWS(UsageError, EpochOrder(10, opts(1, false, 0, false), 0, 0, 1, -1));
  EpochOrder seq(10, opts(3, false, 0, false), 0, 0, 1, 0);
  CHECK_EQ(seq.index(3, 0), 9);
  CHECK_EQ(seq.batch_length(3), 1);
}

// A resumed epoch: the ranks of any world size take the rest of the one
// global order, from the offset, padded by wrapping to its start.
static void resume_offsets() {
  const int64_t n = 101;
  const SamplerOptions o = opts(4, true, 5, false);
  EpochOrder whole(n, opts(n, true, 5, false), 2, 0, 1, 0);
  std::vector<int64_t> order;
  for (int64_t p = 0; p < n; ++p) order.push_back(whole.index(0, p));
  CHECK_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 101u);
  for (int64_t w : {1, 2, 3, 7})
    for (int64_t off : {0, 40, 100, 101}) {
      std::multiset<int64_t> got;
      int64_t batches = -1;
      for (int64_t r = 0; r < w; ++r) {
        EpochOrder e(n, o, 2, r, w, off);
        if (batches < 0) batches = e.num_batches();
        CHECK_EQ(e.num_batches(), batches);  // ranks agree
        for (int64_t k = 0; k < e.num_batches(); ++k)
          for (int64_t p = 0; p < e.batch_length(k); ++p) got.insert(e.index(k, p));
        // Rank r's sample j is global position off + r + j * w (mod n).
        if (e.num_samples() > 0) CHECK_EQ(e.index(0, 0), order[static_cast<size_t>((off + r) % n)]);
        CHECK_EQ(e.consumed_after(0), off);
        CHECK_EQ(e.consumed_after(e.num_batches()), n);
      }
      const int64_t left = n - off, share = (left + w - 1) / w;
      std::multiset<int64_t> want(order.begin() + off, order.end());
      for (int64_t q = 0; q < share * w - left; ++q) want.insert(order[static_cast<size_t>(q)]);
      CHECK(got == want);
    }
  // consumed_after counts every rank's batches: 3 batches of 4 on 2 ranks.
  CHECK_EQ(EpochOrder(n, o, 0, 1, 2, 10).consumed_after(3), 10 + 24);
}

// Sizes near 2^63 neither overflow nor make an empty epoch.
static void huge_arguments() {
  const int64_t big = INT64_MAX;
  EpochOrder one(10, opts(big, true, 1, false), 0, 0, 1, 0);
  CHECK_EQ(one.num_batches(), 1);
  CHECK_EQ(one.batch_length(0), 10);
  CHECK_EQ(EpochOrder(10, opts(big, false, 1, true), 0, 0, 1, 0).num_batches(), 0);
  EpochOrder wide(10, opts(2, false, 1, false), 0, big - 1, big, 0);
  CHECK_EQ(wide.num_samples(), 1);
  CHECK_EQ(wide.num_batches(), 1);
  CHECK(wide.index(0, 0) >= 0 && wide.index(0, 0) < 10);
  CHECK_EQ(wide.consumed_after(1), 10);
}

// Many images at once (Permutation::map, EpochOrder::batch_indices) are the one-at-a-time
// ones, for every count around the lane width, in place or not, padding and ranks included.
static void batched_images_match() {
  for (uint64_t n : {1ull, 2ull, 7ull, 8ull, 9ull, 17ull, 1000ull, 20000ull}) {
    Permutation p(n, 7);
    for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63},
                       static_cast<size_t>(n)}) {
      if (len > n) continue;
      std::vector<uint64_t> in(len), out(len);
      for (size_t j = 0; j < len; ++j) in[j] = (j * 7919) % n;
      p.map(in.data(), out.data(), len);
      for (size_t j = 0; j < len; ++j) CHECK_EQ(out[j], p(in[j]));
      std::vector<uint64_t> same = in;
      p.map(same.data(), same.data(), len);
      CHECK(same == out);
    }
  }
  for (bool shuffle : {false, true})
    for (int64_t w : {1, 3}) {
      const int64_t n = 103;
      EpochOrder e(n, opts(10, shuffle, 5, false), 2, w - 1, w, 4, 1);
      for (int64_t k = 0; k < e.num_batches(); ++k) {
        std::vector<int64_t> got(static_cast<size_t>(e.batch_length(k)));
        e.batch_indices(k, got.data());
        for (int64_t pos = 0; pos < e.batch_length(k); ++pos)
          CHECK_EQ(got[static_cast<size_t>(pos)], e.index(k, pos));
      }
    }
}

TEST_MAIN(permutation_is_bijective(); rank_shares(); resume_offsets(); huge_arguments();
          batched_images_match())
