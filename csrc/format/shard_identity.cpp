#include "format/shard_identity.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace stoker {

std::string DatasetId::hex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

DatasetId DatasetId::from_hex(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    STOKER_THROW(UsageError, "dataset id '", hex, "' is not 32 lowercase hex digits");
  };
  if (hex.size() != 32) STOKER_THROW(UsageError, "dataset id '", hex, "' is not 32 hex digits");
  DatasetId id;
  for (size_t i = 0; i < 16; ++i)
    id.bytes[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return id;
}

DatasetId DatasetId::random() {
  DatasetId id;
  size_t got = 0;
  while (got < id.bytes.size()) {
    ssize_t n = ::getrandom(id.bytes.data() + got, id.bytes.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      STOKER_THROW(DataError, "cannot draw a dataset id: getrandom: ", std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  return id;
}

}  // namespace stoker
