// Shared batch memory (NOTE [ Shared batch memory ] in pipeline/shared_memory.h):
// blocks another process can map through their descriptor, named by address
// while they live and dead once freed, and dropped by a forked worker, which
// then holds neither their mapping nor their descriptor. A block live at a fork
// whose child keeps it is never reused.
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "pipeline/shared_memory.h"

using namespace stoker;

namespace {

// A block's bytes, written here, read through a second mapping of its descriptor
// (as a worker process maps it); an address inside it names it, with its offset.
void blocks_are_shared_and_named() {
  auto alloc = shared_allocator();
  CHECK(alloc->kind() == MemoryKind::kPageable);
  auto* p = static_cast<uint8_t*>(alloc->allocate(10000));
  CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  std::memset(p, 7, 10000);
  std::optional<SharedBlock> b = find_shared_block(p + 5000);
  CHECK(b.has_value());
  CHECK_EQ(b->offset, 5000u);
  CHECK(b->size >= 10000);
  void* other = ::mmap(nullptr, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
  CHECK(other != MAP_FAILED);
  CHECK_EQ(static_cast<uint8_t*>(other)[9999], 7);
  static_cast<uint8_t*>(other)[0] = 9;  // a worker's write, seen by the loader
  CHECK_EQ(p[0], 9);
  // an idle block's pages given back: zeros in every mapping, and none resident
  CHECK(alloc->release_pages(p, 10000));
  CHECK_EQ(p[0], 0);
  CHECK_EQ(static_cast<uint8_t*>(other)[9999], 0);
  std::memset(p, 7, 10000);  // written again: fresh pages
  CHECK_EQ(static_cast<uint8_t*>(other)[9999], 7);
  ::munmap(other, b->size);
  CHECK(!find_shared_block(p + b->size).has_value() || find_shared_block(p + b->size)->id != b->id);
  CHECK(dead_shared_blocks({b->id}).empty());
  const uint64_t id = b->id;
  alloc->deallocate(p, 10000);
  CHECK_EQ(dead_shared_blocks({id}), std::vector<uint64_t>{id});
  // ids are never reused
  auto* q = alloc->allocate(10000);
  CHECK(find_shared_block(q)->id > id);
  alloc->deallocate(q, 10000);
}

// Whether the mapping at `p` is a shared block's (/proc/self/maps names its memfd).
bool maps_block(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    const uintptr_t lo = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    const uintptr_t hi = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
    if (a >= lo && a < hi) return line.find("stoker-batch") != std::string::npos;
  }
  return false;
}

// A child forked while blocks live drops them: no mapping of their memory (the
// range stays reserved), no descriptor, nothing registered; the parent's blocks
// are untouched.
void a_forked_worker_forgets_the_blocks() {
  auto alloc = shared_allocator();
  auto* p = static_cast<uint8_t*>(alloc->allocate(1 << 20));
  std::memset(p, 3, 1 << 20);
  const SharedBlock b = *find_shared_block(p);
  struct stat st {};
  CHECK(::fstat(b.fd, &st) == 0);
  CHECK(maps_block(p));
  const pid_t pid = ::fork();
  if (pid == 0) {
    forget_shared_blocks_after_fork();
    struct stat after {};
    const bool fd_gone = ::fstat(b.fd, &after) != 0 || after.st_ino != st.st_ino;
    const bool unregistered = !find_shared_block(p).has_value();
    // the range is still reserved, but no longer the block's memory
    const bool reserved = !maps_block(p);
    ::_exit(fd_gone && unregistered && reserved ? 0 : 1);
  }
  int status = 0;
  CHECK(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_EQ(p[(1 << 20) - 1], 3);
  CHECK(find_shared_block(p).has_value());
  alloc->deallocate(p, 1 << 20);
}

// Blocks made and freed on several threads at once keep distinct ids, and a
// fork() meanwhile never inherits the registry's lock held (pthread_atfork):
// the child's forget and lookups return.
void many_threads_and_a_fork() {
  auto alloc = shared_allocator();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        void* p = alloc->allocate(4096 * (1 + i % 3));
        CHECK(find_shared_block(p).has_value());
        alloc->deallocate(p, 0);
      }
    });
#if defined(__SANITIZE_THREAD__)
  // (ThreadSanitizer fails a child forked from a multi-threaded process: its
  // threads "leak". The allocations above still race each other here.)
  constexpr int kForks = 0;
#else
  constexpr int kForks = 20;
#endif
  for (int k = 0; k < kForks; ++k) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      forget_shared_blocks_after_fork();
      ::_exit(find_shared_block(nullptr).has_value() ? 1 : 0);
    }
    int status = 0;
    CHECK(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  for (auto& t : threads) t.join();
}

// After a fork whose child keeps its mappings (mark_shared_blocks_forked): a
// block live then is freed when given back to its pool, never handed to a later
// lease (the child may still read it); a block made after the mark goes round.
void blocks_live_at_a_users_fork_are_not_reused() {
  auto pool = BlockPool::create(shared_allocator(), nullptr, 4);
  BlockPool::Block held = pool->acquire(1 << 16);
  const uint64_t id = find_shared_block(held.data)->id;
  CHECK(shared_allocator()->recyclable(held.data));
  mark_shared_blocks_forked();
  CHECK(!shared_allocator()->recyclable(held.data));
  pool->release(held);
  CHECK_EQ(dead_shared_blocks({id}), std::vector<uint64_t>{id});  // freed at once
  CHECK_EQ(pool->blocks(), 0u);
  BlockPool::Block fresh = pool->acquire(1 << 16);
  const uint64_t fresh_id = find_shared_block(fresh.data)->id;
  CHECK(fresh_id > id);
  pool->release(fresh);
  BlockPool::Block again = pool->acquire(1 << 16);  // the unmarked block is reused
  CHECK_EQ(find_shared_block(again.data)->id, fresh_id);
  pool->release(again);
  CHECK(pageable_allocator()->recyclable(nullptr));  // private memory: always
}

}  // namespace

TEST_MAIN(blocks_are_shared_and_named(); a_forked_worker_forgets_the_blocks();
          many_threads_and_a_fork(); blocks_live_at_a_users_fork_are_not_reused())
