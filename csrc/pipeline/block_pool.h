// One pool of reusable memory blocks for everything a loader allocates per
// batch: host batch slots (pageable or page-locked) and device buffers. What
// differs is plugged in: the allocator, and a fence that orders a block's
// reuse after its last reader (a CUDA event on the consumer's stream; none for
// host memory, whose readers are done when they drop it). Every block is handed
// out the same way, as a Lease: the one owner a batch, its DLPack tensors and
// the copy thread share.
//
// NOTE [ Block lifetime ]
//   lease() -> Lease     (reuses an idle block that fits, else allocates)
//      |  workers / the copy thread fill it, the consumer reads it (DLPack);
//      |  set_reader(U): the consumer's stream U reads it last (device memory)
//      v
//   the last owner drops it   (any thread, maybe after the loader is gone:
//      |                       a lease holds its pool by shared_ptr)
//      v
//   idle, with a fence token recorded on U: the next lease() on stream S makes
//   S wait for it (no host wait). A block that is not kept idle is freed once
//   its token has completed (NOTE [ Deferred frees ]).
// When the user keeps batches, lease() allocates rather than waits, so
// list(loader) never deadlocks; at most `max_idle` blocks stay idle, so the
// memory returns afterwards.
//
// NOTE [ Deferred frees ]
// Freeing a block whose fence has not completed would first have to wait for
// the kernels still reading it. That wait never happens where a block comes
// back (a tensor's deleter, with the GIL held) nor where a pool dies: such a
// block is deferred, and collect(), which never waits, frees the deferred
// blocks whose fences have completed. The thread that writes the pool's blocks
// calls it as it goes (the copy thread, cuda/transfer_engine.h), so the frees
// happen there. A pool that dies with fences still pending (its last owner was
// a batch the user kept past its loader) hands those blocks, with the
// allocator and fence they need, to a short-lived thread (stoker-free) that
// frees them as their fences complete.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace stoker {

enum class MemoryKind { kPageable, kPinned, kDevice };

/// Where blocks come from.
class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;
  /// @return at least `bytes` bytes, 256-byte aligned; throws on failure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual MemoryKind kind() const = 0;
  /// Whether the block at `p`, given back, may be handed out again; false: it is
  /// freed instead (a shared block that a forked child may still read:
  /// NOTE [ Shared batch memory ] in shared_memory.h).
  virtual bool recyclable(const void* /*p*/) const noexcept { return true; }
  /// Gives the idle block's pages back to the system, its contents lost (the
  /// next writer faults in zero pages); false where it cannot, and the block
  /// stays as it is.
  virtual bool release_pages(void* /*p*/, size_t /*bytes*/) noexcept { return false; }
};

/// Page-aligned pageable host memory (huge pages advised for large blocks).
std::shared_ptr<BlockAllocator> pageable_allocator();

/// Orders the reuse of a block after the work that last read it.
class BlockFence {
 public:
  /// An opaque completion marker (a recorded event).
  using Token = std::shared_ptr<const void>;
  virtual ~BlockFence() = default;
  /// Captures the work queued so far on `reader` (a stream handle).
  virtual Token record(uintptr_t reader) = 0;
  /// Work queued on `stream` after this call runs after `t` (no host wait).
  virtual void order_after(const Token& t, uintptr_t stream) = 0;
  /// Whether `t` has completed (never waits); throws if it never will.
  virtual bool done(const Token& t) = 0;
  /// Blocks the calling thread until `t` has completed; throws if it never will.
  virtual void wait(const Token& t) = 0;
};

class BlockPool : public std::enable_shared_from_this<BlockPool> {
 public:
  struct Block {
    void* data = nullptr;
    size_t capacity = 0;
  };
  class Lease;

  /// @param fence null for host memory
  /// @param max_idle idle blocks kept for reuse; more are freed
  static std::shared_ptr<BlockPool> create(std::shared_ptr<BlockAllocator> alloc,
                                           std::shared_ptr<BlockFence> fence, size_t max_idle);
  /// Frees the idle and deferred blocks whose fences have completed; the others
  /// go to a thread that frees them once they have (NOTE [ Deferred frees ]).
  /// Never waits.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// A block of at least `bytes` on loan; dropping the last reference gives it
  /// back (NOTE [ Block lifetime ]). With a fence, work queued on `stream`
  /// after this call runs after every reader of the block's previous contents.
  std::shared_ptr<Lease> lease(size_t bytes, uintptr_t stream = 0);

  /// The same, unmanaged: the caller gives the block back with release().
  Block acquire(size_t bytes, uintptr_t stream = 0);
  /// Gives `b` back; `reader` is the stream that last read it (fence only).
  /// Any thread; never throws, never waits (a block whose release cannot be
  /// fenced leaks).
  void release(Block b, std::optional<uintptr_t> reader = std::nullopt) noexcept;

  /// NOTE [ Deferred frees ]: frees the deferred blocks whose fences have
  /// completed. Never waits; cheap when there are none.
  /// @return blocks still deferred
  size_t collect() noexcept;
  /// Sets how many idle blocks are kept (the loader's window may change); those
  /// over it are freed now (deferred while their fences are pending), and with 0
  /// every block as it comes back.
  void set_max_idle(size_t n);

  MemoryKind kind() const { return alloc_->kind(); }
  size_t blocks() const;    ///< blocks alive (idle, in use, or deferred)
  size_t bytes() const;     ///< their total capacity
  size_t deferred() const;  ///< blocks waiting for their fence before they are freed

 private:
  struct Idle {
    Block block;
    BlockFence::Token fence;  // null when nothing else read it
    bool resident = true;     // false: its pages were given back (release_pages)
  };
  // NOTE [ Idle pages ]: one idle block keeps its pages, the one the next lease
  // takes; the pages of the others go back to the system where the allocator can
  // give them (shared memory). A pool that has kept a block more than its steady
  // state needs (a worker a chunk ahead of the loop) then holds no memory for it,
  // and a lease prefers a block that still has its pages (faulting a 10 MB block
  // in again costs its writers about 15 ms).
  static constexpr size_t kResidentIdle = 1;
  void keep_resident_locked() noexcept;
  BlockPool(std::shared_ptr<BlockAllocator> alloc, std::shared_ptr<BlockFence> fence,
            size_t max_idle);
  // Frees `idle` now if its fence allows, else defers it. Never waits.
  void retire(Idle idle) noexcept;
  void free_block(const Block& b) noexcept;
  Block allocate(size_t bytes);

  std::shared_ptr<BlockAllocator> alloc_;
  std::shared_ptr<BlockFence> fence_;
  const int pid_;
  mutable std::mutex mu_;
  size_t max_idle_;                        // guarded by mu_
  std::vector<Idle> idle_;                 // guarded by mu_
  std::vector<Idle> deferred_;             // guarded by mu_: NOTE [ Deferred frees ]
  std::atomic<size_t> deferred_count_{0};  // deferred_.size(), for collect() without the lock
  size_t live_ = 0;                        // guarded by mu_
  size_t live_bytes_ = 0;                  // guarded by mu_
};

/// A block on loan (NOTE [ Block lifetime ]). Destroying it gives the block
/// back to its pool, fenced on the reader if one was set.
class BlockPool::Lease {
 public:
  ~Lease() { pool_->release(block_, reader_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(block_.data); }
  size_t capacity() const { return block_.capacity; }
  /// The stream that reads the block last (device memory): its release
  /// records the fence there. Set before the lease is shared.
  void set_reader(uintptr_t stream) { reader_ = stream; }

  /// The block's bytes, owned: the pointer keeps `lease`, which is what a batch
  /// and its tensors hold (HostBatch::memory, DLPack deleters).
  static std::shared_ptr<uint8_t> bytes(std::shared_ptr<Lease> lease) {
    uint8_t* p = lease->data();
    return std::shared_ptr<uint8_t>(std::move(lease), p);
  }

 private:
  friend class BlockPool;
  Lease(std::shared_ptr<BlockPool> pool, Block block) : pool_(std::move(pool)), block_(block) {}
  std::shared_ptr<BlockPool> pool_;
  Block block_;
  std::optional<uintptr_t> reader_;
};

}  // namespace stoker
