// A read-only mapping of a whole file that survives the file being cut short.
//
// NOTE [ Shards changed under a reader ]
// A MAP_SHARED mapping shows the file as it is now, not as it was when mapped.
// If the file is truncated (or rewritten in place: `cp` truncates first) while
// mapped, touching a page past the new end raises SIGBUS, whose default action
// kills the process with no traceback. stoker never changes a shard in place
// (a rewrite is a new generation of files, see python/stoker/writer.py), but a
// user's `cp -r new/. data/` does exactly that. So:
//
//   - every MappedFile registers its address range in a process-wide table
//     that a SIGBUS handler can read without locks (fixed slots of atomics);
//   - the handler, installed when the first file is mapped and chained to the
//     handler it replaces, looks the faulting address up: inside one of our
//     mappings, it maps an anonymous zero page over the faulting page
//     (MAP_FIXED), counts the fault on that mapping and returns, so the read
//     goes on and sees zeros; anywhere else, it passes the signal on to the
//     previous handler (or the default action) unchanged;
//   - zeros fail the record checksums, and readers ask faulted() (and the loader,
//     after each sample, Dataset::check_intact) so the damage is reported as a
//     DataError "changed on disk while in use" in the thread that reads, never
//     as a dead process.
//
//   worker thread                     kernel / handler
//   -------------                     ----------------
//   checksum32(record) -- touches a page past EOF --> SIGBUS
//                                     on_sigbus: address in slot k?
//                                       yes: mmap zero page, slots[k].faults++
//                                       no:  previous handler / default action
//   <-- the load resumes, reads zeros
//   checksum mismatch, faulted() -> DataError "changed on disk while in use"
//
// Someone installing their own SIGBUS handler later (Python's faulthandler does
// on enable()) would shadow ours; each new mapping re-installs ours on top if
// it is gone, chaining to the newcomer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace stoker {

class MappedFile {
 public:
  /// Maps the first `size` bytes (> 0) of `fd` read-only. The fd may be closed
  /// afterwards. Throws DataError naming `path`; running out of mappings names
  /// vm.max_map_count.
  MappedFile(int fd, size_t size, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return base_; }
  size_t size() const { return size_; }

  /// True once a read of this mapping touched a page the file no longer has
  /// (truncated while mapped): from then on those pages read as zeros.
  bool faulted() const;

  /// Sets up the page tables of bytes [offset, offset + len) so that reading
  /// them takes no page fault (MADV_POPULATE_READ; a read per page where the
  /// kernel lacks it), reading from the file what the page cache does not
  /// hold. In slices, returning early once `stop` is set. Never throws: pages
  /// it could not populate are faulted in by their readers as before.
  /// @return bytes populated
  size_t populate(size_t offset, size_t len,
                  const std::atomic<bool>* stop = nullptr) const noexcept;

  /// Faults absorbed in this process so far, over all mappings: 0 on the normal
  /// path, so checking it costs one relaxed load.
  static uint64_t total_faults();
  /// Live mappings of this kind in the process.
  static size_t live_mappings();

 private:
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* slot_ = nullptr;  // the registry entry (detail in mapped_file.cpp)
};

}  // namespace stoker
