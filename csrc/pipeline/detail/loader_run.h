// LoaderCore's private parts that both of its files use: loader_core.cpp (the
// core: runs, epochs, state) and loader_iterator.cpp (its iterators).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "pipeline/delivery.h"
#include "pipeline/loader_core.h"
#include "pipeline/stream.h"

namespace stoker {

struct LoaderCore::Run {
  std::shared_ptr<Stream> stream;
  std::unique_ptr<BatchReader> reader;
  std::atomic<int64_t> delivered{0};  // positions handed to an iterator
  int64_t skip_to = -1;  // positions before this belong to an epoch left early (with mu_)
  bool part = false;     // a part's stream (NOTE [ Parts ]): nothing flows on after it

  int64_t start() const {
    return skip_to >= 0 ? skip_to : delivered.load(std::memory_order_acquire);
  }
};

// Runs stopped with mu_ held, declared before the lock: when it is released, their
// readers are joined and the runs dropped (NOTE [ Loader shutdown ]).
struct LoaderCore::Retired {
  std::vector<std::shared_ptr<Run>> runs;
  Retired() = default;
  Retired(const Retired&) = delete;
  Retired& operator=(const Retired&) = delete;
  ~Retired() {
    for (const auto& run : runs)
      if (run) run->reader->join();
  }
};

}  // namespace stoker
