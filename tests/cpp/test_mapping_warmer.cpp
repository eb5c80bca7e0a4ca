// NOTE [ Warm mappings ]: MappedFile::populate sets up the page table of every
// page (the readers then take no fault on them), and MappingWarmer maps and populates the shards it
// is given, within its budget, in its own thread, and stops promptly.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "format/dataset.h"
#include "format/shard_writer.h"
#include "producers/mapping_warmer.h"
#include "test_threads.h"
#include "test_util.h"

using namespace stoker;
using namespace std::chrono_literals;

namespace {

constexpr size_t kBytes = 12288;  // a record of three pages, like uint8[3, 64, 64]

Schema schema() {
  Schema s;
  s.fields.push_back({"x", FieldKind::kNDArray, DType::kUInt8, {static_cast<int64_t>(kBytes)}});
  s.hash = 0x5678;
  return s;
}

// `shards` shards of `per_shard` records: x filled with (i % 251).
std::vector<ShardInfo> write(const std::string& dir, int shards, int64_t per_shard) {
  std::vector<ShardInfo> out;
  const DatasetId id = DatasetId::random();
  for (int s = 0; s < shards; ++s) {
    const std::string path = dir + "/shard-" + std::to_string(s) + ".stk";
    ShardWriter w(path, schema().hash, 1, id, static_cast<uint64_t>(s));
    for (int64_t i = s * per_shard; i < (s + 1) * per_shard; ++i) {
      std::string rec(4 + kBytes, static_cast<char>(i % 251));
      const uint32_t n = kBytes;
      std::memcpy(rec.data(), &n, 4);
      w.append(reinterpret_cast<const uint8_t*>(rec.data()), rec.size());
    }
    const ShardSummary sum = w.finish();
    out.push_back({path, sum.num_records, static_cast<int64_t>(sum.bytes),
                   ShardIdentity{id, static_cast<uint64_t>(s), sum.header_sum, sum.table_sum},
                   std::nullopt});
  }
  return out;
}

// Pages of [p, p + n) with a page-table entry in this process (/proc/self/pagemap's
// "present" bit): what populating sets up, whatever a sanitizer's shadow memory does.
size_t present_pages(const uint8_t* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + n - 1) / page;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  CHECK(fd >= 0);
  std::vector<uint64_t> entries(last - first + 1);
  const ssize_t want = static_cast<ssize_t>(entries.size() * 8);
  CHECK_EQ(::pread(fd, entries.data(), entries.size() * 8, static_cast<off_t>(first * 8)), want);
  ::close(fd);
  size_t present = 0;
  for (uint64_t e : entries) present += (e >> 63) & 1;
  return present;
}

size_t pages_of(size_t bytes) { return (bytes + 4095) / 4096; }

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Minor faults this thread takes reading (and verifying) every record.
long faults_reading(const Dataset& ds) {
  std::vector<RecordView> v(1);
  const long before = minor_faults();
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, v.data());
    CHECK(v[0].size == kBytes && v[0].data[kBytes - 1] == static_cast<uint8_t>(i % 251));
  }
  return minor_faults() - before;
}

bool wait_done(const MappingWarmer& w) {
  return test::eventually([&] { return w.done(); }, 20s);
}

void populate_leaves_no_fault() {
  const auto shards = write(test::temp_dir(), 3, 200);  // 3 x 2.4 MB
  {
    Dataset cold(schema(), shards);
    const long faults = faults_reading(cold);
    std::printf("  reading a fresh mapping: %ld minor faults\n", faults);
    CHECK(faults >= 100);  // so that the warm case below means something
  }
  Dataset ds(schema(), shards);
  size_t total = 0;
  for (size_t s = 0; s < ds.num_shards(); ++s) {
    const ShardReader& r = ds.shard(s);
    const MappedFile& m = r.mapping();
    CHECK(present_pages(m.data(), m.size()) < pages_of(m.size()) / 2);  // mapped, not populated
    CHECK_EQ(m.populate(0, r.file_size()), r.file_size());
    CHECK_EQ(present_pages(m.data(), m.size()), pages_of(m.size()));
    total += r.file_size();
  }
  const long faults = faults_reading(ds);
  std::printf("  reading %zu populated bytes: %ld minor faults\n", total, faults);
  // A stop that is already set populates nothing; a range past the end is cut.
  std::atomic<bool> stop{true};
  CHECK_EQ(ds.shard(0).mapping().populate(0, 1 << 20, &stop), 0u);
  const size_t size = ds.shard(1).file_size();
  CHECK_EQ(ds.shard(1).mapping().populate(size - 10, 1 << 20), size - (size - 10) / 4096 * 4096);
}

void warmer_maps_ahead_of_the_readers() {
  const auto shards = write(test::temp_dir(), 4, 150);
  int64_t total = 0;
  for (const ShardInfo& s : shards) total += s.bytes;
  {
    auto ds = std::make_shared<Dataset>(schema(), shards);
    CHECK_EQ(ds->mapped_shards(), 0u);
    MappingWarmer w(ds, {2, 0, 3, 1}, MappingWarmer::default_budget());
    CHECK(wait_done(w));
    CHECK_EQ(w.shards(), 4u);
    CHECK_EQ(w.bytes(), static_cast<size_t>(total));
    CHECK_EQ(ds->mapped_shards(), 4u);
    for (size_t s = 0; s < 4; ++s) {
      const MappedFile& m = ds->shard(s).mapping();
      CHECK_EQ(present_pages(m.data(), m.size()), pages_of(m.size()));
    }
    const long faults = faults_reading(*ds);
    std::printf("  reading %lld warmed bytes: %ld minor faults\n", static_cast<long long>(total),
                faults);
  }
  {
    // The budget holds whole shards, in order: two fit.
    auto ds = std::make_shared<Dataset>(schema(), shards);
    MappingWarmer w(ds, {3, 1, 0, 2}, static_cast<size_t>(shards[3].bytes + shards[1].bytes) + 10);
    CHECK(wait_done(w));
    CHECK_EQ(w.shards(), 2u);
    CHECK(ds->is_mapped(3) && ds->is_mapped(1) && !ds->is_mapped(0) && !ds->is_mapped(2));
  }
  {
    // No budget, no shards, a deferred dataset: no thread at all.
    auto ds = std::make_shared<Dataset>(schema(), shards);
    MappingWarmer none(ds, {0, 1}, 0);
    MappingWarmer empty(ds, {}, 1 << 30);
    Dataset::Options o;
    o.deferred = true;
    auto remote = std::make_shared<Dataset>(schema(), shards, o);
    MappingWarmer deferred(remote, {0, 1}, 1 << 30);
    CHECK(none.done() && empty.done() && deferred.done());
    CHECK(test::eventually([] { return test::threads_named("stoker-warm") == 0; }));
    CHECK_EQ(ds->mapped_shards(), 0u);
  }
  {
    // A shard that cannot be opened is left to its reader; the others are warmed.
    auto bad = shards;
    bad[1].path += ".missing";
    auto ds = std::make_shared<Dataset>(schema(), bad, Dataset::Options{false});
    MappingWarmer w(ds, {0, 1, 2}, 1 << 30);
    CHECK(wait_done(w));
    CHECK_EQ(w.shards(), 2u);
    CHECK(ds->is_mapped(0) && !ds->is_mapped(1) && ds->is_mapped(2));
  }
}

// Destroying a warmer stops its thread within a slice, whatever is left to do.
void warmer_stops_promptly() {
  const auto shards = write(test::temp_dir(), 8, 300);
  for (int round = 0; round < 3; ++round) {
    auto ds = std::make_shared<Dataset>(schema(), shards);
    auto w = std::make_unique<MappingWarmer>(ds, std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7},
                                             size_t{1} << 40);
    std::this_thread::sleep_for(std::chrono::milliseconds(round));
    const auto t0 = std::chrono::steady_clock::now();
    w.reset();
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    CHECK(test::eventually([] { return test::threads_named("stoker-warm") == 0; }));
  }
}

}  // namespace

TEST_MAIN(populate_leaves_no_fault(); warmer_maps_ahead_of_the_readers(); warmer_stops_promptly())
