#include "pipeline/autotuner.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace stoker {

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

int percent(double f) { return static_cast<int>(std::lround(100.0 * f)); }

// Image ops time is never zero for a record with an image (the codec's time
// is taken from the field's), and always zero without one.
const char* stage_what(const std::string& stage, bool images) {
  if (stage == "read") return "reading and verifying records";
  if (stage == "decode") return images ? "decoding" : "copying the fields into the batch";
  if (stage == "ops") return "image ops";
  if (stage == "python")
    return "your Python code (map, collate_fn, batch_map, the dataset's "
           "__getitem__)";
  return "planning batches";
}

const char* stage_advice(const std::string& stage, bool images) {
  if (stage == "read")
    return "storage is the limit: keep the dataset in page cache or on faster storage";
  if (stage == "decode")
    return images ? "store the images smaller (or as arrays), or give the loader more cores"
                  : "memory bandwidth is the limit: fewer bytes per sample (a narrower dtype)";
  if (stage == "ops") return "a smaller output size, or fewer ops in the transforms";
  if (stage == "python")
    return "move work into stoker's C++ transforms, or into NumPy/OpenCV calls on whole arrays "
           "(they release the GIL and run in parallel)";
  // Planning reads what sizes a batch: image headers when no op fixes the
  // output size, else the lengths of variable-length fields (each record's
  // field table, touched in memory once more).
  return images ? "images of many sizes without a fixed output size have their headers read "
                  "to plan each batch: a Resize or RandomResizedCrop fixes the size"
                : "variable-length fields have every record's lengths read to size each "
                  "batch's padding: larger batches spread that cost, a fixed shape removes it";
}

}  // namespace

bool gil_bound(const TuneInterval& iv) {
  if (iv.threads < 2 || iv.python <= 0) return false;
  const double blocked = iv.python - iv.python_cpu - iv.python_wait;
  const double cores = iv.threads * iv.python_cpu / iv.python;  // used between them
  // About one core between them: one thread at a time runs. Blocked threads
  // using much less are waiting for something else (I/O, sleeps, locks).
  return blocked > kGilBlockedShare * iv.python && cores > 0.6 && cores < 1.5;
}

double TuneInterval::stall() const { return wall > 0 ? std::clamp(wait / wall, 0.0, 1.0) : 0.0; }

double TuneInterval::utilization() const {
  return wall > 0 ? std::clamp(busy / (std::max(1, threads) * wall), 0.0, 1.0) : 0.0;
}

const char* bottleneck_name(Bottleneck b) {
  switch (b) {
    case Bottleneck::kConsumer:
      return "consumer";
    case Bottleneck::kLoader:
      return "loader";
    case Bottleneck::kCopy:
      return "copy";
    case Bottleneck::kUnknown:
      break;
  }
  return "unknown";
}

Diagnosis diagnose(const TuneInterval& iv, double stall_threshold) {
  Diagnosis d;
  if (iv.batches <= 0 || iv.wall <= 0) {
    d.text = "no batches delivered yet";
    return d;
  }
  const double stall = iv.stall();
  const double util = iv.utilization();
  const int threads = std::max(1, iv.threads);
  if (stall < stall_threshold) {
    d.kind = Bottleneck::kConsumer;
    d.text = format(
        "consumer-bound: the loop waited for data %d%% of the time; the loader keeps up "
        "(%d worker thread%s, %d%% busy)",
        percent(stall), threads, threads == 1 ? "" : "s", percent(util));
    // Time in next() after the batch was ready (batch_map on the consumer's thread,
    // making the tensors) is in data_stall but no worker could shorten it: say so
    // when it is a visible share, so that the two figures do not seem to disagree.
    const double handoff = std::clamp(iv.handoff / iv.wall, 0.0, 1.0);
    if (handoff >= kHandoffShown)
      d.text += format(
          "; next() itself took %d%% of the loop making each batch ready after its data "
          "came (batch_map on the device runs there), counted in data_stall",
          percent(handoff));
    return d;
  }
  // The loader's pace: worker time per batch spread over the active workers.
  const double loader_ms = 1e3 * iv.busy / static_cast<double>(iv.batches) / threads;
  const double copy_ms = iv.copies > 0 ? 1e3 * iv.copy / static_cast<double>(iv.copies) : 0.0;
  if (iv.device && copy_ms > 0 && copy_ms >= loader_ms) {
    d.kind = Bottleneck::kCopy;
    d.stage = "copy";
    d.text = format(
        "copy-bound: the loop waited for data %d%% of the time; the copy to the device takes "
        "%.3g ms per batch, the workers %.3g ms: pinned batch memory (pin_memory=True), uint8 "
        "images (normalize on the device) or fewer bytes per batch",
        percent(stall), copy_ms, loader_ms);
    return d;
  }
  d.kind = Bottleneck::kLoader;
  if (util < Autotuner::kIdle) {
    d.stage = "prefetch";
    d.text = format(
        "loader-bound: the loop waited for data %d%% of the time while the workers were idle "
        "%d%% of theirs: a larger prefetch (now %d), or batches large enough to share among "
        "%d threads",
        percent(stall), 100 - percent(util), iv.window, threads);
    return d;
  }
  const double stages[5] = {iv.read, iv.decode, iv.ops, iv.plan, iv.python};
  const char* names[5] = {"read", "decode", "ops", "plan", "python"};
  const double total = stages[0] + stages[1] + stages[2] + stages[3] + stages[4];
  const int top = static_cast<int>(std::max_element(stages, stages + 5) - stages);
  d.stage = names[top];
  const double share = total > 0 ? stages[top] / total : 0.0;
  const bool images = iv.ops > 0;
  if (d.stage == "python" && gil_bound(iv)) {
    d.text = format(
        "loader-bound: the loop waited for data %d%% of the time; your Python code takes %d%% "
        "of the workers' time and is GIL-bound: %d threads ran it at %.2g cores' worth of CPU "
        "between them (one at a time holds the GIL). Move pure-Python loops into NumPy/OpenCV "
        "calls on whole arrays or stoker's C++ transforms, or run the Python stage in "
        "processes (python_workers='process')",
        percent(stall), percent(share), threads,
        iv.python > 0 ? static_cast<double>(threads) * iv.python_cpu / iv.python : 0.0);
    return d;
  }
  if (d.stage == "python" && iv.python_wait > kGilBlockedShare * iv.python) {
    d.text = format(
        "loader-bound: the loop waited for data %d%% of the time; your Python code takes %d%% "
        "of the workers' time, and its threads waited for a free core %d%% of theirs: the "
        "machine's cores are busy with other work (more threads will not help)",
        percent(stall), percent(share), percent(iv.python_wait / iv.python));
    return d;
  }
  std::string advice = iv.threads < iv.max_threads
                           ? format("more threads (num_threads=%d)", iv.max_threads)
                           : std::string(stage_advice(d.stage, images));
  d.text = format(
      "loader-bound: the loop waited for data %d%% of the time; %s takes %d%% of the workers' "
      "time (%.3g ms of worker time per batch, %d of %d thread%s %d%% busy): %s",
      percent(stall), stage_what(d.stage, images), percent(share),
      1e3 * iv.busy / static_cast<double>(iv.batches), threads, std::max(1, iv.max_threads),
      iv.max_threads == 1 ? "" : "s", percent(util), advice.c_str());
  return d;
}

Autotuner::Autotuner(const Config& c, int threads, int window)
    : cfg_(c), threads_(std::max(1, threads)), window_(std::max(1, window)) {
  cfg_.max_threads = std::max(1, cfg_.max_threads);
}

Autotuner::Step Autotuner::step(const TuneInterval& iv) {
  Step s;
  const double stall = iv.stall();
  const double util = iv.utilization();
  const int cap = std::max(1, iv.max_window);
  if (cfg_.tune_window && window_ > cap) window_ = cap;  // the memory limit, not a move
  window_floor_ = std::min(window_floor_, cap);
  const double work = iv.batches > 0 ? iv.busy / static_cast<double>(iv.batches) : 0.0;
  if (floor_work_ > 0 && work > 0 && work < kCheaperWork * floor_work_) {
    // The batches got cheaper than when the floors were set (NOTE [ Autotuning ]).
    thread_floor_ = 1;
    window_floor_ = std::min(kMinWindow, cap);
    floor_work_ = 0;
    settled_ = false;
    quiet_ticks_ = 0;
  }

  Move t = Move::kNone, w = Move::kNone;
  int t_target = threads_, w_target = window_;
  const bool copy_bound =
      iv.device && diagnose(iv, kStallHigh).kind == Bottleneck::kCopy;  // threads would not help
  if (cfg_.tune_threads) {
    if (stall > kStallHigh && util >= kSaturated && threads_ < cfg_.max_threads && !copy_bound) {
      t = Move::kUp;
      t_target = std::min(cfg_.max_threads, threads_ + std::max(1, threads_ / 4));
    } else if (stall < kStallLow && util < kIdle && threads_ > thread_floor_ && iv.wall > 0) {
      const int need = static_cast<int>(std::ceil(iv.busy / iv.wall / kTargetUtilization - 1e-9));
      t_target = std::clamp(need, thread_floor_, threads_ - 1);
      t = Move::kDown;
    }
  }
  if (cfg_.tune_window) {
    if (stall > kStallHigh && util < kTargetUtilization && iv.min_depth == 0 && window_ < cap) {
      w = Move::kUp;
      w_target = std::min(cap, window_ * 2);
    } else if (stall < kStallLow && iv.min_depth >= 2 && window_ > window_floor_) {
      w = Move::kDown;
      w_target = std::max(window_floor_, window_ - (iv.min_depth - 1));
    }
  }

  // A move needs the same proposal twice in a row; undoing the last move sets
  // a floor (NOTE [ Autotuning ]).
  bool pending = false;
  if (t == Move::kNone) {
    thread_vote_ = Move::kNone;
  } else if (thread_vote_ != t) {
    thread_vote_ = t;
    pending = true;
  } else {
    if (t == Move::kUp) {
      thread_floor_ = t_target;  // the loop waited with fewer
      floor_work_ = work;
    }
    s.reason = t == Move::kUp
                   ? format("more workers %d -> %d (the loop waited %d%%, workers %d%% busy)",
                            threads_, t_target, percent(stall), percent(util))
                   : format("fewer workers %d -> %d (the loop waited %d%%, workers %d%% busy)",
                            threads_, t_target, percent(stall), percent(util));
    threads_ = t_target;
    thread_vote_ = Move::kNone;
    s.changed = true;
  }
  if (w == Move::kNone) {
    window_vote_ = Move::kNone;
  } else if (window_vote_ != w) {
    window_vote_ = w;
    pending = true;
  } else {
    if (w == Move::kUp) {
      window_floor_ = w_target;
      floor_work_ = work;
    }
    if (!s.reason.empty()) s.reason += "; ";
    s.reason += w == Move::kUp ? format(
                                     "larger prefetch %d -> %d (the loop waited %d%% with no batch "
                                     "ready while workers idled)",
                                     window_, w_target, percent(stall))
                               : format("smaller prefetch %d -> %d (%d batches were always ready)",
                                        window_, w_target, iv.min_depth);
    window_ = w_target;
    window_vote_ = Move::kNone;
    s.changed = true;
  }

  if (s.changed || pending) {
    quiet_ticks_ = 0;
  } else if (++quiet_ticks_ >= kSettleTicks && !settled_ && tuning()) {
    settled_ = true;
    s.settled = true;
  }
  s.threads = threads_;
  s.window = window_;
  return s;
}

}  // namespace stoker
