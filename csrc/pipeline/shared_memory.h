// Batch memory that another process can write into (NOTE [ Shared batch memory ]).
//
// NOTE [ Shared batch memory ]
// A loader with a Python stage takes its host batch blocks from anonymous shared
// memory (memfd_create + mmap(MAP_SHARED)) rather than the heap, so that a Python
// worker process can write its samples' rows straight into the batch it belongs to
// (python/stoker/_stage/direct.py): the loader's process sends the block's
// descriptor with each request, and the rows never pass through a second
// buffer. Every block is registered process-wide by address:
// find_shared_block() names the block an address lies in (its descriptor and a
// process-unique id that is never reused), dead_shared_blocks() which ids have
// been freed. A worker forked from the loader's process drops the blocks it inherited
// (forget_shared_blocks_after_fork): a block the loader frees is freed, not kept
// alive by a worker's inherited mapping or descriptor. A fork() never meets the
// registry's lock held (pthread_atfork).
//
// A process that the user forks keeps the parent's mappings: a batch it holds is
// the parent's block itself, not a copy on write. So after such a fork the parent
// marks every live block (mark_shared_blocks_forked, from os.fork()'s hook in
// python/stoker/_stage/lifecycle.py): given back, a marked block is freed rather
// than handed to a later batch, and the child keeps the pages of its batches as
// they were (the memfd lives while the child maps it). Blocks idle at the fork
// are marked too (the registry does not know which are idle): each is freed once
// after its next use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "pipeline/block_pool.h"

namespace stoker {

/// Page-aligned blocks of shared memory (pageable: MemoryKind::kPageable).
std::shared_ptr<BlockAllocator> shared_allocator();

struct SharedBlock {
  int fd = -1;        ///< open while the block lives; the registry owns it
  uint64_t id = 0;    ///< unique in the process, never reused
  size_t offset = 0;  ///< of the address asked about, in the block
  size_t size = 0;    ///< the block's mapped size
};

/// The shared block `p` lies in, if any.
std::optional<SharedBlock> find_shared_block(const void* p);
/// Those of `ids` that name no live block (freed, or never made here).
std::vector<uint64_t> dead_shared_blocks(const std::vector<uint64_t>& ids);
/// In a process just forked from one with shared blocks: each inherited mapping
/// becomes an inaccessible reservation and each descriptor is closed, so the
/// memory goes when the parent frees it. Only for the loader's own worker processes.
void forget_shared_blocks_after_fork() noexcept;
/// In the parent, after a fork whose child keeps its mappings (the user's, not a
/// worker's): every live block is freed when given back, never reused.
void mark_shared_blocks_forked() noexcept;

}  // namespace stoker
