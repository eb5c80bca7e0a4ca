// A shard's record table parsed from its head and tail bytes (as fetched by
// range) against the same shard opened as a file: the same entries, the same
// refusals with the same reasons, and records verified one by one.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "check.h"
#include "common/checksum.h"
#include "common/error.h"
#include "format/shard_reader.h"
#include "format/shard_table.h"
#include "test_util.h"

using namespace stoker;

namespace {

using test::read_file;
using test::throws_with;

const std::string kUrl = "https://host/data/gen-1/shard-00000.stk";

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

ShardExpectation expectation(const ShardInfo& info) {
  return ShardExpectation{test::test_schema().hash, info.num_records, info.bytes, info.identity};
}

// Parses `file` (a whole shard's bytes) from its first 64 and last `tail` bytes.
ShardTable parse(const std::string& file, const ShardExpectation& expect, size_t tail,
                 const std::string& name = kUrl) {
  return parse_shard_table(name, u8(file), 64, u8(file) + file.size() - tail, tail, file.size(),
                           expect);
}

ShardTable parse(const std::string& file, const ShardExpectation& expect) {
  // From the footer when it is intact: the parser is the one to refuse a bad count.
  int64_t n = 0;
  if (file.size() >= 96) std::memcpy(&n, file.data() + file.size() - 24, 8);
  if (n < 0 || static_cast<uint64_t>(n) > (file.size() - 96) / 16) n = 0;
  return parse(file, expect, shard_tail_bytes(n));
}

// The message of the DataError `f` throws, without its source location and with
// `path` replaced by "<shard>"; "" when it does not throw DataError.
std::string reason(const std::function<void()>& f, const std::string& path) {
  try {
    f();
  } catch (const DataError& e) {
    std::string msg = e.what();  // the source location is e.where(), not in the message
    CHECK(msg.find("csrc/") == std::string::npos);
    if (msg.rfind(path, 0) == 0) msg = "<shard>" + msg.substr(path.size());
    return msg;
  }
  return "";
}

// The same shard as format version 1 wrote it: no dataset id, no ordinal.
std::string as_version_1(std::string file) {
  format::ShardHeader h;
  std::memcpy(&h, file.data(), sizeof h);
  h.version = 1;
  std::memset(h.dataset_id, 0, sizeof h.dataset_id);
  h.ordinal = 0;
  h.header_sum = checksum32(&h, offsetof(format::ShardHeader, header_sum));
  std::memcpy(file.data(), &h, sizeof h);
  return file;
}

void same_entries(const ShardTable& t, const ShardReader& r) {
  CHECK_EQ(t.num_records(), r.num_records());
  CHECK_EQ(t.num_fields(), r.num_fields());
  CHECK_EQ(t.version(), r.version());
  CHECK_EQ(t.file_size(), r.file_size());
  CHECK_EQ(t.table_sum(), r.table_sum());
  CHECK(std::memcmp(&t.header(), &r.header(), sizeof(format::ShardHeader)) == 0);
  const uint8_t* base = r.records_region().data - sizeof(format::ShardHeader);
  for (int64_t i = 0; i < r.num_records(); ++i) {
    const format::RecordEntry& e = t.entry(i);
    RecordView v = r.record(i);
    CHECK_EQ(e.offset, static_cast<uint64_t>(v.data - base));
    CHECK_EQ(e.length, v.size);
    CHECK_EQ(e.sum, r.record_sum(i));
    CHECK_EQ(t.table_offset(), static_cast<uint64_t>(r.records_region().size) + 64);
  }
}

}  // namespace

static void tail_bytes() {
  CHECK_EQ(shard_tail_bytes(0), 32u);
  CHECK_EQ(shard_tail_bytes(1), 48u);
  CHECK_EQ(shard_tail_bytes(1000), 32u + 16000u);
  CHECK_THROWS(UsageError, shard_tail_bytes(-1));
}

static void same_entries_as_the_reader() {
  std::string dir = test::temp_dir();
  for (int64_t n : {1, 7, 40}) {
    auto shards = test::write_shards(dir, n, n);
    const ShardInfo& info = shards[0];
    ShardReader reader(info.path, expectation(info));
    const std::string file = read_file(info.path);
    ShardTable t = parse(file, expectation(info), shard_tail_bytes(n));
    CHECK_EQ(t.path(), kUrl);
    same_entries(t, reader);
    // More bytes than needed, up to the whole file, give the same table; so does a
    // head longer than the header, and no expectation beyond the schema.
    same_entries(parse(file, expectation(info), file.size()), reader);
    same_entries(parse(file, expectation(info), shard_tail_bytes(n) + 5), reader);
    same_entries(parse_shard_table(kUrl, u8(file), file.size(), u8(file), file.size(), file.size(),
                                   ShardExpectation{test::test_schema().hash, -1, -1, {}}),
                 reader);
    // Every record's own bytes verify against the table.
    for (int64_t i = 0; i < n; ++i) {
      const format::RecordEntry& e = t.entry(i);
      verify_record_bytes(t, i, u8(file) + e.offset, e.length);
    }
  }
}

static void empty_shard() {
  std::string path = test::temp_dir() + "/empty.stk";
  ShardWriter w(path, test::test_schema().hash, 3, DatasetId::random(), 0);
  ShardSummary sum = w.finish();
  CHECK_EQ(sum.num_records, 0);
  const std::string file = read_file(path);
  ShardTable t = parse(file, ShardExpectation{test::test_schema().hash, 0, -1, {}}, 32);
  CHECK_EQ(t.num_records(), 0);
  CHECK_EQ(t.table_offset(), 64u);
  CHECK_THROWS(UsageError, t.entry(0));
}

// Every single-byte change of the header, the record table or the footer is refused,
// with or without an identity to match, for the reason opening the file gives.
static void every_byte_flip_of_head_and_tail_is_refused() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 9, 9);
  const ShardInfo& info = shards[0];
  const std::string good = read_file(info.path);
  const size_t tail = shard_tail_bytes(9);
  const std::string flipped_path = dir + "/flipped.stk";
  int checked = 0;
  for (size_t off = 0; off < good.size(); ++off) {
    if (off >= 64 && off < good.size() - tail) continue;  // a record: not in head or tail
    for (int with_identity = 0; with_identity < 2; ++with_identity) {
      ShardExpectation want = expectation(info);
      if (!with_identity) {
        want.identity.reset();
        want.num_records = -1;
      }
      std::string file = good;
      file[off] = static_cast<char>(file[off] ^ 0x40);
      write_file(flipped_path, file);
      const std::string by_range = reason([&] { parse(file, want, tail); }, kUrl);
      const std::string by_file = reason([&] { ShardReader(flipped_path, want); }, flipped_path);
      if (by_range.empty() || by_range != by_file)
        std::fprintf(stderr, "flip at %zu: by range '%s', as a file '%s'\n", off, by_range.c_str(),
                     by_file.c_str());
      CHECK(!by_range.empty());
      CHECK_EQ(by_range, by_file);
      ++checked;
    }
  }
  CHECK_EQ(checked, 2 * static_cast<int>(64 + tail));
  std::remove(flipped_path.c_str());
}

static void wrong_expectations_are_refused() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 20, 10);  // two shards of the same size
  const std::string file = read_file(shards[1].path);
  const size_t tail = shard_tail_bytes(10);
  const ShardExpectation good = expectation(shards[1]);
  (void)parse(file, good, tail);
  auto refused = [&](ShardExpectation e, const char* why) {
    return throws_with([&] { parse(file, e, tail); }, why);
  };
  ShardExpectation e = good;
  e.schema_hash ^= 1;
  CHECK(refused(e, "schema hash does not match"));
  e = good;
  e.num_records = 11;
  CHECK(refused(e, "shard holds 10 records but index.json says 11"));
  e = good;
  e.bytes += 1;
  CHECK(refused(e, "(truncated or replaced file)"));
  e = good;
  e.identity->dataset_id.bytes[3] ^= 1;
  CHECK(refused(e, "belongs to another dataset"));
  e = good;
  e.identity->ordinal = 0;
  CHECK(refused(e, "(shards swapped or reordered)"));
  e = good;
  e.identity->header_sum ^= 1;
  CHECK(refused(e, "differs from index.json's"));
  e = good;
  e.identity->table_sum ^= 1;
  CHECK(refused(e, "(stale or rewritten shard)"));
  // Another shard's bytes under this one's name.
  const std::string other = read_file(shards[0].path);
  CHECK(throws_with([&] { parse(other, good, tail); }, "(shards swapped or reordered)"));
  // A file size that is not the shard's puts the footer's table out of bounds.
  CHECK(throws_with(
      [&] {
        parse_shard_table(kUrl, u8(file), 64, u8(file) + file.size() - tail, tail, file.size() + 16,
                          ShardExpectation{good.schema_hash, -1, -1, good.identity});
      },
      "record table out of bounds (corrupt footer)"));
  CHECK(throws_with(
      [&] {
        parse_shard_table(kUrl, u8(file), 64, u8(file), 64, 64,
                          ShardExpectation{good.schema_hash, -1, -1, {}});
      },
      "too short to be a shard"));
  // Errors name the URL given for messages.
  CHECK(throws_with([&] { parse(other, good, tail); }, kUrl.c_str()));
}

static void short_head_or_tail_says_what_is_needed() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 12, 12);
  const std::string file = read_file(shards[0].path);
  ShardExpectation e = expectation(shards[0]);
  e.num_records = -1;
  // A tail with the footer but not the whole table: how many bytes it takes.
  CHECK(throws_with([&] { parse(file, e, 32); }, "the last 224 bytes are needed (12 records)"));
  CHECK(throws_with([&] { parse(file, e, 223); }, "do not reach the record table at offset"));
  CHECK_THROWS(UsageError, parse(file, e, 31));
  CHECK_THROWS(UsageError,
               parse_shard_table(kUrl, u8(file), 64, u8(file), file.size() + 1, file.size(), e));
  CHECK_THROWS(UsageError, parse_shard_table(kUrl, u8(file), 63, u8(file) + file.size() - 224, 224,
                                             file.size(), e));
  // With the count from index.json, a wrong count is the data's fault, found first.
  e.num_records = 13;
  CHECK_THROWS(DataError, parse(file, e, shard_tail_bytes(13)));
}

static void records_verify_and_flips_do_not() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 6, 6);
  const std::string file = read_file(shards[0].path);
  ShardTable t = parse(file, expectation(shards[0]));
  for (int64_t i = 0; i < t.num_records(); ++i) {
    const format::RecordEntry& e = t.entry(i);
    std::string rec = file.substr(e.offset, e.length);
    CHECK(test::make_record(i) == rec);
    verify_record_bytes(t, i, u8(rec), rec.size());
    for (size_t k = 0; k < rec.size(); ++k) {
      std::string bad = rec;
      bad[k] = static_cast<char>(bad[k] ^ 1);
      CHECK(throws_with([&] { verify_record_bytes(t, i, u8(bad), bad.size()); },
                        (kUrl + ": record " + std::to_string(i) + ": checksum mismatch").c_str()));
    }
    CHECK(throws_with([&] { verify_record_bytes(t, i, u8(rec), rec.size() - 1); },
                      "bytes, the record table gives"));
    // Another record's bytes, of the same length or not, are not this one's.
    const format::RecordEntry& o = t.entry((i + 5) % t.num_records());
    CHECK_THROWS(DataError, verify_record_bytes(t, i, u8(file) + o.offset, o.length));
  }
  const std::string rec = test::make_record(0);
  CHECK_THROWS(UsageError, verify_record_bytes(t, 6, u8(rec), rec.size()));
  CHECK_THROWS(UsageError, verify_record_bytes(t, -1, u8(rec), rec.size()));
}

static void version_1_shards_parse_without_identity() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 8, 8);
  const std::string file = as_version_1(read_file(shards[0].path));
  const std::string path = dir + "/v1.stk";
  write_file(path, file);
  ShardExpectation e = expectation(shards[0]);
  e.identity.reset();
  ShardReader reader(path, e);
  CHECK_EQ(reader.version(), 1u);
  ShardTable t = parse(file, e);
  CHECK_EQ(t.version(), 1u);
  same_entries(t, reader);
  // Listed with an identity (a version-2 index), it is someone else's shard.
  CHECK(throws_with([&] { parse(file, expectation(shards[0])); }, "a version-1 shard"));
  // Every flip of its head and tail is refused too.
  const size_t tail = shard_tail_bytes(8);
  for (size_t off = 0; off < file.size(); ++off) {
    if (off >= 64 && off < file.size() - tail) continue;
    std::string bad = file;
    bad[off] = static_cast<char>(bad[off] ^ 0x40);
    CHECK_THROWS(DataError, parse(bad, e, tail));
  }
}

TEST_MAIN(tail_bytes(); same_entries_as_the_reader(); empty_shard();
          every_byte_flip_of_head_and_tail_is_refused(); wrong_expectations_are_refused();
          short_head_or_tail_says_what_is_needed(); records_verify_and_flips_do_not();
          version_1_shards_parse_without_identity())
