#include "format/dataset.h"

#include <algorithm>

#include "common/error.h"

namespace stoker {

Dataset::Dataset(Schema schema, const std::vector<ShardInfo>& shards) : schema_(std::move(schema)) {
  for (const auto& info : shards) {
    auto r = std::make_unique<ShardReader>(info.path, schema_.hash, info.num_records, info.bytes);
    if (r->num_fields() != schema_.fields.size())
      STOKER_THROW(DataError, info.path, ": shard has ", r->num_fields(),
                   " fields but the schema has ", schema_.fields.size());
    starts_.push_back(total_);
    total_ += r->num_records();
    shards_.push_back(std::move(r));
  }
}

Dataset::Location Dataset::locate(int64_t i) const {
  if (i < 0 || i >= total_)
    STOKER_THROW(UsageError, "sample index ", i, " out of range for a dataset of ", total_);
  auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  size_t s = static_cast<size_t>(it - starts_.begin()) - 1;
  return {s, i - starts_[s]};
}

void Dataset::read(int64_t i, RecordView* out) const {
  Location loc = locate(i);
  const ShardReader& r = *shards_[loc.shard];
  RecordView rec = r.record(loc.record);  // names file and record itself
  try {
    split_record(schema_, rec, out);
  } catch (const DataError& e) {
    STOKER_THROW(DataError, r.path(), ": record ", loc.record, ": ", e.what());
  }
}

}  // namespace stoker
