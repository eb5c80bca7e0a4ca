// Shard writer/reader round trip and the structural checks on open.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "check.h"
#include "common/checksum.h"
#include "common/error.h"
#include "common/file_checks.h"
#include "common/stop_flag.h"
#include "test_util.h"

using namespace stoker;

static void flip_byte(const std::string& path, long offset) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  std::fseek(f, offset, SEEK_SET);
  int c = std::fgetc(f);
  std::fseek(f, offset, SEEK_SET);
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
}

static void round_trip() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 103, 40);
  CHECK_EQ(shards.size(), 3u);
  Dataset ds(test::test_schema(), shards);
  CHECK_EQ(ds.size(), 103);
  std::vector<RecordView> f(3);
  for (int64_t i = 0; i < 103; ++i) {
    ds.read(i, f.data());
    CHECK_EQ(f[0].size, 16u);
    CHECK_EQ(f[0].data[3], static_cast<uint8_t>(i % 251));
    int64_t label;
    std::memcpy(&label, f[1].data, 8);
    CHECK_EQ(label, i);
    CHECK_EQ(f[2].size, static_cast<size_t>(4 * (i % 5)));
  }
  CHECK_EQ(ds.locate(85).shard, 2u);
  CHECK_EQ(ds.locate(85).record, 5);
  CHECK_THROWS(UsageError, ds.locate(103));
}

static void every_byte_flip_is_caught() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 7, 100);
  std::ifstream in(shards[0].path, std::ios::binary | std::ios::ate);
  const long size = static_cast<long>(in.tellg());
  std::vector<RecordView> f(3);
  for (long off = 0; off < size; ++off) {
    flip_byte(shards[0].path, off);
    bool caught = false;
    try {
      Dataset ds(test::test_schema(), shards);
      for (int64_t i = 0; i < ds.size(); ++i) ds.read(i, f.data());
    } catch (const DataError&) {
      caught = true;
    }
    flip_byte(shards[0].path, off);
    if (!caught) std::fprintf(stderr, "flip at %ld not detected\n", off);
    CHECK(caught);
  }
}

// NOTE [ Verified once ]: a record's first read hashes it (a corrupt one is caught
// there, named by file and record), later reads with Verify::kFirst skip the hash,
// Verify::kAlways hashes on every read.
static void records_verified_once() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 7, 100);
  std::vector<RecordView> f(3);
  {  // every corrupt byte of a fresh dataset is caught by the first read
    std::ifstream in(shards[0].path, std::ios::binary | std::ios::ate);
    const long size = static_cast<long>(in.tellg());
    for (long off = 64; off < size; off += 7) {
      flip_byte(shards[0].path, off);
      bool caught = false;
      try {
        Dataset ds(test::test_schema(), shards);
        for (int64_t i = 0; i < ds.size(); ++i) ds.read(ds.locate(i), f.data(), Verify::kFirst);
      } catch (const DataError&) {
        caught = true;
      }
      flip_byte(shards[0].path, off);
      if (!caught) std::fprintf(stderr, "flip at %ld not detected on the first read\n", off);
      CHECK(caught);
    }
  }
  Dataset ds(test::test_schema(), shards);
  const Dataset::Location loc = ds.locate(4);
  CHECK(!ds.shard(0).verified(4));
  ds.read(loc, f.data(), Verify::kNever);
  CHECK(!ds.shard(0).verified(4));
  ds.read(loc, f.data(), Verify::kFirst);
  CHECK(ds.shard(0).verified(4) && !ds.shard(0).verified(3));
  // Corrupt record 4 under the mapping: a first read hashed it already, so a later
  // kFirst read passes (the bytes are not hashed again); kAlways catches it, naming
  // the file and the record.
  const size_t at = static_cast<size_t>(f[0].data - ds.shard(0).records_region().data) +
                    sizeof(format::ShardHeader) + 2;
  flip_byte(shards[0].path, static_cast<long>(at));
  ds.read(loc, f.data(), Verify::kFirst);
  CHECK(test::throws_with([&] { ds.read(loc, f.data(), Verify::kAlways); }, "record 4"));
  // A record first read after the damage is caught by kFirst too, never marked.
  flip_byte(shards[0].path, static_cast<long>(at));
  flip_byte(shards[0].path, static_cast<long>(at + 52));  // record 5 (record 4 is 52 bytes)
  CHECK(test::throws_with([&] { ds.read(ds.locate(5), f.data(), Verify::kFirst); },
                          shards[0].path.c_str()));
  CHECK(!ds.shard(0).verified(5));
  flip_byte(shards[0].path, static_cast<long>(at + 52));
}

// NOTE [ Verified once ]: a record verified once is hashed again after its file
// changed on disk (stat'ed once per check round: each epoch, and a batch planned a
// second or more into a round), so
// a same-size change in place is caught in the next round at the latest; a
// change that leaves the content as it was (a touch) costs a hash and nothing else.
static void records_changed_on_disk_are_verified_again() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 7, 100);
  Dataset ds(test::test_schema(), shards);
  std::vector<RecordView> f(3);
  const Dataset::Location loc = ds.locate(4);
  ds.read(loc, f.data(), Verify::kFirst);
  CHECK(ds.shard(0).verified(4));
  const size_t at = static_cast<size_t>(f[0].data - ds.shard(0).records_region().data) +
                    sizeof(format::ShardHeader) + 2;
  flip_byte(shards[0].path, static_cast<long>(at));
  // The same round, within the second: the change is not looked for yet.
  ds.read(loc, f.data(), Verify::kFirst);
  new_file_check_round();  // an epoch begins
  CHECK(test::throws_with([&] { ds.read(loc, f.data(), Verify::kFirst); },
                          "record 4: changed on disk while in use (checksum mismatch"));
  CHECK(!ds.shard(0).verified(4));
  flip_byte(shards[0].path, static_cast<long>(at));  // as it was: verified again, and read
  new_file_check_round();
  ds.read(loc, f.data(), Verify::kFirst);
  CHECK(ds.shard(0).verified(4));
  ds.read(loc, f.data(), Verify::kFirst);  // a hit: the file checked this round
  // Without a new epoch: a batch planned a second later begins a round.
  flip_byte(shards[0].path, static_cast<long>(at));
  file_check_tick();  // within the second: the same round
  ds.read(loc, f.data(), Verify::kFirst);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  file_check_tick();
  CHECK(test::throws_with([&] { ds.read(loc, f.data(), Verify::kFirst); }, "record 4"));
  flip_byte(shards[0].path, static_cast<long>(at));
  // A touch: the content is the same, the records are hashed again and pass.
  new_file_check_round();
  ds.read(loc, f.data(), Verify::kFirst);
  ds.read(ds.locate(3), f.data(), Verify::kFirst);
  CHECK(ds.shard(0).verified(3) && ds.shard(0).verified(4));
  CHECK(::utimensat(AT_FDCWD, shards[0].path.c_str(), nullptr, 0) == 0);
  new_file_check_round();
  CHECK(ds.shard(0).verified(4));
  ds.read(ds.locate(3), f.data(), Verify::kFirst);  // the check: every bit cleared, 3 hashed
  CHECK(ds.shard(0).verified(3) && !ds.shard(0).verified(4));
  ds.read(loc, f.data(), Verify::kFirst);
  CHECK(ds.shard(0).verified(4));
}

static void truncation_and_mismatches() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 10, 100);
  auto wrong_size = shards;
  wrong_size[0].bytes += 1;
  CHECK_THROWS(DataError, Dataset(test::test_schema(), wrong_size));
  auto wrong_count = shards;
  wrong_count[0].num_records = 9;
  CHECK_THROWS(DataError, Dataset(test::test_schema(), wrong_count));
  Schema other = test::test_schema();
  other.hash = 99;
  CHECK_THROWS(DataError, Dataset(other, shards));
  // A file cut anywhere is refused, whatever the index says.
  std::ifstream in(shards[0].path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (size_t cut : {size_t{0}, size_t{10}, size_t{64}, bytes.size() / 2, bytes.size() - 1}) {
    std::string p = dir + "/cut.stk";
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    CHECK_THROWS(DataError, ShardReader(p, 0x1234, -1, -1));
  }
  CHECK_THROWS(DataError, ShardReader(dir + "/missing.stk", 0x1234, -1, -1));
}

static void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream(to, std::ios::binary | std::ios::trunc) << in.rdbuf();
}

using test::throws_with;

static void identity_is_checked_on_open() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 20, 10);  // two shards of the same size
  Schema schema = test::test_schema();
  // A foreign shard: same schema, size and count, another write.
  std::string other = test::temp_dir();
  auto foreign = test::write_shards(other, 20, 10);
  copy_file(foreign[1].path, shards[1].path);
  CHECK(throws_with([&] { Dataset(schema, shards); }, "belongs to another dataset"));
  CHECK(throws_with(
      [&] {
        ShardReader(shards[1].path, ShardExpectation{schema.hash, 10, -1, shards[1].identity});
      },
      "belongs to another dataset"));
  // Without identity (version 1) it would have passed: that is what v2 adds.
  Dataset::Options lazy;
  lazy.probe_on_open = true;
  auto anonymous = shards;
  for (auto& s : anonymous) s.identity.reset();
  Dataset(schema, anonymous, lazy);
  // Swapped shards.
  shards = test::write_shards(dir, 20, 10);
  auto swapped = shards;
  std::swap(swapped[0].path, swapped[1].path);
  CHECK(throws_with([&] { Dataset(schema, swapped); }, "swapped or reordered"));
  // Checksums from the index.
  auto bad_table = shards;
  bad_table[1].identity->table_sum ^= 1;
  CHECK(throws_with([&] { Dataset(schema, bad_table); }, "record table checksum"));
  auto bad_header = shards;
  bad_header[0].identity->header_sum ^= 1;
  CHECK(throws_with([&] { Dataset(schema, bad_header); }, "header checksum"));
  // The same file listed twice, under another name: refused whatever the version.
  auto twice = anonymous;
  twice[1] = twice[0];
  twice[1].path = dir + "/./" + twice[0].path.substr(dir.size() + 1);
  CHECK(throws_with([&] { Dataset(schema, twice); }, "a shard listed twice"));
}

static void only_regular_files_and_no_blocking() {
  std::string dir = test::temp_dir();
  std::string fifo = dir + "/fifo.stk";
  CHECK(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK(throws_with([&] { probe_shard(fifo, ShardExpectation{}); }, "is a FIFO"));
  CHECK(throws_with([&] { ShardReader(dir, 0, -1, -1); }, "is a directory"));
  CHECK(throws_with([&] { ShardReader("/dev/zero", 0, -1, -1); }, "is a character device"));
}

static void lazy_mapping_and_errors_naming_the_file() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 30, 10);
  Dataset ds(test::test_schema(), shards);
  CHECK_EQ(ds.mapped_shards(), 0u);
  std::vector<RecordView> f(3);
  ds.read(25, f.data());
  CHECK_EQ(ds.mapped_shards(), 1u);
  CHECK(ds.is_mapped(2));
  // Removed after the open (not by stoker): the first use names the file, and a later
  // call tries again rather than remembering the failure.
  copy_file(shards[1].path, dir + "/saved");
  std::remove(shards[1].path.c_str());
  CHECK(throws_with([&] { ds.read(15, f.data()); }, "shard-1.stk: cannot open shard"));
  copy_file(dir + "/saved", shards[1].path);
  ds.read(15, f.data());
  int64_t label;
  std::memcpy(&label, f[1].data, 8);
  CHECK_EQ(label, 15);
}

static void append_shard_copies_records_under_a_new_identity() {
  std::string dir = test::temp_dir();
  auto parts = test::write_shards(dir, 25, 10);  // 10 + 10 + 5
  const DatasetId id = DatasetId::random();
  std::string out = dir + "/merged.stk";
  ShardWriter w(out, test::test_schema().hash, 3, id, 0);
  for (const auto& p : parts) w.append_shard(ShardReader(p.path, test::test_schema().hash, -1, -1));
  ShardSummary sum = w.finish();
  CHECK_EQ(sum.num_records, 25);
  Dataset ds(test::test_schema(),
             {ShardInfo{out, 25, static_cast<int64_t>(sum.bytes),
                        ShardIdentity{id, 0, sum.header_sum, sum.table_sum}, std::nullopt}});
  std::vector<RecordView> f(3);
  for (int64_t i = 0; i < 25; ++i) {
    ds.read(i, f.data());
    int64_t label;
    std::memcpy(&label, f[1].data, 8);
    CHECK_EQ(label, i);
  }
  // A corrupt record is refused before anything is copied.
  flip_byte(parts[1].path, 64 + 3);
  ShardWriter w2(dir + "/other.stk", test::test_schema().hash, 3, id, 0);
  CHECK(throws_with(
      [&] { w2.append_shard(ShardReader(parts[1].path, test::test_schema().hash, -1, -1)); },
      "record 0: checksum mismatch"));
  CHECK_EQ(w2.num_records(), 0);
}

static void checksum_is_streamable() {
  std::string data(100000, 'a');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  StreamingChecksum s;
  s.update(data.data(), 333);
  s.update(data.data() + 333, data.size() - 333);
  CHECK_EQ(s.digest(), checksum32(data.data(), data.size()));
  CHECK(checksum32(data.data(), 1000) != checksum32(data.data() + 1, 1000));
}

// NOTE [ Deferred shards ]: a worker's read waits until the shard is provided, marks it
// demanded (and fires the gate event) meanwhile, stops waiting when its stream stops, and
// raises FetchError after fail(); a thread that is not a worker is refused at once.
static void deferred_shards_wait_for_provide() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 30, 10);
  Dataset::Options opts;
  opts.deferred = true;
  std::string saved = dir + "/saved";
  copy_file(shards[1].path, saved);
  std::remove(shards[1].path.c_str());            // not downloaded yet
  Dataset ds(test::test_schema(), shards, opts);  // opens without touching a shard
  CHECK(ds.deferred() && ds.size() == 30 && ds.demands().empty());
  std::vector<RecordView> f(3);
  bool refused = false;
  try {
    ds.read(15, f.data());
  } catch (const UsageError& e) {
    refused = std::strstr(e.what(), "shard-1.stk: shard not downloaded yet") != nullptr;
  }
  CHECK(refused);
  CHECK(!ds.is_mapped(1) && ds.demands().empty());

  std::atomic<bool> stop{false};
  std::atomic<int> outcome{0};  // 1: read, 2: FetchError, 3: stopped
  auto reader = [&](int64_t index) {
    return std::thread([&, index] {
      const ScopedStop bound(&stop);
      std::vector<RecordView> g(3);
      try {
        ds.read(index, g.data());
        int64_t label;
        std::memcpy(&label, g[1].data, 8);
        outcome = label == index ? 1 : -1;
      } catch (const FetchError& e) {
        outcome = std::string(e.what()) == "https://host/shard-2: HTTP 500" ? 2 : -2;
      } catch (const Error& e) {
        outcome = std::string(e.what()).find("stopped while waiting") != std::string::npos ? 3 : -3;
      }
    });
  };
  // Provided: the waiting reader goes on with the file now in place.
  uint32_t seen = ds.gate()->prepare();
  std::thread t = reader(15);
  ds.gate()->wait(seen, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  for (int i = 0; i < 1000 && ds.demands().empty(); ++i) std::this_thread::yield();
  CHECK(ds.demands() == std::vector<size_t>{1});
  CHECK_EQ(outcome.load(), 0);
  // the wait in progress counts already, and grows while it lasts
  const double waited = ds.gate_wait_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(waited >= 0 && ds.gate_wait_seconds() >= waited + 0.015);
  copy_file(saved, shards[1].path);
  ds.provide(1);
  t.join();
  CHECK_EQ(outcome.load(), 1);
  CHECK(ds.demands().empty() && ds.gate_wait_seconds() > 0);
  ds.provide(1);  // idempotent
  // Failed: the waiting reader raises the reason, and so does every later read.
  outcome = 0;
  t = reader(25);
  for (int i = 0; i < 100000 && ds.demands().empty(); ++i) std::this_thread::yield();
  ds.fail(2, "https://host/shard-2: HTTP 500");
  t.join();
  CHECK_EQ(outcome.load(), 2);
  CHECK_THROWS(FetchError, ds.read(21, f.data()));
  ds.provide(2);  // too late: failed stays failed until reset
  CHECK_THROWS(FetchError, ds.read(21, f.data()));
  // Reset: the next read demands the shard again, and reads it once provided.
  CHECK(ds.reset(2) && !ds.reset(2));
  outcome = 0;
  t = reader(25);
  for (int i = 0; i < 100000 && ds.demands().empty(); ++i) std::this_thread::yield();
  CHECK(ds.demands() == std::vector<size_t>{2});
  ds.provide(2);
  t.join();
  CHECK_EQ(outcome.load(), 1);
  // Stopped: a reader waiting for a shard nobody provides gives up within a slice.
  outcome = 0;
  t = reader(5);
  for (int i = 0; i < 100000 && ds.demands().empty(); ++i) std::this_thread::yield();
  stop = true;
  t.join();
  CHECK_EQ(outcome.load(), 3);
  CHECK(ds.demands() == std::vector<size_t>{0});
  CHECK(!ds.is_mapped(0));
  // A dataset that is not deferred refuses the calls.
  Dataset plain(test::test_schema(), test::write_shards(test::temp_dir(), 5, 5));
  CHECK_THROWS(UsageError, plain.provide(0));
}

// NOTE [ Released shards ]: readers under pins never see a mapping go; a
// release happens only with no pin; a released shard is pending again, and its
// next reader demands it and waits for provide().
static void released_shards_wait_and_come_back() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 40, 10);  // 4 shards of 10
  Dataset::Options opts;
  opts.releasable = true;
  Dataset ds(test::test_schema(), shards, opts);
  CHECK(ds.deferred() && ds.releasable());
  CHECK(!ds.try_release(0));  // never provided: nothing to release
  for (size_t s = 0; s < 4; ++s) ds.provide(s);
  std::vector<RecordView> f(3);
  {
    const Dataset::ShardPin held = ds.pin(1);
    CHECK_EQ(ds.pins(1), 1);
    ds.read(15, f.data());
    CHECK(!ds.try_release(1));  // held: kept, still ready
    CHECK(ds.is_mapped(1));
    int64_t label;
    std::memcpy(&label, f[1].data, 8);
    CHECK_EQ(label, 15);
  }
  CHECK_EQ(ds.pins(1), 0);
  CHECK(ds.try_release(1));  // no pin: unmapped, pending
  CHECK(!ds.is_mapped(1) && !ds.try_release(1));
  CHECK(ds.mapped_reader(2) == nullptr);  // no prefetch hints into releasable shards
  bool refused = false;                   // a thread that is not a loader worker does not wait
  try {
    (void)ds.pin(1);
  } catch (const UsageError& e) {
    refused = std::strstr(e.what(), "shard not downloaded yet") != nullptr;
  }
  CHECK(refused);

  // Readers in threads against a releaser that gives shards back and provides
  // them again: every read sees its own record, nothing reads an unmapped page
  // (ASan/TSan in CI), and a released shard is demanded by its next reader.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reads{0}, bad{0};
  test::UnexpectedErrors unexpected;
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&, t] {
      const ScopedStop bound(&stop);
      std::vector<RecordView> g(3);
      uint64_t x = 12345 + static_cast<uint64_t>(t);
      while (!stop.load()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t i = static_cast<int64_t>((x >> 33) % 40);
        try {
          const Dataset::Location loc = ds.locate(i);
          const Dataset::ShardPin held = ds.pin(loc.shard);
          ds.read(loc, g.data());
          int64_t label;
          std::memcpy(&label, g[1].data, 8);
          if (label != i) ++bad;
          ++reads;
        } catch (const Error& e) {
          unexpected.check(e, stop);  // only "stopped while waiting", once stopped
        }
      }
    });
  int released = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (uint64_t k = 0; std::chrono::steady_clock::now() < until; ++k) {
    const size_t s = k % 4;
    if (ds.try_release(s)) {
      ++released;
      CHECK(!ds.is_mapped(s));
    }
    std::this_thread::yield();
    for (size_t d : ds.demands()) ds.provide(d);  // the fetcher's part
    if (k % 3 == 0)
      for (size_t p = 0; p < 4; ++p) ds.provide(p);
  }
  for (size_t p = 0; p < 4; ++p) ds.provide(p);
  stop = true;
  for (auto& th : readers) th.join();
  CHECK_EQ(bad.load(), 0);
  CHECK_EQ(unexpected.count(), 0);
  CHECK(reads.load() > 100);
  CHECK(released > 10);
  for (size_t p = 0; p < 4; ++p) CHECK_EQ(ds.pins(p), 0);
  // A dataset that is not releasable refuses try_release.
  Dataset plain(test::test_schema(), test::write_shards(test::temp_dir(), 5, 5));
  CHECK_THROWS(UsageError, plain.try_release(0));
  CHECK(!plain.releasable() && plain.pins(0) == 0);
}

// NOTE [ Records by range ]: a reader of a shard not local yet asks for its
// record; the bytes handed over (checked against the table) serve it; a bad
// record is refused; the shard, once provided, serves the rest and drops the
// buffers; a declined shard's readers wait for the whole shard.
static void records_by_range_serve_readers_first() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 20, 10);  // 2 shards of 10
  const std::string bytes0 = test::read_file(shards[0].path);
  const std::vector<uint8_t> file0(bytes0.begin(), bytes0.end());
  Dataset::Options opts;
  opts.record_ranges = true;
  Dataset ds(test::test_schema(), shards, opts);
  CHECK(ds.deferred() && ds.record_ranges() && !ds.releasable());
  const size_t tail = shard_tail_bytes(10);
  {  // a table that is not the one index.json describes is refused by the URL
    std::vector<uint8_t> bad_tail(file0.end() - static_cast<long>(tail), file0.end());
    bad_tail[5] ^= 1;
    CHECK(throws_with(
        [&] {
          ds.provide_table(0, "https://host/shard-0", file0.data(), 64, bad_tail.data(), tail);
        },
        "https://host/shard-0"));
    CHECK(throws_with([&] { ds.provide_record(0, 1, file0.data(), 4); }, "no table"));
  }
  ds.provide_table(0, "https://host/shard-0", file0.data(), 64, file0.data() + file0.size() - tail,
                   tail);
  const ShardTable table =
      parse_shard_table("t", file0.data(), 64, file0.data() + file0.size() - tail, tail,
                        file0.size(), ShardExpectation{test::test_schema().hash, 10, -1, {}});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> label{-1};
  const int64_t wanted[] = {7, 12};  // as the planner of an epoch's first batch asks
  ds.want_records(wanted, 2);
  std::thread reader([&] {
    const ScopedStop bound(&stop);
    const Dataset::Location loc = ds.locate(7);
    const Dataset::ShardPin held = ds.pin_record(loc);
    CHECK(held.record_bytes() != nullptr);  // served by range, the shard still pending
    std::vector<RecordView> g(3);
    ds.read(held, loc, g.data());
    int64_t v;
    std::memcpy(&v, g[1].data, 8);
    label = v;
  });
  std::vector<std::pair<size_t, int64_t>> want{{0, 7}, {1, 2}}, got;
  for (int i = 0; i < 100000 && got.empty(); ++i) {
    got = ds.take_record_demands();
    std::this_thread::yield();
  }
  CHECK(got == want);
  CHECK(ds.take_record_demands().empty());  // taken once
  for (int i = 0; i < 100000 && ds.demands().empty(); ++i) std::this_thread::yield();
  CHECK(ds.demands() == std::vector<size_t>{0});  // the waiting reader demands the shard
  const format::RecordEntry e = table.entry(7);
  std::vector<uint8_t> bad(file0.begin() + static_cast<long>(e.offset),
                           file0.begin() + static_cast<long>(e.offset + e.length));
  bad[3] ^= 1;
  CHECK_THROWS(DataError, ds.provide_record(0, 7, bad.data(), bad.size()));
  bad[3] ^= 1;
  ds.provide_record(0, 7, bad.data(), bad.size());
  reader.join();
  CHECK_EQ(label.load(), 7);
  CHECK(ds.buffered_records().first == 1);
  ds.provide(0);  // the shard came: buffers dropped, reads map it
  CHECK(ds.buffered_records() == std::make_pair(int64_t{0}, int64_t{0}));
  // Declined: the reader waits for the whole shard.
  label = -1;
  std::thread r2([&] {
    const ScopedStop bound(&stop);
    const Dataset::Location loc = ds.locate(15);
    const Dataset::ShardPin held = ds.pin_record(loc);
    CHECK(held.record_bytes() == nullptr);
    std::vector<RecordView> g(3);
    ds.read(held, loc, g.data());
    int64_t v;
    std::memcpy(&v, g[1].data, 8);
    label = v;
  });
  for (int i = 0; i < 100000 && ds.demands().empty(); ++i) std::this_thread::yield();
  ds.no_ranges(1);
  CHECK_EQ(label.load(), -1);
  ds.provide(1);
  r2.join();
  CHECK_EQ(label.load(), 15);
}

// A shard given back while a reader waits for it (pin_record()) is
// demanded again by that reader: with a fetcher that provides only what is
// demanded, every reader keeps going (a reader that waited on a shard nobody
// had demanded would stall for good).
static void readers_demand_released_shards_again() {
  std::string dir = test::temp_dir();
  auto shards = test::write_shards(dir, 40, 10);
  Dataset::Options opts;
  opts.releasable = true;
  opts.record_ranges = true;
  Dataset ds(test::test_schema(), shards, opts);
  constexpr int kReaders = 3;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reads[kReaders] = {};
  std::atomic<int64_t> bad{0};
  test::UnexpectedErrors unexpected;
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t)
    readers.emplace_back([&, t] {
      const ScopedStop bound(&stop);
      std::vector<RecordView> g(3);
      uint64_t x = 777 + static_cast<uint64_t>(t);
      while (!stop.load()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t i = static_cast<int64_t>((x >> 33) % 40);
        try {
          const Dataset::Location loc = ds.locate(i);
          const Dataset::ShardPin held = ds.pin_record(loc);
          ds.read(held, loc, g.data());
          int64_t label;
          std::memcpy(&label, g[1].data, 8);
          if (label != i) ++bad;
          ++reads[t];
        } catch (const Error& e) {
          unexpected.check(e, stop);
        }
      }
    });
  auto fetcher_turn = [&] {  // provides what readers demand, nothing else
    for (size_t d : ds.demands()) ds.provide(d);
    (void)ds.take_record_demands();
  };
  const auto t0 = std::chrono::steady_clock::now();
  // Shards given back right after they are provided: a waiting reader wakes to a
  // shard pending again, which only it can demand.
  while (std::chrono::steady_clock::now() < t0 + std::chrono::milliseconds(400)) {
    for (size_t d : ds.demands()) {
      ds.provide(d);
      (void)ds.try_release(d);
    }
    (void)ds.take_record_demands();
    std::this_thread::yield();
  }
  // No more releases: every reader must go on.
  int64_t before[kReaders];
  for (int t = 0; t < kReaders; ++t) before[t] = reads[t].load();
  const auto t1 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < t1 + std::chrono::milliseconds(300)) {
    fetcher_turn();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int t = 0; t < kReaders; ++t) CHECK(reads[t].load() > before[t]);
  stop = true;
  for (auto& th : readers) th.join();
  CHECK_EQ(bad.load(), 0);
  CHECK_EQ(unexpected.count(), 0);
}

// An error's location is the path from the source tree's root whatever path the compiler
// was handed: -fmacro-prefix-map's "csrc/..." or a path-rewriting compiler cache's
// "../../csrc/...". A file outside csrc/ is kept as it is.
void error_locations_are_relative_to_the_tree() {
  CHECK_EQ(stoker::detail::where("csrc/format/a.cpp", 7), "csrc/format/a.cpp:7");
  CHECK_EQ(stoker::detail::where("../../csrc/format/a.cpp", 7), "csrc/format/a.cpp:7");
  CHECK_EQ(stoker::detail::where("/src/stoker/csrc/format/a.cpp", 7), "csrc/format/a.cpp:7");
  CHECK_EQ(stoker::detail::where("/src/mycsrc/csrc/x.cpp", 1), "csrc/x.cpp:1");
  CHECK_EQ(stoker::detail::where("tests/cpp/t.cpp", 3), "tests/cpp/t.cpp:3");
}

TEST_MAIN(error_locations_are_relative_to_the_tree(); round_trip(); every_byte_flip_is_caught();
          records_verified_once(); records_changed_on_disk_are_verified_again();
          truncation_and_mismatches(); identity_is_checked_on_open();
          only_regular_files_and_no_blocking(); lazy_mapping_and_errors_naming_the_file();
          append_shard_copies_records_under_a_new_identity(); checksum_is_streamable();
          deferred_shards_wait_for_provide(); released_shards_wait_and_come_back();
          records_by_range_serve_readers_first(); readers_demand_released_shards_again())
