// Helpers for C++ tests: temp directories and small datasets written in-process.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "format/dataset.h"
#include "format/shard_writer.h"

namespace stoker::test {

inline std::string temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base ? base : "/tmp") + "/stoker-test-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) std::abort();
  return buf.data();
}

/// Schema: "x" uint8[16] filled with (i % 251), "label" int64 = i, "tok" int32[None] of length i
/// % 5.
inline Schema test_schema() {
  Schema s;
  s.fields.push_back({"x", FieldKind::kNDArray, DType::kUInt8, {16}});
  s.fields.push_back({"label", FieldKind::kScalar, DType::kInt64, {}});
  s.fields.push_back({"tok", FieldKind::kNDArray, DType::kInt32, {-1}});
  s.hash = 0x1234;
  return s;
}

inline std::string make_record(int64_t i) {
  std::string x(16, static_cast<char>(i % 251));
  std::string label(reinterpret_cast<const char*>(&i), 8);
  std::string tok;
  for (int32_t t = 0; t < i % 5; ++t) tok.append(reinterpret_cast<const char*>(&t), 4);
  std::string rec;
  for (const std::string* f : {&x, &label, &tok}) {
    uint32_t n = static_cast<uint32_t>(f->size());
    rec.append(reinterpret_cast<const char*>(&n), 4);
  }
  return rec + x + label + tok;
}

/// Writes `n` records into shards of `per_shard` records under one random
/// dataset id; returns the shard list with each shard's identity.
inline std::vector<ShardInfo> write_shards(const std::string& dir, int64_t n, int64_t per_shard) {
  std::vector<ShardInfo> out;
  const DatasetId id = DatasetId::random();
  for (int64_t s = 0; s * per_shard < n; ++s) {
    std::string path = dir + "/shard-" + std::to_string(s) + ".stk";
    ShardWriter w(path, test_schema().hash, 3, id, static_cast<uint64_t>(s));
    for (int64_t i = s * per_shard; i < std::min(n, (s + 1) * per_shard); ++i) {
      std::string r = make_record(i);
      w.append(reinterpret_cast<const uint8_t*>(r.data()), r.size());
    }
    ShardSummary sum = w.finish();
    out.push_back({path, sum.num_records, static_cast<int64_t>(sum.bytes),
                   ShardIdentity{id, static_cast<uint64_t>(s), sum.header_sum, sum.table_sum},
                   std::nullopt});
  }
  return out;
}

/// The bytes of the file at `path`.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/// Whether `f` throws a DataError or UsageError whose message holds `text`
/// (printing what it got otherwise).
inline bool throws_with(const std::function<void()>& f, const char* text) {
  try {
    f();
  } catch (const DataError& e) {
    if (std::strstr(e.what(), text)) return true;
    std::fprintf(stderr, "unexpected message: %s\n", e.what());
    return false;
  } catch (const UsageError& e) {
    if (std::strstr(e.what(), text)) return true;
    std::fprintf(stderr, "unexpected message: %s\n", e.what());
    return false;
  }
  std::fprintf(stderr, "no error, expected: %s\n", text);
  return false;
}

/// Errors that reader threads of a concurrency test did not expect: the only
/// expected one is "stopped while waiting" once the test has set its stop flag.
/// Counted (and the first printed) instead of swallowed, so a race that throws
/// fails the test.
class UnexpectedErrors {
 public:
  void check(const std::exception& e, const std::atomic<bool>& stop) {
    if (stop.load() && std::strstr(e.what(), "stopped while waiting") != nullptr) return;
    if (count_.fetch_add(1) == 0) std::fprintf(stderr, "unexpected error: %s\n", e.what());
  }
  int count() const { return count_.load(); }

 private:
  std::atomic<int> count_{0};
};

}  // namespace stoker::test
