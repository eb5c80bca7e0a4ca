// One pool of reusable memory blocks for everything a loader allocates per
// batch: host batch slots (pageable or page-locked) and device buffers. What
// differs is plugged in: the allocator, and a fence that orders a block's
// reuse after its last reader (a CUDA event on the consumer's stream; none for
// host memory, whose readers are done when they drop it).
//
// NOTE [ Block lifetime ]
//   acquire() -> block   (reuses an idle block that fits, else allocates)
//      |  workers / the copy thread fill it, the consumer reads it (DLPack)
//      v
//   release(block, reader)  (any thread, maybe after the loader is gone: the
//      |                     owner of a block holds the pool by shared_ptr)
//      v
//   idle, with a fence token: the next acquire() on stream S makes S wait for
//   it (no host wait); freeing waits for it on the host.
// When the user keeps batches, acquire() allocates rather than waits, so
// list(loader) never deadlocks; at most `max_idle` blocks stay idle, so the
// memory returns afterwards.
#pragma once

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
  /// Blocks the calling thread until `t` has completed; throws if it never will.
  virtual void wait(const Token& t) = 0;
};

class BlockPool : public std::enable_shared_from_this<BlockPool> {
 public:
  struct Block {
    void* data = nullptr;
    size_t capacity = 0;
  };

  /// @param fence null for host memory
  /// @param max_idle idle blocks kept for reuse; more are freed
  static std::shared_ptr<BlockPool> create(std::shared_ptr<BlockAllocator> alloc,
                                           std::shared_ptr<BlockFence> fence, size_t max_idle);
  /// Frees the idle blocks (after their fences).
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// A block of at least `bytes`. With a fence, work queued on `stream` after
  /// this call runs after every reader of the block's previous contents.
  Block acquire(size_t bytes, uintptr_t stream = 0);
  /// Gives `b` back; `reader` is the stream that last read it (fence only).
  /// Any thread; never throws (a block whose release cannot be fenced leaks).
  void release(Block b, std::optional<uintptr_t> reader = std::nullopt) noexcept;
  /// A host block owned by the returned pointer: the last copy's release
  /// gives it back. For blocks without a fence.
  std::shared_ptr<uint8_t> acquire_shared(size_t bytes);

  /// Frees the idle blocks now, and from now on every block as it comes back.
  void close() noexcept;
  /// Sets how many idle blocks are kept (the loader's window may change).
  void set_max_idle(size_t n);

  MemoryKind kind() const { return alloc_->kind(); }
  size_t blocks() const;  ///< blocks alive (idle + in use)
  size_t bytes() const;   ///< their total capacity

 private:
  struct Idle {
    Block block;
    BlockFence::Token fence;  // null when nothing else read it
  };
  BlockPool(std::shared_ptr<BlockAllocator> alloc, std::shared_ptr<BlockFence> fence,
            size_t max_idle);
  void free_now(Idle idle) noexcept;
  Block allocate(size_t bytes);

  std::shared_ptr<BlockAllocator> alloc_;
  std::shared_ptr<BlockFence> fence_;
  const int pid_;
  mutable std::mutex mu_;
  size_t max_idle_;         // guarded by mu_
  std::vector<Idle> idle_;  // guarded by mu_
  bool closed_ = false;     // guarded by mu_
  size_t live_ = 0;         // guarded by mu_
  size_t live_bytes_ = 0;   // guarded by mu_
};

}  // namespace stoker
