// One shard file: checked against index.json without mapping it (probe_shard,
// O(1): header and footer), or mapped and fully validated (ShardReader: also
// the record table, so later reads only need the per-record checksum).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "format/mapped_file.h"
#include "format/shard_expectation.h"
#include "format/shard_format.h"
#include "format/shard_identity.h"

namespace stoker {

/// Bytes of one record inside the mapping.
struct RecordView {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// NOTE [ Verified once ]
// A record's checksum proves that the bytes under the mapping are the bytes
// written. Once a read has proven it, hashing the record again on every later
// read mostly costs time (a whole epoch of small records spends about a sixth
// of it there). So with Verify::kFirst (the loader's default) a read hashes a
// record the first time this process reads it from this mapping and sets its
// bit beside the mapping (ShardReader::verified_, one bit per record); later
// reads skip the hash. A shard mapped again (a remote shard given back and
// fetched anew) starts with no bits. Verify::kAlways hashes on every read
// (Loader(verify="always")).
//
// What a skipped hash could miss is the file changed under the mapping after
// its record was verified: a same-size overwrite of a payload in place keeps
// the table's bounds and the header, and the mapping shows the new bytes. So
// a read that would skip the hash first makes sure the file is still the one
// verified: once per check round (each epoch a loader starts begins one, and so
// does a batch planned a second or more into a round: common/file_checks.h), one
// thread stats the path and compares it with what it found last time (device,
// inode, size, modification and change times, to the nanosecond); if anything
// differs, every bit of the mapping is cleared, so each record is hashed again on
// its next read, and a changed one raises DataError naming it ("changed on disk
// while in use"). A change made since the last check is caught in the epoch
// after it at the latest, or once a second has passed while batches are
// planned. A read compares two counters; the clock is read once per batch
// planned, not per record. What the stat misses (a write that leaves every
// time stamp as it was, a page read back wrong from a failing disk after the
// page cache dropped it) needs Verify::kAlways. The rest is caught on every
// read either way: the table entry's bounds, the header compare, the fault
// count (NOTE [ Shards changed under a reader ] in mapped_file.h).
//
// A version-1 shard carries no identity in its header, so a rewrite of it by
// another dataset of the same schema and size is told by nothing but its
// records' hashes: kFirst verifies its records on every read, as kAlways does;
// kOnce (Loader(verify="once")) is kFirst for every version, for a user who
// keeps version-1 data and wants the speed (the stat checks still run).

/// How a read checks a record's checksum (NOTE [ Verified once ]).
enum class Verify : uint8_t {
  kNever,   ///< bounds and structure only (sizing a batch; records by range, checked on arrival)
  kFirst,   ///< the first read of the record from this mapping, again after the file changed;
            ///< every read of a version-1 shard
  kAlways,  ///< every read
  kOnce,    ///< kFirst for every format version (version-1 shards too)
};

/// The file a shard was when it was opened, to tell later whether it changed.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileStamp& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns &&
           ctime_ns == o.ctime_ns;
  }
  bool operator!=(const FileStamp& o) const { return !(*this == o); }
};

/// Header, footer and file of a shard that passed probe_shard.
struct ShardProbe {
  format::ShardHeader header;
  format::ShardFooter footer;
  FileStamp stamp;
};

/// Opens `path` and checks it against `expect` from its header and footer only
/// (two small reads, whatever the shard's size): a regular file (FIFOs, devices
/// and directories are refused, and opening never blocks), the size, magic,
/// checksums, version, schema hash, record count and, for version 2, the
/// identity. Throws DataError naming the file and what does not match.
/// @param fd_out if non-null, receives the open descriptor (the caller closes
///   it); otherwise it is closed.
ShardProbe probe_shard(const std::string& path, const ShardExpectation& expect,
                       int* fd_out = nullptr);

// NOTE [ Preloaded shards ]
// A shard read kInMemory is copied once into anonymous shared memory
// (MappedFile::load) instead of being mapped: for datasets small enough to
// hold, or on a filesystem too slow to map (a network mount), read whole at
// open (stoker.Dataset(..., preload=True)). Everything else is the same: the
// record table is validated, every read verifies its record's checksum, and
// the file's checksum is computed as it is read (load_checksum(), checked
// against index.json by the Dataset). The copy never changes, so the checks
// for a file changed under its mapping are off; a forked child shares the
// pages (MAP_SHARED), and no page of it is ever copied.
class ShardReader {
 public:
  enum Source { kMapped, kInMemory };
  /// Probes `path` (see probe_shard), maps it (or reads it into memory:
  /// NOTE [ Preloaded shards ]) and validates the record table. Throws
  /// DataError naming the file and the reason.
  ShardReader(std::string path, const ShardExpectation& expect, Source source = kMapped);
  /// Shorthand without identity: schema hash, record count and size (-1: any).
  ShardReader(std::string path, uint64_t expected_schema_hash, int64_t expected_records,
              int64_t expected_bytes);
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_records() const { return num_records_; }
  size_t file_size() const { return size_; }
  uint32_t num_fields() const { return num_fields_; }
  uint32_t version() const { return version_; }
  const format::ShardHeader& header() const { return header_; }
  uint32_t table_sum() const { return table_sum_; }
  /// The file as it was when opened.
  const FileStamp& stamp() const { return stamp_; }
  /// Whether the shard was read into memory (kInMemory).
  bool in_memory() const { return map_->in_memory(); }
  /// kInMemory: checksum32 of the whole file, computed as it was read.
  uint32_t load_checksum() const { return load_sum_; }

  /// Record `i` after checking its checksum and that the shard's header is still
  /// the one opened. DataError naming file and record on a mismatch: "changed on
  /// disk while in use" when the file changed after it was opened
  /// (changed_on_disk()), "corrupt data" otherwise.
  RecordView record(int64_t i) const { return record(i, Verify::kAlways); }
  /// record(i), hashing the record only as `verify` says (NOTE [ Verified once ]):
  /// kFirst skips the hash once a read of this reader has verified record `i`.
  RecordView record(int64_t i, Verify verify) const;
  /// Whether a read has verified record `i` since the file last changed (kFirst
  /// skips its hash then).
  bool verified(int64_t i) const noexcept {
    return i >= 0 && i < num_records_ &&
           (verified_[static_cast<size_t>(i) >> 6].load(std::memory_order_relaxed) >> (i & 63)) & 1;
  }
  /// Record `i` without the checksum. Its table entry is still bounds-checked
  /// against the mapping on every call, so a file rewritten in place under us
  /// gives a DataError, never a read outside the mapping.
  RecordView record_unchecked(int64_t i) const;
  /// record_unchecked(i), or an empty view where it would throw (for prefetch hints).
  RecordView record_unchecked_or_empty(int64_t i) const noexcept {
    if (i < 0 || i >= num_records_) return {};
    format::RecordEntry e;
    std::memcpy(&e, table_ + i, sizeof e);
    if (e.offset < sizeof(format::ShardHeader) || e.offset > table_offset_ ||
        e.length > table_offset_ - e.offset)
      return {};
    return {base_ + e.offset, static_cast<size_t>(e.length)};
  }
  /// Starts loading record `i`'s table entry into cache (no effect out of range).
  void prefetch_entry(int64_t i) const noexcept {
    if (i >= 0 && i < num_records_) __builtin_prefetch(table_ + i, 0, 3);
  }
  /// The checksum the record table stores for record `i` (bounds-checked as record_unchecked).
  uint32_t record_sum(int64_t i) const;
  /// checksum32 of the whole file (reads every byte).
  uint32_t file_checksum() const;
  /// The bytes of all records, back to back: [end of header, table offset).
  RecordView records_region() const;

  /// The mapping of the whole file (to populate its page tables ahead of readers).
  const MappedFile& mapping() const { return *map_; }

  /// A page of the mapping vanished under a read (the file was cut short).
  /// One relaxed load.
  bool faulted() const { return map_->faulted(); }
  /// The mapped header differs from the one checked at open (the file was
  /// overwritten in place). One 64-byte compare.
  bool header_changed() const;
  /// faulted(), header_changed(), or the file at path() is no longer the one
  /// mapped (another inode, size or modification time). Costs a stat: for error
  /// paths.
  bool changed_on_disk() const;
  /// Throws DataError "<path>: record <i>: changed on disk while in use (<what>)".
  [[noreturn]] void throw_changed(int64_t record, const std::string& what) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  int64_t num_records_ = 0;
  uint32_t num_fields_ = 0;
  uint32_t version_ = 0;
  uint64_t table_offset_ = 0;
  uint32_t table_sum_ = 0;
  format::ShardHeader header_{};
  FileStamp stamp_;
  const format::RecordEntry* table_ = nullptr;
  uint32_t load_sum_ = 0;
  // One bit per record, set once its checksum matched (NOTE [ Verified once ]).
  std::unique_ptr<std::atomic<uint64_t>[]> verified_;
  // The file as the last check found it, and that check's round; the mutex is
  // held by the one thread that checks.
  mutable std::mutex check_mu_;
  mutable FileStamp checked_stamp_;
  mutable std::atomic<uint64_t> checked_round_{0};
  // Whether the file is due a check (NOTE [ Verified once ]): two relaxed loads.
  bool check_due() const noexcept;
  // Stats the file; if it changed since the last check, clears every verified
  // bit. False when another thread is checking it now (the caller hashes).
  bool check_file() const;
};

}  // namespace stoker
