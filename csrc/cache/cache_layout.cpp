#include "cache/cache_layout.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "cache/cache_file.h"
#include "common/checksum.h"
#include "sampler/permutation.h"

namespace stoker::cache_layout {

uint64_t entry_sum(const EntryHead& e, const uint8_t* pixels, size_t n) {
  uint64_t h = hash_combine(e.key, uint64_t(uint32_t(e.w)) << 32 | uint32_t(e.h));
  h = hash_combine(h, uint64_t(uint32_t(e.full_w)) << 32 | uint32_t(e.full_h));
  return hash_combine(h, checksum32(pixels, n));
}

Layout layout_of(uint64_t slots, uint64_t variants, uint64_t budget) {
  Layout l;
  l.procs = kPage;
  l.words = l.procs + round_up(kProcessSlots * 8, kPage);
  l.marks = l.words + round_up(slots * variants * 8, kPage);
  l.data = l.marks + round_up(slots, kPage);
  l.data_bytes = budget > l.data ? (budget - l.data) / kEntryAlign * kEntryAlign : 0;
  return l;
}

uint64_t layout_fingerprint() {
  using H = DecodedCache::Header;
  const uint64_t parts[] = {kVersion,
                            sizeof(H),
                            offsetof(H, layout),
                            offsetof(H, procs_offset),
                            offsetof(H, max_side),
                            offsetof(H, ready),
                            offsetof(H, used),
                            offsetof(H, reserved),
                            offsetof(H, full),
                            offsetof(H, entries),
                            offsetof(H, images),
                            sizeof(EntryHead),
                            offsetof(EntryHead, sum),
                            kHeadBytes,
                            kEntryAlign,
                            kPage,
                            kProcessSlots,
                            static_cast<uint64_t>(kSlotLockByte),
                            static_cast<uint64_t>(kHolderShift)};
  uint64_t h = 0x6c61796f7574ull;  // "layout"
  for (uint64_t p : parts) h = hash_combine(h, p);
  return h;
}

void write_layout(DecodedCache::Header* h, const DecodedCacheOptions& o, const Layout& l) {
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->version = kVersion;
  h->variants = static_cast<uint32_t>(o.variants);
  h->layout = layout_fingerprint();
  h->identity = o.identity;
  h->slots = static_cast<uint64_t>(o.slots);
  h->total_bytes = static_cast<uint64_t>(o.budget);
  h->procs_offset = l.procs;
  h->words_offset = l.words;
  h->marks_offset = l.marks;
  h->data_offset = l.data;
  h->data_bytes = l.data_bytes;
  h->max_side = o.max_side;
  h->used.store(0, std::memory_order_relaxed);
  h->reserved.store(0, std::memory_order_relaxed);
  h->full.store(0, std::memory_order_relaxed);
  h->entries.store(0, std::memory_order_relaxed);
  h->images.store(0, std::memory_order_relaxed);
}

bool layout_matches(const DecodedCache::Header* h, const DecodedCacheOptions& o, const Layout& l) {
  return std::memcmp(h->magic, kMagic, sizeof kMagic) == 0 && h->version == kVersion &&
         h->layout == layout_fingerprint() && h->variants == static_cast<uint32_t>(o.variants) &&
         h->identity == o.identity && h->slots == static_cast<uint64_t>(o.slots) &&
         h->total_bytes == static_cast<uint64_t>(o.budget) && h->procs_offset == l.procs &&
         h->words_offset == l.words && h->marks_offset == l.marks && h->data_offset == l.data &&
         h->data_bytes == l.data_bytes && h->max_side == o.max_side &&
         h->ready.load(std::memory_order_acquire) == kReady;
}

uint64_t take_slot(DecodedCache::Region& r, int fd) {
  const uint64_t start = static_cast<uint64_t>(::getpid()) % kProcessSlots;
  for (uint64_t i = 0; i < kProcessSlots; ++i) {
    const uint64_t k = (start + i) % kProcessSlots;
    if (!ofd_lock(fd, F_WRLCK, kSlotLockByte + static_cast<off_t>(k), false)) continue;
    const uint64_t count = r.holders[k].fetch_add(1, std::memory_order_acq_rel) + 1;
    return count << kHolderShift | k << 2 | kClaimed;
  }
  return 0;
}

}  // namespace stoker::cache_layout

namespace stoker {

using cache_layout::kChunk;
using cache_layout::kPage;
using cache_layout::round_up;

void DecodedCache::Region::lay(const cache_layout::Layout& l, uint64_t slots, uint64_t variants) {
  header = reinterpret_cast<Header*>(base);
  holders = reinterpret_cast<std::atomic<uint64_t>*>(base + l.procs);
  words = reinterpret_cast<std::atomic<uint64_t>*>(base + l.words);
  marks = reinterpret_cast<std::atomic<uint8_t>*>(base + l.marks);
  data = base + l.data;
  data_offset = l.data;
  data_bytes = l.data_bytes;
  nwords = static_cast<size_t>(slots * variants);
  checked = std::make_unique<std::atomic<uint64_t>[]>((nwords + 63) / 64);
}

void DecodedCache::Region::populate(uint64_t upto, bool write) const noexcept {
  upto = std::min(upto, data_bytes);
  uint64_t have = populated.load(std::memory_order_relaxed);
  if (upto <= have) return;
  // One thread maps the stretch; the others read on meanwhile (and fault as they go).
  if (!populated.compare_exchange_strong(have, upto, std::memory_order_relaxed)) return;
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
  const uint64_t from = have / kPage * kPage, to = round_up(upto, kPage);
  ::madvise(data + from, to - from, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#else
  (void)write;
#endif
}

bool DecodedCache::Region::reserve(uint64_t end) {
  if (!shared()) {  // private memory: the budget bounds it; mapped a chunk at a time
    populate(round_up(end, kChunk), true);
    return true;
  }
  uint64_t r = header->reserved.load(std::memory_order_acquire);
  if (r > data_bytes) return false;  // not a count this layout can have: nothing is backed
  if (end <= r) return true;
  // A chunk at a time; near a full file system, what this entry needs alone.
  // Overlapping calls from several processes are fine: backed bytes stay backed.
  uint64_t to = std::min(data_bytes, round_up(end, kChunk));
  auto back = [&](uint64_t upto) {
    return ::posix_fallocate(fd, static_cast<off_t>(data_offset + r),
                             static_cast<off_t>(upto - r)) == 0;
  };
  if (!back(to)) {
    to = std::min(data_bytes, round_up(end, kPage));
    if (!back(to)) return false;
  }
  while (r < to && !header->reserved.compare_exchange_weak(r, to, std::memory_order_acq_rel)) {
  }
  populate(to, true);  // this process writes there next
  return true;
}

uint64_t DecodedCache::Region::allocate(uint64_t bytes) {
  uint64_t u = header->used.load(std::memory_order_relaxed);
  do {
    // `used` is read from the shared file: one that is not a multiple of the entry
    // alignment was not written by a stoker of this layout (NOTE [ Cache trust ]), and
    // nothing more is allocated after it.
    if (u > data_bytes || data_bytes - u < bytes || u % cache_layout::kEntryAlign != 0) {
      header->full.store(1, std::memory_order_relaxed);
      return UINT64_MAX;
    }
  } while (!header->used.compare_exchange_weak(u, u + bytes, std::memory_order_relaxed));
  if (!reserve(u + bytes)) {  // the file system is full: this room stays unused
    header->full.store(1, std::memory_order_relaxed);
    return UINT64_MAX;
  }
  return u;
}

}  // namespace stoker
