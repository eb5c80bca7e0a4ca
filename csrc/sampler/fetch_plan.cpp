#include "sampler/fetch_plan.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace stoker {

namespace {
constexpr uint8_t kWalked = 1;
constexpr uint8_t kInflight = 2;
}  // namespace

FetchPlan::FetchPlan(std::shared_ptr<Dataset> ds, std::vector<int64_t> shard_bytes)
    : ds_(std::move(ds)), bytes_(std::move(shard_bytes)) {
  STOKER_CHECK(ds_ && ds_->deferred(), UsageError, "a fetch plan needs a deferred dataset");
  STOKER_CHECK(bytes_.size() == ds_->num_shards(), UsageError, "fetch plan: ", bytes_.size(),
               " shard sizes for ", ds_->num_shards(), " shards");
  if (!bytes_.empty())
    min_bytes_ = std::max<int64_t>(1, *std::min_element(bytes_.begin(), bytes_.end()));
  mark_.assign(bytes_.size(), 0);
}

void FetchPlan::follow(uint64_t key, Follower f) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Followed& x : followers_)
    if (x.key == key) {
      x.f = std::move(f);
      return;
    }
  followers_.push_back(Followed{key, std::move(f), std::nullopt, std::nullopt, 0, 0, 0, 0});
}

size_t FetchPlan::followers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return followers_.size();
}

const EpochOrder& FetchPlan::order_of(Followed& f, std::optional<EpochOrder>& slot,
                                      uint64_t& epoch_slot, int64_t& world_slot, uint64_t epoch,
                                      int64_t world) {
  if (!slot || epoch_slot != epoch || world_slot != world) {
    slot.reset();
    slot.emplace(f.f.order(epoch, world));
    epoch_slot = epoch;
    world_slot = world;
  }
  return *slot;
}

std::optional<std::vector<size_t>> FetchPlan::schedule(Followed& f, size_t max) {
  std::optional<ReadPosition> at = f.f.position();
  if (!at) return std::nullopt;
  const int64_t world = at->world_size > 0 ? at->world_size : std::max<int64_t>(1, f.f.world_size);
  // The next epoch's order becomes this one's when the reader gets there.
  if (f.next && f.next_epoch == at->epoch && f.next_world == world &&
      !(f.now && f.now_epoch == at->epoch && f.now_world == world)) {
    f.now = std::move(f.next);
    f.now_epoch = f.next_epoch;
    f.now_world = f.next_world;
    f.next.reset();
  }
  const EpochOrder& now = order_of(f, f.now, f.now_epoch, f.now_world, at->epoch, world);
  const int64_t from = std::clamp<int64_t>(at->offset, 0, ds_->size());
  std::vector<size_t> out = now.shard_schedule(from, max);
  if (out.size() < max) {  // the rest of the epoch is short: the start of the next one
    const EpochOrder& next = order_of(f, f.next, f.next_epoch, f.next_world, at->epoch + 1, world);
    for (size_t s : next.shard_schedule(0, max))
      if (out.size() < max && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

FetchPlan::Turn FetchPlan::turn(const Options& opts) {
  std::lock_guard<std::mutex> lock(mu_);
  const ShardGate& gate = *ds_->gate();
  const size_t n = bytes_.size();
  const bool limited = opts.budget >= 0;
  Turn t;
  for (size_t s : opts.inflight)
    if (s < n && !mark_[s]) {
      mark_[s] = kInflight;
      touched_.push_back(s);
    }
  // Walks shard s: kept, and fetched unless it is local, failed or on its way.
  auto walk = [&](size_t s, bool must) {
    if (s >= n || (mark_[s] & kWalked)) return;
    if (!mark_[s]) touched_.push_back(s);
    mark_[s] |= kWalked;
    t.wanted_bytes += bytes_[s];
    if (must) t.must_bytes += bytes_[s];
    if (mark_[s] & kInflight) return;
    const ShardGate::State v = gate.state(s);
    if (v == ShardGate::kPending || v == ShardGate::kDemanded) t.fetch.push_back(s);
  };
  // 1. In use: demanded, held, pinned now.
  for (size_t s : gate.demands()) walk(s, true);
  for (size_t s : opts.holds) walk(s, true);
  const std::vector<size_t> provided = gate.provided();
  for (size_t s : provided)
    if (gate.pins(s) > 0) walk(s, true);
  t.urgent = t.fetch.size();
  // 2. The followers' schedules, merged turn by turn, within the budget.
  const size_t max_shards = limited ? static_cast<size_t>(std::min<int64_t>(
                                          static_cast<int64_t>(n), opts.budget / min_bytes_ + 1))
                                    : n;
  std::vector<std::vector<size_t>> lists;
  for (auto it = followers_.begin(); it != followers_.end();) {
    std::optional<std::vector<size_t>> l = schedule(*it, max_shards);
    if (!l) {  // the reader is gone
      it = followers_.erase(it);
      continue;
    }
    lists.push_back(std::move(*l));
    ++it;
  }
  t.following = !lists.empty();
  bool full = false;
  auto room = [&](size_t s) { return !limited || t.wanted_bytes + bytes_[s] <= opts.budget; };
  for (size_t k = 0; !full; ++k) {
    bool any = false;
    for (const auto& l : lists) {
      if (k >= l.size()) continue;
      any = true;
      const size_t s = l[k];
      if (mark_[s] & kWalked) continue;
      if (!room(s)) {  // in order: what comes later waits for room
        full = true;
        break;
      }
      walk(s, false);
      if (!limited && t.fetch.size() >= opts.max_fetch + t.urgent) full = true;
    }
    if (!any) break;
  }
  // 3. Without a budget, the rest in shard order.
  if (!limited && !full) {
    for (; background_ < n && t.fetch.size() < opts.max_fetch + t.urgent; ++background_) {
      const size_t s = background_;
      if (!(mark_[s] & kWalked) && !(mark_[s] & kInflight) &&
          (gate.state(s) == ShardGate::kPending || gate.state(s) == ShardGate::kDemanded))
        walk(s, false);
    }
  }
  // Over the budget (with what is to be fetched): give back what was not
  // walked, until under it.
  for (size_t s : provided) t.held_bytes += bytes_[s];
  for (size_t s : opts.inflight)
    if (s < n) t.held_bytes += bytes_[s];
  int64_t coming = 0;
  for (size_t s : t.fetch) coming += bytes_[s];
  for (size_t s : provided) {
    if (!limited || t.held_bytes + coming <= opts.budget) break;
    if (!(mark_[s] & kWalked) && ds_->try_release(s)) {
      t.released.push_back(s);
      t.held_bytes -= bytes_[s];
    }
  }
  for (size_t s : touched_) mark_[s] = 0;
  touched_.clear();
  return t;
}

}  // namespace stoker
