#pragma once

// The file of a shared decoded cache: open-file-description locks on its bytes
// and the sweep of files a killed run left (NOTE [ Cache lifetime ] in
// cache/decoded_cache.cpp).

#include <sys/types.h>

#include <chrono>
#include <string>

namespace stoker {

// A cache file's name starts with this, then the user id and "-".
inline constexpr char kCacheFilePrefix[] = "stoker-cache-";
// The longest wait for a lock (a holder that is stopped, not dead, keeps it).
inline constexpr auto kCacheLockWait = std::chrono::seconds(30);

// One byte of the file locked (type F_RDLCK, F_WRLCK or F_UNLCK) as an
// open-file-description lock; `wait`: block until it is had.
bool ofd_lock(int fd, short type, off_t byte, bool wait);

// The lock, waiting at most kCacheLockWait.
bool ofd_lock_within(int fd, short type, off_t byte);

// Whether `fd` is the file at `path` now (not removed or replaced).
bool same_file(int fd, const std::string& path);

// Removes this user's cache files in `dir` that no process holds, except
// `keep`. Best effort; never blocks.
void sweep(const std::string& dir, const std::string& keep);

}  // namespace stoker
