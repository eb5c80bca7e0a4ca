// libFuzzer target: arbitrary bytes as a shard file. Probing, opening (with and
// without a version-2 identity to match) and reading every record must either
// succeed or throw DataError. No crash, no out-of-bounds access (ASan), no UB
// (UBSan), no leak. The same bytes parsed as by range (parse_shard_table over
// the header and the tail) must be accepted or refused exactly as opening the
// file accepts or refuses them, for the same reason, with the same entries,
// and each record must verify exactly when the reader's checked read succeeds.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "format/dataset.h"
#include "format/schema.h"
#include "format/shard_format.h"
#include "format/shard_reader.h"
#include "format/shard_table.h"

using namespace stoker;

namespace {

void read_all(const ShardReader& r, const Schema& schema) {
  std::vector<RecordView> views(schema.fields.size());
  for (int64_t i = 0; i < r.num_records(); ++i) {
    try {
      RecordView rec = r.record(i);
      if (r.num_fields() == schema.fields.size()) split_record(schema, rec, views.data());
    } catch (const DataError&) {
    }
  }
  (void)r.file_checksum();
}

// The message without its source location.
std::string reason_of(const std::exception& e) {
  std::string msg = e.what();
  return msg.substr(0, msg.rfind(" ["));
}

// Opens the file and parses its head and tail (`tail` bytes of it) with the same
// expectation; both must agree (see the top of the file).
void same_as_reader(const std::string& path, const uint8_t* data, size_t size, size_t tail,
                    const ShardExpectation& e) {
  std::optional<ShardReader> reader;
  std::string by_file, by_range;
  try {
    reader.emplace(path, e);
  } catch (const DataError& err) {
    by_file = reason_of(err);
  }
  std::optional<ShardTable> table;
  try {
    table = parse_shard_table(path, data, size, data + size - tail, tail, size, e);
  } catch (const DataError& err) {
    by_range = reason_of(err);
  }
  // A UsageError (a tail short of the table) would escape: the tails given here
  // reach the table whenever the footer passes its checks.
  if (by_file != by_range) std::abort();
  if (!reader) return;
  if (table->num_records() != reader->num_records()) std::abort();
  const uint8_t* base = reader->records_region().data - sizeof(format::ShardHeader);
  for (int64_t i = 0; i < reader->num_records(); ++i) {
    const format::RecordEntry& en = table->entry(i);
    RecordView v = reader->record_unchecked(i);
    if (en.offset != static_cast<uint64_t>(v.data - base) || en.length != v.size ||
        en.sum != reader->record_sum(i))
      std::abort();
    bool read_ok = true, verify_ok = true;
    try {
      (void)reader->record(i);
    } catch (const DataError&) {
      read_ok = false;
    }
    try {
      verify_record_bytes(*table, i, data + en.offset, en.length);
    } catch (const DataError&) {
      verify_ok = false;
    }
    if (read_ok != verify_ok) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = memfd_create("shard", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  Schema schema;
  schema.fields.push_back({"x", FieldKind::kNDArray, DType::kUInt8, {4}});
  schema.fields.push_back({"v", FieldKind::kNDArray, DType::kInt32, {-1, 2}});
  schema.fields.push_back({"b", FieldKind::kBlob, DType::kUInt8, {}});
  // Accept the file's own schema hash, and (second pass) the identity its own
  // header and footer claim, as index.json would: the fuzzer then gets past
  // those checks into the table and the records.
  ShardExpectation expect;
  std::optional<ShardIdentity> own;
  if (size >= sizeof(format::ShardHeader) + sizeof(format::ShardFooter)) {
    format::ShardHeader h;
    format::ShardFooter f;
    std::memcpy(&h, data, sizeof h);
    std::memcpy(&f, data + size - sizeof f, sizeof f);
    expect.schema_hash = h.schema_hash;
    ShardIdentity id;
    std::memcpy(id.dataset_id.bytes.data(), h.dataset_id, 16);
    id.ordinal = h.ordinal;
    id.header_sum = h.header_sum;
    id.table_sum = f.table_sum;
    own = id;
  }
  schema.hash = expect.schema_hash;
  for (int pass = 0; pass < 2; ++pass) {
    ShardExpectation e = expect;
    if (pass == 1) e.identity = own;
    try {
      (void)probe_shard(path, e);
    } catch (const DataError&) {
    }
    try {
      ShardReader r(path, e);
      read_all(r, schema);
    } catch (const DataError&) {
    }
    if (size >= sizeof(format::ShardHeader) + sizeof(format::ShardFooter)) {
      same_as_reader(path, data, size, size, e);
      // The tail the footer's record count asks for, as a range fetch would take it.
      uint64_t n;
      std::memcpy(&n, data + size - 24, sizeof n);
      if (n <= (size - sizeof(format::ShardFooter)) / sizeof(format::RecordEntry))
        same_as_reader(path, data, size, shard_tail_bytes(static_cast<int64_t>(n)), e);
    }
  }
  // The same through a lazily mapped Dataset, as the loader reads it.
  try {
    Dataset::Options opts;
    opts.probe_on_open = (size & 1) != 0;
    Dataset ds(schema, {ShardInfo{path, -1, static_cast<int64_t>(size), own, std::nullopt}}, opts);
    std::vector<RecordView> views(schema.fields.size());
    for (int64_t i = 0; i < ds.size(); ++i) {
      try {
        ds.read(i, views.data());
        ds.check_intact(i);
      } catch (const DataError&) {
      }
    }
  } catch (const DataError&) {
  }
  close(fd);
  return 0;
}
