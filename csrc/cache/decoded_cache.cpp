#include "cache/decoded_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cache/cache_file.h"
#include "common/error.h"
#include "sampler/permutation.h"

namespace stoker {

// NOTE [ Decoded cache ]
// One cache is one region of memory: a file in /dev/shm that every process
// reading the same dataset with the same cache parameters maps (a private
// anonymous mapping when that cannot be had), laid out as
//
//   +--------+------------------------------+----------------+----------------------------+
//   | header | words: slots x variants x 8  | marks: slots   | entries, handed out in     |
//   | 4 KiB  | one per entry, the entry's   | 1 byte each:   | order by one bump pointer: |
//   |        | sequence word                | has an entry   | 64-byte head, then pixels  |
//   +--------+------------------------------+----------------+----------------------------+
//   |<------------------------------ budget bytes, the file's size ---------------------->|
//
// A slot is one image (record x image fields + field); its variants are the
// JPEG DCT scales 1/8, 2/8, 4/8 and 8/8 (NOTE [ Exact pixels ] in
// geometry/canvas.cpp), or the one reduced copy of cache_max_side.
//
// Entries are written once and never moved, rewritten or freed: what does not
// fit the budget is decoded as without a cache. So an entry's word is a
// seqlock whose writer publishes once: it goes
//
//   0 (empty)  --claim-->  pid << 2 | 1 (odd: being written)  --publish-->  offset/64 << 2 | 2
//
// A writer claims the word (CAS from 0), takes room from the bump pointer,
// writes the head and the pixels with plain stores, and publishes with a
// release CAS from its own claim. A reader does one acquire load: an even,
// published word means the head and every pixel before it are written, and
// they never change afterwards, so the reader needs neither a lock nor the
// second look of a seqlock whose writers come back. A claim is all a writer
// that dies mid-insert leaves: readers take an odd word for a miss (and decode
// as without a cache), and the next writer that finds the claiming process
// gone (kill(pid, 0): ESRCH) claims the word anew and writes into new room;
// the dead writer's room is never published. A writer taken for dead that was
// alive after all (a pid from another pid namespace) loses its publishing CAS
// and leaves its room unused: no word ever points at room two writers wrote.
// Every published entry's head repeats its word's index, and a reader checks
// it and the bounds before using the pixels.
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
// The file's name carries the user, the dataset's identity and the cache's
// parameters (DecodedCache::file_name), so another dataset, a dataset
// rewritten since, or other parameters never meet it. Processes coordinate
// with two open-file-description locks on the file, which the kernel drops
// when a process dies however it dies:
//
//   byte 0  the door: held exclusively while a process joins or leaves
//   byte 1  attached: every process that maps the file holds it shared
//
// Joining takes the door, then tries byte 1 exclusively: if that succeeds no
// process maps the file (it was just created, or every user of it is gone),
// so it is emptied and laid out anew, and the lock is turned into a shared
// one (an atomic conversion for these locks). Otherwise the file is in use by
// live processes: the joiner takes byte 1 shared and checks the header.
// Leaving takes the door, and the process that can turn its shared lock into
// an exclusive one is the last: it removes the file. A file whose last user
// was killed stays until the next process that joins any cache removes it
// (it sweeps the files of this user nobody holds). A forked child shares its
// parent's lock (the same open file description) and never removes the file.

namespace {

constexpr char kMagic[8] = {'S', 'T', 'K', 'D', 'C', 'A', 'C', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kReady = 0x5245414459ull;  // "READY": the layout is written
constexpr uint64_t kPage = 4096;
constexpr uint64_t kEntryAlign = 64;
constexpr uint64_t kHeadBytes = 64;
constexpr uint64_t kChunk = uint64_t{32} << 20;  // bytes fallocate()d at a time

// The low two bits of an entry's word.
constexpr uint64_t kEmpty = 0, kClaimed = 1, kPublished = 2;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct EntryHead {
  uint64_t key;  // the entry's word index + 1
  int32_t w, h, full_w, full_h;
  uint64_t reserved[5];
};
static_assert(sizeof(EntryHead) == kHeadBytes, "an entry's head is one cache line");

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

}  // namespace

struct DecodedCache::Header {
  char magic[8];
  uint32_t version;
  uint32_t variants;
  uint64_t identity;
  uint64_t slots;
  uint64_t total_bytes;
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
static_assert(sizeof(DecodedCache::Header) <= kPage, "the header fits its page");
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint8_t>::is_always_lock_free,
              "atomics in memory shared between processes must be lock-free (address-free)");

int64_t DecodedCache::index_bytes(int64_t slots, int variants) {
  const uint64_t s = static_cast<uint64_t>(std::max<int64_t>(slots, 0));
  return static_cast<int64_t>(kPage + round_up(s * static_cast<uint64_t>(variants) * 8, kPage) +
                              round_up(s, kPage));
}

std::string DecodedCache::file_name(const DecodedCacheOptions& o) {
  const uint64_t key[6] = {o.identity,
                           static_cast<uint64_t>(o.budget),
                           static_cast<uint64_t>(o.slots),
                           static_cast<uint64_t>(o.variants),
                           static_cast<uint64_t>(o.max_side),
                           kVersion};
  uint64_t h = 0x73746f6b6572ull;  // "stoker"
  for (uint64_t k : key) h = hash_combine(h, k);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(kCacheFilePrefix) + std::to_string(::geteuid()) + "-" + hex;
}

std::shared_ptr<DecodedCache> DecodedCache::open(const DecodedCacheOptions& o) {
  return std::shared_ptr<DecodedCache>(new DecodedCache(o));
}

DecodedCache::DecodedCache(const DecodedCacheOptions& o) : opts_(o) {
  STOKER_CHECK(o.variants == 1 || o.variants == 4, UsageError,
               "a decoded cache has 1 or 4 variants per image, not ", o.variants);
  STOKER_CHECK(o.slots > 0, UsageError, "a decoded cache needs at least one image slot");
  const int64_t index = index_bytes(o.slots, o.variants);
  STOKER_CHECK(o.budget > index, UsageError, "cache_size=", o.budget,
               " bytes cannot hold the cache's index alone (", index, " bytes for ", o.slots,
               " images): give at least ", index + (int64_t{1} << 20), " bytes");
  if (!o.dir.empty()) attach_shared();
  if (!base_) make_private();
}

DecodedCache::~DecodedCache() { detach(); }

void DecodedCache::map_layout() {
  header_ = reinterpret_cast<Header*>(base_);
  words_ = reinterpret_cast<std::atomic<uint64_t>*>(base_ + header_->words_offset);
  marks_ = reinterpret_cast<std::atomic<uint8_t>*>(base_ + header_->marks_offset);
  data_ = base_ + header_->data_offset;
  data_bytes_ = header_->data_bytes;
}

namespace {

void write_layout(DecodedCache::Header* h, const DecodedCacheOptions& o) {
  const uint64_t slots = static_cast<uint64_t>(o.slots);
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->version = kVersion;
  h->variants = static_cast<uint32_t>(o.variants);
  h->identity = o.identity;
  h->slots = slots;
  h->total_bytes = static_cast<uint64_t>(o.budget);
  h->words_offset = kPage;
  h->marks_offset = kPage + round_up(slots * static_cast<uint64_t>(o.variants) * 8, kPage);
  h->data_offset = h->marks_offset + round_up(slots, kPage);
  h->data_bytes = (h->total_bytes - h->data_offset) / kEntryAlign * kEntryAlign;
  h->max_side = o.max_side;
  h->used.store(0, std::memory_order_relaxed);
  h->reserved.store(0, std::memory_order_relaxed);
  h->full.store(0, std::memory_order_relaxed);
  h->entries.store(0, std::memory_order_relaxed);
  h->images.store(0, std::memory_order_relaxed);
}

bool layout_matches(const DecodedCache::Header* h, const DecodedCacheOptions& o) {
  return std::memcmp(h->magic, kMagic, sizeof kMagic) == 0 && h->version == kVersion &&
         h->variants == static_cast<uint32_t>(o.variants) && h->identity == o.identity &&
         h->slots == static_cast<uint64_t>(o.slots) &&
         h->total_bytes == static_cast<uint64_t>(o.budget) && h->max_side == o.max_side &&
         h->ready.load(std::memory_order_acquire) == kReady;
}

}  // namespace

void DecodedCache::attach_shared() {
  const std::string name = file_name(opts_);
  const std::string path = opts_.dir + "/" + name;
  const uint64_t budget = static_cast<uint64_t>(opts_.budget);
  const uint64_t index = static_cast<uint64_t>(index_bytes(opts_.slots, opts_.variants));
  auto fail = [&](const std::string& why) { fallback_ = why; };
  struct statvfs vfs;
  if (::statvfs(opts_.dir.c_str(), &vfs) != 0) {
    fail("cannot use " + opts_.dir + " (" + std::strerror(errno) + ")");
    return;
  }
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      fail("cannot create " + path + " (" + std::strerror(errno) + ")");
      return;
    }
    auto give_up = [&](const std::string& why, bool remove) {
      if (base_) ::munmap(base_, size_);
      base_ = nullptr;
      if (remove && same_file(fd, path)) ::unlink(path.c_str());
      ::close(fd);
      fail(why);
    };
    if (!ofd_lock_within(fd, F_WRLCK, 0)) {
      give_up("another process held " + path + " for too long", false);
      return;
    }
    if (!same_file(fd, path)) {  // removed (or replaced) before we took the door: again
      ::close(fd);
      continue;
    }
    const bool alone = ofd_lock(fd, F_WRLCK, 1, false);
    if (alone) {
      // No process maps it: new, or left by processes that are all gone. Laid
      // out anew (NOTE [ Cache lifetime ]), after sweeping other leftovers.
      sweep(opts_.dir, name);
      ::statvfs(opts_.dir.c_str(), &vfs);
      const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      // Room for the whole budget now, or a private cache: entries are backed as they
      // come, and a cache that could never grow to its budget here would only make
      // each process decode what the others would have found.
      if (avail < budget) {
        give_up(opts_.dir + " has " + bytes_text(avail) + " free, less than cache_size (" +
                    bytes_text(budget) + ")",
                true);
        return;
      }
      if (::ftruncate(fd, 0) != 0 || ::ftruncate(fd, static_cast<off_t>(budget)) != 0) {
        give_up("cannot size " + path + " (" + std::strerror(errno) + ")", true);
        return;
      }
      // The index is written anywhere at any time: backed now, whole.
      if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(index)); e != 0) {
        give_up("cannot reserve the cache's index in " + opts_.dir + " (" + std::strerror(e) + ")",
                true);
        return;
      }
    } else if (!ofd_lock(fd, F_RDLCK, 1, false)) {  // in use: attach beside its users
      ::close(fd);
      continue;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != budget) {
      give_up(path + " has another size than this cache's", false);
      return;
    }
    void* p = ::mmap(nullptr, budget, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      give_up("cannot map " + path + " (" + std::strerror(errno) + ")", alone);
      return;
    }
    base_ = static_cast<uint8_t*>(p);
    size_ = budget;
    header_ = reinterpret_cast<Header*>(base_);
    if (alone) {
      write_layout(header_, opts_);
      header_->ready.store(kReady, std::memory_order_release);
      ofd_lock(fd, F_RDLCK, 1, false);  // exclusive -> shared: an atomic conversion
    } else if (!layout_matches(header_, opts_)) {
      give_up(path + " holds a cache of other parameters", false);
      return;
    }
    ofd_lock(fd, F_UNLCK, 0, false);  // the door
    map_layout();
    fd_ = fd;
    owner_pid_ = ::getpid();
    path_ = path;
    return;
  }
  fail(path + " kept changing while this process joined it");
}

void DecodedCache::make_private() {
  if (opts_.private_budget > 0 && opts_.private_budget < opts_.budget)
    opts_.budget = std::max(opts_.private_budget,
                            index_bytes(opts_.slots, opts_.variants) + static_cast<int64_t>(kPage));
  const size_t size = static_cast<size_t>(opts_.budget);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  STOKER_CHECK(p != MAP_FAILED, Error, "cannot map ", size,
               " bytes for the decoded cache: ", std::strerror(errno));
  base_ = static_cast<uint8_t*>(p);
  size_ = size;
  header_ = reinterpret_cast<Header*>(base_);
  write_layout(header_, opts_);
  header_->ready.store(kReady, std::memory_order_release);
  map_layout();
  owner_pid_ = ::getpid();
#ifdef MADV_HUGEPAGE
  // Transparent huge pages where the system allows them for regions that ask:
  // a 2 MiB fault where an image would take hundreds of 4 KiB ones.
  ::madvise(base_ + header_->data_offset, data_bytes_ / kPage * kPage, MADV_HUGEPAGE);
#endif
}

void DecodedCache::populate(uint64_t upto, bool write) const noexcept {
  uint64_t have = populated_.load(std::memory_order_relaxed);
  if (upto <= have) return;
  // One thread maps the stretch; the others read on meanwhile (and fault as they go).
  if (!populated_.compare_exchange_strong(have, upto, std::memory_order_relaxed)) return;
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
  const uint64_t from = have / kPage * kPage, to = round_up(upto, kPage);
  ::madvise(data_ + from, to - from, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#else
  (void)write;
#endif
}

void DecodedCache::detach() noexcept {
  if (base_) ::munmap(base_, size_);
  base_ = nullptr;
  if (fd_ < 0) return;
  // The last process to leave removes the file (NOTE [ Cache lifetime ]); a
  // forked child shares its parent's lock and leaves that to the parent.
  if (::getpid() == owner_pid_ && ofd_lock_within(fd_, F_WRLCK, 0) &&
      ofd_lock(fd_, F_WRLCK, 1, false) && same_file(fd_, path_))
    ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

std::atomic<uint64_t>& DecodedCache::word(size_t i) const { return words_[i]; }

bool DecodedCache::find(int64_t slot, int variant, CachedImage* out) const noexcept {
  if (slot < 0 || slot >= opts_.slots || variant < 0 || variant >= opts_.variants) return false;
  const size_t i = static_cast<size_t>(slot) * static_cast<size_t>(opts_.variants) +
                   static_cast<size_t>(variant);
  const uint64_t v = word(i).load(std::memory_order_acquire);
  if ((v & 3) != kPublished) return false;
  const uint64_t off = (v >> 2) * kEntryAlign;
  if (off > data_bytes_ || data_bytes_ - off < kHeadBytes) return false;
  const auto* e = reinterpret_cast<const EntryHead*>(data_ + off);
  if (e->key != i + 1 || e->w <= 0 || e->h <= 0) return false;
  const uint64_t bytes = uint64_t(e->w) * uint64_t(e->h) * 3;
  if (data_bytes_ - off - kHeadBytes < bytes) return false;
  // Another process's entry past what this one has mapped: map up to what is
  // backed, at once (the file system's pages exist: nothing is allocated).
  if (fd_ >= 0 && off + kHeadBytes + bytes > populated_.load(std::memory_order_relaxed))
    populate(header_->reserved.load(std::memory_order_acquire), false);
  out->pix = {data_ + off + kHeadBytes, e->w, e->h, static_cast<size_t>(e->w) * 3};
  out->full_w = e->full_w;
  out->full_h = e->full_h;
  return true;
}

bool DecodedCache::find_any(int64_t slot, CachedImage* out) const noexcept {
  for (int v = opts_.variants - 1; v >= 0; --v)
    if (find(slot, v, out)) return true;
  return false;
}

uint64_t DecodedCache::allocate(uint64_t bytes) {
  uint64_t u = header_->used.load(std::memory_order_relaxed);
  do {
    if (u > data_bytes_ || data_bytes_ - u < bytes) {
      header_->full.store(1, std::memory_order_relaxed);
      return UINT64_MAX;
    }
  } while (!header_->used.compare_exchange_weak(u, u + bytes, std::memory_order_relaxed));
  if (!reserve(u + bytes)) {  // the file system is full: this room stays unused
    header_->full.store(1, std::memory_order_relaxed);
    return UINT64_MAX;
  }
  return u;
}

bool DecodedCache::reserve(uint64_t end) {
  if (fd_ < 0) {  // private memory: the budget bounds it; mapped a chunk at a time
    populate(std::min(data_bytes_, round_up(end, kChunk)), true);
    return true;
  }
  uint64_t r = header_->reserved.load(std::memory_order_acquire);
  if (end <= r) return true;
  // A chunk at a time; near a full file system, what this entry needs alone.
  // Overlapping calls from several processes are fine: backed bytes stay backed.
  uint64_t to = std::min(data_bytes_, round_up(end, kChunk));
  auto back = [&](uint64_t upto) {
    return ::posix_fallocate(fd_, static_cast<off_t>(header_->data_offset + r),
                             static_cast<off_t>(upto - r)) == 0;
  };
  if (!back(to)) {
    to = std::min(data_bytes_, round_up(end, kPage));
    if (!back(to)) return false;
  }
  while (r < to && !header_->reserved.compare_exchange_weak(r, to, std::memory_order_acq_rel)) {
  }
  populate(to, true);  // this process writes there next
  return true;
}

DecodedCache::Writer DecodedCache::begin(int64_t slot, int variant, int w, int h, int full_w,
                                         int full_h) {
  Writer out;
  if (slot < 0 || slot >= opts_.slots || variant < 0 || variant >= opts_.variants || w <= 0 ||
      h <= 0)
    return out;
  const size_t i = static_cast<size_t>(slot) * static_cast<size_t>(opts_.variants) +
                   static_cast<size_t>(variant);
  std::atomic<uint64_t>& wd = word(i);
  const uint64_t pid = static_cast<uint64_t>(::getpid());
  const uint64_t mine = pid << 2 | kClaimed;
  uint64_t cur = wd.load(std::memory_order_acquire);
  for (;;) {
    if ((cur & 3) == kPublished) return out;
    if ((cur & 3) == kClaimed) {
      // Being written. A writer that died mid-insert is taken over (NOTE
      // [ Decoded cache ]); a live one, or one we cannot tell, is left alone.
      const uint64_t holder = cur >> 2;
      if (holder == pid || ::kill(static_cast<pid_t>(holder), 0) == 0 || errno != ESRCH) return out;
    }
    if (wd.compare_exchange_strong(cur, mine, std::memory_order_acq_rel, std::memory_order_acquire))
      break;
  }
  const uint64_t bytes = round_up(kHeadBytes + uint64_t(w) * uint64_t(h) * 3, kEntryAlign);
  const uint64_t off = allocate(bytes);
  if (off == UINT64_MAX) {
    uint64_t expect = mine;
    wd.compare_exchange_strong(expect, kEmpty, std::memory_order_release,
                               std::memory_order_relaxed);
    declined_.v.fetch_add(1, std::memory_order_relaxed);
    return out;
  }
  auto* e = reinterpret_cast<EntryHead*>(data_ + off);
  std::memset(e, 0, sizeof *e);
  e->key = i + 1;
  e->w = w;
  e->h = h;
  e->full_w = full_w;
  e->full_h = full_h;
  out.cache_ = this;
  out.word_ = i;
  out.claim_ = mine;
  out.offset_ = off;
  out.pixels_ = data_ + off + kHeadBytes;
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
    word_ = o.word_;
    claim_ = o.claim_;
    offset_ = o.offset_;
    pixels_ = o.pixels_;
    stride_ = o.stride_;
    image_ = o.image_;
    o.cache_ = nullptr;
  }
  return *this;
}

CachedImage DecodedCache::Writer::publish() {
  DecodedCache& c = *cache_;
  cache_ = nullptr;
  uint64_t expect = claim_;
  const uint64_t published = (offset_ / kEntryAlign) << 2 | kPublished;
  // Release: the head and the pixels before the word (NOTE [ Decoded cache ]).
  if (c.word(word_).compare_exchange_strong(expect, published, std::memory_order_release,
                                            std::memory_order_relaxed)) {
    c.header_->entries.fetch_add(1, std::memory_order_relaxed);
    const size_t slot = word_ / static_cast<size_t>(c.opts_.variants);
    if (c.marks_[slot].exchange(1, std::memory_order_relaxed) == 0)
      c.header_->images.fetch_add(1, std::memory_order_relaxed);
    c.inserts_.v.fetch_add(1, std::memory_order_relaxed);
  }
  return image_;  // ours to read either way: nobody else writes this room
}

void DecodedCache::Writer::abandon() noexcept {
  if (!cache_) return;
  uint64_t expect = claim_;
  cache_->word(word_).compare_exchange_strong(expect, kEmpty, std::memory_order_release,
                                              std::memory_order_relaxed);
  cache_ = nullptr;
}

DecodedCacheStats DecodedCache::stats() const {
  DecodedCacheStats s;
  s.hits = hits_.v.load(std::memory_order_relaxed);
  s.misses = misses_.v.load(std::memory_order_relaxed);
  s.inserts = inserts_.v.load(std::memory_order_relaxed);
  s.declined = declined_.v.load(std::memory_order_relaxed);
  s.entries = static_cast<int64_t>(header_->entries.load(std::memory_order_relaxed));
  s.images = static_cast<int64_t>(header_->images.load(std::memory_order_relaxed));
  s.slots = opts_.slots;
  const uint64_t used = std::min(header_->used.load(std::memory_order_relaxed), data_bytes_);
  s.bytes = static_cast<int64_t>(header_->data_offset + used);
  s.budget = opts_.budget;
  s.shared = shared();
  s.full = header_->full.load(std::memory_order_relaxed) != 0;
  return s;
}

}  // namespace stoker
