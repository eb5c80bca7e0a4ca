// MappedFile: a file cut short under its mapping reads as zeros and is flagged
// instead of killing the process with SIGBUS; faults elsewhere and signals sent
// with kill() still reach the handler that was there before.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "format/dataset.h"
#include "format/mapped_file.h"
#include "test_util.h"

// The sanitizers keep SIGBUS to themselves unless told otherwise.
extern "C" const char* __asan_default_options() {
  return "handle_sigbus=0:allow_user_segv_handler=1";
}
extern "C" const char* __tsan_default_options() {
  return "handle_sigbus=0:allow_user_segv_handler=1";
}

using namespace stoker;

namespace {

std::atomic<int> g_previous_calls{0};
void previous_handler(int) { g_previous_calls.fetch_add(1); }

std::string write_file(const std::string& dir, size_t size) {
  std::string path = dir + "/data.bin";
  std::string bytes(size, '\x5a');
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0);
  CHECK(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

void truncated_file_reads_zeros_and_is_flagged() {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::string path = write_file(test::temp_dir(), 8 * page);
  int fd = ::open(path.c_str(), O_RDONLY);
  MappedFile m(fd, 8 * page, path);
  ::close(fd);
  const size_t live = MappedFile::live_mappings();
  CHECK(live >= 1);
  CHECK(!m.faulted());
  CHECK_EQ(m.data()[5 * page], 0x5a);
  CHECK(::truncate(path.c_str(), static_cast<off_t>(2 * page)) == 0);
  const uint64_t before = MappedFile::total_faults();
  // Past the new end: SIGBUS, absorbed. In another thread too, as the loader's workers.
  volatile uint8_t seen = 0xff;
  std::thread t([&] { seen = m.data()[6 * page + 7]; });
  t.join();
  CHECK_EQ(seen, 0);
  CHECK(m.faulted());
  CHECK_EQ(m.data()[1 * page], 0x5a);  // what the file still has is still there
  CHECK_EQ(m.data()[7 * page], 0);
  CHECK(MappedFile::total_faults() >= before + 2);
}

void other_signals_reach_the_previous_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = previous_handler;
  sigemptyset(&sa.sa_mask);
  CHECK(::sigaction(SIGBUS, &sa, nullptr) == 0);
  // Mapping a file installs ours on top (again), chained to previous_handler.
  std::string path = write_file(test::temp_dir(), 4096);
  int fd = ::open(path.c_str(), O_RDONLY);
  MappedFile m(fd, 4096, path);
  ::close(fd);
  struct sigaction cur;
  CHECK(::sigaction(SIGBUS, nullptr, &cur) == 0);
  CHECK(cur.sa_flags & SA_SIGINFO);
  CHECK(::raise(SIGBUS) == 0);  // sent, not a fault of ours: passed on
  CHECK_EQ(g_previous_calls.load(), 1);
}

void dataset_reports_a_shard_cut_short() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 4000, 2000);
  Dataset ds(test::test_schema(), shards);
  CHECK_EQ(ds.mapped_shards(), 0u);  // opening checks headers and footers only
  std::vector<RecordView> f(3);
  ds.read(0, f.data());
  ds.check_intact(0);
  CHECK(ds.is_mapped(0) && !ds.is_mapped(1));
  CHECK(::truncate(shards[0].path.c_str(), 200) == 0);
  bool thrown = false;
  try {
    ds.read(1999, f.data());
  } catch (const DataError& e) {
    thrown = std::strstr(e.what(), "changed on disk while in use") != nullptr &&
             std::strstr(e.what(), shards[0].path.c_str()) != nullptr;
  }
  CHECK(thrown);
  CHECK_THROWS(DataError, ds.check_intact(5));
  ds.read(2000, f.data());  // the other shard is fine
  ds.check_intact(2000);
}

}  // namespace

TEST_MAIN(truncated_file_reads_zeros_and_is_flagged(); dataset_reports_a_shard_cut_short();
          other_signals_reach_the_previous_handler())
