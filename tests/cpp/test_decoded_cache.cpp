// Unit tests of csrc/cache: the decoded-sample cache's entries (publish once,
// read lock-free), its budget, sharing between opens of one file (as between
// processes), writers killed mid-insert, and the file's lifetime.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/decoded_cache.h"
#include "check.h"
#include "common/error.h"
#include "test_util.h"

using namespace stoker;

namespace {

// A folder of its own for each test's cache files.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/stoker-cache-test-XXXXXX";
    CHECK(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf " + path).c_str()); }
  // Files in the user's private folder of it, where the caches live.
  int files() const {
    int n = 0;
    if (DIR* d = ::opendir(DecodedCache::private_dir(path).c_str())) {
      while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  }
};

DecodedCacheOptions options(const std::string& dir, int64_t slots = 64, int64_t budget = 8 << 20,
                            uint64_t identity = 1) {
  DecodedCacheOptions o;
  o.budget = budget;
  o.slots = slots;
  o.variants = 4;
  o.identity = identity;
  o.dir = dir;
  return o;
}

// The pixels an entry of `key` holds in these tests.
uint8_t pattern(uint64_t key, int x, int y, int c) {
  return static_cast<uint8_t>(key * 31 + static_cast<uint64_t>(y) * 7 + x * 13 + c);
}

// Writes `key`'s pattern into a writer's room, `pause_us` between rows.
void fill(DecodedCache::Writer& w, int width, int height, uint64_t key, int pause_us = 0) {
  for (int y = 0; y < height; ++y) {
    uint8_t* row = w.pixels() + static_cast<size_t>(y) * w.stride();
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) row[x * 3 + c] = pattern(key, x, y, c);
    if (pause_us) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
  }
}

// Whether an entry holds `key`'s whole pattern at (w x h).
bool holds(const CachedImage& e, int width, int height, uint64_t key) {
  if (e.pix.width != width || e.pix.height != height) return false;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        if (e.pix.data[static_cast<size_t>(y) * e.pix.stride + x * 3 + c] != pattern(key, x, y, c))
          return false;
  return true;
}

bool insert(DecodedCache& c, int64_t slot, int variant, int w, int h, uint64_t key) {
  DecodedCache::Writer wr = c.begin(slot, variant, w, h, w * 2, h * 2);
  if (!wr) return false;
  fill(wr, w, h, key);
  wr.publish();
  return true;
}

void test_entries_publish_once_and_read_back() {
  for (bool shared : {false, true}) {
    TempDir dir;
    auto c = DecodedCache::open(options(shared ? dir.path : ""));
    CHECK_EQ(c->shared(), shared);
    CHECK(c->fallback().empty());
    CachedImage e;
    CHECK(!c->find(3, 1, &e));
    CHECK(!c->find_any(3, &e));
    {
      DecodedCache::Writer w = c->begin(3, 1, 20, 10, 40, 20);
      CHECK(static_cast<bool>(w));
      CHECK(!c->begin(3, 1, 20, 10, 40, 20));  // claimed: a second writer stays out
      fill(w, 20, 10, 7);
      CHECK(!c->find(3, 1, &e));  // not yet published
      const CachedImage mine = w.publish();
      CHECK(holds(mine, 20, 10, 7));
    }
    CHECK(c->find(3, 1, &e) && holds(e, 20, 10, 7) && e.full_w == 40 && e.full_h == 20);
    CHECK(c->find_any(3, &e) && holds(e, 20, 10, 7));
    CHECK(!c->find(3, 0, &e) && !c->find(2, 1, &e) && !c->find(64, 1, &e) && !c->find(-1, 1, &e));
    CHECK(!c->begin(3, 1, 20, 10, 40, 20));  // published: never written again
    {  // a writer dropped unpublished (a failed decode) gives the entry back
      DecodedCache::Writer w = c->begin(5, 3, 8, 8, 8, 8);
      CHECK(static_cast<bool>(w));
    }
    CHECK(!c->find(5, 3, &e));
    CHECK(insert(*c, 5, 3, 8, 8, 9));
    CHECK(c->find(5, 3, &e) && holds(e, 8, 8, 9));
    const DecodedCacheStats s = c->stats();
    CHECK_EQ(s.entries, 2);
    CHECK_EQ(s.images, 2);
    CHECK_EQ(s.inserts, 2);
    CHECK_EQ(s.shared, shared);
    CHECK(s.bytes <= s.budget);
  }
}

void test_budget_is_exact() {
  TempDir dir;
  const int64_t slots = 1000;
  const int64_t index = DecodedCache::index_bytes(slots, 4);
  CHECK_THROWS(UsageError, DecodedCache::open(options(dir.path, slots, index)));
  // Room for 10 entries of 64 + 32 * 32 * 3 bytes.
  const int64_t entry = 64 + 32 * 32 * 3;
  auto c = DecodedCache::open(options(dir.path, slots, index + 10 * entry + 63));
  int stored = 0;
  for (int64_t s = 0; s < 20; ++s) stored += insert(*c, s, 3, 32, 32, static_cast<uint64_t>(s));
  CHECK_EQ(stored, 10);
  const DecodedCacheStats st = c->stats();
  CHECK(st.full);
  CHECK_EQ(st.declined, 10);
  CHECK_EQ(st.images, 10);
  CHECK(st.bytes <= st.budget);
  struct stat f;
  CHECK(::stat(c->path().c_str(), &f) == 0 && f.st_size == st.budget);
  CachedImage e;
  for (int64_t s = 0; s < 20; ++s)  // what fit is whole; what did not is absent
    CHECK(c->find(s, 3, &e) == (s < 10) && (s >= 10 || holds(e, 32, 32, static_cast<uint64_t>(s))));
  CHECK(!insert(*c, 11, 0, 2, 2, 1));  // not even a small one: the budget is spent
}

void test_two_opens_share_entries_and_the_last_removes_the_file() {
  TempDir dir;
  auto a = DecodedCache::open(options(dir.path));
  auto b = DecodedCache::open(options(dir.path));  // another open file: as another process
  CHECK(a->shared() && b->shared() && a->path() == b->path());
  CHECK(insert(*a, 1, 3, 16, 16, 1));
  CHECK(insert(*b, 2, 3, 16, 16, 2));
  CachedImage e;
  CHECK(b->find(1, 3, &e) && holds(e, 16, 16, 1));
  CHECK(a->find(2, 3, &e) && holds(e, 16, 16, 2));
  CHECK(!b->begin(1, 3, 16, 16, 32, 32));  // a's entry: not written twice
  CHECK_EQ(a->stats().images, 2);
  // Other parameters or another dataset: another file, never these entries.
  auto other = DecodedCache::open(options(dir.path, 64, 8 << 20, 2));
  CHECK(other->shared() && other->path() != a->path() && !other->find(1, 3, &e));
  other.reset();
  CHECK_EQ(dir.files(), 1);
  const std::string path = a->path();
  a.reset();
  CHECK(::access(path.c_str(), F_OK) == 0);  // b still maps it
  CHECK(b->find(1, 3, &e) && holds(e, 16, 16, 1));
  b.reset();
  CHECK(::access(path.c_str(), F_OK) != 0);  // the last one out removed it
  CHECK_EQ(dir.files(), 0);
}

void test_a_file_nobody_holds_is_never_read() {
  TempDir dir;
  std::string path;
  {
    auto a = DecodedCache::open(options(dir.path));
    CHECK(insert(*a, 4, 3, 8, 8, 4));
    path = a->path();
    // A copy of the file as a killed run leaves it (no process holds it).
    CHECK(std::system(("cp " + path + " " + path + ".keep").c_str()) == 0);
  }
  CHECK(std::rename((path + ".keep").c_str(), path.c_str()) == 0);
  auto b = DecodedCache::open(options(dir.path));
  CHECK(b->shared() && b->path() == path);
  CachedImage e;
  CHECK(!b->find(4, 3, &e));  // laid out anew: a new run reads nothing of the last one's
  CHECK_EQ(b->stats().entries, 0);
  // A leftover of another cache (another name, nobody holding it) is swept when a
  // process lays out a cache anew.
  const std::string stale = DecodedCache::private_dir(dir.path) + "/stoker-cache-old";
  CHECK(std::system(("cp " + path + " " + stale).c_str()) == 0);
  b.reset();
  auto c = DecodedCache::open(options(dir.path));
  CHECK(::access(stale.c_str(), F_OK) != 0);
  CHECK_EQ(dir.files(), 1);
}

void test_a_file_of_other_parameters_gives_a_private_cache() {
  TempDir dir;
  DecodedCacheOptions o = options(dir.path);
  auto a = DecodedCache::open(o);
  CHECK(a->shared());
  // Corrupt the header's identity: a process with the true parameters joining a
  // file held by another (a hash collision, another version) must not use it.
  const int fd = ::open(a->path().c_str(), O_RDWR);
  CHECK(fd >= 0);
  uint64_t bad = 12345;
  CHECK(::pwrite(fd, &bad, sizeof bad, 24) == sizeof bad);  // Header::identity
  ::close(fd);
  auto b = DecodedCache::open(o);
  CHECK(!b->shared());
  CHECK(b->fallback().find("other parameters") != std::string::npos);
  CHECK(insert(*b, 1, 3, 4, 4, 1));  // works, privately
  // No such folder: private, saying why.
  auto c = DecodedCache::open(options(dir.path + "/missing"));
  CHECK(!c->shared() && !c->fallback().empty());
}

// A writer killed at any point of an insert (SIGKILL, many trials) leaves no
// entry any reader takes for whole when it is not: readers see it as missing
// until another writer takes the dead writer's claim over and writes it.
void test_writers_killed_mid_insert_leave_nothing_torn() {
  TempDir dir;
  const int64_t slots = 400;
  auto reader = DecodedCache::open(options(dir.path, slots, 64 << 20));
  CHECK(reader->shared());
  std::mt19937 rng(12345);
  const int kTrials = 60;
  int killed_mid = 0;
  int64_t next_slot = 0;
  for (int trial = 0; trial < kTrials && next_slot < slots - 10; ++trial) {
    const int64_t first = next_slot;
    const pid_t pid = ::fork();
    CHECK(pid >= 0);
    if (pid == 0) {  // a writer: inserts slot after slot, slowly, until killed
      auto w = DecodedCache::open(options(dir.path, slots, 64 << 20));
      if (!w->shared()) ::_exit(3);
      for (int64_t s = first; s < slots; ++s) {
        DecodedCache::Writer wr = w->begin(s, 3, 24, 24, 48, 48);
        if (!wr) continue;
        fill(wr, 24, 24, static_cast<uint64_t>(s), 40);
        wr.publish();
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 6000));
    ::kill(pid, SIGKILL);
    int status = 0;
    CHECK(::waitpid(pid, &status, 0) == pid);  // reaped: kill(pid, 0) now says it is gone
    CHECK(WIFSIGNALED(status));
    // Every published entry is whole; the first missing one may be claimed by the dead.
    CachedImage e;
    int64_t s = first;
    while (s < slots && reader->find(s, 3, &e)) {
      CHECK(holds(e, 24, 24, static_cast<uint64_t>(s)));
      ++s;
    }
    for (int64_t t = s; t < slots; ++t) CHECK(!reader->find(t, 3, &e));
    if (s < slots) {
      // The killed writer's claim is taken over, and the entry written whole.
      DecodedCache::Writer wr = reader->begin(s, 3, 24, 24, 48, 48);
      killed_mid += static_cast<bool>(wr);
      CHECK(static_cast<bool>(wr));
      fill(wr, 24, 24, static_cast<uint64_t>(s));
      wr.publish();
      CHECK(reader->find(s, 3, &e) && holds(e, 24, 24, static_cast<uint64_t>(s)));
      ++s;
    }
    next_slot = s;
  }
  std::printf("%d writers killed before their last entry, %lld entries written\n", killed_mid,
              static_cast<long long>(next_slot));
  CHECK(killed_mid > 0);
}

// Threads inserting and reading the same slots at once: each entry is written
// by one of them and read whole by all (run under TSan too).
void test_threads_race_on_the_same_entries() {
  TempDir dir;
  auto c = DecodedCache::open(options(dir.path, 256, 32 << 20));
  std::atomic<int> bad{0}, written{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (int64_t s = 0; s < 256; ++s) {
          const int64_t slot = (s * (t + 1) * 7) % 256;
          CachedImage e;
          if (c->find(slot, 2, &e)) {
            bad += !holds(e, 12, 9, static_cast<uint64_t>(slot));
          } else if (DecodedCache::Writer w = c->begin(slot, 2, 12, 9, 12, 9)) {
            fill(w, 12, 9, static_cast<uint64_t>(slot));
            w.publish();
            ++written;
          }
        }
    });
  for (auto& t : threads) t.join();
  CHECK_EQ(bad.load(), 0);
  CHECK_EQ(written.load(), 256);
  CHECK_EQ(c->stats().images, 256);
}

// NOTE [ Cache trust ]: a folder or a file another user could have made or can
// open is never joined; the process keeps a private cache and says why.
void test_files_others_could_open_are_never_joined() {
  {  // a file planted at the cache's path with group and other bits
    TempDir dir;
    std::string path;
    {
      auto a = DecodedCache::open(options(dir.path));
      CHECK(a->shared());
      path = a->path();
    }
    CHECK(::access(path.c_str(), F_OK) != 0);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    CHECK(::fchmod(fd, 0666) == 0);
    CHECK(::ftruncate(fd, 8 << 20) == 0);
    ::close(fd);
    auto b = DecodedCache::open(options(dir.path));
    CHECK(!b->shared());
    CHECK(b->fallback().find("mode 0666") != std::string::npos);
    CHECK(insert(*b, 1, 3, 4, 4, 1));  // works, privately
    struct stat st;
    CHECK(::stat(path.c_str(), &st) == 0 && (st.st_mode & 0777) == 0666);  // left as it was
    // A second link to the file (another user's hard link): never joined either.
    CHECK(::chmod(path.c_str(), 0600) == 0);
    CHECK(::link(path.c_str(), (path + "-link").c_str()) == 0);
    auto c = DecodedCache::open(options(dir.path));
    CHECK(!c->shared() && c->fallback().find("2 links") != std::string::npos);
  }
  {  // the private folder with group or other bits
    TempDir dir;
    const std::string folder = DecodedCache::private_dir(dir.path);
    CHECK(::mkdir(folder.c_str(), 0777) == 0 && ::chmod(folder.c_str(), 0777) == 0);
    auto a = DecodedCache::open(options(dir.path));
    CHECK(!a->shared() && a->fallback().find("mode 0777") != std::string::npos);
    CHECK_EQ(dir.files(), 0);  // nothing made there
  }
  {  // a link where the folder should be
    TempDir dir;
    CHECK(::mkdir((dir.path + "/elsewhere").c_str(), 0700) == 0);
    CHECK(::symlink((dir.path + "/elsewhere").c_str(),
                    DecodedCache::private_dir(dir.path).c_str()) == 0);
    auto a = DecodedCache::open(options(dir.path));
    CHECK(!a->shared() && a->fallback().find("not a folder") != std::string::npos);
  }
  if (::geteuid() == 0) {  // a folder of another user's (root can make one to test with)
    TempDir dir;
    const std::string folder = DecodedCache::private_dir(dir.path);
    CHECK(::mkdir(folder.c_str(), 0700) == 0 && ::chown(folder.c_str(), 65534, 65534) == 0);
    auto a = DecodedCache::open(options(dir.path));
    CHECK(!a->shared() && a->fallback().find("belongs to uid 65534") != std::string::npos);
  }
}

// Bytes of the shared file, changed as a stray write (or a bug) would.
void poke(const std::string& path, off_t at, const void* bytes, size_t n) {
  const int fd = ::open(path.c_str(), O_RDWR);
  CHECK(fd >= 0);
  CHECK(::pwrite(fd, bytes, n, at) == static_cast<ssize_t>(n));
  ::close(fd);
}

uint64_t peek64(const std::string& path, off_t at) {
  uint64_t v = 0;
  const int fd = ::open(path.c_str(), O_RDONLY);
  CHECK(fd >= 0);
  CHECK(::pread(fd, &v, sizeof v, at) == sizeof v);
  ::close(fd);
  return v;
}

// NOTE [ Cache trust ]: nothing read from the mapping is used before it is
// checked: a header with other offsets is not joined, and an entry whose word,
// head or pixels are wrong makes the process leave the shared cache (never a
// signal, never wrong pixels).
void test_a_damaged_cache_is_left_never_trusted() {
  TempDir dir;
  const DecodedCacheOptions o = options(dir.path, 64, 8 << 20);
  auto a = DecodedCache::open(o);
  CHECK(a->shared());
  const std::string path = a->path();
  // Header: the words' offset (8 + 4 + 4 + 8 * 5 bytes in) pointed far away.
  const uint64_t words_at = peek64(path, 56);
  const uint64_t far = uint64_t{1} << 40;
  poke(path, 56, &far, sizeof far);
  auto b = DecodedCache::open(o);
  CHECK(!b->shared() && b->fallback().find("damaged header") != std::string::npos);
  b.reset();
  poke(path, 56, &words_at, sizeof words_at);
  // The layout's fingerprint (another build's structs): not joined either.
  const uint64_t layout = peek64(path, 16) ^ 1;
  poke(path, 16, &layout, sizeof layout);
  CHECK(!DecodedCache::open(o)->shared());
  const uint64_t back = layout ^ 1;
  poke(path, 16, &back, sizeof back);
  CHECK(DecodedCache::open(o)->shared());

  // Entries: a reader in another open (as another process) sees each damage once.
  const uint64_t data = static_cast<uint64_t>(DecodedCache::index_bytes(64, 4));
  CHECK(insert(*a, 0, 3, 8, 8, 1) && insert(*a, 1, 3, 8, 8, 2) && insert(*a, 2, 3, 8, 8, 3));
  const off_t words = static_cast<off_t>(words_at);
  CachedImage e;
  {  // a published word that points past the data region
    auto r = DecodedCache::open(o);
    CHECK(r->find(1, 3, &e) && holds(e, 8, 8, 2));
    const uint64_t bad = (uint64_t{1} << 50) << 2 | 2;
    const uint64_t was = peek64(path, words + 0 * 8 + 3 * 8);
    poke(path, words + 3 * 8, &bad, sizeof bad);  // slot 0, variant 3
    CHECK(!r->find(0, 3, &e));
    CHECK(!r->shared() && r->stats().abandoned && r->stats().corrupt == 1);
    CHECK(r->abandoned_why().find("past the data region") != std::string::npos);
    CHECK(!r->find(1, 3, &e));  // nothing is read from the shared file any more
    CHECK(insert(*r, 1, 3, 8, 8, 2) && r->find(1, 3, &e) && holds(e, 8, 8, 2));  // privately
    poke(path, words + 3 * 8, &was, sizeof was);
  }
  {  // pixels changed under the cache: the checksum (first read in this process)
    auto r = DecodedCache::open(o);
    const uint8_t junk[4] = {1, 2, 3, 4};
    // Entry 2 is the third one handed out: 64-byte head, then 8 x 8 x 3 pixels, rounded to 64.
    const uint64_t entry = (64 + 8 * 8 * 3 + 63) / 64 * 64;
    poke(path, static_cast<off_t>(data + 2 * entry + 64 + 10), junk, sizeof junk);
    CHECK(r->find(0, 3, &e) && holds(e, 8, 8, 1));
    CHECK(!r->find(2, 3, &e));
    CHECK(r->abandoned_why().find("checksum") != std::string::npos);
    CHECK(r->stats().verified == 1 && r->stats().corrupt == 1);
  }
  {  // a head that names another entry
    auto r = DecodedCache::open(o);
    const uint64_t wrong = 99;
    poke(path, static_cast<off_t>(data), &wrong, sizeof wrong);  // entry 0's key
    CHECK(!r->find(0, 3, &e) && !r->shared());
  }
}

// verify_always: every read checks the entry's checksum; otherwise the first
// read in this mapping does, and later ones trust it.
void test_entry_checksums_are_checked_as_records_are() {
  TempDir dir;
  DecodedCacheOptions o = options(dir.path);
  auto w = DecodedCache::open(o);
  CHECK(insert(*w, 5, 3, 16, 16, 5));
  CachedImage e;
  CHECK(w->find(5, 3, &e) && w->stats().verified == 0);  // its writer hashed it
  auto first = DecodedCache::open(o);
  for (int i = 0; i < 3; ++i) CHECK(first->find(5, 3, &e) && holds(e, 16, 16, 5));
  CHECK_EQ(first->stats().verified, 1);
  o.verify_always = true;
  auto always = DecodedCache::open(o);
  for (int i = 0; i < 3; ++i) CHECK(always->find(5, 3, &e) && holds(e, 16, 16, 5));
  CHECK_EQ(always->stats().verified, 3);
}

// NOTE [ Decoded cache ]: a claim belongs to a process slot whose lock the
// kernel holds while its process lives: a live writer's claim is never taken,
// a dead one's always is, whatever pid the dead writer had or a new process has.
void test_claims_follow_the_kernels_locks_not_pids() {
  TempDir dir;
  const DecodedCacheOptions o = options(dir.path);
  auto a = DecodedCache::open(o);
  auto b = DecodedCache::open(o);  // another open: another process's slot
  const std::string path = a->path();
  const off_t words = static_cast<off_t>(peek64(path, 56));  // Header::words_offset
  const off_t word7 = words + (7 * 4 + 3) * 8;
  uint64_t claim = 0;
  {
    DecodedCache::Writer wa = a->begin(7, 3, 4, 4, 4, 4);
    CHECK(static_cast<bool>(wa));
    claim = peek64(path, word7);
    CHECK((claim & 3) == 1);
    CHECK(!b->begin(7, 3, 4, 4, 4, 4));  // a lives: its claim stands
  }  // dropped unpublished: the word is empty again
  CHECK_EQ(peek64(path, word7), uint64_t{0});
  // The claim of the slot's previous holder (as a reused pid was): a lives in that
  // slot now, and the old claim is taken over all the same.
  const uint64_t previous = claim - (uint64_t{1} << 12);
  poke(path, word7, &previous, sizeof previous);
  {
    DecodedCache::Writer wb = b->begin(7, 3, 4, 4, 4, 4);
    CHECK(static_cast<bool>(wb));
  }
  // A claim of a slot nobody holds (its process died, no process took the slot
  // since): taken over.
  const uint64_t orphan = (((claim >> 2) + 500) & 1023) << 2 | 1;
  poke(path, word7, &orphan, sizeof orphan);
  {
    DecodedCache::Writer wb = b->begin(7, 3, 4, 4, 4, 4);
    CHECK(static_cast<bool>(wb));
  }
  // A forked child takes a slot of its own: while it lives its claim stands; once it
  // is killed the parent takes it over.
  int go[2];
  CHECK(::pipe(go) == 0);
  const pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    DecodedCache::Writer w = a->begin(9, 3, 4, 4, 4, 4);
    const char ok = w ? 'y' : 'n';
    if (::write(go[1], &ok, 1) != 1) ::_exit(2);
    for (;;) ::pause();
  }
  char ok = 0;
  CHECK(::read(go[0], &ok, 1) == 1 && ok == 'y');
  CHECK(!a->begin(9, 3, 4, 4, 4, 4));  // the child's claim: alive
  ::kill(pid, SIGKILL);
  int status = 0;
  CHECK(::waitpid(pid, &status, 0) == pid);
  CHECK(static_cast<bool>(a->begin(9, 3, 4, 4, 4, 4)));  // dead: taken over
  ::close(go[0]);
  ::close(go[1]);
}

}  // namespace

TEST_MAIN(test_entries_publish_once_and_read_back(); test_budget_is_exact();
          test_two_opens_share_entries_and_the_last_removes_the_file();
          test_a_file_nobody_holds_is_never_read();
          test_a_file_of_other_parameters_gives_a_private_cache();
          test_writers_killed_mid_insert_leave_nothing_torn();
          test_threads_race_on_the_same_entries(); test_files_others_could_open_are_never_joined();
          test_a_damaged_cache_is_left_never_trusted();
          test_entry_checksums_are_checked_as_records_are();
          test_claims_follow_the_kernels_locks_not_pids())
