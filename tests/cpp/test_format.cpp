// Shard writer/reader round trip and the structural checks on open.
#include <cstdio>
#include <fstream>

#include "check.h"
#include "common/checksum.h"
#include "common/error.h"
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

static void checksum_is_streamable() {
  std::string data(100000, 'a');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  StreamingChecksum s;
  s.update(data.data(), 333);
  s.update(data.data() + 333, data.size() - 333);
  CHECK_EQ(s.digest(), checksum32(data.data(), data.size()));
  CHECK(checksum32(data.data(), 1000) != checksum32(data.data() + 1, 1000));
}

TEST_MAIN(round_trip(); every_byte_flip_is_caught(); truncation_and_mismatches();
          checksum_is_streamable())
