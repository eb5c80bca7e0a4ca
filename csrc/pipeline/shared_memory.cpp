#include "pipeline/shared_memory.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <unordered_set>

#include "common/error.h"

namespace stoker {

namespace {

struct Entry {
  int fd;
  uint64_t id;
  size_t size;
  bool forked = false;  // live at a fork whose child keeps it mapped: never reused
};

// Every live block by its base address. The lock is taken around fork() too
// (pthread_atfork), so a child never inherits it held.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Entry> blocks;
  std::unordered_set<uint64_t> ids;
  uint64_t next_id = 1;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: blocks may outlive static teardown
    ::pthread_atfork([] { registry().mu.lock(); }, [] { registry().mu.unlock(); },
                     [] { registry().mu.unlock(); });
    return reg;
  }();
  return *r;
}

class SharedAllocator final : public BlockAllocator {
 public:
  void* allocate(size_t bytes) override {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t n = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
    const int fd = ::memfd_create("stoker-batch", MFD_CLOEXEC);
    if (fd < 0) throw std::bad_alloc();
    if (::ftruncate(fd, static_cast<off_t>(n)) != 0) {
      ::close(fd);
      throw std::bad_alloc();
    }
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw std::bad_alloc();
    }
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.ids.insert(r.next_id);
    r.blocks[reinterpret_cast<uintptr_t>(p)] = Entry{fd, r.next_id++, n, false};
    return p;
  }
  void deallocate(void* p, size_t) noexcept override {
    Registry& r = registry();
    Entry e{-1, 0, 0};
    {
      std::lock_guard<std::mutex> lock(r.mu);
      auto it = r.blocks.find(reinterpret_cast<uintptr_t>(p));
      if (it == r.blocks.end()) return;  // (not ours: cannot happen)
      e = it->second;
      r.ids.erase(e.id);
      r.blocks.erase(it);
    }
    ::munmap(p, e.size);
    ::close(e.fd);
  }
  MemoryKind kind() const override { return MemoryKind::kPageable; }
  bool release_pages(void* p, size_t bytes) noexcept override {
    // (MADV_REMOVE frees the memfd's pages themselves, in every process that maps
    // them: a worker's mapping reads zeros after it, and holds nothing.)
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return ::madvise(p, (std::max<size_t>(bytes, 1) + page - 1) / page * page, MADV_REMOVE) == 0;
  }
  bool recyclable(const void* p) const noexcept override {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.blocks.find(reinterpret_cast<uintptr_t>(p));
    return it == r.blocks.end() || !it->second.forked;
  }
};

}  // namespace

std::shared_ptr<BlockAllocator> shared_allocator() {
  static auto alloc = std::make_shared<SharedAllocator>();
  return alloc;
}

std::optional<SharedBlock> find_shared_block(const void* p) {
  Registry& r = registry();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.blocks.upper_bound(a);
  if (it == r.blocks.begin()) return std::nullopt;
  --it;
  if (a >= it->first + it->second.size) return std::nullopt;
  return SharedBlock{it->second.fd, it->second.id, a - it->first, it->second.size};
}

std::vector<uint64_t> dead_shared_blocks(const std::vector<uint64_t>& ids) {
  Registry& r = registry();
  std::vector<uint64_t> dead;
  std::lock_guard<std::mutex> lock(r.mu);
  for (uint64_t id : ids)
    if (r.ids.count(id) == 0) dead.push_back(id);
  return dead;
}

void forget_shared_blocks_after_fork() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [base, e] : r.blocks) {
    // (a reservation, not a hole: a stray pointer into it faults rather than
    // landing in a later mapping)
    ::mmap(reinterpret_cast<void*>(base), e.size, PROT_NONE,
           MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ::close(e.fd);
  }
  r.blocks.clear();
  r.ids.clear();
}

void mark_shared_blocks_forked() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [base, e] : r.blocks) e.forked = true;
}

}  // namespace stoker
