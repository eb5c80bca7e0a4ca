// The cost of the augmentation recipes per image inside a worker, against the
// classic RandomResizedCrop(224) + flip on the same JPEGs, one thread, in one
// run: what the timm-style recipe adds to decoding (target: within 25% of
// RRC + flip), and the YOLO-style recipe's cost at 640 with boxes.
//
// Build: cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release
//          -DSTOKER_BUILD_PYTHON=OFF -DSTOKER_BUILD_BENCH=ON && cmake --build build/bench
// Run:   python bench/make_jpegs.py /tmp/jpegs --n 300
//        build/bench/bench_augment_group /tmp/jpegs [rounds [only]]
// `only` runs one row (0-based), for a profiler (valgrind --tool=callgrind
// counts instructions, which a loaded machine does not change).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "geometry/transform_group.h"

using namespace stoker;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::vector<uint8_t>> read_jpegs(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jpg") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<uint8_t>> out;
  for (const auto& p : paths) {
    std::ifstream f(p, std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return out;
}

GroupMember member(GroupMember::Kind k, const char* name) {
  GroupMember m;
  m.kind = k;
  m.name = name;
  return m;
}

// Microseconds per image through `group`, one thread.
double per_image(const TransformGroup& group, const std::vector<std::vector<uint8_t>>& files) {
  std::vector<uint8_t> out(640 * 640 * 3 * 4);
  std::vector<float> b = {0.5f, 0.5f, 0.2f, 0.3f, 0.3f, 0.6f, 0.1f, 0.1f}, bout(8);
  std::vector<int64_t> c = {1, 2}, cout(2);
  const auto t0 = Clock::now();
  uint64_t seed = 1;
  for (const auto& f : files) {
    MemberIO io[3] = {{f.data(), f.size(), out.data()},
                      {reinterpret_cast<const uint8_t*>(b.data()), 32, bout.data()},
                      {reinterpret_cast<const uint8_t*>(c.data()), 16, cout.data()}};
    const auto [h, w] = group.output_size(io);
    group.run(io, seed++, h, w);
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / files.size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s JPEG_DIR [rounds]\n", argv[0]);
    return 2;
  }
  const auto files = read_jpegs(argv[1]);
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int only = argc > 3 ? std::atoi(argv[3]) : -1;
  if (files.empty()) {
    std::fprintf(stderr, "no .jpg files in %s\n", argv[1]);
    return 2;
  }
  const ops::RandomResizedCrop rrc{224, 224, 0.08, 1.0, 3.0 / 4, 4.0 / 3};
  ops::Normalize norm;
  const double mean[3] = {0.485, 0.456, 0.406}, stdv[3] = {0.229, 0.224, 0.225};
  for (int k = 0; k < 3; ++k) norm.mean[k] = mean[k], norm.stddev[k] = stdv[k];
  const ops::RandAugment ra;  // RandAugment(2, 9)
  ops::RandomErasing erase;
  erase.p = 0.25;
  erase.random = 1;
  ops::Letterbox lb;
  lb.h = lb.w = 640;
  const ops::HSVJitter hsv;  // ultralytics' defaults
  ops::RandomHorizontalFlip flip;

  auto image_only = [](std::vector<ImageOp> ops) {
    GroupSpec s;
    s.members.push_back(member(GroupMember::Kind::kImage, "image"));
    s.ops = std::move(ops);
    return TransformGroup(s);
  };
  GroupSpec yolo_spec;
  yolo_spec.members = {member(GroupMember::Kind::kImage, "image"),
                       member(GroupMember::Kind::kBoxes, "boxes"),
                       member(GroupMember::Kind::kRows, "classes")};
  yolo_spec.members[1].format = BoxFormat::kCXCYWH;
  yolo_spec.members[1].normalized = true;
  yolo_spec.members[2].row_bytes = 8;
  yolo_spec.ops = {lb, hsv, flip};
  const TransformGroup rrc_flip = image_only({rrc, flip});
  const TransformGroup timm = image_only({rrc, flip, ra, norm, erase});
  const TransformGroup rrc_flip_norm = image_only({rrc, flip, norm});
  const TransformGroup yolo(yolo_spec);
  const TransformGroup letterbox_only = image_only({lb});

  struct Row {
    const char* name;
    const TransformGroup* group;
    std::vector<double> t;
  } rows[] = {{"RRC(224) + flip", &rrc_flip, {}},
              {"RRC + flip + Normalize", &rrc_flip_norm, {}},
              {"timm-style (+ RandAugment(2, 9) + Normalize + RandomErasing)", &timm, {}},
              {"Letterbox(640)", &letterbox_only, {}},
              {"YOLO-style (Letterbox(640) + HSVJitter + flip, boxes)", &yolo, {}}};
  for (int r = 0; r < rounds; ++r)  // interleaved rounds: load on the machine hits all alike
    for (int k = 0; k < 5; ++k)
      rows[k].t.push_back(only < 0 || only == k ? per_image(*rows[k].group, files) : 1.0);
  std::printf("%zu JPEGs, one thread, microseconds per image (median of %d rounds)\n", files.size(),
              rounds);
  for (auto& row : rows) {
    std::sort(row.t.begin(), row.t.end());
    std::printf("  %-62s %8.0f\n", row.name, row.t[row.t.size() / 2]);
  }
  const double base = rows[0].t[rows[0].t.size() / 2];
  const double timm_t = rows[2].t[rows[2].t.size() / 2];
  std::printf("timm-style throughput / RRC+flip throughput: %.2f (target >= 0.75)\n",
              base / timm_t);
  return 0;
}
