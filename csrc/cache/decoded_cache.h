// The decoded-sample cache: an image's pixels, decoded once per run, kept in
// memory that every process of a node that reads the same dataset maps
// (stoker.Loader(..., cache="decoded")). See NOTE [ Decoded cache ] for the
// layout, the lock-free read path and what a writer that dies mid-insert
// leaves, and NOTE [ Cache lifetime ] for who creates, joins and removes it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
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
  /// Folder of the shared file ("/dev/shm"); empty: private memory only.
  std::string dir = "/dev/shm";
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
  bool shared = false;  ///< in a file other processes map (else this process's memory)
  bool full = false;    ///< an entry found no room (the budget, or the file system)
};

class DecodedCache {
 public:
  /// Joins the shared cache of `o` (creating it when no process has it open),
  /// or makes a private one when shared memory cannot hold it; fallback()
  /// says why. UsageError when the budget cannot even hold the index.
  static std::shared_ptr<DecodedCache> open(const DecodedCacheOptions& o);
  ~DecodedCache();
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  /// Bytes of the index of `slots` x `variants` (what a budget needs beyond the entries).
  static int64_t index_bytes(int64_t slots, int variants);
  /// The shared file's name for `o` (in o.dir).
  static std::string file_name(const DecodedCacheOptions& o);

  const DecodedCacheOptions& options() const { return opts_; }
  bool shared() const { return fd_ >= 0; }
  /// The shared file, or empty.
  const std::string& path() const { return path_; }
  /// Why the cache is private although a shared one was asked for; empty otherwise.
  const std::string& fallback() const { return fallback_; }

  /// Entry `variant` of `slot`, if any process added it. Lock-free: one
  /// acquire load (NOTE [ Decoded cache ]). Never blocks, never throws.
  bool find(int64_t slot, int variant, CachedImage* out) const noexcept;
  /// Any entry of `slot` (the image's size without reading its header).
  bool find_any(int64_t slot, CachedImage* out) const noexcept;

  /// An entry being written: claimed and given room, published by publish().
  /// Dropped unpublished (the decode failed), the claim is released and the
  /// room stays unused.
  class Writer {
   public:
    Writer() = default;
    Writer(Writer&& o) noexcept { *this = std::move(o); }
    Writer& operator=(Writer&& o) noexcept;
    ~Writer() { abandon(); }
    explicit operator bool() const { return cache_ != nullptr; }
    /// Room for height rows of width * 3 bytes, packed.
    uint8_t* pixels() const { return pixels_; }
    size_t stride() const { return stride_; }
    /// Makes the entry visible to every process; returns what find() would.
    CachedImage publish();

   private:
    friend class DecodedCache;
    void abandon() noexcept;
    DecodedCache* cache_ = nullptr;
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

  struct Header;  ///< the shared layout (decoded_cache.cpp)

 private:
  explicit DecodedCache(const DecodedCacheOptions& o);
  void attach_shared();
  void make_private();
  void map_layout();
  // Room for `bytes` more entry bytes; UINT64_MAX when there is none.
  uint64_t allocate(uint64_t bytes);
  // Backs data [0, end) with memory (fallocate) before anything writes there.
  bool reserve(uint64_t end);
  // Maps data [0, upto) into this process's page tables (NOTE [ Decoded cache ]).
  void populate(uint64_t upto, bool write) const noexcept;
  std::atomic<uint64_t>& word(size_t i) const;
  void detach() noexcept;

  struct alignas(kCacheLineSize) Counter {
    std::atomic<int64_t> v{0};
  };

  DecodedCacheOptions opts_;
  std::string path_;
  std::string fallback_;
  int fd_ = -1;              // the shared file (-1: private memory)
  int owner_pid_ = 0;        // the process that attached (a forked child never removes it)
  uint8_t* base_ = nullptr;  // the mapping
  size_t size_ = 0;
  Header* header_ = nullptr;
  std::atomic<uint64_t>* words_ = nullptr;  // slots * variants
  std::atomic<uint8_t>* marks_ = nullptr;   // per slot: has an entry
  uint8_t* data_ = nullptr;
  uint64_t data_bytes_ = 0;
  mutable std::atomic<uint64_t> populated_{0};  // data bytes in this process's page tables
  Counter hits_, misses_, inserts_, declined_;
};

/// Where one image's decoded pixels may be kept: its cache and its slot there
/// (record x image fields + the field's place among them).
struct CacheSlot {
  DecodedCache* cache = nullptr;
  int64_t slot = -1;
  explicit operator bool() const { return cache != nullptr; }
};

}  // namespace stoker
