"""What the benchmarks conclude from repeated runs (stoker.bench._spread, demo, sweep):
a difference is named only beyond the spread of the runs, a cause only with its evidence,
storage only when the data was not in page cache. Fed with made-up runs, so the
conclusions are checked exactly; the figures of real runs are checked in test_cli.py and
test_bench_sweep.py."""

import os

import pytest
from stoker.bench._pagecache import resident_fraction
from stoker.bench._spread import Runs, differs
from stoker.bench.demo import STAGE_WHAT, where_the_time_goes
from stoker.bench.sweep import Point, larger_batch, recommend


def test_differs_needs_apart_ranges_wider_than_the_spread():
    assert differs(Runs([100, 102, 101]), Runs([200, 205, 198]))
    assert not differs(Runs([100, 150, 120]), Runs([140, 190, 160]))   # overlap
    assert not differs(Runs([100, 140, 120]), Runs([141, 160, 150]))   # apart, gap < spread
    assert not differs(Runs([100]), Runs([200]))                        # one run: unknown
    assert Runs([3, 1, 2]).text(unit="x") == "2 x (1-3, 3 runs)"
    assert "spread unknown" in Runs([5]).text()


def shares(*rows):
    return [dict(zip(("read", "decode", "ops", "plan"), r)) for r in rows]


def test_a_stage_is_named_only_when_it_leads_beyond_the_spread():
    lines = where_the_time_goes(shares((0.45, 0.40, 0, 0.15), (0.40, 0.45, 0, 0.15),
                                       (0.42, 0.43, 0, 0.15)), STAGE_WHAT, 1.0, "3 runs")
    assert "No stage leads beyond the spread" in lines[-1]
    lines = where_the_time_goes(shares((0.70, 0.20, 0, 0.10), (0.72, 0.19, 0, 0.09),
                                       (0.71, 0.20, 0, 0.09)), STAGE_WHAT, 1.0, "3 runs")
    assert "reading and verifying records (71% of the workers' time, 3 runs)" in lines[-1]
    assert "100% in page cache (mincore)" in lines[-1] and "not storage" in lines[-1]
    lines = where_the_time_goes(shares((0.70, 0.20, 0, 0.10), (0.72, 0.19, 0, 0.09),
                                       (0.71, 0.20, 0, 0.09)), STAGE_WHAT, 0.4, "3 runs")
    assert "60% of the shards' pages are not in page cache" in lines[-1]
    lines = where_the_time_goes(shares((0.70, 0.20, 0, 0.10)), STAGE_WHAT, 1.0, "1 run")
    assert "spread is unknown" in lines[-1]


def point(batch, threads, rates, worker_ms=1.0, first=0.01):
    p = Point(batch_size=batch, threads=threads, samples_per_second=sorted(rates)[len(rates) // 2],
              first_batch_seconds=first, stall=0.9, bottleneck="loader", stage="decode",
              batches=10, batch_bytes=batch * 100, prefetch=4,
              worker_ms_per_sample={"read": 0.1 * worker_ms, "decode": 0.9 * worker_ms,
                                    "ops": 0.0, "plan": 0.0})
    p.rate_runs = Runs(list(rates))
    p.worker_ms_runs = Runs([worker_ms] * len(rates))
    p.first_batch_runs = Runs([first] * len(rates))
    p.stage_shares = shares(*[(0.1, 0.9, 0, 0)] * len(rates))
    return p


def test_sweep_recommends_within_noise_the_same_way_twice():
    # two sweeps of the same data, ranked differently by noise: one recommendation
    a = [point(32, 1, [900, 1000, 1100]), point(32, 2, [950, 1050, 1150])]
    b = [point(32, 1, [1000, 1080, 1150]), point(32, 2, [880, 990, 1120])]
    ra, rb = recommend(a), recommend(b)
    assert "Within the noise of it" in ra and "Within the noise of it" in rb
    for text in (ra, rb):
        rec = [line for line in text.splitlines() if line.startswith("Recommended")]
        assert rec[0].startswith("Recommended: num_threads=1 loads as fast here")


def test_sweep_prefers_a_setting_only_beyond_the_spread():
    pts = [point(32, 1, [500, 510, 505]), point(32, 2, [1000, 1010, 990])]
    text = recommend(pts)
    assert "Faster than every other setting beyond the spread of 3 runs" in text
    assert "num_threads=None (the default)" in text
    assert "decoding (90% of the workers' time, 3 runs)" in text
    one = recommend([point(32, 1, [500]), point(32, 2, [1000])])
    assert "One run per setting: the spread is unknown" in one


def test_larger_batch_costs_are_real_or_within_noise():
    noisy = [point(16, 2, [900, 1000, 1100]), point(256, 2, [700, 950, 1050], worker_ms=1.3)]
    text = larger_batch(noisy)
    assert "within the noise of these runs" in text
    assert "does not load measurably slower" in text
    real = [point(16, 2, [1000, 1010, 990]), point(256, 2, [600, 610, 590], worker_ms=1.7)]
    real[1].worker_ms_runs = Runs([1.7, 1.72, 1.69])
    real[0].worker_ms_runs = Runs([1.0, 1.01, 0.99])
    text = larger_batch(real)
    assert "loads 40% slower per sample, beyond the spread" in text
    assert "costs more per sample in larger batches, beyond the spread" in text
    assert "caches" not in text  # a measured difference, not a guessed cause


def test_page_cache_residency(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(os.urandom(1 << 20))
    with open(f, "rb+") as fh:
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    cold = resident_fraction([str(f)])
    f.read_bytes()
    assert resident_fraction([str(f)]) == pytest.approx(1.0)
    assert cold is not None and cold < 1.0  # dropped (a page may be read back at once)
