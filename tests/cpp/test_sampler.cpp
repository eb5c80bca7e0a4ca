// The permutation is a bijection; rank shares and batch counts follow the contract;
// the shard-window order is the one NOTE [ Shard windows ] defines.
#include <algorithm>
#include <climits>
#include <map>
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

SamplerOptions opts(int64_t batch, bool shuffle, uint64_t seed, bool drop_last,
                    int64_t shard_window = 0) {
  SamplerOptions o;
  o.batch_size = batch;
  o.shuffle = shuffle;
  o.seed = seed;
  o.drop_last = drop_last;
  o.shard_window = shard_window;
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

// ---- the shard-window order ------------------------------------------------

using Layout = std::vector<int64_t>;  // records of each shard

// Layouts with empty shards (first, last, a run of them, a window of only empty
// ones), one shard, shards of one record, and sizes that leave uneven windows.
const std::vector<Layout> kLayouts = {
    {10, 0, 7, 3, 0, 12, 5, 1, 9},
    {0, 0, 5, 0},
    {37},
    {1, 1, 1, 1, 1, 1, 1},
    {0, 4, 0, 0, 0, 0, 6, 2, 0, 11, 3},
    {50, 2, 33, 17, 8, 8, 8, 64, 1, 0, 29, 5, 12},
};
const std::vector<int64_t> kWindows = {1, 2, 3, 4, 1000, INT64_MAX};

int64_t total(const Layout& l) {
  int64_t n = 0;
  for (int64_t r : l) n += r;
  return n;
}

// The shard holding dataset index i.
size_t shard_of(const Layout& l, int64_t i) {
  size_t s = 0;
  int64_t end = l[0];  // of shard s
  while (end <= i) end += l[++s];
  return s;
}

// NOTE [ Shard windows ] stated directly: slots, windows, each window's records
// concatenated and permuted.
struct Reference {
  std::vector<int64_t> order;               // position -> dataset index
  std::vector<int64_t> window_start;        // window -> first position; then n
  std::vector<std::vector<size_t>> shards;  // window -> its shards with records, slot order
};

Reference reference(const Layout& l, int64_t window, uint64_t seed, uint64_t epoch) {
  const uint64_t key = hash_combine(seed, epoch);
  const size_t num = l.size();
  const size_t per = static_cast<size_t>(std::min<int64_t>(window, static_cast<int64_t>(num)));
  std::vector<int64_t> first(num);
  for (size_t s = 1; s < num; ++s) first[s] = first[s - 1] + l[s - 1];
  const Permutation slots(num, shard_window_keys::shard_order(key));
  Reference ref;
  for (size_t w = 0; w * per < num; ++w) {
    std::vector<int64_t> samples;
    std::vector<size_t> shards;
    for (size_t j = w * per; j < std::min(num, (w + 1) * per); ++j) {
      const size_t s = static_cast<size_t>(slots(j));
      if (l[s] > 0) shards.push_back(s);
      for (int64_t r = 0; r < l[s]; ++r) samples.push_back(first[s] + r);
    }
    const Permutation mix(samples.size(), shard_window_keys::window(key, w));
    ref.window_start.push_back(static_cast<int64_t>(ref.order.size()));
    for (size_t p = 0; p < samples.size(); ++p) ref.order.push_back(samples[mix(p)]);
    ref.shards.push_back(shards);
  }
  ref.window_start.push_back(static_cast<int64_t>(ref.order.size()));
  return ref;
}

// The whole epoch on one rank, in one batch.
std::vector<int64_t> epoch_order(const Layout& l, const SamplerOptions& o, uint64_t epoch) {
  SamplerOptions whole = o;
  whole.batch_size = std::max<int64_t>(1, total(l));
  EpochOrder e(l, whole, epoch, 0, 1, 0);
  std::vector<int64_t> out;
  for (int64_t k = 0; k < e.num_batches(); ++k)
    for (int64_t p = 0; p < e.batch_length(k); ++p) out.push_back(e.index(k, p));
  return out;
}

// Every layout and window: a permutation of [0, n), exactly the reference order.
static void shard_window_is_a_permutation() {
  for (const Layout& l : kLayouts)
    for (int64_t window : kWindows) {
      const int64_t n = total(l);
      const std::vector<int64_t> got = epoch_order(l, opts(1, true, 11, false, window), 4);
      CHECK_EQ(got.size(), static_cast<size_t>(n));
      std::vector<int64_t> sorted = got;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(sorted[static_cast<size_t>(i)], i);
      CHECK(got == reference(l, window, 11, 4).order);
    }
  // No shards, or no records: an empty epoch.
  CHECK_EQ(EpochOrder(Layout{}, opts(4, true, 1, false, 2), 0, 0, 1, 0).num_batches(), 0);
  CHECK_EQ(EpochOrder(Layout{0, 0}, opts(4, true, 1, false, 2), 0, 0, 1, 0).num_batches(), 0);
}

// Samples come window by window: the shards read in a window's span are exactly
// its shards, and, whatever the keys, no more than N shards are in use at once
// (a shard is in use from its first sample to its last).
static void shard_window_reads_windows() {
  for (const Layout& l : kLayouts)
    for (int64_t window : kWindows) {
      const std::vector<int64_t> order = epoch_order(l, opts(1, true, 3, false, window), 9);
      const Reference ref = reference(l, window, 3, 9);
      for (size_t w = 0; w + 1 < ref.window_start.size(); ++w) {
        std::set<size_t> seen;
        for (int64_t q = ref.window_start[w]; q < ref.window_start[w + 1]; ++q)
          seen.insert(shard_of(l, order[static_cast<size_t>(q)]));
        CHECK(seen == std::set<size_t>(ref.shards[w].begin(), ref.shards[w].end()));
        CHECK(ref.shards[w].size() <= static_cast<size_t>(window));
      }
      std::map<size_t, std::pair<size_t, size_t>> span;  // shard -> first, last position
      for (size_t q = 0; q < order.size(); ++q) {
        auto [it, fresh] = span.emplace(shard_of(l, order[q]), std::make_pair(q, q));
        if (!fresh) it->second.second = q;
      }
      for (size_t q = 0; q < order.size(); ++q) {
        int64_t open = 0;
        for (const auto& [s, fl] : span) open += fl.first <= q && q <= fl.second;
        CHECK(open <= window);
      }
    }
}

// The same (seed, epoch) gives the same order; another seed, epoch or window
// another; and it is not the global shuffle's.
static void shard_window_keys_differ() {
  const Layout l = kLayouts.back();
  const auto a = epoch_order(l, opts(1, true, 5, false, 3), 2);
  CHECK(a == epoch_order(l, opts(1, true, 5, false, 3), 2));
  CHECK(a != epoch_order(l, opts(1, true, 6, false, 3), 2));
  CHECK(a != epoch_order(l, opts(1, true, 5, false, 3), 3));
  CHECK(a != epoch_order(l, opts(1, true, 5, false, 4), 2));
  CHECK(a != epoch_order(l, opts(1, true, 5, false, 0), 2));
  // One window over every shard is still a full shuffle of the epoch, keyed differently.
  const auto all = epoch_order(l, opts(1, true, 5, false, 1000), 2);
  CHECK(all != epoch_order(l, opts(1, true, 5, false, 0), 2));
  CHECK(all == epoch_order(l, opts(1, true, 5, false, static_cast<int64_t>(l.size())), 2));
  // The global shuffle is the permutation of the whole epoch, whatever the shards.
  CHECK(epoch_order(l, opts(1, true, 5, false, 0), 2) ==
        epoch_order(Layout{total(l)}, opts(1, true, 5, false, 0), 2));
  CHECK_THROWS(UsageError, EpochOrder(l, opts(1, false, 5, false, 3), 0, 0, 1, 0));
  CHECK_THROWS(UsageError, EpochOrder(l, opts(1, true, 5, false, -1), 0, 0, 1, 0));
  CHECK_THROWS(UsageError, EpochOrder(Layout{3, -1}, opts(1, true, 5, false, 1), 0, 0, 1, 0));
}

// Ranks of every world size take positions offset + r, offset + r + w, ... of
// the one order: together the rest of the epoch once (plus DistributedSampler's
// padding from pad_from, or disjoint with drop_last or without even_batches),
// batch_indices as index() one by one, and a resume is the tail.
static void shard_window_ranks_and_resume() {
  for (const Layout& l : {kLayouts[0], kLayouts[5]})
    for (int64_t window : {1, 3}) {
      const int64_t n = total(l);
      const std::vector<int64_t> order = reference(l, window, 8, 1).order;
      for (int mode = 0; mode < 3; ++mode)  // padding, drop_last, no even_batches
        for (int64_t w = 1; w <= 5; ++w)
          for (int64_t off : {int64_t{0}, int64_t{7}, n / 2, n - 1, n}) {
            const int64_t pad_from = off / 3;
            SamplerOptions o = opts(4, true, 8, mode == 1, window);
            o.even_batches = mode != 2;
            std::multiset<int64_t> got;
            int64_t batches = -1;
            for (int64_t r = 0; r < w; ++r) {
              EpochOrder e(l, o, 1, r, w, off, pad_from);
              if (batches < 0) batches = e.num_batches();
              CHECK_EQ(e.num_batches(), batches);
              for (int64_t k = 0; k < e.num_batches(); ++k) {
                std::vector<int64_t> idx(static_cast<size_t>(e.batch_length(k)));
                e.batch_indices(k, idx.data());
                for (int64_t p = 0; p < e.batch_length(k); ++p) {
                  CHECK_EQ(idx[static_cast<size_t>(p)], e.index(k, p));
                  // Rank r's sample j is global position off + r + j * w.
                  const int64_t q = off + r + (k * 4 + p) * w;
                  if (q < n) CHECK_EQ(e.index(k, p), order[static_cast<size_t>(q)]);
                  got.insert(e.index(k, p));
                }
              }
            }
            const int64_t left = n - off;
            std::multiset<int64_t> want;
            if (mode == 0) {
              want.insert(order.begin() + off, order.end());
              const int64_t share = (left + w - 1) / w;
              for (int64_t q = 0; q < share * w - left; ++q)
                want.insert(order[static_cast<size_t>(pad_from + q % (n - pad_from))]);
            } else if (mode == 1) {
              const int64_t keep = (left / w) / 4 * 4 * w;
              want.insert(order.begin() + off, order.begin() + off + keep);
            } else {
              want.insert(order.begin() + off, order.end());
            }
            CHECK(got == want);
          }
    }
}

// shard_schedule: the shards that the rest of the epoch reads, window by
// window; all of them for a global shuffle; in dataset order without shuffle.
static void shard_schedules() {
  for (const Layout& l : kLayouts)
    for (int64_t window : kWindows) {
      const int64_t n = total(l);
      const Reference ref = reference(l, window, 2, 6);
      EpochOrder e(l, opts(4, true, 2, false, window), 6, 0, 1, 0);
      for (int64_t from : {int64_t{0}, n / 3, n / 2, n - 1, n}) {
        std::vector<size_t> want;
        for (size_t w = 0; w + 1 < ref.window_start.size(); ++w)
          if (ref.window_start[w + 1] > from)
            want.insert(want.end(), ref.shards[w].begin(), ref.shards[w].end());
        CHECK(e.shard_schedule(from, SIZE_MAX) == want);
        // Every shard that the rest of the epoch reads is named.
        const std::vector<size_t> got = e.shard_schedule(from, SIZE_MAX);
        for (int64_t q = from; q < n; ++q) {
          const size_t s = shard_of(l, ref.order[static_cast<size_t>(q)]);
          CHECK(std::find(got.begin(), got.end(), s) != got.end());
        }
        for (size_t cut : {size_t{0}, size_t{1}, size_t{2}})
          CHECK(e.shard_schedule(from, cut) ==
                std::vector<size_t>(want.begin(), want.begin() + std::min(cut, want.size())));
      }
      CHECK_THROWS(UsageError, e.shard_schedule(-1, 4));
      CHECK_THROWS(UsageError, e.shard_schedule(n + 1, 4));
    }
  const Layout l = kLayouts[0];  // {10, 0, 7, 3, 0, 12, 5, 1, 9}: 47 records
  // Without shuffle: dataset order from the position's shard.
  EpochOrder seq(l, opts(4, false, 0, false), 0, 0, 1, 0);
  CHECK(seq.shard_schedule(0, SIZE_MAX) == (std::vector<size_t>{0, 2, 3, 5, 6, 7, 8}));
  CHECK(seq.shard_schedule(10, SIZE_MAX) == (std::vector<size_t>{2, 3, 5, 6, 7, 8}));
  CHECK(seq.shard_schedule(21, 2) == (std::vector<size_t>{5, 6}));
  CHECK(seq.shard_schedule(47, SIZE_MAX).empty());
  // A global shuffle: every shard with records.
  EpochOrder global(l, opts(4, true, 0, false), 0, 0, 1, 0);
  CHECK(global.shard_schedule(30, SIZE_MAX) == (std::vector<size_t>{0, 2, 3, 5, 6, 7, 8}));
  // drop_last leaves positions 32.. unread (2 batches of 8 on 2 ranks).
  EpochOrder dropped(l, opts(8, false, 0, true), 0, 0, 2, 0);
  CHECK(dropped.shard_schedule(0, SIZE_MAX) == (std::vector<size_t>{0, 2, 3, 5}));
  // Padding: the 27 positions from 20 on 4 ranks are 28 reads, the last wrapping
  // to pad_from = 12 (shard 2), named again at the end; alone when only it is left.
  EpochOrder padded(l, opts(4, false, 0, false), 0, 1, 4, 20, 12);
  CHECK(padded.shard_schedule(20, SIZE_MAX) == (std::vector<size_t>{5, 6, 7, 8, 2}));
  CHECK(padded.shard_schedule(47, SIZE_MAX) == (std::vector<size_t>{2}));
  EpochOrder padded_global(l, opts(4, true, 0, false), 0, 1, 4, 20, 12);
  CHECK(padded_global.shard_schedule(20, SIZE_MAX) == (std::vector<size_t>{0, 2, 3, 5, 6, 7, 8}));
  // With shard windows the padding sample's shard comes after the last window.
  EpochOrder padded_windows(l, opts(4, true, 0, false, 2), 0, 1, 4, 20, 12);
  const Reference ref = reference(l, 2, 0, 0);
  std::vector<size_t> want;
  for (size_t w = 0; w + 1 < ref.window_start.size(); ++w)
    if (ref.window_start[w + 1] > 20)
      want.insert(want.end(), ref.shards[w].begin(), ref.shards[w].end());
  want.push_back(shard_of(l, ref.order[12]));
  CHECK(padded_windows.shard_schedule(20, SIZE_MAX) == want);
}

// A user sampler's order (sampler/listed_order.h): its batches as listed, from a batch
// boundary, whatever rank and world size the order is asked for.
static void listed_orders() {
  auto lists = std::make_shared<ListedOrders>();
  CHECK_THROWS(UsageError, lists->get(0));  // not listed yet
  lists->set_hint(3, 9);
  CHECK_EQ(lists->num_batches(), 3);
  // batches of 3, 1 and 4 indices (a bucketing batch sampler), repeats allowed
  lists->set(0, {5, 2, 7, 0, 9, 9, 1, 3}, {3, 4, 8}, 10);
  CHECK_EQ(lists->num_batches(), 3);
  CHECK_EQ(lists->num_samples(), 8);
  SamplerOptions o = opts(100, true, 7, true);  // batch_size, shuffle, drop_last: the sampler's
  o.listed = lists;
  const std::vector<int64_t> shards{4, 6};  // indices 0-3, then 4-9
  for (int64_t world : {1, 3}) {
    EpochOrder e(shards, o, 0, world - 1, world, 0);
    CHECK_EQ(e.num_batches(), 3);
    CHECK_EQ(e.batch_length(0), 3);
    CHECK_EQ(e.batch_length(1), 1);
    CHECK_EQ(e.batch_length(2), 4);
    std::vector<int64_t> b(4);
    e.batch_indices(2, b.data());
    CHECK((b == std::vector<int64_t>{9, 9, 1, 3}));
    CHECK_EQ(e.index(0, 2), 7);
    CHECK_EQ(e.consumed_after(0), 0);
    CHECK_EQ(e.consumed_after(2), 4);
    CHECK_EQ(e.consumed_after(9), 8);
    CHECK((e.shard_schedule(0, SIZE_MAX) == std::vector<size_t>{1, 0}));
  }
  // resumed after the first batch: the rest, numbered from 0
  EpochOrder rest(shards, o, 0, 0, 1, 3);
  CHECK_EQ(rest.num_batches(), 2);
  CHECK_EQ(rest.index(0, 0), 0);
  CHECK_EQ(rest.consumed_after(1), 4);
  CHECK_THROWS(UsageError, EpochOrder(shards, o, 0, 0, 1, 2));  // not a batch boundary
  CHECK_THROWS(UsageError, EpochOrder(shards, o, 1, 0, 1, 0));  // epoch 1 not listed
  // what the sampler gives is checked: an index outside the dataset, an empty batch
  CHECK_THROWS(UsageError, lists->set(1, {0, 10}, {2}, 10));
  CHECK_THROWS(UsageError, lists->set(1, {0, 1}, {0, 2}, 10));
  CHECK_THROWS(UsageError, lists->set(1, {0, 1}, {1}, 10));
}

// Listed permutations (shuffle with a torch.Generator: RandomSampler's order): they stand
// in for the (seed, epoch) permutation only; batches, the rank split, padding, resume
// offsets and counts are the loader's own, counted before any epoch is listed.
static void listed_permutations() {
  auto lists = std::make_shared<ListedOrders>(true);
  CHECK(lists->permutations());
  CHECK_THROWS(UsageError, lists->set(0, {0, 1}, {2}, 10));  // batches: not this kind
  SamplerOptions o = opts(2, true, 7, false);
  o.listed = lists;
  const std::vector<int64_t> shards{4, 3};
  // counts need no listing
  CHECK_EQ(EpochOrder(7, counting_options(o), 0, 1, 2, 0).num_batches(), 2);
  CHECK_THROWS(UsageError, EpochOrder(shards, o, 0, 0, 1, 0));  // epoch 0 not listed yet
  const std::vector<int64_t> perm{6, 2, 0, 5, 1, 3, 4};
  lists->set_permutation(0, perm, 7);
  // one rank: the permutation in batches of 2
  EpochOrder whole(shards, o, 0, 0, 1, 0);
  CHECK_EQ(whole.num_batches(), 4);
  for (int64_t q = 0; q < 7; ++q) CHECK_EQ(whole.index(q / 2, q % 2), perm[q]);
  // two ranks: positions r, r + 2, ..., wrapped around to pad the last
  for (int64_t r = 0; r < 2; ++r) {
    EpochOrder e(shards, o, 0, r, 2, 0);
    CHECK_EQ(e.num_samples(), 4);
    std::vector<int64_t> b(2);
    e.batch_indices(1, b.data());
    CHECK_EQ(b[0], perm[4 + r]);
    CHECK_EQ(b[1], perm[(6 + r) % 7]);
  }
  // resumed after 3 samples consumed: the rest of the same permutation
  EpochOrder rest(shards, o, 0, 0, 1, 3);
  CHECK_EQ(rest.index(0, 0), perm[3]);
  CHECK_EQ(rest.consumed_after(1), 5);
  CHECK((whole.shard_schedule(0, SIZE_MAX) == std::vector<size_t>{0, 1}));
  // a permutation it is: every index once, each in range
  CHECK_THROWS(UsageError, lists->set_permutation(1, {0, 1, 2}, 7));
  CHECK_THROWS(UsageError, lists->set_permutation(1, {0, 0, 1, 2, 3, 4, 5}, 7));
  CHECK_THROWS(UsageError, lists->set_permutation(1, {0, 1, 2, 3, 4, 5, 7}, 7));
}

TEST_MAIN(permutation_is_bijective(); rank_shares(); resume_offsets(); huge_arguments();
          batched_images_match(); shard_window_is_a_permutation(); shard_window_reads_windows();
          shard_window_keys_differ(); shard_window_ranks_and_resume(); shard_schedules();
          listed_orders(); listed_permutations())
