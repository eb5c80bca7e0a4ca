#include "cache/cache_file.h"

#include <dirent.h>
#include <fcntl.h>
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

#include "cache/cache_layout.h"
#include "cache/decoded_cache.h"

namespace stoker {

namespace {

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

std::string mode_text(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

}  // namespace

int open_private_dir(const std::string& dir, std::string* why) {
  const std::string sub = "stoker-" + std::to_string(::geteuid());
  const std::string path = dir + "/" + sub;
  const int parent = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0) {
    *why = "cannot use " + dir + " (" + std::strerror(errno) + ")";
    return -1;
  }
  if (::mkdirat(parent, sub.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create " + path + " (" + std::strerror(errno) + ")";
    ::close(parent);
    return -1;
  }
  // Opened without following a link, then checked on the descriptor: what is
  // checked is what is used.
  const int fd = ::openat(parent, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  const int err = errno;
  ::close(parent);
  if (fd < 0) {
    *why = path + " is not a folder of this user's (" + std::strerror(err) +
           "): another user may have made it; it is never used";
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *why = "cannot stat " + path + " (" + std::strerror(errno) + ")";
  } else if (st.st_uid != ::geteuid()) {
    *why = path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
           std::to_string(::geteuid()) + "): another user made it, and a cache there is never used";
  } else if ((st.st_mode & 077) != 0) {
    *why = path + " has mode " + mode_text(st.st_mode) +
           " (other users may read or replace its files): a cache there is never used; remove "
           "the folder, or make it 0700";
  } else {
    return fd;
  }
  ::close(fd);
  return -1;
}

bool private_file(int fd, const std::string& path, std::string* why) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *why = "cannot stat " + path + " (" + std::strerror(errno) + ")";
  } else if (!S_ISREG(st.st_mode)) {
    *why = path + " is not a regular file: never joined";
  } else if (st.st_uid != ::geteuid()) {
    *why = path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
           std::to_string(::geteuid()) + "): never joined";
  } else if ((st.st_mode & 077) != 0) {
    *why = path + " has mode " + mode_text(st.st_mode) +
           " (other users may read or change it): never joined";
  } else if (st.st_nlink != 1) {
    *why = path + " has " + std::to_string(st.st_nlink) + " links: never joined";
  } else {
    return true;
  }
  return false;
}

// One byte of the file locked (or unlocked) as an open-file-description lock:
// owned by the descriptor's open file, so two opens in one process are two
// owners, and dropped by the kernel when the last descriptor of it closes.
bool ofd_lock(int fd, short type, off_t byte, bool wait) {
  struct flock fl;
  std::memset(&fl, 0, sizeof fl);
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  for (;;) {
    if (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return true;
    if (errno != EINTR) return false;
  }
}

// The lock, waiting at most kCacheLockWait (nothing waits forever: a holder that is
// stopped, not dead, keeps it).
bool ofd_lock_within(int fd, short type, off_t byte) {
  const auto deadline = std::chrono::steady_clock::now() + kCacheLockWait;
  for (int i = 0;; ++i) {
    if (ofd_lock(fd, type, byte, false)) return true;
    if (errno != EAGAIN && errno != EACCES) return false;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(i + 1, 20)));
  }
}

bool same_file(int fd, int dir_fd, const std::string& name) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::fstatat(dir_fd, name.c_str(), &b, AT_SYMLINK_NOFOLLOW) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Removes the cache files that no process holds (NOTE [ Cache lifetime ]): what
// a killed run left. Best effort; never blocks.
void sweep(int dir_fd, const std::string& keep) {
  const int list_fd = ::dup(dir_fd);  // closedir() closes the descriptor it was given
  if (list_fd < 0) return;
  DIR* d = ::fdopendir(list_fd);
  if (!d) {
    ::close(list_fd);
    return;
  }
  ::rewinddir(d);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kCacheFilePrefix, 0) != 0 || name == keep) continue;
    const int fd = ::openat(dir_fd, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        ofd_lock(fd, F_WRLCK, 0, false) && ofd_lock(fd, F_WRLCK, 1, false) &&
        same_file(fd, dir_fd, name))
      ::unlinkat(dir_fd, name.c_str(), 0);
    ::close(fd);  // drops the locks
  }
  ::closedir(d);
}

// Joins the shared file of the cache (NOTE [ Cache lifetime ], [ Cache trust ]
// in cache/decoded_cache.cpp), or says why not in fallback_.
void DecodedCache::attach_shared() {
  const std::string folder = private_dir(opts_.dir);
  name_ = file_name(opts_);
  const std::string path = folder + "/" + name_;
  const uint64_t budget = static_cast<uint64_t>(opts_.budget);
  const cache_layout::Layout layout = cache_layout::layout_of(
      static_cast<uint64_t>(opts_.slots), static_cast<uint64_t>(opts_.variants), budget);
  auto fail = [&](const std::string& why) { fallback_ = why; };
  std::string why;
  dir_fd_ = open_private_dir(opts_.dir, &why);
  if (dir_fd_ < 0) {
    fail(why);
    return;
  }
  struct statvfs vfs;
  if (::fstatvfs(dir_fd_, &vfs) != 0) {
    fail("cannot use " + folder + " (" + std::strerror(errno) + ")");
    return;
  }
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int fd =
        ::openat(dir_fd_, name_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      fail("cannot create " + path + " (" + std::strerror(errno) + ")");
      return;
    }
    auto region = std::make_unique<Region>();
    auto give_up = [&](const std::string& reason, bool remove) {
      region.reset();  // unmapped
      if (remove && same_file(fd, dir_fd_, name_)) ::unlinkat(dir_fd_, name_.c_str(), 0);
      ::close(fd);
      fail(reason);
    };
    if (!private_file(fd, path, &why)) {  // never joined (NOTE [ Cache trust ])
      give_up(why, false);
      return;
    }
    if (!ofd_lock_within(fd, F_WRLCK, 0)) {
      give_up("another process held " + path + " for too long", false);
      return;
    }
    if (!same_file(fd, dir_fd_, name_)) {  // removed (or replaced) before we took the door: again
      ::close(fd);
      continue;
    }
    const bool alone = ofd_lock(fd, F_WRLCK, 1, false);
    if (alone) {
      // No process maps it: new, or left by processes that are all gone. Laid
      // out anew (NOTE [ Cache lifetime ]), after sweeping other leftovers.
      sweep(dir_fd_, name_);
      ::fstatvfs(dir_fd_, &vfs);
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
      if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(layout.data)); e != 0) {
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
    region->base = static_cast<uint8_t*>(p);
    region->size = budget;
    Header* h = reinterpret_cast<Header*>(region->base);
    if (alone) {
      cache_layout::write_layout(h, opts_, layout);
      h->ready.store(cache_layout::kReady, std::memory_order_release);
      ofd_lock(fd, F_RDLCK, 1, false);  // exclusive -> shared: an atomic conversion
    } else if (!cache_layout::layout_matches(h, opts_, layout)) {
      give_up(path + " holds a cache of other parameters, or a damaged header", false);
      return;
    }
    region->lay(layout, static_cast<uint64_t>(opts_.slots), static_cast<uint64_t>(opts_.variants));
    region->fd = fd;
    const uint64_t claim = cache_layout::take_slot(*region, fd);
    if (claim == 0) {
      region->fd = -1;
      give_up(std::to_string(cache_layout::kProcessSlots) + " processes map " + path + " already",
              alone);
      return;
    }
    ofd_lock(fd, F_UNLCK, 0, false);  // the door
    claim_.store(claim, std::memory_order_relaxed);
    slot_fd_.store(fd, std::memory_order_relaxed);
    owner_pid_ = ::getpid();
    slot_pid_.store(owner_pid_, std::memory_order_release);
    path_ = path;
    shared_ = std::move(region);
    return;
  }
  fail(path + " kept changing while this process joined it");
}

}  // namespace stoker
