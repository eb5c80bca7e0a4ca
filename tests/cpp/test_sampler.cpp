// The permutation is a bijection; rank shares and batch counts follow the contract.
#include <algorithm>
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

static void rank_shares() {
  const int64_t n = 103;
  for (bool drop : {false, true}) {
    std::multiset<int64_t> all;
    for (int64_t r = 0; r < 4; ++r) {
      Sampler s(n, {8, true, 7, drop, r, 4});
      CHECK_EQ(s.num_samples(), drop ? 25 : 26);
      CHECK_EQ(s.num_batches(), drop ? 3 : 4);
      auto e = s.epoch(3);
      for (int64_t k = 0; k < s.num_batches(); ++k)
        for (int64_t p = 0; p < s.batch_length(k); ++p) all.insert(e.index(k, p));
    }
    std::set<int64_t> uniq(all.begin(), all.end());
    if (!drop) {
      CHECK_EQ(uniq.size(), 103u);  // everything covered
      CHECK_EQ(all.size(), 104u);   // one wrapped sample of padding
    } else {
      CHECK_EQ(all.size(), uniq.size());  // disjoint
    }
  }
  CHECK_THROWS(UsageError, Sampler(10, {0, false, 0, false, 0, 1}));
  CHECK_THROWS(UsageError, Sampler(10, {1, false, 0, false, 2, 2}));
  Sampler seq(10, {3, false, 0, false, 0, 1});
  auto e = seq.epoch(0);
  CHECK_EQ(e.index(3, 0), 9);
  CHECK_EQ(seq.batch_length(3), 1);
}

TEST_MAIN(permutation_is_bijective(); rank_shares())
