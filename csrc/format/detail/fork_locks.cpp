#include "format/detail/fork_locks.h"

#include <pthread.h>

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "format/mapped_file.h"

namespace stoker::detail {

namespace {

// NOTE [ Locks across fork ]: the registry itself is taken first and held
// across the fork, so no client comes or goes meanwhile.
std::mutex g_clients_mu;
std::vector<ForkClient*>& clients() {
  static std::vector<ForkClient*> v;  // guarded by g_clients_mu
  return v;
}

constexpr int kLevels = 2;

void prepare() {
  g_clients_mu.lock();
  for (int level = 0; level < kLevels; ++level)
    for (ForkClient* c : clients())
      if (c->fork_level() == level) c->before_fork();
  MappedFile::before_fork();  // taken last: clients map shards under their locks
}

void after(bool child) {
  MappedFile::after_fork();
  for (int level = kLevels - 1; level >= 0; --level)
    for (ForkClient* c : clients())
      if (c->fork_level() == level) c->after_fork(child);
  g_clients_mu.unlock();
}

void install() {
  static std::once_flag once;
  std::call_once(once,
                 [] { ::pthread_atfork(&prepare, [] { after(false); }, [] { after(true); }); });
}

}  // namespace

void add_fork_client(ForkClient* c) {
  install();
  STOKER_CHECK(c->fork_level() >= 0 && c->fork_level() < kLevels, UsageError,
               "fork client level out of range");
  std::lock_guard<std::mutex> lock(g_clients_mu);
  clients().push_back(c);
}

void remove_fork_client(ForkClient* c) {
  std::lock_guard<std::mutex> lock(g_clients_mu);
  auto& v = clients();
  v.erase(std::remove(v.begin(), v.end(), c), v.end());
}

}  // namespace stoker::detail
