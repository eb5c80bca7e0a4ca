#include "format/mapped_file.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"

namespace stoker {

namespace {

// The registry the SIGBUS handler reads (NOTE [ Shards changed under a reader ]
// in mapped_file.h). Slots live in chunks that are never freed, so the handler
// walks them without locks or allocation; registration takes a mutex the
// handler never touches.
constexpr size_t kSlotsPerChunk = 1024;

struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};  // 0: free. Written last on register, first on release.
  std::atomic<uint32_t> faults{0};
};

struct Chunk {
  Slot slots[kSlotsPerChunk];
  std::atomic<Chunk*> next{nullptr};
};

static_assert(std::atomic<uintptr_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "the SIGBUS handler may only touch lock-free atomics");

Chunk g_head;  // static storage: the first 1024 mappings need no allocation at all
std::atomic<uint64_t> g_total_faults{0};
std::atomic<size_t> g_live{0};
uintptr_t g_page_mask = ~uintptr_t{4095};

// The handler ours replaced. Two copies so that re-installing (a new previous
// handler) never rewrites the copy a running handler may be reading.
struct sigaction g_previous[2];
std::atomic<int> g_previous_index{0};

std::mutex g_mu;  // registration and installation; never taken by the handler
Chunk* g_tail = &g_head;
size_t g_tail_used = 0;

std::vector<Slot*>& free_slots() {
  static std::vector<Slot*> v;  // guarded by g_mu
  return v;
}

// Replaces the faulting page of one of our mappings with zeros. Async-signal-
// safe: atomics and one mmap system call.
bool absorb_fault(uintptr_t addr) {
  for (Chunk* c = &g_head; c != nullptr; c = c->next.load(std::memory_order_acquire)) {
    for (Slot& s : c->slots) {
      const uintptr_t end = s.end.load(std::memory_order_acquire);
      if (addr >= end) continue;  // free slots have end 0
      const uintptr_t begin = s.begin.load(std::memory_order_acquire);
      // begin 0 or a changed end: the slot is being released or reused right now.
      if (begin == 0 || addr < begin || s.end.load(std::memory_order_acquire) != end) continue;
      void* page = reinterpret_cast<void*>(addr & g_page_mask);
      void* p =
          ::mmap(page, ~g_page_mask + 1, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p == MAP_FAILED) return false;
      s.faults.fetch_add(1, std::memory_order_relaxed);
      g_total_faults.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

void pass_on(int sig, siginfo_t* info, void* uctx) {
  const struct sigaction& prev = g_previous[g_previous_index.load(std::memory_order_acquire)];
  const bool sent = info == nullptr || info->si_code <= 0;  // kill()/raise(), not a fault
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (prev.sa_handler == SIG_IGN) {
    if (sent) return;
    // A real fault cannot be ignored: the kernel would kill us; do the same below.
  } else if (prev.sa_handler != SIG_DFL) {
    prev.sa_handler(sig);
    return;
  }
  // The default action: reinstate it. A fault then recurs when we return and
  // ends the process exactly as if we had not been there; a sent signal is
  // raised again (blocked until we return).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  if (sent) ::raise(sig);
}

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  const bool ours = info != nullptr && info->si_code > 0 &&
                    absorb_fault(reinterpret_cast<uintptr_t>(info->si_addr));
  errno = saved_errno;
  if (!ours) pass_on(sig, info, uctx);
}

// Installs on_sigbus unless it is the current handler. Caller holds g_mu.
void ensure_handler_locked() {
  struct sigaction cur;
  if (::sigaction(SIGBUS, nullptr, &cur) != 0) return;
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == &on_sigbus) return;
  g_page_mask = ~static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE) - 1);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = &on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  const int next = 1 - g_previous_index.load(std::memory_order_relaxed);
  if (::sigaction(SIGBUS, &sa, &g_previous[next]) != 0) return;
  g_previous_index.store(next, std::memory_order_release);
}

Slot* register_range(uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(g_mu);
  ensure_handler_locked();
  Slot* s;
  auto& pool = free_slots();
  if (!pool.empty()) {
    s = pool.back();
    pool.pop_back();
  } else {
    if (g_tail_used == kSlotsPerChunk) {
      Chunk* c = new Chunk;  // never freed: the handler may walk it at any time
      g_tail->next.store(c, std::memory_order_release);
      g_tail = c;
      g_tail_used = 0;
    }
    s = &g_tail->slots[g_tail_used++];
  }
  s->faults.store(0, std::memory_order_relaxed);
  s->begin.store(begin, std::memory_order_relaxed);
  s->end.store(end, std::memory_order_release);
  g_live.fetch_add(1, std::memory_order_relaxed);
  return s;
}

void release_range(Slot* s) {
  std::lock_guard<std::mutex> lock(g_mu);
  s->end.store(0, std::memory_order_release);
  s->begin.store(0, std::memory_order_release);
  free_slots().push_back(s);
  g_live.fetch_sub(1, std::memory_order_relaxed);
}

long read_long(const char* path) {
  std::ifstream in(path);
  long v = -1;
  in >> v;
  return in ? v : -1;
}

long count_lines(const char* path) {
  std::ifstream in(path);
  long n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

}  // namespace

MappedFile::MappedFile(int fd, size_t size, const std::string& path) : size_(size) {
  if (size == 0) STOKER_THROW(DataError, path, ": cannot map an empty file");
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      const long limit = read_long("/proc/sys/vm/max_map_count");
      const long used = count_lines("/proc/self/maps");
      STOKER_THROW(DataError, path, ": mmap failed: out of memory mappings (this process has ",
                   used, ", vm.max_map_count is ", limit, "; ", live_mappings(),
                   " are stoker shards). Raise the limit (sysctl -w vm.max_map_count=",
                   limit > 0 ? 4 * limit : 262144,
                   ") or write fewer, larger shards (ShardWriter shard_size)");
    }
    STOKER_THROW(DataError, path, ": mmap failed: ", std::strerror(err));
  }
  base_ = static_cast<const uint8_t*>(p);
  const auto b = reinterpret_cast<uintptr_t>(p);
  slot_ = register_range(b, b + size);
}

MappedFile::~MappedFile() {
  if (!base_) return;
  // Deregister first: once unmapped, the range may be reused by any mapping.
  release_range(static_cast<Slot*>(slot_));
  ::munmap(const_cast<uint8_t*>(base_), size_);
}

size_t MappedFile::populate(size_t offset, size_t len,
                            const std::atomic<bool>* stop) const noexcept {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older kernels say EINVAL
#endif
  // Slices of 4 MiB: a stop is seen within a few milliseconds.
  constexpr size_t kSlice = 4 << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + len);
  size_t done = 0;
  static std::atomic<bool> no_madvise{false};
  while (begin < end) {
    if (stop && stop->load(std::memory_order_relaxed)) break;
    const size_t n = std::min(kSlice, end - begin);
    auto* p = const_cast<uint8_t*>(base_) + begin;
    bool touch = no_madvise.load(std::memory_order_relaxed);
    if (!touch && ::madvise(p, n, MADV_POPULATE_READ) != 0) {
      // EFAULT: the file was cut short (its readers report that); ENOMEM, EINTR: give up.
      if (errno != EINVAL) break;
      no_madvise.store(true, std::memory_order_relaxed);  // a kernel before 5.14
      touch = true;
    }
    if (touch) {
      // One read per page; a page past a truncated end reads as zeros (the SIGBUS handler).
      const volatile uint8_t* v = p;
      for (size_t i = 0; i < n; i += page) (void)v[i];
    }
    begin += n;
    done += n;
  }
  return done;
}

bool MappedFile::faulted() const {
  return static_cast<const Slot*>(slot_)->faults.load(std::memory_order_relaxed) != 0;
}

uint64_t MappedFile::total_faults() { return g_total_faults.load(std::memory_order_relaxed); }

size_t MappedFile::live_mappings() { return g_live.load(std::memory_order_relaxed); }

}  // namespace stoker
