// libFuzzer target: arbitrary bytes as a shard file. Probing, opening (with and
// without a version-2 identity to match) and reading every record must either
// succeed or throw DataError. No crash, no out-of-bounds access (ASan), no UB
// (UBSan), no leak.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "format/dataset.h"
#include "format/schema.h"
#include "format/shard_format.h"
#include "format/shard_reader.h"

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
  }
  // The same through a lazily mapped Dataset, as the loader reads it.
  try {
    Dataset::Options opts;
    opts.probe_on_open = (size & 1) != 0;
    Dataset ds(schema, {ShardInfo{path, -1, static_cast<int64_t>(size), own}}, opts);
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
