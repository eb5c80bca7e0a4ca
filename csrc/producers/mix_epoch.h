// The epoch plan of a mixture's producers (mix_record_producer.h,
// mix_token_producer.h): the sequence it was planned with, this rank's split
// of the epoch's rows, and the seed of its random draws.
#pragma once

#include <cstdint>
#include <utility>

#include "pipeline/batch_producer.h"
#include "sampler/mixture.h"

namespace stoker {

struct MixEpoch final : EpochPlan {
  MixEpoch(MixSequence s, MixSplit sp, uint64_t e, uint64_t draws)
      : seq(std::move(s)), split(sp), epoch(e), sample_seed(draws) {}
  int64_t num_batches() const override { return split.batches; }

  const MixSequence seq;
  const MixSplit split;
  const uint64_t epoch;
  const uint64_t sample_seed;  ///< hash_combine(seed, epoch): image ops' draws (records)
};

}  // namespace stoker
