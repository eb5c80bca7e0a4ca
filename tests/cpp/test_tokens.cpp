// Token sources (flat files, Megatron .bin/.idx, record fields), the widening
// copy, packing and budget plans, and the token producer: every batch is
// checked against a direct computation, for any unit order and thread count,
// and resuming at any batch gives the rest of the epoch unchanged.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "check.h"
#include "codecs/token_copy.h"
#include "common/error.h"
#include "format/field_lengths.h"
#include "format/megatron_index.h"
#include "format/record_tokens.h"
#include "format/token_file.h"
#include "producers/token_producer.h"
#include "sampler/epoch_split.h"
#include "sampler/pack_plan.h"
#include "sampler/token_budget.h"
#include "test_util.h"

using namespace stoker;

namespace {

template <typename T>
void write_file(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
}

void write_bytes(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

/// A Megatron index for uint16 sequences of the given lengths.
std::string megatron_idx(const std::vector<int32_t>& lengths, int dtype_code = 8, int item = 2) {
  std::string s("MMIDIDX\0\0", 9);
  put<uint64_t>(s, 1);
  put<uint8_t>(s, static_cast<uint8_t>(dtype_code));
  put<uint64_t>(s, lengths.size());
  put<uint64_t>(s, lengths.size() + 1);
  for (int32_t n : lengths) put<int32_t>(s, n);
  int64_t p = 0;
  for (int32_t n : lengths) {
    put<int64_t>(s, p);
    p += int64_t{n} * item;
  }
  for (size_t i = 0; i <= lengths.size(); ++i) put<int64_t>(s, static_cast<int64_t>(i));
  return s;
}

/// All tokens of a source, document by document.
std::vector<std::vector<int64_t>> all_docs(const TokenSource& src) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t d = 0; d < src.num_docs(); ++d) {
    TokenSpan s = src.doc(d);
    std::vector<int64_t> v;
    for (int64_t i = 0; i < s.length; ++i) v.push_back(token_at(s.data, src.dtype(), i));
    out.push_back(v);
  }
  return out;
}

/// Runs every unit of a planned batch, in a scrambled order over `threads` threads.
std::vector<uint8_t> run_batch(BatchWork& w, int threads, uint32_t scramble) {
  std::vector<uint8_t> buf(w.bytes + 64, 0xA5);  // poison: every byte must be written
  std::vector<int> order(static_cast<size_t>(w.units));
  for (int u = 0; u < w.units; ++u) order[static_cast<size_t>(u)] = u;
  std::shuffle(order.begin(), order.end(), std::mt19937(scramble));
  std::atomic<size_t> next{0};
  auto loop = [&] {
    WorkerContext ctx;
    for (size_t i; (i = next.fetch_add(1)) < order.size();) w.run(order[i], buf.data(), ctx);
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < threads; ++t) ts.emplace_back(loop);
  loop();
  for (auto& t : ts) t.join();
  buf.resize(w.bytes);
  return buf;
}

const TensorDesc& tensor(const BatchWork& w, const std::string& name) {
  for (const auto& t : w.tensors)
    if (t.name == name) return t;
  std::fprintf(stderr, "no tensor %s\n", name.c_str());
  std::exit(1);
}

int64_t value(const std::vector<uint8_t>& buf, const TensorDesc& t, int64_t i) {
  const uint8_t* p = buf.data() + t.offset;
  switch (t.dtype) {
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::kBool:
      return p[i];
    default:
      std::abort();
  }
}

}  // namespace

static void flat_files() {
  std::string dir = test::temp_dir();
  std::vector<uint16_t> a = {5, 1, 2, 0, 7, 8, 0, 9}, b = {3, 0, 4};
  write_file(dir + "/a.bin", a);
  write_file(dir + "/b.bin", b);
  auto whole = open_token_files({dir + "/a.bin", dir + "/b.bin"}, DType::kUInt16);
  CHECK_EQ(whole->num_docs(), 2);
  CHECK_EQ(whole->num_tokens(), 11);
  CHECK_EQ(whole->doc_of(8), 1);
  auto split = open_token_files({dir + "/a.bin", dir + "/b.bin"}, DType::kUInt16, 0);
  auto docs = all_docs(*split);
  std::vector<std::vector<int64_t>> want = {{5, 1, 2, 0}, {7, 8, 0}, {9}, {3, 0}, {4}};
  CHECK(docs == want);
  CHECK(split->where(3).find("b.bin: document 0") != std::string::npos);
  // bad input
  write_file(dir + "/empty.bin", std::vector<uint16_t>{});
  CHECK_THROWS(DataError, open_token_files({dir + "/empty.bin"}, DType::kUInt16));
  write_bytes(dir + "/odd.bin", std::string(7, '\1'));
  CHECK_THROWS(DataError, open_token_files({dir + "/odd.bin"}, DType::kUInt16));
  CHECK_THROWS(DataError, open_token_files({dir + "/missing.bin"}, DType::kUInt16));
  CHECK_THROWS(UsageError, open_token_files({dir + "/a.bin"}, DType::kUInt16, 70000));
  CHECK_THROWS(UsageError, open_token_files({dir + "/a.bin"}, DType::kFloat32));
}

static void megatron() {
  std::string dir = test::temp_dir();
  std::vector<int32_t> lengths = {3, 0, 2, 4};
  std::vector<uint16_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  write_bytes(dir + "/ds.idx", megatron_idx(lengths));
  write_file(dir + "/ds.bin", tokens);
  auto src = open_megatron({dir + "/ds"});
  auto docs = all_docs(*src);
  std::vector<std::vector<int64_t>> want = {{1, 2, 3}, {}, {4, 5}, {6, 7, 8, 9}};
  CHECK(docs == want);
  CHECK_EQ(src->doc_of(3), 2);  // the empty document is never the holder
  // a .bin that does not match its .idx
  write_file(dir + "/short.bin", std::vector<uint16_t>{1, 2, 3});
  write_bytes(dir + "/short.idx", megatron_idx(lengths));
  CHECK_THROWS(DataError, open_megatron({dir + "/short"}));
  // a corrupt / truncated index
  std::string idx = megatron_idx(lengths);
  write_file(dir + "/t.bin", tokens);
  write_bytes(dir + "/t.idx", idx.substr(0, idx.size() - 5));
  CHECK_THROWS(DataError, open_megatron({dir + "/t"}));
  std::string bad = idx;
  bad[0] = 'X';
  write_bytes(dir + "/t.idx", bad);
  CHECK_THROWS(DataError, open_megatron({dir + "/t"}));
  bad = idx;
  bad[9 + 8 + 1 + 8 + 8 + 4 * 4 + 8] = 9;  // second pointer no longer back to back
  write_bytes(dir + "/t.idx", bad);
  CHECK_THROWS(DataError, open_megatron({dir + "/t"}));
  write_bytes(dir + "/t.idx", megatron_idx(lengths, 7, 4));  // float32 tokens
  CHECK_THROWS(DataError, open_megatron({dir + "/t"}));
  bad = idx;
  bad[17 + 8] = static_cast<char>(0xFF);  // absurd sequence count
  write_bytes(dir + "/t.idx", bad);
  CHECK_THROWS(DataError, open_megatron({dir + "/t"}));
  // an empty dataset parses (and is refused by the producer, which needs tokens)
  write_bytes(dir + "/e.idx", megatron_idx({}));
  write_file(dir + "/e.bin", std::vector<uint16_t>{});
  auto empty = open_megatron({dir + "/e"});
  CHECK_EQ(empty->num_tokens(), 0);
  TokenOptions o;
  o.seq_len = 4;
  CHECK_THROWS(DataError, TokenProducer(empty, o));
}

static void record_tokens() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 40, 7);  // field "tok": int32[None], length i % 5, 0..n-1
  auto ds = std::make_shared<Dataset>(test::test_schema(), shards);
  RecordTokenSource src(ds, "tok");
  CHECK_EQ(src.num_docs(), 40);
  for (int64_t d = 0; d < 40; ++d) {
    CHECK_EQ(src.doc_length(d), d % 5);
    TokenSpan s = src.doc(d);
    for (int64_t i = 0; i < s.length; ++i) CHECK_EQ(token_at(s.data, DType::kInt32, i), i);
  }
  CHECK_THROWS(UsageError, RecordTokenSource(ds, "label"));
  CHECK_THROWS(UsageError, RecordTokenSource(ds, "nope"));
  // a corrupt record is refused when read, naming shard and record
  {
    std::fstream f(shards[1].path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 12 + 16 + 8 + 2);
    f.put('\x7f');
  }
  auto ds2 = std::make_shared<Dataset>(test::test_schema(), shards);
  RecordTokenSource src2(ds2, "tok");
  bool named = false;
  try {
    src2.doc(7);
  } catch (const DataError& e) {
    named = std::string(e.what()).find("shard-1.stk: record 0") != std::string::npos;
  }
  CHECK(named);
}

static void lengths_with_two_variable_fields() {
  // tokens beside a blob: lengths come from each record's field table
  std::string dir = test::temp_dir();
  Schema schema;
  schema.fields.push_back({"b", FieldKind::kBlob, DType::kUInt8, {}});
  schema.fields.push_back({"t", FieldKind::kNDArray, DType::kUInt16, {-1}});
  schema.hash = 77;
  std::string path = dir + "/s.stk";
  ShardWriter w(path, schema.hash, 2);
  for (uint32_t i = 0; i < 9; ++i) {
    std::string blob(i * 3 % 5, 'x'), toks;
    for (uint16_t t = 0; t < i; ++t) toks.append(reinterpret_cast<const char*>(&t), 2);
    std::string rec;
    for (const std::string* f : {&blob, &toks}) {
      uint32_t n = static_cast<uint32_t>(f->size());
      rec.append(reinterpret_cast<const char*>(&n), 4);
    }
    rec += blob + toks;
    w.append(reinterpret_cast<const uint8_t*>(rec.data()), rec.size());
  }
  ShardSummary sum = w.finish();
  auto ds = std::make_shared<Dataset>(
      schema, std::vector<ShardInfo>{{path, sum.num_records, static_cast<int64_t>(sum.bytes),
                                      std::nullopt, std::nullopt}});
  RecordTokenSource src(ds, "t");
  for (int64_t d = 0; d < 9; ++d) {
    CHECK_EQ(src.doc_length(d), d);
    TokenSpan s = src.doc(d);  // payloads at odd offsets: the copy handles unaligned tokens
    std::vector<int64_t> out(static_cast<size_t>(s.length));
    CHECK_EQ(copy_tokens(s.data, DType::kUInt16, s.length, out.data(), DType::kInt64,
                         token_limit(DType::kInt64, 0)),
             -1);
    for (int64_t i = 0; i < s.length; ++i) CHECK_EQ(out[static_cast<size_t>(i)], i);
  }
  auto blob_rows = variable_field_rows(*ds, 0);
  for (int64_t d = 0; d < 9; ++d) CHECK_EQ(blob_rows[static_cast<size_t>(d)], d * 3 % 5);
}

static void copy_and_limits() {
  std::vector<uint16_t> a = {0, 1, 65535, 7};
  std::vector<int64_t> out(4);
  CHECK_EQ(copy_tokens(a.data(), DType::kUInt16, 4, out.data(), DType::kInt64,
                       token_limit(DType::kInt64, 0)),
           -1);
  CHECK(out == (std::vector<int64_t>{0, 1, 65535, 7}));
  CHECK_EQ(copy_tokens(a.data(), DType::kUInt16, 4, out.data(), DType::kInt64,
                       token_limit(DType::kInt64, 1000)),
           2);
  std::vector<uint32_t> b = {1, 0x80000000u, 3};
  std::vector<int32_t> o32(3);
  CHECK_EQ(copy_tokens(b.data(), DType::kUInt32, 3, o32.data(), DType::kInt32,
                       token_limit(DType::kInt32, 0)),
           1);
  std::vector<int32_t> c = {4, -1};
  CHECK_EQ(copy_tokens(c.data(), DType::kInt32, 2, out.data(), DType::kInt64,
                       token_limit(DType::kInt64, 0)),
           1);
  // unaligned source (records are not padded)
  std::vector<uint8_t> raw(1 + 2 * 3);
  uint16_t v[3] = {10, 20, 30};
  std::memcpy(raw.data() + 1, v, sizeof v);
  CHECK_EQ(copy_tokens(raw.data() + 1, DType::kUInt16, 3, o32.data(), DType::kInt32,
                       token_limit(DType::kInt32, 0)),
           -1);
  CHECK(o32 == (std::vector<int32_t>{10, 20, 30}));
  CHECK_THROWS(UsageError, token_limit(DType::kInt16, 0));
}

static std::vector<int64_t> starts_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> s{0};
  for (int64_t n : lengths) s.push_back(s.back() + n);
  return s;
}

static void pack_plan() {
  std::mt19937 rng(3);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 3000; ++i) lengths.push_back(rng() % 3 == 0 ? rng() % 300 : rng() % 60);
  auto starts = starts_of(lengths);
  auto where = [](int64_t d) { return "doc " + std::to_string(d); };
  for (PackFit fit : {PackFit::kBest, PackFit::kFirst})
    for (int64_t window : {1, 8, 64}) {
      PackOptions o;
      o.seq_len = 128;
      o.fit = fit;
      o.window = window;
      o.shuffle = true;
      o.seed = 11;
      PackPlan p(starts, o, where);
      // every token of every document exactly once; rows never overflow
      std::vector<std::vector<char>> seen(lengths.size());
      for (size_t d = 0; d < lengths.size(); ++d)
        seen[d].assign(static_cast<size_t>(lengths[d]), 0);
      int64_t pad = 0;
      for (int64_t r = 0; r < p.num_rows(); ++r) {
        int64_t used = 0;
        for (int64_t i = 0; i < p.row_num_pieces(r); ++i) {
          const PackPiece& pc = p.row_pieces(r)[i];
          CHECK(pc.length >= 1 && pc.length <= 128);
          for (int64_t t = pc.offset; t < pc.offset + pc.length; ++t) {
            CHECK(!seen[pc.doc][t]);
            seen[pc.doc][t] = 1;
          }
          used += pc.length;
        }
        CHECK(used <= 128 && used == p.row_tokens(r));
        pad += 128 - used;
      }
      for (auto& s : seen)
        for (char c : s) CHECK(c);
      CHECK_EQ(pad, p.pad_tokens());
      // a larger window packs at least about as tightly
      if (window == 64) CHECK(static_cast<double>(pad) / (p.num_rows() * 128) < 0.05);
      PackPlan again(starts, o, where);
      CHECK_EQ(again.num_rows(), p.num_rows());
      for (int64_t r = 0; r < p.num_rows(); ++r) CHECK_EQ(again.row_tokens(r), p.row_tokens(r));
    }
  // overlong documents: refused (naming the document) or truncated
  std::vector<int64_t> s2 = starts_of({10, 300, 5});
  PackOptions o;
  o.seq_len = 128;
  o.overlong = Overlong::kError;
  bool named = false;
  try {
    PackPlan p(s2, o, where);
  } catch (const DataError& e) {
    named = std::string(e.what()).find("doc 1") != std::string::npos;
  }
  CHECK(named);
  o.overlong = Overlong::kTruncate;
  PackPlan t(s2, o, where);
  CHECK_EQ(t.dropped_tokens(), 300 - 128);
  o.overlong = Overlong::kSplit;
  PackPlan sp(s2, o, where);
  CHECK_EQ(sp.dropped_tokens(), 0);
  CHECK_EQ(sp.num_rows(), 3);  // 128 | 128 | 44 + 10 + 5
}

static void budget_plan() {
  std::mt19937 rng(5);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 2000; ++i) lengths.push_back(rng() % 500);
  auto starts = starts_of(lengths);
  auto where = [](int64_t d) { return "doc " + std::to_string(d); };
  BudgetOptions o;
  o.max_tokens = 4096;
  o.multiple = 8;
  o.shuffle = true;
  o.seed = 2;
  BudgetPlan p(starts, o, where);
  for (uint64_t epoch : {0u, 1u}) {
    std::vector<int> seen(lengths.size(), 0);
    for (int64_t b = 0; b < p.num_batches(); ++b) {
      const auto& bb = p.batch(b);
      CHECK((bb.end - bb.begin) * bb.width <= 4096);
      CHECK_EQ(bb.width % 8, 0);
      for (int64_t i = bb.begin; i < bb.end; ++i) {
        int64_t d = p.doc_at(epoch, i);
        CHECK(lengths[d] <= bb.width);
        seen[d]++;
      }
    }
    for (size_t d = 0; d < lengths.size(); ++d) CHECK_EQ(seen[d], lengths[d] > 0 ? 1 : 0);
  }
  o.max_tokens = 100;
  CHECK_THROWS(DataError, BudgetPlan(starts, o, where));
  o.max_length = 96;
  BudgetPlan cut(starts, o, where);
  CHECK(cut.dropped_tokens() > 0);
}

static void split_and_resume() {
  // The rank split: ranks partition each segment, and a segment resumed at
  // any batch boundary (any world size) continues the same global order.
  for (bool drop : {false, true})
    for (int64_t n : {0, 1, 7, 100, 101}) {
      std::multiset<int64_t> all;
      for (int64_t r = 0; r < 3; ++r) {
        EpochSplit s(n, 0, r, 3, 4, drop);
        for (int64_t k = 0; k < s.batches; ++k)
          for (int64_t j = 0; j < s.batch_length(k); ++j) all.insert(s.global(k, j));
      }
      if (!drop)
        for (int64_t i = 0; i < n; ++i) CHECK(all.count(i) >= 1);
      else
        CHECK_EQ(static_cast<int64_t>(all.size()), n / 3 / 4 * 4 * 3);
    }
  // Without even: every position exactly once, every rank the padded count of
  // batches (the last ones short or empty), and the same consumption.
  for (int64_t n : {0, 1, 7, 12, 13, 100, 101})
    for (int64_t offset : {int64_t{0}, n / 2}) {
      std::multiset<int64_t> all;
      std::set<int64_t> counts;
      for (int64_t r = 0; r < 3; ++r) {
        EpochSplit s(n, offset, r, 3, 4, false, false);
        EpochSplit padded(n, offset, r, 3, 4, false);
        CHECK_EQ(s.batches, padded.batches);
        counts.insert(s.batches);
        for (int64_t k = 0; k <= s.batches; ++k)
          CHECK_EQ(s.consumed_after(k), padded.consumed_after(k));
        for (int64_t k = 0; k < s.batches; ++k) {
          CHECK(s.batch_length(k) >= 0 && s.batch_length(k) <= 4);
          for (int64_t j = 0; j < s.batch_length(k); ++j) all.insert(s.global(k, j));
        }
      }
      CHECK_EQ(counts.size(), size_t{1});
      CHECK_EQ(static_cast<int64_t>(all.size()), n - offset);
      for (int64_t i = offset; i < n; ++i) CHECK_EQ(all.count(i), size_t{1});
    }
  EpochSplit a(100, 0, 0, 1, 8, false);
  EpochSplit b(100, a.consumed_after(5), 0, 1, 8, false);
  for (int64_t k = 0; k < b.batches; ++k)
    for (int64_t j = 0; j < b.batch_length(k); ++j) CHECK_EQ(b.global(k, j), a.global(k + 5, j));
}

/// Reference batch for windows: direct from the flat stream.
static void producer_windows() {
  std::string dir = test::temp_dir();
  std::vector<uint16_t> stream(20000);
  std::mt19937 rng(1);
  for (auto& t : stream) t = static_cast<uint16_t>(rng());
  write_file(dir + "/a.bin", std::vector<uint16_t>(stream.begin(), stream.begin() + 7001));
  write_file(dir + "/b.bin", std::vector<uint16_t>(stream.begin() + 7001, stream.end()));
  auto src = open_token_files({dir + "/a.bin", dir + "/b.bin"}, DType::kUInt16);
  for (DType out : {DType::kInt64, DType::kInt32}) {
    TokenOptions o;
    o.seq_len = 100;
    o.stride = 37;
    o.batch_size = 16;
    o.shuffle = true;
    o.seed = 9;
    o.token_dtype = out;
    TokenProducer p(src, o);
    CHECK_EQ(p.epoch_samples(), (20000 - 101) / 37 + 1);
    auto plan = p.plan_epoch({3, 0, 1, 0});
    std::set<int64_t> starts;
    for (int64_t k = 0; k < plan->num_batches(); ++k) {
      auto w = p.plan_batch(*plan, k);
      auto buf = run_batch(*w, 1 + k % 3, static_cast<uint32_t>(k));
      const auto& x = tensor(*w, "input_ids");
      const auto& y = tensor(*w, "labels");
      CHECK(x.dtype == out && x.shape[1] == 100);
      for (int64_t r = 0; r < x.shape[0]; ++r) {
        int64_t s = -1;
        for (int64_t cand = 0; cand * 37 + 101 <= 20000 && s < 0; ++cand) {
          bool ok = true;
          for (int64_t j = 0; j < 100 && ok; ++j)
            ok = value(buf, x, r * 100 + j) == stream[cand * 37 + j];
          if (ok) s = cand * 37;
        }
        CHECK(s >= 0);
        starts.insert(s);
        for (int64_t j = 0; j < 100; ++j) CHECK_EQ(value(buf, y, r * 100 + j), stream[s + j + 1]);
      }
    }
    CHECK_EQ(static_cast<int64_t>(starts.size()), p.epoch_samples());  // each window once
  }
  TokenOptions o;
  o.seq_len = 20000;  // larger than the stream allows (needs 20001)
  CHECK_THROWS(DataError, TokenProducer(src, o));
  o.seq_len = 0;
  CHECK_THROWS(UsageError, TokenProducer(src, o));
}

/// Packed rows: the invariants of the output (any mode), checked batch by batch.
static void check_packed(const TokenProducer& p, const std::vector<std::vector<int64_t>>& docs,
                         const std::vector<uint8_t>& buf, const BatchWork& w,
                         std::map<std::pair<int64_t, int64_t>, int>& seen_tokens_by_doc_pos) {
  const auto& x = tensor(w, "input_ids");
  const auto& y = tensor(w, "labels");
  const auto& pos = tensor(w, "position_ids");
  const auto& cu = tensor(w, "cu_seqlens");
  const auto& ms = tensor(w, "max_seqlen");
  const auto& loss = tensor(w, "loss_mask");
  const int64_t B = x.shape[0], L = x.shape[1];
  // cu_seqlens: from 0 to B*L, boundaries exactly where position_ids restart
  CHECK_EQ(value(buf, cu, 0), 0);
  CHECK_EQ(value(buf, cu, cu.shape[0] - 1), B * L);
  std::set<int64_t> bounds;
  int64_t longest = 0;
  for (int64_t i = 1; i < cu.shape[0]; ++i) {
    CHECK(value(buf, cu, i) > value(buf, cu, i - 1));
    longest = std::max(longest, value(buf, cu, i) - value(buf, cu, i - 1));
    bounds.insert(value(buf, cu, i - 1));
  }
  CHECK_EQ(value(buf, ms, 0), longest);
  for (int64_t t = 0; t < B * L; ++t) CHECK_EQ(value(buf, pos, t) == 0, bounds.count(t) == 1);
  // each sequence is a run of one document: find it, check labels and mask
  for (int64_t i = 1; i < cu.shape[0]; ++i) {
    const int64_t a = value(buf, cu, i - 1), b = value(buf, cu, i);
    if (value(buf, loss, a) == 0 && value(buf, y, a) == p.options().ignore_index &&
        value(buf, x, a) == p.options().pad_id && b % L == 0 && b - a < L) {
      bool pad = true;
      for (int64_t t = a; t < b; ++t) pad = pad && value(buf, loss, t) == 0;
      if (pad) continue;  // a padding run
    }
    // tokens are unique in this source: the first one names (doc, offset)
    int64_t found = -1, off = -1;
    for (size_t d = 0; d < docs.size() && found < 0; ++d)
      for (size_t o = 0; o < docs[d].size() && found < 0; ++o)
        if (docs[d][o] == value(buf, x, a))
          found = static_cast<int64_t>(d), off = static_cast<int64_t>(o);
    CHECK(found >= 0);
    CHECK(off + (b - a) <= static_cast<int64_t>(docs[static_cast<size_t>(found)].size()));
    for (int64_t t = a; t < b; ++t)
      CHECK_EQ(value(buf, x, t), docs[static_cast<size_t>(found)][off + t - a]);
    const auto& doc = docs[static_cast<size_t>(found)];
    for (int64_t t = a; t < b; ++t) {
      const int64_t at = off + t - a;
      seen_tokens_by_doc_pos[{found, at}]++;
      if (at + 1 < static_cast<int64_t>(doc.size())) {
        CHECK_EQ(value(buf, y, t), doc[at + 1]);
        CHECK_EQ(value(buf, loss, t), 1);
      } else {
        CHECK_EQ(value(buf, y, t), p.options().ignore_index);
        CHECK_EQ(value(buf, loss, t), 0);
      }
    }
  }
}

static void producer_packed() {
  std::string dir = test::temp_dir();
  std::mt19937 rng(4);
  std::vector<int32_t> lengths;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 300; ++i) {
    int32_t n = static_cast<int32_t>(rng() % 5 == 0 ? rng() % 200 : rng() % 40);
    lengths.push_back(n);
    for (int32_t j = 0; j < n; ++j) tokens.push_back(static_cast<uint16_t>(tokens.size() + 1));
  }
  write_bytes(dir + "/m.idx", megatron_idx(lengths));
  write_file(dir + "/m.bin", tokens);
  auto src = open_megatron({dir + "/m"});
  auto docs = all_docs(*src);
  for (TokenMode mode : {TokenMode::kConcat, TokenMode::kDocument}) {
    TokenOptions o;
    o.mode = mode;
    o.seq_len = 64;
    o.batch_size = 8;
    o.shuffle = true;
    o.seed = 5;
    o.pad_id = 0;
    TokenProducer p(src, o);
    std::map<std::pair<int64_t, int64_t>, int> seen;
    auto plan = p.plan_epoch({1, 0, 1, 0});
    for (int64_t k = 0; k < plan->num_batches(); ++k) {
      auto w = p.plan_batch(*plan, k);
      auto b1 = run_batch(*w, 1, 0);
      auto b2 = run_batch(*w, 3, 77);  // any order, any threads: the same bytes
      CHECK(b1 == b2);
      check_packed(p, docs, b1, *w, seen);
    }
    // no token lost or repeated (concat: all but the tail that fills no row)
    int64_t total = 0;
    for (auto& [key, count] : seen) {
      CHECK_EQ(count, 1);
      ++total;
    }
    CHECK_EQ(total, src->num_tokens() - p.unused_tokens());
    if (mode == TokenMode::kDocument)
      CHECK(p.pad_fraction() > 0 && p.pad_fraction() < 0.2);
    else
      CHECK_EQ(p.pad_fraction(), 0.0);
  }
}

/// labels="unshifted" (HF's convention): labels are the tokens themselves bar every
/// sequence's first and padding; packed keys named as DataCollatorWithFlattening's, the
/// longest sequence as a shape; the same bytes for any thread count.
static void producer_unshifted() {
  std::string dir = test::temp_dir();
  std::mt19937 rng(6);
  std::vector<int32_t> lengths;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 120; ++i) {
    const int32_t n = static_cast<int32_t>(1 + rng() % 70);
    lengths.push_back(n);
    for (int32_t j = 0; j < n; ++j) tokens.push_back(static_cast<uint16_t>(1 + rng() % 999));
  }
  write_bytes(dir + "/m.idx", megatron_idx(lengths));
  write_file(dir + "/m.bin", tokens);
  auto src = open_megatron({dir + "/m"});
  for (TokenMode mode : {TokenMode::kWindows, TokenMode::kConcat, TokenMode::kDocument}) {
    TokenOptions o;
    o.mode = mode;
    o.seq_len = 48;
    o.batch_size = 5;
    o.shuffle = true;
    o.seed = 2;
    o.unshifted = true;
    TokenProducer p(src, o);
    auto plan = p.plan_epoch({0, 0, 1, 0});
    for (int64_t k = 0; k < plan->num_batches(); ++k) {
      auto w = p.plan_batch(*plan, k);
      auto buf = run_batch(*w, 1, 0);
      CHECK(buf == run_batch(*w, 3, static_cast<uint32_t>(k)));
      for (const auto& t : w->tensors)
        CHECK(t.name != "loss_mask" && t.name != "cu_seqlens" && t.name != "max_seqlen");
      const auto& x = tensor(*w, "input_ids");
      const auto& y = tensor(*w, "labels");
      const int64_t n = x.shape[0] * x.shape[1];
      std::set<int64_t> starts;  // sequence starts over the flattened batch
      int64_t longest = 0;
      if (mode == TokenMode::kWindows) {
        for (int64_t r = 0; r < x.shape[0]; ++r) starts.insert(r * 48);
      } else {
        const auto& cu = tensor(*w, "cu_seq_lens_q");
        const auto& cuk = tensor(*w, "cu_seq_lens_k");
        CHECK(cu.offset == cuk.offset && cu.shape == cuk.shape);  // one buffer, two names
        CHECK_EQ(value(buf, cu, cu.shape[0] - 1), n);
        for (int64_t i = 0; i + 1 < cu.shape[0]; ++i) {
          starts.insert(value(buf, cu, i));
          longest = std::max(longest, value(buf, cu, i + 1) - value(buf, cu, i));
        }
        const auto& ml = tensor(*w, "max_length");
        CHECK(ml.shape.size() == 2 && ml.shape[0] == longest && ml.shape[1] == 0 && ml.nbytes == 0);
        const auto& pos = tensor(*w, "position_ids");
        for (int64_t t = 0; t < n; ++t) CHECK_EQ(value(buf, pos, t) == 0, starts.count(t) == 1);
      }
      for (int64_t t = 0; t < n; ++t) {
        const int64_t want = starts.count(t) || value(buf, x, t) == 0 ? -100 : value(buf, x, t);
        CHECK_EQ(value(buf, y, t), want);
      }
    }
  }
}

static void producer_budget() {
  std::string dir = test::temp_dir();
  std::mt19937 rng(8);
  std::vector<int32_t> lengths;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 500; ++i) {
    int32_t n = static_cast<int32_t>(rng() % 90);
    lengths.push_back(n);
    for (int32_t j = 0; j < n; ++j) tokens.push_back(static_cast<uint16_t>(rng() % 1000));
  }
  write_bytes(dir + "/m.idx", megatron_idx(lengths));
  write_file(dir + "/m.bin", tokens);
  auto src = open_megatron({dir + "/m"});
  auto docs = all_docs(*src);
  TokenOptions o;
  o.mode = TokenMode::kBudget;
  o.max_tokens = 512;
  o.pad_to_multiple_of = 8;
  o.max_length = 80;
  o.batch_size = 0;
  o.shuffle = true;
  o.seed = 3;
  o.pad_id = 1;
  o.token_dtype = DType::kInt32;
  TokenProducer p(src, o);
  auto plan = p.plan_epoch({0, 0, 1, 0});
  std::vector<int> used(docs.size(), 0);
  for (int64_t k = 0; k < plan->num_batches(); ++k) {
    auto w = p.plan_batch(*plan, k);
    auto buf = run_batch(*w, 2, 5);
    const auto& x = tensor(*w, "input_ids");
    const auto& y = tensor(*w, "labels");
    const auto& am = tensor(*w, "attention_mask");
    const auto& lm = tensor(*w, "loss_mask");
    const int64_t R = x.shape[0], T = x.shape[1];
    CHECK(R * T <= 512 && T % 8 == 0);
    for (int64_t r = 0; r < R; ++r) {
      int64_t n = 0;
      while (n < T && value(buf, am, r * T + n) == 1) ++n;
      // find the document: same length (cut to 80) and content
      int64_t found = -1;
      for (size_t d = 0; d < docs.size() && found < 0; ++d) {
        if (used[d] || std::min<int64_t>(80, static_cast<int64_t>(docs[d].size())) != n) continue;
        bool ok = true;
        for (int64_t j = 0; j < n && ok; ++j) ok = value(buf, x, r * T + j) == docs[d][j];
        if (ok) found = static_cast<int64_t>(d);
      }
      CHECK(found >= 0);
      used[found] = 1;
      const auto& doc = docs[found];
      for (int64_t j = 0; j < T; ++j) {
        if (j < n) {
          const bool has = j + 1 < static_cast<int64_t>(doc.size());
          CHECK_EQ(value(buf, y, r * T + j), has ? doc[j + 1] : -100);
          CHECK_EQ(value(buf, lm, r * T + j), has ? 1 : 0);
        } else {
          CHECK_EQ(value(buf, x, r * T + j), 1);
          CHECK_EQ(value(buf, y, r * T + j), -100);
          CHECK_EQ(value(buf, am, r * T + j), 0);
        }
      }
    }
  }
  for (size_t d = 0; d < docs.size(); ++d) CHECK_EQ(used[d], docs[d].empty() ? 0 : 1);
}

/// Resume: a segment starting at consumed_after(k) yields batches k.. of the
/// original, for every mode; at another world size the union is unchanged.
static void producer_resume() {
  std::string dir = test::temp_dir();
  std::mt19937 rng(6);
  std::vector<int32_t> lengths;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 400; ++i) {
    int32_t n = static_cast<int32_t>(rng() % 70);
    lengths.push_back(n);
    for (int32_t j = 0; j < n; ++j) tokens.push_back(static_cast<uint16_t>(rng()));
  }
  write_bytes(dir + "/m.idx", megatron_idx(lengths));
  write_file(dir + "/m.bin", tokens);
  auto src = open_megatron({dir + "/m"});
  for (TokenMode mode :
       {TokenMode::kWindows, TokenMode::kConcat, TokenMode::kDocument, TokenMode::kBudget}) {
    TokenOptions o;
    o.mode = mode;
    o.seq_len = 32;
    o.batch_size = mode == TokenMode::kBudget ? 0 : 4;
    o.max_tokens = 256;
    o.shuffle = true;
    o.seed = 1;
    TokenProducer p(src, o);
    for (int64_t world : {1, 2, 3}) {
      std::vector<std::vector<std::vector<uint8_t>>> full(static_cast<size_t>(world));
      for (int64_t r = 0; r < world; ++r) {
        auto plan = p.plan_epoch({2, r, world, 0});
        CHECK_EQ(plan->num_batches(), p.num_batches(r, world));
        for (int64_t k = 0; k < plan->num_batches(); ++k) {
          auto w = p.plan_batch(*plan, k);
          full[r].push_back(run_batch(*w, 1, 0));
        }
      }
      for (int64_t k : {int64_t{0}, int64_t{1}, p.num_batches(0, world) / 2}) {
        const int64_t off = p.consumed_after({2, 0, world, 0}, k);
        for (int64_t r = 0; r < world; ++r) {
          auto plan = p.plan_epoch({2, r, world, off});
          CHECK_EQ(plan->num_batches(), p.num_batches(r, world) - k);
          for (int64_t j = 0; j < plan->num_batches(); ++j) {
            auto w = p.plan_batch(*plan, j);
            CHECK(run_batch(*w, 1, 0) == full[r][k + j]);
          }
        }
      }
    }
  }
}

static void bad_tokens() {
  std::string dir = test::temp_dir();
  std::vector<uint32_t> big = {1, 2, 3, 0x90000000u, 5, 6, 7, 8, 9, 10};
  write_file(dir + "/u32.bin", big);
  auto src = open_token_files({dir + "/u32.bin"}, DType::kUInt32);
  TokenOptions o;
  o.seq_len = 4;
  o.batch_size = 1;
  o.token_dtype = DType::kInt32;
  TokenProducer p(src, o);
  auto plan = p.plan_epoch({0, 0, 1, 0});
  auto w = p.plan_batch(*plan, 0);
  bool named = false;
  try {
    run_batch(*w, 1, 0);
  } catch (const DataError& e) {
    named = std::string(e.what()).find("u32.bin") != std::string::npos &&
            std::string(e.what()).find("2415919104") != std::string::npos;
  }
  CHECK(named);
  o.token_dtype = DType::kInt64;  // int64 holds it
  TokenProducer q(src, o);
  auto wq = q.plan_batch(*q.plan_epoch({0, 0, 1, 0}), 0);
  run_batch(*wq, 1, 0);
  o.vocab_size = 8;  // ... but not a vocabulary of 8
  TokenProducer v(src, o);
  auto wv = v.plan_batch(*v.plan_epoch({0, 0, 1, 0}), 1);
  CHECK_THROWS(DataError, run_batch(*wv, 1, 0));
  o.pad_id = int64_t{1} << 40;
  o.token_dtype = DType::kInt32;
  o.vocab_size = 0;
  CHECK_THROWS(UsageError, TokenProducer(src, o));
}

TEST_MAIN(flat_files(); megatron(); record_tokens(); lengths_with_two_variable_fields();
          copy_and_limits(); pack_plan(); budget_plan(); split_and_resume(); producer_windows();
          producer_packed(); producer_unshifted(); producer_budget(); producer_resume();
          bad_tokens())
