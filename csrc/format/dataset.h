// A dataset: the schema and the shards listed in index.json, addressed by a
// global record index. Shards are checked against the index when the dataset
// is opened (header and footer, O(1) each) and mapped on first use, so opening
// costs no mapping and a process maps only the shards it reads.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/detail/fork_locks.h"
#include "format/record_ranges.h"
#include "format/schema.h"
#include "format/shard_gate.h"
#include "format/shard_identity.h"
#include "format/shard_reader.h"
#include "format/shard_table.h"

namespace stoker {

struct ShardInfo {
  std::string path;
  int64_t num_records = 0;  ///< from index.json; -1: read it from the shard at open
  int64_t bytes = -1;       ///< file size from index.json, -1: any
  /// Format v2: what the shard's header and footer must say. Unset for version 1.
  std::optional<ShardIdentity> identity;
  /// The whole file's checksum from index.json (checked by Options::preload).
  std::optional<uint32_t> checksum;
};

class Dataset {
 public:
  struct Options {
    /// Check every shard against the index when the dataset is opened (regular
    /// file, size, header, footer, identity; no mapping). Off, each shard is
    /// checked when first used instead, so that a caller can report every bad
    /// shard rather than the first (`stoker inspect --verify`).
    bool probe_on_open = true;
    /// Map and validate every shard now rather than on first use.
    bool map_on_open = false;
    /// The shard files are not there yet (NOTE [ Deferred shards ]): each is
    /// read only after provide(). Implies neither probing nor mapping at open.
    bool deferred = false;
    /// Deferred shards may also be given back (try_release()), so that a cache
    /// smaller than the dataset can evict them: every reader pins the shard it
    /// reads (pin()), and prefetch hints are off. Implies deferred.
    bool releasable = false;
    /// Deferred shards may also be read record by record before they are local,
    /// from bytes the fetcher fetches by range (NOTE [ Records by range ]).
    /// Implies deferred.
    bool record_ranges = false;
    /// Read every shard into anonymous memory now, checking each file's
    /// checksum as it is read (NOTE [ Preloaded shards ] in shard_reader.h):
    /// reads never touch the files again, and forked children share the
    /// memory. Implies map_on_open; not with deferred.
    bool preload = false;
  };

  class ShardPin;

  /// Throws DataError naming the first shard that cannot be opened or does not
  /// match the index (foreign, swapped, stale, truncated, not a regular file).
  Dataset(Schema schema, std::vector<ShardInfo> shards, Options opts);
  Dataset(Schema schema, std::vector<ShardInfo> shards)
      : Dataset(std::move(schema), std::move(shards), Options{}) {}
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  const Schema& schema() const { return schema_; }
  int64_t size() const { return total_; }
  size_t num_shards() const { return infos_.size(); }
  const ShardInfo& shard_info(size_t s) const { return infos_[s]; }
  const std::string& shard_path(size_t s) const { return infos_[s].path; }
  /// Whether the shards were read into memory at open (Options::preload).
  bool in_memory() const { return in_memory_; }
  /// Bytes of memory the preloaded shards take (0 unless in_memory()).
  int64_t memory_bytes() const;

  /// The reader of shard `s`, mapped and validated on first use (thread-safe;
  /// a failed open is retried by the next call). Throws DataError naming the file.
  /// Of a releasable dataset, only while the caller holds a pin of `s`.
  const ShardReader& shard(size_t s) const;
  /// Shard `s`, mapped and held so until the pin is dropped: try_release()
  /// passes it over meanwhile. Waits for a deferred shard as a read does. Every
  /// reader of a releasable dataset reads under a pin; for the others it costs
  /// nothing beyond shard().
  ShardPin pin(size_t s) const;
  /// Whether shard `s` is mapped (without mapping it).
  bool is_mapped(size_t s) const;
  size_t mapped_shards() const;

  struct Location {
    size_t shard;
    int64_t record;  ///< index within the shard
  };
  Location locate(int64_t i) const;

  /// Verified, split fields of sample `i` into `out` (one per field): views
  /// into the shard's mapping, valid while the caller holds a pin of the shard
  /// (releasable datasets; see pin()). DataError names the shard file, the
  /// record and the reason.
  void read(int64_t i, RecordView* out) const { read(locate(i), out); }
  /// read() of a sample already located (a reader that locates each sample
  /// once for its prefetches and its read); `verify` says when the record's
  /// checksum is hashed (NOTE [ Verified once ] in shard_reader.h).
  void read(Location loc, RecordView* out, Verify verify = Verify::kAlways) const;
  /// read() without the record's checksum: its bytes are bounds-checked and split
  /// (DataError on a broken structure) but may be corrupt. For batch planning,
  /// which only sizes a batch from the field lengths; the sample writer's read
  /// then verifies every byte it copies.
  void read_unverified(Location loc, RecordView* out) const;
  /// What a read of the sample at `loc` needs, held: its shard (pin()), or, for
  /// a deferred shard not local yet, the record's bytes fetched by range (NOTE
  /// [ Records by range ]). Waits as a read of a deferred shard waits.
  ShardPin pin_record(Location loc) const;
  /// read() from what pin_record(loc) holds (`held` must be its result); with
  /// Verify::kNever, read_unverified() (records fetched by range were verified
  /// when they arrived).
  void read(const ShardPin& held, Location loc, RecordView* out,
            Verify verify = Verify::kAlways) const;

  /// Throws DataError "<file>: changed on disk while in use" if the shard of
  /// sample `i` was cut short under its mapping (NOTE [ Shards changed under a
  /// reader ] in format/mapped_file.h), so that bytes copied out of it after
  /// their checksum was checked are not trusted. One relaxed load while no
  /// mapping ever faulted: readers call it after using a sample's bytes. (A
  /// shard overwritten in place without being cut short is caught by the next
  /// read of it: read() compares the header.)
  void check_intact(int64_t i) const {
    if (MappedFile::total_faults() != 0) check_intact(locate(i));
  }
  void check_intact(Location loc) const;
  /// The reader of shard `s` if it is mapped, else null (never maps, never
  /// waits): for prefetch hints, so always null where a mapping may be released
  /// under the caller.
  const ShardReader* mapped_reader(size_t s) const {
    if (releasable() || s >= infos_.size()) return nullptr;
    return readers_[s].load(std::memory_order_acquire);
  }

  // -- remote shards: the gate (NOTE [ Deferred shards ] in shard_gate.h) and
  // records by range (NOTE [ Records by range ] in record_ranges.h) ----------

  bool deferred() const { return gate_ != nullptr; }
  bool releasable() const { return gate_ && gate_->releasable(); }
  bool record_ranges() const { return ranges_ != nullptr; }
  /// The gate of a deferred dataset (null otherwise): what the fetcher drives.
  ShardGate* gate() { return gate_.get(); }
  const ShardGate* gate() const { return gate_.get(); }
  /// Asks for the samples `indices` by range where their shards are not local
  /// yet (and not declined), before any reader waits for them: a batch's
  /// planner names all its samples at once, so that the fetcher fetches them
  /// together. Never waits; a no-op without record ranges.
  void want_records(const int64_t* indices, size_t n) const;
  /// Records readers wait for, as (shard, record), each once; taken (cleared).
  std::vector<std::pair<size_t, int64_t>> take_record_demands();
  /// The header (`head`, the first bytes) and record table with footer (`tail`,
  /// the last bytes) of shard `s`, fetched by range; `url` names it in errors.
  /// DataError if they do not match index.json (then call no_ranges(s)).
  void provide_table(size_t s, const std::string& url, const uint8_t* head, size_t head_len,
                     const uint8_t* tail, size_t tail_len);
  /// Bytes of record `r` of shard `s` (after provide_table): checked against the
  /// table (DataError naming the URL and record), kept until the shard is
  /// provided, and handed to the readers waiting for it.
  void provide_record(size_t s, int64_t r, const uint8_t* data, size_t len);
  /// Shard `s` is not served by range: its readers wait for the whole shard.
  void no_ranges(size_t s);
  /// Records held for readers now (buffered by range), and their bytes.
  std::pair<int64_t, int64_t> buffered_records() const;
  /// Releasable datasets: unmaps shard `s` and makes it pending again, unless a
  /// reader holds it (or it is not provided): then false, and nothing changes.
  bool try_release(size_t s);
  /// Shard `s` is local at its path: readers may map it (ShardGate::provide),
  /// and its records buffered by range go.
  void provide(size_t s);
  /// Shard `s` cannot be fetched: its readers raise FetchError(`why`).
  void fail(size_t s, const std::string& why) { checked_gate(s, "fail").fail(s, why); }
  /// A failed shard is pending again (ShardGate::reset).
  bool reset(size_t s) { return checked_gate(s, "reset").reset(s); }
  /// Readers' pins of shard `s` now (0 unless releasable).
  int pins(size_t s) const { return gate_ && s < infos_.size() ? gate_->pins(s) : 0; }
  /// Shards readers wait for, in the order they first asked.
  std::vector<size_t> demands() const { return gate_ ? gate_->demands() : std::vector<size_t>{}; }
  /// Seconds readers have spent waiting for shards to be provided.
  double gate_wait_seconds() const { return gate_ ? gate_->wait_seconds() : 0.0; }

  /// Keeps `fd` open until the dataset is destroyed: the reader lease on the
  /// dataset's generation (python/stoker/writer.py), which stops a later write
  /// from removing the files this dataset maps on first use.
  void hold_lease(int fd);

 private:
  friend class ShardPin;
  void unpin(size_t s) const noexcept { gate_->leave(s); }
  ShardGate& checked_gate(size_t s, const char* what) const;
  // Options::preload: every shard read into memory now, several at a time.
  void load_all();

  Schema schema_;
  std::vector<ShardInfo> infos_;
  std::vector<int64_t> starts_;  // first global index of each shard
  int64_t total_ = 0;
  bool in_memory_ = false;  // Options::preload
  std::unique_ptr<std::atomic<const ShardReader*>[]> readers_;
  mutable std::vector<std::unique_ptr<ShardReader>> owned_;  // slot s guarded by stripes_[s]
  mutable detail::StripedMutex stripes_;
  int lease_fd_ = -1;
  std::unique_ptr<ShardGate> gate_;       // null unless deferred
  std::unique_ptr<RecordRanges> ranges_;  // null unless record_ranges
};

/// A shard held mapped (Dataset::pin). Movable; drops the hold when destroyed.
class Dataset::ShardPin {
 public:
  ShardPin() = default;
  ShardPin(ShardPin&& o) noexcept
      : ds_(o.ds_), s_(o.s_), r_(o.r_), record_(std::move(o.record_)), counted_(o.counted_) {
    o.ds_ = nullptr;
    o.r_ = nullptr;
    o.counted_ = false;
  }
  ShardPin& operator=(ShardPin&& o) noexcept {
    if (this != &o) {
      reset();
      ds_ = o.ds_, s_ = o.s_, r_ = o.r_, counted_ = o.counted_;
      record_ = std::move(o.record_);
      o.ds_ = nullptr;
      o.r_ = nullptr;
      o.counted_ = false;
    }
    return *this;
  }
  ShardPin(const ShardPin&) = delete;
  ShardPin& operator=(const ShardPin&) = delete;
  ~ShardPin() { reset(); }

  /// The shard's reader (null when this holds a record fetched by range).
  const ShardReader& reader() const { return *r_; }
  /// The record's bytes fetched by range (NOTE [ Records by range ]), or null.
  const std::vector<uint8_t>* record_bytes() const { return record_.get(); }
  size_t shard() const { return s_; }
  bool holds(size_t s) const { return r_ != nullptr && s_ == s; }
  void reset() noexcept {
    if (counted_) ds_->unpin(s_);
    ds_ = nullptr;
    r_ = nullptr;
    record_.reset();
    counted_ = false;
  }

 private:
  friend class Dataset;
  const Dataset* ds_ = nullptr;
  size_t s_ = 0;
  const ShardReader* r_ = nullptr;
  std::shared_ptr<const std::vector<uint8_t>> record_;
  bool counted_ = false;  // a count in Dataset::pins_ to give back
};

}  // namespace stoker
