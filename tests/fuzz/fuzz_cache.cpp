// libFuzzer target: arbitrary bytes written over a live decoded cache's file
// (its header, process slots, entry words and entries), as a stray write or a
// process of the same user gone wrong would (NOTE [ Cache trust ] in
// cache/decoded_cache.cpp). A process that joins the file afterwards, and one
// that had it mapped before, must look up, read, insert and count every entry
// without a crash: no signal, no read outside the mapping (ASan), no UB (UBSan).
// Every entry find() hands out is read whole, and has the size it claims.
//
// The input is a list of patches: u16 offset (little-endian, taken modulo the
// file's size), u8 length, then that many bytes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cache/decoded_cache.h"

using namespace stoker;

namespace {

const std::string& folder() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/stoker-fuzz-cache-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    return std::string(tmpl);
  }();
  return dir;
}

constexpr int64_t kSlots = 8;

DecodedCacheOptions options() {
  DecodedCacheOptions o;
  o.budget = DecodedCache::index_bytes(kSlots, 4) + (64 << 10);
  o.slots = kSlots;
  o.variants = 4;
  o.identity = 7;
  o.dir = folder();
  return o;
}

// Reads every pixel of every entry, inserts where it can, and counts: the
// entries it hands out must be readable and of the size they claim.
uint64_t exercise(DecodedCache& c) {
  uint64_t sum = 0;
  for (int64_t s = 0; s < kSlots; ++s) {
    for (int v = 0; v < 4; ++v) {
      CachedImage e;
      if (!c.find(s, v, &e)) continue;
      if (e.pix.width <= 0 || e.pix.height <= 0 || e.pix.stride < size_t(e.pix.width) * 3)
        std::abort();
      for (int y = 0; y < e.pix.height; ++y)
        for (int x = 0; x < e.pix.width * 3; ++x) sum += e.pix.data[size_t(y) * e.pix.stride + x];
    }
    CachedImage any;
    int variant = -1;
    if (c.find_any(s, &any, &variant) && (variant < 0 || variant > 3)) std::abort();
    if (DecodedCache::Writer w = c.begin(s, int(s % 4), 3, 2, 6, 4)) {
      std::memset(w.pixels(), int(s), w.stride() * 2);
      w.publish();
    }
  }
  const DecodedCacheStats st = c.stats();
  return sum + uint64_t(st.entries + st.images + st.bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const DecodedCacheOptions o = options();
  auto holder = DecodedCache::open(o);  // lays the file out anew: nobody else holds it
  if (!holder->shared()) return 0;
  for (int64_t s = 0; s < kSlots; s += 2)
    if (DecodedCache::Writer w = holder->begin(s, 3, 5, 4, 10, 8)) {
      std::memset(w.pixels(), 0x5a, w.stride() * 4);
      w.publish();
    }
  const int fd = ::open(holder->path().c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return 0;
  const uint64_t file = static_cast<uint64_t>(o.budget);
  size_t at = 0;
  while (at + 3 <= size) {
    const uint64_t off = (uint64_t(data[at]) | uint64_t(data[at + 1]) << 8) % file;
    size_t len = data[at + 2];
    at += 3;
    len = std::min<size_t>({len, size - at, static_cast<size_t>(file - off)});
    if (::pwrite(fd, data + at, len, static_cast<off_t>(off)) < 0) break;
    at += len;
  }
  ::close(fd);
  volatile uint64_t sink = 0;
  {
    auto joiner = DecodedCache::open(o);  // another open file: as another process
    sink = sink + exercise(*joiner);
  }
  sink = sink + exercise(*holder);
  return 0;
}
