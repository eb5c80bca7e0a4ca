#include "cache/cache_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace stoker {

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

bool same_file(int fd, const std::string& path) {
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// Removes this user's cache files that no process holds (NOTE [ Cache
// lifetime ]): what a killed run left. Best effort; never blocks.
void sweep(const std::string& dir, const std::string& keep) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const std::string mine = std::string(kCacheFilePrefix) + std::to_string(::geteuid()) + "-";
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(mine, 0) != 0 || name == keep) continue;
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        ofd_lock(fd, F_WRLCK, 0, false) && ofd_lock(fd, F_WRLCK, 1, false) && same_file(fd, path))
      ::unlink(path.c_str());
    ::close(fd);  // drops the locks
  }
  ::closedir(d);
}

}  // namespace stoker
