// The decoded-sample cache: an image's pixels, decoded once per run, kept in
// memory that every process of a node that reads the same dataset maps
// (stoker.Loader(..., cache="decoded")). See NOTE [ Decoded cache ] for the
// layout, the lock-free read path and what a writer that dies mid-insert
// leaves, NOTE [ Cache lifetime ] for who creates, joins and removes it, and
// NOTE [ Cache trust ] for what another user, or a stray write, can do to it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "codecs/image_info.h"
#include "common/cache_line.h"

namespace stoker {

struct DecodedCacheOptions {
  /// Bytes of the whole cache: its index and every entry. Never exceeded:
  /// images that do not fit are decoded as without a cache.
  int64_t budget = 0;
  /// Images it can hold: records x image fields (one slot each).
  int64_t slots = 0;
  /// Entries per slot: 4 (one per JPEG DCT scale, 1/8 .. 8/8: NOTE [ Exact
  /// pixels ] in geometry/canvas.cpp) or 1 (cache_max_side: one reduced copy).
  int variants = 4;
  /// The longest side of a cached copy; 0: pixels as decoded (variants = 4).
  int max_side = 0;
  /// The dataset's content and the cache's parameters (the shared file's name
  /// and header carry it: another dataset or other parameters never match).
  uint64_t identity = 0;
  /// Folder of the shared file's private folder ("/dev/shm": the file is
  /// /dev/shm/stoker-<uid>/<name>); empty: private memory only.
  std::string dir = "/dev/shm";
  /// Check an entry's checksum on every read (verify="always"); otherwise on
  /// the first read of it from this mapping (NOTE [ Cache trust ]).
  bool verify_always = false;
  /// The budget of a private cache, made when the shared one cannot be had
  /// (each process then holds its own: the node's budget over its processes);
  /// 0: the whole budget.
  int64_t private_budget = 0;
};

/// One cached image. Its pixels stay where they are while the cache lives:
/// entries are written once and never moved, reused or freed.
struct CachedImage {
  RgbView pix;     ///< 8-bit RGB, packed rows
  int full_w = 0;  ///< the image's own size (what its header declares)
  int full_h = 0;
};

struct DecodedCacheStats {
  int64_t hits = 0;      ///< images this process took from the cache
  int64_t misses = 0;    ///< images this process decoded (with the cache in use)
  int64_t inserts = 0;   ///< entries this process added
  int64_t declined = 0;  ///< entries this process could not add: no room left
  int64_t entries = 0;   ///< entries in the cache (every process's)
  int64_t images = 0;    ///< slots with at least one entry
  int64_t slots = 0;
  int64_t bytes = 0;  ///< bytes in use: the index and the entries handed out
  int64_t budget = 0;
  bool shared = false;     ///< in a file other processes map (else this process's memory)
  bool full = false;       ///< an entry found no room (the budget, or the file system)
  int64_t verified = 0;    ///< entries this process hashed on a read (NOTE [ Cache trust ])
  int64_t corrupt = 0;     ///< entries whose checksum or size did not match: the cache was left
  bool abandoned = false;  ///< the shared cache was left for a private one (abandoned_why())
};

class DecodedCache {
 public:
  /// Joins the shared cache of `o` (creating it when no process has it open),
  /// or makes a private one when shared memory cannot hold it or the file
  /// fails a check (NOTE [ Cache trust ]); fallback() says why. UsageError
  /// when the budget cannot even hold the index.
  static std::shared_ptr<DecodedCache> open(const DecodedCacheOptions& o);
  ~DecodedCache();
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  /// Bytes of the index of `slots` x `variants` (what a budget needs beyond the entries).
  static int64_t index_bytes(int64_t slots, int variants);
  /// The shared file's name for `o` (in its private folder, private_dir(o.dir)).
  static std::string file_name(const DecodedCacheOptions& o);
  /// The folder of this user's shared caches in `dir`: dir/stoker-<uid>.
  static std::string private_dir(const std::string& dir);

  const DecodedCacheOptions& options() const { return opts_; }
  /// Whether this process reads the shared file (false once it was abandoned).
  bool shared() const;
  /// The shared file, or empty.
  const std::string& path() const { return path_; }
  /// Why the cache is private although a shared one was asked for; empty otherwise.
  const std::string& fallback() const { return fallback_; }

  /// Entry `variant` of `slot`, if any process added it. Lock-free: one
  /// acquire load (NOTE [ Decoded cache ]), and the entry's checksum the first
  /// time this process reads it (NOTE [ Cache trust ]). Never blocks, never throws.
  bool find(int64_t slot, int variant, CachedImage* out) const noexcept;
  /// Any entry of `slot` (the image's size without reading its header); its
  /// variant in `*variant` if given.
  bool find_any(int64_t slot, CachedImage* out, int* variant = nullptr) const noexcept;
  /// An entry find() gave does not hold what its image needs (a size that
  /// does not follow from its original's): the shared cache is left for a
  /// private one (NOTE [ Cache trust ]).
  void reject(int64_t slot, int variant, const char* why) const noexcept;

  struct Region;  ///< one mapping of the layout (decoded_cache.cpp)

  /// An entry being written: claimed and given room, published by publish().
  /// Dropped unpublished (the decode failed), the claim is released and the
  /// room stays unused.
  class Writer {
   public:
    Writer() = default;
    Writer(Writer&& o) noexcept { *this = std::move(o); }
    Writer& operator=(Writer&& o) noexcept;
    ~Writer() { abandon(); }
    explicit operator bool() const { return region_ != nullptr; }
    /// Room for height rows of width * 3 bytes, packed.
    uint8_t* pixels() const { return pixels_; }
    size_t stride() const { return stride_; }
    /// Makes the entry visible to every process; returns what find() would.
    CachedImage publish();

   private:
    friend class DecodedCache;
    void abandon() noexcept;
    const DecodedCache* cache_ = nullptr;
    Region* region_ = nullptr;
    size_t word_ = 0;      // index of the entry's word
    uint64_t claim_ = 0;   // the claim word written there
    uint64_t offset_ = 0;  // of the entry in the data region
    uint8_t* pixels_ = nullptr;
    size_t stride_ = 0;
    CachedImage image_;
  };

  /// Claims entry `variant` of `slot` and room for a (w x h) RGB image of a
  /// (full_w x full_h) original. An empty Writer when another writer holds
  /// the entry or published it, or there is no room (counted as declined).
  Writer begin(int64_t slot, int variant, int w, int h, int full_w, int full_h);

  /// Counts one image taken from the cache, or decoded (stats).
  void count_hit() noexcept { hits_.v.fetch_add(1, std::memory_order_relaxed); }
  void count_miss() noexcept { misses_.v.fetch_add(1, std::memory_order_relaxed); }
  DecodedCacheStats stats() const;
  /// Why the shared cache was left for a private one; empty while it is read.
  std::string abandoned_why() const;

  struct Header;  ///< the shared layout (decoded_cache.cpp)

 private:
  explicit DecodedCache(const DecodedCacheOptions& o);
  void attach_shared();
  std::unique_ptr<Region> make_private() const;
  // The region reads and writes go to now (null: none, decode without a cache).
  Region* region() const noexcept { return region_.load(std::memory_order_acquire); }
  // Leaves the shared region for a private one: entry word `entry` of `from`
  // failed a check (`why`); said once (abandoned_why()).
  void leave(Region* from, size_t entry, const char* why) const noexcept;
  // The claim word of this process in `r` (taking a process slot in a forked
  // child); 0 when it has none.
  uint64_t claim_word(Region& r) const noexcept;
  // Whether the writer of claim word `v` in `r` may still publish.
  bool claim_alive(Region& r, uint64_t v) const noexcept;
  // Whether entry word `i` of `r` at `off` holds a whole, matching entry.
  bool entry_ok(Region& r, size_t i, uint64_t off, const void* head) const noexcept;

  struct alignas(kCacheLineSize) Counter {
    std::atomic<int64_t> v{0};
  };

  DecodedCacheOptions opts_;
  std::string path_;
  std::string name_;  // of the shared file in its folder
  std::string fallback_;
  int dir_fd_ = -1;                 // the private folder of the shared file
  int owner_pid_ = 0;               // the process that attached (a forked child never removes it)
  std::unique_ptr<Region> shared_;  // the shared file's mapping, kept while the cache lives
  mutable std::unique_ptr<Region> private_;  // a private cache, made at open or on leave()
  mutable std::atomic<Region*> region_{nullptr};
  mutable std::mutex mu_;  // leave(), and a forked child's process slot
  mutable std::string abandoned_;
  // The process whose slot claim_ is (a forked child takes its own), its claim
  // word (NOTE [ Decoded cache ]), and the descriptor that holds the slot's lock.
  mutable std::atomic<int> slot_pid_{0};
  mutable std::atomic<uint64_t> claim_{0};
  mutable std::atomic<int> slot_fd_{-1};
  mutable Counter hits_, misses_, inserts_, declined_, verified_, corrupt_;
};

/// Where one image's decoded pixels may be kept: its cache and its slot there
/// (record x image fields + the field's place among them).
struct CacheSlot {
  DecodedCache* cache = nullptr;
  int64_t slot = -1;
  explicit operator bool() const { return cache != nullptr; }
};

}  // namespace stoker
