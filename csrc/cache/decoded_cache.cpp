#include "cache/decoded_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "cache/cache_file.h"
#include "cache/cache_layout.h"
#include "common/checksum.h"
#include "common/error.h"
#include "sampler/permutation.h"

namespace stoker {

// NOTE [ Decoded cache ]
// One cache is one region of memory: a file in /dev/shm that every process
// reading the same dataset with the same cache parameters maps (a private
// anonymous mapping when that cannot be had), laid out as
//
//   +--------+-----------------+--------------------------+--------------+---------------------+
//   | header | process slots:  | words: slots x variants  | marks: slots | entries, handed out |
//   | 4 KiB  | 1024 x 8, each  | x 8, one per entry: the  | 1 byte each: | in order by one     |
//   |        | slot's holder   | entry's sequence word    | has an entry | bump pointer: 64-   |
//   |        | count           |                          |              | byte head, pixels   |
//   +--------+-----------------+--------------------------+--------------+---------------------+
//   |<----------------------------- budget bytes, the file's size ------------------------------>|
//
// A slot is one image (record x image fields + field); its variants are the
// JPEG DCT scales 1/8, 2/8, 4/8 and 8/8 (NOTE [ Exact pixels ] in
// geometry/canvas.cpp), or the one reduced copy of cache_max_side.
//
// Entries are written once and never moved, rewritten or freed: what does not
// fit the budget is decoded as without a cache. So an entry's word is a
// seqlock whose writer publishes once: it goes
//
//   0 (empty)  --claim-->  holder << 12 | slot << 2 | 1 (being written)  --publish-->  offset/64 <<
//   2 | 2
//
// A writer claims the word (CAS from 0), takes room from the bump pointer,
// writes the head and the pixels with plain stores, and publishes with a
// release CAS from its own claim. A reader does one acquire load: an even,
// published word means the head and every pixel before it are written, and
// they never change afterwards, so the reader needs neither a lock nor the
// second look of a seqlock whose writers come back. A claim is all a writer
// that dies mid-insert leaves: readers take an odd word for a miss (and decode
// as without a cache), and the next writer that finds the claiming process
// gone claims the word anew and writes into new room; the dead writer's room is
// never published.
//
// Who holds a claim is told by the kernel, not by a pid (a pid is reused, and
// means another process in another pid namespace: containers that share
// /dev/shm). Every process that maps the file takes one of 1024 process slots:
// it locks the slot's byte of the file (byte 2 + slot, an open-file-description
// lock, which the kernel drops when the process dies however it dies) and adds
// one to the slot's holder count in the file. A claim word carries the slot and
// that count; it is stale when the slot's count moved on (a later process took
// the slot) or when nobody holds the slot's lock (F_OFD_GETLK). A forked child
// opens the file again and takes a slot of its own before it claims anything
// (its parent's lock is shared with it, so it could tell neither its parent's
// claims nor its own apart). A writer taken for dead that was alive after all
// loses its publishing CAS and leaves its room unused: no word ever points at
// room two writers wrote. Every published entry's head repeats its word's
// index, and a reader checks it and the bounds before using the pixels.
//
// The region is backed as it is handed out, and mapped into a process's page
// tables a stretch at a time (MADV_POPULATE_*: an image is hundreds of pages,
// each a fault of its own otherwise, which made a first epoch's inserts cost
// as much as a third of the decode). A shared file is fallocate()d a chunk at a
// time before any byte of the chunk is written, so a /dev/shm that
// fills up (other files grow there) makes an insert fail (the image is decoded
// as without a cache) instead of the store raising SIGBUS. A /dev/shm without
// room for the whole budget when the cache is created gives private caches
// instead, of private_budget bytes each.
//
// NOTE [ Cache lifetime ]
// The file lives in a folder of the user's own, <dir>/stoker-<uid> (NOTE
// [ Cache trust ]); its name carries the dataset's identity, the cache's
// parameters and the layout (DecodedCache::file_name), so another dataset, a
// dataset rewritten since, other parameters or another build's layout never
// meet it. Processes coordinate with open-file-description locks on the file,
// which the kernel drops when a process dies however it dies:
//
//   byte 0        the door: held exclusively while a process joins or leaves
//   byte 1        attached: every process that maps the file holds it shared
//   byte 2 + k    process slot k: held exclusively by the process in it
//
// Joining takes the door, then tries byte 1 exclusively: if that succeeds no
// process maps the file (it was just created, or every user of it is gone),
// so it is emptied and laid out anew, and the lock is turned into a shared
// one (an atomic conversion for these locks). Otherwise the file is in use by
// live processes: the joiner takes byte 1 shared and checks the header.
// Leaving takes the door, and the process that can turn its shared lock into
// an exclusive one is the last: it removes the file. A file whose last user
// was killed stays until the next process that joins any cache removes it
// (it sweeps the files of its folder that nobody holds). A forked child shares
// its parent's lock on byte 1 and never removes the file.
//
// NOTE [ Cache trust ]
// What another local user could do to a file of a known name in /dev/shm (a
// sticky, world-writable folder): create it first with mode 0666, then read
// every cached image and change them under the job (fs.protected_regular=0,
// the kernel's default, lets the job open a file another user made there),
// cut it short (SIGBUS in the job), or hold its lock bytes (30 s waits). So, as
// CPython's multiprocessing.shared_memory and glibc's shm_open keep a segment
// from other users (O_EXCL, mode 0600), the file is made where only its user
// can make files: <dir>/stoker-<uid>, created with mode 0700 and opened with
// O_NOFOLLOW; its owner and mode are checked on the open folder (fstat: no
// window between a check and the open), and the file is opened inside it
// (openat, O_NOFOLLOW) and checked again on every join: a regular file of this
// user, no group or other bits, one link, the budget's size, and a header that
// matches this cache's layout field by field (the layout is computed here,
// never read from the file). A folder or a file that fails is never used: the
// process keeps a private cache and the loader says why once. Another user can
// then only make the job use private memory (by creating the folder first),
// never see or change its pixels.
//
// Nothing read from the mapping is trusted before it is checked: a published
// word's offset, the entry's head (its word's index, its sizes, the bytes
// they take) against the mapping's bounds, the header's counters against the
// data region; and every entry carries a checksum of its head and pixels
// (checksum32, the records' hash), written by its writer and checked the first
// time this process reads the entry from this mapping (every read with
// verify="always"), as records are (NOTE [ Verified once ] in
// format/shard_reader.h). The writer's own entries count as checked: it hashed
// the bytes it had just written. An entry that fails (a stray write into the
// segment, a bug, a same-user process that wrote garbage) makes this process
// leave the shared cache for a private one (DecodedCache::leave): the images
// are decoded again, the loader says why once, and nothing is ever read from
// the shared mapping again. Readers that hold an entry's pixels when it is
// left keep reading them (the mapping stays until the cache is dropped).

using cache_layout::entry_sum;
using cache_layout::EntryHead;
using cache_layout::kClaimed;
using cache_layout::kEmpty;
using cache_layout::kEntryAlign;
using cache_layout::kHeadBytes;
using cache_layout::kHolderShift;
using cache_layout::kMaxSlots;
using cache_layout::kPage;
using cache_layout::kProcessSlots;
using cache_layout::kPublished;
using cache_layout::kReady;
using cache_layout::kSlotLockByte;
using cache_layout::Layout;
using cache_layout::layout_fingerprint;
using cache_layout::layout_of;
using cache_layout::round_up;
using cache_layout::take_slot;
using cache_layout::write_layout;

int64_t DecodedCache::index_bytes(int64_t slots, int variants) {
  const uint64_t s = static_cast<uint64_t>(std::clamp<int64_t>(slots, 0, kMaxSlots));
  return static_cast<int64_t>(layout_of(s, static_cast<uint64_t>(std::max(variants, 1)), 0).data);
}

std::string DecodedCache::private_dir(const std::string& dir) {
  return dir + "/stoker-" + std::to_string(::geteuid());
}

std::string DecodedCache::file_name(const DecodedCacheOptions& o) {
  const uint64_t key[6] = {o.identity,
                           static_cast<uint64_t>(o.budget),
                           static_cast<uint64_t>(o.slots),
                           static_cast<uint64_t>(o.variants),
                           static_cast<uint64_t>(o.max_side),
                           layout_fingerprint()};
  uint64_t h = 0x73746f6b6572ull;  // "stoker"
  for (uint64_t k : key) h = hash_combine(h, k);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(kCacheFilePrefix) + hex;
}

std::shared_ptr<DecodedCache> DecodedCache::open(const DecodedCacheOptions& o) {
  return std::shared_ptr<DecodedCache>(new DecodedCache(o));
}

DecodedCache::DecodedCache(const DecodedCacheOptions& o) : opts_(o) {
  STOKER_CHECK(o.variants == 1 || o.variants == 4, UsageError,
               "a decoded cache has 1 or 4 variants per image, not ", o.variants);
  STOKER_CHECK(o.slots > 0, UsageError, "a decoded cache needs at least one image slot");
  STOKER_CHECK(static_cast<uint64_t>(o.slots) <= kMaxSlots, UsageError,
               "a decoded cache holds at most ", kMaxSlots, " images, not ", o.slots);
  const int64_t index = index_bytes(o.slots, o.variants);
  STOKER_CHECK(o.budget > index, UsageError, "cache_size=", o.budget,
               " bytes cannot hold the cache's index alone (", index, " bytes for ", o.slots,
               " images): give at least ", index + (int64_t{1} << 20), " bytes");
  if (!o.dir.empty()) attach_shared();
  if (shared_) {
    region_.store(shared_.get(), std::memory_order_release);
  } else {
    if (opts_.private_budget > 0 && opts_.private_budget < opts_.budget)
      opts_.budget = std::max(opts_.private_budget, index + static_cast<int64_t>(kPage));
    private_ = make_private();
    region_.store(private_.get(), std::memory_order_release);
  }
}

DecodedCache::~DecodedCache() {
  region_.store(nullptr, std::memory_order_relaxed);
  private_.reset();
  const bool mine = ::getpid() == owner_pid_;
  const int fd = shared_ ? shared_->fd : -1;
  shared_.reset();  // unmapped
  if (fd >= 0) {
    // The last process to leave removes the file (NOTE [ Cache lifetime ]); a
    // forked child shares its parent's lock and leaves that to the parent.
    if (mine && ofd_lock_within(fd, F_WRLCK, 0) && ofd_lock(fd, F_WRLCK, 1, false) &&
        same_file(fd, dir_fd_, name_))
      ::unlinkat(dir_fd_, name_.c_str(), 0);
    ::close(fd);
  }
  const int own = slot_fd_.load(std::memory_order_relaxed);
  if (own >= 0 && own != fd) ::close(own);  // a forked child's own open
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

bool DecodedCache::shared() const { return shared_ && region() == shared_.get(); }

std::unique_ptr<DecodedCache::Region> DecodedCache::make_private() const {
  const uint64_t size = static_cast<uint64_t>(opts_.budget);
  const Layout layout =
      layout_of(static_cast<uint64_t>(opts_.slots), static_cast<uint64_t>(opts_.variants), size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  STOKER_CHECK(p != MAP_FAILED, Error, "cannot map ", size,
               " bytes for the decoded cache: ", std::strerror(errno));
  auto r = std::make_unique<Region>();
  r->base = static_cast<uint8_t*>(p);
  r->size = size;
  Header* h = reinterpret_cast<Header*>(r->base);
  write_layout(h, opts_, layout);
  h->ready.store(kReady, std::memory_order_release);
  r->lay(layout, static_cast<uint64_t>(opts_.slots), static_cast<uint64_t>(opts_.variants));
#ifdef MADV_HUGEPAGE
  // Transparent huge pages where the system allows them for regions that ask:
  // a 2 MiB fault where an image would take hundreds of 4 KiB ones.
  ::madvise(r->data, r->data_bytes / kPage * kPage, MADV_HUGEPAGE);
#endif
  return r;
}

void DecodedCache::leave(Region* from, size_t entry, const char* why) const noexcept {
  corrupt_.v.fetch_add(1, std::memory_order_relaxed);
  if (!from->shared()) return;  // this process's own memory: nothing else to go to
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (region() != from) return;  // left already
    abandoned_ = path_ + ": entry " + std::to_string(entry) + " (image slot " +
                 std::to_string(entry / static_cast<size_t>(opts_.variants)) + ") " + why;
    Region* to = nullptr;
    try {
      if (!private_) private_ = make_private();
      to = private_.get();
    } catch (...) {  // no memory for it: decode as without a cache
    }
    region_.store(to, std::memory_order_release);
  } catch (...) {  // no memory for the message: stop using the file all the same
    region_.store(nullptr, std::memory_order_release);
  }
}

std::string DecodedCache::abandoned_why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abandoned_;
}

uint64_t DecodedCache::claim_word(Region& r) const noexcept {
  if (!r.shared()) return uint64_t{1} << kHolderShift | kClaimed;  // no other process
  const int pid = ::getpid();
  if (slot_pid_.load(std::memory_order_acquire) == pid)
    return claim_.load(std::memory_order_relaxed);
  // A forked child: an open file description of its own, and a slot of its own
  // (NOTE [ Decoded cache ]). Never waits: a mutex a thread of the parent held at
  // the fork stays held here, and the child then caches nothing.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  if (slot_pid_.load(std::memory_order_relaxed) == pid)
    return claim_.load(std::memory_order_relaxed);
  uint64_t claim = 0;
  int fd = ::openat(dir_fd_, name_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  struct stat a, b;
  if (fd >= 0 && (::fstat(fd, &a) != 0 || ::fstat(r.fd, &b) != 0 || a.st_dev != b.st_dev ||
                  a.st_ino != b.st_ino || (claim = take_slot(r, fd)) == 0)) {
    ::close(fd);
    fd = -1;
  }
  claim_.store(claim, std::memory_order_relaxed);
  slot_fd_.store(fd, std::memory_order_relaxed);
  slot_pid_.store(pid, std::memory_order_release);  // tried once, whatever came of it
  return claim;
}

bool DecodedCache::claim_alive(Region& r, uint64_t v) const noexcept {
  // This process's (another thread writes it): begin() took this process's slot first.
  if (!r.shared() || v == claim_.load(std::memory_order_relaxed)) return true;
  const uint64_t k = (v >> 2) & (kProcessSlots - 1);
  if (r.holders[k].load(std::memory_order_acquire) != v >> kHolderShift)
    return false;  // a later process took the slot: the claim's holder is gone
  struct flock fl;
  std::memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kSlotLockByte + static_cast<off_t>(k);
  fl.l_len = 1;
  if (::fcntl(slot_fd_.load(std::memory_order_relaxed), F_OFD_GETLK, &fl) != 0)
    return true;  // cannot tell: leave it
  return fl.l_type != F_UNLCK;
}

bool DecodedCache::entry_ok(Region& r, size_t i, uint64_t off, const void* head) const noexcept {
  const auto& e = *static_cast<const EntryHead*>(head);
  const uint64_t bytes = uint64_t(uint32_t(e.w)) * uint64_t(uint32_t(e.h)) * 3;
  const uint8_t* px = r.data + off + kHeadBytes;
  if (!opts_.verify_always && r.is_checked(i)) return true;
  if (entry_sum(e, px, bytes) != e.sum) return false;
  verified_.v.fetch_add(1, std::memory_order_relaxed);
  r.set_checked(i);
  return true;
}

bool DecodedCache::find(int64_t slot, int variant, CachedImage* out) const noexcept {
  Region* r = region();
  if (!r || slot < 0 || slot >= opts_.slots || variant < 0 || variant >= opts_.variants)
    return false;
  const size_t i = static_cast<size_t>(slot) * static_cast<size_t>(opts_.variants) +
                   static_cast<size_t>(variant);
  const uint64_t v = r->words[i].load(std::memory_order_acquire);
  if ((v & 3) != kPublished) return false;
  const uint64_t off = (v >> 2) * kEntryAlign;
  if (off > r->data_bytes || r->data_bytes - off < kHeadBytes) {
    leave(r, i, "has a word that points past the data region");
    return false;
  }
  EntryHead e;  // a copy: what is checked is what is used
  std::memcpy(&e, r->data + off, sizeof e);
  if (e.key != i + 1 || e.w <= 0 || e.h <= 0 || e.full_w <= 0 || e.full_h <= 0) {
    leave(r, i, "has a head that is not its own");
    return false;
  }
  const uint64_t bytes = uint64_t(uint32_t(e.w)) * uint64_t(uint32_t(e.h)) * 3;
  if (r->data_bytes - off - kHeadBytes < bytes) {
    leave(r, i, "runs past the data region");
    return false;
  }
  // Another process's entry past what this one has mapped: map up to what is
  // backed, at once (the file system's pages exist: nothing is allocated).
  if (r->shared() && off + kHeadBytes + bytes > r->populated.load(std::memory_order_relaxed))
    r->populate(r->header->reserved.load(std::memory_order_acquire), false);
  if (!entry_ok(*r, i, off, &e)) {
    leave(r, i, "does not match its checksum");
    return false;
  }
  out->pix = {r->data + off + kHeadBytes, e.w, e.h, static_cast<size_t>(e.w) * 3};
  out->full_w = e.full_w;
  out->full_h = e.full_h;
  return true;
}

bool DecodedCache::find_any(int64_t slot, CachedImage* out, int* variant) const noexcept {
  for (int v = opts_.variants - 1; v >= 0; --v)
    if (find(slot, v, out)) {
      if (variant) *variant = v;
      return true;
    }
  return false;
}

void DecodedCache::reject(int64_t slot, int variant, const char* why) const noexcept {
  if (Region* r = region())
    leave(r,
          static_cast<size_t>(slot) * static_cast<size_t>(opts_.variants) +
              static_cast<size_t>(variant),
          why);
}

DecodedCache::Writer DecodedCache::begin(int64_t slot, int variant, int w, int h, int full_w,
                                         int full_h) {
  Writer out;
  Region* r = region();
  if (!r || slot < 0 || slot >= opts_.slots || variant < 0 || variant >= opts_.variants || w <= 0 ||
      h <= 0)
    return out;
  const size_t i = static_cast<size_t>(slot) * static_cast<size_t>(opts_.variants) +
                   static_cast<size_t>(variant);
  const uint64_t mine = claim_word(*r);
  if (mine == 0) return out;  // no process slot: decode as without a cache
  std::atomic<uint64_t>& wd = r->words[i];
  uint64_t cur = wd.load(std::memory_order_acquire);
  for (;;) {
    if ((cur & 3) == kPublished) return out;
    // Being written. A writer that died mid-insert is taken over (NOTE
    // [ Decoded cache ]); a live one, or one we cannot tell, is left alone.
    if ((cur & 3) == kClaimed && claim_alive(*r, cur)) return out;
    if (wd.compare_exchange_strong(cur, mine, std::memory_order_acq_rel, std::memory_order_acquire))
      break;
  }
  const uint64_t bytes = round_up(kHeadBytes + uint64_t(w) * uint64_t(h) * 3, kEntryAlign);
  const uint64_t off = r->allocate(bytes);
  if (off == UINT64_MAX) {
    uint64_t expect = mine;
    wd.compare_exchange_strong(expect, kEmpty, std::memory_order_release,
                               std::memory_order_relaxed);
    declined_.v.fetch_add(1, std::memory_order_relaxed);
    return out;
  }
  auto* e = reinterpret_cast<EntryHead*>(r->data + off);
  std::memset(e, 0, sizeof *e);
  e->key = i + 1;
  e->w = w;
  e->h = h;
  e->full_w = full_w;
  e->full_h = full_h;
  out.cache_ = this;
  out.region_ = r;
  out.word_ = i;
  out.claim_ = mine;
  out.offset_ = off;
  out.pixels_ = r->data + off + kHeadBytes;
  out.stride_ = static_cast<size_t>(w) * 3;
  out.image_.pix = {out.pixels_, w, h, out.stride_};
  out.image_.full_w = full_w;
  out.image_.full_h = full_h;
  return out;
}

DecodedCache::Writer& DecodedCache::Writer::operator=(Writer&& o) noexcept {
  if (this != &o) {
    abandon();
    cache_ = o.cache_;
    region_ = o.region_;
    word_ = o.word_;
    claim_ = o.claim_;
    offset_ = o.offset_;
    pixels_ = o.pixels_;
    stride_ = o.stride_;
    image_ = o.image_;
    o.region_ = nullptr;
  }
  return *this;
}

CachedImage DecodedCache::Writer::publish() {
  const DecodedCache& c = *cache_;
  Region& r = *region_;
  region_ = nullptr;
  auto* e = reinterpret_cast<EntryHead*>(r.data + offset_);
  e->sum = entry_sum(*e, pixels_, static_cast<size_t>(image_.pix.width) * image_.pix.height * 3);
  uint64_t expect = claim_;
  const uint64_t published = (offset_ / kEntryAlign) << 2 | kPublished;
  // Release: the head and the pixels before the word (NOTE [ Decoded cache ]).
  if (r.words[word_].compare_exchange_strong(expect, published, std::memory_order_release,
                                             std::memory_order_relaxed)) {
    r.set_checked(word_);  // its writer hashed what it wrote (NOTE [ Cache trust ])
    r.header->entries.fetch_add(1, std::memory_order_relaxed);
    const size_t slot = word_ / static_cast<size_t>(c.opts_.variants);
    if (r.marks[slot].exchange(1, std::memory_order_relaxed) == 0)
      r.header->images.fetch_add(1, std::memory_order_relaxed);
    c.inserts_.v.fetch_add(1, std::memory_order_relaxed);
  }
  return image_;  // ours to read either way: nobody else writes this room
}

void DecodedCache::Writer::abandon() noexcept {
  if (!region_) return;
  uint64_t expect = claim_;
  region_->words[word_].compare_exchange_strong(expect, kEmpty, std::memory_order_release,
                                                std::memory_order_relaxed);
  region_ = nullptr;
}

DecodedCacheStats DecodedCache::stats() const {
  DecodedCacheStats s;
  s.hits = hits_.v.load(std::memory_order_relaxed);
  s.misses = misses_.v.load(std::memory_order_relaxed);
  s.inserts = inserts_.v.load(std::memory_order_relaxed);
  s.declined = declined_.v.load(std::memory_order_relaxed);
  s.verified = verified_.v.load(std::memory_order_relaxed);
  s.corrupt = corrupt_.v.load(std::memory_order_relaxed);
  s.slots = opts_.slots;
  s.shared = shared();
  s.abandoned = shared_ && !s.shared;
  const Region* r = region();
  if (!r) return s;
  const Header* h = r->header;
  s.entries = static_cast<int64_t>(
      std::min<uint64_t>(h->entries.load(std::memory_order_relaxed), r->nwords));
  s.images = static_cast<int64_t>(
      std::min<uint64_t>(h->images.load(std::memory_order_relaxed), opts_.slots));
  const uint64_t used = std::min(h->used.load(std::memory_order_relaxed), r->data_bytes);
  s.bytes = static_cast<int64_t>(r->data_offset + used);
  s.budget = static_cast<int64_t>(r->size);
  s.full = h->full.load(std::memory_order_relaxed) != 0;
  return s;
}

}  // namespace stoker