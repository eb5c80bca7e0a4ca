#pragma once

// The decoded cache's layout in memory (NOTE [ Decoded cache ] in
// cache/decoded_cache.cpp): its constants, the header and an entry's head, where
// each part lies, a mapping of it (DecodedCache::Region), how a header is
// written and checked, and the process slots.

#include <sys/mman.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "cache/decoded_cache.h"
#include "common/cache_line.h"

namespace stoker::cache_layout {

inline constexpr char kMagic[8] = {'S', 'T', 'K', 'D', 'C', 'A', 'C', '2'};
inline constexpr uint32_t kVersion = 2;
inline constexpr uint64_t kReady = 0x5245414459ull;  // "READY": the layout is written
inline constexpr uint64_t kPage = 4096;
inline constexpr uint64_t kEntryAlign = 64;
inline constexpr uint64_t kHeadBytes = 64;
inline constexpr uint64_t kChunk = uint64_t{32} << 20;  // bytes fallocate()d at a time
// Process slots (NOTE [ Decoded cache ]): their lock bytes, and a claim word's fields.
inline constexpr uint64_t kProcessSlots = 1024;
inline constexpr off_t kSlotLockByte = 2;
inline constexpr int kHolderShift = 12;  // holder count << 12 | slot << 2 | kClaimed
static_assert(kProcessSlots << 2 == uint64_t{1} << kHolderShift, "a claim's slot bits");
// The most slots (images) a cache has: its index stays far from overflowing.
inline constexpr uint64_t kMaxSlots = uint64_t{1} << 40;

// The low two bits of an entry's word.
inline constexpr uint64_t kEmpty = 0, kClaimed = 1, kPublished = 2;

inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct EntryHead {
  uint64_t key;  // the entry's word index + 1
  int32_t w, h, full_w, full_h;
  uint64_t sum;  // entry_sum(): of the fields above and the pixels
  uint64_t reserved[4];
};
static_assert(sizeof(EntryHead) == kHeadBytes, "an entry's head is one cache line");

// The checksum of an entry: of its head's fields and its pixels (NOTE [ Cache trust ]).
uint64_t entry_sum(const EntryHead& e, const uint8_t* pixels, size_t n);

// Where each part of a cache of `slots` x `variants` in `budget` bytes lies.
struct Layout {
  uint64_t procs, words, marks, data, data_bytes;
};

Layout layout_of(uint64_t slots, uint64_t variants, uint64_t budget);

// The layout's sizes and offsets, part of the file's name and header: two
// builds whose structs differ never share a file, whatever kVersion says.
uint64_t layout_fingerprint();

// A new layout of `o` at `h` (counters zero; `ready` is the caller's to set).
void write_layout(DecodedCache::Header* h, const DecodedCacheOptions& o, const Layout& l);

// Every field of the header against what this process computes for `o` (NOTE
// [ Cache trust ]): the offsets it maps are its own, and a header that says
// anything else is not this cache's (another build, another cache, or damage).
bool layout_matches(const DecodedCache::Header* h, const DecodedCacheOptions& o, const Layout& l);

// Locks a free process slot of the file open at `fd` and counts this holder
// there: the claim word of the slot (NOTE [ Decoded cache ]), or 0 when every
// slot is held.
uint64_t take_slot(DecodedCache::Region& r, int fd);

}  // namespace stoker::cache_layout

namespace stoker {

struct DecodedCache::Header {
  char magic[8];
  uint32_t version;
  uint32_t variants;
  uint64_t layout;  // layout_fingerprint(): the sizes and offsets of this build's structs
  uint64_t identity;
  uint64_t slots;
  uint64_t total_bytes;
  uint64_t procs_offset;
  uint64_t words_offset;
  uint64_t marks_offset;
  uint64_t data_offset;
  uint64_t data_bytes;
  int64_t max_side;
  std::atomic<uint64_t> ready;                         // kReady once the layout above is written
  alignas(kCacheLineSize) std::atomic<uint64_t> used;  // entry bytes handed out
  alignas(kCacheLineSize) std::atomic<uint64_t> reserved;  // entry bytes backed (fallocate)
  std::atomic<uint64_t> full;                              // an entry found no room
  alignas(kCacheLineSize) std::atomic<uint64_t> entries;
  std::atomic<uint64_t> images;  // slots with an entry
};
static_assert(sizeof(DecodedCache::Header) <= cache_layout::kPage, "the header fits its page");
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint8_t>::is_always_lock_free,
              "atomics in memory shared between processes must be lock-free (address-free)");

// One mapping of the layout: the shared file's, or private memory's.
struct DecodedCache::Region {
  uint8_t* base = nullptr;
  size_t size = 0;
  Header* header = nullptr;
  std::atomic<uint64_t>* holders = nullptr;  // per process slot (NOTE [ Decoded cache ])
  std::atomic<uint64_t>* words = nullptr;    // slots * variants
  std::atomic<uint8_t>* marks = nullptr;     // per slot: has an entry
  uint8_t* data = nullptr;
  uint64_t data_bytes = 0;
  uint64_t data_offset = 0;
  size_t nwords = 0;
  int fd = -1;                                 // the shared file; -1: private memory
  mutable std::atomic<uint64_t> populated{0};  // data bytes in this process's page tables
  // One bit per entry word: its checksum matched in this mapping (NOTE [ Cache trust ]).
  std::unique_ptr<std::atomic<uint64_t>[]> checked;

  Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  ~Region() {
    if (base) ::munmap(base, size);
  }
  bool shared() const { return fd >= 0; }

  // Points at the parts of `l` in [base, base + size).
  void lay(const cache_layout::Layout& l, uint64_t slots, uint64_t variants);
  bool is_checked(size_t i) const noexcept {
    return (checked[i >> 6].load(std::memory_order_relaxed) >> (i & 63)) & 1;
  }
  void set_checked(size_t i) const noexcept {
    checked[i >> 6].fetch_or(uint64_t{1} << (i & 63), std::memory_order_relaxed);
  }

  // Maps data [0, upto) into this process's page tables (NOTE [ Decoded cache ]).
  void populate(uint64_t upto, bool write) const noexcept;

  // Backs data [0, end) with memory (fallocate) before anything writes there.
  bool reserve(uint64_t end);

  // Room for `bytes` more entry bytes; UINT64_MAX when there is none.
  uint64_t allocate(uint64_t bytes);
};

}  // namespace stoker
