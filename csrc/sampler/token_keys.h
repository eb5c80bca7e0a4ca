// Keys of the token plans' pseudo-random orders, all derived from the user's
// seed with the sampler's mixer (permutation.h). Changing one changes every
// shuffled epoch of every token dataset: the Python reference
// (tests/_token_reference.py) mirrors them.
#pragma once

#include <cstdint>

#include "sampler/permutation.h"

namespace stoker::token_keys {

/// Order of windows / packed rows / budget batches in epoch e (as for records).
inline uint64_t epoch_order(uint64_t seed, uint64_t epoch) { return hash_combine(seed, epoch); }
/// Order in which documents are packed into rows (once, not per epoch).
inline uint64_t pack_order(uint64_t seed) { return hash_combine(seed, 0x7061636b2d646f63ull); }
/// Order of the documents of one length bucket `g` in epoch e (token budgets).
inline uint64_t bucket_order(uint64_t seed, uint64_t epoch, uint64_t g) {
  return hash_combine(hash_combine(hash_combine(seed, epoch), 0x6275636b6574ull), g);
}

}  // namespace stoker::token_keys
