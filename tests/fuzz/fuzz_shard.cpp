// libFuzzer target: arbitrary bytes as a shard file. Opening must either
// succeed or throw DataError; reading every record likewise. No crash, no
// out-of-bounds access (ASan), no UB (UBSan), no leak.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "format/schema.h"
#include "format/shard_format.h"
#include "format/shard_reader.h"

using namespace stoker;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = memfd_create("shard", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // Accept the file's own schema hash so the fuzzer gets past that check.
  uint64_t hash = 0;
  if (size >= sizeof(format::ShardHeader))
    std::memcpy(&hash, data + offsetof(format::ShardHeader, schema_hash), 8);
  Schema schema;
  schema.fields.push_back({"x", FieldKind::kNDArray, DType::kUInt8, {4}});
  schema.fields.push_back({"v", FieldKind::kNDArray, DType::kInt32, {-1, 2}});
  schema.fields.push_back({"b", FieldKind::kBlob, DType::kUInt8, {}});
  try {
    ShardReader r(path, hash, -1, -1);
    std::vector<RecordView> views(schema.fields.size());
    for (int64_t i = 0; i < r.num_records(); ++i) {
      try {
        RecordView rec = r.record(i);
        if (r.num_fields() == schema.fields.size()) split_record(schema, rec, views.data());
      } catch (const DataError&) {
      }
    }
    (void)r.file_checksum();
  } catch (const DataError&) {
  }
  close(fd);
  return 0;
}
