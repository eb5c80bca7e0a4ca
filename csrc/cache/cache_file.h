#pragma once

// The file of a shared decoded cache: the user's private folder it lives in,
// the checks a file passes before it is joined (NOTE [ Cache trust ] in
// cache/decoded_cache.cpp), open-file-description locks on its bytes, the sweep
// of files a killed run left (NOTE [ Cache lifetime ]), and the join itself
// (DecodedCache::attach_shared, in cache_file.cpp).

#include <sys/types.h>

#include <chrono>
#include <string>

namespace stoker {

// A cache file's name starts with this.
inline constexpr char kCacheFilePrefix[] = "stoker-cache-";
// The longest wait for a lock (a holder that is stopped, not dead, keeps it).
inline constexpr auto kCacheLockWait = std::chrono::seconds(30);

// The folder dir/stoker-<euid>, made with mode 0700 if missing, opened without
// following a link and checked on the open descriptor: a folder of this user
// with no group or other bits. Its descriptor, or -1 with the reason in `why`.
int open_private_dir(const std::string& dir, std::string* why);

// Whether the file open at `fd` (`path`, for the reason) may be joined: a
// regular file of this user, no group or other bits, one link. False with the
// reason in `why`.
bool private_file(int fd, const std::string& path, std::string* why);

// One byte of the file locked (type F_RDLCK, F_WRLCK or F_UNLCK) as an
// open-file-description lock; `wait`: block until it is had.
bool ofd_lock(int fd, short type, off_t byte, bool wait);

// The lock, waiting at most kCacheLockWait.
bool ofd_lock_within(int fd, short type, off_t byte);

// Whether `fd` is the file `name` of the folder open at `dir_fd` now (not
// removed or replaced).
bool same_file(int fd, int dir_fd, const std::string& name);

// Removes the cache files of the folder open at `dir_fd` that no process
// holds, except `keep`. Best effort; never blocks.
void sweep(int dir_fd, const std::string& keep);

}  // namespace stoker
