// libFuzzer target: arbitrary bytes as a Megatron .idx. Parsing must either
// succeed or throw DataError; on success the document lengths drive the
// packing and token-budget plans (bounded sizes), which must either succeed or
// throw DataError / UsageError. No crash, no UB, no leak.
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "format/megatron_index.h"
#include "sampler/pack_plan.h"
#include "sampler/token_budget.h"

using namespace stoker;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MegatronIndex idx;
  try {
    idx = parse_megatron_index(data, size, "fuzz.idx");
  } catch (const DataError&) {
    return 0;
  }
  if (idx.sequence_lengths.size() > 4096 || idx.total_tokens > (1 << 22)) return 0;
  std::vector<int64_t> starts{0};
  for (int64_t n : idx.sequence_lengths) starts.push_back(starts.back() + n);
  auto where = [](int64_t d) { return "doc " + std::to_string(d); };
  // a few option bits from the input, so the fuzzer explores the plans' options too
  const uint8_t knob = static_cast<uint8_t>(idx.total_tokens ^ (idx.total_tokens >> 7) ^ size);
  try {
    PackOptions o;
    o.seq_len = 1 + knob % 97;
    o.window = 1 + knob % 5;
    o.fit = knob & 1 ? PackFit::kFirst : PackFit::kBest;
    o.overlong = static_cast<Overlong>(knob % 3);
    o.shuffle = knob & 2;
    PackPlan p(starts, o, where);
    int64_t placed = 0;
    for (int64_t r = 0; r < p.num_rows(); ++r) placed += p.row_tokens(r);
    if (o.overlong == Overlong::kSplit && placed != idx.total_tokens) __builtin_trap();
  } catch (const DataError&) {
  }
  try {
    BudgetOptions b;
    b.max_tokens = 1 + knob * 13;
    b.multiple = 1 + knob % 8;
    b.max_length = knob % 4 == 0 ? 0 : knob;
    b.shuffle = knob & 4;
    BudgetPlan bp(starts, b, where);
    for (int64_t i = 0; i < bp.num_docs(); ++i) (void)bp.doc_at(1, i);
  } catch (const DataError&) {
  }
  return 0;
}
