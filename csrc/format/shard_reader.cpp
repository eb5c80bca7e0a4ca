#include "format/shard_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/checksum.h"
#include "common/error.h"
#include "common/file_checks.h"
#include "format/detail/shard_checks.h"

namespace stoker {

using format::RecordEntry;
using format::ShardFooter;
using format::ShardHeader;

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

FileStamp stamp_of(const struct stat& st) {
  FileStamp s;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = static_cast<int64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

// pread of exactly n bytes; false on a short file or an error (errno set, 0 if short).
bool read_exact(int fd, void* buf, size_t n, off_t off) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, off);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (got == 0) {
      errno = 0;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
    off += got;
  }
  return true;
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

ShardProbe probe_shard(const std::string& path, const ShardExpectation& expect, int* fd_out) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (fd.fd < 0) STOKER_THROW(DataError, path, ": cannot open shard: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd.fd, &st) != 0)
    STOKER_THROW(DataError, path, ": cannot stat shard: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    STOKER_THROW(DataError, path, ": is ", file_kind(st.st_mode),
                 ", not a shard file (shards must be regular files)");
  ShardProbe p;
  p.stamp = stamp_of(st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  detail::check_shard_size(path, size, expect);
  if (!read_exact(fd.fd, &p.header, sizeof p.header, 0) ||
      !read_exact(fd.fd, &p.footer, sizeof p.footer,
                  static_cast<off_t>(size - sizeof(ShardFooter))))
    STOKER_THROW(DataError, path, ": cannot read shard header and footer: ",
                 errno ? std::strerror(errno) : "file shorter than its size");
  detail::check_shard_header(path, p.header, expect);
  detail::check_shard_footer(path, p.footer, size, expect);
  if (fd_out) {
    *fd_out = fd.fd;
    fd.fd = -1;
  }
  return p;
}

ShardReader::ShardReader(std::string path, uint64_t expected_schema_hash, int64_t expected_records,
                         int64_t expected_bytes)
    : ShardReader(std::move(path),
                  ShardExpectation{expected_schema_hash, expected_records, expected_bytes, {}}) {}

ShardReader::ShardReader(std::string path, const ShardExpectation& expect, Source source)
    : path_(std::move(path)) {
  int raw_fd = -1;
  ShardProbe p = probe_shard(path_, expect, &raw_fd);
  FdCloser fd{raw_fd};
  header_ = p.header;
  stamp_ = p.stamp;
  size_ = static_cast<size_t>(p.stamp.size);
  if (source == kInMemory) {
    StreamingChecksum sum;
    map_ = MappedFile::load(fd.fd, size_, path_, &sum);
    load_sum_ = sum.digest();
  } else {
    map_ = std::make_unique<MappedFile>(fd.fd, size_, path_);
  }
  base_ = map_->data();
  num_fields_ = p.header.num_fields;
  version_ = p.header.version;
  table_offset_ = p.footer.table_offset;
  table_sum_ = p.footer.table_sum;
  num_records_ = static_cast<int64_t>(p.footer.num_records);
  table_ = reinterpret_cast<const RecordEntry*>(base_ + table_offset_);
  if (!detail::table_sum_matches(table_, p.footer.num_records, table_sum_)) {
    if (changed_on_disk()) throw_changed(-1, "record table checksum mismatch");
    detail::throw_table_sum_mismatch(path_);
  }
  detail::check_table_entries(path_, base_ + table_offset_, p.footer.num_records, table_offset_,
                              num_fields_);
  const size_t words = (static_cast<size_t>(num_records_) + 63) / 64;
  verified_ = std::make_unique<std::atomic<uint64_t>[]>(words);  // value-initialised: zeros
  checked_stamp_ = stamp_;  // what probe_shard found: checked this round
  checked_round_.store(file_check_round(), std::memory_order_relaxed);
}

bool ShardReader::check_due() const noexcept {
  return checked_round_.load(std::memory_order_relaxed) != file_check_round();
}

bool ShardReader::check_file() const {
  std::unique_lock<std::mutex> lock(check_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const uint64_t round = file_check_round();
  if (!check_due()) return true;  // another thread checked it meanwhile
  struct stat st;
  const bool found = ::stat(path_.c_str(), &st) == 0;
  if (!found || stamp_of(st) != checked_stamp_) {
    // Changed (or removed, or replaced): every record is hashed again on its next read.
    const size_t words = (static_cast<size_t>(num_records_) + 63) / 64;
    for (size_t w = 0; w < words; ++w) verified_[w].store(0, std::memory_order_relaxed);
    if (found) checked_stamp_ = stamp_of(st);
  }
  checked_round_.store(round, std::memory_order_release);
  return true;
}

RecordView ShardReader::record_unchecked(int64_t i) const {
  if (i < 0 || i >= num_records_)
    STOKER_THROW(UsageError, path_, ": record ", i, " out of range [0, ", num_records_, ")");
  RecordEntry e;
  std::memcpy(&e, table_ + i, sizeof e);
  // The table was validated when mapped; an entry out of bounds now means the
  // bytes under the mapping changed. Checked on every call so that nothing reads
  // outside the mapping, whatever the file became.
  if (e.offset < sizeof(ShardHeader) || e.offset > table_offset_ ||
      e.length > table_offset_ - e.offset || e.length < 4ull * num_fields_)
    throw_changed(i, "record table entry out of bounds");
  return {base_ + e.offset, e.length};
}

RecordView ShardReader::record(int64_t i, Verify verify) const {
  RecordView v = record_unchecked(i);
  if (verify == Verify::kNever) return v;
  // NOTE [ Verified once ]: a version-1 shard is verified on every read unless kOnce.
  const bool once = verify == Verify::kOnce || (verify == Verify::kFirst && version_ >= 2);
  if (once && verified(i)) {
    // The file checked for changes first, once a round (each epoch, and each second
    // of planned batches); a check that another thread is making, or that found a
    // change, means this read hashes.
    const bool checked = in_memory() || !check_due() || check_file();
    if (checked && verified(i)) {
      if (header_changed()) throw_changed(i, "the file now has another shard's header");
      return v;
    }
  }
  uint32_t want;
  std::memcpy(&want, &table_[i].sum, sizeof want);
  if (checksum32(v.data, v.size) != want) {
    if (changed_on_disk()) throw_changed(i, "checksum mismatch");
    STOKER_THROW(DataError, path_, ": record ", i, ": checksum mismatch (corrupt data)");
  }
  // A whole shard copied over this one in place (`cp` of another dataset) has records
  // that match their own table: only the header tells. Writers write it first, so
  // checking it after the record catches any rewrite the record came from.
  if (header_changed()) throw_changed(i, "the file now has another shard's header");
  // Relaxed: the bit only saves a later hash of bytes that cannot have changed
  // unnoticed (NOTE [ Verified once ]); a reader that misses it hashes again.
  if (!verified(i))
    verified_[static_cast<size_t>(i) >> 6].fetch_or(uint64_t{1} << (i & 63),
                                                    std::memory_order_relaxed);
  return v;
}

uint32_t ShardReader::record_sum(int64_t i) const {
  (void)record_unchecked(i);
  uint32_t sum;
  std::memcpy(&sum, &table_[i].sum, sizeof sum);
  return sum;
}

RecordView ShardReader::records_region() const {
  return {base_ + sizeof(ShardHeader), static_cast<size_t>(table_offset_ - sizeof(ShardHeader))};
}

uint32_t ShardReader::file_checksum() const { return checksum32(base_, size_); }

bool ShardReader::header_changed() const {
  // Eight word compares, inlined: this runs on every checked read.
  uint64_t diff = 0;
  for (size_t k = 0; k < sizeof header_; k += 8) {
    uint64_t a, b;
    std::memcpy(&a, base_ + k, 8);
    std::memcpy(&b, reinterpret_cast<const uint8_t*>(&header_) + k, 8);
    diff |= a ^ b;
  }
  return diff != 0;
}

bool ShardReader::changed_on_disk() const {
  if (faulted() || header_changed()) return true;
  if (in_memory()) return false;  // the copy is what was read, whatever the file became
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) return true;  // removed or renamed away
  return stamp_of(st) != stamp_;
}

void ShardReader::throw_changed(int64_t record, const std::string& what) const {
  std::string where = record >= 0 ? ": record " + std::to_string(record) : std::string();
  STOKER_THROW(DataError, path_, where, ": changed on disk while in use (", what,
               faulted() ? "; the file was cut short under the reader" : "",
               "). A dataset must be replaced by writing a new one "
               "(ShardWriter(..., overwrite=True)), never edited in place");
}

}  // namespace stoker
